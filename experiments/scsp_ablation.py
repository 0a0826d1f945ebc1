"""SCSP ablation on non-IID data: which part recovers the accuracy lost to compression?

Trains 16 nodes on the embedded digits data (Dirichlet(alpha) label skew) over the time-varying
one-peer exponential graph with

* push_sum (uncompressed SGP, the reference accuracy),
* sparse_push (top-k compressed push-sum),
* sparse_push at 4x the density (about the bits of (b), the fair comparison for the budget rule),
* scsp with only the final merge (a), only the residual-adaptive budget (b), and both,

for several seeds, and writes a table (accuracy of the averaged model and of the nodes, MB sent per
node, reduction vs push_sum) to ``experiments/results/scsp_ablation.{json,md}``.

    python experiments/scsp_ablation.py [--quick] [--seeds 3] [--fraction 0.01]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from jaxgossip import data
from jaxgossip.run.plots import format_table
from jaxgossip.run.runner import TrainConfig, run_training

HERE = os.path.dirname(os.path.abspath(__file__))


def variants(fraction: float, gamma: float, merge_rounds: int) -> list[dict]:
    sparse = {"fraction": fraction, "gamma": gamma}
    return [
        {"name": "push_sum (uncompressed)", "algorithm": "push_sum", "options": {}, "merge": None},
        {"name": "sparse_push", "algorithm": "sparse_push", "options": sparse, "merge": None},
        # Same bits as (b) roughly: does the adaptive budget beat a uniformly larger one?
        {
            "name": "sparse_push 4x density",
            "algorithm": "sparse_push",
            "options": {**sparse, "fraction": min(1.0, 4 * fraction)},
            "merge": None,
        },
        {
            "name": "scsp (a) merge only",
            "algorithm": "scsp",
            "options": {**sparse, "compensation": False},
            "merge": merge_rounds,
        },
        {"name": "scsp (b) compensation only", "algorithm": "scsp", "options": sparse, "merge": None},
        {"name": "scsp (a)+(b)", "algorithm": "scsp", "options": sparse, "merge": merge_rounds},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--fraction", type=float, default=0.01)
    parser.add_argument("--gamma", type=float, default=0.3)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    rounds = 100 if args.quick else args.rounds
    seeds = 1 if args.quick else args.seeds
    dataset = data.load_dataset("digits")
    base = TrainConfig(
        dataset="digits",
        num_nodes=16,
        topology="one_peer_exponential",
        partition=f"dirichlet:{args.alpha}",
        model="mlp",
        model_options={"hidden": [64]},
        batch_size=16,
        num_rounds=rounds,
        eval_every=rounds // 4,
        evals_per_chunk=4,
        lr=0.05,
        eval_size=360,
    )
    merge_rounds = 4  # one period of one_peer_exponential(16): exact averaging of the push-sum mass
    table = []
    for variant in variants(args.fraction, args.gamma, merge_rounds):
        accs, node_accs, mbs, walls = [], [], [], []
        for seed in range(seeds):
            config = base.replace(
                algorithm=variant["algorithm"],
                algorithm_options=variant["options"],
                final_merge=variant["merge"],
                seed=seed,
                name=variant["name"],
            )
            start = time.perf_counter()
            result = run_training(config, None, progress=False, dataset=dataset, log=lambda s: None)
            walls.append(time.perf_counter() - start)
            last = result.rows[-1]
            accs.append(last["test_acc"])
            node_accs.append(last["node_acc_mean"])
            mbs.append(last["MB_per_node"])
        table.append(
            {
                "name": variant["name"],
                "acc": float(np.mean(accs)),
                "acc_std": float(np.std(accs)),
                "node_acc": float(np.mean(node_accs)),
                "MB": float(np.mean(mbs)),
                "wall": float(np.mean(walls)),
            }
        )
        print(
            f"{variant['name']:<28} acc {table[-1]['acc']:.4f} +- {table[-1]['acc_std']:.4f}  "
            f"nodes {table[-1]['node_acc']:.4f}  MB/node {table[-1]['MB']:.3f}",
            flush=True,
        )
    reference = table[0]["MB"]
    for row in table:
        row["reduction"] = reference / row["MB"]
    text = format_table(
        table,
        [
            ("name", "variant", ""),
            ("acc", "acc(avg model)", ".4f"),
            ("acc_std", "+-", ".4f"),
            ("node_acc", "acc(nodes)", ".4f"),
            ("MB", "MB/node", ".3f"),
            ("reduction", "x less than SGP", ".1f"),
            ("wall", "time(s)", ".1f"),
        ],
    )
    print(text)
    os.makedirs(args.out, exist_ok=True)
    setting = (
        f"digits, 16 nodes, one_peer_exponential(16), dirichlet({args.alpha}), MLP(64), {rounds} rounds, "
        f"top-{args.fraction:.0%}, gamma={args.gamma}, {seeds} seed(s)"
    )
    with open(os.path.join(args.out, "scsp_ablation.json"), "w") as f:
        json.dump({"setting": setting, "rows": table}, f, indent=1)
    with open(os.path.join(args.out, "scsp_ablation.md"), "w") as f:
        f.write(f"{setting}\n\n```\n{text}\n```\n")


if __name__ == "__main__":
    main()
