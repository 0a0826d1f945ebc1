"""Spectral tools: how fast a graph's mixing averages, the relaxation that balances it, and the
effective number of neighbours of "Beyond spectral gap"."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxgossip.topology.convolution import group_modes
from jaxgossip.topology.graph import Topology
from jaxgossip.topology.random_spectra import GapEstimate

__all__ = [
    "spectral_gap",
    "gap_estimate",
    "GapEstimate",
    "optimal_gamma",
    "effective_neighbors",
    "neighbors_estimate",
    "NeighborsEstimate",
]

_TOL = 1e-6
# Largest N for the dense covariance of a graph that is not circulant ([N, N] float64 matrices).
_DENSE_LIMIT = 4096
# Fixed graphs up to this N take their spectral gap from dense eigenvalues; larger ones by Lanczos.
_EIGSH_FROM = 256
# How far past +-1 the shift-invert shifts sit: W - s I stays invertible on the ones vector too.
_SHIFT = 1e-14


def spectral_gap(topo: Topology) -> float:
    """``1 - |lambda_2(W)|``, with ``|lambda_2|`` the second-largest eigenvalue magnitude.

    This is the Koloskova et al. (ICML 2019) convention delta (docs/topologies.md, section
    topologies and spectral tools). For a time-varying topology the per-round gap of one period is returned,
    ``1 - |lambda_2(W(T-1) ... W(0))|^(1/T)``, which is 1 when a period averages exactly.

    For a stochastic graph (:mod:`jaxgossip.topology.stochastic`) it is the expected per-round gap
    ``1 - sqrt(lambda_2(E[W^T W]))``, the rate at which ``E ||x - mean||^2`` contracts per round
    (Boyd et al., 2006): exact where the sampler knows ``E[W^T W]`` in closed form
    (``random_matching``, failures of a static symmetric graph), else a reproducible sampled estimate
    (:func:`jaxgossip.topology.random_spectra.expected_gap`); :func:`gap_estimate` returns it with
    its standard error. For a static symmetric W this formula gives back ``1 - |lambda_2(W)|``.

    Raises:
      ValueError: if W is not doubly stochastic (the gap then does not measure convergence to the
        average; push-sum graphs need the debiased analysis instead).
    """
    return gap_estimate(topo).value


def gap_estimate(topo: Topology) -> GapEstimate:
    """:func:`spectral_gap` with its error bar, a :class:`GapEstimate` ``(value, stderr, exact)``.

    Fixed graphs are exact: rounds that are convolutions on a group (circulant: ring, exponential,
    one-peer exponential, ...; the torus; the hypercube) by the group's Fourier transform of node
    0's row in O(T N log N) (:mod:`jaxgossip.topology.convolution`); other graphs with N <= 256 by
    dense eigenvalues; larger ones by Lanczos/Arnoldi (``scipy.sparse.linalg``) on ``W - J`` (the
    period's product for a schedule) applied from the sparse tables, to about 1e-9, and static
    trees (or static symmetric graphs where Lanczos does not converge) by shift-invert Lanczos.
    Stochastic graphs:
    :func:`jaxgossip.topology.random_spectra.expected_gap` (exact for a closed form, else sampled with
    a standard error).

    Raises:
      ValueError: if W is not doubly stochastic.
    """
    if not topo.is_doubly_stochastic:
        raise ValueError(f"spectral_gap needs doubly stochastic weights; {topo.name} is not")
    if topo.stochastic:
        from jaxgossip.topology.random_spectra import expected_gap

        return expected_gap(topo)
    lam2 = _second_magnitude(topo)
    # A period that averages exactly leaves |lambda_2| at rounding level; its 1/T-th root would
    # inflate 1e-16 to ~1e-5.
    lam2 = 0.0 if lam2 < 1e-12 else lam2
    return GapEstimate(float(1.0 - lam2 ** (1.0 / topo.period)), 0.0, True)


def _sparse_round(topo: Topology, t: int):
    import scipy.sparse

    n = topo.num_nodes
    keep = topo.weights[t] != 0
    return scipy.sparse.csr_matrix(
        (topo.weights[t][keep], (topo.receivers[t][keep], topo.senders[t][keep])), shape=(n, n)
    )


def _second_magnitude(topo: Topology) -> float:
    """``|lambda_2|`` of the period's product ``Phi = W(T-1) ... W(0)`` of a doubly stochastic
    fixed graph. Doubly stochastic rounds commute with J, so ``Phi - J`` has Phi's eigenvalues
    with the 1 of the all-ones vector replaced by 0: its largest magnitude is ``|lambda_2|``."""
    n = topo.num_nodes
    if n == 1:
        return 0.0
    modes = _modes(topo)
    if modes is not None:  # the rounds share the group's characters: eigenvalues multiply per mode
        modes = np.prod(modes, axis=0)
        return float(np.max(np.abs(modes[1:])))
    if n <= _EIGSH_FROM:
        prod = np.eye(n)
        for t in range(topo.period):
            prod = topo.matrix(t) @ prod
        return float(np.sort(np.abs(np.linalg.eigvals(prod)))[::-1][1])
    import scipy.sparse.linalg

    rounds = [_sparse_round(topo, t) for t in range(topo.period)]

    def apply(x):
        x = np.asarray(x, dtype=np.float64).ravel()
        x = x - x.mean()  # (Phi - J) x = Phi (I - J) x
        for w in rounds:
            x = w @ x
        return x

    v0 = np.cos(np.arange(n) + 0.5)
    op = scipy.sparse.linalg.LinearOperator((n, n), matvec=apply, dtype=np.float64)
    if topo.period == 1 and topo.is_symmetric:
        w = rounds[0]
        links = (w.nnz - np.count_nonzero(w.diagonal())) // 2
        if links < n:  # a tree (a chain, a binary tree, a star): its LU has no fill
            return _shift_invert_magnitude(w, v0)
        try:
            vals = scipy.sparse.linalg.eigsh(op, k=2, which="BE", v0=v0, tol=1e-12, return_eigenvectors=False)
        except scipy.sparse.linalg.ArpackNoConvergence:
            return _shift_invert_magnitude(w, v0)
    else:
        vals = scipy.sparse.linalg.eigs(op, k=2, which="LM", v0=v0, tol=1e-12, return_eigenvectors=False)
    return float(np.max(np.abs(vals)))


def _shift_invert_magnitude(w, v0: np.ndarray) -> float:
    """``max(lambda_2, -lambda_N)`` of a symmetric doubly stochastic sparse W by shift-invert
    Lanczos: the largest ``|mu|`` of ``(W - s I)^{-1}`` on the vectors orthogonal to 1 is
    ``1 / (lambda - s)`` at the eigenvalue nearest s, so ``s = 1 + d`` finds lambda_2 from one
    sparse LU (little fill on chains and trees, whose gaps of 1e-7 to 1e-12 leave plain Lanczos
    without convergence). lambda_N is bounded by Gershgorin's discs, ``lambda_N >= min_i (2 W_ii -
    1)`` for non-negative rows that sum to 1, and only computed (``s = -1 - d``) when that bound
    does not settle which end is larger."""
    import scipy.sparse
    import scipy.sparse.linalg

    n = w.shape[0]
    eye = scipy.sparse.identity(n, format="csc")

    def nearest(shift):
        lu = scipy.sparse.linalg.splu((w - shift * eye).tocsc())

        def apply(x):
            x = np.asarray(x, dtype=np.float64).ravel()
            y = lu.solve(x - x.mean())
            return y - y.mean()  # W - s I maps 1 to (1 - s) 1: the ones direction is projected out

        op = scipy.sparse.linalg.LinearOperator((n, n), matvec=apply, dtype=np.float64)
        mu = scipy.sparse.linalg.eigsh(op, k=1, which="LM", v0=v0, tol=1e-10, return_eigenvectors=False)[0]
        return shift + 1.0 / mu

    top = nearest(1.0 + _SHIFT)
    floor = 2.0 * w.diagonal().min() - 1.0
    if (w.data >= 0).all() and -floor <= abs(top):
        return float(abs(top))
    return float(max(abs(top), abs(nearest(-1.0 - _SHIFT))))


def optimal_gamma(topo: Topology) -> float:
    """Over-relaxation ``gamma* = 2 / ((1 - lambda_2) + (1 - lambda_N))`` for ``I + gamma (W - I)``.

    Balances the two extreme non-unit eigenvalues of a static symmetric W (8-ring: 1.3084;
    docs/topologies.md, section topologies and spectral tools).

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


