"""What the simulated clock costs: a training chunk with and without a time model, side by side.

The same run (digits, an MLP or the CNN, N nodes, gossip on a ring or Choco top-1 %) is compiled
twice, untimed and timed (stragglers, per-edge-priced links), and the two chunks are timed in
alternation in one process, ``--reps`` times each after one warm-up call; the ratio of the medians
is the clock's overhead (the target: at most 5 %).

    python experiments/bench/timing_overhead.py [--model mlp] [--nodes 16] [--reps 7] [--out FILE.json]

``--out`` appends one row (settings, medians, ratio, backend and CPU count) to a JSON list.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import numpy as np

from jaxgossip.engine.training import make_train
from jaxgossip.run.resolve import check_train_config, make_optimizer, resolve
from jaxgossip.run.runner import TrainConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--algorithm", default="gossip", choices=["gossip", "choco"])
    parser.add_argument("--rounds", type=int, default=20, help="rounds per timed chunk")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", default=None, help="JSON list to append this run's row to")
    args = parser.parse_args()
    options = {}
    if args.algorithm == "choco":
        options = {"compressor": "top_k", "compressor_options": {"fraction": 0.01}, "gamma": 0.5}
    base = TrainConfig(
        dataset="digits",
        model=args.model,
        num_nodes=args.nodes,
        algorithm=args.algorithm,
        algorithm_options=options,
        num_rounds=args.rounds,
        eval_every=args.rounds,
        batch_size=16,
    )
    timed_config = check_train_config(
        base.replace(time={"compute": "stragglers:0.01,0.125,10", "latency": 1e-3, "bandwidth": 1e8})
    )
    prep = resolve(timed_config)

    alg = prep.algorithm
    eval_data = (prep.dataset.x_test[:500], prep.dataset.y_test[:500])
    common = dict(num_rounds=args.rounds, batch_size=16, eval_every=args.rounds, eval_chunk=500)
    runs = {
        "untimed": make_train(prep.model, alg, prep.shards, eval_data, make_optimizer(base), **common),
        "timed": make_train(
            prep.model,
            alg,
            prep.shards,
            eval_data,
            make_optimizer(base),
            time=prep.time,
            **common,
        ),
    }
    states = {name: trainer.init(jax.random.key(0)) for name, trainer in runs.items()}
    for name, trainer in runs.items():  # compile
        jax.block_until_ready(trainer.run_chunk(states[name], 1))
    times = {name: [] for name in runs}
    for _ in range(args.reps):
        for name, trainer in runs.items():
            start = time.perf_counter()
            jax.block_until_ready(trainer.run_chunk(states[name], 1))
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(
        f"# timing_overhead: {args.model}, {args.nodes} nodes, {args.algorithm}, {args.rounds} rounds per chunk, "
        f"{args.reps} reps, {jax.default_backend()}"
    )
    for name, value in med.items():
        print(f"{name:8s} {value * 1e3:9.2f} ms per chunk (min {min(times[name]) * 1e3:.2f})")
    print(f"timed / untimed = {med['timed'] / med['untimed']:.3f}")
    if args.out:
        rows = []
        if os.path.exists(args.out):
            with open(args.out) as f:
                rows = json.load(f)
        rows.append(
            {
                "model": args.model,
                "nodes": args.nodes,
                "algorithm": args.algorithm,
                "rounds_per_chunk": args.rounds,
                "reps": args.reps,
                "untimed_ms": med["untimed"] * 1e3,
                "timed_ms": med["timed"] * 1e3,
                "timed_over_untimed": med["timed"] / med["untimed"],
                "backend": jax.default_backend(),
                "cpu_count": os.cpu_count(),
            }
        )
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    np.testing.assert_array_equal(  # the clock never changes the iterates
        np.asarray(jax.tree_util.tree_leaves(runs["timed"].run_chunk(states["timed"], 1)[0].params)[0]),
        np.asarray(jax.tree_util.tree_leaves(runs["untimed"].run_chunk(states["untimed"], 1)[0].params)[0]),
    )


if __name__ == "__main__":
    main()
