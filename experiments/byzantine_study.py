"""Byzantine attacks against gossip and the robust aggregators, on a torus and on the dumbbell.

Setting (the ``jaxgossip demo`` task on IID shards): the embedded digits data (1437 train / 360
test images, 8x8, 10 classes), 16 nodes, MLP with one hidden layer of 64, batch 16 per node,
Nesterov momentum 0.9, lr 0.05 (the demo's recipe, constant), weight decay 1e-4, "atc" ordering,
identical initial models, R rounds, 2 seeds. IID shards keep the attack's effect apart from the
data each attacker withholds (under label skew the attackers' classes would be missing from the
honest nodes' data).

Graphs and attackers (``--byzantine.ids``, fixed so that every seed sees the same placement):

* ``torus(4x4)`` (weights 1/5), attackers 0 and 10: no honest node has more than one attacker among
  its 4 neighbours;
* ``dumbbell(16)`` (two 8-cliques joined by the edge 0 - 8, Metropolis weights), attackers 1 and 9,
  one inside each clique: every honest node but the bridge ends sees one attacker among its 7
  neighbours.

Attacks (:mod:`jaxgossip.algorithms.byzantine`, default options): ``gaussian`` (sigma 100),
``signflip``, ``alie`` (z from the rule of He et al.'s code, ``Phi^{-1}((N - K - s) / (N - K))``
with ``s = floor(N/2 + 1) - K``: exactly 0 at N = 16, K = 2, so the attackers send the honest
neighbourhood mean; hence also ``alie_z1``, z = 1), ``ipm`` (epsilon 0.1), ``dissensus``
(epsilon 1), plus the no-attack row (16 honest nodes). Aggregators: ``gossip``, ``clipped_gossip``
(adaptive radius: the second-largest neighbour distance, the authors' rule), ``trimmed_mean``
(trim 1) and ``median`` (coordinate-wise). Every attack x aggregator x graph is one compile (the
attack and the aggregator fix the program); the seeds share it.

Reported (mean over seeds): the test accuracy of the honest nodes' averaged model, the mean and
worst test accuracy of the honest nodes' own models, and the honest consensus distance. Every
metric is over the honest nodes only (the trainer's metrics skip attackers).

Outputs (``experiments/results/byzantine/`` by default): ``byzantine.md`` (tables),
``byzantine.json`` (settings, per-seed final numbers, curves, machine), ``byzantine.png``
(honest-node accuracy, attack x aggregator, one panel per graph).

Usage::

    python experiments/byzantine_study.py            # 200 rounds, about 30-60 min on 2 shared cores
    python experiments/byzantine_study.py --quick    # smoke run (writes to runs/byzantine_quick)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _common, also when loaded by a test

from _common import jsonable, machine  # noqa: E402

from jaxgossip import data  # noqa: E402
from jaxgossip.cli.demo import DEMO_DEFAULTS  # noqa: E402
from jaxgossip.run.runner import TrainConfig  # noqa: E402
from jaxgossip.run.training_sweeps import sweep_training  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "byzantine")
QUICK_OUT = os.path.join("runs", "byzantine_quick")
#: graph spec -> attacker ids (no honest node has two attacker neighbours)
GRAPHS = {"torus:4x4": (0, 10), "dumbbell": (1, 9)}
#: row label -> (attack, its options); "none" runs without attackers. ALIE's default z is 0 here
#: (see the module docstring), so it also runs at z = 1.
ATTACKS = {
    "none": (None, {}),
    "gaussian": ("gaussian", {}),
    "signflip": ("signflip", {}),
    "alie": ("alie", {}),
    "alie_z1": ("alie", {"z": 1.0}),
    "ipm": ("ipm", {}),
    "dissensus": ("dissensus", {}),
}
AGGREGATORS = ("gossip", "clipped_gossip", "trimmed_mean", "median")
SEEDS = (0, 1)
ROUNDS, EVAL_EVERY = 200, 25
QUICK = {"rounds": 10, "eval_every": 5, "seeds": (0,)}
FIELDS = ("test_acc", "node_acc_mean", "node_acc_min", "consensus", "test_loss")


def base_config(rounds: int, eval_every: int) -> TrainConfig:
    """The demo's config (digits, 16 nodes, MLP(64), batch 16, momentum 0.9, lr 0.05) on IID shards."""
    config = TrainConfig(**{**DEMO_DEFAULTS, "model_options": {"hidden": (64,)}})
    return config.replace(num_rounds=rounds, eval_every=eval_every, evals_per_chunk=1, partition="iid")


