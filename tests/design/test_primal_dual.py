"""The primal-dual phase of fastest_mixing (jaxgossip.design.primal_dual): from a strictly feasible
point it drives the duality measure down while every iterate stays strictly feasible, its epigraph
bound s converges to the certified optimum from above, and the whole design needs far fewer steps
than barrier centerings alone."""

import numpy as np
import pytest
import scipy.linalg

import jaxgossip as jg
from jaxgossip.design import fastest_mixing, undirected_edges
from jaxgossip.design.primal_dual import primal_dual
from jaxgossip.design.sdp import (
    cholesky_lower,
    feasible_point,
    iterate_slem,
    problem_of,
    quadratic_forms,
    schur_lower,
    symmetric_inverse,
)


@pytest.mark.parametrize("nonnegative", [True, False])
def test_the_measure_falls_and_every_iterate_stays_feasible(nonnegative):
    topo = jg.topology.erdos_renyi(40, 5.0 / 39, seed=3)
    edges = undirected_edges(topo)
    problem = problem_of(edges, 40, nonnegative)
    w0 = np.full(len(edges), 1.0 / (np.bincount(edges.ravel()).max() + 1.0))
    s0 = iterate_slem(problem, w0) + 0.1
    nu = 2 * 40 + (len(edges) + 40 if nonnegative else 0)
    history = []
    point, iterations, mu = primal_dual(problem, feasible_point(problem, w0, s0), nu / s0, 1e-9, history, 80)
    optimum = fastest_mixing(topo, nonnegative=nonnegative).slem
    assert mu <= 1e-9 and 0 < iterations < 80 and len(history) == iterations
    assert feasible_point(problem, point.w, point.s) is not None  # S_1, S_2 (and w, 1 - L_ii) positive
    assert iterate_slem(problem, point.w) <= point.s
    # the epigraph bound closes on the optimum: within nu mu of it
    assert optimum - 1e-8 <= point.s <= optimum + 10 * nu * mu
    if nonnegative:
        assert np.all(point.w > 0)


def test_the_designs_need_few_steps_where_centerings_alone_needed_many():
    # an Erdos-Renyi chain of 128 nodes took 137 Newton steps with barrier centerings alone (the
    # weights on their way to 0); the primal-dual middle of the path takes it in about 35
    design = fastest_mixing(jg.topology.erdos_renyi(128, 5.0 / 127, seed=0))
    assert design.gap_bound <= 1e-8
    assert design.history.size <= 50


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_the_schur_block_equals_the_dense_gram_products(chunk):
    # sum_b (A^T P_b A) * (A^T Q_b A) against the incidence matrix A built densely, row by row
    topo = jg.topology.erdos_renyi(30, 6.0 / 29, seed=1)
    edges = undirected_edges(topo)
    problem = problem_of(edges, 30, True)
    m = len(edges)
    a = np.zeros((30, m))
    for l, (u, v) in enumerate(edges):
        a[u, l], a[v, l] = 1.0, -1.0
    rng = np.random.default_rng(0)
    mats = [rng.standard_normal((30, 30)) for _ in range(3)]
    p1, q1, p2 = (x + x.T for x in mats)
    pairs = [(p1, q1, 1.0), (p2, p2, -1.0)]
    out = np.full((m, m), np.nan)
    dots = schur_lower(problem, pairs, out, chunk=chunk)
    expected = sum((a.T @ p @ a) * (a.T @ q @ a) for p, q, _ in pairs)
    lower = np.tril_indices(m)
    np.testing.assert_allclose(out[lower], expected[lower], rtol=1e-12, atol=1e-12)
    written = ~np.isnan(out)  # the lower triangle, and at most the chunks' diagonal blocks above it
    np.testing.assert_allclose(out[written], expected[written], rtol=1e-12, atol=1e-12)
    if chunk == 1:
        assert not written[np.triu_indices(m, 1)].any()
    expected_dots = [sum(s * a[:, l] @ p @ q @ a[:, l] for p, q, s in pairs) for l in range(m)]
    np.testing.assert_allclose(dots, expected_dots, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(quadratic_forms(problem, p1), np.diag(a.T @ p1 @ a), rtol=1e-12, atol=1e-12)


def test_the_lower_cholesky_solves_and_refuses_an_indefinite_matrix():
    rng = np.random.default_rng(2)
    b = rng.standard_normal((12, 12))
    spd = b @ b.T + 12 * np.eye(12)
    rhs = rng.standard_normal(12)
    lower_only = np.tril(spd) + np.triu(np.full((12, 12), 1e300), 1)  # the upper triangle is never read
    factor = cholesky_lower(lower_only)
    np.testing.assert_allclose(scipy.linalg.cho_solve(factor, rhs), np.linalg.solve(spd, rhs), rtol=1e-10)
    assert cholesky_lower(spd - 100 * np.eye(12)) is None


def test_the_inverse_is_symmetric_and_row_contiguous():
    rng = np.random.default_rng(3)
    b = rng.standard_normal((9, 9))
    spd = b @ b.T + 9 * np.eye(9)
    inverse = symmetric_inverse(np.linalg.cholesky(spd))
    assert inverse.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(inverse, np.linalg.inv(spd), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(inverse, inverse.T)
