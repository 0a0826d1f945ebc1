"""Gradient tracking / D^2 / QGM vs D-SGD in training under Dirichlet(0.1) label skew.

The training half of study (c); the least-squares half is ``gradient_methods_study.py``.

Setting (the ``jaxgossip demo`` task): the embedded digits data (1437 train / 360 test images,
8x8, 10 classes), 16 nodes, MLP with one hidden layer of 64, batch 16 per node, weight decay 1e-4,
constant learning rate (no schedule: a constant step is where D-SGD's heterogeneity bias shows and
the exact methods should not have one), "atc" ordering, identical initial models, R rounds.
Partitions: ``dirichlet:0.1`` (most nodes hold one or two classes) and ``iid`` as the control.

Three groups of methods, each compared with all-reduce (exact averaging, the reference line)
under the same local optimizer:

* plain SGD (momentum 0; gradient tracking and D^2 are exact with plain SGD): ``allreduce``,
  ``gossip`` (D-SGD on ``ring(16)``, weights 1/3), ``gossip_half`` (D-SGD on ``(I + W) / 2``:
  the graph D^2 effectively mixes with, so that D^2 vs D-SGD is not confounded by the graph),
  ``gradient_tracking`` (ring), ``d2`` (gamma 0.5 = Exact Diffusion; the uniform ring has
  lambda_min(W) = -1/3, D^2's limit, so gamma 1 is refused);
* momentum 0.9 (Nesterov): ``allreduce_m``, ``gossip_m`` (D-SGDm, the demo's recipe) and ``qgm``
  (quasi-global momentum, beta 0.9, Nesterov; its optimizer is plain SGD at the same lr, since QGM
  replaces the optimizer's momentum);
* plain SGD with 2 local steps per round (where heterogeneity adds client drift):
  ``allreduce_h2`` (local SGD with exact averaging), ``gossip_h2``, ``gradient_tracking_h2``,
  ``d2_h2``.

Every method runs a grid of learning rates x seeds in one compile
(:func:`jaxgossip.run.training_sweeps.sweep_training`, lr axis x seeds), except ``qgm``: its ``lr``
option must equal the optimizer's and the library's sweep axes do not tie two fields, so it
compiles once per lr (its seeds still share the compile). The seed changes the initial model and
the batches; the partition is drawn once (data seed 0) and shared, as shards fix array shapes.

Reported per partition, method and lr (mean +- sample std over seeds): final test accuracy of the
averaged model, its gap to all-reduce of the same group and lr, its accuracy after R/4 rounds and
the first evaluated round at which it reaches 0.95 (the transient; "never" counts as a diverged
seed), the mean and worst accuracy of the nodes' own models, the consensus distance
``(1/N) sum_i ||x_i - x_bar||^2``, the test loss and the MB sent per node. The main table uses
each group's main lr (SGD 0.2, momentum 0.05 as in the demo, H = 2: 0.2); the lr tables show all
of them for Dirichlet(0.1).

Outputs (``experiments/results/heterogeneity/`` by default): ``heterogeneity.md`` (tables),
``heterogeneity.json`` (settings, per-seed final numbers and curves, machine),
``accuracy_dirichlet0.1.png`` and ``accuracy_iid.png`` (accuracy and consensus vs rounds).

Usage::

    python experiments/heterogeneity_study.py            # 400 rounds, about 3.5 min on 2 cores under load
    python experiments/heterogeneity_study.py --quick    # smoke run (writes to runs/heterogeneity_quick)
    python experiments/heterogeneity_study.py --quick --methods allreduce,gradient_tracking,qgm \\
        --partitions dirichlet:0.1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import NamedTuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _common, also when loaded by a test

import jax  # noqa: E402
from _common import jsonable, machine  # noqa: E402

from jaxgossip import data  # noqa: E402
from jaxgossip.cli.demo import DEMO_DEFAULTS  # noqa: E402
from jaxgossip.run.runner import TrainConfig  # noqa: E402
from jaxgossip.run.training_sweeps import sweep_training  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "heterogeneity")
QUICK_OUT = os.path.join("runs", "heterogeneity_quick")
PARTITIONS = ("dirichlet:0.1", "iid")
SEEDS = (0, 1, 2)
ROUNDS, EVAL_EVERY = 400, 20
BETA = 0.9


class Group(NamedTuple):
    title: str
    lrs: tuple  # the lr grid of every method of the group (one compile per method)
    main: float  # the lr of the main table and the plots
    reference: str  # the all-reduce run the group's gap is measured to


GROUPS = {
    "sgd": Group("plain SGD", (0.05, 0.1, 0.2, 0.4, 0.8), 0.2, "allreduce"),
    "momentum": Group("momentum 0.9 (Nesterov)", (0.025, 0.05, 0.1), 0.05, "allreduce_m"),
    "local2": Group("plain SGD, 2 local steps per round", (0.05, 0.1, 0.2, 0.4), 0.2, "allreduce_h2"),
}
QUICK = {"rounds": 20, "eval_every": 10, "seeds": (0, 1), "lrs": {g: (grp.main,) for g, grp in GROUPS.items()}}


class Method(NamedTuple):
    label: str
    group: str  # a key of GROUPS: compared with the all-reduce of its group
    algorithm: str
    options: dict
    momentum: float  # of the local optimizer (Nesterov when > 0)
    ties_lr: bool = False  # the algorithm's lr option must equal the optimizer's (one compile per lr)
    local_steps: int = 1


METHODS = {
    "allreduce": Method("allreduce", "sgd", "allreduce", {}, 0.0),
    "gossip": Method("gossip (D-SGD)", "sgd", "gossip", {}, 0.0),
    "gossip_half": Method("gossip on (I+W)/2", "sgd", "gossip", {"gamma": 0.5}, 0.0),
    "gradient_tracking": Method("gradient_tracking", "sgd", "gradient_tracking", {}, 0.0),
    "d2": Method("d2 (gamma 0.5)", "sgd", "d2", {"gamma": 0.5}, 0.0),
    "allreduce_m": Method("allreduce, momentum 0.9", "momentum", "allreduce", {}, BETA),
    "gossip_m": Method("gossip (D-SGDm), momentum 0.9", "momentum", "gossip", {}, BETA),
    "qgm": Method("qgm (beta 0.9)", "momentum", "qgm", {"beta": BETA, "nesterov": True}, 0.0, ties_lr=True),
    "allreduce_h2": Method("allreduce (local SGD), H=2", "local2", "allreduce", {}, 0.0, local_steps=2),
    "gossip_h2": Method("gossip (D-SGD), H=2", "local2", "gossip", {}, 0.0, local_steps=2),
    "gradient_tracking_h2": Method("gradient_tracking, H=2", "local2", "gradient_tracking", {}, 0.0, local_steps=2),
    "d2_h2": Method("d2 (gamma 0.5), H=2", "local2", "d2", {"gamma": 0.5}, 0.0, local_steps=2),
}
COLORS = ("gossip", "gossip_half", "gradient_tracking", "d2", "qgm")
# Final-metric fields of the sweep's Metrics (leaves [G, S, num_evals]) kept per seed. (train_loss
# is each node's loss on its own batches: under label skew it rewards local overfitting, so it is
# kept in the JSON but not tabled.)
FIELDS = ("test_acc", "test_loss", "node_acc_mean", "node_acc_min", "consensus", "train_loss")
# The transient, where heterogeneity shows on this easy task: accuracy of the averaged model after
# a quarter of the rounds, and the first evaluated round at which it reaches LEVEL.
LEVEL = 0.95


def base_config(rounds: int, eval_every: int) -> TrainConfig:
    """The demo's config (digits, 16 nodes, Dirichlet(0.1), MLP(64), batch 16) with a constant lr."""
    config = TrainConfig(**{**DEMO_DEFAULTS, "model_options": {"hidden": (64,)}})
    return config.replace(num_rounds=rounds, eval_every=eval_every, evals_per_chunk=1, topology="ring")


