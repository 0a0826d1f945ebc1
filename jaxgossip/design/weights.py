"""Symmetric mixing weights of least SLEM on a given graph: the fastest-mixing Markov chain and
the fastest distributed linear averaging iteration.

With ``W = I - L(w)`` on the graph's M undirected edges (:mod:`jaxgossip.design.support`), both
problems minimize the second-largest eigenvalue magnitude of W:

.. math::

   \\min_{w \\in \\mathbb{R}^M} \\; \\| I - L(w) - J \\|_2
   \\quad \\text{s.t.} \\quad w \\ge 0, \\; \\operatorname{diag} L(w) \\le 1
   \\quad \\text{(fastest mixing chain; FDLA drops both constraints)}

a convex problem. Written with the epigraph variable ``s``, the objective is an SDP in ``(w, s)``:
``-s I <= W - J <= s I``. This module solves it by interior-point methods written for its
structure instead of a general SDP solver: primal-dual steps along the central path, then the
primal barrier method (Boyd and Vandenberghe, Convex Optimization, 2004, ch. 11) at its end:

* barrier ``phi(w, s) = -log det(s I - W + J) - log det(s I + W - J) - sum_l log w_l
  - sum_i log(1 - L_ii)`` (the two last terms only for the chain);
* each edge enters W as the rank-one term ``w_l a_l a_l^T``, ``a_l = e_u - e_v``, so with
  ``C = F^{-1}`` of each matrix inequality the Hessian entries are ``(a_k^T C a_l)^2`` and the
  gradient entries ``a_l^T C a_l``: no [M, N^2] matrices;
* Mehrotra predictor-corrector steps of the primal-dual method (HKM direction,
  :func:`jaxgossip.design.primal_dual.primal_dual`) from the Metropolis weights and
  ``s_0 = SLEM + 0.1``, with the multipliers ``X_b = F_b^{-1} / t_0``, ``t_0 = nu / s_0`` (the
  barrier's multipliers at that point, off the central path), down to ``mu <= 4 / t_final``. Why:
  in the middle of the path the barrier method's centerings after ``t <- 2 t`` take 10-20 Newton
  steps each on irregular graphs (the chain's weights on their way to 0), 600 in all on a
  1,024-node Erdos-Renyi graph; the primal-dual steps keep a nearly constant count (20-35,
  N = 64-1,024), each about twice a Newton step's work, and need no centred start (a first
  centering took 19 Newton steps there and saved none of the primal-dual ones);
* then Newton's method with a backtracking line search that keeps both matrices positive definite
  (and, for the chain, starts below the largest step that keeps the linear constraints strict)
  for the barrier ``t s + phi``;
* the last centerings, from ``t = 1 / mu`` doubling up to ``t_final``, give the certificate: at a
  point whose Newton decrement for ``t s + phi`` is ``lambda < 1``,
  ``s - s* <= (nu + (lambda + sqrt(nu)) lambda / (1 - lambda)) / t`` (Nesterov, Introductory
  Lectures on Convex Optimization, 2004, Theorem 4.2.7), with ``nu`` the barrier parameter (2N
  matrix rows, plus M + N linear constraints for the chain). Each centering stops once
  ``lambda <= 0.3``, and ``t_final`` is chosen so that this bound is at most ``tol``: the method
  stops with a certified bound on the distance to the optimum, not a heuristic stopping rule.

Cost of one Newton step, dense linear algebra on the host in float64:

* two Cholesky factorizations of the [N, N] barrier matrices per trial point (``2 N^3 / 3``
  flops; they also decide feasibility and give the log-determinants);
* two inverses from those factors at the accepted point (LAPACK potri, ``4 N^3 / 3`` flops). A
  single symmetric eigendecomposition of ``W - J`` would give both inverses, but measured 6x
  slower than the two potri at N = 1024;
* the [M + 1, M + 1] Newton system: its edge block, the squared Gram matrices ``a_k^T C a_l``,
  by row gathers of C a block of edges at a time into the lower triangle
  (:func:`jaxgossip.design.sdp.schur_lower`: ``O(M N + M^2)`` memory traffic, no products, no
  [M, M] temporaries), and one Cholesky solve in place (``M^3 / 3`` flops);
* the SLEM of the iterate for ``history`` (dense ``eigvalsh``, ``O(N^3)`` with a small constant).

A primal-dual step adds the Gram matrices of the two multipliers, six dense [N, N] products
(``X dS S^{-1}`` for the predictor and the corrector) and the Cholesky tests of its step length,
so ``O(N^3 + M^3)`` per step either way.

Why interior points and not a first-order method: the SLEM is non-smooth exactly at the optimum
(its extreme eigenvalues are typically multiple there), where subgradient methods crawl and
smoothed objectives trade accuracy for conditioning; Newton steps reach 1e-8 and need no step-size
tuning. For graphs beyond a few thousand nodes, where the dense [N, N] and [M, M] matrices no
longer fit, :func:`jaxgossip.design.consensus_weights` designs the weights matrix-free (a
surrogate of the SLEM, no certificate).

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
import scipy.sparse
import threadpoolctl

from jaxgossip.checks import check_int, check_number
from jaxgossip.design.primal_dual import primal_dual
from jaxgossip.design.sdp import (
    Point,
    Problem,
    add_lower,
    cholesky_lower,
    feasible_point,
    iterate_slem,
    problem_of,
    quadratic_forms,
    schur_lower,
    symmetric_inverse,
)
from jaxgossip.design.support import (
    best_constant_weights,
    max_degree_weights,
    metropolis_edge_weights,
    mixing_matrix,
    slem,
    undirected_edges,
    weighted_topology,
)
from jaxgossip.topology import Topology

__all__ = ["Design", "fastest_mixing"]

# Barrier growth per centering. With centerings stopped early (below), 2 takes fewer Newton steps
# in all than 4 on the chain of irregular graphs (Erdos-Renyi, N = 128: 137 against 232) and a
# few more on tori (43 against 37); 8 and 16 stall the chain (a centering unfinished after 100
# steps), and growing it after short centerings (4 or 8 after <= 2 steps) gained nothing.
_MU = 2.0
# Each centering stops at this Newton decrement: the gap bound above holds for any value below 1,
# and full Newton convergence inside every centering only adds steps (measured: 0.3 saves 10-15%
# of the steps of 0.1, the bound grows by 0.43 sqrt(nu) / t, which the last t absorbs).
_BETA = 0.3
# The primal-dual phase stops at mu <= _SWITCH / t_final: the barrier method's last centerings
# (from t = 1 / mu, two doublings) then give the certificate.
_SWITCH = 4.0
# Newton steps per centering at most.
_STEPS_PER_CENTERING = 100
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
      gap_bound: the method's certified bound on ``slem - optimum`` (Nesterov's bound at the last
        point; inf when its Newton decrement is not below 1, e.g. ``max_steps`` ran out).
      history: [steps] float64, the SLEM after every step, Newton or primal-dual (the objective during
        the design).
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


def _value(problem: Problem, point: Point, t: float) -> float:
    value = t * point.s - point.logdet
    if problem.nonnegative:
        value -= np.sum(np.log(point.w)) + np.sum(np.log(point.slack))
    return float(value)


def _newton_step(problem: Problem, point: Point, t: float) -> tuple[np.ndarray, np.ndarray]:
    """Gradient and Newton direction of ``t s + phi`` at ``point``, both [M + 1] (w, then s)."""
    m = len(problem.u)
    grad = np.zeros(m + 1)
    hess = np.empty((m + 1, m + 1))  # the lower triangle is filled and read
    grad[m] = t
    # d/dw_l of the upper matrix s I - W + J is +a a^T, of the lower one s I + W - J is -a a^T.
    inverses = [symmetric_inverse(factor) for factor in point.factors]  # C_1, C_2
    hess[m, :m] = schur_lower(problem, [(inverses[0], inverses[0], 1.0), (inverses[1], inverses[1], -1.0)], hess)
    grad[:m] = quadratic_forms(problem, inverses[1]) - quadratic_forms(problem, inverses[0])
    hess[m, m] = sum(float(np.sum(inverse * inverse)) for inverse in inverses)  # tr C^2
    grad[m] -= sum(float(np.trace(inverse)) for inverse in inverses)  # tr C
    if problem.nonnegative:
        inc = problem.incidence
        grad[:m] += -1.0 / point.w + inc.T @ (1.0 / point.slack)
        hess[np.diag_indices(m)] += 1.0 / point.w**2
        # |A|^T diag(1 / slack^2) |A|: non-zero only between edges that share a node
        add_lower(hess, inc.T @ inc.multiply(1.0 / point.slack[:, None] ** 2).tocsr())
    return grad, -_solve_psd(hess, grad)


def _solve_psd(hess: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """``hess^{-1} rhs`` by Cholesky of the lower triangle. Near the optimum rounding can leave
    the Hessian numerically semidefinite; a diagonal shift of relative size 1e-14, doubled until
    it factors, then keeps the step a descent direction. NaN when no shift up to 1e-2 helps (the
    caller stops)."""
    shift, diag = 0.0, np.diag(hess).copy()
    while shift <= 1e-2:
        shifted = hess.copy()
        shifted[np.diag_indices_from(shifted)] += shift * diag
        factor = cholesky_lower(shifted)
        if factor is not None:
            return scipy.linalg.cho_solve(factor, rhs, check_finite=False)
        shift = 2.0 * shift if shift else 1e-14
    return np.full_like(rhs, np.nan)


def _max_step(problem: Problem, point: Point, step: np.ndarray) -> float:
    """The largest step length along ``step`` that keeps the linear constraints (w > 0, slack > 0)
    strict, scaled by 0.99; 1 when it is above 1 (the matrix constraints are left to the line
    search)."""
    if not problem.nonnegative:
        return 1.0
    dw = step[:-1]
    dslack = -(problem.incidence @ dw)
    ratios = np.concatenate([point.w[dw < 0] / -dw[dw < 0], point.slack[dslack < 0] / -dslack[dslack < 0]])
    return min(1.0, 0.99 * float(ratios.min())) if ratios.size else 1.0


def _center(problem: Problem, point: Point, t: float, history: list, max_steps: int):
    """Newton's method on ``t s + phi`` from a strictly feasible point until the Newton decrement
    ``lambda`` is at most ``_BETA``; returns the point, the Newton steps taken (each one's SLEM
    appended to ``history``) and the last ``lambda``."""
    for steps in range(max_steps):
        grad, step = _newton_step(problem, point, t)
        decrement = np.sqrt(max(-float(grad @ step), 0.0))
        if not np.isfinite(decrement):  # the Newton system is lost to rounding: stop here
            return point, steps, np.inf
        if decrement <= _BETA:
            return point, steps, decrement
        value = _value(problem, point, t)
        alpha = _max_step(problem, point, step)
        while alpha > 1e-12:
            w, s = point.w + alpha * step[:-1], point.s + alpha * step[-1]
            trial = feasible_point(problem, w, s)
            if trial is not None and _value(problem, trial, t) <= value - _ARMIJO * alpha * decrement**2:
                break
            alpha *= _BACKTRACK
        else:  # no progress possible at this precision: the point is as centred as it gets
            return point, steps, decrement
        point = trial
        history.append(iterate_slem(problem, point.w))
    grad, step = _newton_step(problem, point, t)
    return point, max_steps, np.sqrt(max(-float(grad @ step), 0.0))


def _gap_bound(nu: int, t: float, decrement: float) -> float:
    """Nesterov's bound on ``s - s*`` at a point whose Newton decrement for ``t s + phi`` is
    ``lambda < 1`` (Introductory Lectures on Convex Optimization, 2004, Theorem 4.2.7):
    ``(nu + (lambda + sqrt(nu)) lambda / (1 - lambda)) / t``; inf for ``lambda >= 1``."""
    if not decrement < 1.0:
        return np.inf
    return (nu + (decrement + np.sqrt(nu)) * decrement / (1.0 - decrement)) / t


def _barrier_method(problem: Problem, w0: np.ndarray, tol: float, max_steps: int):
    """Minimizes the SLEM from the strictly feasible ``w0``; returns ``(w, gap_bound, history)``."""
    n, m = problem.num_nodes, len(problem.u)
    nu = 2 * n + (m + n if problem.nonnegative else 0)
    s0 = iterate_slem(problem, w0) + 0.1
    point = feasible_point(problem, w0, s0)
    # the last centering, once its decrement is at most _BETA, certifies gap_bound <= tol
    t, t_final = nu / s0, _gap_bound(nu, tol, _BETA)
    history = []
    # the path by primal-dual steps from the start, then the last centerings certify
    point, used, mu = primal_dual(problem, point, t, _SWITCH / t_final, history, max_steps)
    if used:
        t = min(max(1.0 / mu, t), t_final)
    while True:
        point, steps, decrement = _center(problem, point, t, history, min(_STEPS_PER_CENTERING, max_steps - used))
        used += steps
        gap = _gap_bound(nu, t, decrement)
        if gap <= tol or used >= max_steps or (t >= t_final and steps == 0):
            return point.w, gap, np.asarray(history)
        t = min(_MU * t, t_final)


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

    Solved exactly by structured interior-point steps (primal-dual steps along the central path
    from the Metropolis weights, barrier centerings at its end; see the module docstring): the
    result is within ``gap_bound <= tol`` of the optimum. Cost per step ``O(N^3 + M^3)``; 15-40
    steps.

    Args:
      topology: a fixed, static graph with an undirected, connected support (the pairs with a
        non-zero weight; the weights themselves are ignored).
      nonnegative: True for the fastest-mixing chain, False for FDLA.
      tol: the certified bound on ``SLEM - optimum`` at which the method stops (> 0).
      max_steps: the most steps in all, Newton and primal-dual (the method stops early with ``gap_bound`` above
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
    problem = problem_of(edges, n, bool(nonnegative))
    # Metropolis weights 1 / (1 + max(d_u, d_v)): strictly inside the chain's constraints (w > 0,
    # L_ii <= d_i / (d_i + 1) < 1) and much closer to the optimum than a constant weight on
    # irregular graphs; also a fine start for FDLA.
    w0 = metropolis_edge_weights(edges, n)
    # One BLAS thread: on a CPU shared with other jobs OpenBLAS's threads wait on each other
    # (measured on a loaded 2-core machine, the same 41 Newton steps on a 1,024-node torus: 126 s
    # with the default threads, 47 s with one; 44 s against 2.9 s at 256 nodes).
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
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
