"""The top-k round with public copies (Choco-Gossip, Sparse-Push, SCSP), fused into one CPU kernel.

One round, for every leaf, node i, public-copy set ``c`` and round graph W (edges ``j -> i``):

.. math::

    q_i &= \\mathrm{TopK}_{k_i}(x_i - \\hat x_i^{(c)}) \\\\
    \\hat x_i^{(c)} &\\leftarrow \\hat x_i^{(c)} + q_i \\\\
    s_i^{(c)} &\\leftarrow s_i^{(c)} + \\textstyle\\sum_{j} W_{ij}\\, q_j
        \\quad (j = i \\text{ included iff } \\texttt{self\\_in\\_s}) \\\\
    x_i &\\leftarrow x_i + \\gamma\\, \\big(s_i^{(c)} + [\\lnot\\texttt{self\\_in\\_s}]\\, W_{ii}\\,
        \\hat x_i^{(c)} - \\hat x_i^{(c)}\\big)

Choco-Gossip is ``self_in_s=True`` with one copy set; Sparse-Push and SCSP are
``self_in_s=False`` with one set per distinct graph of the schedule (SCSP with a per-node ``k_i``).
Shapes: params leaves ``[N, ...]``, copies ``x_hat`` and sums ``s`` ``[P, N, ...]``, kept counts
``[N]`` int32 per leaf (each in ``[1, D_leaf]``), the round's edges ``[E]``.

Why: XLA:CPU runs the round as a top-k per leaf, a scatter and five elementwise passes over
``[N, D]`` that it does not fuse into one loop (15 reads and writes of the model per round); at
ResNet-20 scale that made a Choco top-1 % round 3.6-5.6x a gossip round. The C++ kernel
(``jaxgossip/compress/csrc/fused_top_k.cc``) does all leaves in one call: it selects on ``x - x_hat``
computed on the fly, updates the copies at the kept entries in place (the buffers are aliased)
and makes the dense update while the row is in cache; measured in experiments/bench_communication.py.

Exactness: the kept sets and the copies ``x_hat`` are bitwise those of ``lax.top_k``; ``s`` and
the params differ from the XLA formulation by float32 round-off (the messages are added one by
one rather than summed first). The kernel is used on the CPU only (``lax.platform_dependent``
picks the algorithm's XLA path elsewhere), for float32 leaves, on fixed (not stochastic) graphs and
off multi-device meshes; ``JAXGOSSIP_FUSED=0`` (or ``JAXGOSSIP_NATIVE=0``) turns it off.

Derivative: the kernel's round is differentiated as the XLA round with the kernel's kept entries
(``mask`` rule of :data:`jaxgossip.compress.GRADIENT_RULES`): linear in params, copies and sums given
the kept sets, with the tangents of the weights and gamma; the choice of the kept sets passes none.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.compress import compressors as compress
from jaxgossip.compress import native, selection
from jaxgossip.types import Array, Params

__all__ = [
    "CopyRound",
    "RoundEdges",
    "FusedRequest",
    "round_edges",
    "enabled",
    "fusable",
    "top_k_round",
    "spec_round",
    "on_cpu_or",
    "dispatch",
]

_TARGET = "jaxgossip_fused_top_k_f32"


class RoundEdges(NamedTuple):
    """The edges of one round's graph, ``W[receivers[e], senders[e]] = weights[e]`` (self edges included)."""

    senders: Array  # [E] int32
    receivers: Array  # [E] int32
    weights: Array  # [E] float32 (weight-0 padding edges carry nothing)


class FusedRequest(NamedTuple):
    """What an algorithm hands :func:`dispatch` so that the fused kernel can run its round
    (the arguments of :func:`spec_round` that the algorithm, not the round, fixes)."""

    spec: compress.TopKSpec  # the exact top-k compressor's K per leaf and index bits
    copy: Any = 0  # int32 scalar in [0, P), the public-copy set of the round
    self_in_s: bool = True  # s sums the node's own message too (Choco) or not (Sparse-Push)
    growth: Array | None = None  # top_k_round's growth, [L, M] float32 (None: k_i = K)
    header_bits: Any = None  # bits every message carries besides its entries (None: none)


class CopyRound(NamedTuple):
    """What one round returns."""

    params: Params  # leaves [N, ...], x after the round
    x_hat: Params  # leaves [P, N, ...] (or [N, ...]), the copies with set c updated
    s: Params  # leaves like x_hat, the received sums with set c updated
    kept: Array  # [L, N] int32, the entries each node sent per leaf (k_i; K without a budget growth)


