"""Mixing kernels on the node axis: ``x <- W(t) @ x`` for every leaf of a stacked pytree.

A :class:`~jaxgossip.topology.Topology` keeps its tables in one of three layouts, and ``mix`` has
one kernel per layout. Each kernel serves a single graph with NumPy tables (constants of the
compiled program), a member of a graph stack under ``vmap`` (traced tables) and a traced round
counter alike. The layout is chosen per graph from measurements on XLA:CPU (``experiments/bench_mixing.py``,
:mod:`jaxgossip.topology.layout`):

* ``"slots"`` (bounded degree): ``y = sum_k w[:, k] * x[nbr[:, k]]`` over the K in-neighbour slots
  ``[T, N, K]``, unrolled over K (the degree, not the nodes), in :mod:`jaxgossip.ops.slots`
  (slot columns that are shifts, group rotations or bit flips move x without a gather).
* ``"dense"`` (dense graphs): ``y = W(t) @ x`` as one matmul at full float32 precision.
* ``"segment"`` (irregular sparse graphs): gather over the edge list ``[T, E]``, weight,
  ``segment_sum``. A round of static tables with a few rows of more than 16 in-neighbours and
  bounded rows elsewhere (a star) mixes by :func:`jaxgossip.topology.layout.hub_split` instead:
  one reduction per hub plus the slot kernel for the other rows, no scatter.

Placement: when a leaf's node axis lives on a mesh axis named ``"nodes"`` (see
:mod:`jaxgossip.ops.sharding`) and the graph is circulant with static slot tables, ``mix`` runs the
slot kernel as ``shard_map`` + ``lax.ppermute`` of contiguous row slices instead of leaving the
gathers to XLA's partitioner (``experiments/bench/ppermute.py``: 1.6-38x per round for the
one-peer exponential graph with a traced round, the same speed for static rounds).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec

from jaxgossip.ops.slots import acc_dtype, mix_slots, per_node, round_table, traced_plan
from jaxgossip.topology import Topology, TopologyKey
from jaxgossip.topology.coins import buffered
from jaxgossip.topology.layout import hub_split
from jaxgossip.topology.moves import circulant_shift, circulant_shifts
from jaxgossip.types import Array, Params

__all__ = [
    "mix",
    "mix_on_mesh",
    "check_params",
    "node_mean",
    "consensus_distance",
    "num_params_per_node",
    "per_node",
    "where_nodes",
    "leaf_bits",
    "NODE_AXIS",
]

# The mesh axis that carries the node axis (jaxgossip.ops.sharding.node_mesh builds it).
NODE_AXIS = "nodes"


@functools.lru_cache(maxsize=64)
def _cached_hubs(graph: TopologyKey, idx: int):
    """Round ``idx`` of a host graph as :func:`hub_split`, or None, cached per graph value."""
    topology = graph.topology
    return hub_split(topology.senders[idx], topology.receivers[idx], topology.weights[idx], topology.num_nodes)


@functools.lru_cache(maxsize=256)
def _cached_shifts(graph: TopologyKey):
    """``circulant_shifts`` or None for a non-circulant graph, cached per graph value (equal
    tables, one entry)."""
    try:
        return circulant_shifts(graph.topology)
    except ValueError:
        return None


# ---- validation and helpers ------------------------------------------------------------------------


def check_params(topology_or_n: Topology | int, x: Params, name: str = "params") -> int:
    """Checks every leaf of ``x`` is a floating array ``[N, ...]``; returns N.

    Raises:
      ValueError: a leaf has no leading axis or a leading axis other than N.
      TypeError: a leaf is not floating point (mixing would silently round it).
    """
    n = int(topology_or_n) if isinstance(topology_or_n, (int, np.integer)) else topology_or_n.num_nodes
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


def _round(period: int, t: Any):
    """Index of the graph used at round t: a Python int when it is static, else a traced int."""
    if period == 1:
        return 0
    if isinstance(t, (int, np.integer)):
        return int(t) % period
    return jnp.asarray(t, dtype=jnp.int32) % period


def where_nodes(mask: Array, new: Any, old: Any) -> Any:
    """``new`` for the nodes where ``mask`` ``[N]`` is true, ``old`` for the others (pytrees of
    leaves ``[N, ...]``), e.g. the online nodes' update and the offline nodes' unchanged state."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(per_node(mask, a), a, b), new, old)


# ---- one kernel per layout -------------------------------------------------------------------------


def _dense_matrix(topology: Topology, idx: Any, acc: Any) -> Array:
    if isinstance(topology.senders, np.ndarray):
        return jnp.asarray(round_table(topology.matrices(), idx), acc)
    # Traced tables: scatter the round's edges; edges are unique (receiver, sender) pairs, so every
    # entry is one weight (plus weight-0 padding), exactly as in the host matrices.
    n = topology.num_nodes
    w = jnp.zeros((n, n), acc)
    return w.at[topology.receivers[idx], topology.senders[idx]].add(topology.weights[idx].astype(acc))


