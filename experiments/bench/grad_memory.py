"""Forward vs gradient of a long decentralized optimization run: time and peak memory, with and
without rematerialisation.

Workload: D-PSGD (gossip on a ring, N nodes, one SGD step per round) on per-node quadratics
``f_i(x) = 1/2 ||x - c_i||^2`` of dimension D; the scalar is the final global objective and the
gradient is taken with respect to the (injected) learning rate, so every round's state enters the
backward pass. Modes: ``plain`` (no rematerialisation: every round's residuals are stored),
``remat`` (each round rematerialised: the S carries are stored), ``chunked`` (chunks of
C = round(sqrt(S)) rounds rematerialised, C a divisor of S: about S / C + C carries).

Memory: XLA's compiled memory analysis (``temp_size_in_bytes`` of the jitted forward and of the
jitted gradient; deterministic, independent of load). Time: median of ``--reps`` calls after one
warm-up, compile excluded; run it on a quiet machine.

  python experiments/bench/grad_memory.py                          # S = 100 and 1,000
  python experiments/bench/grad_memory.py --rounds 100 1000 --dim 10000 --json experiments/bench/grad_memory.json
"""

from __future__ import annotations

import argparse
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _benchlib import header_line, machine_info, median_seconds, write_result

import jaxgossip as jg
from jaxgossip.engine.optimization import optimization_scan

MODES = ("plain", "remat", "chunked")


def chunk_for(num_rounds: int) -> int:
    """The divisor of S nearest to sqrt(S)."""
    divisors = [c for c in range(1, num_rounds + 1) if num_rounds % c == 0]
    return min(divisors, key=lambda c: abs(c - math.sqrt(num_rounds)))


def objective_fn(num_nodes: int, dim: int, num_rounds: int, mode: str):
    targets = jnp.asarray(np.random.default_rng(0).normal(size=(num_nodes, dim)), jnp.float32)
    alg = jg.algorithms.make("gossip", jg.topology.ring(num_nodes))
    x0 = jnp.zeros((num_nodes, dim), jnp.float32)
    key = jax.random.key(0)
    options = {
        "plain": {},
        "remat": {"remat": True},
        "chunked": {"remat": True, "checkpoint_every": chunk_for(num_rounds)},
    }

    def loss_fn(x, node, key):
        del key
        return 0.5 * jnp.sum((x - targets[node]) ** 2)

    def final_objective(lr):
        optimizer = optax.inject_hyperparams(optax.sgd)(learning_rate=lr)
        return optimization_scan(alg, x0, loss_fn, optimizer, num_rounds, key, **options[mode]).objective[-1]

    return final_objective


def measure(num_nodes: int, dim: int, num_rounds: int, mode: str, reps: int) -> dict:
    f = objective_fn(num_nodes, dim, num_rounds, mode)
    lr = jnp.float32(0.05)
    row = {"rounds": num_rounds, "mode": mode, "chunk": chunk_for(num_rounds) if mode == "chunked" else None}
    for name, fn in (("forward", jax.jit(f)), ("gradient", jax.jit(jax.grad(f)))):
        compiled = fn.lower(lr).compile()
        row[f"{name}_temp_bytes"] = int(compiled.memory_analysis().temp_size_in_bytes)
        jax.block_until_ready(compiled(lr))  # warm-up
        row[f"{name}_seconds"] = median_seconds(lambda c=compiled: c(lr), reps)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--dim", type=int, default=10000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    info = machine_info()
    print(header_line(info))
    print(f"N = {args.nodes}, D = {args.dim}; temp = XLA compiled temporaries")
    print(
        f"{'S':>6} {'mode':>8} {'C':>4} {'fwd s':>9} {'grad s':>9} {'grad/fwd':>8} {'fwd temp MB':>12} {'grad temp MB':>13}"
    )
    rows = []
    for num_rounds in args.rounds:
        for mode in MODES:
            row = measure(args.nodes, args.dim, num_rounds, mode, args.reps)
            rows.append(row)
            print(
                f"{num_rounds:>6} {mode:>8} {row['chunk'] or '-':>4} {row['forward_seconds']:>9.4f} "
                f"{row['gradient_seconds']:>9.4f} {row['gradient_seconds'] / row['forward_seconds']:>8.2f} "
                f"{row['forward_temp_bytes'] / 1e6:>12.2f} {row['gradient_temp_bytes'] / 1e6:>13.2f}"
            )
    write_result(args.json, {"machine": info, "nodes": args.nodes, "dim": args.dim, "rows": rows})


if __name__ == "__main__":
    main()
