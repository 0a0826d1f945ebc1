"""Low-bandwidth training over slow links: all-reduce, gossip, PowerGossip, Choco, Sparse-Push,
DiLoCo, Streaming DiLoCo, SPARTA and DeMo, by bits and by simulated time at three link tiers.

Workloads (``WORKLOADS``; every method does the same number of local steps):

* ``lm``: ``--dataset=python_docs --partition=by_source``, the byte-level transformer (depth 2,
  width 32, 2 heads, context 32: 43,136 parameters per node), AdamW lr 3e-3, weight decay 0.01,
  warm-up from 3e-4 over the first 20 local steps, cosine decay to 3e-4, gradient clipping at 1,
  batch 8 windows, 200 local steps, perplexity on 256 held-out windows every 50 steps.
* ``digits``: ``--dataset=digits --partition=dirichlet:0.1``, the MLP (85,002 parameters),
  SGD with Nesterov momentum 0.9, lr 0.05, weight decay 1e-4, batch 16, 300 local steps, test
  accuracy every 30 steps.

Methods (``METHODS``), with the graph each runs on:

* ``allreduce``: exact averaging after every step (synchronous data parallel), the reference;
* ``gossip_ring`` / ``gossip_exp``: D-SGD on the ring / the static exponential graph;
* ``power_gossip_ring``: PowerGossip rank 1 on the ring (it needs a symmetric graph);
* ``choco_ring``: Choco-SGD top-1 % per leaf, ``gamma`` 0.02, public copies at the shared init;
* ``sparse_push_1pe``: Sparse-Push top-1 % per leaf, ``gamma`` 0.02, on the one-peer exponential
  graph (directed and time-varying: one out-neighbour per round);
* ``diloco_allreduce``: DiLoCo, H = 10 inner steps, all-reduce, Nesterov outer step (lr 0.7,
  momentum 0.9); ``diloco_gossip_exp``: the same with one gossip round on the exponential graph;
* ``streaming_diloco``: Streaming DiLoCo, H = 10, F = 2 fragments, overlap tau = 1 inner step,
  mix 0.5, outer gradients as 4-bit floats (``outer_message=pseudo_gradient``), all-reduce;
* ``sparta_ring_p05``, ``sparta_complete_p05``, ``sparta_complete_p005``: SPARTA, fraction 0.05
  on the ring and on the complete graph (the reference's all-reduce form), and EXO Gym's 0.005;
* ``demo_complete``: DeMo on the complete graph (the all-gather form), k = 8 of chunk 64,
  beta 0.999, its lr from a pilot (``DEMO_LR``).

Time. Every run's compute time per local step is an assumption, ``6 P T / 1e12`` s (P parameters,
T tokens or samples per step, a device sustaining 1 TFLOP/s). Training does not depend on the
links, so each run is priced after the fact at the three tiers (``TIERS``) with
:func:`jaxgossip.sim.cost.simulate` on :func:`jaxgossip.sim.cost.per_round_bits` of its bits.
Streaming DiLoCo's overlap is priced by its own clock (``jaxgossip/sim/fragment_clock.py``): it
runs once per tier (``--time.latency`` / ``--time.bandwidth``, the three in one compile), and its
reported simulated time is used. Every other run also carries the middle tier in ``--time.*``, so
its own clock is compared with the post-hoc price (``clock_check`` in the JSON).

Seeds run in one compile per method (:func:`jaxgossip.run.training_sweeps.sweep_training`); they
share the data partition and differ in the initial model, the batches and the random draws.

Outputs (``experiments/results/wan_training/`` by default, rewritten after every method):
``wan_training.json`` (settings, every evaluation row of every seed priced at every tier, clock
check, machine), ``wan_training.md`` (tables) and per workload and N ``WORKLOAD_nN_bits.png`` and
``WORKLOAD_nN_time.png``.

Usage::

    python experiments/wan_training_study.py                  # the study (about an hour on 2 loaded cores)
    python experiments/wan_training_study.py --quick          # smoke run (writes to runs/wan_training_quick)
    python experiments/wan_training_study.py --plan digits:8:0,1,2 --methods allreduce,gossip_ring
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import NamedTuple

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _common, also when loaded by a test

from _common import jsonable, machine  # noqa: E402

from jaxgossip.run.resolve import resolve  # noqa: E402
from jaxgossip.run.runner import TrainConfig, build, metrics_to_rows  # noqa: E402
from jaxgossip.run.training_sweeps import sweep_program  # noqa: E402
from jaxgossip.sim.cost import per_round_bits, simulate  # noqa: E402
from jaxgossip.sim.network import Network  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "wan_training")
QUICK_OUT = os.path.join("runs", "wan_training_quick")
DEVICE_FLOPS = 1e12  # FLOP/s sustained by every node (an assumption; see the module docstring)


class Tier(NamedTuple):
    label: str
    bandwidth: float  # bit/s
    latency: float  # s per message


TIERS = (
    Tier("10 Mbit/s, 50 ms", 1e7, 5e-2),
    Tier("1 Gbit/s, 5 ms", 1e9, 5e-3),
    Tier("100 Gbit/s, 10 us", 1e11, 1e-5),
)
CLOCK_TIER = 1  # the tier every run's own clock carries (compared with the post-hoc price)


class Workload(NamedTuple):
    name: str
    steps: int  # local steps of every method
    eval_steps: int  # local steps between evaluations
    warmup_steps: int
    config: dict  # TrainConfig fields
    tokens_per_sample: int  # tokens per sample (1 for a classifier), for the compute assumption


LM_MODEL = {"depth": 2, "width": 32, "heads": 2, "context": 32}
WORKLOADS = {
    "lm": Workload(
        "lm",
        200,
        50,
        20,
        dict(
            dataset="python_docs",
            partition="by_source",
            model="transformer",
            model_options=LM_MODEL,
            optimizer="adamw",
            lr=3e-3,
            weight_decay=0.01,
            warmup_from=3e-4,
            lr_schedule="cosine",
            final_lr=3e-4,
            grad_clip=1.0,
            batch_size=8,
            eval_size=256,
            eval_chunk=128,
        ),
        LM_MODEL["context"],
    ),
    "digits": Workload(
        "digits",
        300,
        30,
        0,
        dict(dataset="digits", partition="dirichlet:0.1", model="mlp", lr=0.05, batch_size=16, eval_size=2000),
        1,
    ),
}
QUICK = {
    "lm": WORKLOADS["lm"]._replace(
        steps=40, eval_steps=20, warmup_steps=0, config={**WORKLOADS["lm"].config, "eval_size": 128}
    ),
    "digits": WORKLOADS["digits"]._replace(steps=40, eval_steps=20),
}

CHOCO_GAMMA = 0.02
H = 10
OUTER = {"outer_optimizer": "nesterov", "outer_lr": 0.7, "outer_momentum": 0.9}
STREAMING = {
    **OUTER,
    "outer_message": "pseudo_gradient",
    "outer_fragments": 2,
    "outer_overlap": 1,
    "outer_mix": 0.5,
    "outer_message_bits": 4,
}
# DeMo's step size per workload, from a pilot of 100 local steps on 8 nodes (the page gives it).
DEMO_LR = {"lm": 1e-2, "digits": 3e-3}
DEMO = {"k": 8, "chunk": 64, "beta": 0.999}


class Method(NamedTuple):
    label: str
    algorithm: str
    options: dict
    topology: str = "ring"
    local_steps: int = 1
    outer: dict = {}
    lr: float | None = None  # the inner optimizer's peak lr, when not the workload's


def _top1(gamma: float) -> dict:
    return {"gamma": gamma, "compressor": "top_k", "compressor_options": {"fraction": 0.01}}


METHODS = {
    "allreduce": Method("all-reduce", "allreduce", {}),
    "gossip_ring": Method("gossip (ring)", "gossip", {}),
    "gossip_exp": Method("gossip (exponential)", "gossip", {}, "exponential"),
    "power_gossip_ring": Method("PowerGossip rank 1 (ring)", "power_gossip", {"rank": 1}),
    "choco_ring": Method("Choco top-1% (ring)", "choco", {**_top1(CHOCO_GAMMA), "public_init": "model"}),
    "sparse_push_1pe": Method(
        "Sparse-Push top-1% (one-peer exp.)",
        "sparse_push",
        {"gamma": CHOCO_GAMMA, "fraction": 0.01},
        "one_peer_exponential",
    ),
    "diloco_allreduce": Method(
        f"DiLoCo H={H} (all-reduce)", "allreduce", {}, "ring", H, {**OUTER, "outer_message": "model"}
    ),
    "diloco_gossip_exp": Method(
        f"DiLoCo H={H} (gossip, exponential)", "gossip", {}, "exponential", H, {**OUTER, "outer_message": "model"}
    ),
    "streaming_diloco": Method(
        f"Streaming DiLoCo H={H} F=2 tau=1 4-bit (all-reduce)", "allreduce", {}, "ring", H, STREAMING
    ),
    "sparta_ring_p05": Method("SPARTA p=0.05 (ring)", "sparta", {"fraction": 0.05}),
    "sparta_complete_p05": Method("SPARTA p=0.05 (complete)", "sparta", {"fraction": 0.05}, "complete"),
    "sparta_complete_p005": Method("SPARTA p=0.005 (complete)", "sparta", {"fraction": 0.005}, "complete"),
    "demo_complete": Method("DeMo k=8/64 (complete)", "demo_momentum", dict(DEMO), "complete"),
    # not in the plan: the all-reduce reference at DeMo's lm step size (a control for DeMo's lr)
    "allreduce_lr1e-2": Method("all-reduce, peak lr 1e-2", "allreduce", {}, lr=1e-2),
}
# The study: (workload, N, seeds, methods), run in this order (cheap and complete first).
ALL = tuple(k for k in METHODS if k != "allreduce_lr1e-2")
N16_LM = (
    "allreduce",
    "gossip_exp",
    "power_gossip_ring",
    "sparse_push_1pe",
    "diloco_allreduce",
    "diloco_gossip_exp",
    "streaming_diloco",
    "sparta_complete_p05",
    "demo_complete",
)
PLAN = (
    ("digits", 8, (0, 1, 2), ALL),
    ("digits", 16, (0, 1), ALL),
    ("lm", 8, (0, 1), ALL),
    ("lm", 16, (0, 1), N16_LM),
)
KEEP = ("round", "local_step", "test_loss", "test_acc", "node_acc_mean", "node_loss_mean", "consensus", "MB_per_node")


def compute_seconds(workload: Workload, num_params: int) -> float:
    """Assumed seconds per local step: 6 P T FLOPs (forward + backward of a dense net) at DEVICE_FLOPS."""
    tokens = workload.config["batch_size"] * workload.tokens_per_sample
    return 6.0 * num_params * tokens / DEVICE_FLOPS


_PARAMS: dict = {}


def count_params(workload: Workload, num_nodes: int) -> int:
    """Parameters per node of the workload's model (one build per workload and N, cached)."""
    if (workload.name, num_nodes) not in _PARAMS:
        config = method_config(workload, num_nodes, "gossip_ring", 0.0)
        _PARAMS[workload.name, num_nodes] = build(config).num_params
    return _PARAMS[workload.name, num_nodes]