def run(
    graphs=tuple(GRAPHS),
    attacks=tuple(ATTACKS),
    aggregators=AGGREGATORS,
    rounds=ROUNDS,
    eval_every=EVAL_EVERY,
    seeds=SEEDS,
    log=print,
    checkpoint=None,
) -> dict:
    """Every graph x attack x aggregator cell; ``checkpoint(report)`` after each cell (the report so
    far, complete cells only), so that a long run killed midway keeps what it did."""
    dataset = data.load_dataset("digits")
    base = base_config(rounds, eval_every)
    results = {}
    report = {
        "settings": {
            "dataset": "digits",
            "partition": base.partition,
            "num_nodes": base.num_nodes,
            "model": f"mlp hidden {list(base.model_options['hidden'])}",
            "batch_size": base.batch_size,
            "lr": base.lr,
            "momentum": base.momentum,
            "weight_decay": base.weight_decay,
            "rounds": rounds,
            "eval_every": eval_every,
            "seeds": list(seeds),
            "graphs": {g: list(GRAPHS[g]) for g in graphs},
            "attacks": {a: {"attack": ATTACKS[a][0], "options": ATTACKS[a][1]} for a in attacks},
            "aggregators": list(aggregators),
        },
        "results": results,
        "machine": machine(),
    }
    for graph in graphs:
        results[graph] = {}
        for attack in attacks:
            results[graph][attack] = {}
            for aggregator in aggregators:
                name, options = ATTACKS[attack]
                byz = {} if name is None else {"ids": list(GRAPHS[graph]), "attack": name, "attack_options": options}
                config = base.replace(
                    name=f"{aggregator}_{attack}", topology=graph, algorithm=aggregator, byzantine=byz
                )
                start = time.time()
                _, metrics = sweep_training(config, {"lr": [base.lr]}, seeds, dataset)
                m = {k: np.asarray(v)[0] for k, v in metrics._asdict().items() if v is not None}  # [S, M, ...]
                seconds = time.time() - start
                results[graph][attack][aggregator] = {
                    "rounds": m["round"][0].tolist(),
                    "final": {f: m[f][:, -1] for f in FIELDS},
                    "curves": {"test_acc": m["test_acc"], "node_acc_mean": m["node_acc_mean"]},
                    "seconds": seconds,
                }
                log(
                    f"{graph:10s} {attack:10s} {aggregator:15s} acc {np.mean(m['test_acc'][:, -1]):.4f} "
                    f"nodes {np.mean(m['node_acc_mean'][:, -1]):.4f} worst {np.mean(m['node_acc_min'][:, -1]):.4f} "
                    f"consensus {np.mean(m['consensus'][:, -1]):.3g} ({seconds:.1f} s)"
                )
                if checkpoint is not None:
                    checkpoint(report)
    return report


def _mean(values) -> float:
    values = np.asarray(values, np.float64)
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else math.nan


def _cell(values, digits=3) -> str:
    values = np.asarray(values, np.float64)
    bad = int(np.sum(~np.isfinite(values)))
    text = "NaN" if bad == values.size else f"{_mean(values):.{digits}f}"
    return text + (f" ({bad} NaN)" if bad and bad < values.size else "")