def _modes(topo: Topology) -> np.ndarray | None:
    """:func:`jaxgossip.topology.convolution.group_modes` of a fixed graph's tables."""
    return group_modes(topo.senders, topo.receivers, topo.weights, topo.num_nodes)


def _projected_trace(topo: Topology, gamma: float, order: list[int]) -> float:
    """``tr((I - J) Sigma (I - J))`` at the periodic fixed point, Sigma taken after the rounds ``order``.

    Doubly stochastic rounds commute with J, so the mean direction decouples (it contributes
    ``1 / (1 - gamma)``) and the rest solves ``X = A X A^T + Q`` with ``A = gamma^(T/2) (Phi - J)``,
    ``Phi`` the period's product: summed by doubling (Smith's method), which converges at the rate
    ``(gamma^T |lambda_2(Phi)|^2)^(2^k)``, in one step for a period that averages exactly. The
    rounds are applied as sparse matrices.
    """
    import scipy.sparse

    n = topo.num_nodes
    noise, phi = np.zeros((n, n)), np.eye(n)
    for s in order:
        keep = topo.weights[s] != 0
        w = scipy.sparse.csr_matrix(
            (topo.weights[s][keep], (topo.receivers[s][keep], topo.senders[s][keep])), shape=(n, n)
        )
        # W (gamma N + I) W^T for a symmetric N, as W (W (gamma N + I))^T with sparse W on the left
        noise = np.asarray(w @ np.asarray(w @ (gamma * noise + np.eye(n))).T)
        phi = np.asarray(w @ phi)
    mean = np.full((n, n), 1.0 / n)
    proj = np.eye(n) - mean
    x = proj @ noise @ proj
    a = gamma ** (len(order) / 2) * (phi - mean)
    for _ in range(64):
        step = a @ x @ a.T
        x = x + step
        if np.trace(step) <= 1e-16 * np.trace(x):
            break
        a = a @ a
    return float(np.trace(x))


