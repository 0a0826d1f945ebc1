"""RelaySGD vs D-SGD (gossip) vs gradient tracking on a chain and a binary tree, non-IID data.

Setting (the ``jaxgossip demo`` task): the embedded digits data (1437 train / 360 test images, 8x8,
10 classes) split over 16 nodes by ``dirichlet:0.1`` (most nodes hold one or two classes), MLP
with one hidden layer of 64, batch 16 per node, **plain SGD** (momentum 0: gradient tracking is
exact with plain SGD, and RelaySum's analysis is for SGD), constant lr, weight decay 1e-4, "atc",
identical initial models (RelaySGD/Model's setting), R rounds, 3 seeds.

Graphs: ``chain(16)`` (diameter 15) and ``binary_tree(16)`` (diameter 6), Metropolis weights for
the gossip-based methods; RelaySGD uses only the tree's links (its weights are the uniform 1/N of
the relayed sums). Methods: ``allreduce`` (exact averaging, the reference), ``gossip`` (D-SGD),
``gradient_tracking`` (2 vectors per message), ``relaysgd`` (RelaySum/Model) and ``relaysum_grad``
(RelaySum/Grad). Every method runs its lr grid x seeds in one compile
(:func:`jaxgossip.run.training_sweeps.sweep_training`); the partition is drawn once (data seed
0) and shared.

Reported per graph and method: the best lr of the grid (by final test accuracy of the averaged
model), and at that lr (mean +- std over seeds): final test accuracy and loss of the averaged
model, mean and worst accuracy of the nodes' own models, consensus distance, the accuracy at R/4
and MB sent per node. Also every lr.

Outputs (``experiments/results/relaysgd/`` by default): ``relaysgd.md`` (tables), ``relaysgd.json``
(settings, per-seed final numbers and curves, machine), ``relaysgd.png`` (node accuracy and test
loss vs rounds at each method's best lr, one column per graph).

Usage::

    python experiments/relaysgd_study.py            # 400 rounds, ~5 min on 2 shared cores
    python experiments/relaysgd_study.py --quick    # smoke run (writes to runs/relaysgd_quick)
"""

from __future__ import annotations

import argparse
import json
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

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "relaysgd")
QUICK_OUT = os.path.join("runs", "relaysgd_quick")
GRAPHS = ("chain", "binary_tree")
METHODS = ("allreduce", "gossip", "gradient_tracking", "relaysgd", "relaysum_grad")
LRS = (0.1, 0.2, 0.4, 0.8)
SEEDS = (0, 1, 2)
ROUNDS, EVAL_EVERY = 400, 20
PARTITION = "dirichlet:0.1"
QUICK = {"rounds": 10, "eval_every": 5, "seeds": (0,), "lrs": (0.2,)}
FIELDS = ("test_acc", "test_loss", "node_acc_mean", "node_acc_min", "consensus", "train_loss")


def base_config(rounds: int, eval_every: int) -> TrainConfig:
    """The demo's config (digits, 16 nodes, Dirichlet(0.1), MLP(64), batch 16), plain SGD."""
    config = TrainConfig(**{**DEMO_DEFAULTS, "model_options": {"hidden": (64,)}})
    return config.replace(
        num_rounds=rounds, eval_every=eval_every, evals_per_chunk=1, partition=PARTITION, momentum=0.0, nesterov=False
    )


def _stats(values) -> dict:
    values = np.asarray(values, np.float64)
    finite = values[np.isfinite(values)]
    return {
        "mean": float(finite.mean()) if finite.size else None,
        "std": float(finite.std(ddof=1)) if finite.size > 1 else 0.0 if finite.size else None,
        "diverged": int(values.size - finite.size),
    }


