"""Graphs that are convolutions on an abelian group (jaxgossip/topology/convolution.py): the
eigenvalues from the group's Fourier transform against dense eigenvalues, per round and for a
period's product, the refusals of graphs that are not, and the expected Gram matrix of failures on
such a graph against the dense closed form and against Lanczos."""

import numpy as np
import pytest
import scipy.sparse.linalg

import jaxgossip.topology as T
from jaxgossip.topology import random_spectra
from jaxgossip.topology.convolution import group_modes

GROUP_GRAPHS = {
    "ring": lambda: T.ring(24),
    "exponential": lambda: T.exponential(32),
    "one_peer": lambda: T.one_peer_exponential(16),  # Z_16, T = 4
    "torus_square": lambda: T.torus(6, 6),
    "torus_wide": lambda: T.torus(3, 8),  # a != b
    "torus_side_2": lambda: T.torus(2, 6),  # the two neighbours along a side of 2 coincide
    "hypercube": lambda: T.hypercube(32),  # Z_2^5
}


def _sorted(values):
    """Complex values in a canonical order that rounding does not change (conjugate pairs whose
    real parts differ in the last bit would swap under np.sort_complex)."""
    values = np.asarray(values, complex)
    return values[np.lexsort((np.round(values.imag, 8), np.round(values.real, 8)))]


def _modes(topo):
    return group_modes(topo.senders, topo.receivers, topo.weights, topo.num_nodes)


@pytest.mark.parametrize("name", GROUP_GRAPHS)
def test_group_modes_are_every_rounds_eigenvalues(name):
    topo = GROUP_GRAPHS[name]()
    modes = _modes(topo)
    assert modes is not None and modes.shape == (topo.period, topo.num_nodes)
    for t in range(topo.period):
        dense = np.linalg.eigvals(topo.matrix(t))
        np.testing.assert_allclose(_sorted(modes[t]), _sorted(dense), atol=1e-10)
        assert modes[t, 0] == pytest.approx(1.0)  # the ones vector's
    # one basis for every round: the period's product has the products of the modes
    prod = np.eye(topo.num_nodes)
    for t in range(topo.period):
        prod = topo.matrix(t) @ prod
    np.testing.assert_allclose(
        np.sort(np.abs(np.prod(modes, axis=0))), np.sort(np.abs(np.linalg.eigvals(prod))), atol=1e-10
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: T.chain(16),
        lambda: T.star(16),
        lambda: T.binary_tree(15),
        lambda: T.erdos_renyi(32, 0.3, seed=0),
        lambda: T.schedule([T.ring(16), T.torus(4, 4)]),  # each a convolution, on different groups
    ],
)
def test_graphs_that_are_not_convolutions_get_none(make):
    assert _modes(make()) is None


def test_a_ring_with_one_changed_weight_is_not_a_convolution():
    w = T.ring(12).matrix(0)
    w[[3, 4], [4, 3]] -= 0.1
    w[[3, 4], [3, 4]] += 0.1
    assert _modes(T.from_matrix(w[None])) is None
    assert _modes(T.from_matrix(T.ring(12).matrix(0)[None])) is not None


@pytest.mark.parametrize("base", [lambda: T.ring(300), lambda: T.torus(20, 16), lambda: T.hypercube(512)])
def test_the_expected_gram_of_failures_on_a_group_graph_by_its_modes(base):
    """Failures that treat every edge and node alike keep E[W^T W] a convolution: its lambda_2 by
    the modes equals the dense eigenvalues of the closed form and the Lanczos value."""
    gram = T.exact_gram(T.with_failures(base(), 0.2, 0.05))
    n = gram.num_nodes
    assert n > 256  # past the dense path
    coo = gram.sparse.tocoo()
    assert group_modes(coo.col[None], coo.row[None], coo.data[None], n) is not None
    dense = np.sort(np.linalg.eigvalsh(gram.matrix()))[-2]
    assert gram.second_eigenvalue() == pytest.approx(dense, abs=1e-12)
    op = scipy.sparse.linalg.LinearOperator(
        (n, n), matvec=lambda x: (lambda y: y - y.mean())(gram.sparse @ (x.ravel() - x.mean())), dtype=np.float64
    )
    lanczos = scipy.sparse.linalg.eigsh(op, k=1, which="LA", tol=1e-12, return_eigenvectors=False)[0]
    assert gram.second_eigenvalue() == pytest.approx(lanczos, abs=1e-9)
    assert isinstance(gram, random_spectra.SparseGram)
