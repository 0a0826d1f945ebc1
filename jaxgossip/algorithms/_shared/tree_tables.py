"""Directed-edge tables of an undirected tree, for algorithms that relay messages along it (RelaySum).

A tree on N nodes has N - 1 undirected edges, so E = 2 (N - 1) directed edges ``src -> dst``. The
tables are host NumPy arrays built once at construction (not jittable, like every graph table):

* ``src``, ``dst`` [E]: the directed edges, sorted by receiver (``dst``) so that a per-receiver
  ``jax.ops.segment_sum`` runs on sorted segment ids;
* ``rev`` [E]: the index of the reverse edge ``dst -> src``;
* ``distance`` [N, N]: tree distances (hops), for references and the delay tables of the docs.

The relay: every node sends one message to each tree neighbour per round, its own value plus the
sum of what its *other* neighbours sent it the round before. Along a tree each value then reaches
every node exactly once, over the unique path between them, so node i sums the values of all nodes,
that of node j delayed by the tree distance. A count travels with each message (how many nodes'
values it sums), so a node knows how many values have reached it and stands in for the others.

:func:`require_tree` is the graph requirement ``GraphNeeds.tree``: it names the cycle, the
disconnection or the missing reverse edge of a graph that is not an undirected tree. :func:`relay`
is one RelaySum round on these tables (Vogels et al., NeurIPS 2021, arXiv:2110.04175).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np
import scipy.sparse
import scipy.sparse.csgraph

from jaxgossip.ops.mixing import leaf_bits
from jaxgossip.topology import Topology
from jaxgossip.types import Array, Params

__all__ = [
    "TreeTables",
    "tree_tables",
    "require_tree",
    "Relayed",
    "relay",
    "segment_to_receivers",
    "edge_zeros",
    "relay_bits",
    "COUNT_BITS",
    "RELAY_GRAPH_REASONS",
    "RELAY_RECEIVE_REASONS",
]

COUNT_BITS = 32  # the count sent with each relayed message, an int32

_SHOW = 12  # nodes of a cycle or a component named in an error message


class TreeTables(NamedTuple):
    """The directed edges of a tree (NumPy, host side)."""

    src: np.ndarray  # [E] int32, sender of each directed edge, E = 2 (N - 1)
    dst: np.ndarray  # [E] int32, receiver (sorted ascending)
    rev: np.ndarray  # [E] int32, index of the edge dst -> src
    distance: np.ndarray  # [N, N] int64, hops between nodes on the tree
    diameter: int  # the largest distance (hops)


def _links(topology: Topology) -> tuple[np.ndarray, np.ndarray]:
    """The directed links of round 0 with a nonzero weight, self-loops excluded (unique pairs)."""
    s, r, w = (np.asarray(a)[0] for a in (topology.senders, topology.receivers, topology.weights))
    keep = (w != 0) & (s != r)
    pairs = np.unique(np.stack([s[keep], r[keep]], axis=1).astype(np.int64), axis=0)
    return pairs[:, 0], pairs[:, 1]


def _shown(nodes: list[int]) -> str:
    if len(nodes) <= _SHOW:
        return ", ".join(map(str, nodes))
    return ", ".join(map(str, nodes[:_SHOW])) + f", ... ({len(nodes)} nodes)"


def require_tree(topology: Topology, algorithm: str) -> None:
    """Raises ValueError unless the static graph is an undirected tree (connected, N - 1 links).

    The message names the problem: a link without its reverse, the components of a disconnected
    graph, or one cycle (``nx.find_cycle``). Mixing weights are not read, only which links exist.
    """
    if not isinstance(topology, Topology):
        raise TypeError(f"{algorithm} needs a jaxgossip Topology, got {type(topology).__name__}")
    n = topology.num_nodes
    src, dst = _links(topology)
    forward = set(zip(src.tolist(), dst.tolist()))
    one_way = [(a, b) for a, b in forward if (b, a) not in forward]
    if one_way:
        a, b = min(one_way)
        raise ValueError(
            f"{algorithm} needs an undirected tree (every message is relayed both ways along each link); "
            f"{topology.name} is directed: the link {a} -> {b} has no reverse {b} -> {a}"
        )
    adj = scipy.sparse.coo_matrix((np.ones(src.size), (src, dst)), shape=(n, n)).tocsr()
    count, labels = scipy.sparse.csgraph.connected_components(adj, directed=False)
    if count > 1:
        parts = "; ".join("{" + _shown(np.flatnonzero(labels == c).tolist()) + "}" for c in range(min(count, 3)))
        more = f"; ... ({count} components)" if count > 3 else ""
        raise ValueError(
            f"{algorithm} needs a tree, which is connected; {topology.name} is not connected: it falls into "
            f"{count} components, {parts}{more}"
        )
    links = src.size // 2
    if links != n - 1:
        graph = nx.Graph()
        graph.add_edges_from(zip(src.tolist(), dst.tolist()))
        cycle = [int(a) for a, _ in nx.find_cycle(graph, source=int(src.min()))]
        path = "-".join(map(str, cycle[:_SHOW])) + ("-..." if len(cycle) > _SHOW else "") + f"-{cycle[0]}"
        raise ValueError(
            f"{algorithm} needs a tree (N - 1 = {n - 1} links, one path between any two nodes); "
            f"{topology.name} has {links} links and the cycle {path} (length {len(cycle)}). "
            "Use a tree: chain, binary_tree, or spanning_tree:SPEC of this graph"
        )


def tree_tables(topology: Topology, algorithm: str) -> TreeTables:
    """The directed-edge tables of a tree topology (checked with :func:`require_tree`)."""
    require_tree(topology, algorithm)
    n = topology.num_nodes
    src, dst = _links(topology)
    order = np.lexsort((src, dst))  # by receiver, then sender
    src, dst = src[order], dst[order]
    code = {(int(a), int(b)): e for e, (a, b) in enumerate(zip(src, dst))}
    rev = np.array([code[(int(b), int(a))] for a, b in zip(src, dst)], dtype=np.int32)
    adj = scipy.sparse.coo_matrix((np.ones(src.size), (src, dst)), shape=(n, n)).tocsr()
    distance = scipy.sparse.csgraph.shortest_path(adj, unweighted=True, directed=False).astype(np.int64)
    return TreeTables(
        src=src.astype(np.int32),
        dst=dst.astype(np.int32),
        rev=rev,
        distance=distance,
        diameter=int(distance.max()),
    )


class Relayed(NamedTuple):
    """One relay round (:func:`relay`): the new messages and counts and what reached each node."""

    messages: Params  # leaves [E, ...], this round's messages
    counts: Array  # [E] int32, this round's counts
    received: Params  # [N, ...] sum of this round's messages into each node
    heard_before: Array  # [N] int32, sum of the last round's counts into each node
    heard: Array  # [N] int32, sum of this round's counts into each node


def segment_to_receivers(values: Array, tables: TreeTables, n: int) -> Array:
    """Sums edge values ``[E, ...]`` into their receivers: ``[N, ...]``."""
    return jax.ops.segment_sum(values, tables.dst, num_segments=n, indices_are_sorted=True)


def relay(tables: TreeTables, n: int, payload: Params, messages: Params, counts: Array) -> Relayed:
    """One RelaySum round on the directed edges:
    ``m_{i->j} = v_i + sum_{k in N(i), k != j} m_{k->i}`` and ``c_{i->j} = 1 + sum_{k != j} c_{k->i}``.

    The sum over the other neighbours is the sum into i minus the reverse edge's message (one
    segment sum and two gathers per leaf: O(E) for any degree, where per-slot exclusion would cost
    O(N K) and K reaches N - 1 on a star)."""

    def edge(v, m):
        inbox = segment_to_receivers(m, tables, n)  # [N, ...]
        return v[tables.src] + inbox[tables.src] - m[tables.rev]

    new_messages = jax.tree_util.tree_map(edge, payload, messages)
    heard_before = segment_to_receivers(counts, tables, n)
    new_counts = 1 + heard_before[tables.src] - counts[tables.rev]
    received = jax.tree_util.tree_map(lambda m: segment_to_receivers(m, tables, n), new_messages)
    return Relayed(new_messages, new_counts, received, heard_before, segment_to_receivers(new_counts, tables, n))


def edge_zeros(params: Params, num_edges: int) -> Params:
    """Zero messages ``[E, ...]`` shaped like the leaves ``[N, ...]`` of ``params``."""
    return jax.tree_util.tree_map(lambda x: jnp.zeros((num_edges,) + x.shape[1:], x.dtype), params)


def relay_bits(topology: Topology, params: Params) -> Array:
    """[N] bits a node sends per round: one model-sized message and one count per tree neighbour."""
    degree = jnp.asarray(topology.out_degree[0], jnp.float32)
    return degree * float(leaf_bits(params) + COUNT_BITS)


#: Why the relay algorithms need the graphs their metadata says (``GraphNeeds.reasons``).
RELAY_GRAPH_REASONS = {
    "tree": "RelaySum relays every value along the unique path between two nodes; on a cycle a value "
    "would come back and be counted again",
    "time_varying": "its per-edge messages and counts belong to the fixed links of one tree",
    "stochastic_graphs": "a link that fails loses the relayed sums of a whole subtree",
    "stackable": "it builds the tree's directed-edge tables on the host",
}
#: Why the relay algorithms cannot be attacked (``TrainerHooks.reasons``).
RELAY_RECEIVE_REASONS = {
    "receive": "its messages are relayed sums over subtrees with counts, not a node's own model",
}