def run(graphs=GRAPHS, methods=METHODS, lrs=LRS, rounds=ROUNDS, eval_every=EVAL_EVERY, seeds=SEEDS, log=print):
    dataset = data.load_dataset("digits")
    base = base_config(rounds, eval_every)
    results = {}
    for graph in graphs:
        results[graph] = {}
        for method in methods:
            config = base.replace(name=method, topology=graph, algorithm=method)
            start = time.time()
            _, metrics = sweep_training(config, {"lr": list(lrs)}, seeds, dataset)
            m = {k: np.asarray(v) for k, v in metrics._asdict().items() if v is not None}  # [G, S, M, ...]
            final = {f: m[f][:, :, -1] for f in FIELDS}
            final["mb_per_node"] = m["bits"][:, :, -1].mean(axis=-1) / 8e6
            final["acc_quarter"] = m["test_acc"][:, :, max(0, m["test_acc"].shape[-1] // 4 - 1)]
            acc = np.where(np.isfinite(final["test_acc"]), final["test_acc"], -1.0).mean(axis=1)
            best = int(np.argmax(acc))
            seconds = time.time() - start
            results[graph][method] = {
                "lrs": [float(lr) for lr in lrs],
                "best": best,
                "rounds": m["round"][0, 0].tolist(),
                "final": final,
                "curves": {k: m[k] for k in ("test_acc", "test_loss", "node_acc_mean", "consensus")},
                "seconds": seconds,
            }
            log(
                f"{graph:12s} {method:18s} best lr {lrs[best]:<5g} acc {acc[best]:.4f} "
                f"nodes {final['node_acc_mean'][best].mean():.4f} ({seconds:.1f} s, {len(lrs)} lr x {len(seeds)} seeds)"
            )
    return {
        "settings": {
            "dataset": "digits",
            "partition": PARTITION,
            "num_nodes": base.num_nodes,
            "model": f"mlp hidden {list(base.model_options['hidden'])}",
            "batch_size": base.batch_size,
            "optimizer": "sgd, momentum 0",
            "weight_decay": base.weight_decay,
            "rounds": rounds,
            "eval_every": eval_every,
            "seeds": list(seeds),
            "data_seed": 0,
            "lrs": list(lrs),
            "graphs": list(graphs),
            "methods": list(methods),
        },
        "results": results,
        "machine": machine(),
    }


def _pm(s: dict, digits: int = 4) -> str:
    if s["mean"] is None:
        return "diverged"
    text = f"{s['mean']:.{digits}f} +- {s['std']:.{digits}f}"
    return text + (f" ({s['diverged']} diverged)" if s["diverged"] else "")


def tables(report: dict) -> str:
    s = report["settings"]
    quarter = s["eval_every"] * max(1, s["rounds"] // s["eval_every"] // 4)
    lines = []
    for graph, by_method in report["results"].items():
        lines += [
            f"**{graph}({s['num_nodes']}), {s['partition']}, best lr per method**, {s['rounds']} rounds, "
            f"{len(s['seeds'])} seeds:",
            "",
            f"| method | best lr | acc (avg model) | acc at round {quarter} | acc (nodes, mean) | acc (worst node) "
            "| consensus | test loss | MB / node |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for method, r in by_method.items():
            b = r["best"]
            f = {k: _stats(v[b]) for k, v in r["final"].items()}
            cons = "-" if f["consensus"]["mean"] is None else f"{f['consensus']['mean']:.2e}"
            lines.append(
                f"| {method} | {r['lrs'][b]:g} | {_pm(f['test_acc'])} | {_pm(f['acc_quarter'])} "
                f"| {_pm(f['node_acc_mean'])} | {_pm(f['node_acc_min'])} | {cons} | {_pm(f['test_loss'], 3)} "
                f"| {f['mb_per_node']['mean']:.2f} |"
            )
        lines.append("")
        lrs = s["lrs"]
        if len(lrs) > 1:
            lines += [
                f"**{graph}: every lr** (mean accuracy of the nodes' own models; averaged model in brackets):",
                "",
                "| method | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |",
                "|---|" + "---:|" * len(lrs),
            ]
            for method, r in by_method.items():
                cells = []
                for g in range(len(lrs)):
                    node, avg = _stats(r["final"]["node_acc_mean"][g]), _stats(r["final"]["test_acc"][g])
                    cells.append("diverged" if node["mean"] is None else f"{node['mean']:.3f} ({avg['mean']:.3f})")
                lines.append(f"| {method} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = report["settings"]
    graphs = list(report["results"])
    fig, axes = plt.subplots(2, len(graphs), figsize=(5.5 * len(graphs), 7), squeeze=False)
    for col, graph in enumerate(graphs):
        for key, r in report["results"][graph].items():
            b = r["best"]
            rounds = np.asarray(r["rounds"])
            style = {"color": "black", "ls": "--"} if key == "allreduce" else {}
            for row, name in enumerate(("node_acc_mean", "test_loss")):
                values = np.asarray(r["curves"][name][b], np.float64)
                mean = np.nanmean(values, axis=0)
                axes[row, col].plot(
                    rounds, mean, marker="o", markersize=2, label=f"{key} (lr {r['lrs'][b]:g})", **style
                )
        axes[0, col].set_ylim(0.5, 1.0)
        axes[0, col].set_ylabel("test accuracy (nodes' own models, mean)")
        axes[1, col].set_yscale("log")
        axes[1, col].set_ylabel("test loss (averaged model)")
        axes[0, col].set_title(f"{graph}({s['num_nodes']}), {s['partition']}", fontsize=10)
        axes[0, col].legend(fontsize=7)
    for ax in axes.ravel():
        ax.set_xlabel("round")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"digits, MLP(64), plain SGD, best lr per method, mean over {len(s['seeds'])} seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 10 rounds, 1 seed, one lr")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--graphs", default=",".join(GRAPHS))
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {list(METHODS)}")
    parser.add_argument("--out", default=None, help=f"output folder (default {RESULTS}; --quick: {QUICK_OUT})")
    args = parser.parse_args(argv)
    methods = tuple(m for m in args.methods.split(",") if m)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown methods {unknown}; known: {list(METHODS)}")
    options = dict(QUICK) if args.quick else {}
    if args.rounds is not None:
        options["rounds"] = args.rounds
    out = args.out or (QUICK_OUT if args.quick else RESULTS)
    start = time.time()
    report = run(graphs=tuple(g for g in args.graphs.split(",") if g), methods=methods, **options)
    report["settings"]["seconds"] = round(time.time() - start, 1)
    os.makedirs(out, exist_ok=True)
    plot(report, os.path.join(out, "relaysgd.png"))
    text = tables(report)
    with open(os.path.join(out, "relaysgd.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "relaysgd.json"), "w") as f:
        json.dump(jsonable(report), f, allow_nan=False)
    print(text)
    print(f"total {time.time() - start:.1f} s; wrote {out}")
    return report


if __name__ == "__main__":
    main()
