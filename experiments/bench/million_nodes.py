"""Graphs of up to millions of nodes: build time per family, and one gossip round of jaxgossip
against scipy's CSR product ``W @ x`` and a plain copy of x, side by side in one run.

For every family and N (powers of two, ``--log2-sizes``) the script builds the graph with
``topology.make`` (wall time, edges E, slot width K, kernel), then for every D in ``--dims`` times,
on x of shape [N, D] float32:

* ``jaxgossip``: ``--rounds`` rounds of ``jaxgossip.mix`` in one jitted ``lax.fori_loop`` (round t
  uses W(t mod T); a stochastic graph draws each round from the key), divided by the rounds;
* ``scipy``: ``W(0) @ x`` with W(0) as a float32 ``scipy.sparse.csr_matrix`` (a stochastic graph:
  its round 0 drawn once);
* ``copy``: ``np.copyto`` of x (one read and one write of N D 4 bytes), which gives the measured
  bandwidth; the *floor* of a round is its bytes, ``E D 4`` read (one value per edge, self-loops
  included: ``(K + 1) N D 4`` on a K-regular graph) and ``N D 4`` written, at that bandwidth.

A round inside a compiled loop is what every run does (the round driver's ``lax.scan``), and there
it costs one copy more than the floor: the round's output reads other nodes' rows of x, so XLA
computes it into a new buffer and copies that into the loop's carried x (the ``copy`` at the root
of the while body in the compiled HLO), one more read and write of ``N D 4`` bytes. ``loop_floor_s``
adds that copy to the floor. A round jitted on its own has no such copy but allocates its output on
every call, which at large ``N D`` costs more than the copy (first touch of fresh pages), so the
in-loop round is not compared with a standalone one here. Unrolling the loop does not remove the
copy on XLA:CPU: consecutive rounds fuse into one kernel that recomputes the earlier round for
every neighbour it reads, which is slower.

Timings are medians of ``--reps`` calls after one warm-up. They mean something only on a quiet
machine: nothing else running, the same machine for every column.

    python experiments/bench/million_nodes.py --out experiments/bench/million_nodes.json
    python experiments/bench/million_nodes.py --log2-sizes 6,8 --dims 1,4 --rounds 2 --reps 1  # smoke
    python experiments/bench/million_nodes.py --log2-sizes 22 --rounds 5 --merge --out experiments/bench/million_nodes.json
    python experiments/bench/million_nodes.py --builds-only --log2-sizes 24 --out builds.json  # peak RSS
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse

import jaxgossip as jg
from jaxgossip import topology

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _benchlib import header_line, machine_info, median_seconds  # noqa: E402

FAMILIES = (
    "ring",
    "directed_ring",
    "torus",
    "hypercube",
    "exponential",
    "one_peer_exponential",
    "star",
    "chain",
    "binary_tree",
    "base:1",
    "base:3",
    "d_equistatic",
    "u_equistatic",
    "ring+drop:0.1",
    "torus+drop:0.1+nodedrop:0.05",
    "random_matching",
    "random_matching:feistel",
    "random_out:2",
)
POWER_OF_TWO_ONLY = ("hypercube",)


def build(spec: str, n: int) -> tuple[topology.Topology, float]:
    start = time.perf_counter()
    graph = topology.make(spec, n)
    return graph, time.perf_counter() - start


def round_zero(graph, key) -> topology.Topology:
    """The graph of round 0: the graph itself, or a stochastic graph's draw."""
    return graph.draw(key, 0).graph if graph.stochastic else graph


def csr_of(graph) -> scipy.sparse.csr_matrix:
    """W(0) as a float32 CSR matrix, from the round's edge list (no dense matrix)."""
    s, r, w = (np.asarray(a)[0] for a in (graph.senders, graph.receivers, graph.weights))
    live = w != 0
    n = graph.num_nodes
    return scipy.sparse.csr_matrix((w[live].astype(np.float32), (r[live], s[live])), shape=(n, n))


def round_loop(graph, rounds: int, key):
    """``x -> x`` after ``rounds`` gossip rounds in one ``lax.fori_loop``: round t mixes with
    W(t mod T), a stochastic graph's round t drawn from ``fold_in(key, t)``."""

    def run(x):
        def body(t, x):
            return jg.mix(graph.draw(jax.random.fold_in(key, t), t).graph, x, t)

        return jax.lax.fori_loop(0, rounds, body, x)

    return run


def jaxgossip_round(graph, x, rounds: int, key, reps: int) -> float:
    fn = jax.jit(round_loop(graph, rounds, key))
    jax.block_until_ready(fn(x))
    return median_seconds(lambda: fn(x), reps) / rounds


