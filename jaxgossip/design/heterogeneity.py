"""Data-aware sparse topologies: a doubly stochastic W of in-degree at most d whose neighbourhoods
see the global label distribution.

For label skew with C classes, node i holds the class proportions ``Pi[i]`` (a row of ``Pi``
[N, C]) and the network the mean ``pi_bar = Pi^T 1 / N``. D-SGD's rate depends on the
*neighbourhood heterogeneity* ``(1/N) ||W Pi - 1 pi_bar^T||_F^2``: how far each node's weighted
neighbourhood is from the global distribution. Learning W minimizes

.. math::  g(W) = \\frac{1}{N} \\| W \\Pi - 1 \\bar\\pi^T \\|_F^2
           + \\frac{\\lambda}{N} \\| W - 11^T/N \\|_F^2

over the doubly stochastic matrices (the Birkhoff polytope); the second term keeps W mixing (it is
the consensus part of the rate). Frank-Wolfe from ``W_0 = I``: the linear minimization oracle over
the polytope is a permutation matrix (a linear assignment on the gradient), and the step is the
exact line search of the quadratic. After d steps W is a convex combination of I and d
permutations, so every node receives from at most d others (and sends to at most d): the degree
budget is the iteration count.

Host-side NumPy: the design reads dense [N, N] matrices and solves an N x N assignment per step
(``scipy.optimize.linear_sum_assignment``, O(N^3)), meant for N up to a few thousand; the result is
an ordinary sparse :class:`~jaxgossip.topology.Topology`.

Reference: Le Bars, Bellet, Tommasi, Lavoie, Kermarrec, "Refined Convergence and Topology Learning
for Decentralized SGD with Heterogeneous Data", AISTATS 2023 (neighbourhood heterogeneity, STL-FW).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.optimize
import scipy.sparse
import scipy.sparse.csgraph

from jaxgossip.checks import check_int
from jaxgossip.topology import Topology, from_matrix

__all__ = ["LearnedTopology", "learn_topology", "neighbourhood_heterogeneity", "label_proportions"]


class LearnedTopology(NamedTuple):
    """A data-aware topology (:func:`learn_topology`).

    Attributes:
      topology: the learned graph and weights, a directed :class:`Topology` (W doubly stochastic).
      weights: W [N, N], ``W[i, j]`` what receiver i takes from j.
      heterogeneity: ``(1/N) ||W Pi - 1 pi_bar^T||_F^2`` of the learned W.
      objective: g(W_l) [d + 1] after each Frank-Wolfe step (l = 0 is the identity).
      max_in_degree: the largest number of other nodes a node receives from (<= d).
    """

    topology: Topology
    weights: np.ndarray
    heterogeneity: float
    objective: np.ndarray
    max_in_degree: int


def _check_proportions(proportions) -> np.ndarray:
    pi = np.asarray(proportions, dtype=np.float64)
    if pi.ndim != 2 or pi.shape[0] < 2 or pi.shape[1] < 1:
        raise ValueError(f"label proportions must be [N, C] with N >= 2 nodes and C >= 1 classes, got shape {pi.shape}")
    if not np.all(np.isfinite(pi)):
        raise ValueError("label proportions contain NaN or inf")
    if np.any(pi < 0):
        raise ValueError(f"label proportions must be >= 0, got a minimum of {pi.min():.3g}")
    sums = pi.sum(axis=1)
    if not np.allclose(sums, 1.0, atol=1e-6):
        bad = int(np.argmax(np.abs(sums - 1.0)))
        raise ValueError(f"label proportions of node {bad} sum to {sums[bad]:.6g}, not 1 (each row is a distribution)")
    return pi


def label_proportions(labels, node_of, num_nodes: int, num_classes: int | None = None) -> np.ndarray:
    """Pi [N, C]: the share of each class among node i's examples, from the examples' ``labels``
    [M] and their nodes ``node_of`` [M] (any partition). A node without examples is refused."""
    labels = np.asarray(labels).astype(np.int64).ravel()
    node_of = np.asarray(node_of).astype(np.int64).ravel()
    if labels.shape != node_of.shape:
        raise ValueError(f"labels {labels.shape} and node_of {node_of.shape} must have the same length")
    num_classes = int(labels.max()) + 1 if num_classes is None else num_classes
    counts = np.zeros((num_nodes, num_classes))
    np.add.at(counts, (node_of, labels), 1.0)
    empty = np.flatnonzero(counts.sum(axis=1) == 0)
    if empty.size:
        raise ValueError(f"node {int(empty[0])} holds no examples: its label distribution is undefined")
    return counts / counts.sum(axis=1, keepdims=True)


def neighbourhood_heterogeneity(weights, proportions) -> float:
    """``(1/N) ||W Pi - 1 pi_bar^T||_F^2`` for W [N, N] and Pi [N, C]."""
    w, pi = np.asarray(weights, dtype=np.float64), _check_proportions(proportions)
    gap = w @ pi - pi.mean(axis=0)
    return float(np.sum(gap * gap) / pi.shape[0])


def learn_topology(proportions, degree: int, lam: float = 0.1, name: str | None = None) -> LearnedTopology:
    """Sparse topology learning by Frank-Wolfe (module docstring): W of in-degree at most
    ``degree`` minimizing neighbourhood heterogeneity plus ``lam`` times the distance to the
    exact average.

    Args:
      proportions: Pi [N, C], node i's class distribution (:func:`label_proportions`).
      degree: d >= 1, the Frank-Wolfe steps and the bound on in- and out-degree.
      lam: lambda >= 0, the weight of the mixing term.
      name: display name of the topology.

    Raises:
      ValueError: bad proportions, degree < 1 or >= N, lam < 0 or not finite, or a learned graph
        that is not strongly connected (gossip would never mix across its parts: raise ``lam`` or
        ``degree``).
    """
    pi = _check_proportions(proportions)
    n = pi.shape[0]
    degree = check_int("degree", degree, 1, n - 1)
    if not (np.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam={lam!r} must be a finite number >= 0")
    target = pi.mean(axis=0)
    mean = np.full((n, n), 1.0 / n)

    def objective(w):
        gap = w @ pi - target
        return float((np.sum(gap * gap) + lam * np.sum((w - mean) ** 2)) / n)

    w = np.eye(n)
    history = [objective(w)]
    for _ in range(degree):
        gap = w @ pi - target
        grad = 2.0 / n * (gap @ pi.T + lam * (w - mean))
        rows, cols = scipy.optimize.linear_sum_assignment(grad)
        atom = np.zeros((n, n))
        atom[rows, cols] = 1.0
        direction = atom - w
        # Exact line search: g(w + s d) is a quadratic in s.
        slope = np.sum(gap * (direction @ pi)) + lam * np.sum((w - mean) * direction)
        curvature = np.sum((direction @ pi) ** 2) + lam * np.sum(direction * direction)
        step = 0.0 if curvature <= 0 else float(np.clip(-slope / curvature, 0.0, 1.0))
        w = w + step * direction
        history.append(objective(w))
    w[np.abs(w) < 1e-12] = 0.0
    off = (w != 0) & ~np.eye(n, dtype=bool)
    links = scipy.sparse.csr_matrix(off)
    parts, _ = scipy.sparse.csgraph.connected_components(links, directed=True, connection="strong")
    if parts > 1:
        raise ValueError(
            f"the learned graph (degree={degree}, lam={lam:g}) splits into {parts} parts that never exchange: "
            "raise lam (more weight on mixing) or degree"
        )
    topology = from_matrix(w, name=name or f"learned(d={degree}, lam={lam:g})", directed=True)
    return LearnedTopology(
        topology=topology,
        weights=w,
        heterogeneity=neighbourhood_heterogeneity(w, pi),
        objective=np.asarray(history),
        max_in_degree=int(off.sum(axis=1).max()),
    )
