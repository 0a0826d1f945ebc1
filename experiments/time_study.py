"""Accuracy against simulated time: stragglers (synchronous vs asynchronous) and compression vs link speed.

Setting: 16 nodes, Fashion-MNIST (the embedded digits when Fashion-MNIST is not available
offline: ``JAXGOSSIP_FASHION_MNIST_DIR``, ``--raw_dir`` or a prepared tfds copy; the reports say
which), IID partition, MLP with one hidden layer of 64 (50,890 parameters, 1.63 Mbit per fp32
model), batch 32 per node, SGD with Nesterov momentum 0.9 at a constant lr 0.05, weight decay
1e-4, "atc" ordering, identical initial models, one local step per round. Every run carries the
simulated clock of :mod:`jaxgossip.sim.timing` (docs/usage.md, "Simulated time and cost"): a local
step takes ``C = 0.02`` s on a normal node, a message of B bits ``latency + B / bandwidth``, a
node's messages of a round share its uplink one after another (``mode=serial``), an all-reduce
round is priced as the ring all-reduce.

Part A, **stragglers** (bandwidth 1 Gbit/s unless ``--bandwidth`` says otherwise, latency
1e-4 s): ``stragglers:C,1/16,10`` (one node ten times slower) and ``stragglers:C,1/4,3`` (four
nodes three times slower), with the homogeneous clock as the control. Synchronous methods: all-reduce SGD, D-PSGD (``gossip`` on ``ring(16)``) and
SGP (``push_sum`` on the one-peer exponential graph). Their iterates do not depend on the clock,
so one compile per method sweeps the clocks (``time.fraction`` x ``time.slowdown`` sweep axes,
which do not batch the training: the sweep costs about one run). Asynchronous methods, when the
installed jaxgossip has ``--execution=async`` training: AD-PSGD and asynchronous gossip on
``ring(16)``, asynchronous SGP on the static exponential graph (every node sends to i + 1, 2, 4, 8;
an asynchronous run needs a static graph); their events depend on the
clock, so one run per clock and seed. A round is N node events (N local steps) in both modes.

Part B, **compression vs link speed** (homogeneous ``C``, latency 1e-4 s, bandwidth 10 Mbit/s and
10 Gbit/s, one compile per method sweeps both): all-reduce, gossip (D-PSGD, ring), PowerGossip
rank 1 (ring), Choco-SGD top-1 % (ring, gamma from ``jaxgossip tune-gamma`` on this graph and
model), push-sum (SGP, one-peer exponential) and Sparse-Push top-1 % (one-peer exponential,
gamma from ``tune-gamma``).

Reported per method and clock (mean +- sample std over seeds): simulated time to the target
accuracy of the averaged model (first evaluation at or above it; evaluations every
``eval_every`` rounds), rounds to target, final accuracy, accuracy at a common time budget, MB sent
per node, and simulated seconds per round.

Outputs (``experiments/results/time_study/`` by default), one set per part (A: ``stragglers``,
B: ``compression``): ``.md`` (table), ``.json`` (settings, curves per seed, summary, machine) and
``.png`` (accuracy vs simulated time).

Usage::

    python experiments/time_study.py                 # both parts, about 8 + 8 min on 2 shared cores
    python experiments/time_study.py --parts B       # one part
    python experiments/time_study.py --parts A --bandwidth 1e7 --out DIR   # part A at 10 Mbit/s
    python experiments/time_study.py --parts A --bandwidth stragglers:0.25,10 --out DIR  # 4 slow uplinks
    python experiments/time_study.py --quick         # smoke run (digits, 20 rounds, writes to runs/time_study_quick)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import NamedTuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _common, also when loaded by a test

from _common import jsonable, machine  # noqa: E402

from jaxgossip import data  # noqa: E402
from jaxgossip.run.runner import TrainConfig, run_training  # noqa: E402
from jaxgossip.run.training_sweeps import sweep_training  # noqa: E402
from jaxgossip.sim.network import DEFAULT_BANDWIDTH  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "time_study")
QUICK_OUT = os.path.join("runs", "time_study_quick")
COMPUTE = 0.02  # s per local step of a normal node
LATENCY = 1e-4
SEEDS = (0, 1)
ROUNDS = {"A": 300, "B": 300}
EVAL_EVERY = 10
TARGET = {"fashion_mnist": 0.82, "digits": 0.9}
QUICK = {"rounds": {"A": 20, "B": 20}, "eval_every": 10, "seeds": (0,)}

# Part A: the clocks, as (fraction, slowdown) of stragglers:C,F,S; (0, 1) is the homogeneous clock.
CLOCKS = {"homogeneous": (0.0625, 1.0), "one 10x slower": (0.0625, 10.0), "quarter 3x slower": (0.25, 3.0)}
STRAGGLER_BANDWIDTH = 1e9
# Part B: the links.
LINKS = {"10 Mbit/s": 1e7, "10 Gbit/s": 1e10}
# Consensus steps from `jaxgossip tune-gamma` on ring(16) / one_peer_exponential(16) with the
# MLP(64)'s leaves at 1 % density (1500 rounds): the recommended value (largest contracting / 2.5;
# choco 0.0501 / 2.5, sparse_push 0.126 / 2.5).
CHOCO_GAMMA = 0.02
SPARSE_PUSH_GAMMA = 0.05


class Method(NamedTuple):
    label: str
    algorithm: str
    topology: str
    options: dict
    execution: str = "sync"
    async_form: str = "auto"
    rate_compensation: bool = False


METHODS_A = {
    "allreduce": Method("all-reduce SGD (sync)", "allreduce", "ring", {}),
    "dpsgd": Method("D-PSGD (sync gossip, ring)", "gossip", "ring", {}),
    "sgp": Method("SGP (sync push-sum, 1-peer exp)", "push_sum", "one_peer_exponential", {}),
    "ad_psgd": Method("AD-PSGD (async, ring)", "gossip", "ring", {}, "async", "ad_psgd"),
    # AD-PSGD with each node's step scaled by E[p_i] mean_j 1 / E[p_j] (--async_rate_compensation=true)
    "ad_psgd_rc": Method("AD-PSGD (async, ring, rate-compensated)", "gossip", "ring", {}, "async", "ad_psgd", True),
    "async_gossip": Method("async gossip (ring)", "gossip", "ring", {}, "async", "async_gossip"),
    # Asynchronous nodes share no round to switch graphs on: the static exponential graph.
    "async_sgp": Method("async SGP (exponential)", "push_sum", "exponential", {}, "async", "async_sgp"),
}
METHODS_B = {
    "allreduce": Method("all-reduce SGD", "allreduce", "ring", {}),
    "gossip": Method("gossip (D-PSGD, ring)", "gossip", "ring", {}),
    "power_gossip": Method("PowerGossip rank 1 (ring)", "power_gossip", "ring", {"rank": 1, "num_iterations": 1}),
    "choco": Method(
        f"Choco top-1% (ring, gamma {CHOCO_GAMMA:g})",
        "choco",
        "ring",
        {"compressor": "top_k", "compressor_options": {"fraction": 0.01}, "gamma": CHOCO_GAMMA},
    ),
    "push_sum": Method("push-sum (SGP, 1-peer exp)", "push_sum", "one_peer_exponential", {}),
    "sparse_push": Method(
        f"Sparse-Push top-1% (1-peer exp, gamma {SPARSE_PUSH_GAMMA:g})",
        "sparse_push",
        "one_peer_exponential",
        {"fraction": 0.01, "gamma": SPARSE_PUSH_GAMMA},
    ),
}
PART_FILES = {"A": "stragglers", "B": "compression"}
FIELDS = ("test_acc", "sim_time", "round", "consensus", "node_acc_mean")


def async_training_available() -> bool:
    """Whether this jaxgossip trains with ``execution="async"`` (TrainConfig field and trainer)."""
    if "execution" not in {f.name for f in dataclasses.fields(TrainConfig)}:
        return False
    try:
        import jaxgossip.engine.asynchronous.training  # noqa: F401
    except ImportError:
        return False
    return True


def load_data(name: str, raw_dir: str | None):
    """``(dataset, name)``: Fashion-MNIST when it is found offline, else the embedded digits."""
    raw_dir = raw_dir or os.environ.get("JAXGOSSIP_FASHION_MNIST_DIR")
    if name == "fashion_mnist" and not data.fashion_mnist_available(raw_dir=raw_dir):
        print("Fashion-MNIST not found offline (JAXGOSSIP_FASHION_MNIST_DIR, --raw_dir); using digits")
        name = "digits"
    if name == "fashion_mnist":
        return data.load_dataset("fashion_mnist", raw_dir=raw_dir), name
    return data.load_dataset("digits"), name


def base_config(dataset: str, rounds: int, eval_every: int, partition: str = "iid") -> TrainConfig:
    return TrainConfig(
        dataset=dataset,
        num_nodes=16,
        partition=partition,
        model="mlp",
        model_options={"hidden": (64,)},
        batch_size=32,
        lr=0.05,
        momentum=0.9,
        nesterov=True,
        weight_decay=1e-4,
        num_rounds=rounds,
        eval_every=eval_every,
        evals_per_chunk=max(1, rounds // eval_every),
        eval_size=2000,
        ordering="atc",
    )


def _method_config(base: TrainConfig, key: str, method: Method, timing: dict) -> TrainConfig:
    changes = {}
    if method.execution != "sync":
        changes = {"execution": method.execution, "async_form": method.async_form}
        if method.rate_compensation:
            changes["async_rate_compensation"] = True
    return base.replace(
        name=key,
        algorithm=method.algorithm,
        topology=method.topology,
        algorithm_options=dict(method.options),
        time=timing,
        **changes,
    )


def _from_metrics(metrics) -> dict:
    """{field: np.ndarray [..., M]} plus "mb" (MB sent per node, mean over nodes) from Metrics."""
    out = {name: np.asarray(getattr(metrics, name), np.float64) for name in FIELDS}
    out["mb"] = np.asarray(metrics.bits, np.float64).mean(axis=-1) / 8e6
    return out


def train_sweep(config: TrainConfig, axes: dict, seeds, dataset) -> dict:
    """A synchronous method over a grid of clock axes x seeds in one compile: arrays [G, S, M]."""
    _, metrics = sweep_training(config, axes, seeds, dataset)
    return _from_metrics(metrics)


def train_runs(configs: list, seeds, dataset) -> dict:
    """One run per config and seed (asynchronous runs plan their events from the clock): [G, S, M].
    Every seed keeps the config's data seed, as :func:`train_sweep`'s seeds do: one partition for all."""
    per = []
    for config in configs:
        runs = [
            _from_metrics(
                run_training(
                    config.replace(seed=s, data_seed=config.resolved_data_seed),
                    dataset=dataset,
                    progress=False,
                    log=lambda _: None,
                ).metrics
            )
            for s in seeds
        ]
        per.append({k: np.stack([r[k] for r in runs]) for k in runs[0]})
    return {k: np.stack([p[k] for p in per]) for k in per[0]}


def time_to(acc: np.ndarray, times: np.ndarray, target: float) -> np.ndarray:
    """[...]: the time (or round) of the first evaluation with acc >= target (NaN: never)."""
    reached = acc >= target
    first = reached.argmax(axis=-1)
    value = np.take_along_axis(times, first[..., None], axis=-1)[..., 0]
    return np.where(reached.any(axis=-1), value, np.nan)


def acc_at(acc: np.ndarray, times: np.ndarray, budget: float) -> np.ndarray:
    """[...]: accuracy of the last evaluation at or before ``budget`` simulated seconds (NaN: none)."""
    ok = times <= budget * (1 + 1e-6)
    last = np.where(ok.any(axis=-1), ok.shape[-1] - 1 - ok[..., ::-1].argmax(axis=-1), 0)
    value = np.take_along_axis(acc, last[..., None], axis=-1)[..., 0]
    return np.where(ok.any(axis=-1), value, np.nan)


def run_part_a(base, dataset, seeds, methods, bandwidth=STRAGGLER_BANDWIDTH, log=print) -> dict:
    clocks = list(CLOCKS)
    results = {}
    for key in methods:
        method = METHODS_A[key]
        start = time.time()
        timing = {
            "compute": f"stragglers:{COMPUTE},0.0625,1",
            "latency": LATENCY,
            "bandwidth": bandwidth,
        }
        config = _method_config(base, key, method, timing)
        if method.execution == "sync":
            # The product grid fraction x slowdown holds every clock of CLOCKS (and two unused points).
            fractions = sorted({f for f, _ in CLOCKS.values()})
            slowdowns = sorted({s for _, s in CLOCKS.values()})
            m = train_sweep(config, {"time.fraction": fractions, "time.slowdown": slowdowns}, seeds, dataset)
            index = [fractions.index(f) * len(slowdowns) + slowdowns.index(s) for f, s in CLOCKS.values()]
            m = {k: v[index] for k, v in m.items()}
        else:
            configs = [
                config.replace(time={**timing, "compute": f"stragglers:{COMPUTE},{f},{s:g}"})
                for f, s in CLOCKS.values()
            ]
            m = train_runs(configs, seeds, dataset)
        seconds = time.time() - start
        results[key] = {"label": method.label, "execution": method.execution, "clocks": clocks, **m, "seconds": seconds}
        log(
            f"A {method.label:34s} final acc {np.round(m['test_acc'][:, :, -1].mean(axis=1), 4)} "
            f"sim s {np.round(m['sim_time'][:, :, -1].mean(axis=1), 1)} ({seconds:.1f} s)"
        )
    return results


def run_part_b(base, dataset, seeds, methods, log=print) -> dict:
    links = list(LINKS)
    results = {}
    for key in methods:
        method = METHODS_B[key]
        start = time.time()
        config = _method_config(base, key, method, {"compute": COMPUTE, "latency": LATENCY, "bandwidth": 1e9})
        m = train_sweep(config, {"time.bandwidth": [LINKS[k] for k in links]}, seeds, dataset)
        seconds = time.time() - start
        results[key] = {"label": method.label, "execution": "sync", "links": links, **m, "seconds": seconds}
        log(
            f"B {method.label:44s} final acc {np.round(m['test_acc'][:, :, -1].mean(axis=1), 4)} "
            f"sim s {np.round(m['sim_time'][:, :, -1].mean(axis=1), 2)} MB {m['mb'][0, :, -1].mean():.2f} "
            f"({seconds:.1f} s)"
        )
    return results


def _bandwidth(text: str):
    """``--bandwidth``: a number of bits/s, or a per-node spec kept as text for ``--time.bandwidth``."""
    try:
        return float(text)
    except ValueError:
        return text


def link_label(bandwidth) -> str:
    """``1e9`` -> "1 Gbit/s"; a per-node spec such as ``stragglers:0.25,10`` -> the slow uplinks in words."""
    if isinstance(bandwidth, str):
        kind, _, numbers = bandwidth.partition(":")
        if kind == "stragglers":
            fraction, slowdown = (float(v) for v in numbers.split(","))
            return f"{link_label(DEFAULT_BANDWIDTH)}, {fraction:g} of the uplinks {slowdown:g}x slower"
        return f"links {bandwidth}"
    for scale, unit in ((1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
        if bandwidth >= scale:
            return f"{bandwidth / scale:g} {unit}"
    return f"{bandwidth:g} bit/s"


def _pm(values: np.ndarray, fmt: str = ".4f", never: str = "never") -> str:
    values = np.asarray(values, np.float64).ravel()
    finite = values[np.isfinite(values)]
    if not finite.size:
        return never
    std = finite.std(ddof=1) if finite.size > 1 else 0.0
    text = f"{finite.mean():{fmt}} +- {std:{fmt}}" if values.size > 1 else f"{finite.mean():{fmt}}"
    missing = values.size - finite.size
    return text + (f" ({missing} {never})" if missing else "")


def summary(report: dict) -> dict:
    """Per part, method and clock / link: time and rounds to target, final and budget accuracy."""
    target = report["settings"]["target"]
    out = {}
    for part, results in report["results"].items():
        cases = report["settings"]["clocks"] if part == "A" else list(LINKS)
        rows = []
        for g, case in enumerate(cases):
            # The common budget of a case: the earliest end of a run in it (every method has a point there).
            budget = min(float(np.min(r["sim_time"][g, :, -1])) for r in results.values())
            for key, r in results.items():
                acc, t = r["test_acc"][g], r["sim_time"][g]
                rows.append(
                    {
                        "case": case,
                        "method": key,
                        "label": r["label"],
                        "execution": r["execution"],
                        "time_to_target": time_to(acc, t, target).tolist(),
                        "rounds_to_target": time_to(acc, r["round"][g], target).tolist(),
                        "final_acc": acc[:, -1].tolist(),
                        "budget": budget,
                        "acc_at_budget": acc_at(acc, t, budget).tolist(),
                        "sim_time_end": t[:, -1].tolist(),
                        "s_per_round": (t[:, -1] / r["round"][g][:, -1]).tolist(),
                        "mb_per_node": r["mb"][g][:, -1].tolist(),
                        "consensus": r["consensus"][g][:, -1].tolist(),
                    }
                )
        out[part] = rows
    return out


def _data_label(settings: dict) -> str:
    """The data set, and its partition where it is not IID."""
    partition = settings.get("partition", "iid")
    return settings["dataset"] if partition == "iid" else f"{settings['dataset']}, {partition}"


def tables(report: dict) -> str:
    s = report["settings"]
    target = s["target"]
    lines = []
    for part, rows in report["summary"].items():
        if part == "A":
            lines += [
                f"**Part A, stragglers** ({_data_label(s)}, {s['rounds']['A']} rounds = {s['rounds']['A']} x 16 local "
                f"steps, C = {COMPUTE} s, {link_label(s['straggler_bandwidth'])}, {len(s['seeds'])} seeds; "
                f"target {target:g}):",
                "",
            ]
        else:
            lines += [
                f"**Part B, compression vs link** ({_data_label(s)}, {s['rounds']['B']} rounds, C = {COMPUTE} s, "
                f"latency {LATENCY:g} s, {len(s['seeds'])} seeds; target {target:g}):",
                "",
            ]
        lines += [
            f"| case | method | sim s to {target:g} | rounds to {target:g} | acc at budget | final acc | "
            "sim s (end) | sim s / round | MB / node |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in rows:
            lines.append(
                f"| {row['case']} | {row['label']} | {_pm(row['time_to_target'], '.2f')} "
                f"| {_pm(row['rounds_to_target'], '.0f')} | {_pm(row['acc_at_budget'], never='no eval yet')} (at {row['budget']:.2f} s) "
                f"| {_pm(row['final_acc'])} | {_pm(row['sim_time_end'], '.2f')} | {np.mean(row['s_per_round']):.4f} "
                f"| {np.mean(row['mb_per_node']):.2f} |"
            )
        lines.append("")
        if part == "A" and s.get("absent"):
            lines += [f"Not run: {s['absent']}.", ""]
    return "\n".join(lines)


def plot(report: dict, part: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    results = report["results"][part]
    cases = report["settings"]["clocks"] if part == "A" else list(LINKS)
    target = report["settings"]["target"]
    fig, axes = plt.subplots(1, len(cases), figsize=(5.2 * len(cases), 4.2), squeeze=False)
    for g, case in enumerate(cases):
        ax = axes[0, g]
        for i, r in enumerate(results.values()):
            t = r["sim_time"][g].mean(axis=0)
            acc = r["test_acc"][g]
            mean, std = acc.mean(axis=0), acc.std(axis=0)
            style = "--" if r["execution"] == "sync" and part == "A" else "-"
            (line,) = ax.plot(t, mean, style, color=f"C{i}", label=r["label"], lw=1.4)
            ax.fill_between(t, mean - std, mean + std, color=line.get_color(), alpha=0.15)
        ax.axhline(target, color="gray", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # short ranges crowd the minor labels
        ax.set_ylim(max(0.0, target - 0.25), min(1.0, target + 0.12))
        ax.set_xlabel("simulated time (s, log)")
        ax.set_title(case, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].set_ylabel("test accuracy (averaged model)")
    axes[0, 0].legend(fontsize=7, loc="lower right")
    st = report["settings"]
    what = (
        f"stragglers, {link_label(st['straggler_bandwidth'])}"
        if part == "A"
        else f"compression vs link, latency {LATENCY:g} s"
    )
    fig.suptitle(
        f"{_data_label(st)}, 16 nodes, MLP(64), C = {COMPUTE} s per step: {what} "
        f"(mean +- std over {len(st['seeds'])} seeds)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: digits, 20 rounds, one seed")
    parser.add_argument("--parts", default="A,B", help="A (stragglers), B (compression), or A,B")
    parser.add_argument("--dataset", default="fashion_mnist", help="fashion_mnist (digits if not found) or digits")
    parser.add_argument("--raw_dir", default=None, help="folder of the Fashion-MNIST IDX files")
    parser.add_argument(
        "--partition",
        default="iid",
        help="the nodes' shards: iid (default) or any --partition spec, e.g. dirichlet:0.1",
    )
    parser.add_argument("--methods", default=None, help="comma list of method keys to run (default: all of each part)")
    parser.add_argument(
        "--bandwidth",
        default=STRAGGLER_BANDWIDTH,
        type=_bandwidth,
        help="part A's links: bits/s (default 1e9) or a per-node --time.bandwidth spec, e.g. stragglers:0.25,10",
    )
    parser.add_argument("--out", default=None, help=f"output folder (default {RESULTS}; --quick: {QUICK_OUT})")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if any(p not in ("A", "B") for p in parts):
        parser.error(f"--parts={args.parts!r}: give A, B or A,B")
    rounds, eval_every, seeds = dict(ROUNDS), EVAL_EVERY, SEEDS
    name = args.dataset
    if args.quick:
        rounds, eval_every, seeds, name = QUICK["rounds"], QUICK["eval_every"], QUICK["seeds"], "digits"
    out = args.out or (QUICK_OUT if args.quick else RESULTS)
    start = time.time()
    dataset, name = load_data(name, args.raw_dir)
    async_ok = async_training_available()
    methods_a = [k for k, m in METHODS_A.items() if m.execution == "sync" or async_ok]
    absent = (
        ""
        if async_ok
        else "AD-PSGD, async gossip and async SGP (this jaxgossip has no asynchronous training: "
        "TrainConfig has no execution field)"
    )
    methods_b = list(METHODS_B)
    if args.methods:
        chosen = args.methods.split(",")
        unknown = sorted(set(chosen) - set(METHODS_A) - set(METHODS_B))
        if unknown:
            parser.error(f"--methods: unknown {unknown}; known: {sorted(set(METHODS_A) | set(METHODS_B))}")
        methods_a = [k for k in methods_a if k in chosen]
        methods_b = [k for k in methods_b if k in chosen]
    results, seconds = {}, {}
    for part in parts:
        t0 = time.time()
        base = base_config(name, rounds[part], eval_every, args.partition)
        if part == "A":
            results["A"] = run_part_a(base, dataset, seeds, methods_a, args.bandwidth)
        else:
            results["B"] = run_part_b(base, dataset, seeds, methods_b)
        seconds[part] = round(time.time() - t0, 1)
    report = {
        "settings": {
            "dataset": name,
            "data_source": dataset.source,
            "num_nodes": 16,
            "partition": args.partition,
            "model": "mlp hidden [64]",
            "batch_size": 32,
            "lr": 0.05,
            "momentum": 0.9,
            "compute_s": COMPUTE,
            "latency_s": LATENCY,
            "straggler_bandwidth": args.bandwidth,
            "links": LINKS,
            "clocks": list(CLOCKS),
            "clock_specs": {k: f"stragglers:{COMPUTE},{f},{s:g}" for k, (f, s) in CLOCKS.items()},
            "rounds": rounds,
            "eval_every": eval_every,
            "seeds": list(seeds),
            "target": TARGET[name],
            "methods_a": {k: METHODS_A[k]._asdict() for k in methods_a},
            "methods_b": {k: METHODS_B[k]._asdict() for k in methods_b},
            "absent": absent if "A" in parts else "",
            "seconds": seconds,
            "mode": "quick" if args.quick else "full",
        },
        "results": results,
        "machine": machine(),
    }
    report["summary"] = summary(report)
    os.makedirs(out, exist_ok=True)
    text = tables(report)
    for part in results:
        # One set of files per part, so that the parts can be run (and re-run) separately.
        stem = PART_FILES[part]
        one = {**report, "results": {part: results[part]}, "summary": {part: report["summary"][part]}}
        plot(one, part, os.path.join(out, f"{stem}.png"))
        with open(os.path.join(out, f"{stem}.md"), "w") as f:
            f.write(tables(one))
        with open(os.path.join(out, f"{stem}.json"), "w") as f:
            json.dump(jsonable(one, 5), f, allow_nan=False)
    print(text)
    print(f"total {time.time() - start:.1f} s; wrote {out}")
    return report


if __name__ == "__main__":
    main()