def effective_neighbors(topo: Topology, gamma: float = 0.99, t: int = 0) -> float:
    """The effective number of neighbours ``n_W(gamma)`` of "Beyond spectral gap" (Vogels et al.).

    Run the random walk ``x <- W(s) (sqrt(gamma) x + xi_s)`` with one scalar per node and fresh
    i.i.d. standard normal noise ``xi`` every round; its covariance ``Sigma`` settles (periodically,
    for a schedule) at the fixed point of ``Sigma <- W (gamma Sigma + I) W^T``. Then

    .. math::  n_W(\\gamma) = \\frac{1}{(1 - \\gamma)\\ \\tfrac1N \\operatorname{tr} \\Sigma}

    the number of workers whose noise a node averages: 1 alone (``W = I``), N with exact averaging
    (``W = J``), and, at fixed gamma, bounded in N for graphs that are sparse in the right way.
    ``gamma`` plays the role of the decay ``(1 - learning rate * curvature)^2`` of the paper's
    quadratic model: close to 1 it rewards graphs that average well over many rounds, small it
    rewards one round's averaging. For a static symmetric W with eigenvalues ``lambda_k``,
    ``tr Sigma = sum_k lambda_k^2 / (1 - gamma lambda_k^2)``; for circulant rounds (ring,
    exponential, one-peer exponential, EquiStatic, ...) the same per Fourier mode, in O(T N log N);
    other graphs solve the period's discrete Lyapunov equation densely (N <= 4096), by doubling on
    the vectors orthogonal to 1. Larger static symmetric graphs (a torus or a random graph of
    16,384 nodes) use the sampled estimate of :func:`neighbors_estimate` (its value; the function
    also gives the error bar).

    Args:
      topo: a fixed doubly stochastic graph (static or a schedule).
      gamma: the decay, in [0, 1).
      t: the round the covariance is taken before (after round t - 1; phase ``t mod T``): 0 means
        after whole periods, the convention of the authors' code.

    Raises:
      ValueError: for a stochastic graph, weights that are not doubly stochastic, gamma outside
        [0, 1), or a graph too large for the dense computation.

    References:
      Vogels, Hendrikx, Jaggi, "Beyond spectral gap: The role of the topology in decentralized
      learning", NeurIPS 2022 (arXiv:2206.03093); code epfml/topology-in-decentralized-learning.
    """
    return _effective_neighbors(topo, gamma, t, None)