def tier_time(tier: Tier, seconds: float) -> dict:
    return {"compute": seconds, "latency": tier.latency, "bandwidth": tier.bandwidth}


def method_config(workload: Workload, num_nodes: int, key: str, seconds: float) -> TrainConfig:
    """One method's run: rounds, evaluation interval and warm-up converted from local steps."""
    method = METHODS[key]
    h = method.local_steps
    for what, steps in (
        ("steps", workload.steps),
        ("eval_steps", workload.eval_steps),
        ("warmup_steps", workload.warmup_steps),
    ):
        if steps % h:
            raise ValueError(f"{what}={steps} must be a multiple of local_steps={h} ({key})")
    options = dict(method.options)
    if method.algorithm == "demo_momentum":
        options["lr"] = DEMO_LR[workload.name]
    config = dict(workload.config)
    if method.lr is not None:
        config["lr"] = method.lr
    return TrainConfig(
        **config,
        num_nodes=num_nodes,
        topology=method.topology,
        algorithm=method.algorithm,
        algorithm_options=options,
        local_steps=h,
        num_rounds=workload.steps // h,
        eval_every=workload.eval_steps // h,
        warmup_rounds=workload.warmup_steps // h,
        evals_per_chunk=1,
        name=key,
        time=tier_time(TIERS[CLOCK_TIER], seconds),
        **method.outer,
    )


