"""Every topology family at N = 16, 32, 64: spectral gap, effective neighbours, consensus, training.

Families (``jaxgossip.topology.make`` specs; every size is a power of 2, so every family has all
three sizes): ring, directed_ring, torus (4x4, 4x8, 8x8), hypercube, exponential,
one_peer_exponential, complete, star, erdos_renyi with p = 2 ln(N) / N, random_matching, chain,
binary_tree, dumbbell, spanning_tree:torus, d_equistatic / u_equistatic (M = ceil(log2 N) basis
graphs, seed 0), od_equidyn / ou_equidyn (eta 0.5), base:1 / base:2 / base:3 (the Base-(k+1)
graphs of maximum degree k). Only doubly stochastic graphs are kept (gossip's requirement), so
``random_out`` and ``random_directed`` (column stochastic) are left out.

Per graph:

* spectral gap ``1 - |lambda_2|`` (:func:`jaxgossip.topology.spectral_gap`; per round of one period
  for schedules, the expected gap for drawn graphs) and the effective number of neighbours
  ``n_W(0.99)`` of "Beyond spectral gap" (:func:`jaxgossip.topology.effective_neighbors`; fixed
  graphs only, so none for random_matching and the EquiDyn graphs);
* consensus: exact gossip (gamma 1) from ``x0 ~ N(0, 1)^[N, 16]``, 2 seeds, through
  :func:`jaxgossip.engine.sweeps.sweep_topologies` (one compile per group of same-shape graphs): the
  first round at which ``||X_r - X_bar||^2 / ||X_0 - X_bar||^2 <= 1e-6`` (seed mean; "> R" if not
  reached in R rounds);
* training: the ``jaxgossip demo`` task (embedded digits, MLP(64), batch 16, Nesterov momentum
  0.9, lr 0.05, weight decay 1e-4) on ``shards:2`` label shards (every node holds two sorted-label
  shards, about 2 classes; Dirichlet(0.1) leaves a node 11 samples at N = 64, fewer than a batch)
  with D-SGD (gossip) for a fixed budget of
  R_train rounds, 2 seeds, through
  :func:`jaxgossip.run.training_sweeps.sweep_topologies_training` (one compile per group of
  same-shape graphs): the test accuracy of the averaged model and the mean and worst test accuracy
  of the nodes' own models.

Outputs (``experiments/results/topology_families/`` by default): ``topology_families.md``
(tables), ``topology_families.json`` (rows, settings, machine), ``topology_families.png`` (rounds
to 1e-6 against the gap, node accuracy against the gap and against n_W).

Usage::

    python experiments/topology_families_study.py            # about 55 min on 2 shared cores
    python experiments/topology_families_study.py --quick    # N = 16 only, short runs
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

from jaxgossip import data, topology  # noqa: E402
from jaxgossip.cli.demo import DEMO_DEFAULTS  # noqa: E402
from jaxgossip.engine import sweeps
from jaxgossip.run.runner import TrainConfig  # noqa: E402
from jaxgossip.run.training_sweeps import sweep_topologies_training  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "topology_families")
QUICK_OUT = os.path.join("runs", "topology_families_quick")
FAMILIES = (
    "ring", "directed_ring", "torus", "hypercube", "exponential", "one_peer_exponential", "complete", "star",
    "erdos_renyi", "random_matching", "chain", "binary_tree", "dumbbell", "spanning_tree:torus",
    "d_equistatic", "u_equistatic", "od_equidyn", "ou_equidyn", "base:1", "base:2", "base:3",
)  # fmt: skip
SIZES = (16, 32, 64)
TOL = 1e-6
GAMMA = 0.99  # the decay of n_W
CONSENSUS_ROUNDS, DIM = 4000, 16
TRAIN_ROUNDS, EVAL_EVERY = 200, 50
SEEDS = (0, 1)
PARTITION = "shards:2"
QUICK = {"sizes": (16,), "consensus_rounds": 300, "train_rounds": 10, "eval_every": 5, "seeds": (0,)}


def spec_for(family: str, n: int) -> str:
    """The ``topology.make`` spec of a family at N nodes (erdos_renyi gets p = 2 ln(N) / N)."""
    if family == "erdos_renyi":
        return f"erdos_renyi:{round(min(0.9, 2 * math.log(n) / n), 4)}"
    return family


def base_config(train_rounds: int, eval_every: int) -> TrainConfig:
    """The demo's config (digits, MLP(64), batch 16, momentum 0.9, lr 0.05) on ``shards:2``, D-SGD."""
    config = TrainConfig(**{**DEMO_DEFAULTS, "model_options": {"hidden": (64,)}})
    return config.replace(
        num_rounds=train_rounds, eval_every=eval_every, evals_per_chunk=1, algorithm="gossip", partition=PARTITION
    )


