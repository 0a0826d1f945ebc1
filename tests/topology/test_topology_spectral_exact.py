"""Exact spectral gaps: closed forms of the stochastic graphs, sparse eigenvalues of large fixed
graphs, and the error bar of the sampled estimate."""

import itertools

import jax
import numpy as np
import pytest

import jaxgossip.topology as T


def _dense_gap(topo):
    n = topo.num_nodes
    prod = np.eye(n)
    for t in range(topo.period):
        prod = topo.matrix(t) @ prod
    lam2 = np.sort(np.abs(np.linalg.eigvals(prod)))[::-1][1]
    lam2 = 0.0 if lam2 < 1e-12 else lam2
    return 1.0 - lam2 ** (1.0 / topo.period)


@pytest.mark.parametrize("n, expected", [(1024, 0.2932), (16, 0.3169)])
def test_random_matching_gap_is_the_closed_form(n, expected):
    est = T.gap_estimate(T.random_matching(n))
    assert est.exact and est.stderr == 0.0
    assert est.value == pytest.approx(1 - np.sqrt(0.5 - 0.5 / (n - 1)), abs=1e-12)
    assert est.value == pytest.approx(expected, abs=1e-4)
    assert T.spectral_gap(T.random_matching(n)) == est.value


def test_random_matching_odd_n_gap_is_one_minus_sqrt_half():
    assert T.spectral_gap(T.random_matching(15)) == pytest.approx(1 - np.sqrt(0.5), abs=1e-12)


@pytest.mark.parametrize(
    "topo", [T.random_matching(6), T.random_matching(7), T.random_out(6, 2), T.random_out(7, 1)], ids=lambda t: t.name
)
def test_exact_gram_matches_a_large_monte_carlo(topo):
    exact = T.exact_gram(topo).matrix()
    sampled = T.expected_gram(topo, num_samples=8192, seed=3)
    # entries are means of values in [0, 1]: standard error <= 0.5 / sqrt(8192) ~ 0.0055
    np.testing.assert_allclose(sampled, exact, atol=0.025)
    np.testing.assert_allclose(np.linalg.eigvalsh(exact)[:-1], T.exact_gram(topo).perp, atol=1e-12)


def _enumerated_gram(topo, p, q):
    """E[W(t)^T W(t)] of with_failures(topo, p, q) by enumerating every pattern of links and nodes."""
    w = topo.matrix(0)
    n = topo.num_nodes
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n) if w[i, j] != 0]
    gram = np.zeros((n, n))
    for links in itertools.product([0, 1], repeat=len(pairs)):
        for nodes in itertools.product([0, 1], repeat=n if q else 0):
            alive = nodes if q else [1] * n
            wt = w.copy()
            for (i, j), up in zip(pairs, links):
                if not (up and alive[i] and alive[j]):
                    wt[i, i] += wt[i, j]
                    wt[j, j] += wt[j, i]
                    wt[i, j] = wt[j, i] = 0.0
            prob = np.prod([(1 - p) if k else p for k in links]) * np.prod([(1 - q) if a else q for a in nodes])
            gram += prob * wt.T @ wt
    return gram


@pytest.mark.parametrize("p, q", [(0.5, 0.0), (0.3, 0.2), (0.0, 0.4)])
def test_failures_gram_is_the_enumerated_expectation(p, q):
    ring = T.ring(6)
    topo = T.with_failures(ring, p, q)
    gram = _enumerated_gram(ring, p, q)
    np.testing.assert_allclose(T.exact_gram(topo).matrix(), gram, atol=1e-6)  # float32 drop probabilities
    est = T.gap_estimate(topo)
    assert est.exact and est.stderr == 0.0
    assert est.value == pytest.approx(1 - np.sqrt(np.sort(np.linalg.eigvalsh(gram))[-2]), abs=1e-6)


def test_failures_gap_on_a_large_graph_is_exact():
    big = T.with_failures(T.torus(20, 15), 0.2, 0.05)
    small = T.with_failures(T.torus(4, 5), 0.2, 0.05)
    gram = T.exact_gram(small).matrix()
    np.testing.assert_allclose(gram, gram.T, atol=1e-12)
    np.testing.assert_allclose(gram.sum(axis=1), 1.0, atol=1e-12)
    # the sparse Lanczos value past N = 256 against dense eigenvalues of the same closed form
    dense = np.sort(np.linalg.eigvalsh(T.exact_gram(big).matrix()))[-2]
    assert T.gap_estimate(big).value == pytest.approx(1 - np.sqrt(dense), abs=1e-6)


def test_sampled_gap_brackets_the_exact_expectation():
    """Failures of a two-round schedule have no closed form here (sampled); the average of the two
    phases' closed forms is the truth the estimate must bracket."""
    a, b = T.ring(8), T.hypercube(8)
    topo = T.with_failures(T.schedule([a, b]), 0.5)
    assert T.exact_gram(topo) is None
    gram = (T.exact_gram(T.with_failures(a, 0.5)).matrix() + T.exact_gram(T.with_failures(b, 0.5)).matrix()) / 2
    exact = 1 - np.sqrt(np.sort(np.linalg.eigvalsh(gram))[-2])
    est = T.gap_estimate(topo)
    assert not est.exact and 0 < est.stderr < 0.01
    assert abs(est.value - exact) < 4 * est.stderr + 1e-3
    assert T.gap_estimate(topo) == est  # fixed key: reproducible