def price(bits_cum: np.ndarray, rounds: np.ndarray, config: TrainConfig, topology, seconds: float) -> dict:
    """Post-hoc simulated time [M] at each evaluation point for every tier (cost.simulate)."""
    allreduce = config.algorithm == "allreduce"
    per_round = per_round_bits(bits_cum, rounds, None if allreduce else topology)
    out = {}
    for tier in TIERS:
        network = Network(compute=seconds, latency=tier.latency, bandwidth=tier.bandwidth)
        report = simulate(
            per_round,
            None if allreduce else topology,
            network,
            allreduce=allreduce,
            exchanges=int(config.algorithm_options.get("num_iterations", 1)),
            local_steps=config.local_steps,
            seed=config.seed,
        )
        out[tier.label] = np.cumsum(report.round_time)[np.asarray(rounds) - 1]
    return out


def _rows(metrics, index: tuple, local_steps: int, perplexity: bool) -> list[dict]:

    one = jax.tree_util.tree_map(lambda a: None if a is None else np.asarray(a)[index], metrics)
    rows = metrics_to_rows(one, local_steps, perplexity=perplexity)
    keep = KEEP + (("perplexity", "node_perplexity") if perplexity else ())
    return [{k: row[k] for k in keep} | {"clock": row.get("sim_time")} for row in rows]