# Slot width K of a family at N (self included) and its period T, for the memory estimates of
# the accelerator section (a family not listed: K = 3, T = 1).
def _width_period(spec: str, n: int) -> tuple[int, int]:
    log2 = max(1, (n - 1).bit_length())
    return {
        "exponential": (log2 + 1, 1),
        "hypercube": (log2 + 1, 1),
        "one_peer_exponential": (2, log2),
        "random_matching": (2, 1),
    }.get(spec, (3, 1))


# Host bytes per edge of a build at its peak, measured on the CPU (tracemalloc and peak RSS,
# N = 2^20 .. 2^24: 28 to 40 bytes per edge across the fixed families); taken with a margin.
HOST_BYTES_PER_EDGE = 120


def device_rows(
    families, log2_sizes, dim: int, rounds: int, timed, deadline: float, device_bytes: float | None, host_bytes: float
) -> list[dict]:
    """The accelerator section of ``experiments/bench/gpu_suite.py``: for every family and N, the
    build (host) and ``rounds`` rounds of :func:`round_loop` on x ``[N, dim]`` float32 on the
    default device, next to a copy-like loop ``x * (1 + 1e-7 t)`` (one read, one write).

    A size is skipped (a row with ``skipped``) when its estimated memory exceeds half of
    ``device_bytes`` (four copies of x and the slot table in float32 and int32) or of ``host_bytes``
    (:data:`HOST_BYTES_PER_EDGE`), or when the time of the previous size of the family, times the
    growth of E, would pass ``deadline`` (``time.perf_counter`` seconds).

    Args:
      timed: ``timed(fn, args)`` compiles and times ``jax.jit(fn)`` on ``args`` (the suite's
        timer), returning an object with ``compile_s`` and ``median_s``.
    """
    rows = []
    key = jax.random.key(0)
    for spec in families:
        last = None  # (seconds, edges) of the previous size of this family
        for log2 in log2_sizes:
            n = 2**log2
            k, period = _width_period(spec, n)
            edges = n * k * period
            need_device = 4 * n * dim * 4 + 8 * n * k * period
            row = {"family": spec, "log2_nodes": log2, "num_nodes": n, "dim": dim}
            reason = None
            if device_bytes is not None and need_device > device_bytes / 2:
                reason = f"needs ~{need_device / 2**30:.1f} GiB of device memory, half of the free memory is less"
            elif edges * HOST_BYTES_PER_EDGE > host_bytes / 2:
                reason = f"needs ~{edges * HOST_BYTES_PER_EDGE / 2**30:.1f} GiB of host memory to build"
            elif last is not None and time.perf_counter() + last[0] * edges / last[1] > deadline:
                reason = "would pass the time budget"
            elif time.perf_counter() > deadline:
                reason = "time budget spent"
            if reason is not None:
                rows.append(dict(row, skipped=reason))
                continue
            start = time.perf_counter()
            graph, build_s = build(spec, n)
            x = jax.random.normal(jax.random.key(1), (n, dim), jnp.float32)
            mix = timed(round_loop(graph, rounds, key), (x,))
            copy = timed(
                lambda x: jax.lax.fori_loop(0, rounds, lambda t, x: x * (1.0 + 1e-7 * t.astype(x.dtype)), x), (x,)
            )
            mix_s, copy_s = mix.median_s / rounds, copy.median_s / rounds
            bandwidth = 2 * n * dim * 4 / copy_s
            e = graph.num_edges
            floor_s = (e * dim * 4 + n * dim * 4) / bandwidth
            row.update(
                edges=e,
                period=graph.period,
                kernel=graph.resolved_kernel,
                build_s=build_s,
                compile_s=mix.compile_s,
                ms_per_round=mix_s * 1e3,
                copy_ms=copy_s * 1e3,
                floor_ms=floor_s * 1e3,
                times_floor=mix_s / floor_s,
            )
            rows.append(dict(row, rounds=rounds))
            last = (time.perf_counter() - start, edges)
            del graph, x
    return rows


def measure(spec: str, n: int, dims: list[int], rounds: int, reps: int) -> dict:
    graph, build_s = build(spec, n)
    key = jax.random.key(0)
    first = round_zero(graph, key)
    matrix = csr_of(first)
    in_degree = int(np.diff(matrix.indptr).max())  # self-loop included
    row = {
        "family": spec,
        "num_nodes": n,
        "build_s": build_s,
        "edges": int(matrix.nnz),
        "period": graph.period,
        "kernel": graph.resolved_kernel,
        "max_in_degree": in_degree,
        "dims": {},
    }
    rng = np.random.default_rng(0)
    for d in dims:
        x_host = rng.standard_normal((n, d), dtype=np.float32)
        x = jnp.asarray(x_host)
        out = np.empty_like(x_host)
        copy_s = median_seconds(lambda: np.copyto(out, x_host), reps)
        scipy_s = median_seconds(lambda: matrix @ x_host, reps)
        ours_s = jaxgossip_round(graph, x, rounds, key, reps)
        bandwidth = 2 * x_host.nbytes / copy_s
        floor_s = (matrix.nnz * d * 4 + x_host.nbytes) / bandwidth
        row["dims"][str(d)] = {
            "jaxgossip_round_s": ours_s,
            "scipy_round_s": scipy_s,
            "copy_s": copy_s,
            "floor_s": floor_s,
            "loop_floor_s": floor_s + copy_s,
            "speedup_vs_scipy": scipy_s / ours_s,
            "times_floor": ours_s / floor_s,
            "times_loop_floor": ours_s / (floor_s + copy_s),
        }
    return row


