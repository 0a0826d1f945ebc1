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
    centred_matrix,
    feasible_point,
    gram_rows,
    iterate_slem,
    symmetric_inverse,
)

__all__ = ["primal_dual"]


class _Dual(NamedTuple):
    """The primal-dual method's multipliers: ``X`` of the two matrix inequalities (``[N, N]``,
    positive definite) and ``x`` of the linear ones (``[M]`` for ``w > 0``, ``[N]`` for
    ``1 - L_ii > 0``; the chain only)."""

    upper: np.ndarray
    lower: np.ndarray
    weights: np.ndarray | None
    rows: np.ndarray | None


def _all_definite(matrices) -> bool:
    """Whether every symmetric matrix is positive definite (a Cholesky factorization each)."""
    return all(scipy.linalg.lapack.dpotrf(a, lower=1)[1] == 0 for a in matrices)


def primal_dual(problem: Problem, point: Point, t: float, mu_stop: float, history: list, max_iters: int):
    """Mehrotra predictor-corrector steps of the primal-dual interior-point method (HKM direction)
    from the point centred for ``t``, until the duality measure ``mu`` is at most ``mu_stop``.

    The SDP in the dual form: ``S_1 = s I - (W - J)``, ``S_2 = s I + (W - J)`` and, for the chain,
    ``w`` and ``r = 1 - diag L`` stay positive, ``S = F_0 + sum_i y_i F_i`` with ``y = (w, s)``;
    multipliers ``X_1, X_2 >= 0``, ``x_w, x_r >= 0``. A step solves the linearized conditions
    ``sum_b <F_bi, X_b> = c_i`` (``c = e_s``) and ``X_b S_b = sigma mu I``:

    * ``H dy = sigma mu g - c - k``, ``H_ij = sum_b <F_bi, X_b F_bj S_b^{-1}>``, so for edges
      ``H_kl = sum_b (a_k^T X_b a_l)(a_k^T S_b^{-1} a_l)`` (four [M, M] Gram matrices),
      ``g_i = sum_b <F_bi, S_b^{-1}>`` (the barrier gradient), ``k`` Mehrotra's second-order term;
    * ``dX_b = sigma mu S_b^{-1} - X_b - sym(X_b dS_b S_b^{-1}) - sym(dX_b' dS_b' S_b^{-1})`` (primes:
      the affine predictor, ``sigma = 0``), ``sigma = (mu' / mu)^3``;
    * one step length for both sides (separate ones drifted off the central path: 146 against 19
      steps on a 256-node Erdos-Renyi chain), 0.95 of the largest that keeps every block positive
      definite (:func:`_step_length`).

    Dual feasibility is exact (S is computed from y); the multipliers start at the barrier's
    centre for ``t`` (``X_b = S_b^{-1} / t``), feasible up to its Newton decrement, and their
    residual shrinks by ``1 - alpha`` per step. Where the barrier method needs 10-20 Newton steps per
    centering in the middle of the path (weights on their way to 0 on irregular graphs), these steps
    keep a nearly constant count (15-30 in all, N = 64-1,024). Returns ``(point, iterations, mu)``;
    the barrier method's last centerings then certify the result.

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
    for iteration in range(max_iters):
        slacks = _slacks(problem, point)
        mu = _measure(dual, slacks, nu)
        if mu <= mu_stop:
            return point, iteration, mu
        grams = [
            (gram_rows(problem, dual.upper), gram_rows(problem, inverses[0])),
            (gram_rows(problem, dual.lower), gram_rows(problem, inverses[1])),
        ]
        hess, grad = np.zeros((m + 1, m + 1)), np.zeros(m + 1)
        for ((x_rows, x_gram), (c_rows, c_gram)), inverse, x, sign in zip(
            grams, inverses, (dual.upper, dual.lower), (1.0, -1.0)
        ):
            hess[:m, :m] += x_gram * c_gram
            hess[:m, m] += sign * np.einsum("ij,ij->i", x_rows, c_rows)  # a_l^T X S^{-1} a_l
            hess[m, m] += float(np.sum(x * inverse))
            grad[:m] += sign * np.diag(c_gram)
            grad[m] += float(np.trace(inverse))
        hess[m, :m] = hess[:m, m]
        if chain:
            inc = problem.incidence
            hess[np.diag_indices(m)] += dual.weights / point.w
            pairs = (inc.T @ inc.multiply((dual.rows / point.slack)[:, None]).tocsr()).tocoo()
            hess[pairs.row, pairs.col] += pairs.data
            grad[:m] += 1.0 / point.w - inc.T @ (1.0 / point.slack)
        try:
            factor = scipy.linalg.cho_factor(hess, check_finite=False)
        except np.linalg.LinAlgError:  # lost to rounding: the barrier method goes on from here
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
            k[:m] += (1.0 if b == 0 else -1.0) * _quadratic(problem, product)
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


def _quadratic(problem: Problem, matrix: np.ndarray) -> np.ndarray:
    """``a_l^T P a_l`` [M] of a symmetric [N, N] matrix P."""
    u, v = problem.u, problem.v
    return matrix[u, u] + matrix[v, v] - 2.0 * matrix[u, v]


def _step_length(problem, point, dual, slacks, step: _Step, precise: bool = True) -> float:
    """0.95 of the largest step (at most 1 / 0.95) that keeps the multipliers and slacks positive:
    the linear ones exactly, the four matrices by Cholesky tests (the bound itself, else a
    bisection to 1/32 of it: a test costs ``N^3 / 3`` flops, an exact eigenvalue bound ten times
    more)."""
    top = 1.0 / 0.95
    pairs = [
        (dual.weights, step.dual.weights),
        (dual.rows, step.dual.rows),
        (slacks[2], step.slacks[2]),
        (slacks[3], step.slacks[3]),
    ]
    for x, dx in pairs:
        if x is not None and np.any(dx < 0):
            top = min(top, float(np.min(x[dx < 0] / -dx[dx < 0])))
    # the slacks' steps are sparse: made dense once, not at every test
    matrices = [(a, _dense(d)) for a, d in zip((*dual[:2], *slacks[:2]), (*step.dual[:2], *step.slacks[:2]))]

    def inside(alpha):
        return _all_definite(a + alpha * d for a, d in matrices)

    if inside(top):
        return min(1.0, 0.95 * top)
    if not precise:  # the predictor's length only sets sigma: factors of 0.8 are enough
        alpha = 0.8 * top
        while alpha > 1e-9 and not inside(alpha):
            alpha *= 0.8
        return min(1.0, 0.95 * alpha)
    low, high = 0.0, top
    for _ in range(5):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if inside(mid) else (low, mid)
    return min(1.0, 0.95 * low)
