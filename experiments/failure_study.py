"""Link failures and random graphs in training: (a) a link-failure sweep, (b) random vs static graphs.

Setting (the demo's, ``jaxgossip demo``): the embedded digits data split over 16 workers by
Dirichlet(0.1), an MLP with one hidden layer of 64, batch 16 per node, SGD lr 0.05, weight decay
1e-4, evaluation on 360 test images every 40 rounds; each method with the demo's options and
graph (gossip, Choco top-10% gamma 0.3 and PowerGossip rank 1 on ring(16); push-sum and
Sparse-Push 10% gamma 0.3 on the one-peer exponential graph).

(a) **Link failures**: every method on ``with_failures(graph, link_drop=p)`` for p in
{0, 0.1, 0.3, 0.5}. The probabilities are traced (``Topology.draw_args``), so the four graphs of a
method stack and train in one vmapped program: one compile per method (the script checks the
compile groups). Reported: final accuracy of the averaged model vs p, and accuracy vs MB sent per
node (bits count only the messages sent; Choco and Sparse-Push deliver their compressed updates
to every holder of their public copy whatever the failures, by design, so their bits do not fall).

(b) **Random vs static graphs** at equal bits per round: gossip on ring(16) (2 messages per node
and round), the one-peer exponential graph and a fresh random matching per round (1 message
each); push-sum on the one-peer exponential graph, the directed ring and random_out(16, s=1)
(1 message each). Reported: accuracy vs MB/node, the training consensus distance vs rounds, and
plain averaging (``sweeps.sweep_topologies``, D = 64, 3 seeds) error vs rounds.

Outputs (``experiments/results/failure_study/``): ``failure_vs_p.png``, ``failure_vs_bits.png``,
``random_graphs.png``, ``failure_study.json`` (curves, settings, machine, load),
``failure_study.md`` (the tables of experiments/studies/failures.md).

Usage::

    python experiments/failure_study.py               # both studies, a few minutes on 2 cores
    python experiments/failure_study.py --study a     # only the failure sweep
    python experiments/failure_study.py --quick       # smoke run: tiny rounds, seconds per method
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time

import jax
import numpy as np
from _common import cpu_model

from jaxgossip import topology as T
from jaxgossip.cli.demo import DEMO_DEFAULTS
from jaxgossip.engine import sweeps
from jaxgossip.run.config import TrainConfig
from jaxgossip.run.resolve import check_train_config, resolve
from jaxgossip.run.training_sweeps import sweep_topologies_training

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "failure_study")
N = 16
PS = (0.0, 0.1, 0.3, 0.5)

# The demo's methods (jaxgossip.cli.demo), each with its graph.
METHODS = {
    "gossip": ("gossip", "ring", {}),
    "choco top-10%": (
        "choco",
        "ring",
        {"compressor": "top_k", "compressor_options": {"fraction": 0.1}, "gamma": 0.3},
    ),
    "power_gossip r1": ("power_gossip", "ring", {"rank": 1, "num_iterations": 1}),
    "push_sum": ("push_sum", "one_peer_exponential", {}),
    "sparse_push 10%": ("sparse_push", "one_peer_exponential", {"fraction": 0.1, "gamma": 0.3}),
}
# Study (b): method -> graphs sending equal bits per round (but the ring: two messages).
RANDOM = {
    "gossip": ["ring", "one_peer_exponential", "random_matching"],
    "push_sum": ["one_peer_exponential", "directed_ring", "random_out:1"],
}


def base_config(quick: bool, rounds: int | None) -> TrainConfig:
    values = dict(DEMO_DEFAULTS)
    if quick:
        values.update(num_rounds=10, eval_every=5, evals_per_chunk=1, eval_size=60)
    if rounds:
        values.update(num_rounds=rounds)
    return TrainConfig(**values)


def summarize(metrics) -> dict:
    """Curves of one graph, averaged over seeds (leaves [S, M, ...])."""
    acc = np.asarray(metrics.test_acc, np.float64)
    return {
        "round": np.asarray(metrics.round)[0].tolist(),
        "test_acc": acc.mean(0).tolist(),
        "test_acc_seeds_final": acc[:, -1].tolist(),
        "consensus": np.asarray(metrics.consensus, np.float64).mean(0).tolist(),
        "MB_per_node": (np.asarray(metrics.bits, np.float64).mean(axis=(0, 2)) / 8e6).tolist(),
        "finite": bool(np.all(np.isfinite(np.asarray(metrics.train_loss)))),
    }


def train_graphs(config, algorithm, options, graphs, seeds, prep):
    """Trains ``config`` with ``algorithm`` on every graph; returns (curves, compile groups, seconds)."""
    config = check_train_config(config.replace(algorithm=algorithm, algorithm_options=options))
    start = time.perf_counter()
    metrics, groups = sweep_topologies_training(config, graphs, seeds, dataset=prep.dataset)
    return [summarize(m) for m in metrics], groups, time.perf_counter() - start


def study_a(config, seeds, methods, prep) -> dict:
    out = {}
    for label in methods:
        algorithm, spec, options = METHODS[label]
        base = T.make(spec, N, seed=config.seed)
        graphs = [T.with_failures(base, link_drop=p) for p in PS]
        curves, groups, seconds = train_graphs(config, algorithm, options, graphs, seeds, prep)
        out[label] = {"graph": base.name, "p": list(PS), "curves": curves, "groups": groups, "seconds": seconds}
        finals = "  ".join(
            f"p={p:g}: {c['test_acc'][-1]:.3f} ({c['MB_per_node'][-1]:.2f} MB)" for p, c in zip(PS, curves)
        )
        print(f"(a) {label:<16} compiles {len(groups)}  {seconds:6.1f} s  {finals}", flush=True)
    return out


def study_b(config, seeds, methods, prep, quick) -> dict:
    out = {}
    rounds, dim = (10, 8) if quick else (60, 64)
    for algorithm in methods:
        graphs = [T.make(spec, N, seed=config.seed) for spec in RANDOM[algorithm]]
        curves, groups, seconds = train_graphs(config, algorithm, {}, graphs, seeds, prep)
        averaging = sweeps.sweep_topologies(algorithm, graphs, dim=dim, num_steps=rounds, seeds=[0, 1, 2])
        out[algorithm] = {
            "graphs": [g.name for g in graphs],
            "curves": curves,
            "groups": groups,
            "seconds": seconds,
            "averaging_error": [e.mean(0).tolist() for e in averaging.error],
            "averaging_MB_per_node": [(b.mean(0).cumsum() / N / 8e6).tolist() for b in averaging.bits],
        }
        finals = "  ".join(
            f"{g.name}: {c['test_acc'][-1]:.3f} ({c['MB_per_node'][-1]:.2f} MB)" for g, c in zip(graphs, curves)
        )
        print(f"(b) {algorithm:<9} {seconds:6.1f} s  {finals}", flush=True)
    return out


def accuracy_at(curve: dict, budget: float) -> float:
    """Accuracy at the last evaluation point with at most ``budget`` MB/node sent (NaN if none)."""
    mb, acc = np.asarray(curve["MB_per_node"]), np.asarray(curve["test_acc"])
    inside = np.flatnonzero(mb <= budget * (1 + 1e-9))
    return float(acc[inside[-1]]) if inside.size else float("nan")


def early_round(curve: dict) -> int:
    """The evaluation point a fifth into the run (round 80 of 400), where accuracy has not yet
    saturated on digits; the first point in a run too short for that."""
    rounds = curve["round"]
    return rounds[max(0, len(rounds) // 5 - 1)]


def table_a(result: dict) -> str:
    first = next(iter(result.values()))["curves"][0]
    early = early_round(first)
    lines = [
        "| method (graph) | " + " | ".join(f"p = {p:g}" for p in PS) + " | MB/node at p = 0 / 0.5 | compiles |",
        "|---|" + "---|" * len(PS) + "---|---|",
    ]
    for label, r in result.items():
        cells = []
        for c in r["curves"]:
            seeds = np.asarray(c["test_acc_seeds_final"])
            spread = f" ± {seeds.std():.3f}" if seeds.size > 1 else ""
            at_early = c["test_acc"][c["round"].index(early)]
            cells.append(f"{c['test_acc'][-1]:.3f}{spread} ({at_early:.3f})" + ("" if c["finite"] else " (NaN)"))
        mb = f"{r['curves'][0]['MB_per_node'][-1]:.2f} / {r['curves'][-1]['MB_per_node'][-1]:.2f}"
        lines.append(f"| {label} ({r['graph']}) | " + " | ".join(cells) + f" | {mb} | {len(r['groups'])} |")
    return "\n".join(lines)


def table_b(result: dict) -> str:
    lines = [
        "| method | graph | final acc | MB/node | acc at equal MB (small / full budget) | training consensus "
        "distance, max / final | averaging error after all rounds |",
        "|---|---|---|---|---|---|---|",
    ]
    for algorithm, r in result.items():
        budget = min(c["MB_per_node"][-1] for c in r["curves"])
        small = min(c["MB_per_node"][max(0, len(c["round"]) // 5 - 1)] for c in r["curves"])
        for name, c, err in zip(r["graphs"], r["curves"], r["averaging_error"]):
            lines.append(
                f"| {algorithm} | {name} | {c['test_acc'][-1]:.3f} | {c['MB_per_node'][-1]:.2f} | "
                f"{accuracy_at(c, small):.3f} / {accuracy_at(c, budget):.3f} (at {small:.2f} / {budget:.2f} MB) | "
                f"{max(c['consensus']):.3g} / {c['consensus'][-1]:.3g} | {err[-1]:.2e} |"
            )
    return "\n".join(lines)


def plot(result: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "a" in result:
        a = result["a"]
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for label, r in a.items():
            ax.plot(PS, [c["test_acc"][-1] for c in r["curves"]], "o-", label=label)
        ax.set(xlabel="link drop probability p", ylabel="final test accuracy (averaged model)")
        ax.set_title("digits, 16 nodes, Dirichlet(0.1)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "failure_vs_p.png"), dpi=120)
        plt.close(fig)
        fig, axes = plt.subplots(1, len(a), figsize=(3.2 * len(a), 3.2), squeeze=False, sharey=True)
        for ax, (label, r) in zip(axes[0], a.items()):
            for p, c in zip(PS, r["curves"]):
                ax.plot(c["MB_per_node"], c["test_acc"], "o-", ms=3, label=f"p={p:g}")
            ax.set(title=label, xlabel="MB sent per node")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("test accuracy")
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "failure_vs_bits.png"), dpi=120)
        plt.close(fig)
    if "b" in result:
        b = result["b"]
        fig, axes = plt.subplots(len(b), 3, figsize=(13, 3.4 * len(b)), squeeze=False)
        for row, (algorithm, r) in zip(axes, b.items()):
            for name, c, err in zip(r["graphs"], r["curves"], r["averaging_error"]):
                row[0].semilogy(np.arange(len(err)), err, label=name)  # index 0: the start
                row[1].semilogy(c["round"], np.maximum(c["consensus"], 1e-12), "o-", ms=3, label=name)
                row[2].plot(c["MB_per_node"], c["test_acc"], "o-", ms=3, label=name)
            row[0].set(title=f"{algorithm}: averaging, D = 64", xlabel="round", ylabel="consensus error")
            row[1].set(title=f"{algorithm}: training", xlabel="round", ylabel="consensus distance")
            row[2].set(title=f"{algorithm}: training", xlabel="MB sent per node", ylabel="test accuracy")
            for ax in row:
                ax.grid(alpha=0.3)
            row[0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "random_graphs.png"), dpi=110)
        plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--study", choices=["a", "b", "both"], default="both")
    parser.add_argument("--quick", action="store_true", help="smoke run: 10 rounds, one seed")
    parser.add_argument("--rounds", type=int, default=None, help="training rounds (default: the demo's 400)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per graph (default 2)")
    parser.add_argument("--methods", default=None, help="comma-separated subset (study a: labels' first word)")
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--from-json", default=None, help="only redraw tables and plots from a saved JSON")
    args = parser.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        result = {k: saved[k] for k in ("a", "b") if k in saved}
        write_report(result, args.out)
        return result
    config = base_config(args.quick, args.rounds)
    seeds = [0] if args.quick else list(range(args.seeds))
    chosen = None if args.methods is None else args.methods.split(",")
    methods_a = [m for m in METHODS if chosen is None or m.split()[0] in chosen]
    methods_b = [m for m in RANDOM if chosen is None or m in chosen]
    prep = resolve(config.replace(algorithm="gossip", topology="ring"))
    load_before = os.getloadavg()
    start = time.perf_counter()
    result = {}
    if args.study in ("a", "both"):
        result["a"] = study_a(config, seeds, methods_a, prep)
    if args.study in ("b", "both"):
        result["b"] = study_b(config, seeds, methods_b, prep, args.quick)
    seconds = time.perf_counter() - start
    os.makedirs(args.out, exist_ok=True)
    meta = {
        "config": config.to_dict(),
        "seeds": seeds,
        "link_drop": list(PS),
        "seconds": seconds,
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "load_avg_before": load_before,
            "load_avg_after": os.getloadavg(),
            "jax": jax.__version__,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
        },
    }
    with open(os.path.join(args.out, "failure_study.json"), "w") as f:
        json.dump({"meta": meta, **result}, f, indent=1)
    write_report(result, args.out)
    print(f"total {seconds:.0f} s; load average before/after {load_before} / {os.getloadavg()}")
    return result


def write_report(result: dict, out: str) -> None:
    parts = []
    if "a" in result:
        early = early_round(next(iter(result["a"].values()))["curves"][0])
        title = f"## (a) link failures: final test accuracy (mean ± std over seeds; in brackets at round {early})"
        parts += [title, "", table_a(result["a"]), ""]
    if "b" in result:
        parts += ["## (b) random vs static graphs", "", table_b(result["b"]), ""]
    with open(os.path.join(out, "failure_study.md"), "w") as f:
        f.write("\n".join(parts))
    plot(result, out)
    print("\n".join(parts))


if __name__ == "__main__":
    main()
