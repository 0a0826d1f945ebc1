"""Ablation of ``public_init``: Choco-type public copies starting at 0 (the papers) or at the shared
initial model, in identically initialised training runs on the embedded digits.

Choco-SGD top-1 % on the 8-ring and Sparse-Push top-1 % on the one-peer exponential graph, MLP(64),
8 nodes, IID partition, lr 0.05, batch 16, 200 rounds evaluated every 10, seeds 0 and 1. Reports the
consensus distance after the first 10 rounds and at the end, and the accuracies of the averaged
model and of the nodes' own models.

    python experiments/public_init_ablation.py [--out experiments/results/public_init_ablation]

About a minute on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from jaxgossip.run import plots
from jaxgossip.run.runner import TrainConfig, run_training

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS = (0, 1)
METHODS = {
    "Choco top-1% (ring, gamma 0.02)": {
        "algorithm": "choco",
        "topology": "ring",
        "algorithm_options": {"gamma": 0.02, "compressor": "top_k", "compressor_options": {"fraction": 0.01}},
    },
    "Sparse-Push top-1% (one-peer exp., gamma 0.1)": {
        "algorithm": "sparse_push",
        "topology": "one_peer_exponential",
        "algorithm_options": {"gamma": 0.1, "fraction": 0.01},
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(HERE, "results", "public_init_ablation"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    table = []
    for label, method in METHODS.items():
        for init in ("zero", "model"):
            runs = []
            for seed in SEEDS:
                config = TrainConfig(
                    dataset="digits",
                    num_nodes=8,
                    model="mlp",
                    model_options={"hidden": [64]},
                    partition="iid",
                    batch_size=16,
                    lr=0.05,
                    num_rounds=200,
                    eval_every=10,
                    evals_per_chunk=20,
                    eval_size=360,
                    seed=seed,
                    algorithm=method["algorithm"],
                    topology=method["topology"],
                    algorithm_options={**method["algorithm_options"], "public_init": init},
                )
                result = run_training(config, None, progress=False, log=lambda s: None)
                runs.append(result.rows)
            first = [r[0]["consensus"] for r in runs]
            last = [r[-1] for r in runs]
            table.append(
                {
                    "method": label,
                    "public_init": init,
                    "consensus_10": float(np.mean(first)),
                    "consensus_end": float(np.mean([r["consensus"] for r in last])),
                    "acc_avg": float(np.mean([r["test_acc"] for r in last])),
                    "acc_avg_std": float(np.std([r["test_acc"] for r in last], ddof=1)),
                    "acc_nodes": float(np.mean([r["node_acc_mean"] for r in last])),
                    "MB_per_node": float(np.mean([r["MB_per_node"] for r in last])),
                }
            )
            print(table[-1], flush=True)
    columns = [
        ("method", "method", ""),
        ("public_init", "public_init", ""),
        ("consensus_10", "consensus @10", ".3g"),
        ("consensus_end", "consensus @200", ".3g"),
        ("acc_avg", "acc(avg)", ".4f"),
        ("acc_avg_std", "+-", ".4f"),
        ("acc_nodes", "acc(nodes)", ".4f"),
        ("MB_per_node", "MB/node", ".3f"),
    ]
    print(plots.format_table(table, columns))
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(plots.format_table(table, columns, markdown=True) + "\n")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
