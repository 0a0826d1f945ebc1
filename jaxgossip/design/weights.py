"""Symmetric mixing weights of least SLEM on a given graph: the fastest-mixing Markov chain and
the fastest distributed linear averaging iteration.

With ``W = I - L(w)`` on the graph's M undirected edges (:mod:`jaxgossip.design.support`), both
problems minimize the second-largest eigenvalue magnitude of W:

.. math::

   \\min_{w \\in \\mathbb{R}^M} \\; \\| I - L(w) - J \\|_2
   \\quad \\text{s.t.} \\quad w \\ge 0, \\; \\operatorname{diag} L(w) \\le 1
   \\quad \\text{(fastest mixing chain; FDLA drops both constraints)}

a convex problem. Written with the epigraph variable ``s``, the objective is an SDP in ``(w, s)``:
``-s I <= W - J <= s I``. This module solves it with the primal barrier method (Boyd and
Vandenberghe, Convex Optimization, 2004, ch. 11), written for its structure instead of a general
SDP solver:

* barrier ``phi(w, s) = -log det(s I - W + J) - log det(s I + W - J) - sum_l log w_l
  - sum_i log(1 - L_ii)`` (the two last terms only for the chain);
* each edge enters W as the rank-one term ``w_l a_l a_l^T``, ``a_l = e_u - e_v``, so with
  ``C = F^{-1}`` of each matrix inequality the Hessian entries are ``(a_k^T C a_l)^2`` and the
  gradient entries ``a_l^T C a_l``: one [N, N] inverse and one [M, M] Cholesky solve per Newton
  step, no [M, N^2] matrices;
* centering by Newton's method with a backtracking line search that keeps both matrices positive
  definite, then ``t <- mu t``; on the central path ``s - s* <= nu / t`` with ``nu`` the barrier
  parameter (2N matrix rows, plus M + N linear constraints for the chain), so the method stops
  with a certified bound on the distance to the optimum, not a heuristic stopping rule.

Why a barrier method and not a first-order one: the SLEM is non-smooth exactly at the optimum
(its extreme eigenvalues are typically multiple there), where subgradient methods crawl and
smoothed objectives trade accuracy for conditioning; Newton steps on the barrier converge in a few
hundred steps to 1e-8 and need no step-size tuning. The cost per step is ``O(N^3 + M^3)`` (dense
[N, N] inverses, [M, M] Newton system), which suits graphs up to a few hundred nodes.

References:
  Boyd, Diaconis, Xiao, "Fastest mixing Markov chain on a graph", SIAM Review 46(4), 2004.
  Xiao, Boyd, "Fast linear iterations for distributed averaging", Systems & Control Letters 53,
  2004.
  Boyd, Diaconis, Sun, Xiao, "Fastest mixing Markov chain on a path", American Mathematical
  Monthly 113(1), 2006: on the path of n nodes the optimum is ``w = 1/2``, SLEM ``cos(pi / n)``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.linalg
import scipy.linalg.lapack

from jaxgossip.checks import check_int, check_number
from jaxgossip.design.support import (
    best_constant_weights,
    max_degree_weights,
    metropolis_edge_weights,
    mixing_matrix,
    slem,
    topology_slem,
    undirected_edges,
    weighted_topology,
)
from jaxgossip.topology import Topology

__all__ = ["Design", "fastest_mixing"]

# Barrier growth per centering. The textbook's 10-20 left centerings unfinished on graphs whose
# optimum has many zero weights and multiple extreme eigenvalues (Erdos-Renyi, N = 64); 4 centres
# every time in 100-150 Newton steps in all.
_MU = 4.0
# Centering stops when half the squared Newton decrement is below this.
_CENTERED = 1e-10
# Newton steps per centering at most: near the float64 limit (t ~ 1e10) the decrement stalls at
# rounding level instead of falling below _CENTERED; the point is then as centred as it gets.
_STEPS_PER_CENTERING = 100
# A point counts as centred (its nu / t a valid bound up to a factor 1 + O(sqrt(decrement))) when
# the squared Newton decrement is below this.
_NEAR_CENTRE = 1e-6
# Armijo fraction and backtracking factor of the line search.
_ARMIJO, _BACKTRACK = 0.25, 0.5


class Design(NamedTuple):
    """A designed weighting of a graph, and the classical weightings of the same graph.

    Attributes:
      topology: the designed graph, an ordinary static :class:`~jaxgossip.topology.Topology`
        (symmetric, doubly stochastic; usable by every algorithm).
      edges: [M, 2] int64, the undirected edges ``u < v`` of the support.
      weights: [M] float64, the designed edge weights ``w`` (``W = I - L(w)``).
      slem: the designed W's second-largest eigenvalue magnitude ``||W - J||_2``.
      metropolis_slem, max_degree_slem, best_constant_slem: the SLEM of the Metropolis-Hastings,
        max-degree (``1 / d_max``) and best constant (``2 / (lambda_1(L) + lambda_{N-1}(L))``)
        weights on the same support.
      gap_bound: the method's certified bound on ``slem - optimum`` (``nu / t`` at the last
        centering; inf when that centering did not converge within ``max_steps``).
      history: [steps] float64, the SLEM after every Newton step (the objective during the design).
      nonnegative: whether the weights were constrained to a Markov chain (``w >= 0``,
        ``diag L <= 1``).
    """

    topology: Topology
    edges: np.ndarray
    weights: np.ndarray
    slem: float
    metropolis_slem: float
    max_degree_slem: float
    best_constant_slem: float
    gap_bound: float
    history: np.ndarray
    nonnegative: bool


class _Problem(NamedTuple):
    """What the barrier method needs about the graph (host constants)."""

    u: np.ndarray  # [M] first endpoint of each edge
    v: np.ndarray  # [M] second endpoint
    incidence: np.ndarray  # [N, M] |A|, 1 where node i is an endpoint of edge l
    num_nodes: int
    nonnegative: bool


class _Point(NamedTuple):
    """A strictly feasible point and its barrier's ingredients."""

    w: np.ndarray  # [M]
    s: float
    inv_upper: np.ndarray  # [N, N] (s I - W + J)^{-1}
    inv_lower: np.ndarray  # [N, N] (s I + W - J)^{-1}
    logdet: float  # log det of both matrices, summed
    slack: np.ndarray  # [N] 1 - L_ii (chain only; ones otherwise)


