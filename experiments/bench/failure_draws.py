"""The cost of failures drawn inside the compiled run: the coins alone, and a gossip round of a
failed graph next to the round of the graph itself, at one N, side by side in one process.

For every M in ``--coins`` (multiples of N) the script times, in a jitted ``lax.fori_loop`` of
``--rounds`` rounds, ``jax.random.uniform(key, (M,)) >= p`` against the same bits from
:func:`jaxgossip.topology.coins.coins` (the threefry hash unrolled into one fused loop, computed
into memory) and against the cheaper coins of :func:`jaxgossip.topology.coins.hashed_coins`
(other bits, ``+coins:hash``). Then for every spec and D in ``--dims``, on x of shape [N, D] float32, one round of
``jaxgossip.mix(g.draw(key, t).graph, x, t)`` (as ``experiments/bench/million_nodes.py`` times it)
and the round of the spec's base graph without failures. Medians of ``--reps`` calls after one
warm-up, per round, wall and CPU time (``time.process_time``, all threads): on a loaded machine
compare the ratios.

    python experiments/bench/failure_draws.py --log2-n 20
    python experiments/bench/failure_draws.py --log2-n 12 --rounds 2 --reps 1  # smoke
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

import jaxgossip as jg
from jaxgossip import topology
from jaxgossip.topology import coins


def per_round(fn, x, rounds: int, reps: int) -> tuple[float, float]:
    """(wall, cpu) seconds per round of the jitted loop ``fn`` on x: medians of ``reps`` calls."""
    jax.block_until_ready(fn(x))
    walls, cpus = [], []
    for _ in range(reps):
        wall, cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn(x))
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls) / rounds, statistics.median(cpus) / rounds


def loop(body, rounds: int):
    return jax.jit(lambda x: jax.lax.fori_loop(0, rounds, body, x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log2-n", type=int, default=20)
    parser.add_argument("--coins", default="1,2,3", help="coin counts, in multiples of N")
    parser.add_argument(
        "--specs",
        default="ring+drop:0.1,ring+drop:0.1+coins:hash,torus+drop:0.1+nodedrop:0.05,torus+drop:0.1+nodedrop:0.05+coins:hash",
    )
    parser.add_argument("--dims", default="1,4")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    n, rounds, reps = 1 << args.log2_n, args.rounds, args.reps
    key = jax.random.key(0)
    zero = jnp.zeros((n,), jnp.float32)

    def show(label, seconds):
        print(f"{label:48s} wall {seconds[0] * 1e3:8.3f} ms  cpu {seconds[1] * 1e3:8.3f} ms", flush=True)

    for multiple in (int(m) for m in args.coins.split(",")):
        num = multiple * n
        draws = {
            "jax.random.uniform": lambda k: jax.random.uniform(k, (num,)) >= 0.1,
            "coins.coins": lambda k: coins.coins(k, num, 0.1),
            "coins.hashed_coins (other bits)": lambda k: coins.hashed_coins(k, num, 0.1),
        }
        for name, draw in draws.items():
            # Each round reads every coin (a sum), so that none is left undrawn.
            body = lambda t, x, draw=draw: x + jnp.sum(draw(jax.random.fold_in(key, t))).astype(x.dtype)  # noqa: E731
            show(f"coins {multiple}N: {name}", per_round(loop(body, rounds), zero, rounds, reps))
    for dim in (int(d) for d in args.dims.split(",")):
        x = jnp.ones((n, dim), jnp.float32)
        for spec in args.specs.split(","):
            graph = topology.make(spec, n)
            for label, g in ((spec, graph), (spec.split("+")[0] + " (no failures)", graph.sampler.base)):
                body = lambda t, x, g=g: jg.mix(g.draw(jax.random.fold_in(key, t), t).graph, x, t)  # noqa: E731
                show(f"D={dim} {label}", per_round(loop(body, rounds), x, rounds, reps))


if __name__ == "__main__":
    main()
