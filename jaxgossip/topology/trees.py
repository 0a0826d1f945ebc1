"""Sparse undirected graphs with bottlenecks: chain, binary tree, BFS spanning trees, the dumbbell.

All carry Metropolis-Hastings weights ``W_ij = 1 / (1 + max(d_i, d_j))`` on their edges and the
rest on the diagonal (symmetric, doubly stochastic), as the irregular graphs of
:mod:`~jaxgossip.topology.constructors` do. The trees are the graphs of RelaySum / RelaySGD
(Vogels et al., NeurIPS 2021), the dumbbell the hard case of the Byzantine-robust gossip papers
(He, Karimireddy, Jaggi 2022) and of "Beyond spectral gap" (Vogels et al., NeurIPS 2022).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse
import scipy.sparse.csgraph

from jaxgossip.checks import check_int
from jaxgossip.topology.constructors import from_edges, from_matrix, metropolis_weights
from jaxgossip.topology.edges import bincount
from jaxgossip.topology.graph import Topology

__all__ = ["chain", "binary_tree", "spanning_tree", "dumbbell"]


def _from_undirected_edges(n: int, a: np.ndarray, b: np.ndarray, name: str) -> Topology:
    """Metropolis-Hastings weights on the undirected edges {a_e, b_e} (no duplicates), built from
    the edge list (no [N, N] matrix, so trees of 16,384 nodes build in well under a second)."""
    return from_edges(name, n, _undirected_round(n, a, b), directed=False)


def _undirected_round(n: int, a: np.ndarray, b: np.ndarray):
    """The one round of :func:`_from_undirected_edges`, yielded: from_edges takes it and the
    arrays made on the way are gone before the graph's layout is built."""
    # Node ids in the tables' int32 (int64 beyond it): half the bytes of every index array.
    index = np.int32 if 2 * n < 2**31 else np.int64
    a, b = np.asarray(a, index), np.asarray(b, index)
    ends = np.concatenate([a, b])
    deg = bincount(ends, n)
    w = 1.0 / (1.0 + np.maximum(deg[a], deg[b]))
    kept = 1.0 - bincount(ends, n, np.concatenate([w, w]))
    nodes = np.arange(n, dtype=index)
    del ends, deg
    yield np.concatenate([nodes, a, b]), np.concatenate([nodes, b, a]), np.concatenate([kept, w, w])


def chain(n: int) -> Topology:
    """Path 0 - 1 - ... - (N-1); Metropolis-Hastings weights (1/3 inside, 2/3 kept at the ends).

    Args:
      n: number of nodes N >= 2.
    """
    n = check_int("n", n, 2)
    nodes = np.arange(n - 1)
    return _from_undirected_edges(n, nodes, nodes + 1, f"chain({n})")


def binary_tree(n: int) -> Topology:
    """Binary tree: node 0 hangs under node 1, and node i >= 2 under node i // 2.

    So node 1 is the root with children 0, 2, 3 and node i >= 2 has children 2i and 2i + 1 (those
    < N): the numbering of the RelaySGD code (epfml/relaysgd, ``BinaryTreeTopology``). N - 1
    edges, depth about log2 N, degrees at most 3; Metropolis-Hastings weights.

    Args:
      n: number of nodes N >= 2.

    References:
      Vogels, He, Koloskova, Lin, Karimireddy, Stich, Jaggi, "RelaySum for Decentralized Deep
      Learning on Heterogeneous Data", NeurIPS 2021 (arXiv:2110.04175).
    """
    n = check_int("n", n, 2)
    child = np.arange(n)
    parent = np.where(child == 0, 1, child // 2)
    keep = child != 1
    return _from_undirected_edges(n, child[keep], parent[keep], f"binary_tree({n})")


def dumbbell(n: int) -> Topology:
    """Two cliques, nodes ``0 .. N//2 - 1`` and ``N//2 .. N-1``, joined by the one edge 0 - N//2.

    The bridge is the bottleneck: a spectral gap of order 1/N^2 however dense the cliques.
    Metropolis-Hastings weights.

    Args:
      n: number of nodes N >= 4 (two nodes per clique at least).

    References:
      He, Karimireddy, Jaggi, "Byzantine-Robust Decentralized Learning via ClippedGossip", 2022
      (arXiv:2202.01545); Vogels, Hendrikx, Jaggi, "Beyond spectral gap", NeurIPS 2022
      (arXiv:2206.03093), "two cliques".
    """
    n = check_int("n", n, 4)
    half = n // 2
    adj = np.zeros((n, n))
    adj[:half, :half] = 1
    adj[half:, half:] = 1
    adj[0, half] = adj[half, 0] = 1
    np.fill_diagonal(adj, 0)
    return from_matrix(metropolis_weights(adj), name=f"dumbbell({n})", directed=False)


def spanning_tree(topology: Topology, root: int = 0) -> Topology:
    """The breadth-first spanning tree of a graph, rooted at ``root``; Metropolis-Hastings weights.

    BFS visits the neighbours of each node in increasing order, so each node hangs under its
    smallest-numbered neighbour one level up. The edges are those of the union of the graph's
    rounds, direction ignored (a tree is undirected), so a time-varying schedule gives the tree of
    its union graph.

    Args:
      topology: a graph with host tables (static or a schedule); not a stochastic graph.
      root: the node the BFS starts from.

    Raises:
      ValueError: for a stochastic graph (it has no fixed edges) or a disconnected union graph.
    """
    if not isinstance(topology, Topology):
        raise TypeError(f"spanning_tree needs a jaxgossip Topology, got {type(topology).__name__}")
    if topology.stochastic:
        raise ValueError(f"spanning_tree needs a graph with fixed edges; {topology.name} draws new edges every round")
    if not topology.host_tables or topology.num_graphs is not None:
        raise TypeError("spanning_tree needs a graph built on the host (not a stack or a stack member)")
    n = topology.num_nodes
    root = check_int("root", root, 0)
    if root >= n:
        raise ValueError(f"root={root} is out of range for N={n} nodes")
    real = (topology.weights != 0) & (topology.senders != topology.receivers)
    s, r = topology.senders[real], topology.receivers[real]
    links = scipy.sparse.coo_matrix((np.ones(s.size), (s, r)), shape=(n, n)).tocsr()
    links = scipy.sparse.csr_matrix(((links + links.T) > 0).astype(np.float64))
    links.sort_indices()  # BFS then visits neighbours in increasing order
    order, parent = scipy.sparse.csgraph.breadth_first_order(links, root, directed=False)
    if order.size != n:
        raise ValueError(
            f"spanning_tree: {topology.name} is not connected (BFS from node {root} reaches {order.size} of {n} nodes)"
        )
    child = np.delete(np.arange(n), root)
    return _from_undirected_edges(n, child, parent[child], f"spanning_tree({topology.name})")