def _point(problem: _Problem, w: np.ndarray, s: float) -> _Point | None:
    """The point ``(w, s)`` with its inverses, or None when it is not strictly feasible."""
    n = problem.num_nodes
    if problem.nonnegative and np.any(w <= 0):
        return None
    slack = 1.0 - problem.incidence @ w if problem.nonnegative else np.ones(n)
    if np.any(slack <= 0):
        return None
    centred = np.eye(n) - _laplacian(problem, w) - 1.0 / n  # W - J
    inverses, logdet = [], 0.0
    for matrix in (s * np.eye(n) - centred, s * np.eye(n) + centred):
        try:
            factor = scipy.linalg.cho_factor(matrix, lower=True, check_finite=False)
        except np.linalg.LinAlgError:
            return None
        logdet += 2.0 * np.sum(np.log(np.diag(factor[0])))
        # the inverse from the factor (LAPACK potri): a third of the flops of solving against I
        inverse, info = scipy.linalg.lapack.dpotri(factor[0], lower=1)
        if info != 0:
            return None
        inverses.append(np.tril(inverse) + np.tril(inverse, -1).T)
    return _Point(w, float(s), inverses[0], inverses[1], float(logdet), slack)


def _laplacian(problem: _Problem, w: np.ndarray) -> np.ndarray:
    n, u, v = problem.num_nodes, problem.u, problem.v
    lap = np.zeros((n, n))
    np.add.at(lap, (u, v), -w)
    np.add.at(lap, (v, u), -w)
    lap[np.diag_indices(n)] = problem.incidence @ w
    return lap


def _iterate_slem(problem: _Problem, w: np.ndarray) -> float:
    """The SLEM of ``I - L(w)``: dense up to 256 nodes, Lanczos on the sparse matrix above (the
    dense eigen-solver would cost as much as a Newton step there)."""
    n = problem.num_nodes
    if n <= 256:
        return slem(np.eye(n) - _laplacian(problem, w))
    edges = np.stack([problem.u, problem.v], axis=1)
    return topology_slem(weighted_topology(edges, w, n, "iterate"), dense_up_to=0)


