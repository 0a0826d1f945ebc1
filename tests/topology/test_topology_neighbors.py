"""The effective number of neighbours of "Beyond spectral gap" (Vogels, Hendrikx, Jaggi, NeurIPS
2022): the authors' numbers for 32-node graphs, every computation route (eigenvalues, Fourier modes
of circulant rounds, the periodic Lyapunov equation) against the fixed point of the covariance
recursion written here, its limits, its errors, and its column in ``sweeps.topology_rows``."""

import numpy as np
import pytest

from jaxgossip import topology as T
from jaxgossip.engine import sweeps

GAMMAS = (0.5, 0.9, 0.99)

# effective_number_of_neighbors(scheme, gamma) of epfml/topology-in-decentralized-learning
# (random_walks.py, mode "mean", t = 0), run on its 32-worker schemes: Ring, Hypercube,
# Time-varying exponential, Binary tree, Two cliques, Star, Torus (4x8).
AUTHORS = {
    "ring": [3.719658, 6.632115, 17.075527],
    "hypercube": [8.897196, 19.636364, 30.009032],
    "one_peer_exponential": [2.994152, 9.286398, 25.428995],
    "binary_tree": [2.740869, 5.147694, 15.389772],
    "dumbbell": [16.182803, 16.990623, 22.384886],
    "star": [1.162683, 1.673581, 6.437949],
    "twisted_torus": [7.115863, 15.739137, 28.540596],
}


def _twisted_torus(rows, cols):
    """The authors' "torus": node i = col + row * cols links to (i +- 1) mod N and (i +- cols) mod N,
    so stepping left from column 0 lands on the previous row's last node (a circulant graph)."""
    n = rows * cols
    adj = np.zeros((n, n))
    for i in range(n):
        for d in (1, -1, cols, -cols):
            adj[i, (i + d) % n] = 1
    return T.from_adjacency(adj, weights="metropolis")


def _graph(name):
    if name == "twisted_torus":
        return _twisted_torus(4, 8)
    return T.make(name, 32)


@pytest.mark.parametrize("name", list(AUTHORS))
def test_the_authors_numbers_for_32_nodes(name):
    topo = _graph(name)
    got = [T.effective_neighbors(topo, g) for g in GAMMAS]
    np.testing.assert_allclose(got, AUTHORS[name], rtol=0, atol=2e-6)


def _permutation_mix(n):
    """A directed doubly stochastic W that is not circulant: a mix of I and two random permutations."""
    rng = np.random.default_rng(0)
    w = 0.4 * np.eye(n) + sum(0.3 * np.eye(n)[rng.permutation(n)] for _ in range(2))
    return T.from_matrix(w, name="permutation_mix")


def _reference(topo, gamma, t=0, rounds=6000):
    """Iterates Sigma <- W(s) (gamma Sigma + I) W(s)^T from 0 until it settles, stopping before round t."""
    n = topo.num_nodes
    w = topo.matrices()
    period = topo.period
    sigma = np.zeros((n, n))
    total = rounds - rounds % period + t % period
    for s in range(total):
        ws = w[s % period]
        sigma = ws @ (gamma * sigma + np.eye(n)) @ ws.T
    return n / ((1 - gamma) * np.trace(sigma))


@pytest.mark.parametrize(
    "topo",
    [
        T.torus(4, 8),  # symmetric, not circulant: eigenvalues
        T.star(9),  # symmetric, irregular
        T.exponential(16),  # directed circulant: Fourier modes
        T.d_equistatic(15, 3, seed=1),  # directed circulant, irregular shifts
        T.directed_ring(7),  # directed circulant, one neighbour
        T.base_graph(12, 2),  # periodic, not circulant: the periodic Lyapunov equation
        T.one_peer_exponential(8),  # periodic circulant
        T.u_equistatic(12, 2, seed=0),  # symmetric circulant
        _permutation_mix(9),  # static, directed, not circulant: the Lyapunov route with T = 1
        T.schedule([T.ring(8), T.torus(2, 4), T.hypercube(8)]),  # periodic, slow mixing
    ],
    ids=str,
)
@pytest.mark.parametrize("gamma", (0.3, 0.95))
def test_every_route_equals_the_covariance_fixed_point(topo, gamma):
    np.testing.assert_allclose(T.effective_neighbors(topo, gamma), _reference(topo, gamma), rtol=1e-9)


def test_phase_of_a_schedule():
    topo = T.base_graph(12, 2)
    for t in range(topo.period):
        np.testing.assert_allclose(T.effective_neighbors(topo, 0.9, t=t), _reference(topo, 0.9, t=t), rtol=1e-9)
    # the exact average closes every period, so the phase after it sees the most neighbours
    values = [T.effective_neighbors(topo, 0.9, t=t) for t in range(topo.period)]
    assert np.argmax(values) == 0


def test_limits():
    for n in (5, 16):
        for gamma in (0.0, 0.5, 0.999):  # exact averaging every round: all N workers
            assert T.effective_neighbors(T.complete(n), gamma) == pytest.approx(n, rel=1e-9)
    # gamma = 0: one round's averaging, N / sum_ij W_ij^2
    ring = T.ring(9)
    assert T.effective_neighbors(ring, 0.0) == pytest.approx(9 / np.sum(ring.matrix(0) ** 2))
    # more rounds of memory, more neighbours; never more than N
    values = [T.effective_neighbors(ring, g) for g in (0.0, 0.5, 0.9, 0.99, 0.9999)]
    assert all(a < b for a, b in zip(values, values[1:])) and values[-1] <= 9


def test_bad_input():
    with pytest.raises(ValueError, match="needs a fixed graph"):
        T.effective_neighbors(T.random_matching(8))
    with pytest.raises(ValueError, match="doubly stochastic"):
        T.effective_neighbors(T.random_directed(8, 0.5, seed=0))
    for gamma in (1.0, -0.1, float("nan"), True):
        with pytest.raises(ValueError, match=r"gamma=.* must be a decay in \[0, 1\)"):
            T.effective_neighbors(T.ring(8), gamma)


def test_topology_rows_carry_the_effective_number_of_neighbours():
    topos = [T.ring(8), T.base_graph(8, 1), T.random_matching(8)]
    result = sweeps.sweep_topologies("gossip", topos, dim=2, num_steps=3, seeds=[0])
    rows = sweeps.topology_rows(result)
    assert rows[0]["effective_neighbors"] == pytest.approx(T.effective_neighbors(T.ring(8), 0.99))
    assert rows[1]["effective_neighbors"] == pytest.approx(T.effective_neighbors(topos[1], 0.99))
    assert np.isnan(rows[2]["effective_neighbors"])  # drawn anew every round: no fixed covariance
    again = sweeps.topology_rows(result, gamma=0.5)
    assert again[0]["effective_neighbors"] == pytest.approx(T.effective_neighbors(T.ring(8), 0.5))
    with pytest.raises(ValueError, match=r"gamma=1.0 must be a decay in \[0, 1\)"):
        sweeps.topology_rows(result, gamma=1.0)
