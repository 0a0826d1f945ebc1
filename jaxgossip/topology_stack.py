"""Graphs as arrays: a group of same-shape topologies stacked so that one compile serves them all.

A :class:`~jaxgossip.topology.Topology` keeps its tables as host NumPy arrays, closed over by jitted
code as constants, so every graph costs its own compile. A :class:`TopologyStack` holds the tables of
G graphs with the same node count N as device arrays with a leading graph axis ``[G, ...]``; it is a
pytree, so ``jax.vmap`` over it gives each graph's tables as traced values and a mixing algorithm
built on it runs all G graphs in one program (``jaxgossip.sweeps.sweep_topologies``).

Stacking pads the tables to a common shape:

* period: the schedules are repeated to the least common multiple ``T`` of their periods, so round
  ``t`` still uses graph ``t mod T_g`` of every member;
* ``"slots"`` kernel: in-neighbour slot tables ``neighbors [G, T, N, K]``, ``weights [G, T, N, K]``
  padded to the largest K with weight-0 self slots;
* ``"segment"`` kernel: edge lists ``senders / receivers / weights [G, T, E]`` padded to the largest
  E with weight-0 self edges;
* ``"dense"`` kernel: matrices ``[G, T, N, N]``.

A padded slot or edge has weight 0, so mixing with the stack equals mixing with each member (tested
against ``Topology.matrix``). Out-degrees ``[G, T, N]`` ride along for the bit counts.

Which graphs share a stack (:func:`group`): same N, same kernel, static vs time-varying (Choco-SGD
refuses time-varying graphs, and one of them would force the period of a whole group), and the same
stochasticity (doubly vs only column stochastic), which fixes an algorithm's messages.

Only algorithms whose communication is ``mix`` plus degree-based bit counts accept a stack member
(:data:`STACKABLE`: gossip, allreduce, choco, deepsqueeze, push_sum). PowerGossip and Sparse-Push
build per-edge or per-graph host tables and need a :class:`~jaxgossip.topology.Topology`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.topology import Topology

__all__ = ["TopologyStack", "STACKABLE", "signature", "group", "stack"]

# Algorithms whose only use of the graph is mix(topology, ...) and per-round out-degrees.
STACKABLE = ("gossip", "allreduce", "choco", "deepsqueeze", "push_sum")

# A least common multiple of periods above this would repeat tables too often; such graphs are
# split into separate groups.
_MAX_PERIOD = 4096

_TABLES = {
    "slots": ("neighbors", "slot_weights"),
    "segment": ("senders", "receivers", "weights"),
    "dense": ("matrices",),
}


@jax.tree_util.register_pytree_node_class
class TopologyStack:
    """Tables of G same-shape graphs as arrays with a leading graph axis (or of one graph, under vmap).

    The array leaves (pytree children) are, for ``kernel``:

    * ``"slots"``: ``neighbors`` [G, T, N, K] int32, ``slot_weights`` [G, T, N, K] float32;
    * ``"segment"``: ``senders``, ``receivers`` [G, T, E] int32, ``weights`` [G, T, E] float32;
    * ``"dense"``: ``matrices`` [G, T, N, N] float32;

    and always ``out_degree`` [G, T, N] float32 (messages each node sends in round t, self excluded).
    Under ``jax.vmap`` over the stack the leading G axis is gone and the object behaves like one
    topology with traced tables: it has the attributes the stackable algorithms read (``num_nodes``,
    ``period``, ``out_degree``, ``is_doubly_stochastic``, ``is_column_stochastic``, ``name``).

    Static attributes: ``names`` (one per member), ``num_nodes`` N, ``period`` T (the lcm of the
    members' periods), ``kernel``, ``directed`` (any member directed), ``is_doubly_stochastic``,
    ``is_column_stochastic``.
    """

    def __init__(
        self,
        tables: dict[str, Any],
        names: tuple[str, ...],
        num_nodes: int,
        period: int,
        kernel: str,
        directed: bool,
        doubly: bool,
        column: bool,
    ):
        self.tables = dict(tables)
        self.names = tuple(names)
        self.num_nodes = int(num_nodes)
        self.period = int(period)
        self.kernel = kernel
        self.directed = bool(directed)
        self.is_doubly_stochastic = bool(doubly)
        self.is_column_stochastic = bool(column)

    # ---- pytree -----------------------------------------------------------------------------
    def tree_flatten(self):
        keys = tuple(sorted(self.tables))
        aux = (
            keys,
            self.names,
            self.num_nodes,
            self.period,
            self.kernel,
            self.directed,
            self.is_doubly_stochastic,
            self.is_column_stochastic,
        )
        return tuple(self.tables[k] for k in keys), aux

    @classmethod
    def tree_unflatten(cls, aux, children):
        keys, *rest = aux
        return cls(dict(zip(keys, children)), *rest)

    # ---- the Topology-like interface --------------------------------------------------------
    @property
    def name(self) -> str:
        return self.names[0] if len(self.names) == 1 else "stack(" + ", ".join(self.names) + ")"

    @property
    def time_varying(self) -> bool:
        return self.period > 1

    @property
    def resolved_kernel(self) -> str:
        return self.kernel

    @property
    def out_degree(self) -> Any:
        """[T, N] (under vmap; [G, T, N] on the whole stack) float32 out-degrees."""
        return self.tables["out_degree"]

    @property
    def num_graphs(self) -> int:
        """G, the members of a whole (not vmapped) stack."""
        return len(self.names)

    def __repr__(self) -> str:
        return (
            f"TopologyStack({len(self.names)} graphs, N={self.num_nodes}, T={self.period}, "
            f"kernel={self.kernel}, tables={ {k: tuple(jnp.shape(v)) for k, v in self.tables.items()} })"
        )


def signature(topology: Topology) -> tuple:
    """The grouping key: graphs with equal signatures can share a :class:`TopologyStack`."""
    if not isinstance(topology, Topology):
        raise TypeError(f"expected a jaxgossip Topology, got {type(topology).__name__}")
    return (
        topology.num_nodes,
        topology.resolved_kernel,
        topology.time_varying,
        topology.is_doubly_stochastic,
        topology.is_column_stochastic,
    )


def group(topologies: Sequence[Topology]) -> list[list[int]]:
    """Indices of ``topologies`` grouped by :func:`signature`, in order of first appearance.

    A group whose schedules' periods have a least common multiple above 4096 is split so that each
    part stays below it.
    """
    groups: dict[tuple, list[list[int]]] = {}
    for i, topo in enumerate(topologies):
        parts = groups.setdefault(signature(topo), [[]])
        last = parts[-1]
        period = math.lcm(*(topologies[j].period for j in last), topo.period) if last else topo.period
        if last and period > _MAX_PERIOD:
            parts.append([i])
        else:
            last.append(i)
    return [part for parts in groups.values() for part in parts]


def _repeat(table: np.ndarray, period: int) -> np.ndarray:
    """[T_g, ...] -> [period, ...] by repeating the schedule (period is a multiple of T_g)."""
    return np.tile(table, (period // table.shape[0],) + (1,) * (table.ndim - 1))


def _pad_last(table: np.ndarray, size: int, fill: np.ndarray | float) -> np.ndarray:
    extra = size - table.shape[-1]
    if extra == 0:
        return table
    pad = np.broadcast_to(np.asarray(fill)[..., None] if np.ndim(fill) else fill, table.shape[:-1] + (extra,))
    return np.concatenate([table, pad.astype(table.dtype)], axis=-1)


def stack(topologies: Sequence[Topology], kernel: str | None = None) -> TopologyStack:
    """Stacks graphs of one :func:`signature` into a :class:`TopologyStack` with leading axis G.

    Args:
      topologies: G >= 1 topologies with equal :func:`signature` (use :func:`group` first).
      kernel: override the shared resolved kernel ("slots", "segment" or "dense").

    Raises:
      ValueError: empty list, members with different signatures (the message names both), or an
        unknown kernel.
    """
    topologies = list(topologies)
    if not topologies:
        raise ValueError("stack needs at least one topology")
    first = signature(topologies[0])
    for topo in topologies[1:]:
        if signature(topo) != first:
            raise ValueError(
                f"cannot stack {topologies[0].name} with {topo.name}: they differ in (N, kernel, "
                f"time-varying, doubly stochastic, column stochastic) = {first} vs {signature(topo)}; "
                "group them with jaxgossip.topology_stack.group"
            )
    n = topologies[0].num_nodes
    kernel = kernel or topologies[0].resolved_kernel
    if kernel not in _TABLES:
        raise ValueError(f"kernel={kernel!r} is unknown; stackable kernels: {sorted(_TABLES)}")
    period = math.lcm(*(t.period for t in topologies))
    self_ids = np.broadcast_to(np.arange(n, dtype=np.int32), (period, n))
    per_graph: dict[str, list[np.ndarray]] = {}

    def add(name, value):
        per_graph.setdefault(name, []).append(value)

    if kernel == "slots":
        k = max(t.max_slots for t in topologies)
        for t in topologies:
            nbr, w = (_repeat(a, period) for a in t.slots)
            add("neighbors", _pad_last(nbr.astype(np.int32), k, self_ids))
            add("slot_weights", _pad_last(w.astype(np.float32), k, 0.0))
    elif kernel == "segment":
        e = max(t.num_edges for t in topologies)
        for t in topologies:
            add("senders", _pad_last(_repeat(t.senders, period).astype(np.int32), e, 0))
            add("receivers", _pad_last(_repeat(t.receivers, period).astype(np.int32), e, 0))
            add("weights", _pad_last(_repeat(t.weights, period).astype(np.float32), e, 0.0))
    else:
        for t in topologies:
            add("matrices", _repeat(t.matrices(), period).astype(np.float32))
    for t in topologies:
        add("out_degree", _repeat(t.out_degree, period).astype(np.float32))
    tables = {name: jnp.asarray(np.stack(values)) for name, values in per_graph.items()}
    return TopologyStack(
        tables,
        tuple(t.name for t in topologies),
        n,
        period,
        kernel,
        any(t.directed for t in topologies),
        topologies[0].is_doubly_stochastic,
        topologies[0].is_column_stochastic,
    )


def mix_stacked(topology: TopologyStack, leaf: Any, idx: Any) -> Any:
    """``W(idx) @ leaf`` for one member (tables without the G axis, i.e. under vmap).

    ``leaf`` is [N, ...]; accumulation in float32 for low-precision leaves, as in ``mix``.
    """
    tables = topology.tables
    if tables["out_degree"].ndim != 2:
        raise ValueError(
            "mix on a TopologyStack needs one member's tables: vmap over the stack's graph axis first "
            f"(out_degree has shape {tuple(tables['out_degree'].shape)}, expected [T, N])"
        )
    acc = jnp.promote_types(leaf.dtype, jnp.float32)
    x = leaf.astype(acc)

    def expand(w):
        return jnp.reshape(w.astype(acc), w.shape + (1,) * (x.ndim - 1))

    if topology.kernel == "slots":
        nbr, w = tables["neighbors"][idx], tables["slot_weights"][idx]  # [N, K]
        out = expand(w[:, 0]) * x[nbr[:, 0]]
        for k in range(1, nbr.shape[1]):
            out = out + expand(w[:, k]) * x[nbr[:, k]]
    elif topology.kernel == "segment":
        senders, receivers = tables["senders"][idx], tables["receivers"][idx]
        msgs = expand(tables["weights"][idx]) * x[senders]
        out = jax.ops.segment_sum(msgs, receivers, num_segments=topology.num_nodes)
    else:
        flat = x.reshape(x.shape[0], -1)
        out = jnp.matmul(tables["matrices"][idx].astype(acc), flat, precision=jax.lax.Precision.HIGHEST)
        out = out.reshape(x.shape)
    return out.astype(leaf.dtype)