def main_lr(lrs, main: float) -> float:
    return main if main in lrs else lrs[0]


def train_method(config: TrainConfig, method: Method, lrs, seeds, dataset) -> dict:
    """All lrs x seeds of one method: ``{name: np.ndarray [G, S, num_evals, ...]}``."""
    if method.ties_lr:
        # One compile per lr: the option is a Python float fixed when the algorithm is built.
        parts = [
            sweep_training(
                config.replace(algorithm_options={**method.options, "lr": lr}), {"lr": [lr]}, seeds, dataset
            )[1]
            for lr in lrs
        ]
        metrics = jax.tree_util.tree_map(lambda *xs: np.concatenate([np.asarray(x) for x in xs]), *parts)
    else:
        _, metrics = sweep_training(config, {"lr": list(lrs)}, seeds, dataset)
    return {name: np.asarray(value) for name, value in metrics._asdict().items()}


def summarize(values: np.ndarray) -> dict:
    """Mean and sample std over seeds of the finite values; how many seeds diverged (NaN/inf)."""
    finite = values[np.isfinite(values)]
    return {
        "mean": float(finite.mean()) if finite.size else None,
        "std": float(finite.std(ddof=1)) if finite.size > 1 else 0.0 if finite.size else None,
        "diverged": int(values.size - finite.size),
    }