def round_edges(topology: Any, t: Any) -> RoundEdges:
    """The edges of round ``t`` (static or traced) of a fixed graph (host or traced tables ``[T, E]``)."""
    period = topology.period
    idx = 0 if period == 1 else jnp.asarray(t, jnp.int32) % period
    return RoundEdges(
        jnp.asarray(topology.senders, jnp.int32)[idx],
        jnp.asarray(topology.receivers, jnp.int32)[idx],
        jnp.asarray(topology.weights, jnp.float32)[idx],
    )


def enabled() -> bool:
    """False when ``JAXGOSSIP_FUSED`` is ``0`` / ``false`` / ``off`` / ``no`` (the algorithms then
    run their XLA formulation on the CPU too, e.g. to compare the two)."""
    return os.environ.get("JAXGOSSIP_FUSED", "1").strip().lower() not in ("0", "false", "off", "no")


def fusable(topology: Any, *trees: Params) -> bool:
    """Trace-time check: the fused kernel can serve a round on ``topology`` with these pytrees (a
    fixed graph, not a stochastic one; all leaves float32, none on a multi-device mesh; native
    kernels available and not turned off)."""
    if topology.stochastic or not enabled() or not native.enabled():
        return False
    leaves = [leaf for tree in trees for leaf in jax.tree_util.tree_leaves(tree)]
    if not leaves or any(jnp.result_type(leaf) != jnp.float32 for leaf in leaves):
        return False
    if any(selection.on_multi_device_mesh(leaf) for leaf in leaves):
        return False
    return native.load().available


def _check(params: Params, x_hat: Params, s: Params, kept: Sequence[Any]) -> tuple[int, int]:
    leaves = jax.tree_util.tree_leaves(params)
    hat_leaves, s_leaves = jax.tree_util.tree_leaves(x_hat), jax.tree_util.tree_leaves(s)
    if not (len(leaves) == len(hat_leaves) == len(s_leaves) == len(kept)) or not leaves:
        raise ValueError(
            f"top_k_round needs one x_hat, s and kept count per params leaf; got {len(leaves)} params, "
            f"{len(hat_leaves)} x_hat, {len(s_leaves)} s leaves and {len(kept)} kept counts"
        )
    n = leaves[0].shape[0]
    lifted = hat_leaves[0].ndim == leaves[0].ndim + 1
    p = hat_leaves[0].shape[0] if lifted else 1
    for x, h, r in zip(leaves, hat_leaves, s_leaves):
        want = (p,) + x.shape if lifted else x.shape
        if x.shape[:1] != (n,) or h.shape != want or r.shape != want:
            raise ValueError(
                "top_k_round needs params [N, ...] and x_hat, s [P, N, ...] (or [N, ...] for P = 1); got "
                f"{x.shape}, {h.shape}, {r.shape}"
            )
    return n, p