def tables(report: dict) -> str:
    s = report["settings"]
    lines = []
    for graph, by_attack in report["results"].items():
        aggs = s["aggregators"]
        ids = ", ".join(str(i) for i in s["graphs"][graph])
        for field, title in (
            ("node_acc_mean", "mean test accuracy of the honest nodes' own models"),
            ("node_acc_min", "worst honest node's test accuracy"),
            ("test_acc", "test accuracy of the honest nodes' averaged model"),
            ("consensus", "honest consensus distance"),
        ):
            lines += [
                f"**{graph}, attackers {ids}: {title}** (after {s['rounds']} rounds, mean over "
                f"{len(s['seeds'])} seeds):",
                "",
                "| attack | " + " | ".join(aggs) + " |",
                "|---|" + "---:|" * len(aggs),
            ]
            for attack, by_agg in by_attack.items():
                if field == "consensus":
                    cells = [f"{_mean(by_agg[a]['final'][field]):.2e}" if a in by_agg else "not run" for a in aggs]
                else:
                    cells = [_cell(by_agg[a]["final"][field]) if a in by_agg else "not run" for a in aggs]
                lines.append(f"| {attack} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = report["settings"]
    graphs = list(report["results"])
    fig, axes = plt.subplots(1, len(graphs), figsize=(5.2 * len(graphs), 3.8), squeeze=False)
    for ax, graph in zip(axes[0], graphs):
        by_attack = report["results"][graph]
        attacks, aggs = list(by_attack), s["aggregators"]
        grid = np.array(
            [
                [_mean(by_attack[a][g]["final"]["node_acc_mean"]) if g in by_attack[a] else math.nan for g in aggs]
                for a in attacks
            ]
        )
        ax.imshow(np.nan_to_num(grid, nan=0.0), vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
        for i in range(len(attacks)):
            for j in range(len(aggs)):
                label = (
                    "-"
                    if aggs[j] not in by_attack[attacks[i]]
                    else "NaN"
                    if np.isnan(grid[i, j])
                    else f"{grid[i, j]:.2f}"
                )
                ax.text(j, i, label, ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(aggs)), [a.replace("_", "\n") for a in aggs], fontsize=8)
        ax.set_yticks(range(len(attacks)), attacks, fontsize=8)
        ax.set_title(f"{graph}, attackers {s['graphs'][graph]}", fontsize=9)
    fig.suptitle(f"digits IID, 16 nodes, {s['rounds']} rounds: mean honest-node test accuracy", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def load_reports(paths) -> dict:
    """Reports written by this script (their JSON), merged cell by cell: every graph x attack x
    aggregator cell is its own deterministic compile, so runs of disjoint subsets (``--attacks``)
    add up to the full table. NaN, stored as null, comes back as NaN."""

    def nan(value):
        if isinstance(value, list):
            return [nan(v) for v in value]
        return math.nan if value is None else value

    merged = None
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        for by_attack in report["results"].values():
            for by_agg in by_attack.values():
                for cell in by_agg.values():
                    cell["final"] = {k: nan(v) for k, v in cell["final"].items()}
        attacks = report["settings"]["attacks"]
        if isinstance(attacks, list):  # labels only: their attack and options are ATTACKS'
            report["settings"]["attacks"] = {a: {"attack": ATTACKS[a][0], "options": ATTACKS[a][1]} for a in attacks}
        if merged is None:
            merged = report
            continue
        for graph, by_attack in report["results"].items():
            merged["settings"]["graphs"].setdefault(graph, report["settings"]["graphs"][graph])
            for attack, by_agg in by_attack.items():
                merged["results"].setdefault(graph, {}).setdefault(attack, {}).update(by_agg)
        merged["settings"]["attacks"].update(report["settings"]["attacks"])
        merged["settings"]["seconds"] = merged["settings"].get("seconds", 0) + report["settings"].get("seconds", 0)
    order = list(ATTACKS)
    for graph, by_attack in merged["results"].items():
        merged["results"][graph] = {a: by_attack[a] for a in sorted(by_attack, key=order.index)}
    return merged


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 10 rounds, 1 seed")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--graphs", default=",".join(GRAPHS), help=f"comma-separated subset of {list(GRAPHS)}")
    parser.add_argument("--attacks", default=",".join(ATTACKS), help=f"comma-separated subset of {list(ATTACKS)}")
    parser.add_argument("--aggregators", default=",".join(AGGREGATORS))
    parser.add_argument("--out", default=None, help=f"output folder (default {RESULTS}; --quick: {QUICK_OUT})")
    parser.add_argument(
        "--from-json", nargs="+", default=None, help="rewrite tables and plot from saved JSONs (merged), no runs"
    )
    args = parser.parse_args(argv)
    chosen = {}
    for name, known in (("graphs", GRAPHS), ("attacks", ATTACKS), ("aggregators", AGGREGATORS)):
        values = [v for v in getattr(args, name).split(",") if v]
        unknown = [v for v in values if v not in known]
        if unknown:
            parser.error(f"unknown {name} {unknown}; known: {list(known)}")
        chosen[name] = tuple(values)
    options = dict(QUICK) if args.quick else {}
    if args.rounds is not None:
        options["rounds"] = args.rounds
    out = args.out or (QUICK_OUT if args.quick else RESULTS)
    start = time.time()
    if args.from_json:
        report = load_reports(args.from_json)
    else:
        os.makedirs(out, exist_ok=True)

        def checkpoint(partial):
            with open(os.path.join(out, "byzantine.partial.json"), "w") as f:
                json.dump(jsonable(partial), f, allow_nan=False)

        report = run(**chosen, **options, checkpoint=checkpoint)
        report["settings"]["seconds"] = round(time.time() - start, 1)
    os.makedirs(out, exist_ok=True)
    plot(report, os.path.join(out, "byzantine.png"))
    text = tables(report)
    with open(os.path.join(out, "byzantine.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "byzantine.json"), "w") as f:
        json.dump(jsonable(report), f, allow_nan=False)
    if os.path.exists(os.path.join(out, "byzantine.partial.json")):
        os.remove(os.path.join(out, "byzantine.partial.json"))
    print(text)
    print(f"total {time.time() - start:.1f} s; wrote {out}")
    return report


if __name__ == "__main__":
    main()
