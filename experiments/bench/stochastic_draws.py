"""The cost of the random draws of the stochastic graphs and of failures, and of their rounds, at
one N, side by side in one process.

The draws, each in a jitted ``lax.fori_loop`` of ``--rounds`` rounds: for every M in ``--coins``
(multiples of N), ``jax.random.uniform(key, (M,)) >= p`` against the same bits from
:func:`jaxgossip.topology.coins.coins` (the threefry hash unrolled into one fused loop, computed
into memory) and the cheaper coins of :func:`jaxgossip.topology.coins.hashed_coins` (other bits,
``+coins:hash``); for random_out with s out-neighbours (``--out-degrees``), the s Floyd draws
``jax.random.randint(k_j, (N,), 0, N - s + j)`` against :func:`jaxgossip.topology.coins.randint`;
the per-pair coins of a failed drawn matching, ``vmap(uniform(fold_in(key, code)))`` over 2N
codes, against :func:`jaxgossip.topology.coins.folded_uniform`. Then for every spec and D in
``--dims``, on x of shape [N, D] float32, one round of
``jaxgossip.mix(g.draw(key, t).graph, x, t)`` (as ``experiments/bench/million_nodes.py`` times
it), for a failed graph also the round of its base graph without failures, and for random_out the
mix alone on a round drawn once (the segment kernel: a gather of x and a scatter over the random
receivers). Medians of ``--reps`` calls after one warm-up, per round, wall and CPU time
(``time.process_time``, all threads): on a loaded machine compare the ratios.

    python experiments/bench/stochastic_draws.py --log2-n 20
    python experiments/bench/stochastic_draws.py --log2-n 12 --rounds 2 --reps 1  # smoke
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp

import jaxgossip as jg
from jaxgossip import topology
from jaxgossip.topology import coins

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _benchlib import per_round, round_loop  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log2-n", type=int, default=20)
    parser.add_argument("--coins", default="1,2,3", help="failure coin counts, in multiples of N")
    parser.add_argument("--out-degrees", default="1,2,3", help="random_out's s")
    parser.add_argument(
        "--specs",
        default="ring+drop:0.1,ring+drop:0.1+coins:hash,torus+drop:0.1+nodedrop:0.05,"
        "torus+drop:0.1+nodedrop:0.05+coins:hash,random_out:1,random_out:2,random_out:3,"
        "random_matching:feistel,random_matching:feistel+drop:0.1",
    )
    parser.add_argument("--dims", default="1,4")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    n, rounds, reps = 1 << args.log2_n, args.rounds, args.reps
    key = jax.random.key(0)

    def show(label, seconds):
        print(f"{label:56s} wall {seconds[0] * 1e3:8.3f} ms  cpu {seconds[1] * 1e3:8.3f} ms", flush=True)

    zero = jnp.zeros((n,), jnp.float32)
    for multiple in (int(m) for m in args.coins.split(",")):
        num = multiple * n
        flips = {
            "jax.random.uniform": lambda k, num=num: jax.random.uniform(k, (num,)) >= 0.1,
            "coins.coins": lambda k, num=num: coins.coins(k, num, 0.1),
            "coins.hashed_coins (other bits)": lambda k, num=num: coins.hashed_coins(k, num, 0.1),
        }
        for name, flip in flips.items():
            # Each round reads every coin (a sum), so that none is left undrawn.
            body = lambda t, x, flip=flip: x + jnp.sum(flip(jax.random.fold_in(key, t))).astype(x.dtype)  # noqa: E731
            show(f"coins {multiple}N: {name}", per_round(round_loop(body, rounds), zero, rounds, reps))
    draws = {
        "jax.random.randint": lambda k, hi: jax.random.randint(k, (n,), 0, hi, dtype=jnp.int32),
        "coins.randint": lambda k, hi: coins.randint(k, n, 0, hi),
    }
    for s in (int(v) for v in args.out_degrees.split(",")):
        for name, draw in draws.items():

            def body(t, x, draw=draw, s=s):
                keys = jax.random.split(jax.random.fold_in(key, t), s)
                for j in range(s):
                    x = x + draw(keys[j], n - s + j)
                return x

            show(
                f"random_out:{s} draws ({s} x N): {name}",
                per_round(round_loop(body, rounds), jnp.zeros((n,), jnp.int32), rounds, reps),
            )
    codes = jnp.arange(2 * n, dtype=jnp.int32) * 7
    folds = {
        "vmap(uniform(fold_in))": lambda k, c: jax.vmap(lambda d: jax.random.uniform(jax.random.fold_in(k, d)))(c),
        "coins.folded_uniform": coins.folded_uniform,
    }
    for name, fold in folds.items():
        body = lambda t, x, fold=fold: x + fold(jax.random.fold_in(key, t), codes + t)  # noqa: E731
        show(
            f"pair coins (2N): {name}",
            per_round(round_loop(body, rounds), jnp.zeros((2 * n,), jnp.float32), rounds, reps),
        )
    for dim in (int(d) for d in args.dims.split(",")):
        x = jnp.ones((n, dim), jnp.float32)
        for spec in args.specs.split(","):
            graph = topology.make(spec, n)
            body = lambda t, x, g=graph: jg.mix(g.draw(jax.random.fold_in(key, t), t).graph, x, t)  # noqa: E731
            show(f"D={dim} {spec} round", per_round(round_loop(body, rounds), x, rounds, reps))
            if "drop:" in spec:
                base = graph.sampler.base
                body = lambda t, x, g=base: jg.mix(g.draw(jax.random.fold_in(key, t), t).graph, x, t)  # noqa: E731
                show(f"D={dim} {spec} without failures", per_round(round_loop(body, rounds), x, rounds, reps))
            if spec.startswith("random_out") and "+" not in spec:

                def mix_alone(x, g=graph):
                    drawn = g.draw(key, 0).graph
                    return jax.lax.fori_loop(0, rounds, lambda t, x: jg.mix(drawn, x, t), x)

                show(f"D={dim} {spec} mix alone", per_round(jax.jit(mix_alone), x, rounds, reps))


if __name__ == "__main__":
    main()
