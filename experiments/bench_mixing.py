"""Bandwidth benchmark of ``jaxgossip.mix`` against a plain device copy of the same bytes.

For each topology (ring, torus, exponential, one-peer exponential with a traced round counter) and
size (N nodes x D float32 parameters per node) it times jitted mixing rounds, warm-up (compile)
excluded, as the median of several repetitions with ``block_until_ready``, and next to it, in the
same run, a jitted ``x * s`` with a traced scalar ``s`` (XLA cannot elide it: it reads and writes
N*D floats). A second table runs the three kernels (slots / dense / segment) side by side, a third compares
slots and dense on complete graphs (where ``"auto"`` switches from slots to dense).

Two modes. ``--mode loop`` (default) runs R rounds inside one jit (``lax.fori_loop`` with the round
counter traced, as in a training ``lax.scan``) and reports the time per round: buffers are reused,
so this is the steady-state bandwidth of the hot path. ``--mode call`` times one jitted call per
round; every call then allocates a fresh [N, D] output, and on this CPU the first-touch page
faults of that allocation dominate a copy (high system time), which flatters every ratio.

Bytes counted (the traffic of a gather-based round; the same nominal count for every kernel so
that their GB/s compare directly):

    mix:   (K + 1) * N * D * 4   K in-neighbour slots read (self included), one output written
    copy:      2   * N * D * 4   one read, one write

``ratio = GB/s(mix) / GB/s(copy)``: 1.0 means the round moves its K + 1 streams as fast as a copy
moves its 2. This is the measurement behind the kernel choice per topology (jaxgossip/topology/layout.py).

Usage::

    python experiments/bench_mixing.py           # full grid (N in 16/256/1024, D in 1e4/1e5/1e6)
    python experiments/bench_mixing.py --quick   # a fast subset
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from _common import cpu_model  # noqa: E402

import jaxgossip as jg
from jaxgossip import topology as T

BYTES = 4  # float32
MAX_ARRAY_BYTES = 2 * 1024**3  # skip [N, D] float32 arrays above ~2 GB (mix needs ~3x that in RAM)


def time_fn(fn, args_for_rep, reps: int) -> float:
    """Median seconds of ``fn(*args_for_rep(i))`` over ``reps`` calls after one warm-up call."""
    jax.block_until_ready(fn(*args_for_rep(0)))  # compile + first run, excluded
    times = []
    for i in range(reps):
        args = args_for_rep(i + 1)
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def make_x(n: int, d: int) -> jax.Array:
    return jax.jit(lambda key: jax.random.normal(key, (n, d), jnp.float32))(jax.random.key(0))


def rounds_for(size_bytes: int, mode: str) -> int:
    """Rounds per timed call: 1 in call mode, else enough to amortise the call (fewer when big)."""
    return 1 if mode == "call" else int(max(2, min(10, 5e8 // max(size_bytes, 1))))


def bench_round(round_fn, x: jax.Array, reps: int, mode: str) -> float:
    """Median seconds of one ``x <- round_fn(x, t)`` (t a traced int32 round counter)."""
    rounds = rounds_for(x.size * BYTES, mode)
    if mode == "call":
        fn = jax.jit(round_fn)
    else:
        fn = jax.jit(lambda x, t0: jax.lax.fori_loop(0, rounds, lambda i, x: round_fn(x, t0 + i), x))
    ts = [jnp.int32(i * rounds) for i in range(reps + 1)]
    return time_fn(fn, lambda i: (x, ts[i]), reps) / rounds


def bench_copy(x: jax.Array, reps: int, mode: str) -> float:
    # x * s with s = 1 + 1e-7 * t: traced, so nothing can be elided or folded across rounds
    return bench_round(lambda x, t: x * (1.0 + 1e-7 * t.astype(jnp.float32)), x, reps, mode)


def bench_mix(topo: T.Topology, x: jax.Array, reps: int, mode: str) -> float:
    # traced round counter, as inside a lax.scan (a static topology ignores it)
    return bench_round(lambda x, t: jg.mix(topo, x, t), x, reps, mode)


def _roll_ring(x: jax.Array, t) -> jax.Array:
    """Hand-written ring round with shifts instead of gathers (reference for the slot kernel)."""
    del t
    return (x + jnp.roll(x, 1, axis=0) + jnp.roll(x, -1, axis=0)) * jnp.float32(1 / 3)


def topologies(n: int) -> list[T.Topology]:
    side = int(round(np.sqrt(n)))
    rows, cols = (side, n // side) if side * (n // side) == n else (2, n // 2)
    return [T.ring(n), T.torus(rows, cols), T.exponential(n), T.one_peer_exponential(n)]


def row(label, kernel, n, d, k, t_mix, t_copy):
    size = n * d * BYTES
    gbs_mix = (k + 1) * size / t_mix / 1e9
    gbs_copy = 2 * size / t_copy / 1e9
    return (
        f"| {label:<34} | {kernel:<7} | {n:>5} | {d:>8.0e} | {k:>2} | {t_mix * 1e3:>9.2f} | {gbs_mix:>8.2f} "
        f"| {t_copy * 1e3:>9.2f} | {gbs_copy:>7.2f} | {gbs_mix / gbs_copy:>5.2f} |"
    )


HEADER = (
    "| topology                           | kernel  |     N |        D |  K |    mix ms | mix GB/s "
    "|   copy ms | cp GB/s | ratio |\n"
    "|------------------------------------|---------|-------|----------|----|-----------|----------"
    "|-----------|---------|-------|"
)


def reps_for(size_bytes: int, base: int) -> int:
    return base if size_bytes < 200e6 else max(3, base // 2)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="N in {16, 256}, D in {1e4, 1e5}, fewer reps")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions per entry (median)")
    parser.add_argument(
        "--mode", choices=("loop", "call"), default="loop", help="rounds inside one jit, or one call per round"
    )
    args = parser.parse_args(argv)

    sizes_n = (16, 256) if args.quick else (16, 256, 1024)
    sizes_d = (10_000, 100_000) if args.quick else (10_000, 100_000, 1_000_000)
    base_reps = args.reps or (3 if args.quick else 5)

    print(f"# bench_mixing  {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(
        f"# machine: nproc={os.cpu_count()}, CPU: {cpu_model()}; JAX {jax.__version__}, "
        f"backend {jax.default_backend()}, devices {jax.devices()}"
    )
    print("# bytes: mix (K+1)*N*D*4 (K slot reads incl. self + 1 write); copy 2*N*D*4 (x * s, traced s)")
    how = "R rounds per jitted fori_loop, time per round" if args.mode == "loop" else "one jitted call per round"
    print(f"# mode {args.mode}: {how}; median of reps after one warm-up (compile) call; ratio = GB/s(mix) / GB/s(copy)")
    print(f"# load average at start: {os.getloadavg()} (the machine may be shared)\n")

    print("## mix vs copy, default kernel per topology (one_peer_exponential with a traced t)\n")
    print(HEADER)
    skipped = []
    for n in sizes_n:
        for d in sizes_d:
            size = n * d * BYTES
            if size > MAX_ARRAY_BYTES:
                limit = MAX_ARRAY_BYTES / 1e9
                skipped.append(f"N={n}, D={d:.0e}: [N, D] float32 = {size / 1e9:.1f} GB > {limit:.1f} GB")
                continue
            reps = reps_for(size, base_reps)
            x = make_x(n, d)
            t_copy = bench_copy(x, reps, args.mode)
            for topo in topologies(n):
                t_mix = bench_mix(topo, x, reps, args.mode)
                print(row(topo.name, topo.resolved_kernel, n, d, topo.max_slots, t_mix, t_copy), flush=True)
            del x
    for line in skipped:
        print(f"skipped {line}")

    n, d = 256, 100_000
    print(f"\n## kernels side by side, N={n}, D={d:.0e}\n")
    print(HEADER)
    x = make_x(n, d)
    reps = reps_for(n * d * BYTES, base_reps)
    t_copy = bench_copy(x, reps, args.mode)
    for base in (T.ring(n), T.exponential(n)):
        for kernel in ("slots", "dense", "segment"):
            topo = dataclasses.replace(base, kernel=kernel)
            t_mix = bench_mix(topo, x, reps, args.mode)
            print(row(base.name, kernel, n, d, base.max_slots, t_mix, t_copy), flush=True)
    t_roll = bench_round(_roll_ring, x, reps, args.mode)
    print(row(f"ring({n}) hand-written roll", "roll", n, d, 3, t_roll, t_copy), flush=True)
    # one-peer exponential: a traced round gathers; a static round is a pure shift (jnp.roll)
    one_peer = T.one_peer_exponential(n)
    t_traced = bench_mix(one_peer, x, reps, args.mode)
    t_static = bench_round(lambda x, t: jg.mix(one_peer, x, 1), x, reps, args.mode)
    print(row(f"{one_peer.name} traced t", "slots", n, d, 2, t_traced, t_copy), flush=True)
    print(row(f"{one_peer.name} static t", "slots", n, d, 2, t_static, t_copy), flush=True)
    del x

    # Dense graphs: "auto" picks slots up to K = 16 in-neighbour slots, dense above (mixing.choose_kernel).
    d = 100_000
    auto = ", ".join(f"N={m}: {T.complete(m).resolved_kernel}" for m in (8, 16, 32, 64))
    print(f"\n## complete graphs, slots vs dense, D={d:.0e} (auto picks {auto})\n")
    print(HEADER)
    for n in (8, 16, 32) if args.quick else (8, 16, 32, 64):
        x = make_x(n, d)
        t_copy = bench_copy(x, base_reps, args.mode)
        for kernel in ("slots", "dense"):
            topo = dataclasses.replace(T.complete(n), kernel=kernel)
            t_mix = bench_mix(topo, x, base_reps, args.mode)
            print(row(topo.name, kernel, n, d, n, t_mix, t_copy), flush=True)
        del x


if __name__ == "__main__":
    main()