def _mix_dense(topology: Topology, leaf: Array, idx: Any) -> Array:
    acc = acc_dtype(leaf.dtype)
    w = _dense_matrix(topology, idx, acc)
    flat = leaf.reshape(leaf.shape[0], -1).astype(acc)
    out = jnp.matmul(w, flat, precision=jax.lax.Precision.HIGHEST)
    return out.reshape(leaf.shape).astype(leaf.dtype)


def _mix_segment(topology: Topology, leaf: Array, idx: Any) -> Array:
    acc = acc_dtype(leaf.dtype)
    if isinstance(topology.senders, np.ndarray) and isinstance(idx, int):
        split = _cached_hubs(TopologyKey.of(topology), idx)
        if split is not None:
            return _mix_hubs(split, leaf)
    senders = round_table(topology.senders, idx)
    receivers = round_table(topology.receivers, idx)
    w = jnp.asarray(round_table(topology.weights, idx), acc)
    msgs = per_node(w, leaf) * leaf.astype(acc)[senders]
    out = jax.ops.segment_sum(msgs, receivers, num_segments=topology.num_nodes)
    return out.astype(leaf.dtype)


def _mix_hubs(split, leaf: Array) -> Array:
    """A round of a few hubs (:func:`jaxgossip.topology.layout.hub_split`): the slot kernel for
    the other rows, then each hub's row as one reduction over its in-neighbours (a slice of x when
    they are consecutive nodes, else a gather; of the weighted rows, or of the rows times their
    one weight when the hub weighs them equally), written into its row. The other rows
    sum as the segment kernel does up to the order of their few terms; a hub's row sums its M_h
    terms in the reduction's order."""
    acc = acc_dtype(leaf.dtype)
    x = leaf.astype(acc)
    cast = np.float32 if acc == jnp.float32 else None
    w = split.weights if cast is None else split.weights.astype(cast)
    # Columns with one sender for every live slot (a star's leaves take from the hub) read that
    # row broadcast. The rows are fetched into memory (coins.buffered): XLA fuses nothing across
    # it, so they are copied out before the update, which then may overwrite x in place (a fusion
    # that reads another node's row of x would make XLA copy all of x).
    columns = range(1, split.neighbors.shape[1])
    single = {k: np.unique(split.neighbors[w[:, k] != 0, k]) for k in columns}
    rows = sorted({int(c[0]) for c in single.values() if c.size == 1})
    if rows:
        fetched = buffered(x[(0,) * x.ndim], lambda: x[np.asarray(rows)])
    out = per_node(jnp.asarray(w[:, 0], acc), x) * x  # slot 0 is the node itself
    for k in columns:
        column = split.neighbors[:, k]
        if single[k].size == 1:
            gathered = fetched[rows.index(int(single[k][0]))][None]
        elif (shift := circulant_shift(column)) is not None:
            gathered = jnp.roll(x, -shift, axis=0)
        else:
            gathered = x[column]
        out = per_node(jnp.asarray(w[:, k], acc), x) * gathered + out
    for hub, senders, weights in zip(split.hubs, split.hub_senders, split.hub_weights):
        first = int(senders[0])
        consecutive = bool(np.all(np.diff(senders) == 1))
        rows = x[first : first + senders.size] if consecutive else x[senders]
        row_w = weights if cast is None else weights.astype(cast)
        if np.all(row_w == row_w[0]):
            # Equal weights (Metropolis or max-degree weights on a star) scale the sum once: on
            # XLA:CPU a reduction of x alone runs ~4x faster than one of a product with a
            # constant of N values (measured at N = 2^20, D = 1).
            total = jnp.asarray(row_w[0], acc) * jnp.sum(rows, axis=0)
        else:
            # A fused multiply and reduction over the rows (measured faster than a dot).
            total = jnp.sum(per_node(jnp.asarray(row_w, acc), rows) * rows, axis=0)
        out = out.at[hub].set(total)
    return out.astype(leaf.dtype)


_KERNELS = {"slots": mix_slots, "dense": _mix_dense, "segment": _mix_segment}


# ---- the slot kernel with the node axis over devices ------------------------------------------------


def _from_device(piece: Array, offset: int, num_devices: int) -> Array:
    """``piece`` as held by device ``d + offset`` (mod P), on every device d."""
    offset %= num_devices
    if offset == 0:
        return piece
    perm = [(src, (src - offset) % num_devices) for src in range(num_devices)]
    return lax.ppermute(piece, NODE_AXIS, perm)


