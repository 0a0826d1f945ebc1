"""The models a round's receivers read, per in-neighbour slot: the message view of model-gossip.

An algorithm whose messages are its models (every node sends its current model to each
out-neighbour) can be written as a function of what each receiver reads: in round t, receiver i
reads in slot k of the graph's in-neighbour table (:attr:`jaxgossip.topology.Topology.slots`,
``[T, N, K]``, slot 0 the node itself) the row ``neighbors[i, k]`` of a *source* array. Without
an attacker the source is the params and the slots are the graph's own, so such a round reads
exactly the models its in-neighbours hold. The Byzantine wrapper (:mod:`jaxgossip.algorithms.byzantine`)
appends the messages attackers send on each of their out-edges to the source (rows ``N, N + 1,
...``) and points those slots there: one model per directed edge, a different one per neighbour
if the attack wants, without changing the round.

Shapes: N nodes, K in-neighbour slots (the largest in-degree, self included), M attacked edges.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.algorithms._shared.common import CountState, per_round
from jaxgossip.algorithms.registry import check_graph, sign
from jaxgossip.ops.mixing import check_params, leaf_bits, per_node
from jaxgossip.topology import Topology
from jaxgossip.types import AlgorithmInfo, Array, GossipAlgorithm, GraphNeeds, Params, StepInfo

__all__ = [
    "Received",
    "received_models",
    "slot_round",
    "read_slot",
    "check_fixed_graph",
    "model_bits",
    "model_algorithm",
    "coordinatewise_round",
]


class Received(NamedTuple):
    """What every receiver reads in one round.

    Attributes:
      source: pytree of leaves ``[N + M, ...]``: rows ``0..N-1`` the nodes' own models, rows
        ``N..N+M-1`` messages that replace a sender's model on one edge (M = 0 without attackers).
      neighbors: [N, K] int32, the source row receiver i reads in slot k (slot 0: i itself).
      weights: [N, K] float32, ``W_t[i, j]`` of the sender j of slot k; 0 for padding slots.
      mask: [N, K] bool, the slot holds an in-neighbour or the node itself (slot 0 always; other
        slots where the weight is non-zero): the neighbourhood the robust rules aggregate over.
    """

    source: Params
    neighbors: Array
    weights: Array
    mask: Array


def check_fixed_graph(topology: Any, algorithm: str) -> Topology:
    """Raises unless ``topology`` is one fixed graph with host tables (its slot table is read)."""
    if not isinstance(topology, Topology):
        raise TypeError(f"{algorithm} needs a jaxgossip Topology, got {type(topology).__name__}")
    if topology.stochastic:
        raise ValueError(
            f"{algorithm} reads the graph's in-neighbour slot table; {topology.name} is stochastic (drawn every "
            "round) and has none. Use a fixed or time-varying graph"
        )
    if not topology.host_tables or topology.num_graphs is not None:
        raise TypeError(
            f"{algorithm} builds its slot tables on the host; {topology.name} has traced or stacked tables. "
            "Give it a graph built on the host"
        )
    if topology.neighbors is None:
        _ = topology.slots  # a hub graph keeps no table of its own: made here, or its size refused
    return topology


def slot_round(table: np.ndarray, t: Any) -> Array:
    """Round ``t mod T`` of a host table ``[T, ...]`` (a constant when T = 1)."""
    if table.shape[0] == 1:
        return jnp.asarray(table[0])
    return jnp.asarray(table)[jnp.asarray(t, jnp.int32) % table.shape[0]]


def received_models(topology: Topology, params: Params, t: Any) -> Received:
    """The honest view of round t: every receiver reads its in-neighbours' own models."""
    nbr, slot_w = topology.slots
    slots = np.arange(nbr.shape[-1])
    mask = (slot_w != 0) | (slots == 0)[None, None, :]
    return Received(
        source=params,
        neighbors=slot_round(nbr.astype(np.int32), t),
        weights=slot_round(slot_w.astype(np.float32), t),
        mask=slot_round(mask, t),
    )


def read_slot(received: Received, k: int) -> Params:
    """The models every receiver reads in slot k: a pytree of leaves ``[N, ...]``."""
    rows = received.neighbors[:, k]
    return jax.tree_util.tree_map(lambda leaf: leaf[rows], received.source)


def model_bits(topology: Topology, params: Params, t: Any) -> Array:
    """[N] bits of round t when every node sends its model to each out-neighbour (as gossip)."""
    return per_round(topology.out_degree, t) * leaf_bits(params)


def model_algorithm(topology: Topology, round_fn: Any, name: str, info: AlgorithmInfo) -> GossipAlgorithm:
    """The algorithm of a round written on :class:`Received` (state ``CountState``): each step
    reads the in-neighbours' own models."""

    def init_fn(params):
        check_params(topology, params)
        return CountState(count=jnp.zeros([], jnp.int32))

    def step_fn(params, state, key):
        return round_fn(params, state, received_models(topology, params, state.count), key)

    def debias_fn(params, state):
        del state
        return params

    return sign(GossipAlgorithm(init_fn, step_fn, debias_fn), name, info)


def _acc(leaf: Array) -> Array:
    return leaf.astype(jnp.promote_types(leaf.dtype, jnp.float32))


def _sorted_neighbourhood(received: Received, source: Array, leaf: Array) -> Array:
    """[N, K, ...]: every coordinate's values over the receiver's neighbourhood (slots in the mask)
    in ascending order, the slots outside it (+inf) last."""
    values = _acc(source)[received.neighbors]
    mask = per_node(received.mask, leaf)
    return jnp.sort(jnp.where(mask, values, jnp.inf), axis=1)


def fixed_slot_graph(mixing: str, reasons: dict[str, str] | None = None) -> GraphNeeds:
    """The graph needs of a rule written on the received models: any ``mixing`` it states, fixed
    graphs only, because the in-neighbour slot table it reads is built on the host; ``reasons`` adds
    the reasons of its other refusals (:attr:`jaxgossip.types.GraphNeeds.reasons`)."""
    why = "it reads the graph's fixed in-neighbour slot table (host tables), which a drawn graph lacks"
    return GraphNeeds(mixing=mixing, stochastic_graphs="none", reasons={"stochastic_graphs": why, **(reasons or {})})


def coordinatewise_round(topology: Topology, name: str, info: AlgorithmInfo, rule: Any):
    """A round that replaces every coordinate of x_i by ``rule`` of its neighbourhood's values.

    ``rule(ranked, count, leaf)`` gets ``ranked`` [N, K, ...] (ascending, padding +inf last) and
    ``count`` [N] (the neighbourhood size m_i, self included) and returns the new leaf [N, ...].
    The gather materialises ``[N, K, ...]`` per leaf: a coordinate-wise rule needs all values of a
    coordinate at once.
    """
    check_graph(name, info, topology)
    check_fixed_graph(topology, name)

    def round_fn(params, state, received, key):
        del key
        t = state.count
        count = jnp.sum(received.mask, axis=1)
        leaves, treedef = jax.tree_util.tree_flatten(params)
        sources = jax.tree_util.tree_leaves(received.source)
        new = [
            rule(_sorted_neighbourhood(received, src, leaf), count, leaf).astype(leaf.dtype)
            for src, leaf in zip(sources, leaves)
        ]
        info = StepInfo(bits=model_bits(topology, params, t))
        return jax.tree_util.tree_unflatten(treedef, new), CountState(count=t + 1), info

    return round_fn
