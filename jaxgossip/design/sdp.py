"""The SDP of the least-SLEM weights, as the interior-point methods of
:mod:`jaxgossip.design.weights` and :mod:`jaxgossip.design.primal_dual` see it.

With ``W = I - L(w)`` on the graph's M undirected edges, the epigraph form
``min s  s.t.  S_1 = s I - (W - J) >= 0, S_2 = s I + (W - J) >= 0`` (and, for the fastest-mixing
chain, ``w > 0``, ``r = 1 - diag L(w) > 0``) depends on ``w`` only through the rank-one terms
``w_l a_l a_l^T``, ``a_l = e_u - e_v``: every quantity the methods need is a dense [N, N] matrix
or a Gram matrix ``a_k^T C a_l`` gathered from one. Host-side NumPy in float64.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.linalg
import scipy.linalg.lapack
import scipy.sparse

__all__ = [
    "Problem",
    "Point",
    "problem_of",
    "centred_matrix",
    "feasible_point",
    "symmetric_inverse",
    "quadratic_forms",
    "schur_lower",
    "add_lower",
    "cholesky_lower",
    "iterate_slem",
]


class Problem(NamedTuple):
    """What the interior-point methods need about the graph (host constants)."""

    u: np.ndarray  # [M] first endpoint of each edge
    v: np.ndarray  # [M] second endpoint
    incidence: scipy.sparse.csr_matrix  # [N, M] |A|, 1 where node i is an endpoint of edge l
    num_nodes: int
    nonnegative: bool
    signed: scipy.sparse.csr_matrix  # [N, M] A, column l is a_l = e_u - e_v


def problem_of(edges: np.ndarray, num_nodes: int, nonnegative: bool) -> Problem:
    """The :class:`Problem` of undirected ``edges [M, 2]`` (``u < v``) on ``num_nodes`` nodes;
    ``nonnegative``: the chain's constraints ``w > 0``, ``1 - L_ii > 0`` (else FDLA)."""
    m = len(edges)
    columns = (edges.T.ravel(), np.tile(np.arange(m), 2))
    incidence = scipy.sparse.csr_matrix((np.ones(2 * m), columns), shape=(num_nodes, m))
    signs = np.concatenate([np.ones(m), -np.ones(m)])
    signed = scipy.sparse.csr_matrix((signs, columns), shape=(num_nodes, m))
    u, v = np.ascontiguousarray(edges[:, 0]), np.ascontiguousarray(edges[:, 1])
    return Problem(u, v, incidence, int(num_nodes), bool(nonnegative), signed)


class Point(NamedTuple):
    """A strictly feasible point with the Cholesky factors of its two barrier matrices."""

    w: np.ndarray  # [M]
    s: float
    factors: tuple  # two [N, N] lower Cholesky factors, of s I - W + J and of s I + W - J
    logdet: float  # log det of both matrices, summed
    slack: np.ndarray  # [N] 1 - L_ii (chain only; ones otherwise)


def centred_matrix(problem: Problem, w: np.ndarray) -> np.ndarray:
    """``W - J = I - L(w) - 11^T / N`` [N, N], dense."""
    n, u, v = problem.num_nodes, problem.u, problem.v
    centred = np.full((n, n), -1.0 / n)
    centred[u, v] += w
    centred[v, u] += w
    centred[np.diag_indices(n)] += 1.0 - problem.incidence @ w
    return centred


def feasible_point(problem: Problem, w: np.ndarray, s: float) -> Point | None:
    """The point ``(w, s)``, or None when it is not strictly feasible: two Cholesky factorizations
    (``N^3 / 3`` flops each) decide it and give the log-determinants; the inverses are formed
    from them only for an accepted point."""
    n = problem.num_nodes
    slack = 1.0 - problem.incidence @ w if problem.nonnegative else np.ones(n)
    if problem.nonnegative and (np.any(w <= 0) or np.any(slack <= 0)):
        return None
    centred = centred_matrix(problem, w)
    factors, logdet = [], 0.0
    for sign in (-1.0, 1.0):
        matrix = sign * centred
        matrix[np.diag_indices(n)] += s
        factor, info = scipy.linalg.lapack.dpotrf(matrix, lower=1, overwrite_a=1)
        if info != 0:
            return None
        logdet += 2.0 * float(np.sum(np.log(np.diag(factor))))
        factors.append(factor)
    return Point(w, float(s), tuple(factors), logdet, slack)


