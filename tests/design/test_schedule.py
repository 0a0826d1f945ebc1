"""consensus_weights: the weights of a T-periodic schedule (or one static graph) of least consensus
error, checked against NumPy products of the weight matrices: exact averaging where it exists
(one-peer exponential, Base-(k+1)), the known optimum of a ring-matching schedule where it does not,
the constraints of a mixing matrix, determinism, and the refusals of bad input."""

import numpy as np
import pytest

import jaxgossip as jg
from jaxgossip.design import consensus_weights, schedule_error


def numpy_error(topo, rounds):
    """The reference: ||W(R-1) ... W(0) - J||_F^2 from the dense matrices, multiplied in NumPy."""
    n = topo.num_nodes
    product = np.eye(n)
    for t in range(rounds):
        product = topo.matrix(t % topo.period) @ product
    return float(np.sum((product - np.ones((n, n)) / n) ** 2))


def check_mixing_schedule(design, supports):
    """Every designed W(t) is non-negative, doubly stochastic, on its round's support (self-loops
    allowed), symmetric where the round is undirected."""
    topo = design.topology
    assert topo.period == len(supports)
    for t, support in enumerate(supports):
        w = topo.matrix(t)
        assert w.min() >= 0
        np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-10)
        np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-10)
        allowed = (support != 0) | np.eye(len(w), dtype=bool)
        assert np.all(w[~allowed] == 0)
        if np.array_equal(allowed, allowed.T):
            np.testing.assert_allclose(w, w.T, atol=1e-12)
    assert topo.is_doubly_stochastic


def ring_matchings(n):
    """The n-ring's edges as two perfect matchings (n even): {2i, 2i+1}, then {2i+1, 2i+2}."""
    rounds = []
    for first in (0, 1):
        a = np.zeros((n, n))
        for i in range(first, n + first, 2):
            a[i % n, (i + 1) % n] = a[(i + 1) % n, i % n] = 1
        rounds.append(a)
    return rounds


@pytest.mark.parametrize("n", [8, 16])
def test_one_peer_exponential_from_random_weights_reaches_exact_averaging(n):
    given = jg.topology.one_peer_exponential(n)
    design = consensus_weights(given, seed=1)
    supports = [given.matrix(t) for t in range(given.period)]
    check_mixing_schedule(design, supports)
    assert design.start_error > 0.05  # the random start is far from exact
    assert design.error < 1e-9 and numpy_error(design.topology, given.period) < 1e-9
    assert design.error == pytest.approx(numpy_error(design.topology, given.period), abs=1e-14)
    # the exact schedule of this support: 1/2 on the self-loop and on the peer
    for t in range(given.period):
        np.testing.assert_allclose(design.topology.matrix(t)[given.matrix(t) != 0], 0.5, atol=1e-4)
    # the objective the optimizer saw (mixing kernels, JAX) is the NumPy error of its start
    assert design.history[0] == pytest.approx(design.start_error / (n - 1), rel=1e-6)


@pytest.mark.parametrize("n, k, seed", [(6, 1, None), (10, 2, 2)])
def test_base_graph_supports_reach_exact_averaging(n, k, seed):
    """Base-(k+1) supports for N not a power of k + 1: its link rounds need unequal weights, so
    neither the uniform start nor a random one averages exactly; the design does."""
    given = jg.topology.base_graph(n, k)
    design = consensus_weights(given, seed=seed)
    check_mixing_schedule(design, [given.matrix(t) for t in range(given.period)])
    assert design.start_error > 0.01
    assert numpy_error(design.topology, given.period) < 1e-9
    assert design.history[-1] < design.history[0]


def test_ring_matching_schedule_stops_at_its_optimum_above_zero():
    """Two matchings of the 8-ring cannot average exactly: after the two rounds a node's value mixes
    at most 4 starting values (itself, its partner, their partners), so row i of the product P has
    at most 4 non-zeros summing to 1 and ||P - J||_F^2 = ||P||_F^2 - 1 >= N * 4 * (1/4)^2 - 1 =
    N/4 - 1, reached by weights 1/2. The design from random weights reaches that bound."""
    n = 8
    supports = ring_matchings(n)
    design = consensus_weights(supports, seed=3)
    check_mixing_schedule(design, supports)
    optimum = n / 4 - 1
    error = numpy_error(design.topology, 2)
    assert error >= optimum - 1e-9
    assert error == pytest.approx(optimum, abs=1e-6) and design.error == pytest.approx(error, abs=1e-12)
    assert design.start_error > optimum + 0.05
    # four rounds (two periods) of the same supports: the error is reported after R rounds
    longer = consensus_weights(supports, rounds=4)
    assert longer.error == pytest.approx(numpy_error(longer.topology, 4), abs=1e-12)
    assert longer.error < optimum


def test_static_design_after_r_rounds_beats_metropolis_and_is_deterministic():
    topo = jg.topology.erdos_renyi(12, 0.3, seed=4)
    rounds = 6
    design = consensus_weights(topo, rounds=rounds)
    again = consensus_weights(topo, rounds=rounds)
    np.testing.assert_array_equal(design.topology.weights, again.topology.weights)
    check_mixing_schedule(design, [topo.matrix()])
    assert design.topology.period == 1 and not design.topology.directed
    metropolis = numpy_error(topo, rounds)
    assert design.error == pytest.approx(numpy_error(design.topology, rounds), abs=1e-12)
    assert design.error < 0.9 * metropolis
    assert schedule_error(topo, rounds) == pytest.approx(metropolis, abs=1e-12)
    # with Gaussian probes the same design problem, estimated: close to the exact one
    probed = consensus_weights(topo, rounds=rounds, probes=64, seed=0)
    assert probed.probes == 64 and probed.error < metropolis


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(supports=[np.eye(4), np.eye(4)]), "strongly connected"),
        (dict(supports=[np.ones((4, 4)), np.ones((5, 5))]), "mix node counts"),
        (dict(supports=[]), "non-empty sequence"),
        (dict(supports=[np.ones((4, 3))]), "must be a Topology or an [N, N] array"),
        (dict(supports=[np.full((3, 3), np.nan)]), "NaN or inf"),
        (dict(rounds=0), "rounds"),
        (dict(probes=0), "probes"),
        (dict(max_steps=0), "max_steps"),
        (dict(tol=-1.0), "tol=-1.0 must be a finite number >= 0"),
        (dict(tol=float("nan")), "must be a finite number >= 0"),
        (dict(seed=-1), "seed"),
    ],
)
def test_bad_input_is_refused_naming_the_problem(kwargs, message):
    kwargs = {"supports": jg.topology.ring(6), **kwargs}
    with pytest.raises(ValueError, match=None) as err:
        consensus_weights(**kwargs)
    assert message in str(err.value), str(err.value)


def test_stochastic_graphs_are_refused():
    with pytest.raises(ValueError, match="fixed graphs built on the host"):
        consensus_weights(jg.topology.random_matching(8))