def run_method(workload: Workload, num_nodes: int, seeds, key: str) -> dict:
    """One method's runs over the seeds (and, for Streaming DiLoCo, the tiers) in one compile."""
    method = METHODS[key]
    num_params = count_params(workload, num_nodes)
    seconds = compute_seconds(workload, num_params)
    config = method_config(workload, num_nodes, key, seconds)
    prep = resolve(config)
    lm = workload.name == "lm"
    streaming = config.outer_fragments > 1
    start = time.time()
    if streaming:  # one run per tier, the (latency, bandwidth) pairs as sweep points
        axes = {"time.latency": [t.latency for t in TIERS], "time.bandwidth": [t.bandwidth for t in TIERS]}
        program = sweep_program(prep, axes, seeds)
        keys, _, tables = program.args
        values = {k: np.asarray(v, np.float32) for k, v in axes.items()}
        metrics = program.run(keys, values, tables)
    else:
        program = sweep_program(prep, {"weight_decay": [config.weight_decay]}, seeds)
        metrics = program.run(*program.args)
    jax.block_until_ready(metrics)
    seconds_wall = time.time() - start
    runs = []
    for s, seed in enumerate(seeds):
        rows = _rows(metrics, (0, s), config.local_steps, lm)
        rounds = np.asarray([row["round"] for row in rows])
        if streaming:
            times = {
                t.label: [row["clock"] for row in _rows(metrics, (g, s), config.local_steps, lm)]
                for g, t in enumerate(TIERS)
            }
            for g in range(1, len(TIERS)):  # the tiers change the clock only, never the training
                other = _rows(metrics, (g, s), config.local_steps, lm)
                assert all(a["test_loss"] == b["test_loss"] for a, b in zip(rows, other)), (key, seed)
            check = None
        else:
            bits = np.asarray(metrics.bits)[0, s]  # [M, N]
            priced = price(bits, rounds, config.replace(seed=seed), prep.topology, seconds)
            times = {label: list(map(float, t)) for label, t in priced.items()}
            clock = np.asarray([row["clock"] for row in rows], np.float64)
            post = np.asarray(times[TIERS[CLOCK_TIER].label])
            check = float(np.max(np.abs(clock - post) / post))
        for i, row in enumerate(rows):
            row["sim_time"] = {label: times[label][i] for label in times}
            del row["clock"]
        runs.append({"seed": seed, "rows": rows, "clock_check": check})
    return {
        "label": method.label,
        "algorithm": method.algorithm,
        "options": config.algorithm_options,
        "topology": method.topology,
        "local_steps": config.local_steps,
        "num_rounds": config.num_rounds,
        "outer": dict(method.outer),
        "num_params": num_params,
        "compute_seconds_per_step": seconds,
        "runs": runs,
        "seconds": seconds_wall,
    }