def _shifted_block(block: Array, shift: int, n_local: int, num_devices: int) -> Array:
    """This device's rows of ``roll(x, -shift, axis=0)``, from its block ``[n_local, ...]`` of x.

    Global row ``d n + j`` needs ``x[d n + j + c]`` with ``c = q n + r``: rows ``r..n-1`` of
    device ``d + q`` followed by rows ``0..r-1`` of device ``d + q + 1``, i.e. two ppermutes of
    contiguous slices (one when r = 0), n_local rows received per shift in all.
    """
    q, r = divmod(shift, n_local)
    head = _from_device(block[r:], q, num_devices)
    if r == 0:
        return head
    tail = _from_device(block[:r], q + 1, num_devices)
    return jnp.concatenate([head, tail], axis=0)


def _local_weights(w: np.ndarray, acc: Any, n_local: int) -> Array | float:
    """This device's slice ``[n_local]`` of a per-node weight vector (a scalar when uniform)."""
    if np.all(w == w[0]):
        return float(w[0])
    start = lax.axis_index(NODE_AXIS) * n_local
    return lax.dynamic_slice_in_dim(jnp.asarray(w, acc), start, n_local)


def _mix_round_local(terms, n_local: int, num_devices: int, leaf: Array) -> Array:
    """One round on one device's block ``[n_local, ...]`` of a leaf."""
    acc = acc_dtype(leaf.dtype)
    out = None
    for shift, w in terms:
        # Shift in the leaf's own dtype (bfloat16 sends half the bytes); accumulate in float32.
        shifted = _shifted_block(leaf, shift, n_local, num_devices).astype(acc)
        wl = _local_weights(w, acc, n_local)
        if not isinstance(wl, float):
            wl = per_node(wl, leaf)
        term = wl * shifted
        out = term if out is None else term + out  # product first, as in the slot kernel
    if out is None:  # a round with no edges at all
        out = jnp.zeros(leaf.shape, acc)
    return out.astype(leaf.dtype)


def _mix_ppermute(plan, mesh: Any, x: Params, idx: Any) -> Params:
    """``shard_map`` over the ``"nodes"`` axis of ``mesh``: each round of ``plan`` (static ``idx``)
    or a ``lax.switch`` over all of them (traced ``idx``), each with its own static ppermutes."""
    num_devices = int(mesh.shape[NODE_AXIS])
    n_local = jax.tree_util.tree_leaves(x)[0].shape[0] // num_devices
    branches = [
        functools.partial(jax.tree_util.tree_map, functools.partial(_mix_round_local, terms, n_local, num_devices))
        for terms in plan
    ]
    spec = PartitionSpec(NODE_AXIS)
    if isinstance(idx, int):
        return jax.shard_map(branches[idx], mesh=mesh, in_specs=(spec,), out_specs=spec)(x)

    def body(x_local, idx):
        return lax.switch(idx, branches, x_local)

    return jax.shard_map(body, mesh=mesh, in_specs=(spec, PartitionSpec()), out_specs=spec)(x, idx)


