"""The round of the low-bandwidth methods against a gossip round of the same model, side by side.

For one model on N nodes of a ring, every method is timed two ways, each compiled once and then
called ``--reps`` times in alternation with the others (the median is reported):

* ``comm``: the communication round alone, ``alg.step`` on the stacked models (for DeMo, its
  gradient hook on a gradient-shaped tree first, since the hook feeds the round);
* ``train``: a training chunk of ``--rounds`` rounds of the trainer (local step and round each,
  one evaluation on 64 test samples at its end), the way a run spends its time.

The target is a round of each new method within 2x a gossip round of the same model; the ratio to
``gossip`` is printed per row. Methods: ``gossip``, ``sparta`` (p = 0.005, the reference's),
``demo_momentum`` (C = 64, k = 32 as the reference, and k = 4), and DiLoCo and Streaming DiLoCo
over the same gossip round (H = 10 inner steps per outer round; Streaming: F = 2 fragments,
tau = 1, mix 0.5, 4-bit outer gradients, the study's settings). The two DiLoCo rows have no
``comm`` time (their communication is part of the outer round, not one ``alg.step``), and their
``train`` chunk is ``--rounds / 10`` outer rounds: the same number of local steps as the others'.

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

from jaxgossip.run import runner  # noqa: E402
from jaxgossip.run.resolve import check_train_config  # noqa: E402
from jaxgossip.run.runner import TrainConfig  # noqa: E402

H = 10  # inner steps per outer round of the DiLoCo rows
_DILOCO = dict(local_steps=H, outer_optimizer="nesterov")
# method: (algorithm, its options, other TrainConfig fields)
METHODS = {
    "gossip": ("gossip", {}, {}),
    "sparta": ("sparta", {"fraction": 0.005}, {}),
    "demo_momentum_k32": ("demo_momentum", {"lr": 0.003, "k": 32, "chunk": 64}, {}),
    "demo_momentum_k4": ("demo_momentum", {"lr": 0.003, "k": 4, "chunk": 64}, {}),
    "diloco": ("gossip", {}, _DILOCO),
    "streaming_diloco": (
        "gossip",
        {},
        dict(
            _DILOCO,
            outer_message="pseudo_gradient",
            outer_fragments=2,
            outer_overlap=1,
            outer_mix=0.5,
            outer_message_bits=4,
        ),
    ),
}
MODELS = {
    "mlp": dict(dataset="digits", model="mlp"),
    "transformer": dict(dataset="python_docs", model="transformer", partition="by_source"),
}


def _median(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def build(method: str, args) -> dict:
    """The compiled comm round and training chunk of ``method`` with their arguments."""
    algorithm, options, fields = METHODS[method]
    rounds = args.rounds // fields.get("local_steps", 1)
    config = check_train_config(
        TrainConfig(
            **MODELS[args.model],
            num_nodes=args.nodes,
            topology="ring",
            algorithm=algorithm,
            algorithm_options=options,
            num_rounds=rounds,
            eval_every=rounds,
            batch_size=args.batch,
            eval_size=64,
            eval_chunk=64,
            **fields,
        )
    )
    built = runner.build(config)
    trainer = built.trainer
    state = trainer.init(jax.random.key(0))
    jax.block_until_ready(trainer.run_chunk(state, 1))  # compiled once here
    train = {"train": lambda: trainer.run_chunk(state, 1), "num_params": built.num_params}
    if fields:
        return {"comm": None, **train}
    alg = built.resolved.algorithm
    params, comm_state = state.params, state.comm_state

    def comm(params, comm_state, key):
        if alg.gradient is not None:
            _, comm_state = alg.gradient(params, params, comm_state)
        return alg.step(params, comm_state, key)

    comm_fn = jax.jit(comm)
    key = jax.random.key(1)
    jax.block_until_ready(comm_fn(params, comm_state, key))
    return {"comm": lambda: comm_fn(params, comm_state, key), **train}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mlp", choices=list(MODELS))
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10, help=f"rounds per timed training chunk (a multiple of {H})")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help=f"4 nodes, {H} rounds, 1 repetition (a smoke test)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.rounds % H:
        parser.error(f"--rounds={args.rounds} must be a multiple of {H} (the DiLoCo rows' inner steps per round)")
    if args.quick:
        args.nodes, args.rounds, args.reps = 4, H, 1
    info = machine_info()
    print(header_line(info), flush=True)
    built = {method: build(method, args) for method in METHODS}
    medians = {method: {"comm": [], "train": []} for method in METHODS}
    for _ in range(args.reps):  # in alternation, so that a load change hits every method alike
        for method, fns in built.items():
            for part in ("comm", "train"):
                if fns[part] is not None:
                    medians[method][part].append(_median(fns[part], 1))
    rows = {}
    for method in METHODS:
        rows[method] = {
            part: statistics.median(v) if (v := medians[method][part]) else None for part in ("comm", "train")
        }
    for row in rows.values():
        row["comm_over_gossip"] = None if row["comm"] is None else row["comm"] / rows["gossip"]["comm"]
        row["train_over_gossip"] = row["train"] / rows["gossip"]["train"]
    num_params = built["gossip"]["num_params"]
    print(f"{args.model}: {num_params:,} parameters per node, {args.nodes} nodes on a ring, {args.reps} reps")
    print(f"{'method':<20} {'comm s':>10} {'x gossip':>9} {'train chunk s':>14} {'x gossip':>9}")
    for method, row in rows.items():
        comm = "-" if row["comm"] is None else f"{row['comm']:.5f}"
        comm_ratio = "-" if row["comm"] is None else f"{row['comm_over_gossip']:.2f}"
        print(f"{method:<20} {comm:>10} {comm_ratio:>9} {row['train']:>14.4f} {row['train_over_gossip']:>9.2f}")
    worst = max(row["train_over_gossip"] for row in rows.values())
    print(f"largest training-round ratio to gossip: {worst:.2f} (target <= 2)")
    return write_result(
        args.json,
        {"machine": info, "settings": vars(args), "num_params": num_params, "rows": rows, "worst_train_ratio": worst},
    )


if __name__ == "__main__":
    main()
