"""Mixing kernels on the node axis: ``x <- W(t) @ x`` for every leaf of a stacked pytree.

No ``[N, N]`` matrix is built except for graphs dense enough that a matmul is the fast path. The
kernel is chosen per topology (``Topology.resolved_kernel``), following measurements on XLA:CPU
(DESIGN.md principle 2 and ``experiments/bench_mixing.py``):

* ``"slots"`` (bounded degree): ``y = sum_k w[:, k] * x[nbr[:, k]]`` over the K in-neighbour slots,
  unrolled over K (the degree, not the nodes). Static circulant slots become ``jnp.roll``.
* ``"dense"`` (dense graphs): ``y = W(t) @ x`` as one matmul at full float32 precision.
* ``"segment"`` (irregular sparse graphs): gather over the edge list, weight, ``segment_sum``.

``t`` may be a Python int or a traced integer (``lax.scan`` round counter); round ``t`` uses the
graph ``t mod T``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.topology import Topology
from jaxgossip.topology_stack import TopologyStack, mix_stacked
from jaxgossip.types import Array, Params

__all__ = ["mix", "check_params", "node_mean", "consensus_distance", "num_params_per_node", "leaf_bits"]


def check_params(topology_or_n: Topology | int, x: Params, name: str = "params") -> int:
    """Checks every leaf of ``x`` is a floating array ``[N, ...]``; returns N.

    Raises:
      ValueError: a leaf has no leading axis or a leading axis other than N.
      TypeError: a leaf is not floating point (mixing would silently round it).
    """
    if isinstance(topology_or_n, (Topology, TopologyStack)):
        n = topology_or_n.num_nodes
    else:
        n = int(topology_or_n)
    leaves = jax.tree_util.tree_leaves_with_path(x)
    if not leaves:
        raise ValueError(f"{name} is an empty pytree")
    for path, leaf in leaves:
        shape = jnp.shape(leaf)
        where = jax.tree_util.keystr(path) or "<root>"
        if len(shape) == 0 or shape[0] != n:
            raise ValueError(
                f"{name} leaf {where} has shape {tuple(shape)}; every leaf needs a leading node axis of size N={n}"
            )
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
            raise TypeError(f"{name} leaf {where} has dtype {jnp.result_type(leaf)}; mixing needs floating leaves")
    return n


def _round(topology: Topology, t: Any):
    """Index of the graph used at round t: a Python int when it is static, else a traced int."""
    if topology.period == 1:
        return 0
    if isinstance(t, (int, np.integer)):
        return int(t) % topology.period
    return jnp.asarray(t, dtype=jnp.int32) % topology.period


def _table(array: np.ndarray, idx: Any, dtype=None) -> Array | np.ndarray:
    if isinstance(idx, int):
        return array[idx] if dtype is None else array[idx].astype(dtype)
    table = jnp.asarray(array if dtype is None else array.astype(dtype))
    return table[idx]


def _acc_dtype(dtype) -> Any:
    # Low-precision leaves accumulate in float32 so that mixing many neighbours does not drift.
    return jnp.promote_types(dtype, jnp.float32)


def _expand(w: Array, ndim: int) -> Array:
    return jnp.reshape(w, w.shape + (1,) * (ndim - 1))


def _circulant_shift(column: np.ndarray) -> int | None:
    """c if ``column[i] == (i + c) mod N`` for all i, else None."""
    n = column.shape[0]
    c = int(column[0])
    return c if np.array_equal(column, (np.arange(n) + c) % n) else None


def _mix_slots(topology: Topology, leaf: Array, idx: Any) -> Array:
    nbr, slot_w = topology.slots
    acc = _acc_dtype(leaf.dtype)
    x = leaf.astype(acc)
    w = _table(slot_w, idx, np.float32 if acc == jnp.float32 else None)
    out = _expand(jnp.asarray(w[:, 0], acc), x.ndim) * x  # slot 0 is the node itself
    for k in range(1, nbr.shape[2]):
        if isinstance(idx, int) and (shift := _circulant_shift(nbr[idx, :, k])) is not None:
            gathered = jnp.roll(x, -shift, axis=0)
        else:
            gathered = x[_table(nbr, idx)[:, k]]
        out = out + _expand(jnp.asarray(w[:, k], acc), x.ndim) * gathered
    return out.astype(leaf.dtype)


def _mix_dense(topology: Topology, leaf: Array, idx: Any) -> Array:
    acc = _acc_dtype(leaf.dtype)
    w = jnp.asarray(_table(topology.matrices(), idx), acc)
    flat = leaf.reshape(leaf.shape[0], -1).astype(acc)
    out = jnp.matmul(w, flat, precision=jax.lax.Precision.HIGHEST)
    return out.reshape(leaf.shape).astype(leaf.dtype)


def _mix_segment(topology: Topology, leaf: Array, idx: Any) -> Array:
    acc = _acc_dtype(leaf.dtype)
    senders = _table(topology.senders, idx)
    receivers = _table(topology.receivers, idx)
    w = jnp.asarray(_table(topology.weights, idx), acc)
    msgs = _expand(w, leaf.ndim) * leaf.astype(acc)[senders]
    out = jax.ops.segment_sum(msgs, receivers, num_segments=topology.num_nodes)
    return out.astype(leaf.dtype)


_KERNELS = {"slots": _mix_slots, "dense": _mix_dense, "segment": _mix_segment}


def mix(topology: Topology, x: Params, t: Any = 0) -> Params:
    """One round of linear mixing on the node axis: ``x_i <- sum_j W(t)_ij x_j`` for every leaf.

    .. math::  X^{t+1} = W^{(t)} X^{t}

    Works under ``jit``, ``vmap`` (e.g. over seeds), ``lax.scan`` with a traced round counter, and
    with the node axis sharded over devices (``NamedSharding``). ``topology`` may also be one member
    of a :class:`~jaxgossip.topology_stack.TopologyStack` (its tables traced, under ``vmap`` over
    the stack), so that one compile mixes over many graphs.

    Args:
      topology: the graph; ``W(t)`` is its round ``t mod T``.
      x: pytree whose leaves are floating ``[N, ...]``.
      t: round counter, Python int or traced integer scalar.

    Returns:
      A pytree like ``x`` (same shapes and dtypes).
    """
    check_params(topology, x)
    idx = _round(topology, t)
    if isinstance(topology, TopologyStack):
        return jax.tree_util.tree_map(lambda leaf: mix_stacked(topology, leaf, idx), x)
    kernel = _KERNELS[topology.resolved_kernel]
    return jax.tree_util.tree_map(lambda leaf: kernel(topology, leaf, idx), x)


def node_mean(x: Params) -> Params:
    """The average model ``x_bar = (1/N) sum_i x_i`` per leaf (leaves ``[...]``, no node axis)."""
    return jax.tree_util.tree_map(lambda leaf: jnp.mean(leaf.astype(_acc_dtype(leaf.dtype)), axis=0), x)


def consensus_distance(x: Params, target: Params | None = None) -> Array:
    """``(1/N) sum_i ||x_i - target||^2`` summed over all leaves (squared Frobenius norms).

    Args:
      x: pytree of leaves ``[N, ...]``.
      target: pytree of leaves ``[...]``; defaults to the node mean of ``x`` (consensus distance
        Xi^2 of ALGORITHMS.md section 1).
    """
    if target is None:
        target = node_mean(x)

    def per_leaf(leaf, ref):
        diff = leaf.astype(_acc_dtype(leaf.dtype)) - ref[None]
        return jnp.sum(diff * diff) / leaf.shape[0]

    return sum(jax.tree_util.tree_leaves(jax.tree_util.tree_map(per_leaf, x, target)))


def num_params_per_node(x: Params) -> int:
    """D, the flat parameter dimension of one node."""
    return int(sum(np.prod(jnp.shape(leaf)[1:], dtype=np.int64) for leaf in jax.tree_util.tree_leaves(x)))


def leaf_bits(x: Params) -> int:
    """Bits of one node's uncompressed model: ``sum over leaves of size * dtype bits``."""
    return int(
        sum(
            np.prod(jnp.shape(leaf)[1:], dtype=np.int64) * jnp.dtype(jnp.result_type(leaf)).itemsize * 8
            for leaf in jax.tree_util.tree_leaves(x)
        )
    )