# ---- summaries ---------------------------------------------------------------------------------


def quality(workload: str) -> tuple[str, str, bool]:
    """(metric of the averaged model, of the nodes' own, lower is better) for a workload."""
    return ("perplexity", "node_perplexity", True) if workload == "lm" else ("test_acc", "node_acc_mean", False)


def _stat(values) -> str:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "-"
    mean = float(np.mean(values))
    spread = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    fmt = ".3f" if abs(mean) < 100 else ".1f"
    return f"{mean:{fmt}} ± {spread:{fmt}}"


TARGETS = (0.1, 0.5)  # targets: all-reduce's mean quality after these fractions of the local steps


def target_value(group: dict, workload: str, fraction: float = 0.5) -> float | None:
    """A target: all-reduce's mean metric at the first evaluation at or after ``fraction`` of the
    local steps (None without all-reduce)."""
    ref = group["methods"].get("allreduce")
    if ref is None:
        return None
    metric, _, _ = quality(workload)
    step = fraction * group["steps"]
    values = [next(r for r in run["rows"] if r["local_step"] >= step)[metric] for run in ref["runs"]]
    return float(np.mean(values))


def time_to(run: dict, metric: str, target: float, lower: bool, tier: str) -> float | None:
    """Simulated seconds at the first evaluation reaching ``target`` (None: never reached)."""
    for row in run["rows"]:
        v = row[metric]
        if v is not None and math.isfinite(v) and (v <= target if lower else v >= target):
            return row["sim_time"][tier]
    return None


def _seconds(values) -> str:
    values = list(values)
    done = [v for v in values if v is not None]
    if len(done) < len(values):
        return f"not reached ({len(done)}/{len(values)})" if done else "not reached"
    mean = float(np.mean(done))
    spread = float(np.std(done, ddof=1)) if len(done) > 1 else 0.0
    if spread <= 1e-6 * abs(mean):  # the same in every seed (float rounding apart)
        return f"{mean:.3g}"
    return f"{mean:.3g} ± {spread:.2g}"


def _mean_time(runs, metric, target, lower, tier) -> float | None:
    times = [time_to(run, metric, target, lower, tier) for run in runs]
    return None if any(t is None for t in times) else float(np.mean(times))


