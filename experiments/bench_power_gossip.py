"""Cost of PowerGossip on CPU: one round against one ``mix`` round, and the half-step kernel.

Table 1 (round cost): a ResNet-20 shaped pytree in flax layout (conv kernels (kh, kw, C_in, F),
dense (64, 10), BatchNorm scale/bias and the dense bias as 1-D leaves; 272 474 parameters per
node) on ``ring(N)``, rank 1, gamma 1.308. Rows:

* ``mix``: one ``jaxgossip.mix`` round (the baseline);
* ``power_gossip flax_kernel``: the library path (``matrix_view="flax_kernel"``);
* ``flax_kernel via transposes``: the straightforward formulation of the same view, every >= 2-D
  leaf transposed to its PyTorch matrix (F, C_in * kh * kw) before the round and back after it,
  with ``matrix_view="leading"`` in between (same results; the cost of explicit transposes);
* ``power_gossip leading``: ``matrix_view="leading"`` on the flax layout (a different matrix,
  listed only as the transpose-free cost reference).

Method (as experiments/bench_communication.py): ``jit`` of ``R`` rounds in a ``lax.fori_loop``
(round counter and state carried), params and state donated and fed back,
``block_until_ready``, first call excluded, median over repetitions divided by ``R``.

Table 2 (half-step kernel): one right half-step of one matrix leaf, the library's slot form
(each node multiplies its matrix by its incident pairs' bases, pair products are differences of
gathered rows) against a per-edge gather of X + ``segment_sum``: XLA temporaries and time.

Usage::

    python experiments/bench_power_gossip.py            # N = 16 and 64; kernel on ring(8), torus(8, 8)
    python experiments/bench_power_gossip.py --quick    # N = 16; kernel on ring(8), two leaf shapes
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from _common import resnet20_shapes  # noqa: E402

import jaxgossip as jg
from jaxgossip import topology as tp
from jaxgossip.algorithms import oriented_pairs, pair_round, pair_tables
from jaxgossip.algorithms.power_gossip import half_step, orth, power_gossip
from jaxgossip.types import GossipAlgorithm

HIGHEST = jax.lax.Precision.HIGHEST


# ---- table 1: one round on a ResNet-20 shaped pytree ---------------------------------------------


def make_params(num_nodes: int, seed: int = 0) -> dict:
    shapes = resnet20_shapes()
    leaves, treedef = jax.tree_util.tree_flatten(shapes, is_leaf=lambda s: isinstance(s, tuple))
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree_util.tree_unflatten(
        treedef, [jax.random.normal(k, (num_nodes,) + s, jnp.float32) for k, s in zip(keys, leaves)]
    )


def _torch_axes(ndim: int) -> tuple[int, ...]:
    """Node axes (kh, kw, C_in, F) -> (F, C_in, kh, kw) (the PyTorch matrix order)."""
    return (ndim - 1, ndim - 2) + tuple(range(ndim - 2))


def via_transposes(topo, **kwargs) -> GossipAlgorithm:
    """``matrix_view="flax_kernel"`` written with explicit transposes around a "leading" round."""
    inner = power_gossip(topo, matrix_view="leading", **kwargs)

    def to_torch(leaf):
        if leaf.ndim < 3:
            return leaf
        return jnp.transpose(leaf, (0,) + tuple(1 + a for a in _torch_axes(leaf.ndim - 1)))

    def from_torch(mat, like):
        if like.ndim < 3:
            return mat
        return jnp.transpose(mat, (0,) + tuple(1 + a for a in np.argsort(_torch_axes(like.ndim - 1))))

    def init(x):
        return inner.init(jax.tree_util.tree_map(to_torch, x))

    def step(x, state, key):
        y, state, info = inner.step(jax.tree_util.tree_map(to_torch, x), state, key)
        return jax.tree_util.tree_map(from_torch, y, x), state, info

    return GossipAlgorithm(init, step, inner.debias, "power_gossip_via_transposes")


def mix_alg(topo) -> GossipAlgorithm:
    return GossipAlgorithm(
        lambda x: jnp.zeros([], jnp.int32), lambda x, t, key: (jg.mix(topo, x, t), t + 1, None), lambda x, s: x, "mix"
    )


def time_round(alg: GossipAlgorithm, num_nodes: int, rounds: int, reps: int) -> float:
    """Median seconds per round (see the module docstring)."""

    def run(x, state, key):
        def body(r, carry):
            x, state = carry
            x, state, _ = alg.step(x, state, jax.random.fold_in(key, r))
            return x, state

        return jax.lax.fori_loop(0, rounds, body, (x, state))

    x = make_params(num_nodes)
    state = jax.jit(alg.init)(x)
    key = jax.random.key(1)
    fn = jax.jit(run, donate_argnums=(0, 1))
    x, state = jax.block_until_ready(fn(x, state, key))  # compile + first touch, excluded
    times = []
    for r in range(reps):
        t0 = time.perf_counter()
        x, state = jax.block_until_ready(fn(x, state, jax.random.fold_in(key, r + 1)))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / rounds


def round_table(nodes: list[int], rounds: int, reps: int) -> None:
    print(f"## One round, ResNet-20 (flax layout), ring(N), rank 1, gamma 1.308; R = {rounds}, median of {reps}")
    print()
    print("| N | variant | I | ms / round | x mix |")
    print("|---|---|---|---|---|")
    for n in nodes:
        topo = tp.ring(n)
        mix_s = time_round(mix_alg(topo), n, rounds, reps)
        print(f"| {n} | mix | - | {mix_s * 1e3:.2f} | 1.00x |", flush=True)
        for num_iterations in (1, 2):
            opts = dict(rank=1, gamma=1.308, num_iterations=num_iterations)
            variants = [
                ("power_gossip flax_kernel", power_gossip(topo, matrix_view="flax_kernel", **opts)),
                ("flax_kernel via transposes", via_transposes(topo, **opts)),
                ("power_gossip leading", power_gossip(topo, matrix_view="leading", **opts)),
            ]
            for name, alg in variants:
                s = time_round(alg, n, rounds, reps)
                print(f"| {n} | {name} | {num_iterations} | {s * 1e3:.2f} | {s / mix_s:.2f}x |", flush=True)
    print()


# ---- table 2: one right half-step, slot form vs per-edge gather ---------------------------------


def slot_version(topo):
    host = pair_tables(topo)
    pairs = pair_round(host, 0)

    def f(x, u, v):
        del u  # a right step reads V and overwrites U with the product
        x, v_hat, product = half_step(x, v, "right", pairs)
        return x, product, v_hat

    return f, host


def gather_version(topo, host):
    a, b = jnp.asarray(host.a), jnp.asarray(host.b)
    w = jnp.asarray(oriented_pairs(topo).w_ab[0], jnp.float32)
    n = topo.num_nodes

    def f(x, u, v):
        vh = orth(v)
        d = x[b] - x[a]
        p = jnp.einsum("pmn,pnr->pmr", d, vh, precision=HIGHEST)
        delta = jnp.einsum("pmr,pnr->pmn", p, vh, precision=HIGHEST) * w[:, None, None]
        upd = jax.ops.segment_sum(delta, a, n) - jax.ops.segment_sum(delta, b, n)
        return x + upd, p, vh

    return f


def kernel_table(topologies, shapes, reps: int) -> None:
    print(f"## One right half-step of one leaf: slot form vs per-edge gather (median of {reps})")
    print()
    print("| graph | P | leaf m x n | R | X MB | slots temp MB | slots ms | gather temp MB | gather ms | max diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for topo in topologies:
        for m, nn, r in shapes:
            f_slots, host = slot_version(topo)
            f_gather = gather_version(topo, host)
            num_nodes, num_pairs = topo.num_nodes, host.a.size
            x = jax.random.normal(jax.random.key(0), (num_nodes, m, nn))
            u = jax.random.normal(jax.random.key(1), (num_pairs, m, r))
            v = jax.random.normal(jax.random.key(2), (num_pairs, nn, r))
            cells, outs = [], []
            for f in (f_slots, f_gather):
                compiled = jax.jit(f).lower(x, u, v).compile()
                mem = compiled.memory_analysis()
                out = jax.block_until_ready(compiled(x, u, v))
                times = []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    jax.block_until_ready(compiled(x, u, v))
                    times.append(time.perf_counter() - t0)
                outs.append(out)
                cells += [f"{mem.temp_size_in_bytes / 1e6:.1f}", f"{statistics.median(times) * 1e3:.1f}"]
            err = float(jnp.abs(outs[0][0] - outs[1][0]).max())
            print(
                f"| {topo.name} | {num_pairs} | {m} x {nn} | {r} | {x.nbytes / 1e6:.1f} | "
                + " | ".join(cells)
                + f" | {err:.1e} |",
                flush=True,
            )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 16 only; kernel table on ring(8), two shapes")
    parser.add_argument("--reps", type=int, default=None, help="timing repetitions (default 5, quick 5)")
    parser.add_argument("--no-kernel", action="store_true", help="skip table 2")
    args = parser.parse_args()
    reps = args.reps or 5
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, {jax.devices()[0].device_kind}")
    print()
    round_table([16] if args.quick else [16, 64], rounds=2, reps=reps)
    if not args.no_kernel:
        if args.quick:
            kernel_table([tp.ring(8)], [(64, 576, 1), (256, 2304, 1)], reps)
        else:
            kernel_table([tp.ring(8), tp.torus(8, 8)], [(64, 576, 1), (64, 576, 4), (256, 2304, 1)], reps)


if __name__ == "__main__":
    main()