def build_only(spec: str, n: int) -> dict:
    """One build in this process: wall seconds, live edges E, and the process's peak resident memory
    (``ru_maxrss``, so run each build in a fresh process: :func:`build_rows`)."""
    import resource

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    graph, build_s = build(spec, n)
    edges = int(sum(np.count_nonzero(w) for w in graph.weights)) if not graph.stochastic else 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "family": spec,
        "num_nodes": n,
        "build_s": build_s,
        "edges": edges,
        "peak_rss_bytes": peak,
        "peak_rss_before_bytes": base,
        "bytes_per_edge": (peak - base) / edges if edges else None,
    }


def build_rows(families, log2_sizes) -> list[dict]:
    """:func:`build_only` of every family and size, each in a fresh Python process."""
    import subprocess

    rows = []
    for spec in families:
        for log2 in log2_sizes:
            done = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--build-one", f"{spec}@{log2}"],
                capture_output=True,
                text=True,
            )
            if done.returncode:
                tail = (done.stderr.strip().splitlines() or ["killed"])[-1]
                rows.append({"family": spec, "num_nodes": 2**log2, "failed": tail})
                print(f"{spec:28s} N=2^{log2}: failed ({tail})", flush=True)
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(
                f"{spec:28s} N=2^{log2} E={row['edges']} build {row['build_s']:.2f} s, "
                f"peak RSS {row['peak_rss_bytes'] / 2**30:.2f} GiB",
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log2-sizes", default="10,12,14,16,18,20,22", help="comma-separated log2 N")
    parser.add_argument("--dims", default="1,4,64", help="comma-separated D")
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated topology specs")
    parser.add_argument("--rounds", type=int, default=50, help="gossip rounds per timed call")
    parser.add_argument("--reps", type=int, default=5, help="timed calls per measurement (median)")
    parser.add_argument("--max-gib", type=float, default=16.0, help="skip N D combinations whose x exceeds this")
    parser.add_argument("--out", help="write the rows to this JSON file")
    parser.add_argument(
        "--merge", action="store_true", help="keep the rows of --out for other (family, N) pairs (each row says its options)"
    )
    parser.add_argument("--builds-only", action="store_true", help="only builds, each in a fresh process (peak RSS)")
    parser.add_argument("--build-one", help=argparse.SUPPRESS)  # "spec@log2": one build_only row as JSON
    args = parser.parse_args()
    if args.build_one:
        spec, log2 = args.build_one.rsplit("@", 1)
        print(json.dumps(build_only(spec, 2 ** int(log2))))
        return
    if args.builds_only:
        rows = build_rows(args.families.split(","), [int(v) for v in args.log2_sizes.split(",")])
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"machine": machine_info(), "rows": rows}, f, indent=1)
        return
    info = machine_info()
    print(header_line(info), flush=True)
    dims = [int(d) for d in args.dims.split(",")]
    rows = []
    for spec in args.families.split(","):
        for log2 in (int(v) for v in args.log2_sizes.split(",")):
            n = 2**log2
            usable = [d for d in dims if n * d * 4 * 4 <= args.max_gib * 2**30]
            try:
                row = measure(spec, n, usable, args.rounds, args.reps)
            except (ValueError, MemoryError) as err:
                print(f"{spec:28s} N=2^{log2}: skipped ({err})", flush=True)
                continue
            rows.append(dict(row, rounds=args.rounds, reps=args.reps, date=info["date"]))
            cells = "  ".join(
                f"D={d}: {v['jaxgossip_round_s'] * 1e3:.2f} ms vs scipy {v['scipy_round_s'] * 1e3:.2f} ms, "
                f"{v['times_floor']:.1f}x floor"
                for d, v in row["dims"].items()
            )
            print(f"{spec:28s} N=2^{log2} E={row['edges']} build {row['build_s']:.2f} s  {cells}", flush=True)
    if args.out:
        if args.merge and os.path.exists(args.out):
            with open(args.out) as f:
                kept = json.load(f)["rows"]
            ours = {(r["family"], r["num_nodes"]) for r in rows}
            rows = [r for r in kept if (r["family"], r["num_nodes"]) not in ours] + rows
            rows.sort(key=lambda r: (FAMILIES.index(r["family"]) if r["family"] in FAMILIES else len(FAMILIES), r["num_nodes"]))
        with open(args.out, "w") as f:
            json.dump({"machine": info, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