def run(
    families=FAMILIES,
    sizes=SIZES,
    consensus_rounds=CONSENSUS_ROUNDS,
    train_rounds=TRAIN_ROUNDS,
    eval_every=EVAL_EVERY,
    seeds=SEEDS,
    log=print,
) -> dict:
    dataset = data.load_dataset("digits")
    base = base_config(train_rounds, eval_every)
    rows, timing = [], {}
    for n in sizes:
        graphs = [topology.make(spec_for(f, n), n, seed=0) for f in families]
        start = time.time()
        consensus = sweeps.sweep_topologies("gossip", graphs, dim=DIM, num_steps=consensus_rounds, seeds=list(seeds))
        consensus_rows = sweeps.topology_rows(consensus, tol=TOL, gamma=GAMMA)  # gap, n_W, rounds to TOL
        t_consensus = time.time() - start
        start = time.time()
        metrics, groups = sweep_topologies_training(base.replace(num_nodes=n), graphs, seeds, dataset)
        t_train = time.time() - start
        timing[n] = {
            "consensus_s": t_consensus,
            "train_s": t_train,
            "consensus_groups": len(consensus.groups),
            "train_groups": len(groups),
        }
        log(
            f"N={n}: consensus {t_consensus:.1f} s ({len(consensus.groups)} compiles), "
            f"training {t_train:.1f} s ({len(groups)} compiles)"
        )
        for family, topo, crow, m in zip(families, graphs, consensus_rows, metrics):
            final = {k: np.asarray(getattr(m, k))[:, -1] for k in ("test_acc", "node_acc_mean", "node_acc_min")}
            rows.append(
                {
                    "family": family,
                    "name": topo.name,
                    "N": n,
                    "period": topo.period,
                    "stochastic": bool(topo.stochastic),
                    "spectral_gap": crow["spectral_gap"],
                    "effective_neighbors": crow["effective_neighbors"],
                    "mean_degree": crow["mean_degree"],
                    "rounds_to_tol": crow["rounds_to_tol"],
                    "final_error": crow["final_error"],
                    "test_acc": float(np.mean(final["test_acc"])),
                    "node_acc_mean": float(np.mean(final["node_acc_mean"])),
                    "node_acc_min": float(np.mean(final["node_acc_min"])),
                    "node_acc_mean_seeds": final["node_acc_mean"].tolist(),
                }
            )
            r = rows[-1]
            log(
                f"  {topo.name:36s} gap {r['spectral_gap']:.4f} n_W {r['effective_neighbors']:6.2f} "
                f"rounds {r['rounds_to_tol']:7.1f} acc {r['test_acc']:.4f} nodes {r['node_acc_mean']:.4f}"
            )
    return {
        "settings": {
            "families": list(families),
            "sizes": list(sizes),
            "tol": TOL,
            "gamma_effective_neighbors": GAMMA,
            "consensus": {"algorithm": "gossip", "dim": DIM, "rounds": consensus_rounds},
            "training": {
                "dataset": "digits",
                "partition": base.partition,
                "model": f"mlp hidden {list(base.model_options['hidden'])}",
                "algorithm": "gossip",
                "batch_size": base.batch_size,
                "lr": base.lr,
                "momentum": base.momentum,
                "rounds": train_rounds,
            },
            "seeds": list(seeds),
            "timing": timing,
        },
        "rows": rows,
        "machine": machine(),
    }


def _num(value: float, fmt: str, none: str = "-") -> str:
    return none if value is None or not math.isfinite(value) else format(value, fmt)