def run(
    partitions=PARTITIONS,
    methods=tuple(METHODS),
    rounds: int = ROUNDS,
    eval_every: int = EVAL_EVERY,
    seeds=SEEDS,
    lrs=None,
    log=print,
) -> dict:
    lrs = {g: tuple(lrs[g]) if lrs and g in lrs else grp.lrs for g, grp in GROUPS.items()}
    dataset = data.load_dataset("digits")
    base = base_config(rounds, eval_every)
    results = {}
    for partition in partitions:
        results[partition] = {}
        for key in methods:
            method = METHODS[key]
            grid = lrs[method.group]
            config = base.replace(
                name=key,
                partition=partition,
                algorithm=method.algorithm,
                algorithm_options=dict(method.options),
                momentum=method.momentum,
                nesterov=method.momentum > 0,
                local_steps=method.local_steps,
            )
            start = time.time()
            m = train_method(config, method, grid, seeds, dataset)
            final = {field: m[field][:, :, -1] for field in FIELDS}  # [G, S]
            final["mb_per_node"] = m["bits"][:, :, -1].mean(axis=-1) / 8e6
            quarter = max(0, m["test_acc"].shape[-1] // 4 - 1)
            final["acc_quarter"] = m["test_acc"][:, :, quarter]
            reached = m["test_acc"] >= LEVEL
            first = np.where(reached.any(axis=-1), reached.argmax(axis=-1), -1)
            final["rounds_to_level"] = np.where(first >= 0, m["round"][0, 0][np.maximum(first, 0)], np.nan)
            seconds = time.time() - start
            results[partition][key] = {
                "label": method.label,
                "group": method.group,
                "lrs": [float(lr) for lr in grid],
                "rounds": m["round"][0, 0].tolist(),
                "final": final,
                "curves": {"test_acc": m["test_acc"], "consensus": m["consensus"]},
                "seconds": seconds,
            }
            g = grid.index(main_lr(grid, GROUPS[method.group].main))
            acc = summarize(final["test_acc"][g])
            log(
                f"{partition:14s} {method.label:32s} lr {grid[g]:<6g} acc {acc['mean']}  "
                f"consensus {np.nanmean(final['consensus'][g]):.3g}  ({seconds:.1f} s, {len(grid)} lr x {len(seeds)} seeds)"
            )
    return {
        "settings": {
            "dataset": "digits",
            "num_nodes": base.num_nodes,
            "model": f"mlp hidden {list(base.model_options['hidden'])}",
            "batch_size": base.batch_size,
            "weight_decay": base.weight_decay,
            "rounds": rounds,
            "eval_every": eval_every,
            "eval_size": base.eval_size,
            "seeds": list(seeds),
            "data_seed": 0,
            "partitions": list(partitions),
            "lrs": {g: list(v) for g, v in lrs.items()},
            "main_lr": {g: main_lr(lrs[g], grp.main) for g, grp in GROUPS.items()},
            "methods": {k: METHODS[k]._asdict() for k in methods},
        },
        "results": results,
        "machine": machine(),
    }


def rows(report: dict) -> list[dict]:
    """One summary row per partition x method x lr (mean +- std over seeds), with the gap of the
    averaged model's accuracy to the all-reduce of the same group at the same lr."""
    out = []
    for partition, by_method in report["results"].items():
        for key, r in by_method.items():
            ref = by_method.get(GROUPS[r["group"]].reference)
            for g, lr in enumerate(r["lrs"]):
                row = {"partition": partition, "method": key, "label": r["label"], "group": r["group"], "lr": lr}
                for field, values in r["final"].items():
                    row[field] = summarize(np.asarray(values[g], np.float64))
                row["gap_to_allreduce"] = None
                if ref is not None and row["test_acc"]["mean"] is not None:
                    ref_acc = summarize(np.asarray(ref["final"]["test_acc"][g], np.float64))["mean"]
                    if ref_acc is not None:
                        row["gap_to_allreduce"] = row["test_acc"]["mean"] - ref_acc
                out.append(row)
    return out


def _pm(s: dict, digits: int = 4) -> str:
    if s["mean"] is None:
        return "diverged"
    text = f"{s['mean']:.{digits}f} +- {s['std']:.{digits}f}"
    return text + (f" ({s['diverged']} diverged)" if s["diverged"] else "")


def _rounds(s: dict) -> str:
    if s["mean"] is None:
        return "never"
    return f"{s['mean']:.0f} +- {s['std']:.0f}" + (f" ({s['diverged']} never)" if s["diverged"] else "")


def _sci(s: dict) -> str:
    return "-" if s["mean"] is None else f"{s['mean']:.2e}"


def tables(report: dict) -> str:
    settings = report["settings"]
    summary = rows(report)
    main = settings["main_lr"]
    quarter = settings["eval_every"] * max(1, settings["rounds"] // settings["eval_every"] // 4)
    lines = []
    for partition in settings["partitions"]:
        lines += [
            f"**{partition}**, main lr ({', '.join(f'{GROUPS[g].title} {lr:g}' for g, lr in main.items())}), "
            f"{settings['rounds']} rounds, {len(settings['seeds'])} seeds:",
            "",
            f"| method | lr | acc (avg model) | gap to all-reduce | acc at round {quarter} | rounds to {LEVEL:g} "
            "| acc (nodes, mean) | acc (worst node) | consensus | test loss | MB / node |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in summary:
            if row["partition"] != partition or row["lr"] != main[row["group"]]:
                continue
            gap = "-" if row["gap_to_allreduce"] is None else f"{row['gap_to_allreduce']:+.4f}"
            lines.append(
                f"| {row['label']} | {row['lr']:g} | {_pm(row['test_acc'])} | {gap} | {_pm(row['acc_quarter'])} "
                f"| {_rounds(row['rounds_to_level'])} | {_pm(row['node_acc_mean'])} "
                f"| {_pm(row['node_acc_min'])} | {_sci(row['consensus'])} | {_pm(row['test_loss'], 3)} "
                f"| {row['mb_per_node']['mean']:.2f} |"
            )
        lines.append("")
    first = settings["partitions"][0]
    for group, lrs in settings["lrs"].items():
        group_rows = [r for r in summary if r["partition"] == first and r["group"] == group]
        if not group_rows or len(lrs) < 2:
            continue
        lines += [
            f"**{first}, {GROUPS[group].title}: every lr** (acc of the averaged model "
            "+- std; consensus distance in brackets):",
            "",
            "| method | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |",
            "|---|" + "---:|" * len(lrs),
        ]
        for key in dict.fromkeys(r["method"] for r in group_rows):
            cells = {r["lr"]: r for r in group_rows if r["method"] == key}
            label = cells[lrs[0]]["label"]
            lines.append(
                f"| {label} | "
                + " | ".join(f"{_pm(cells[lr]['test_acc'], 3)} ({_sci(cells[lr]['consensus'])})" for lr in lrs)
                + " |"
            )
        lines.append("")
    return "\n".join(lines)


def plot(report: dict, partition: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_method = report["results"][partition]
    main = report["settings"]["main_lr"]
    groups = [g for g in GROUPS if any(r["group"] == g for r in by_method.values())]
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 3.75 * len(groups)), squeeze=False)
    for row, group in enumerate(groups):
        low = 1.0
        for key, r in by_method.items():
            if r["group"] != group:
                continue
            g = r["lrs"].index(main[group])
            rounds = np.asarray(r["rounds"])
            for col, name in enumerate(("test_acc", "consensus")):
                if name == "consensus" and key == GROUPS[group].reference:
                    continue  # exactly averaged: 0 up to round-off (1e-16), off any useful scale
                values = np.asarray(r["curves"][name][g], np.float64)  # [S, M]
                mean, std = values.mean(axis=0), values.std(axis=0)
                ax = axes[row, col]
                # one colour per algorithm across the rows (gossip_m and gossip_h2 are "gossip")
                base_key = key.removesuffix("_h2").removesuffix("_m")
                color = f"C{list(COLORS).index(base_key)}" if base_key in COLORS else None
                style = {"color": "black", "ls": "--"} if key == GROUPS[group].reference else {"color": color}
                (line,) = ax.plot(rounds, mean, marker="o", markersize=2.5, label=r["label"], **style)
                ax.fill_between(rounds, mean - std, mean + std, color=line.get_color(), alpha=0.2)
            late = np.asarray(r["curves"]["test_acc"][g])[:, rounds >= rounds[-1] / 4]
            if np.all(np.isfinite(late)):
                low = min(low, float(late.min()))
        title = GROUPS[group].title
        axes[row, 0].set_ylim(max(0.0, low - 0.02), 1.0)
        axes[row, 0].set_ylabel("test accuracy (averaged model)")
        axes[row, 0].set_title(f"{title}, lr {main[group]:g}", fontsize=10)
        axes[row, 1].set_yscale("log")
        axes[row, 1].set_ylabel("consensus distance")
        axes[row, 1].set_title(f"{title}, lr {main[group]:g}", fontsize=10)
        axes[row, 0].legend(fontsize=8)
    for ax in axes.ravel():
        ax.set_xlabel("round")
        ax.grid(True, which="both", alpha=0.3)
    s = report["settings"]
    fig.suptitle(
        f"digits, {s['num_nodes']} nodes, {partition}, {s['model']}, batch {s['batch_size']}: "
        f"mean +- std over {len(s['seeds'])} seeds"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 20 rounds, 2 seeds, one lr per group")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {list(METHODS)}")
    parser.add_argument("--partitions", default=",".join(PARTITIONS))
    parser.add_argument("--out", default=None, help=f"output folder (default {RESULTS}; --quick: {QUICK_OUT})")
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown methods {unknown}; known: {list(METHODS)}")
    options = {}
    if args.quick:
        options = {k: v for k, v in QUICK.items()}
    if args.rounds is not None:
        options["rounds"] = args.rounds
    out = args.out or (QUICK_OUT if args.quick else RESULTS)
    start = time.time()
    report = run(partitions=tuple(p for p in args.partitions.split(",") if p), methods=tuple(methods), **options)
    report["settings"]["seconds"] = round(time.time() - start, 1)
    report["settings"]["mode"] = "quick" if args.quick else "full"
    os.makedirs(out, exist_ok=True)
    for partition in report["settings"]["partitions"]:
        plot(report, partition, os.path.join(out, f"accuracy_{partition.replace(':', '')}.png"))
    text = tables(report)
    with open(os.path.join(out, "heterogeneity.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "heterogeneity.json"), "w") as f:
        json.dump(jsonable({**report, "summary": rows(report)}, 4), f, allow_nan=False)  # one line: the curves make it large
    print(text)
    print(f"total {time.time() - start:.1f} s; wrote {out}")
    return report


if __name__ == "__main__":
    main()
