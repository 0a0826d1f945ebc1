"""Spectral tools: how fast a graph's mixing averages, and the relaxation that balances it."""

from __future__ import annotations

import numpy as np

from jaxgossip.topology.graph import Topology

__all__ = ["spectral_gap", "optimal_gamma"]

_TOL = 1e-6


def spectral_gap(topo: Topology) -> float:
    """``1 - |lambda_2(W)|``, with ``|lambda_2|`` the second-largest eigenvalue magnitude.

    This is the Koloskova et al. (ICML 2019) convention delta (docs/algorithms.md, section
    topologies and spectral tools). For a time-varying topology the per-round gap of one period is returned,
    ``1 - |lambda_2(W(T-1) ... W(0))|^(1/T)``, which is 1 when a period averages exactly.

    For a stochastic graph (:mod:`jaxgossip.topology.stochastic`) it is the expected per-round gap
    ``1 - sqrt(lambda_2(E[W^T W]))``, the rate at which ``E ||x - mean||^2`` contracts per round
    (Boyd et al., 2006), with ``E[W^T W]`` estimated by Monte Carlo over 512 rounds drawn with the
    fixed key ``jax.random.key(0)`` (:func:`jaxgossip.topology.stochastic.expected_gram`), so the
    value is reproducible. For a static symmetric W this formula gives back ``1 - |lambda_2(W)|``.

    Raises:
      ValueError: if W is not doubly stochastic (the gap then does not measure convergence to the
        average; push-sum graphs need the debiased analysis instead).
    """
    if not topo.is_doubly_stochastic:
        raise ValueError(f"spectral_gap needs doubly stochastic weights; {topo.name} is not")
    if topo.stochastic:
        from jaxgossip.topology.stochastic import expected_gram

        lam = np.sort(np.linalg.eigvalsh(expected_gram(topo)))[::-1]
        lam2 = max(float(lam[1]), 0.0) if lam.size > 1 else 0.0
        return float(1.0 - np.sqrt(lam2))
    prod = np.eye(topo.num_nodes)
    for t in range(topo.period):
        prod = topo.matrix(t) @ prod
    mags = np.sort(np.abs(np.linalg.eigvals(prod)))[::-1]
    lam2 = mags[1] if mags.size > 1 else 0.0
    # A period that averages exactly leaves |lambda_2| at rounding level; its 1/T-th root would
    # inflate 1e-16 to ~1e-5.
    lam2 = 0.0 if lam2 < 1e-12 else lam2
    return float(1.0 - lam2 ** (1.0 / topo.period))


def optimal_gamma(topo: Topology) -> float:
    """Over-relaxation ``gamma* = 2 / ((1 - lambda_2) + (1 - lambda_N))`` for ``I + gamma (W - I)``.

    Balances the two extreme non-unit eigenvalues of a static symmetric W (8-ring: 1.3084;
    docs/algorithms.md, section topologies and spectral tools).

    Raises:
      ValueError: for time-varying or non-symmetric W.
    """
    if topo.time_varying:
        if topo.stochastic:
            raise ValueError(f"optimal_gamma needs a static topology; {topo.name} is drawn anew every round")
        raise ValueError(f"optimal_gamma needs a static topology; {topo.name} has period {topo.period}")
    w = topo.matrix(0)
    if not np.allclose(w, w.T, atol=_TOL):
        raise ValueError(f"optimal_gamma needs a symmetric W; {topo.name} is not symmetric")
    lam = np.sort(np.linalg.eigvalsh(w))[::-1]
    return float(2.0 / ((1.0 - lam[1]) + (1.0 - lam[-1])))
