"""Cost of one communication round of every algorithm, relative to one plain ``mix`` round.

For N in {16, 64, 256} nodes and two parameter pytrees,

(a) ResNet-20 shaped (docs/training.md, section training recipes and models; flax layout: conv kernels
(kh, kw, C_in, C_out), dense
    (64, 10), BatchNorm scale/bias and the dense bias as 1-D leaves; 272 474 parameters per node),
(b) one leaf of 1e6 parameters per node, held as a 1000 x 1000 matrix (a 1-D leaf is gossiped
    uncompressed by PowerGossip, so the matrix view is what makes its rank-1 round meaningful; for
    every other algorithm the leaf is flattened and the shape does not matter),

it times one round of: gossip, choco top-1 %, choco sign, power_gossip rank 1 (flax kernel view
for (a)), deepsqueeze sign on the ring; push_sum, sparse_push 1 % and scsp 1 % on
``one_peer_exponential(N)`` (push-sum methods run on directed graphs) and divides by the time of
one ``jaxgossip.mix`` round on the same graph and the same params.

Method: ``jit`` of ``R`` rounds inside a ``lax.fori_loop`` (the round counter and the state
carried, as in a training scan), params and state donated and fed back, ``block_until_ready``;
the first call (compile + first touch) is excluded; the time per round is the median over
repetitions divided by ``R``. Every combination is compiled first and its XLA memory estimate
(arguments + outputs + temporaries - aliased) read from ``memory_analysis``; combinations above
``--max-gb`` (default 4 GB) are skipped and listed.

A second table isolates the top-k selection (the suspected bottleneck on CPU) on the same
pytrees: ``lax.top_k`` + scatter (what ``compress.top_k`` does), ``lax.approx_max_k``, a
threshold from a full ``sort``, and a threshold found by bisection on ``|x|`` (24 vectorised
counting passes, masking instead of scattering; keeps ``>= k`` entries, exactly ``k`` without ties
at the threshold). None of these is changed in the library; the numbers are for a suggestion.

Usage::

    python experiments/bench_communication.py            # N in 16, 64, 256
    python experiments/bench_communication.py --quick    # N in 16, 64, fewer repetitions
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from _common import resnet20_shapes  # noqa: E402

import jaxgossip as jg
from jaxgossip import topology as T
from jaxgossip.algorithms import choco, deepsqueeze, gossip, power_gossip, push_sum, scsp, sparse_push

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from consensus_study import RESULTS, machine_info  # noqa: E402

GB = 1e9


# ---- parameter pytrees ----------------------------------------------------------------------------


def is_shape(x) -> bool:
    return isinstance(x, tuple) and all(isinstance(d, int) for d in x)


def param_specs(kind: str, num_nodes: int):
    if kind == "resnet20":
        shapes = resnet20_shapes()
    else:
        shapes = {"w": (1000, 1000)}
    return jax.tree_util.tree_map(
        lambda s: jax.ShapeDtypeStruct((num_nodes,) + s, jnp.float32), shapes, is_leaf=is_shape
    )


def make_params(specs, seed: int = 0):
    leaves, treedef = jax.tree_util.tree_flatten(specs)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree_util.tree_unflatten(treedef, [jax.random.normal(k, s.shape, s.dtype) for k, s in zip(keys, leaves)])


# ---- algorithms -----------------------------------------------------------------------------------


def algorithms(kind: str, ring, opexp):
    """name -> (topology kind, algorithm); the mix baseline runs on the same topology kind."""
    view = "flax_kernel" if kind == "resnet20" else "leading"
    return {
        "gossip": ("ring", gossip(ring, gamma=1.0)),
        "choco top-1%": ("ring", choco(ring, gamma=0.0375, compressor="top_k", compressor_options={"fraction": 0.01})),
        "choco sign": ("ring", choco(ring, gamma=0.45, compressor="sign")),
        "power_gossip r1": ("ring", power_gossip(ring, rank=1, gamma=1.308, matrix_view=view)),
        "deepsqueeze sign": ("ring", deepsqueeze(ring, gamma=0.01, compressor="sign")),
        "push_sum": ("opexp", push_sum(opexp)),
        "sparse_push 1%": ("opexp", sparse_push(opexp, fraction=0.01, gamma=0.01)),
        "scsp 1%": ("opexp", scsp(opexp, fraction=0.01, gamma=0.01)),
    }


class _MixAlg:
    """The baseline as a GossipAlgorithm-like triple: x <- W(t) x, state = round counter."""

    def __init__(self, topo):
        self.init = lambda x: jnp.zeros([], jnp.int32)
        self.step = lambda x, t, key: (jg.mix(topo, x, t), t + 1, None)


def loop_fn(alg, rounds: int):
    def run(x, state, key):
        def body(r, carry):
            x, state = carry
            x, state, _ = alg.step(x, state, jax.random.fold_in(key, r))
            return x, state

        return jax.lax.fori_loop(0, rounds, body, (x, state))

    return jax.jit(run, donate_argnums=(0, 1))


def memory_bytes(compiled) -> float:
    m = compiled.memory_analysis()
    if m is None:
        return float("nan")
    return float(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)


def time_alg(alg, specs, rounds: int, reps: int, max_bytes: float, slow_s: float):
    """(seconds per round or None, memory estimate bytes, note)."""
    state_spec = jax.eval_shape(alg.init, specs)
    key = jax.random.key(1)
    fn = loop_fn(alg, rounds)
    compiled = fn.lower(specs, state_spec, key).compile()
    need = memory_bytes(compiled)
    if need > max_bytes:
        return None, need, f"skipped: XLA estimate {need / GB:.1f} GB > {max_bytes / GB:.1f} GB"
    x = make_params(specs)
    state = jax.jit(alg.init)(x)
    t0 = time.perf_counter()
    x, state = jax.block_until_ready(compiled(x, state, key))  # warm-up: first touch, excluded
    first = time.perf_counter() - t0
    times = []
    n_reps = reps if first < slow_s else max(1, min(reps, 2))
    for r in range(n_reps):
        t0 = time.perf_counter()
        x, state = jax.block_until_ready(compiled(x, state, jax.random.fold_in(key, r + 1)))
        times.append(time.perf_counter() - t0)
    del x, state
    return statistics.median(times) / rounds, need, f"{n_reps} reps"


# ---- top-k alternatives ---------------------------------------------------------------------------


def _kept(size: int, fraction: float) -> int:
    return max(1, int(np.floor(fraction * size)))


def sel_top_k(flat, k):
    _, idx = jax.lax.top_k(jnp.abs(flat), k)
    return jnp.zeros_like(flat).at[idx].set(flat[idx])


def sel_approx_max_k(flat, k):
    _, idx = jax.lax.approx_max_k(jnp.abs(flat), k, recall_target=0.95)
    return jnp.zeros_like(flat).at[idx].set(flat[idx])


def sel_sort_threshold(flat, k):
    a = jnp.abs(flat)
    thr = jnp.sort(a)[a.size - k]
    return jnp.where(a >= thr, flat, 0)


def sel_bisection(flat, k, iterations: int = 24):
    a = jnp.abs(flat)

    def body(_, lohi):
        lo, hi = lohi
        mid = 0.5 * (lo + hi)
        enough = jnp.sum(a >= mid) >= k
        return jnp.where(enough, mid, lo), jnp.where(enough, hi, mid)

    lo, _ = jax.lax.fori_loop(0, iterations, body, (jnp.zeros((), a.dtype), jnp.max(a)))
    return jnp.where(a >= lo, flat, 0)


def sel_sampled_threshold(flat, k, stride: int = 16):
    """Approximate top-k: the threshold is the (k / stride)-th largest |x| of every stride-th entry.

    One lax.top_k on D / stride entries plus one masking pass; keeps ~k entries (not exactly k:
    the count must then be read from the mask for the bits). Small leaves use the exact top-k.
    """
    if k < stride or flat.size < 64 * stride:
        return sel_top_k(flat, k)
    a = jnp.abs(flat)
    thr = jax.lax.top_k(a[::stride], k // stride)[0][-1]
    return jnp.where(a >= thr, flat, 0)


SELECTORS = {
    "lax.top_k + scatter": sel_top_k,
    "lax.approx_max_k + scatter": sel_approx_max_k,
    "sort threshold + mask": sel_sort_threshold,
    "bisection threshold + mask": sel_bisection,
    "sampled threshold (1/16) + mask": sel_sampled_threshold,
}


def time_selector(selector, params, fraction: float, reps: int):
    def one_leaf(leaf):
        size = int(np.prod(leaf.shape[1:]))
        k = _kept(size, fraction)
        flat = leaf.reshape(leaf.shape[0], size)
        return jax.vmap(lambda v: selector(v, k))(flat).reshape(leaf.shape)

    fn = jax.jit(lambda p: jax.tree_util.tree_map(one_leaf, p))
    out = jax.block_until_ready(fn(params))
    kept = sum(int(jnp.sum(o != 0)) for o in jax.tree_util.tree_leaves(out))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(params))
        times.append(time.perf_counter() - t0)
    return statistics.median(times), kept


# ---- main -----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N in 16, 64 and fewer repetitions")
    parser.add_argument("--nodes", type=int, nargs="*", default=None)
    parser.add_argument("--kinds", nargs="*", default=["resnet20", "vector1e6"], choices=["resnet20", "vector1e6"])
    parser.add_argument("--rounds", type=int, default=2, help="rounds per timed call (R)")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--max-gb", type=float, default=4.0)
    parser.add_argument("--slow-s", type=float, default=8.0, help="calls slower than this get 2 repetitions")
    parser.add_argument("--tag", default=None, help="suffix of the output files (default: 'quick' with --quick)")
    parser.add_argument("--no-topk", action="store_true", help="skip the top-k alternatives table")
    parser.add_argument(
        "--only-topk", action="store_true", help="only the top-k alternatives table (mix rounds timed for the ratio)"
    )
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    nodes = args.nodes or ([16, 64] if args.quick else [16, 64, 256])
    reps = args.reps or (3 if args.quick else 5)
    max_bytes = args.max_gb * GB
    info = machine_info()
    print(info, flush=True)

    # Process warm-up: the first timed jit call of a fresh process ran ~5x slower than later ones
    # (thread pool start, first page faults); time one throw-away mix round first.
    time_alg(_MixAlg(T.ring(16)), param_specs("resnet20", 16), args.rounds, 2, max_bytes, args.slow_s)

    rows, skipped, mix_ms = [], [], {}
    for kind in args.kinds:
        for n in nodes:
            ring, opexp = T.ring(n), T.one_peer_exponential(n)
            specs = param_specs(kind, n)
            d = sum(int(np.prod(s.shape[1:])) for s in jax.tree_util.tree_leaves(specs))
            base = {}
            for tkind, topo in (("ring", ring), ("opexp", opexp)):
                sec, need, note = time_alg(_MixAlg(topo), specs, args.rounds, reps, max_bytes, args.slow_s)
                base[tkind] = sec
                mix_ms[(kind, n, tkind)] = None if sec is None else sec * 1e3
                print(f"{kind} N={n} D={d}: mix on {topo.name}: {sec * 1e3:.2f} ms/round ({note})", flush=True)
            for name, (tkind, alg) in ({} if args.only_topk else algorithms(kind, ring, opexp)).items():
                sec, need, note = time_alg(alg, specs, args.rounds, reps, max_bytes, args.slow_s)
                row = {
                    "kind": kind,
                    "N": n,
                    "D": d,
                    "algorithm": name,
                    "topology": tkind,
                    "mix_ms": None if base[tkind] is None else base[tkind] * 1e3,
                    "ms": None if sec is None else sec * 1e3,
                    "mem_GB": need / GB,
                    "note": note,
                }
                row["ratio"] = None if sec is None or base[tkind] is None else sec / base[tkind]
                rows.append(row)
                if sec is None:
                    skipped.append(f"{kind} N={n} {name}: {note}")
                    print(f"   {name:18s} {note}", flush=True)
                else:
                    print(
                        f"   {name:18s} {sec * 1e3:10.2f} ms/round  ratio {row['ratio']:7.2f}  "
                        f"(est. {need / GB:.2f} GB, {note})",
                        flush=True,
                    )

    topk_rows = []
    if not args.no_topk:
        for kind, n in (("resnet20", 16), ("resnet20", 64), ("vector1e6", 16)):
            if kind not in args.kinds:
                continue
            specs = param_specs(kind, n)
            params = make_params(specs)
            ring_ms = mix_ms.get((kind, n, "ring"))
            for name, sel in SELECTORS.items():
                sec, kept = time_selector(sel, params, 0.01, reps)
                vs = None if ring_ms is None else sec * 1e3 / ring_ms
                topk_rows.append(
                    {"kind": kind, "N": n, "selector": name, "ms": sec * 1e3, "kept_entries": kept, "vs_mix_ring": vs}
                )
                print(
                    f"top-1% selection {kind} N={n} {name:28s} {sec * 1e3:9.2f} ms  kept {kept}  "
                    f"(x{vs if vs is not None else float('nan'):.2f} of a ring mix round)",
                    flush=True,
                )
            del params

    lines = [
        "| params | N | mix ms (ring / one-peer exp) | "
        + " | ".join(algorithms("resnet20", T.ring(4), T.one_peer_exponential(4)))
        + " |"
    ]
    lines.append("|" + "---|" * (3 + 8))
    for kind in args.kinds:
        for n in nodes:
            sub = [r for r in rows if r["kind"] == kind and r["N"] == n]
            if not sub:
                continue
            ring_ms, op_ms = mix_ms[(kind, n, "ring")], mix_ms[(kind, n, "opexp")]
            cells = ["skipped (mem)" if r["ratio"] is None else f"{r['ratio']:.2f}x" for r in sub]
            lines.append(f"| {kind} | {n} | {ring_ms:.2f} / {op_ms:.2f} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    lines2 = [
        "| params | N | selector (top-1 % of every leaf, all nodes) | ms | x ring mix round | kept entries |",
        "|---|---|---|---|---|---|",
    ]
    for r in topk_rows:
        vs = "-" if r["vs_mix_ring"] is None else f"{r['vs_mix_ring']:.2f}"
        lines2.append(f"| {r['kind']} | {r['N']} | {r['selector']} | {r['ms']:.2f} | {vs} | {r['kept_entries']} |")
    table2 = "\n".join(lines2)
    if not rows:
        table = "(algorithm rounds not timed: --only-topk)"
    print("\n" + table + "\n\n" + table2)
    if skipped:
        print("skipped:\n  " + "\n  ".join(skipped))
    os.makedirs(args.out, exist_ok=True)
    suffix = f"_{args.tag}" if args.tag else ("_quick" if args.quick else "")
    with open(os.path.join(args.out, f"bench_communication{suffix}.json"), "w") as f:
        json.dump(
            {
                "machine": info,
                "settings": {"rounds_per_call": args.rounds, "reps": reps, "max_gb": args.max_gb, "nodes": nodes},
                "mix_ms": [{"kind": k, "N": n, "topology": t, "ms": v} for (k, n, t), v in mix_ms.items()],
                "rows": rows,
                "skipped": skipped,
                "topk_alternatives": topk_rows,
            },
            f,
            indent=1,
        )
    with open(os.path.join(args.out, f"bench_communication{suffix}.md"), "w") as f:
        f.write(table + "\n\n" + table2 + "\n")


if __name__ == "__main__":
    main()
