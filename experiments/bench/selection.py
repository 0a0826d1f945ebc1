"""Exact top-k selection: jaxgossip.compress.selection (native XLA:CPU kernel) vs lax.top_k vs torch.topk.

Times one selection of the K largest entries of every row (``top_k``: values and indices) and the
top-k compressor's dense message (``top_k_dense``: K largest |x| kept in place, the rest zero), on
the shapes the algorithms meet: the Choco consensus workload (8 rows of 10,000, K = 1, 50, 100) and
ResNet-20-sized rows (16 x 272,474, K = 1 %). Also one Choco top-k consensus round (the workload of
``baselines/compare.py``) with each selector.

Timing: jaxgossip sides are ``jit`` of R calls in a ``lax.fori_loop`` (the selection's input is
the loop carry, nudged every round so no call is hoisted), time / R minus nothing (the nudge, one
elementwise pass, is timed alone and printed as "loop floor"); compiled before timing; medians of
``--reps`` after one warm-up; 0.2 s idle before every call so that the previous runtime's threads
stop spinning. torch: ``torch.topk`` (``abs`` + ``topk`` + ``zeros().scatter_`` for the dense
message) in a Python loop of R calls at 1 and 2 threads. Same data on every side; the results are
checked equal (indices and values) before timing.

  python experiments/bench/selection.py              # ~1 min on the 2-core box
  python experiments/bench/selection.py --json experiments/bench/selection.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _benchlib import header_line, machine_info, write_result  # noqa: E402

import jaxgossip as jg  # noqa: E402
from jaxgossip.compress import native, selection  # noqa: E402

try:
    import torch
except ImportError:  # torch is an optional benchmark-only dependency
    torch = None

SHAPES = [((8, 10_000), 1), ((8, 10_000), 50), ((8, 10_000), 100), ((16, 272_474), 2_724)]


def _median(fn, reps: int, settle: float) -> float:
    times = []
    for _ in range(reps):
        time.sleep(settle)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _jax_loop(op, x, rounds: int):
    def body(i, c):
        return c + jnp.asarray(1e-30, c.dtype) * op(c)

    f = jax.jit(lambda x: jax.lax.fori_loop(0, rounds, body, x)).lower(x).compile()
    jax.block_until_ready(f(x))
    return lambda: jax.block_until_ready(f(x))


def _first(fn):
    return lambda c: fn(c)[0][..., :1]


def _torch_loop(op, x, rounds: int, threads: int):
    def run():
        torch.set_num_threads(threads)
        for _ in range(rounds):
            op(x)

    run()
    return run


def _torch_dense(x, k):
    _, idx = torch.topk(x.abs(), k, dim=-1)
    return torch.zeros_like(x).scatter_(-1, idx, x.gather(-1, idx))


def _check(x, k) -> None:
    values, idx = selection.top_k(x, k)
    lax_values, lax_idx = jax.lax.top_k(x, k)
    assert (np.asarray(idx) == np.asarray(lax_idx)).all() and (np.asarray(values) == np.asarray(lax_values)).all()
    dense = np.asarray(selection.top_k_dense(x, k))
    assert (dense == np.asarray(selection.top_k_dense(x, k, impl="xla"))).all()
    if torch is not None:
        tx = torch.from_numpy(np.asarray(x))
        assert (_torch_dense(tx, k).numpy() == dense).all()


def _choco_round(impl: str, rounds: int):
    """One Choco top-k consensus round of compare.py (8-ring, 100x100 per node, K = 50), with ``impl``."""
    topo = jg.topology.ring(8)
    x0 = jax.random.normal(jax.random.key(0), (8, 100, 100))

    def step(c):
        x, x_hat, s = c
        q = selection.top_k_dense((x - x_hat).reshape(8, -1), 50, impl=impl).reshape(x.shape)
        x_hat = x_hat + q
        s = s + jg.mix(topo, q)
        return x + 0.01468 * (s - x_hat), x_hat, s

    f = jax.jit(
        lambda x: jax.lax.fori_loop(0, rounds, lambda i, c: step(c), (x, jnp.zeros_like(x), jnp.zeros_like(x)))[0]
    )
    f = f.lower(x0).compile()
    jax.block_until_ready(f(x0))
    return lambda: jax.block_until_ready(f(x0))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=200, help="calls per timed loop (R); 10 for the big rows")
    parser.add_argument("--settle", type=float, default=0.2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    info = machine_info()
    status = native.load()
    print(header_line(info))
    print(f"native kernels: {'available' if status.available else 'UNAVAILABLE: ' + status.reason}")
    torch_note = f"torch {torch.__version__}" if torch is not None else "torch not installed (its columns skipped)"
    print(torch_note)
    rows = []
    rng = np.random.default_rng(0)
    for shape, k in SHAPES:
        x = jnp.asarray(rng.normal(size=shape).astype(np.float32))
        _check(x, k)
        rounds = args.rounds if shape[-1] <= 100_000 else max(1, args.rounds // 20)
        per = lambda fn: _median(fn, args.reps, args.settle) / rounds * 1e6  # noqa: E731
        row = {"shape": list(shape), "k": k, "rounds": rounds}
        row["loop_floor_us"] = per(_jax_loop(lambda c: c, x, rounds))
        row["lax_top_k_us"] = per(_jax_loop(_first(lambda c: jax.lax.top_k(c, k)), x, rounds))
        row["native_top_k_us"] = per(_jax_loop(_first(lambda c: selection.top_k(c, k, impl="native")), x, rounds))
        row["xla_dense_us"] = per(_jax_loop(lambda c: selection.top_k_dense(c, k, impl="xla"), x, rounds))
        row["native_dense_us"] = per(_jax_loop(lambda c: selection.top_k_dense(c, k, impl="native"), x, rounds))
        if torch is not None:
            tx = torch.from_numpy(np.asarray(x))
            for threads in (1, 2):
                row[f"torch{threads}_top_k_us"] = per(
                    _torch_loop(lambda t: torch.topk(t, k, dim=-1), tx, rounds, threads)
                )
                row[f"torch{threads}_dense_us"] = per(_torch_loop(lambda t: _torch_dense(t, k), tx, rounds, threads))
        rows.append(row)
        print({key: (round(v, 1) if isinstance(v, float) else v) for key, v in row.items()})

    rounds = args.rounds
    choco = {
        impl: _median(_choco_round(impl, rounds), args.reps, args.settle) / rounds * 1e3 for impl in ("xla", "native")
    }
    print(
        f"Choco top-k consensus round (8-ring, 100x100, K = 50): xla {choco['xla']:.3f} ms, "
        f"native {choco['native']:.3f} ms"
    )

    cols = ["lax.top_k", "native top_k", "XLA dense", "native dense"]
    keys = ["lax_top_k_us", "native_top_k_us", "xla_dense_us", "native_dense_us"]
    if torch is not None:
        cols += ["torch.topk 1t", "torch.topk 2t", "torch dense 1t", "torch dense 2t"]
        keys += ["torch1_top_k_us", "torch2_top_k_us", "torch1_dense_us", "torch2_dense_us"]
    print()
    print("| rows x D | K | loop floor | " + " | ".join(cols) + " |")
    print("|---|---|---|" + "---|" * len(cols))
    for row in rows:
        shape = " x ".join(f"{d:,}" for d in row["shape"])
        cells = " | ".join(f"{row[key]:.1f}" for key in keys)
        print(f"| {shape} | {row['k']:,} | {row['loop_floor_us']:.1f} | {cells} |")
    print("(microseconds per call; jaxgossip cells include the loop floor)")
    result = {"machine": info, "native": status._asdict(), "torch": torch_note, "rows": rows, "choco_round_ms": choco}
    return write_result(args.json, result)


if __name__ == "__main__":
    main()
