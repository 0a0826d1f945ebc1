"""Language model on text split by source: all-reduce, gossip, PowerGossip, Choco top-1 % and
decentralized DiLoCo (H = 10 and 50, all-reduce and gossip outer steps) at equal local computation.

Setting: ``--dataset=python_docs --partition=by_source`` (CPython's documentation topics, byte
tokens, every node holding whole topics), 8 nodes, the byte-level decoder-only transformer
(depth 2, width 64, 4 heads, context 32, learned positions: 135,168 parameters per node), batch 16
windows per node and local step, AdamW (lr 3e-3, weight decay 0.01), linear warm-up from 3e-4 over
the first 50 local steps, cosine decay to 3e-4 at the end, per-node gradient clipping at norm 1,
identical initial models, one seed.

Every method does the same number of local (inner) steps, ``STEPS`` = 500, i.e. the same
computation. A method with H local steps per round therefore has ``STEPS / H`` communication
rounds. The library's schedule counts rounds (the H steps of a round share its rate), so the
warm-up and the evaluation interval are given in local steps and converted to rounds per method:
warm-up 50 steps = 50 / 5 / 1 rounds for H = 1 / 10 / 50, an evaluation every 50 local steps.

Methods (``METHODS``; the ring has weights 1/3):

* ``allreduce``: exact averaging after every step (the synchronous data-parallel reference);
* ``gossip``: D-SGD (here D-AdamW) on the ring, one gossip round per step;
* ``power_gossip``: PowerGossip rank 1, one power iteration, warm start, on the ring;
* ``choco``: Choco-SGD top-1 % (per leaf) on the ring, ``gamma`` 0.02, public copies started at
  the shared initial model (``public_init="model"``, exact for identical initial models);
* ``diloco_allreduce_h10`` / ``_h50``: DiLoCo, H inner AdamW steps, then an all-reduce of the models
  and a Nesterov outer step (lr 0.7, momentum 0.9) on ``x - mean(y)`` (the original DiLoCo);
* ``diloco_gossip_h10`` / ``_h50``: decentralized DiLoCo, the same with one gossip round on the
  ring instead of the all-reduce (``outer_message="model"``: the models are gossiped, and the
  pseudo-gradient is ``x - W y``);
* not in the default set, the controls for what the outer Nesterov step adds:
  ``localsgd_allreduce_h10`` / ``_h50`` (H steps, then plain averaging ``x <- mean(y)``: local SGD
  with AdamW, i.e. DiLoCo with outer SGD at lr 1) and ``localsgd_gossip_h10`` / ``_h50`` (H steps,
  then one gossip round ``x <- W y``).

Reported per method: perplexity of the averaged model and geometric-mean perplexity of the nodes'
own models on 512 held-out windows (the last tenth of every source), consensus distance, MB sent per
node and rounds, all at every evaluation; the final values in the table.

Outputs (``experiments/results/lm_diloco/`` by default): ``lm_diloco.md`` (table),
``lm_diloco.json`` (settings, every evaluation row, machine) and ``perplexity.png`` (perplexity vs
local steps, vs communication rounds and vs MB sent per node).

Usage::

    python experiments/lm_diloco_study.py            # 8 runs x 500 local steps, about 14 min on 2 loaded cores
    python experiments/lm_diloco_study.py --quick    # smoke run: tiny model, 100 steps (writes to runs/lm_diloco_quick)
    python experiments/lm_diloco_study.py --out experiments/results/lm_diloco/controls \\
        --methods localsgd_allreduce_h10,localsgd_allreduce_h50,localsgd_gossip_h10,localsgd_gossip_h50
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _common, also when loaded by a test

from _common import jsonable, machine  # noqa: E402

from jaxgossip.run.runner import TrainConfig, run_training  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "lm_diloco")
QUICK_OUT = os.path.join("runs", "lm_diloco_quick")


class Sizes(NamedTuple):
    steps: int  # local (inner) steps of every method
    eval_steps: int  # local steps between evaluations
    warmup_steps: int  # local steps of linear warm-up
    model_options: dict
    batch_size: int
    eval_size: int


FULL = Sizes(500, 50, 50, {"depth": 2, "width": 64, "heads": 4, "context": 32}, 16, 512)
QUICK = Sizes(100, 50, 50, {"depth": 1, "width": 32, "heads": 2, "context": 16}, 4, 128)
CHOCO_GAMMA = 0.02
OUTER = {"outer_optimizer": "nesterov", "outer_lr": 0.7, "outer_momentum": 0.9, "outer_message": "model"}


class Method(NamedTuple):
    label: str
    algorithm: str
    options: dict
    local_steps: int = 1
    outer: dict = {}


METHODS = {
    "allreduce": Method("all-reduce", "allreduce", {}),
    "gossip": Method("gossip (ring)", "gossip", {}),
    "power_gossip": Method("PowerGossip rank 1 (ring)", "power_gossip", {"rank": 1}),
    "choco": Method(
        f"Choco top-1% (ring, gamma {CHOCO_GAMMA:g})",
        "choco",
        {
            "gamma": CHOCO_GAMMA,
            "compressor": "top_k",
            "compressor_options": {"fraction": 0.01},
            "public_init": "model",
        },
    ),
    "diloco_allreduce_h10": Method("DiLoCo H=10, all-reduce outer", "allreduce", {}, 10, OUTER),
    "diloco_allreduce_h50": Method("DiLoCo H=50, all-reduce outer", "allreduce", {}, 50, OUTER),
    "diloco_gossip_h10": Method("DiLoCo H=10, gossip outer (ring)", "gossip", {}, 10, OUTER),
    "diloco_gossip_h50": Method("DiLoCo H=50, gossip outer (ring)", "gossip", {}, 50, OUTER),
    "localsgd_allreduce_h10": Method("local AdamW H=10, averaging (no outer step)", "allreduce", {}, 10),
    "localsgd_allreduce_h50": Method("local AdamW H=50, averaging (no outer step)", "allreduce", {}, 50),
    "localsgd_gossip_h10": Method("local AdamW H=10, gossip (no outer step)", "gossip", {}, 10),
    "localsgd_gossip_h50": Method("local AdamW H=50, gossip (no outer step)", "gossip", {}, 50),
}
DEFAULT = tuple(k for k in METHODS if not k.startswith("localsgd"))
KEEP = ("round", "local_step", "perplexity", "node_perplexity", "test_acc", "consensus", "MB_per_node", "wall_time")


def base_config(sizes: Sizes) -> TrainConfig:
    """The docs/usage.md language-model run ("Language models on text split by source") at these sizes."""
    return TrainConfig(
        dataset="python_docs",
        partition="by_source",
        num_nodes=8,
        topology="ring",
        model="transformer",
        model_options=dict(sizes.model_options),
        optimizer="adamw",
        lr=3e-3,
        weight_decay=0.01,
        warmup_from=3e-4,
        lr_schedule="cosine",
        final_lr=3e-4,
        grad_clip=1.0,
        batch_size=sizes.batch_size,
        eval_size=sizes.eval_size,
        eval_chunk=128,
        evals_per_chunk=1,
        seed=0,
    )


def method_config(base: TrainConfig, key: str, sizes: Sizes) -> TrainConfig:
    """The run of one method: rounds, evaluation interval and warm-up converted from local steps."""
    method = METHODS[key]
    h = method.local_steps
    for what, steps in (("steps", sizes.steps), ("eval_steps", sizes.eval_steps), ("warmup_steps", sizes.warmup_steps)):
        if steps % h:
            raise ValueError(f"{what}={steps} must be a multiple of local_steps={h} ({key})")
    return base.replace(
        name=key,
        algorithm=method.algorithm,
        algorithm_options=dict(method.options),
        local_steps=h,
        num_rounds=sizes.steps // h,
        eval_every=sizes.eval_steps // h,
        warmup_rounds=sizes.warmup_steps // h,
        **method.outer,
    )


def run(methods=DEFAULT, sizes: Sizes = FULL, log=print) -> dict:
    base = base_config(sizes)
    results = {}
    for key in methods:
        config = method_config(base, key, sizes)
        start = time.time()
        result = run_training(config, None, progress=False, log=lambda s: None)
        seconds = time.time() - start
        rows = [{k: row[k] for k in KEEP} for row in result.rows if row.get("phase", "train") == "train"]
        results[key] = {
            "label": METHODS[key].label,
            "local_steps": config.local_steps,
            "num_rounds": config.num_rounds,
            "rows": rows,
            "seconds": seconds,
        }
        last = rows[-1]
        log(
            f"{METHODS[key].label:46s} ppl {last['perplexity']:7.3f}  nodes {last['node_perplexity']:7.3f}  "
            f"consensus {last['consensus']:.2e}  {last['MB_per_node']:9.2f} MB/node  {config.num_rounds:4d} rounds  "
            f"({seconds:.0f} s)"
        )
    return {
        "settings": {
            "dataset": "python_docs",
            "partition": "by_source",
            "num_nodes": base.num_nodes,
            "topology": base.topology,
            "model": "transformer",
            "model_options": dict(sizes.model_options),
            "batch_size": sizes.batch_size,
            "steps": sizes.steps,
            "eval_steps": sizes.eval_steps,
            "warmup_steps": sizes.warmup_steps,
            "eval_size": sizes.eval_size,
            "optimizer": {
                "name": base.optimizer,
                "lr": base.lr,
                "warmup_from": base.warmup_from,
                "final_lr": base.final_lr,
                "weight_decay": base.weight_decay,
                "grad_clip": base.grad_clip,
            },
            "outer": OUTER,
            "seed": base.seed,
            "methods": {k: METHODS[k]._asdict() for k in methods},
        },
        "results": results,
        "machine": machine(),
    }


def table(report: dict) -> str:
    """The final evaluation of every method (Markdown), with all-reduce's perplexity as reference."""
    results = report["results"]
    ref = results.get("allreduce")
    ref_ppl = ref["rows"][-1]["perplexity"] if ref else None
    steps = report["settings"]["steps"]
    lines = [
        f"{steps} local steps per node for every method; perplexity on "
        f"{report['settings']['eval_size']} held-out windows:",
        "",
        f"| method | H | rounds | ppl (avg model) | vs all-reduce | ppl at step {steps // 2} | ppl (nodes) "
        "| consensus | MB / node | wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, r in results.items():
        last = r["rows"][-1]
        half = next((row for row in r["rows"] if row["local_step"] >= steps // 2), last)
        gap = "-" if ref_ppl is None or key == "allreduce" else f"{last['perplexity'] / ref_ppl - 1:+.1%}"
        lines.append(
            f"| {r['label']} | {r['local_steps']} | {r['num_rounds']} | {last['perplexity']:.3f} | {gap} "
            f"| {half['perplexity']:.3f} | {last['node_perplexity']:.3f} | {last['consensus']:.2e} "
            f"| {last['MB_per_node']:.2f} | {r['seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    styles = {
        "allreduce": {"color": "black", "ls": "--"},
        "gossip": {"color": "C0"},
        "power_gossip": {"color": "C1"},
        "choco": {"color": "C2"},
        "diloco_allreduce_h10": {"color": "C3"},
        "diloco_allreduce_h50": {"color": "C3", "ls": ":"},
        "diloco_gossip_h10": {"color": "C4"},
        "diloco_gossip_h50": {"color": "C4", "ls": ":"},
        "localsgd_allreduce_h10": {"color": "C5"},
        "localsgd_allreduce_h50": {"color": "C5", "ls": ":"},
        "localsgd_gossip_h10": {"color": "C6"},
        "localsgd_gossip_h50": {"color": "C6", "ls": ":"},
    }
    low, high = math.inf, 0.0
    for key, r in report["results"].items():
        rows = r["rows"]
        ppl = [row["perplexity"] for row in rows]
        style = {"marker": "o", "markersize": 3, "label": r["label"], **styles.get(key, {})}
        axes[0].plot([row["local_step"] for row in rows], ppl, **style)
        axes[1].plot([row["round"] for row in rows], ppl, **style)
        axes[2].plot([row["MB_per_node"] for row in rows], ppl, **style)
        finite = [p for p in ppl if math.isfinite(p)]
        if finite:
            low, high = min(low, min(finite)), max(high, finite[min(1, len(finite) - 1)])
    for ax, xlabel in zip(axes, ("local steps (= computation)", "communication rounds", "MB sent per node")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("perplexity (averaged model)")
        ax.grid(True, which="both", alpha=0.3)
        if math.isfinite(low):
            ax.set_ylim(0.97 * low, 1.03 * high)
    axes[1].set_xscale("log")
    axes[2].set_xscale("log")
    axes[0].legend(fontsize=7)
    s = report["settings"]
    o = s["model_options"]
    fig.suptitle(
        f"python_docs by source, {s['num_nodes']} nodes, transformer depth {o['depth']} width {o['width']} "
        f"context {o['context']}, batch {s['batch_size']}, {s['steps']} local steps"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny model, 100 local steps")
    parser.add_argument("--methods", default=",".join(DEFAULT), help=f"comma-separated subset of {list(METHODS)}")
    parser.add_argument("--out", default=None, help=f"output folder (default {RESULTS}; --quick: {QUICK_OUT})")
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown methods {unknown}; known: {list(METHODS)}")
    out = args.out or (QUICK_OUT if args.quick else RESULTS)
    start = time.time()
    report = run(methods=tuple(methods), sizes=QUICK if args.quick else FULL)
    report["settings"]["seconds"] = round(time.time() - start, 1)
    report["settings"]["mode"] = "quick" if args.quick else "full"
    os.makedirs(out, exist_ok=True)
    plot(report, os.path.join(out, "perplexity.png"))
    text = table(report)
    with open(os.path.join(out, "lm_diloco.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "lm_diloco.json"), "w") as f:
        json.dump(jsonable(report, digits=None), f, indent=1, allow_nan=False)
    print(text)
    print(f"total {time.time() - start:.1f} s; wrote {out}")
    return report


if __name__ == "__main__":
    main()