def group_table(group: dict) -> str:
    workload = group["workload"]
    metric, node_metric, lower = quality(workload)
    name = "perplexity" if workload == "lm" else "test accuracy"
    seeds = ", ".join(str(s) for s in group["seeds"])
    lines = [
        f"### {workload}, N = {group['num_nodes']} (seeds {seeds}; {group['steps']} local steps; mean ± std)",
        "",
        "Final evaluation; simulated seconds to it at each tier:",
        "",
        f"| method | rounds | {name} (avg model) | (nodes' own) | MB / node | "
        + " | ".join(f"s, {t.label}" for t in TIERS)
        + " |",
        "|---|---:|---:|---:|---:|" + "---:|" * len(TIERS),
    ]
    for m in group["methods"].values():
        finals = [run["rows"][-1] for run in m["runs"]]
        end = [_seconds(row["sim_time"][t.label] for row in finals) for t in TIERS]
        lines.append(
            f"| {m['label']} | {m['num_rounds']} | {_stat(r[metric] for r in finals)} | "
            f"{_stat(r[node_metric] for r in finals)} | {_stat(r['MB_per_node'] for r in finals)} | "
            + " | ".join(end)
            + " |"
        )
    targets = [(f, target_value(group, workload, f)) for f in TARGETS]
    targets = [(f, v) for f, v in targets if v is not None]
    if not targets:
        return "\n".join(lines) + "\n"
    lines += [
        "",
        "Simulated seconds to a target (all-reduce's mean "
        + name
        + " at "
        + " and ".join(f"{f:.0%} of the steps: {v:.3f}" for f, v in targets)
        + "), at the first evaluation reaching it; every seed must reach it:",
        "",
        "| method | " + " | ".join(f"{v:.3f}, {t.label}" for _, v in targets for t in TIERS) + " |",
        "|---|" + "---:|" * (len(targets) * len(TIERS)),
    ]
    for m in group["methods"].values():
        cells = [
            _seconds(time_to(run, metric, v, lower, t.label) for run in m["runs"]) for _, v in targets for t in TIERS
        ]
        lines.append(f"| {m['label']} | " + " | ".join(cells) + " |")
    lines.append("")
    for _, v in targets:
        wins = []
        for t in TIERS:
            times = {m["label"]: _mean_time(m["runs"], metric, v, lower, t.label) for m in group["methods"].values()}
            times = {k: x for k, x in times.items() if x is not None}
            best = min(times, key=times.get) if times else "none"
            wins.append(f"{t.label}: {best}" + (f" ({times[best]:.3g} s)" if times else ""))
        lines.append(f"Fastest to {v:.3f}: " + "; ".join(wins) + ".")
        lines.append("")
    return "\n".join(lines) + "\n"


def report_text(report: dict) -> str:
    s = report["settings"]
    parts = [
        f"Compute per local step assumed 6 P T / {DEVICE_FLOPS:.0e} FLOP/s; tiers: "
        + "; ".join(t.label for t in TIERS)
        + f". Mode: {s['mode']}.",
        "",
    ]
    for group in report["groups"]:
        parts.append(group_table(group))
    checks = [
        (g["workload"], g["num_nodes"], key, run["clock_check"])
        for g in report["groups"]
        for key, m in g["methods"].items()
        for run in m["runs"]
        if run["clock_check"] is not None
    ]
    if checks:
        worst = max(checks, key=lambda c: c[3])
        parts.append(
            f"Run's own clock vs cost.simulate at {TIERS[CLOCK_TIER].label}: largest relative difference over "
            f"{len(checks)} runs {worst[3]:.2e} ({worst[0]}, N = {worst[1]}, {worst[2]}).\n"
        )
    return "\n".join(parts)


def plot(group: dict, out: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workload = group["workload"]
    metric, _, lower = quality(workload)
    ylabel = "perplexity (averaged model)" if workload == "lm" else "test accuracy (averaged model)"
    prefix = os.path.join(out, f"{workload}_n{group['num_nodes']}")
    keys = list(group["methods"])
    cmap = plt.get_cmap("tab20")
    colors = {k: cmap(i % 20) for i, k in enumerate(keys)}
    styles = {k: ("--" if k.startswith(("allreduce", "diloco", "streaming")) else "-") for k in keys}

    def curve(m, x):
        runs = m["runs"]
        xs = np.mean([[x(r) for r in run["rows"]] for run in runs], axis=0)
        ys = np.asarray([[r[metric] if r[metric] is not None else np.nan for r in run["rows"]] for run in runs])
        return xs, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0)

    def finish(ax, xlabel):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_xscale("log")
        if lower:
            ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)

    paths = []
    fig, ax = plt.subplots(figsize=(11, 5))
    for key, m in group["methods"].items():
        xs, mean, lo, hi = curve(m, lambda r: max(r["MB_per_node"], 1e-6))
        ax.plot(xs, mean, marker="o", ms=3, color=colors[key], ls=styles[key], label=m["label"])
        ax.fill_between(xs, lo, hi, color=colors[key], alpha=0.15)
    finish(ax, "MB sent per node")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle(f"{workload}, N = {group['num_nodes']}: quality vs MB sent (mean, band min-max over seeds)")
    fig.tight_layout()
    fig.savefig(prefix + "_bits.png", dpi=72)
    plt.close(fig)
    paths.append(prefix + "_bits.png")

    fig, axes = plt.subplots(1, len(TIERS), figsize=(6 * len(TIERS), 5.6))
    for ax, tier in zip(axes, TIERS):
        for key, m in group["methods"].items():
            xs, mean, lo, hi = curve(m, lambda r, t=tier.label: r["sim_time"][t])
            ax.plot(xs, mean, marker="o", ms=3, color=colors[key], ls=styles[key], label=m["label"])
            ax.fill_between(xs, lo, hi, color=colors[key], alpha=0.15)
        finish(ax, f"simulated seconds, {tier.label}")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=4)
    fig.suptitle(f"{workload}, N = {group['num_nodes']}: quality vs simulated time per link tier")
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.savefig(prefix + "_time.png", dpi=72)
    plt.close(fig)
    paths.append(prefix + "_time.png")
    return paths