def _node_mesh(leaf: Array, num_nodes: int) -> Any:
    """The mesh whose ``"nodes"`` axis (size P > 1, P divides N) holds the node axis of ``leaf``,
    or None. Under ``jit`` with automatic axes only the mesh is known, not the spec, so a leaf on
    a mesh with a ``"nodes"`` axis counts as placed on it (jaxgossip.ops.sharding.shard_nodes)."""
    sharding = getattr(jax.typeof(leaf), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or NODE_AXIS not in mesh.axis_names:
        return None
    size = int(mesh.shape[NODE_AXIS])
    if size == 1 or num_nodes % size:
        return None
    spec = tuple(sharding.spec)
    explicit = mesh.axis_types[mesh.axis_names.index(NODE_AXIS)] == jax.sharding.AxisType.Explicit
    if explicit and (not spec or spec[0] != NODE_AXIS):
        return None
    return mesh


@functools.lru_cache(maxsize=256)
def _ppermute_mixer(graph: TopologyKey, mesh: Any, round_idx: int | None):
    """The jitted ``shard_map`` for round ``round_idx`` (static) or for all rounds (None: ``f(x, idx)``).

    Jitted and cached so that calls outside ``jit`` compile once instead of running the shard_map
    body op by op; under an outer ``jit`` it is inlined. ``circulant_shifts`` raises for a
    non-circulant graph here, and lru_cache does not cache exceptions.
    """
    plan = circulant_shifts(graph.topology)
    if round_idx is None:
        return jax.jit(lambda x, idx: _mix_ppermute(plan, mesh, x, idx))
    return jax.jit(lambda x: _mix_ppermute(plan, mesh, x, round_idx))


def _sharded(topology: Topology, mesh: Any, x: Any, idx: Any) -> Any:
    graph = TopologyKey.of(topology)
    if isinstance(idx, int):
        return _ppermute_mixer(graph, mesh, idx)(x)
    return _ppermute_mixer(graph, mesh, None)(x, idx)


# ---- public entry points ---------------------------------------------------------------------------


def mix(topology: Topology, x: Params, t: Any = 0) -> Params:
    """One round of linear mixing on the node axis: ``x_i <- sum_j W(t)_ij x_j`` for every leaf.

    .. math::  X^{t+1} = W^{(t)} X^{t}

    Works under ``jit``, ``vmap`` (over seeds, or over the graph axis G of a stack from
    :func:`jaxgossip.topology.stack`, whose members then have traced tables), ``lax.scan`` with a
    traced round counter, and with the node axis sharded over a mesh axis ``"nodes"``; circulant
    graphs on the slot layout then mix by ``lax.ppermute`` (see the module docstring).

    Args:
      topology: one graph (tables ``[T, ...]``); ``W(t)`` is its round ``t mod T``.
      x: pytree whose leaves are floating ``[N, ...]``.
      t: round counter, Python int or traced integer scalar.

    Returns:
      A pytree like ``x`` (same shapes and dtypes).

    Raises:
      ValueError: ``topology`` is a whole stack (tables ``[G, T, ...]``; vmap over G first), a
        stochastic graph (draw the round first: ``topology.draw(key, t).graph``), or a leaf is not
        ``[N, ...]``.
    """
    if topology.stochastic:
        raise ValueError(
            f"mix needs one round's graph; {topology.name} is stochastic: mix the round drawn by "
            "topology.draw(key, t).graph"
        )
    if jnp.ndim(topology.senders) != 2:
        raise ValueError(
            "mix needs one graph: vmap over the stack's graph axis first (senders has shape "
            f"{tuple(jnp.shape(topology.senders))}, expected [T, E])"
        )
    check_params(topology, x)
    idx = _round(topology.period, t)
    kernel = _KERNELS[topology.resolved_kernel]
    static_slots = topology.resolved_kernel == "slots" and isinstance(topology.senders, np.ndarray)
    if static_slots and not isinstance(idx, int) and isinstance(topology.slots[1], np.ndarray):
        nbr, slot_w = topology.slots
        kernel = functools.partial(kernel, plan=traced_plan(nbr, slot_w))

    def one(leaf):
        mesh = _node_mesh(leaf, topology.num_nodes) if static_slots else None
        if mesh is None or _cached_shifts(TopologyKey.of(topology)) is None:
            return kernel(topology, leaf, idx)
        return _sharded(topology, mesh, leaf, idx)

    return jax.tree_util.tree_map(one, x)


def mix_on_mesh(topology: Topology, x: Params, t: Any, mesh: Any) -> Params:
    """``mix(topology, x, t)`` of a circulant graph as ``shard_map`` + ``lax.ppermute`` on ``mesh``.

    .. math::  (W^{(t)} X)_i = \\sum_c w_c[i] X_{(i + c) \\bmod N}

    The node axis is split into P blocks of ``N / P`` consecutive nodes, one per device of the mesh
    axis ``"nodes"``; each shift c of round t (:func:`circulant_shifts`) moves at most two
    contiguous row slices between devices. Any layout of a circulant graph is served. ``mix`` picks
    this path by itself for slot-layout graphs whose leaves are placed on such a mesh;
    :func:`jaxgossip.ops.sharding.mix_ppermute` is the checked public entry with an explicit mesh.

    Args:
      topology: a circulant graph with host tables.
      x: pytree whose leaves are floating ``[N, ...]``, N divisible by the mesh's ``"nodes"`` size.
      t: round counter, Python int or traced integer scalar.
      mesh: a ``Mesh`` (or ``AbstractMesh`` under ``jit``) with an axis ``"nodes"``.

    Raises:
      ValueError: the topology is not circulant.
    """
    check_params(topology, x)
    return _sharded(topology, mesh, x, _round(topology.period, t))


# ---- reductions over the node axis -----------------------------------------------------------------


def node_mean(x: Params) -> Params:
    """The average model ``x_bar = (1/N) sum_i x_i`` per leaf (leaves ``[...]``, no node axis)."""
    return jax.tree_util.tree_map(lambda leaf: jnp.mean(leaf.astype(acc_dtype(leaf.dtype)), axis=0), x)


def consensus_distance(x: Params, target: Params | None = None) -> Array:
    """``(1/N) sum_i ||x_i - target||^2`` summed over all leaves (squared Frobenius norms).

    Args:
      x: pytree of leaves ``[N, ...]``.
      target: pytree of leaves ``[...]``; defaults to the node mean of ``x`` (consensus distance
        Xi^2 of docs/topologies.md, section topologies and spectral tools).
    """
    if target is None:
        target = node_mean(x)

    def per_leaf(leaf, ref):
        diff = leaf.astype(acc_dtype(leaf.dtype)) - ref[None]
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