def tables(report: dict) -> str:
    s = report["settings"]
    rounds = s["consensus"]["rounds"]
    lines = [
        f"Consensus: exact gossip, D = {s['consensus']['dim']}, first round with relative error <= {s['tol']:g} "
        f'("> {rounds}": not reached). Training: D-SGD, digits {s["training"]["partition"]}, '
        f"{s['training']['rounds']} rounds, accuracies on the test set. Mean over {len(s['seeds'])} seeds; "
        f"n_W at gamma {s['gamma_effective_neighbors']:g}.",
        "",
    ]
    for n in s["sizes"]:
        lines += [
            f"**N = {n}**",
            "",
            "| graph | period | gap | n_W | mean deg | rounds to 1e-6 | acc (avg model) | acc (nodes) | worst node |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in sorted((r for r in report["rows"] if r["N"] == n), key=lambda r: -np.nan_to_num(r["spectral_gap"])):
            period = "drawn" if r["stochastic"] else str(r["period"])
            lines.append(
                f"| {r['name']} | {period} | {_num(r['spectral_gap'], '.4g')} | {_num(r['effective_neighbors'], '.2f')} "
                f"| {r['mean_degree']:.2f} | {_num(r['rounds_to_tol'], '.1f', f'> {rounds}')} | {r['test_acc']:.4f} "
                f"| {r['node_acc_mean']:.4f} | {r['node_acc_min']:.4f} |"
            )
        lines.append("")
    lines += [
        "**Rank correlation with the nodes' mean accuracy** (Spearman, fixed graphs only: n_W needs one",
        "sequence of W):",
        "",
        "| N | graphs | vs spectral gap | vs n_W(0.99) |",
        "|---:|---:|---:|---:|",
    ]
    for n, count, gap, neighbors in rank_correlations(report["rows"]):
        lines.append(f"| {n} | {count} | {gap:+.2f} | {neighbors:+.2f} |")
    lines.append("")
    return "\n".join(lines)


def rank_correlations(rows: list[dict]) -> list[tuple]:
    """Per N: (N, graphs, Spearman rho of node accuracy vs gap, vs n_W) over the fixed graphs."""
    from scipy.stats import spearmanr

    out = []
    for n in sorted({r["N"] for r in rows}):
        fixed = [r for r in rows if r["N"] == n and not r["stochastic"] and math.isfinite(r["effective_neighbors"])]
        acc = [r["node_acc_mean"] for r in fixed]
        gap = spearmanr(acc, [r["spectral_gap"] for r in fixed]).statistic
        neighbors = spearmanr(acc, [r["effective_neighbors"] for r in fixed]).statistic
        out.append((n, len(fixed), float(gap), float(neighbors)))
    return out


def load_report(paths) -> dict:
    """Reports written by this script (their JSON: NaN stored as null) back as :func:`run` returns
    them, merged: runs of different ``--sizes`` add up (rows, sizes and timings)."""
    merged = None
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        for r in report["rows"]:
            for key, value in r.items():
                if value is None:
                    r[key] = math.nan
        if merged is None:
            merged = report
            continue
        merged["rows"] += report["rows"]
        merged["settings"]["sizes"] = sorted(set(merged["settings"]["sizes"]) | set(report["settings"]["sizes"]))
        merged["settings"]["timing"].update(report["settings"]["timing"])
        merged["settings"]["seconds"] = merged["settings"].get("seconds", 0) + report["settings"].get("seconds", 0)
    return merged


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    families = report["settings"]["families"]
    markers = {16: "o", 32: "s", 64: "^"}
    cmap = plt.get_cmap("tab20")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    for r in rows:
        color = cmap(families.index(r["family"]) % 20)
        style = {"color": color, "marker": markers.get(r["N"], "x"), "s": 22}
        gap = max(r["spectral_gap"], 1e-4)
        if math.isfinite(r["rounds_to_tol"]):
            axes[0].scatter(gap, r["rounds_to_tol"], **style)
        axes[1].scatter(gap, r["node_acc_mean"], **style)
        if math.isfinite(r["effective_neighbors"]):
            axes[2].scatter(r["effective_neighbors"], r["node_acc_mean"], **style)
    g = np.logspace(-3.2, 0, 50)
    axes[0].plot(g, math.log(1 / report["settings"]["tol"]) / (2 * g), "k--", lw=0.8, label="ln(1e6) / (2 gap)")
    axes[0].set(xscale="log", yscale="log", xlabel="spectral gap", ylabel="rounds to 1e-6 (gossip)")
    axes[1].set(xscale="log", xlabel="spectral gap", ylabel="test accuracy, nodes' own models (mean)")
    axes[2].set(
        xscale="log",
        xlabel="effective number of neighbours n_W(0.99)",
        ylabel="test accuracy, nodes' own models (mean)",
    )
    for f in families:
        axes[1].scatter([], [], color=cmap(families.index(f) % 20), marker="o", s=16, label=f)
    for n, marker in markers.items():
        if n in report["settings"]["sizes"]:
            axes[0].scatter([], [], color="gray", marker=marker, label=f"N = {n}")
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=6, ncol=2, loc="lower right")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    t = report["settings"]["training"]
    fig.suptitle(
        f"gossip consensus and D-SGD training (digits {t['partition']}, {t['rounds']} rounds) per graph", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: N = 16, 300 consensus / 10 training rounds")
    parser.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated subset of {list(FAMILIES)}")
    parser.add_argument("--sizes", default=None, help="comma-separated node counts (default 16,32,64)")
    parser.add_argument("--train-rounds", type=int, default=None)
    parser.add_argument("--out", default=None, help=f"output folder (default {RESULTS}; --quick: {QUICK_OUT})")
    parser.add_argument(
        "--from-json", nargs="+", default=None, help="rewrite tables and plot from saved JSONs (merged), no runs"
    )
    args = parser.parse_args(argv)
    families = tuple(f for f in args.families.split(",") if f)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}; known: {list(FAMILIES)}")
    options = dict(QUICK) if args.quick else {}
    if args.sizes:
        options["sizes"] = tuple(int(v) for v in args.sizes.split(","))
    if args.train_rounds is not None:
        options["train_rounds"] = args.train_rounds
    out = args.out or (QUICK_OUT if args.quick else RESULTS)
    start = time.time()
    if args.from_json:
        report = load_report(args.from_json)
    else:
        report = run(families=families, **options)
        report["settings"]["seconds"] = round(time.time() - start, 1)
    os.makedirs(out, exist_ok=True)
    plot(report, os.path.join(out, "topology_families.png"))
    text = tables(report)
    with open(os.path.join(out, "topology_families.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "topology_families.json"), "w") as f:
        json.dump(jsonable(report, 5), f, allow_nan=False)
    print(text)
    print(f"total {time.time() - start:.1f} s; wrote {out}")
    return report


if __name__ == "__main__":
    main()