def test_sampled_gap_without_failures_is_the_fixed_gap():
    est = T.gap_estimate(T.with_failures(T.torus(4, 4), 0.0))
    assert est.value == pytest.approx(T.spectral_gap(T.torus(4, 4)), abs=1e-6) and est.stderr < 1e-9


@pytest.mark.parametrize(
    "make",
    [
        lambda: T.torus(20, 15),
        lambda: T.erdos_renyi(300, 0.1, seed=0),
        lambda: T.hypercube(512),
        lambda: T.schedule([T.torus(20, 15), T.erdos_renyi(300, 0.05, seed=1)]),
        lambda: T.ring(300),
        lambda: T.exponential(300),
        lambda: T.one_peer_exponential(300),
    ],
)
def test_large_fixed_graph_gap_equals_dense_eigenvalues(make):
    topo = make()
    assert topo.num_nodes > 256  # past the dense path
    est = T.gap_estimate(topo)
    assert est.exact and est.stderr == 0.0
    assert est.value == pytest.approx(_dense_gap(topo), abs=1e-6)


@pytest.mark.parametrize("make", [T.ring, T.exponential, T.one_peer_exponential])
def test_small_fixed_graph_gap_equals_dense_eigenvalues(make):
    for n in (5, 8, 12):
        assert T.spectral_gap(make(n)) == pytest.approx(_dense_gap(make(n)), abs=1e-9)


def test_16384_node_ring_and_exponential():
    n = 16384
    # ring(n): weights 1/3 on self and both neighbours, lambda_2 = (1 + 2 cos(2 pi / n)) / 3
    assert T.spectral_gap(T.ring(n)) == pytest.approx(2 / 3 * (1 - np.cos(2 * np.pi / n)), rel=1e-6)
    # exponential(2^14): 15 equal weights on offsets 0, 1, 2, 4, ..., 2^13; its eigenvalues are
    # the mean of exp(2 pi i k o / n) over those offsets
    offsets = np.array([0] + [2**j for j in range(14)])
    modes = np.exp(2j * np.pi * np.outer(np.arange(1, n), offsets) / n).mean(axis=1)
    assert T.spectral_gap(T.exponential(n)) == pytest.approx(1 - np.abs(modes).max(), abs=1e-9)
    assert T.spectral_gap(T.one_peer_exponential(n)) == pytest.approx(1.0, abs=1e-9)


def test_a_million_node_ring_gap_is_the_closed_form():
    """1 - lambda_2 of ring(2^20) is 1.2e-11: the circulant row must be one node's weights, not an
    average of N rows (whose rounding, ~N eps, is of the gap's size)."""
    n = 2**20
    # (2/3)(1 - cos(2 pi / n)) without the cancellation: (4/3) sin^2(pi / n)
    assert T.spectral_gap(T.ring(n)) == pytest.approx(4 / 3 * np.sin(np.pi / n) ** 2, rel=1e-4)
    # |lambda_2| of (I + P) / 2 is cos(pi / n): 1 - cos(pi / n) = 2 sin^2(pi / (2 n))
    assert T.spectral_gap(T.directed_ring(n)) == pytest.approx(2 * np.sin(np.pi / (2 * n)) ** 2, rel=1e-4)


@pytest.mark.parametrize(
    "topo", [T.random_matching(15), T.random_out(16, 2), T.with_failures(T.ring(16), 0.3, 0.1)], ids=lambda t: t.name
)
def test_mean_out_degree_from_the_sparse_rounds_counts_the_dense_matrices_messages(topo):
    from jaxgossip.topology import random_spectra

    w = random_spectra.sample_matrices(topo, jax.random.split(jax.random.key(0), 64))
    off = (w != 0) & ~np.eye(topo.num_nodes, dtype=bool)[None]
    assert random_spectra.mean_out_degree(topo, num_samples=64) == off.sum() / (64 * topo.num_nodes)


@pytest.mark.parametrize("spec, n", [("torus", 1024), ("hypercube", 1024), ("erdos_renyi:0.1", 512)])
def test_sampled_effective_neighbors_agree_with_the_exact_value_within_their_error_bar(spec, n):
    topo = T.make(spec, n, seed=0)
    exact = T.neighbors_estimate(topo, 0.99)
    assert exact.exact and exact.stderr == 0 and exact.value == T.effective_neighbors(topo, 0.99)
    sampled = T.neighbors_estimate(topo, 0.99, sampled=True)
    assert not sampled.exact and 0 < sampled.stderr < 0.03 * sampled.value
    assert abs(sampled.value - exact.value) < 4 * sampled.stderr