def top_k_round(
    params: Params,
    x_hat: Params,
    s: Params,
    copy: Any,
    edges: RoundEdges,
    gamma: Any,
    kept: Sequence[Any],
    *,
    self_in_s: bool,
    growth: Any = None,
) -> CopyRound:
    """One fused round (module docstring) with the native CPU kernel; call it on the CPU only
    (see :func:`on_cpu_or`).

    Args:
      params: leaves ``[N, ...]`` float32.
      x_hat, s: leaves ``[P, N, ...]`` float32, or ``[N, ...]`` for one set (P = 1); donate them,
        they are updated in place.
      copy: int32 scalar in ``[0, P)``, the set this round uses.
      edges: the round's graph.
      gamma: consensus step size (scalar, traced or not).
      kept: one ``[N]`` int32 (or a static int) per leaf, in ``[1, D_leaf]``; an out-of-range value
        fails at run time with the kernel's error.
      self_in_s: whether ``s`` sums the node's own message too (Choco) or only its in-neighbours'
        (Sparse-Push).
      growth: None (``k_i`` = ``kept``) or a budget that grows with the relative residual
        ``rho_i = ||x_i - x_hat_i|| / max(||x_i||, FLT_MIN)`` of the leaf (computed in the kernel,
        float32 sums): ``[L, M]`` float32 steps, row l non-decreasing and NaN past its own length
        M_l, and node i sends ``kept + #{m : growth[l, m] <= rho_i}`` entries of leaf l (at most
        ``D_l``). SCSP's rule gives its steps with :func:`jaxgossip.algorithms.scsp.budget_steps`.
    """
    n, _ = _check(params, x_hat, s, kept)
    status = native.load()
    if not status.available:
        raise RuntimeError(f"the fused top-k round needs the native CPU kernels, unavailable: {status.reason}")
    leaves, treedef = jax.tree_util.tree_flatten(params)
    hat_leaves, s_leaves = treedef.flatten_up_to(x_hat), treedef.flatten_up_to(s)
    counts = jnp.stack([jnp.broadcast_to(jnp.asarray(k, jnp.int32), (n,)) for k in kept])  # [L, N]
    steps = jnp.zeros((len(leaves), 0), jnp.float32) if growth is None else jnp.asarray(growth, jnp.float32)
    if steps.ndim != 2 or steps.shape[0] != len(leaves):
        raise ValueError(f"top_k_round growth must be [L, M] with L = {len(leaves)} leaves, got shape {steps.shape}")
    operands = (
        jnp.asarray(copy, jnp.int32),
        jnp.asarray(edges.senders, jnp.int32),
        jnp.asarray(edges.receivers, jnp.int32),
        jnp.asarray(edges.weights, jnp.float32),
        jnp.asarray(gamma, jnp.float32),
        steps,
        counts,
        *leaves,
        *hat_leaves,
        *s_leaves,
    )
    num = len(leaves)
    out = _native_round(bool(self_in_s), num, *operands)
    unflat = lambda part: jax.tree_util.tree_unflatten(treedef, list(out[part * num : (part + 1) * num]))  # noqa: E731
    return CopyRound(unflat(0), unflat(1), unflat(2), out[3 * num])


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _native_round(self_in_s: bool, num: int, *operands: Array) -> tuple[Array, ...]:
    """The kernel call on :func:`top_k_round`'s operands ``(copy, senders, receivers, weights,
    gamma, steps, counts, *params, *x_hat, *s)``: ``(*params, *x_hat, *s, kept [L, N])``."""
    first = 7
    out_types = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in operands[first:]]
    out_types.append(jax.ShapeDtypeStruct(operands[6].shape, jnp.int32))
    call = jax.ffi.ffi_call(
        _TARGET,
        out_types,
        vmap_method="broadcast_all",
        input_output_aliases={first + i: i for i in range(3 * num)},
    )
    return tuple(call(*operands, self_in_s=self_in_s))


def _masked_round(self_in_s, copy, senders, receivers, masks, weights, gamma, leaves, hats, sums):
    """The round of the module docstring in XLA with the kept entries fixed by ``masks`` (0/1,
    like the params): linear in the copies and sums given the masks, the form whose derivative
    the fused round takes."""
    self_edge = senders == receivers
    outs = ([], [], [])
    for x, hat, s_sum, mask in zip(leaves, hats, sums, masks):
        n = x.shape[0]
        lifted = hat.ndim == x.ndim + 1
        xh, sc = (hat[copy], s_sum[copy]) if lifted else (hat, s_sum)
        q = mask * (x - xh)
        xh_new = xh + q
        w_msg = weights if self_in_s else jnp.where(self_edge, 0, weights)
        flat = q.reshape(n, -1)
        received = jax.ops.segment_sum(w_msg[:, None] * flat[senders], receivers, n).reshape(x.shape)
        s_new = sc + received
        drift = s_new - xh_new
        if not self_in_s:
            w_self = jax.ops.segment_sum(jnp.where(self_edge, weights, 0), receivers, n)
            drift = drift + w_self.reshape((n,) + (1,) * (x.ndim - 1)) * xh_new
        outs[0].append(x + gamma * drift)
        outs[1].append(hat.at[copy].set(xh_new) if lifted else xh_new)
        outs[2].append(s_sum.at[copy].set(s_new) if lifted else s_new)
    return tuple(outs[0] + outs[1] + outs[2])


@_native_round.defjvp
def _native_round_jvp(self_in_s, num, primals, tangents):
    """The fused round's derivative: that of the XLA round with the kernel's kept entries (the top-k
    masks pass tangents, the choice of indices none, as :func:`jaxgossip.compress.selection.top_k_dense`)."""
    out = _native_round(self_in_s, num, *primals)
    copy, senders, receivers, weights, gamma, _, _ = primals[:7]
    leaves, hats, sums = (list(primals[7 + i * num : 7 + (i + 1) * num]) for i in range(3))
    masks = []
    for x, hat, kept in zip(leaves, hats, out[3 * num]):
        xh = hat[copy] if hat.ndim == x.ndim + 1 else hat
        diff = (x - xh).reshape(x.shape[0], -1)
        masks.append(selection.kept_mask(diff, kept).reshape(x.shape))

    def round_of(weights, gamma, leaves, hats, sums):
        return _masked_round(self_in_s, copy, senders, receivers, masks, weights, gamma, leaves, hats, sums)

    dw, dg = tangents[3], tangents[4]
    dl, dh, ds = (list(tangents[7 + i * num : 7 + (i + 1) * num]) for i in range(3))
    _, d_out = jax.jvp(round_of, (weights, gamma, leaves, hats, sums), (dw, dg, dl, dh, ds))
    return out, (*d_out, np.zeros(out[3 * num].shape, jax.dtypes.float0))


