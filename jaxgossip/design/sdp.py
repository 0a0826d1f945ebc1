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
    "gram_rows",
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
    return Problem(edges[:, 0], edges[:, 1], incidence, int(num_nodes), bool(nonnegative), signed)


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
    return inverse


def iterate_slem(problem: Problem, w: np.ndarray) -> float:
    """The SLEM of ``I - L(w)`` by dense ``eigvalsh`` (about a tenth of a Newton step at N = 1024).
    Not Lanczos: near the optimum the extreme eigenvalues are multiple and of both signs, where
    ARPACK measured no convergence in 5,000 iterations (Erdos-Renyi, N = 512)."""
    return float(np.max(np.abs(np.linalg.eigvalsh(centred_matrix(problem, w)))))


def gram_rows(problem: Problem, matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rows [M, N], gram [M, M])`` of a symmetric [N, N] matrix C: row l is ``(C a_l)^T``,
    ``gram[k, l] = a_k^T C a_l``; row gathers only (contiguous in memory; column gathers measured
    3x slower at N = 1024)."""
    u, v = problem.u, problem.v
    rows = np.take(matrix, u, axis=0)
    rows -= np.take(matrix, v, axis=0)
    cols = np.ascontiguousarray(rows.T)  # [N, M]
    gram = np.take(cols, u, axis=0)
    gram -= np.take(cols, v, axis=0)
    return rows, gram