def _value(problem: _Problem, point: _Point, t: float) -> float:
    value = t * point.s - point.logdet
    if problem.nonnegative:
        value -= np.sum(np.log(point.w)) + np.sum(np.log(point.slack))
    return float(value)


def _newton_step(problem: _Problem, point: _Point, t: float) -> tuple[np.ndarray, np.ndarray]:
    """Gradient and Newton direction of ``t s + phi`` at ``point``, both [M + 1] (w, then s)."""
    u, v = problem.u, problem.v
    grad_w = np.zeros(len(u))
    hess_ww = np.zeros((len(u), len(u)))
    hess_ws = np.zeros(len(u))
    hess_ss = 0.0
    # d/dw_l of the upper matrix s I - W + J is +a a^T, of the lower one s I + W - J is -a a^T.
    for inverse, sign in ((point.inv_upper, 1.0), (point.inv_lower, -1.0)):
        c_a = inverse[:, u] - inverse[:, v]  # [N, M], C a_l
        gram = c_a[u] - c_a[v]  # [M, M], a_k^T C a_l
        grad_w -= sign * np.diag(gram)
        hess_ww += gram * gram
        hess_ws += sign * np.sum(c_a * c_a, axis=0)  # a_l^T C^2 a_l
        hess_ss += float(np.sum(inverse * inverse))  # tr C^2
    grad_s = t - np.trace(point.inv_upper) - np.trace(point.inv_lower)
    if problem.nonnegative:
        inc = problem.incidence
        grad_w += -1.0 / point.w + inc.T @ (1.0 / point.slack)
        hess_ww += np.diag(1.0 / point.w**2) + inc.T @ (inc / point.slack[:, None] ** 2)
    grad = np.concatenate([grad_w, [grad_s]])
    hess = np.block([[hess_ww, hess_ws[:, None]], [hess_ws[None, :], np.array([[hess_ss]])]])
    try:
        step = -scipy.linalg.cho_solve(scipy.linalg.cho_factor(hess, check_finite=False), grad, check_finite=False)
    except np.linalg.LinAlgError:  # rounding near the optimum; the least-squares step still descends
        step = -np.linalg.lstsq(hess, grad, rcond=None)[0]
    return grad, step


def _center(problem: _Problem, point: _Point, t: float, history: list, max_steps: int) -> tuple[_Point, int, float]:
    """Newton's method on ``t s + phi`` from a strictly feasible point; returns the centred point,
    the Newton steps taken (each one's SLEM appended to ``history``) and the last Newton
    decrement ``lambda^2``."""
    for steps in range(max_steps):
        grad, step = _newton_step(problem, point, t)
        decrement = -float(grad @ step)
        if decrement / 2.0 <= _CENTERED:
            return point, steps, decrement
        value, alpha = _value(problem, point, t), 1.0
        while alpha > 1e-12:
            trial = _point(problem, point.w + alpha * step[:-1], point.s + alpha * step[-1])
            if trial is not None and _value(problem, trial, t) <= value - _ARMIJO * alpha * decrement:
                break
            alpha *= _BACKTRACK
        else:  # no progress possible at this precision: the point is as centred as it gets
            return point, steps, decrement
        point = trial
        history.append(_iterate_slem(problem, point.w))
    grad, step = _newton_step(problem, point, t)
    return point, max_steps, -float(grad @ step)


def _barrier_method(problem: _Problem, w0: np.ndarray, tol: float, max_steps: int):
    """Minimizes the SLEM from the strictly feasible ``w0``; returns ``(w, gap_bound, history)``,
    ``gap_bound`` inf when the last centering did not converge (the bound ``nu / t`` holds on the
    central path only)."""
    n, m = problem.num_nodes, len(problem.u)
    nu = 2 * n + (m + n if problem.nonnegative else 0)
    s0 = slem(np.eye(n) - _laplacian(problem, w0)) + 0.1
    point = _point(problem, w0, s0)
    t = nu / s0
    history, used = [], 0
    while True:
        budget = min(_STEPS_PER_CENTERING, max_steps - used)
        point, steps, decrement = _center(problem, point, t, history, budget)
        used += steps
        centred = decrement <= _NEAR_CENTRE
        if (nu / t < tol and centred) or used >= max_steps:
            return point.w, (nu / t if centred else np.inf), np.asarray(history)
        t *= _MU


