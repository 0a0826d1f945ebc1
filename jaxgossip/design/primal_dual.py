"""Primal-dual interior-point steps for the least-SLEM SDP (:mod:`jaxgossip.design.sdp`): the
middle of the central path of :func:`jaxgossip.design.fastest_mixing` (see
:func:`primal_dual`). Host-side NumPy in float64.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.linalg
import scipy.linalg.lapack
import scipy.sparse

from jaxgossip.design.sdp import (
    Point,
    Problem,
    add_lower,
    centred_matrix,
    cholesky_lower,
    feasible_point,
    iterate_slem,
    quadratic_forms,
    schur_lower,
    symmetric_inverse,
)

__all__ = ["primal_dual"]

# The step goes this fraction of the way to the boundary of the cone.
_FRACTION = 0.95


class _Dual(NamedTuple):
    """The primal-dual method's multipliers: ``X`` of the two matrix inequalities (``[N, N]``,
    positive definite) and ``x`` of the linear ones (``[M]`` for ``w > 0``, ``[N]`` for
    ``1 - L_ii > 0``; the chain only)."""

    upper: np.ndarray
    lower: np.ndarray
    weights: np.ndarray | None
    rows: np.ndarray | None


def _definite(matrix: np.ndarray) -> bool:
    """Whether a symmetric matrix is positive definite (one Cholesky factorization; of the
    transpose, the same matrix in Fortran order, which LAPACK takes without a copy)."""
    return scipy.linalg.lapack.dpotrf(matrix.T, lower=0, overwrite_a=1, clean=0)[1] == 0


def primal_dual(problem: Problem, point: Point, t: float, mu_stop: float, history: list, max_iters: int):
    """Mehrotra predictor-corrector steps of the primal-dual interior-point method (HKM direction)
    from a strictly feasible point and the barrier's multipliers there for ``t``, until the duality
    measure ``mu`` is at most ``mu_stop``.

    The SDP in the dual form: ``S_1 = s I - (W - J)``, ``S_2 = s I + (W - J)`` and, for the chain,
    ``w`` and ``r = 1 - diag L`` stay positive, ``S = F_0 + sum_i y_i F_i`` with ``y = (w, s)``;
    multipliers ``X_1, X_2 >= 0``, ``x_w, x_r >= 0``. A step solves the linearized conditions
    ``sum_b <F_bi, X_b> = c_i`` (``c = e_s``) and ``X_b S_b = sigma mu I``:

    * ``H dy = sigma mu g - c - k``, ``H_ij = sum_b <F_bi, X_b F_bj S_b^{-1}>``, so for edges
      ``H_kl = sum_b (a_k^T X_b a_l)(a_k^T S_b^{-1} a_l)`` (Hadamard products of Gram matrices),
      ``g_i = sum_b <F_bi, S_b^{-1}>`` (the barrier gradient), ``k`` Mehrotra's second-order term;
    * ``dX_b = sigma mu S_b^{-1} - X_b - sym(X_b dS_b S_b^{-1}) - sym(dX_b' dS_b' S_b^{-1})`` (primes:
      the affine predictor, ``sigma = 0``), ``sigma = (mu' / mu)^3``;
    * one step length for both sides (separate ones drifted off the central path: 146 against 19
      steps on a 256-node Erdos-Renyi chain, and no end in 12 minutes at 1,024 nodes), 0.95 of the
      largest that keeps every block positive definite (:func:`_step_length`).

    Dual feasibility is exact (S is computed from y); the multipliers start as the barrier's for
    ``t`` (``X_b = S_b^{-1} / t``), which satisfy the primal equations only at the centre; the
    residual ``c - sum_b <F_b, X_b>`` shrinks by ``1 - alpha`` per step, so the start need not be
    centred. Where the barrier method needs 10-20 Newton steps per centering in the middle of the
    path (weights on their way to 0 on irregular graphs), these steps keep a nearly constant count
    (20-35 in all, N = 64-1,024). Returns ``(point, iterations, mu)``; the barrier method's last
    centerings then certify the result.

    Cost of a step: the [M + 1, M + 1] system (its edge block by :func:`schur_lower`, one
    Cholesky factorization, ``M^3 / 3`` flops: most of a step at M in the thousands), six dense
    [N, N] products, the two inverses at the new point and the Cholesky tests of the step lengths.

    Reference: Helmberg, Rendl, Vanderbei, Wolkowicz, SIAM J. Optim. 6(2), 1996 (the direction);
    Mehrotra, SIAM J. Optim. 2(4), 1992 (predictor-corrector); Todd, Toh, Tutuncu, Math. Program.
    83, 1998 (both for SDP).
    """
    n, m = problem.num_nodes, len(problem.u)
    chain = problem.nonnegative
    nu = 2 * n + (m + n if chain else 0)
    inverses = [symmetric_inverse(f) for f in point.factors]  # S_1^{-1}, S_2^{-1}
    dual = _Dual(
        inverses[0] / t,
        inverses[1] / t,
        1.0 / (t * point.w) if chain else None,
        1.0 / (t * point.slack) if chain else None,
    )
    c = np.zeros(m + 1)
    c[m] = 1.0
    hess = None  # [M + 1, M + 1], reused: a fresh one per step costs its page faults
    for iteration in range(max_iters):
        slacks = _slacks(problem, point)
        mu = _measure(dual, slacks, nu)
        if mu <= mu_stop:
            return point, iteration, mu
        hess = np.empty((m + 1, m + 1)) if hess is None else hess
        dots = schur_lower(problem, [(dual.upper, inverses[0], 1.0), (dual.lower, inverses[1], -1.0)], hess)
        hess[m, :m] = dots  # a_l^T X_b S_b^{-1} a_l, signed
        hess[m, m] = sum(float(np.sum(x * inverse)) for x, inverse in zip(dual[:2], inverses))
        grad = np.zeros(m + 1)
        grad[:m] = quadratic_forms(problem, inverses[0]) - quadratic_forms(problem, inverses[1])
        grad[m] = float(np.trace(inverses[0]) + np.trace(inverses[1]))
        if chain:
            inc = problem.incidence
            hess[np.diag_indices(m)] += dual.weights / point.w
            add_lower(hess, inc.T @ inc.multiply((dual.rows / point.slack)[:, None]).tocsr())
            grad[:m] += 1.0 / point.w - inc.T @ (1.0 / point.slack)
        factor = cholesky_lower(hess)
        if factor is None:  # lost to rounding: the barrier method goes on from here
            return point, iteration, mu
        predictor = _direction(problem, point, dual, inverses, factor, -c, 0.0, None)
        alpha = _step_length(problem, point, dual, slacks, predictor, precise=False)
        mu_affine = _measure(_moved(dual, predictor.dual, alpha), _moved(slacks, predictor.slacks, alpha), nu)
        sigma = min(1.0, (mu_affine / mu) ** 3)
        step = _direction(problem, point, dual, inverses, factor, sigma * mu * grad - c, sigma * mu, predictor)
        alpha = _step_length(problem, point, dual, slacks, step)
        trial = feasible_point(problem, point.w + alpha * step.dy[:m], point.s + alpha * step.dy[m])
        if trial is None or alpha < 1e-8:
            return point, iteration, mu
        point, dual = trial, _moved(dual, step.dual, alpha)
        inverses = [symmetric_inverse(f) for f in point.factors]
        history.append(iterate_slem(problem, point.w))
    return point, max_iters, _measure(dual, _slacks(problem, point), nu)


class _Step(NamedTuple):
    dy: np.ndarray  # [M + 1]
    dual: _Dual  # the multipliers' step
    slacks: tuple  # the steps of (S_1, S_2, w, r): sparse [N, N] twice, [M], [N]


def _slacks(problem: Problem, point: Point) -> tuple:
    """``(S_1, S_2, w, r)`` of a point (dense [N, N] twice; w and r None for FDLA)."""
    centred = centred_matrix(problem, point.w)
    upper, lower = -centred, centred
    upper[np.diag_indices(problem.num_nodes)] += point.s
    lower[np.diag_indices(problem.num_nodes)] += point.s
    return (upper, lower, point.w if problem.nonnegative else None, point.slack if problem.nonnegative else None)


def _measure(dual: _Dual, slacks: tuple, nu: int) -> float:
    """The duality measure ``mu = (sum_b <X_b, S_b> + x_w . w + x_r . r) / nu``."""
    total = float(np.sum(dual.upper * slacks[0]) + np.sum(dual.lower * slacks[1]))
    if dual.weights is not None:
        total += float(dual.weights @ slacks[2] + dual.rows @ slacks[3])
    return total / nu


def _moved(old, step, alpha: float):
    """``old + alpha step`` leaf by leaf (a _Dual or a slacks tuple; None stays None)."""
    moved = [
        None if a is None else a + alpha * (b.toarray() if scipy.sparse.issparse(b) else b) for a, b in zip(old, step)
    ]
    return type(old)(*moved) if isinstance(old, _Dual) else tuple(moved)


def _dense(matrix):
    return matrix.toarray() if scipy.sparse.issparse(matrix) else matrix


def _direction(problem, point, dual, inverses, factor, rhs, target, predictor) -> _Step:
    """The HKM step for ``H dy = rhs - k`` and the complementarity target ``sigma mu``
    (``target``); ``predictor``: the affine step whose second-order term ``k`` corrects this one."""
    m = len(problem.u)
    corrections = [None, None, None, None]
    if predictor is not None:
        k = np.zeros(m + 1)
        for b, (x_step, s_step, inverse) in enumerate(zip(predictor.dual[:2], predictor.slacks[:2], inverses)):
            product = (s_step @ x_step).T @ inverse  # dX' dS' S^{-1} (dS' sparse and symmetric)
            product = 0.5 * (product + product.T)
            corrections[b] = product
            k[:m] += (1.0 if b == 0 else -1.0) * quadratic_forms(problem, product)
            k[m] += float(np.trace(product))
        if problem.nonnegative:
            corrections[2] = predictor.dual.weights * predictor.slacks[2] / point.w
            corrections[3] = predictor.dual.rows * predictor.slacks[3] / point.slack
            k[:m] += corrections[2] - problem.incidence.T @ corrections[3]
        rhs = rhs - k
    dy = scipy.linalg.cho_solve(factor, rhs, check_finite=False)
    dw, ds = dy[:m], dy[m]
    lap = (problem.signed @ scipy.sparse.diags(dw) @ problem.signed.T).tocsr()  # L(dw), sparse
    eye = scipy.sparse.identity(problem.num_nodes, format="csr")
    s_steps = (lap + ds * eye, -lap + ds * eye)
    x_steps = []
    for x, s_step, inverse, correction in zip(dual[:2], s_steps, inverses, corrections[:2]):
        product = (s_step @ x).T @ inverse  # X dS S^{-1}
        x_step = target * inverse - x - 0.5 * (product + product.T)
        x_steps.append(x_step if correction is None else x_step - correction)
    weights_step = rows_step = dr = None
    if problem.nonnegative:
        dr = -(problem.incidence @ dw)
        weights_step = target / point.w - dual.weights - dual.weights * dw / point.w
        rows_step = target / point.slack - dual.rows - dual.rows * dr / point.slack
        if corrections[2] is not None:
            weights_step, rows_step = weights_step - corrections[2], rows_step - corrections[3]
    return _Step(dy, _Dual(*x_steps, weights_step, rows_step), (*s_steps, dw if problem.nonnegative else None, dr))


def _step_length(problem, point, dual, slacks, step: _Step, precise: bool = True) -> float:
    """``_FRACTION`` of the largest step (at most 1) that keeps the multipliers and slacks
    positive: the linear ones exactly, the four matrices by Cholesky tests, block by block.
    Definiteness along ``A + alpha D`` is lost once and for good (the cone is convex), so a block
    that passes at the current bound needs one test, and a bisection (to 1/256 of the bound; 1/16
    for the predictor, whose length only sets sigma) runs only for the blocks that bind. A test
    costs ``N^3 / 3`` flops; an exact eigenvalue bound costs ten times more."""
    top = 1.0 / _FRACTION
    linear = [
        (dual.weights, step.dual.weights),
        (dual.rows, step.dual.rows),
        (slacks[2], step.slacks[2]),
        (slacks[3], step.slacks[3]),
    ]
    for x, dx in linear:
        if x is not None and np.any(dx < 0):
            top = min(top, float(np.min(x[dx < 0] / -dx[dx < 0])))
    for a, d in zip((*dual[:2], *slacks[:2]), (*step.dual[:2], *step.slacks[:2])):
        d = _dense(d)
        if _definite(a + top * d):
            continue
        low, high = 0.0, top
        for _ in range(8 if precise else 4):
            mid = 0.5 * (low + high)
            low, high = (mid, high) if _definite(a + mid * d) else (low, mid)
        top = low
    return min(1.0, _FRACTION * top)