def _effective_neighbors(topo: Topology, gamma: float, t: int, modes: np.ndarray | None) -> float:
    """:func:`effective_neighbors`, given the graph's :func:`_modes` when already computed (None:
    computed here)."""
    if topo.stochastic:
        raise ValueError(
            f"effective_neighbors needs a fixed graph; {topo.name} is drawn anew every round (its covariance "
            "depends on the distribution of W, not one sequence)"
        )
    if not topo.is_doubly_stochastic:
        raise ValueError(f"effective_neighbors needs doubly stochastic weights; {topo.name} is not")
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.floating)) or not 0.0 <= gamma < 1.0:
        raise ValueError(f"gamma={gamma!r} must be a decay in [0, 1)")
    gamma = float(gamma)
    n, period = topo.num_nodes, topo.period
    order = [(t + s) % period for s in range(period)]  # the rounds of one period ending before t
    modes = _modes(topo) if modes is None else modes
    if modes is not None:
        gain = np.abs(modes) ** 2  # [T, N] |lambda_k(W(t))|^2
        sigma, through = np.zeros(n), np.ones(n)
        for s in order:
            sigma, through = gain[s] * (gamma * sigma + 1.0), gain[s] * gamma * through
        trace = float(np.sum(sigma / (1.0 - through)))
    else:
        if n > _DENSE_LIMIT:
            if period == 1 and topo.is_symmetric:
                return neighbors_estimate(topo, gamma, sampled=True).value
            raise ValueError(
                f"effective_neighbors of {topo.name}: N={n} > {_DENSE_LIMIT} needs [N, N] dense matrices; "
                "beyond that only circulant and static symmetric graphs are computed"
            )
        if period == 1 and topo.is_symmetric:
            lam2 = np.linalg.eigvalsh(topo.matrix(0)) ** 2
            trace = float(np.sum(lam2 / (1.0 - gamma * lam2)))
        else:
            trace = 1.0 / (1.0 - gamma) + _projected_trace(topo, gamma, order)
    return float(n / ((1.0 - gamma) * trace))


class NeighborsEstimate(NamedTuple):
    """The effective number of neighbours with its error bar (:func:`neighbors_estimate`).

    Attributes:
      value: ``n_W(gamma)``.
      stderr: its standard error (0 when exact).
      exact: computed exactly (small or circulant graphs) rather than sampled.
    """

    value: float
    stderr: float
    exact: bool


