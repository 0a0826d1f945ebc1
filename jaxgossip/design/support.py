"""The undirected support of a graph and the classical symmetric weightings on it.

A symmetric weighting of an undirected graph with M edges ``{u_l, v_l}`` is a vector ``w`` [M]:

.. math::  W = I - L(w), \\qquad L(w) = \\sum_l w_l (e_{u_l} - e_{v_l})(e_{u_l} - e_{v_l})^T

so ``W`` is symmetric with rows and columns summing to 1 whatever ``w`` is, and ``W_ii = 1 -
sum_{l ∋ i} w_l``. Its speed is the SLEM (second-largest eigenvalue magnitude), ``||W - J||_2``
with ``J = 11^T / N``; the spectral gap is ``1 - SLEM``.

Host-side NumPy: the tables of a :class:`~jaxgossip.topology.Topology` are read once, the design
methods then work on ``edges [M, 2]`` and ``w [M]``.

References:
  Boyd, Diaconis, Xiao, "Fastest mixing Markov chain on a graph", SIAM Review 46(4), 2004
  (max-degree and Metropolis-Hastings chains).
  Xiao, Boyd, "Fast linear iterations for distributed averaging", Systems & Control Letters 53,
  2004 (best constant edge weight).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import scipy.sparse
import scipy.sparse.csgraph
import scipy.sparse.linalg

from jaxgossip.topology import Topology

__all__ = [
    "undirected_edges",
    "laplacian",
    "mixing_matrix",
    "slem",
    "max_degree_weights",
    "metropolis_edge_weights",
    "best_constant_weights",
    "weighted_topology",
    "symmetric_weights",
    "topology_slem",
]


def undirected_edges(topology: Topology, what: str = "a symmetric design") -> np.ndarray:
    """The undirected support of a fixed, static graph: ``edges [M, 2]`` int64, ``u < v``, sorted.

    The support is the set of pairs with a non-zero weight off the diagonal; the weights
    themselves are not used.

    Raises:
      TypeError: not a :class:`Topology`.
      ValueError: a stochastic, time-varying, stacked or traced graph; NaN or inf weights; a pair
        linked one way only (a directed support); a disconnected support; fewer than 2 nodes.
    """
    if not isinstance(topology, Topology):
        raise TypeError(f"{what} needs a jaxgossip Topology, got {type(topology).__name__}")
    if topology.stochastic:
        raise ValueError(f"{what} needs a fixed graph; {topology.name} is drawn anew every round")
    if topology.num_graphs is not None:
        raise ValueError(f"{what} needs one graph; {topology.name} is a stack of {topology.num_graphs}")
    if not topology.host_tables:
        raise ValueError(f"{what} needs a graph built on the host; {topology.name} has traced tables")
    if topology.period != 1:
        raise ValueError(f"{what} needs a static graph; {topology.name} has period {topology.period}")
    n = topology.num_nodes
    if n < 2:
        raise ValueError(f"{what} needs at least 2 nodes; {topology.name} has {n}")
    s, r, w = topology.senders[0], topology.receivers[0], np.asarray(topology.weights[0], np.float64)
    if not np.all(np.isfinite(w)):
        raise ValueError(f"{topology.name} has NaN or inf weights; its support is undefined")
    keep = (w != 0) & (s != r)
    forward = set(zip(r[keep].tolist(), s[keep].tolist()))
    one_way = sorted((a, b) for a, b in forward if (b, a) not in forward)
    if one_way:
        a, b = one_way[0]
        raise ValueError(
            f"{what} needs an undirected support; {topology.name} is directed: node {a} receives from "
            f"{b} but {b} does not receive from {a} ({len(one_way)} one-way links)"
        )
    pairs = np.array(sorted({(min(a, b), max(a, b)) for a, b in forward}), dtype=np.int64).reshape(-1, 2)
    adj = scipy.sparse.coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    count, _ = scipy.sparse.csgraph.connected_components(adj, directed=False)
    if count > 1:
        raise ValueError(
            f"{what} needs a connected support; {topology.name} has {count} connected components, "
            "so no weighting can reach consensus"
        )
    return pairs


def laplacian(edges: np.ndarray, w: np.ndarray, num_nodes: int) -> np.ndarray:
    """``L(w)`` [N, N] of edge weights ``w`` [M] on ``edges`` [M, 2]."""
    u, v = edges[:, 0], edges[:, 1]
    lap = np.zeros((num_nodes, num_nodes))
    np.add.at(lap, (u, v), -w)
    np.add.at(lap, (v, u), -w)
    np.add.at(lap, (u, u), w)
    np.add.at(lap, (v, v), w)
    return lap


def mixing_matrix(edges: np.ndarray, w: np.ndarray, num_nodes: int) -> np.ndarray:
    """``W = I - L(w)`` [N, N]."""
    return np.eye(num_nodes) - laplacian(edges, w, num_nodes)


def slem(matrix: np.ndarray) -> float:
    """``||W - J||_2`` of a symmetric ``W`` [N, N] with ``W 1 = 1``: its second-largest eigenvalue
    magnitude (dense ``eigvalsh``)."""
    n = matrix.shape[0]
    return float(np.max(np.abs(np.linalg.eigvalsh(matrix - 1.0 / n))))


def _degrees(edges: np.ndarray, num_nodes: int) -> np.ndarray:
    return np.bincount(edges.ravel(), minlength=num_nodes)


def max_degree_weights(edges: np.ndarray, num_nodes: int) -> np.ndarray:
    """The max-degree chain: ``w_l = 1 / d_max`` on every edge (Boyd, Diaconis, Xiao 2004). On a
    regular bipartite graph its W has the eigenvalue -1 (SLEM 1)."""
    return np.full(len(edges), 1.0 / _degrees(edges, num_nodes).max())


def metropolis_edge_weights(edges: np.ndarray, num_nodes: int) -> np.ndarray:
    """Metropolis-Hastings weights ``w_l = 1 / (1 + max(d_u, d_v))`` (the library's default for
    irregular undirected graphs)."""
    deg = _degrees(edges, num_nodes)
    return 1.0 / (1.0 + np.maximum(deg[edges[:, 0]], deg[edges[:, 1]]))


def best_constant_weights(edges: np.ndarray, num_nodes: int) -> np.ndarray:
    """The best constant edge weight ``alpha* = 2 / (lambda_1(L) + lambda_{N-1}(L))`` on every edge
    (Xiao and Boyd 2004), with ``L`` the unweighted Laplacian. Some ``W_ii`` may be negative."""
    lam = np.linalg.eigvalsh(laplacian(edges, np.ones(len(edges)), num_nodes))
    return np.full(len(edges), 2.0 / (lam[-1] + lam[1]))


def weighted_topology(edges: np.ndarray, w: np.ndarray, num_nodes: int, name: str, kernel: str = "auto") -> Topology:
    """The :class:`Topology` of ``W = I - L(w)``: both directions of every edge with weight ``w_l``
    and a self-loop ``1 - sum_{l ∋ i} w_l`` on every node (kept even where it is 0, so that the
    support and the slot table stay those of the graph)."""
    u, v = edges[:, 0], edges[:, 1]
    nodes = np.arange(num_nodes)
    diag = 1.0 - np.bincount(u, w, num_nodes) - np.bincount(v, w, num_nodes)
    senders = np.concatenate([nodes, v, u]).astype(np.int32)
    receivers = np.concatenate([nodes, u, v]).astype(np.int32)
    weights = np.concatenate([diag, w, w]).astype(np.float64)
    return Topology(name, num_nodes, senders[None], receivers[None], weights[None], directed=False, kernel=kernel)


def symmetric_weights(edges: np.ndarray, w, num_nodes: int):
    """The weights table [1, N + 2M] of ``W = I - L(w)`` in the edge order of
    :func:`weighted_topology` (self-loops, then ``v -> u``, then ``u -> v``), from edge weights
    ``w`` [M] that may be traced: ``weighted_topology(edges, w0, N).with_weights(
    symmetric_weights(edges, w, N))`` is the graph of ``w`` as a differentiable function of it."""
    w = jnp.asarray(w)
    degree = jnp.zeros(num_nodes, w.dtype).at[edges[:, 0]].add(w).at[edges[:, 1]].add(w)
    return jnp.concatenate([1.0 - degree, w, w])[None]


def topology_slem(topology: Topology, dense_up_to: int = 512) -> float:
    """``||W - J||_2`` of a static symmetric doubly stochastic graph: dense ``eigvalsh`` up to
    ``dense_up_to`` nodes, above it Lanczos (``scipy.sparse.linalg.eigsh``, largest and smallest) on
    the sparse W with the mean removed, O(E) per iteration and no [N, N] matrix."""
    n = topology.num_nodes
    if n <= dense_up_to:
        return slem(topology.matrix())
    w = scipy.sparse.csr_matrix(
        (np.asarray(topology.weights[0], np.float64), (topology.receivers[0], topology.senders[0])), shape=(n, n)
    )

    def centred(x):
        y = w @ x
        return y - y.mean(axis=0)

    operator = scipy.sparse.linalg.LinearOperator((n, n), matvec=centred, dtype=np.float64)
    start = np.random.default_rng(0).normal(size=n)
    # the two ends separately: with "LM" a pair of extreme eigenvalues of equal magnitude and
    # opposite signs (as at a designed optimum) measured no convergence in 10,000 iterations
    ends = [
        scipy.sparse.linalg.eigsh(operator, k=1, which=which, v0=start - start.mean(), tol=1e-12)[0][0]
        for which in ("LA", "SA")
    ]
    return float(max(abs(e) for e in ends))