def fastest_mixing(
    topology: Topology, nonnegative: bool = True, tol: float = 1e-8, max_steps: int = 1000, kernel: str = "auto"
) -> Design:
    """Symmetric weights on a graph's edges that minimize the SLEM of ``W = I - L(w)``.

    ``nonnegative=True`` is the fastest-mixing Markov chain (Boyd, Diaconis, Xiao 2004): weights
    ``w >= 0`` with ``sum_{l ∋ i} w_l <= 1``, so W is a symmetric doubly stochastic matrix with
    non-negative entries. ``nonnegative=False`` is the fastest distributed linear averaging
    iteration (FDLA, Xiao and Boyd 2004): signed weights, W symmetric with rows and columns
    summing to 1 but possibly negative entries; its SLEM is never above the chain's.

    .. math::  \\min_w \\|I - L(w) - 11^T / N\\|_2, \\qquad L(w) = \\sum_l w_l a_l a_l^T

    Solved exactly by a structured primal barrier method (see the module docstring): the result
    is within ``gap_bound <= tol`` of the optimum. Cost per Newton step ``O(N^3 + M^3)``; a few
    hundred steps.

    Args:
      topology: a fixed, static graph with an undirected, connected support (the pairs with a
        non-zero weight; the weights themselves are ignored).
      nonnegative: True for the fastest-mixing chain, False for FDLA.
      tol: the certified bound on ``SLEM - optimum`` at which the method stops (> 0).
      max_steps: the most Newton steps in all (the method stops early with ``gap_bound`` above
        ``tol`` if it runs out).
      kernel: the mixing kernel of the returned topology (``"auto"``, ``"slots"``, ...).

    Returns:
      A :class:`Design`: the designed topology and weights, its SLEM and those of the Metropolis,
      max-degree and best constant weights on the same graph, the certified gap bound and the
      SLEM after every Newton step.

    Raises:
      TypeError: ``topology`` is not a Topology.
      ValueError: the graph is stochastic, time-varying, stacked or traced; its weights are not
        finite; its support is directed or disconnected; ``tol`` is not a positive number.

    References:
      Boyd, Diaconis, Xiao, SIAM Review 46(4), 2004; Xiao, Boyd, Systems & Control Letters 53,
      2004; Boyd and Vandenberghe, Convex Optimization, 2004, ch. 11.
    """
    if not isinstance(nonnegative, (bool, np.bool_)):
        raise TypeError(f"nonnegative={nonnegative!r} must be a bool")
    check_number("tol", tol, minimum=0.0, strict=True)
    max_steps = check_int("max_steps", max_steps, 1)
    what = "fastest_mixing" if nonnegative else "fastest_mixing(nonnegative=False)"
    edges = undirected_edges(topology, what)
    n = topology.num_nodes
    incidence = np.zeros((n, len(edges)))
    incidence[edges[:, 0], np.arange(len(edges))] = 1.0
    incidence[edges[:, 1], np.arange(len(edges))] = 1.0
    problem = _Problem(edges[:, 0], edges[:, 1], incidence, n, bool(nonnegative))
    deg = incidence.sum(axis=1)
    # Strictly inside the chain's constraints (w > 0, L_ii = d_i / (d_max + 1) < 1); also a fine
    # start for FDLA.
    w0 = np.full(len(edges), 1.0 / (deg.max() + 1.0))
    w, gap, history = _barrier_method(problem, w0, float(tol), max_steps)
    label = "fastest_mixing" if nonnegative else "fdla"
    designed = weighted_topology(edges, w, n, f"{label}({topology.name})", kernel=kernel)
    return Design(
        topology=designed,
        edges=edges,
        weights=w,
        slem=slem(mixing_matrix(edges, w, n)),
        metropolis_slem=_slem_of(edges, metropolis_edge_weights(edges, n), n),
        max_degree_slem=_slem_of(edges, max_degree_weights(edges, n), n),
        best_constant_slem=_slem_of(edges, best_constant_weights(edges, n), n),
        gap_bound=float(gap),
        history=history,
        nonnegative=bool(nonnegative),
    )


def _slem_of(edges: np.ndarray, w: np.ndarray, n: int) -> float:
    return slem(mixing_matrix(edges, w, n))
