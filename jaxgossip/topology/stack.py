"""Stacks of graphs: G graphs of one shape as one :class:`Topology` with a leading graph axis.

A graph built on the host keeps NumPy tables, constants of the compiled program, so every graph
costs its own compile. :func:`stack` puts the tables of G graphs with the same node count N on a
leading graph axis ``[G, ...]`` as device arrays; ``jax.vmap`` over the stack gives each member's
tables as traced values, so a mixing algorithm built on a member runs all G graphs in one program
(``jaxgossip.engine.sweeps.sweep_topologies``).

Stacking pads the tables to a common shape:

* period: the schedules are repeated to the least common multiple ``T`` of their periods, so round
  ``t`` still uses graph ``t mod T_g`` of every member;
* edge lists ``senders / receivers / weights [G, T, E]``: padded to the largest E with weight-0
  self edges of node 0;
* ``"slots"`` layout: slot tables ``neighbors / slot_weights [G, T, N, K]`` padded to the largest K
  with weight-0 self slots. :func:`buckets` splits a group by K so that no member pays for the
  largest degree (a star among rings would make every ring gather N times per round).

A padded slot or edge has weight 0, so mixing with a member equals mixing with the graph itself.

Which graphs share a compile (:func:`group`): same N, same kernel layout, static vs time-varying
(Choco-SGD refuses time-varying graphs, and one of them would force the period of a whole group),
and the same stochasticity (doubly vs only column stochastic), which fixes an algorithm's messages.
Stochastic graphs have no tables to stack; failures of one graph at several probabilities share a
sampler and stack on their traced probabilities (``Topology.draw_args`` ``[G]``) instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.topology.graph import Topology

__all__ = ["signature", "group", "buckets", "stack"]

# A least common multiple of periods above this would repeat tables too often; such graphs are
# split into separate groups.
_MAX_PERIOD = 4096
_LAYOUTS = ("slots", "dense", "segment")


def signature(topology: Topology) -> tuple:
    """The grouping key: graphs with equal signatures can share one compiled program. A stochastic
    graph has tables only inside the run; graphs with equal samplers and traceable ``draw_args``
    (``with_failures`` of one graph at several p, q) stack on those arguments; any other stochastic
    graph is its own group."""
    if not isinstance(topology, Topology):
        raise TypeError(f"expected a jaxgossip Topology, got {type(topology).__name__}")
    if topology.stochastic:
        if topology.draw_args is None:
            return (topology.num_nodes, "stochastic", topology.sampler, id(topology))
        return (topology.num_nodes, "stochastic", topology.sampler)
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


def buckets(topologies: Sequence[Topology]) -> list[list[int]]:
    """Indices of one :func:`group` split by slot count K (slot layout only), in order of first
    appearance; each bucket is stacked without padding K."""
    parts: dict[int, list[int]] = {}
    for i, topo in enumerate(topologies):
        k = topo.max_slots if topo.resolved_kernel == "slots" and not topo.stochastic else 0
        parts.setdefault(k, []).append(i)
    return list(parts.values())


def _repeat(table: np.ndarray, period: int) -> np.ndarray:
    """[T_g, ...] -> [period, ...] by repeating the schedule (period is a multiple of T_g)."""
    return np.tile(table, (period // table.shape[0],) + (1,) * (table.ndim - 1))


def _pad_last(table: np.ndarray, size: int, fill: np.ndarray | float) -> np.ndarray:
    extra = size - table.shape[-1]
    if extra == 0:
        return table
    pad = np.broadcast_to(np.asarray(fill)[..., None] if np.ndim(fill) else fill, table.shape[:-1] + (extra,))
    return np.concatenate([table, pad.astype(table.dtype)], axis=-1)


def stack(topologies: Sequence[Topology], kernel: str | None = None) -> Topology:
    """Stacks graphs of one :func:`signature` into one :class:`Topology` with leading axis G.

    Args:
      topologies: G >= 1 host topologies with equal :func:`signature` (use :func:`group` first,
        and :func:`buckets` to avoid padding K).
      kernel: override the shared layout (``"slots"``, ``"segment"`` or ``"dense"``).

    Returns:
      A :class:`Topology` with tables ``[G, T, ...]`` (device arrays; weights float32); ``vmap``
      over its leading axis to get the members.

    Raises:
      ValueError: empty list, members with different signatures (the message names both), or an
        unknown kernel.

    Stochastic graphs stack only when they share one sampler and carry ``draw_args`` (failures of
    one graph at several probabilities): the result has the sampler and ``draw_args`` leaves
    ``[G]``, and ``jax.vmap`` over it draws every member's rounds with its own probabilities.
    """
    topologies = list(topologies)
    if not topologies:
        raise ValueError("stack needs at least one topology")
    if any(isinstance(topo, Topology) and topo.stochastic for topo in topologies):
        return _stack_stochastic(topologies)
    first = signature(topologies[0])
    for topo in topologies[1:]:
        if signature(topo) != first:
            raise ValueError(
                f"cannot stack {topologies[0].name} with {topo.name}: they differ in (N, kernel, "
                f"time-varying, doubly stochastic, column stochastic) = {first} vs {signature(topo)}; "
                "group them with jaxgossip.topology.group"
            )
    n = topologies[0].num_nodes
    kernel = kernel or topologies[0].resolved_kernel
    if kernel not in _LAYOUTS:
        raise ValueError(f"kernel={kernel!r} is unknown; stackable kernels: {sorted(_LAYOUTS)}")
    period = math.lcm(*(t.period for t in topologies))
    e = max(t.num_edges for t in topologies)
    tables = {
        "senders": [_pad_last(_repeat(t.senders, period).astype(np.int32), e, 0) for t in topologies],
        "receivers": [_pad_last(_repeat(t.receivers, period).astype(np.int32), e, 0) for t in topologies],
        "weights": [_pad_last(_repeat(t.weights, period).astype(np.float32), e, 0.0) for t in topologies],
    }
    if kernel == "slots":
        k = max(t.max_slots for t in topologies)
        self_ids = np.broadcast_to(np.arange(n, dtype=np.int32), (period, n))
        tables["neighbors"] = [_pad_last(_repeat(t.slots[0], period).astype(np.int32), k, self_ids) for t in topologies]
        tables["slot_weights"] = [_pad_last(_repeat(t.slots[1], period).astype(np.float32), k, 0.0) for t in topologies]
    return Topology.from_tables(
        {name: jnp.asarray(np.stack(values)) for name, values in tables.items()},
        name="stack(" + ", ".join(t.name for t in topologies) + ")",
        num_nodes=n,
        directed=any(t.directed for t in topologies),
        layout=kernel,
        row_stochastic=topologies[0].is_row_stochastic,
        column_stochastic=topologies[0].is_column_stochastic,
    )


def _stack_stochastic(topologies: list[Topology]) -> Topology:
    """G stochastic graphs of one sampler -> one with ``draw_args`` stacked to ``[G]``."""
    first = topologies[0]
    for topo in topologies:
        if not isinstance(topo, Topology) or not topo.stochastic or topo.draw_args is None:
            name = topo.name if isinstance(topo, Topology) else type(topo).__name__
            raise ValueError(
                f"cannot stack {name}: only stochastic graphs with traceable arguments (with_failures of "
                "one graph at several probabilities) stack; other stochastic graphs draw their tables "
                "inside the run and run one per program"
            )
        if topo.num_graphs is not None:
            raise ValueError(f"cannot stack {topo.name}: it is already a stack")
        if signature(topo) != signature(first):
            raise ValueError(
                f"cannot stack {first.name} with {topo.name}: stochastic graphs stack only with the same "
                "sampler (failures of the same graph); group them with jaxgossip.topology.group"
            )
    draw_args = jax.tree_util.tree_map(
        lambda *a: jnp.stack([jnp.asarray(x, jnp.float32) for x in a]), *(t.draw_args for t in topologies)
    )
    return Topology.from_sampler(
        first.sampler,
        draw_args=draw_args,
        name="stack(" + ", ".join(t.name for t in topologies) + ")",
        num_nodes=first.num_nodes,
        directed=first.directed,
        layout=first.resolved_kernel,
        row_stochastic=first.is_row_stochastic,
        column_stochastic=first.is_column_stochastic,
    )