def write(report: dict, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "wan_training.json")
    with open(path + ".tmp", "w") as f:
        json.dump(jsonable(report, digits=None), f, indent=1, allow_nan=False)
    os.replace(path + ".tmp", path)
    with open(os.path.join(out, "wan_training.md"), "w") as f:
        f.write(report_text(report))


def parse_plan(specs, methods) -> tuple:
    """``WORKLOAD:N:SEEDS`` strings (seeds comma-separated) as plan entries over ``methods``."""
    plan = []
    for spec in specs:
        try:
            workload, n, seeds = spec.split(":")
            plan.append((workload, int(n), tuple(int(s) for s in seeds.split(",")), methods))
        except ValueError as err:
            raise ValueError(f"--plan {spec!r}: expected WORKLOAD:N:SEED,SEED ({err})") from err
        if workload not in WORKLOADS:
            raise ValueError(f"--plan {spec!r}: unknown workload {workload!r}; known {list(WORKLOADS)}")
    return tuple(plan)


def _same_settings(old: dict, new: dict) -> list[str]:
    """Settings keys whose values differ between an existing report and this run's.

    The plan is excluded, methods added since are allowed, and a key absent from the old report
    equals a ``None`` one (fields added with a default that keeps old results valid).
    """

    def canon(value):
        value = json.loads(json.dumps(jsonable(value, digits=None)))

        def drop_none(v):
            if isinstance(v, dict):
                return {k: drop_none(x) for k, x in v.items() if x is not None}
            return v

        return drop_none(value)

    differ = []
    for key in new:
        if key == "plan":
            continue
        a, b = canon(old.get(key)), canon(new[key])
        if key == "methods" and isinstance(a, dict):
            b = {k: v for k, v in b.items() if k in a}
        if a != b:
            differ.append(key)
    return differ


def _order_methods(group: dict) -> None:
    """Puts a group's methods in METHODS' order, whichever run added them (the tables' row order)."""
    rank = {key: i for i, key in enumerate(METHODS)}
    group["methods"] = dict(sorted(group["methods"].items(), key=lambda kv: rank.get(kv[0], len(rank))))