def symmetric_inverse(factor: np.ndarray) -> np.ndarray:
    """The symmetric inverse [N, N] from a lower Cholesky factor (LAPACK potri, ``2 N^3 / 3``
    flops: a sixth of a symmetric eigendecomposition's, which measured 6x slower at N = 1024)."""
    inverse, info = scipy.linalg.lapack.dpotri(factor, lower=1)
    if info != 0:
        raise np.linalg.LinAlgError("singular barrier matrix")
    upper = np.triu_indices_from(inverse, 1)
    inverse[upper] = inverse.T[upper]
    # potri returns Fortran order; the transpose (the same symmetric matrix) is C-ordered, so
    # the row gathers of schur_lower read contiguous rows (strided ones measured 5x slower)
    return inverse.T


def iterate_slem(problem: Problem, w: np.ndarray) -> float:
    """The SLEM of ``I - L(w)`` by dense ``eigvalsh`` (about a tenth of a Newton step at N = 1024).
    Not Lanczos: near the optimum the extreme eigenvalues are multiple and of both signs, where
    ARPACK measured no convergence in 5,000 iterations (Erdos-Renyi, N = 512)."""
    return float(np.max(np.abs(np.linalg.eigvalsh(centred_matrix(problem, w)))))


def quadratic_forms(problem: Problem, matrix: np.ndarray) -> np.ndarray:
    """``a_l^T C a_l`` [M] of a symmetric [N, N] matrix C (four entries of C per edge)."""
    u, v = problem.u, problem.v
    return matrix[u, u] + matrix[v, v] - 2.0 * matrix[u, v]


def schur_lower(problem: Problem, pairs, out: np.ndarray, chunk: int = 64) -> np.ndarray:
    """The edge block of an interior-point Hessian, ``sum_b (A^T P_b A) * (A^T Q_b A)`` (Hadamard
    products of [M, M] Gram matrices ``a_k^T P a_l``), written into the **lower** triangle of
    ``out[:M, :M]`` (above it only the chunks' diagonal blocks are written; Cholesky reads one
    triangle); returns
    ``sum_b sign_b a_l^T P_b Q_b a_l`` [M].

    ``pairs``: ``(P_b, Q_b, sign_b)`` with symmetric [N, N] P and Q (``Q is P`` gathers once).
    ``chunk`` edges at a time: their rows ``(P a_k)^T`` [chunk, N], transposed to [N, chunk], then
    row gathers give the Gram block ``[M - k, chunk]``, so nothing of size [M, M] is allocated
    (whole Gram matrices and their products measured 8x slower at N = 1,024, M = 4,317: each is
    a fresh 149 MB array, memory traffic and first-touch page faults).
    """
    u, v = problem.u, problem.v
    m = len(u)
    dots = np.zeros(m)
    for start in range(0, m, chunk):
        block = slice(start, min(start + chunk, m))
        below_u, below_v = u[start:], v[start:]
        total = None
        for p_matrix, q_matrix, sign in pairs:
            p_rows = np.take(p_matrix, u[block], axis=0)
            p_rows -= np.take(p_matrix, v[block], axis=0)  # [chunk, N]
            if q_matrix is p_matrix:
                q_rows = p_rows
            else:
                q_rows = np.take(q_matrix, u[block], axis=0)
                q_rows -= np.take(q_matrix, v[block], axis=0)
            dots[block] += sign * np.einsum("ij,ij->i", p_rows, q_rows)
            p_cols = np.ascontiguousarray(p_rows.T)  # [N, chunk]
            gram = np.take(p_cols, below_u, axis=0)
            gram -= np.take(p_cols, below_v, axis=0)  # [M - start, chunk]
            if q_matrix is p_matrix:
                gram *= gram
            else:
                q_cols = np.ascontiguousarray(q_rows.T)
                q_gram = np.take(q_cols, below_u, axis=0)
                q_gram -= np.take(q_cols, below_v, axis=0)
                gram *= q_gram
            if total is None:
                total = gram
            else:
                total += gram
        out[start:m, block] = total
    return dots


def add_lower(out: np.ndarray, matrix) -> None:
    """``out += matrix`` on the lower triangle, for a sparse symmetric [M, M] ``matrix``."""
    pairs = matrix.tocoo()
    keep = pairs.row >= pairs.col
    out[pairs.row[keep], pairs.col[keep]] += pairs.data[keep]


def cholesky_lower(matrix: np.ndarray):
    """In-place Cholesky factor of a symmetric C-ordered matrix from its lower triangle, or None
    when it is not positive definite. Its transpose is the same matrix in Fortran order with the
    triangle on top, which LAPACK factors without a copy; the result is a ``cho_solve`` factor."""
    factor, info = scipy.linalg.lapack.dpotrf(matrix.T, lower=0, overwrite_a=1, clean=0)
    return None if info != 0 else (factor, False)
