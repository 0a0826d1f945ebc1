"""The round of the low-bandwidth methods against a gossip round of the same model, side by side.

For one model on N nodes of a ring, every method is timed two ways, each compiled once and then
called ``--reps`` times in alternation with the others (the median is reported):

* ``comm``: the communication round alone, ``alg.step`` on the stacked models (for DeMo, its
  gradient hook on a gradient-shaped tree first, since the hook feeds the round);
* ``train``: a training chunk of ``--rounds`` rounds of the trainer (local step and round each,
  one evaluation on 64 test samples at its end), the way a run spends its time.

The target is a round of each new method within 2x a gossip round of the same model; the ratio to
``gossip`` is printed per row. Methods: ``gossip``, ``sparta`` (p = 0.005, the reference's), and
``demo_momentum`` (C = 64, k = 32 as the reference, and k = 4).

    python experiments/bench/wan_rounds.py [--model mlp|transformer] [--nodes 8] [--reps 5]
                                           [--rounds 10] [--quick] [--json FILE]

Timings are only meaningful on a quiet machine (nothing else running on its cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _benchlib import header_line, machine_info, write_result  # noqa: E402

from jaxgossip.engine.training import make_train  # noqa: E402
from jaxgossip.models import count_params  # noqa: E402
from jaxgossip.run.resolve import check_train_config, make_optimizer, resolve  # noqa: E402
from jaxgossip.run.runner import TrainConfig  # noqa: E402

METHODS = {
    "gossip": {},
    "sparta": {"fraction": 0.005},
    "demo_momentum_k32": {"lr": 0.003, "k": 32, "chunk": 64},
    "demo_momentum_k4": {"lr": 0.003, "k": 4, "chunk": 64},
}
MODELS = {
    "mlp": dict(dataset="digits", model="mlp"),
    "transformer": dict(dataset="python_docs", model="transformer", partition="by_source"),
}


def _algorithm_name(method: str) -> str:
    return method.split("_k")[0]


def _median(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def build(method: str, args) -> dict:
    """The compiled comm round and training chunk of ``method`` with their arguments."""
    config = check_train_config(
        TrainConfig(
            **MODELS[args.model],
            num_nodes=args.nodes,
            topology="ring",
            algorithm=_algorithm_name(method),
            algorithm_options=METHODS[method],
            num_rounds=args.rounds,
            eval_every=args.rounds,
            batch_size=args.batch,
        )
    )
    prep = resolve(config)
    alg = prep.algorithm
    trainer = make_train(
        prep.model,
        alg,
        prep.shards,
        (prep.dataset.x_test[:64], prep.dataset.y_test[:64]),
        make_optimizer(config),
        num_rounds=args.rounds,
        batch_size=args.batch,
        eval_every=args.rounds,
        eval_chunk=64,
    )
    state = trainer.init(jax.random.key(0))
    params, comm_state = state.params, state.comm_state

    def comm(params, comm_state, key):
        if alg.gradient is not None:
            _, comm_state = alg.gradient(params, params, comm_state)
        return alg.step(params, comm_state, key)

    comm_fn = jax.jit(comm)
    key = jax.random.key(1)
    jax.block_until_ready(comm_fn(params, comm_state, key))
    jax.block_until_ready(trainer.run_chunk(state, 1))  # compiled once here
    return {
        "comm": lambda: comm_fn(params, comm_state, key),
        "train": lambda: trainer.run_chunk(state, 1),
        "num_params": count_params(jax.tree_util.tree_map(lambda leaf: leaf[0], params)),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mlp", choices=list(MODELS))
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10, help="rounds per timed training chunk")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="4 nodes, 2 rounds, 1 repetition (a smoke test)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.rounds, args.reps = 4, 2, 1
    info = machine_info()
    print(header_line(info), flush=True)
    built = {method: build(method, args) for method in METHODS}
    medians = {method: {"comm": [], "train": []} for method in METHODS}
    for _ in range(args.reps):  # in alternation, so that a load change hits every method alike
        for method, fns in built.items():
            for part in ("comm", "train"):
                medians[method][part].append(_median(fns[part], 1))
    rows = {}
    for method in METHODS:
        rows[method] = {part: statistics.median(medians[method][part]) for part in ("comm", "train")}
    for row in rows.values():
        row["comm_over_gossip"] = row["comm"] / rows["gossip"]["comm"]
        row["train_over_gossip"] = row["train"] / rows["gossip"]["train"]
    num_params = built["gossip"]["num_params"]
    print(f"{args.model}: {num_params:,} parameters per node, {args.nodes} nodes on a ring, {args.reps} reps")
    print(f"{'method':<20} {'comm s':>10} {'x gossip':>9} {'train chunk s':>14} {'x gossip':>9}")
    for method, row in rows.items():
        print(
            f"{method:<20} {row['comm']:>10.5f} {row['comm_over_gossip']:>9.2f} "
            f"{row['train']:>14.4f} {row['train_over_gossip']:>9.2f}"
        )
    worst = max(row["train_over_gossip"] for row in rows.values())
    print(f"largest training-round ratio to gossip: {worst:.2f} (target <= 2)")
    return write_result(
        args.json,
        {"machine": info, "settings": vars(args), "num_params": num_params, "rows": rows, "worst_train_ratio": worst},
    )


if __name__ == "__main__":
    main()