def neighbors_estimate(
    topo: Topology, gamma: float = 0.99, num_probes: int = 64, seed: int = 0, sampled: bool | None = None
) -> NeighborsEstimate:
    r""":func:`effective_neighbors` with an error bar, matrix free for large static symmetric graphs.

    Exact (``stderr = 0``) wherever :func:`effective_neighbors` computes densely or per Fourier mode
    (N <= 4096, or circulant rounds). A static symmetric W beyond that uses Hutchinson's trace
    estimator: with the mean direction taken out exactly (it contributes ``1 / (1 - gamma)``),

    .. math::  \operatorname{tr} \Sigma - \tfrac{1}{1 - \gamma}
               = \mathbb E_z\, (W z)^T (I - \gamma W^2)^{-1} (W z),
               \qquad z = P \xi,\ \xi_i = \pm 1,

    ``P = I - J`` (so ``E[z z^T] = P``), averaged over ``num_probes`` probes drawn with
    ``numpy.random.default_rng(seed)``; each solve is a conjugate-gradient run on the sparse
    ``I - gamma W^2`` (eigenvalues in ``[1 - gamma, 1]``, so at most a few hundred iterations).
    The trace estimate is unbiased; ``n_W = N / ((1 - gamma) tr)`` and its error bar follow by the
    delta method.

    Args:
      topo: a fixed doubly stochastic graph.
      gamma: the decay, in [0, 1).
      num_probes: Hutchinson probes (sampled case), >= 2.
      seed: the probes' seed (sampled case).
      sampled: None picks (exact where possible); True samples a static symmetric graph of any
        size (to check the estimator against the exact value).

    Raises:
      ValueError: as :func:`effective_neighbors`, and for a graph beyond the dense limit that is
        neither circulant nor static symmetric.
    """
    n = topo.num_nodes
    if not sampled:
        modes = None if n <= _DENSE_LIMIT or topo.stochastic else _modes(topo)
        exact = n <= _DENSE_LIMIT or topo.stochastic or modes is not None
        if exact or topo.period != 1 or not topo.is_symmetric:  # the last two raise: no method
            return NeighborsEstimate(_effective_neighbors(topo, gamma, 0, modes), 0.0, True)
    elif topo.stochastic or topo.period != 1 or not topo.is_symmetric:
        raise ValueError(f"the sampled effective_neighbors needs a static symmetric graph; {topo.name} is not")
    if not topo.is_doubly_stochastic:
        raise ValueError(f"effective_neighbors needs doubly stochastic weights; {topo.name} is not")
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.floating)) or not 0.0 <= gamma < 1.0:
        raise ValueError(f"gamma={gamma!r} must be a decay in [0, 1)")
    if isinstance(num_probes, bool) or not isinstance(num_probes, (int, np.integer)) or num_probes < 2:
        raise ValueError(f"num_probes={num_probes!r} must be an int >= 2 (the error bar needs two)")
    gamma = float(gamma)
    w = _sparse_round(topo, 0)
    xi = np.random.default_rng(seed).choice([-1.0, 1.0], size=(n, int(num_probes)))
    v = w @ (xi - xi.mean(axis=0))  # [N, P] W z
    u = _block_cg(lambda y: y - gamma * (w @ (w @ y)), v)
    samples = np.einsum("np,np->p", v, u)  # [P] one trace sample per probe
    trace = 1.0 / (1.0 - gamma) + float(samples.mean())
    trace_err = float(samples.std(ddof=1) / np.sqrt(samples.size))
    value = n / ((1.0 - gamma) * trace)
    return NeighborsEstimate(float(value), float(value * trace_err / trace), False)


def _block_cg(apply, b: np.ndarray, tol: float = 1e-10, max_iter: int = 5000) -> np.ndarray:
    """Solves ``A X = B`` column by column by conjugate gradients, all columns at once (A SPD,
    given by ``apply``: [N, P] -> [N, P])."""
    x = np.zeros_like(b)
    r = b.copy()
    p = r.copy()
    rr = np.einsum("np,np->p", r, r)
    stop = tol**2 * np.maximum(rr, 1e-300)
    for _ in range(max_iter):
        if np.all(rr <= stop):
            return x
        ap = apply(p)
        alpha = rr / np.maximum(np.einsum("np,np->p", p, ap), 1e-300)
        x += alpha * p
        r -= alpha * ap
        new = np.einsum("np,np->p", r, r)
        p = r + (new / np.maximum(rr, 1e-300)) * p
        rr = new
    raise RuntimeError(f"conjugate gradients did not reach {tol} in {max_iter} iterations")