def spec_round(
    params: Params,
    x_hat: Params,
    s: Params,
    copy: Any,
    topology: Any,
    t: Any,
    gamma: Any,
    spec: compress.TopKSpec,
    *,
    self_in_s: bool,
    growth: Array | None = None,
) -> tuple[CopyRound, Array]:
    """:func:`top_k_round` on round ``t`` of the fixed graph ``topology`` with the budget of an exact
    top-k compressor (K per leaf from ``spec``; ``growth`` as there).

    Returns the round and the payload bits ``[N]`` float32 of one node's message: the sum over
    leaves of ``k_i (value bits + index bits)``, leaf by leaf (as :func:`jaxgossip.compress.compress_tree`).
    """
    leaves = jax.tree_util.tree_leaves(params)
    sizes = [leaf[0].size for leaf in leaves]
    out = top_k_round(
        params,
        x_hat,
        s,
        copy,
        round_edges(topology, t),
        gamma,
        [spec.kept(d) for d in sizes],
        self_in_s=self_in_s,
        growth=growth,
    )
    payload = None
    for counts, d, leaf in zip(out.kept, sizes, leaves):
        term = counts.astype(jnp.float32) * (compress.value_bits(leaf) + compress.bits_per_index(spec.index_bits, d))
        payload = term if payload is None else payload + term
    return out, payload


def dispatch(
    topology: Any,
    params: Params,
    x_hat: Params,
    s: Params,
    t: Any,
    gamma: Any,
    request: FusedRequest | None,
    xla_round: Callable[[], Any],
    finish: Callable[[Params, Params, Params, Array], Any],
) -> Any:
    """One round of a top-k algorithm with public copies: the one place that chooses between the
    fused native kernel and the algorithm's XLA formulation.

    The fused kernel serves the round when the algorithm hands a ``request`` (its compressor is an
    exact top-k) and :func:`fusable` holds (a fixed graph, float32 leaves off multi-device meshes,
    native kernels available and not turned off); then a CPU program runs :func:`spec_round` and
    every other platform ``xla_round`` (:func:`on_cpu_or`). Otherwise ``xla_round()`` is the round.

    Args:
      topology: the algorithm's graph (a stochastic one always takes ``xla_round``; the fused round
        uses a fixed graph's edges of round ``t``).
      params, x_hat, s: the round's inputs (leaves ``[N, ...]``; ``[P, N, ...]``).
      t: round counter; gamma: consensus step size.
      request: what the kernel needs (:class:`FusedRequest`), or None for an XLA-only round.
      xla_round: ``() -> (params, state, message_bits)``, the algorithm's round in XLA; ``state``
        has the fields ``x_hat`` and ``s`` (the parts the fused round also produces).
      finish: ``(params, x_hat, s, message_bits) -> R``, the algorithm's result from those parts.

    Returns:
      ``xla_round()``, or ``finish`` of either formulation's parts (message bits: the kernel's
      payload plus ``request.header_bits``).
    """
    if request is None or not fusable(topology, params, x_hat, s):
        return xla_round()

    def native():
        out, payload = spec_round(
            params,
            x_hat,
            s,
            request.copy,
            topology,
            t,
            gamma,
            request.spec,
            self_in_s=request.self_in_s,
            growth=request.growth,
        )
        bits = payload if request.header_bits is None else payload + request.header_bits
        return out.params, out.x_hat, out.s, bits

    def xla():
        new_params, state, bits = xla_round()
        return new_params, state.x_hat, state.s, bits

    return finish(*on_cpu_or(native, xla))


def on_cpu_or(fused: Callable[[], Any], fallback: Callable[[], Any]) -> Any:
    """``fused()`` in a program compiled for the CPU, ``fallback()`` on every other platform (both
    are traced; their results must have the same structure)."""
    return jax.lax.platform_dependent(cpu=fused, default=fallback)