def test_effective_neighbors_of_a_16384_node_sparse_graph():
    topo = T.make("hypercube", 16384)
    # the hypercube's Walsh-Hadamard modes give the exact value; Hutchinson's estimate brackets it
    exact = T.neighbors_estimate(topo, 0.99)
    assert exact.exact and T.effective_neighbors(topo, 0.99) == exact.value
    est = T.neighbors_estimate(topo, 0.99, sampled=True)
    assert not est.exact and est.stderr < 0.01 * est.value
    assert abs(est.value - exact.value) < 4 * est.stderr
    # ... and the refusals name the rule.
    with pytest.raises(ValueError, match="sampled effective_neighbors needs a static symmetric graph"):
        T.neighbors_estimate(T.one_peer_exponential(16), 0.99, sampled=True)


def test_a_graph_that_is_circulant_but_for_one_row_takes_the_general_path():
    """The circulant test is exact: a ring with one lighter edge, or with one chord (doubly
    stochastic still), is not circulant, and its gap is the dense eigenvalues', not the ring's."""
    n = 300
    ring = T.ring(n).matrix(0)
    uneven = ring.copy()
    uneven[[7, 8], [8, 7]] = 0.2  # one edge lighter, its ends keep the weight on themselves
    uneven[7, 7] += 1 / 3 - 0.2
    uneven[8, 8] += 1 / 3 - 0.2
    chord = ring.copy()  # a chord 0-150 of weight 0.1, taken from the edges 0-1 and 150-151
    chord[[0, 1, 150, 151], [1, 0, 151, 150]] -= 0.1
    chord[[1, 151], [1, 151]] += 0.1
    chord[[0, 150], [150, 0]] = 0.1
    for w in (uneven, chord):
        topo = T.from_matrix(w[None])
        assert T.spectral_gap(topo) == pytest.approx(_dense_gap(topo), abs=1e-9)
        assert abs(_dense_gap(topo) - 4 / 3 * np.sin(np.pi / n) ** 2) > 1e-7
    assert T.spectral_gap(T.from_matrix(ring[None])) == pytest.approx(4 / 3 * np.sin(np.pi / n) ** 2, rel=1e-9)


def test_million_node_torus_and_hypercube_gaps_are_their_closed_forms():
    """The torus and the hypercube are convolutions on Z_a x Z_b and Z_2^d: their gaps come from
    one 2-D FFT / Walsh-Hadamard transform of node 0's row, equal to the closed forms at 2^20."""
    # torus(a, b), weights 1/5: lambda = (1 + 2 cos(2 pi j / a) + 2 cos(2 pi k / b)) / 5
    assert T.spectral_gap(T.torus(1024, 1024)) == pytest.approx(4 / 5 * np.sin(np.pi / 1024) ** 2, rel=1e-6)
    assert T.spectral_gap(T.torus(256, 4096)) == pytest.approx(4 / 5 * np.sin(np.pi / 4096) ** 2, rel=1e-5)
    # hypercube(2^d), weights 1 / (d + 1): lambda = (1 + sum_b +-1) / (d + 1), lambda_2 = (d - 1) / (d + 1)
    assert T.spectral_gap(T.hypercube(2**20)) == pytest.approx(2 / 21, rel=1e-9)
    assert T.effective_neighbors(T.torus(128, 128), 0.9) == pytest.approx(
        _circulant_effective_neighbors(np.fft.fft2(_torus_kernel(128, 128)), 0.9), rel=1e-9
    )


def _torus_kernel(a, b):
    c = np.zeros((a, b))
    c[0, 0] = c[1, 0] = c[-1, 0] = c[0, 1] = c[0, -1] = 0.2
    return c


def _circulant_effective_neighbors(modes, gamma):
    """N / ((1 - gamma) tr Sigma), tr Sigma = sum_k 1 / (1 - gamma |lambda_k|^2) of a static graph."""
    gain = np.abs(modes.ravel()) ** 2
    return gain.size / ((1 - gamma) * np.sum(gain / (1 - gamma * gain)))


@pytest.mark.parametrize("make", [lambda: T.chain(700), lambda: T.binary_tree(1023), lambda: T.star(600)])
def test_tree_gaps_by_shift_invert_equal_dense_eigenvalues(make):
    """Trees take shift-invert Lanczos (no fill in their LU); the star's most negative eigenvalue
    is not settled by Gershgorin's bound and is computed too."""
    topo = make()
    assert T.spectral_gap(topo) == pytest.approx(_dense_gap(topo), abs=1e-9)


def test_chain_gaps_where_lanczos_did_not_converge_are_the_closed_form():
    # chain(n), weights 1/3: lambda_2 = 1/3 + 2/3 cos(pi / n), 1 - lambda_2 = (4/3) sin^2(pi / (2 n))
    for n in (4096, 2**18):
        assert T.spectral_gap(T.chain(n)) == pytest.approx(4 / 3 * np.sin(np.pi / (2 * n)) ** 2, rel=1e-4)