def run(
    plan=PLAN, quick: bool = False, out: str = RESULTS, log=print, methods=None, extend: dict | None = None
) -> dict:
    """Train every (workload, N, seeds, methods) entry of ``plan``; write after each method.

    ``extend``: a report this script wrote earlier with the same settings; its groups are kept, a plan
    entry matching a group (workload, N, seeds) adds only the methods that group lacks.
    """
    workloads = QUICK if quick else WORKLOADS
    report = {
        "settings": {
            "mode": "quick" if quick else "full",
            "workloads": {k: w._asdict() for k, w in workloads.items()},
            "tiers": [t._asdict() for t in TIERS],
            "clock_tier": TIERS[CLOCK_TIER].label,
            "device_flops": DEVICE_FLOPS,
            "methods": {k: m._asdict() for k, m in METHODS.items()},
            "demo_lr": DEMO_LR,
            "plan": [list(p[:3]) + [list(methods or p[3])] for p in plan],
        },
        "groups": [],
        "machine": machine(),
    }
    if extend is not None:
        differ = _same_settings(extend["settings"], report["settings"])
        if differ:
            raise ValueError(f"--extend: the existing report was made with other settings: {differ}")
        report["settings"]["plan"] = extend["settings"]["plan"] + report["settings"]["plan"]
        report["groups"] = extend["groups"]
    for workload_name, num_nodes, seeds, keys in plan:
        workload = workloads[workload_name]
        where = (workload_name, num_nodes, list(seeds), workload.steps)
        found = [g for g in report["groups"] if (g["workload"], g["num_nodes"], g["seeds"], g["steps"]) == where]
        if found:
            group = found[0]
        else:
            group = {
                "workload": workload_name,
                "num_nodes": num_nodes,
                "seeds": list(seeds),
                "steps": workload.steps,
                "methods": {},
            }
            report["groups"].append(group)
        for key in methods or keys:
            if key in group["methods"]:
                log(f"{workload_name} N={num_nodes} {key}: kept from the existing report")
                continue
            m = run_method(workload, num_nodes, seeds, key)
            group["methods"][key] = m
            _order_methods(group)
            metric, node_metric, _ = quality(workload_name)
            finals = [r["rows"][-1] for r in m["runs"]]
            log(
                f"{workload_name} N={num_nodes} {m['label']:52s} {metric} {_stat(r[metric] for r in finals)}  "
                f"nodes {_stat(r[node_metric] for r in finals)}  {finals[0]['MB_per_node']:.2f} MB/node  "
                f"({m['seconds']:.0f} s)"
            )
            write(report, out)
        plot(group, out)
    return report


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 40 local steps, 4 nodes, one seed")
    parser.add_argument("--plan", action="append", help="WORKLOAD:N:SEEDS (repeatable); default: the study's plan")
    parser.add_argument("--methods", default=None, help=f"comma-separated subset of {list(METHODS)}")
    parser.add_argument("--out", default=None, help=f"output folder (default {RESULTS}; --quick: {QUICK_OUT})")
    parser.add_argument(
        "--extend",
        action="store_true",
        help="keep OUT/wan_training.json's groups and add the planned methods they lack (same settings only)",
    )
    parser.add_argument(
        "--retable", default=None, help="a wan_training.json: rewrite its tables and plots, no training"
    )
    args = parser.parse_args(argv)
    if args.retable:
        with open(args.retable) as f:
            report = json.load(f)
        folder = os.path.dirname(os.path.abspath(args.retable))
        for group in report["groups"]:
            _order_methods(group)
        write(report, folder)
        for group in report["groups"]:
            if group["methods"]:
                plot(group, folder)
        print(report_text(report))
        return report
    methods = None
    if args.methods:
        methods = tuple(m for m in args.methods.split(",") if m)
        unknown = [m for m in methods if m not in METHODS]
        if unknown:
            parser.error(f"unknown methods {unknown}; known: {list(METHODS)}")
    try:
        plan = parse_plan(args.plan, methods or ALL) if args.plan else PLAN
    except ValueError as err:
        parser.error(str(err))
    if args.quick and not args.plan:
        plan = (("digits", 4, (0,), ALL),)
    out = args.out or (QUICK_OUT if args.quick else RESULTS)
    extend = None
    if args.extend:
        with open(os.path.join(out, "wan_training.json")) as f:
            extend = json.load(f)
    start = time.time()
    try:
        report = run(plan, quick=args.quick, out=out, methods=methods, extend=extend)
    except ValueError as err:
        parser.error(str(err))
    report["settings"]["seconds"] = round(time.time() - start + (extend or {}).get("settings", {}).get("seconds", 0), 1)
    write(report, out)
    print(report_text(report))
    print(f"total {time.time() - start:.1f} s; wrote {out}")
    return report


if __name__ == "__main__":
    main()
