"""The comparison tables of ``jaxgossip design``: a designed weighting next to the classical ones
of the same graph (Metropolis-Hastings, max-degree, best constant), or next to the graph's own
weights, with the numbers that say how fast each one averages.

For a fixed doubly stochastic graph of period P (P = 1: static):

* ``rate``: ``||W(P-1) ... W(0) - J||_2^{1/P}``, the worst start's contraction per round over a
  period; for a static symmetric W it is the SLEM, and ``1 - rate`` the spectral gap;
* ``curve[r]``: ``||W(r-1) ... W(0) - J||_F^2 / (N - 1)``, the squared consensus error after r
  rounds relative to its start, averaged over random starts (exact for N <= 512, else estimated
  with 64 Gaussian probes);
* ``rounds to 1e-6``: the first r with ``curve[r] <= 1e-6`` (None past the curve's end);
* ``effective neighbours``: :func:`jaxgossip.topology.effective_neighbors` at decay 0.99.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse

from jaxgossip.design import (
    best_constant_weights,
    max_degree_weights,
    metropolis_edge_weights,
    undirected_edges,
    weighted_topology,
)
from jaxgossip.topology import Topology, effective_neighbors

__all__ = ["classical_weightings", "consensus_curve", "rate", "weighting_row", "COLUMNS"]

# Up to this N the curve is the exact Frobenius error (X_0 = I); above it, Gaussian probes.
_EXACT_CURVE_NODES = 512
_PROBES = 64
_TARGET = 1e-6

COLUMNS = [
    ("weights", "weights", ""),
    ("objective", "objective", ".3e"),
    ("rate", "SLEM / rate", ".6f"),
    ("spectral_gap", "gap", ".6f"),
    ("effective_neighbors", "eff. neighbours", ".2f"),
    ("rounds_1e-6", "rounds to 1e-6", ""),
]


def classical_weightings(topology: Topology) -> dict[str, Topology]:
    """Metropolis, max-degree and best constant weights on a static undirected connected graph's
    support; empty for any other graph (they are symmetric weightings of one graph)."""
    try:
        edges = undirected_edges(topology)
    except ValueError:
        return {}
    n = topology.num_nodes
    return {
        label: weighted_topology(edges, rule(edges, n), n, f"{label}({topology.name})")
        for label, rule in (
            ("metropolis", metropolis_edge_weights),
            ("max-degree", max_degree_weights),
            ("best constant", best_constant_weights),
        )
    }


def _sparse_rounds(topology: Topology) -> list:
    n = topology.num_nodes
    return [
        scipy.sparse.csr_matrix(
            (np.asarray(topology.weights[t], np.float64), (topology.receivers[t], topology.senders[t])), shape=(n, n)
        )
        for t in range(topology.period)
    ]


def consensus_curve(topology: Topology, max_rounds: int, seed: int = 0) -> np.ndarray:
    """[max_rounds + 1] relative squared consensus error after r rounds (module docstring)."""
    n = topology.num_nodes
    rounds = _sparse_rounds(topology)
    if n <= _EXACT_CURVE_NODES:
        x = np.eye(n) - 1.0 / n
    else:
        z = np.random.default_rng(seed).normal(size=(n, _PROBES))
        x = (z - z.mean(axis=0)) * np.sqrt((n - 1) / np.sum((z - z.mean(axis=0)) ** 2))
    start = float(np.sum(x * x))
    curve = [1.0]
    for r in range(max_rounds):
        x = rounds[r % len(rounds)] @ x
        x -= x.mean(axis=0)  # rounding drift of the mean; the weights are doubly stochastic
        curve.append(float(np.sum(x * x)) / start)
    return np.asarray(curve)


def rate(topology: Topology) -> float:
    """``||W(P-1) ... W(0) - J||_2^{1/P}`` (dense; N up to a few thousand)."""
    n = topology.num_nodes
    product = np.eye(n)
    for t in range(topology.period):
        product = topology.matrix(t) @ product
    return float(np.linalg.norm(product - 1.0 / n, 2) ** (1.0 / topology.period))


def weighting_row(label: str, topology: Topology, objective: float | None, curve: np.ndarray) -> dict:
    """One table row (:data:`COLUMNS`) of a weighting."""
    contraction = rate(topology)
    reached = np.flatnonzero(curve <= _TARGET)
    try:
        neighbours = float(effective_neighbors(topology, 0.99))
    except ValueError:
        neighbours = None
    return {
        "weights": label,
        "objective": None if objective is None else float(objective),
        "rate": contraction,
        "spectral_gap": 1.0 - contraction,
        "effective_neighbors": neighbours,
        "rounds_1e-6": int(reached[0]) if reached.size else f"> {curve.size - 1}",
    }
