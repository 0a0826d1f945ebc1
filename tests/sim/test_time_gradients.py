"""Differentiable simulated time: :func:`jaxgossip.sim.timing.elapsed` is the run's clock, its
gradient with respect to the link parameters equals central finite differences and the closed form
of the slowest node, and :func:`jaxgossip.sim.timing.time_to_target` interpolates the crossing."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _gradcheck import check_against_fd

import jaxgossip as jg
from jaxgossip.engine.consensus import consensus_scan
from jaxgossip.engine.optimization import optimization_scan
from jaxgossip.sim import timing

N = 6
KEY = jax.random.key(0)


def x0_for(n=N, dim=4, seed=1):
    return np.random.default_rng(seed).normal(size=(n, dim))


def links(seed=2):
    rng = np.random.default_rng(seed)
    return rng.uniform(1e-3, 5e-3, N), rng.uniform(2e3, 8e3, N)  # distinct: one slowest node per round


@pytest.mark.parametrize("compute", [0.01, "lognormal:0.01,0.5", "stragglers:0.01,0.3,4"])
def test_elapsed_is_the_runs_clock(compute):
    topo = jg.topology.ring(N)
    latency, bandwidth = links()
    model = timing.time_model(topo, compute=compute, latency=latency, bandwidth=bandwidth)
    alg = jg.algorithms.make("choco", topo, compressor=jg.compress.top_k(k=2), gamma=0.5)
    quad = lambda x, i, k: 0.5 * jnp.sum((x - i) ** 2)  # noqa: E731
    trace = optimization_scan(alg, jnp.asarray(x0_for(), jnp.float32), quad, optax.sgd(0.1), 9, KEY, 2, time=model)
    times = timing.elapsed(model, trace.node_bits, 2, KEY)
    assert times.shape == (10,)
    np.testing.assert_allclose(times, trace.sim_time, rtol=2e-6)


def test_elapsed_matches_a_per_round_loop():
    """tau_r = max_i (H p + sum over i's out-edges of (l_i + B_i / (d_i b_i))) on a static ring."""
    topo = jg.topology.ring(N)
    latency, bandwidth = links()
    bits = np.random.default_rng(3).uniform(1e3, 1e4, (5, N))
    model = timing.time_model(topo, compute=0.02, latency=latency, bandwidth=bandwidth)
    degree = 2  # ring: two out-neighbours
    tau = [np.max(3 * 0.02 + degree * (latency + b / degree / bandwidth)) for b in bits]
    np.testing.assert_allclose(timing.elapsed(model, bits, 3), np.concatenate([[0], np.cumsum(tau)]), rtol=1e-6)


class TestGradients:
    @pytest.fixture(autouse=True)
    def float64(self):
        with jax.enable_x64(True):
            yield

    def test_sim_time_gradient_wrt_latency_and_bandwidth(self):
        topo = jg.topology.one_peer_exponential(N)  # time-varying: each round its own out-edges
        latency, bandwidth = links()
        alg = jg.algorithms.make("sparse_push", topo, k=2)
        bits = consensus_scan(alg, x0_for(), 8, KEY).node_bits

        def total(lat, bw):
            return timing.elapsed(timing.time_model(topo, compute=0.01, latency=lat, bandwidth=bw), bits)[-1]

        check_against_fd(lambda lat: total(lat, bandwidth), latency)
        check_against_fd(lambda bw: total(latency, bw), bandwidth, rtol=1e-5)

    def test_sim_time_gradient_is_the_slowest_nodes(self):
        """Node 0 has the slowest uplink: every round waits for it, so d time / d l_0 = S d_0 and
        d time / d b_0 = -sum_r bits_r0 / b_0^2; the other nodes' links do not count."""
        topo = jg.topology.ring(N)
        latency, bandwidth = np.full(N, 1e-3), np.full(N, 1e4)
        bandwidth[0] = 1e3
        bits = np.full((7, N), 5e3)

        def total(links):
            lat, bw = links
            return timing.elapsed(timing.time_model(topo, latency=lat, bandwidth=bw), bits)[-1]

        d_lat, d_bw = jax.grad(total)((jnp.asarray(latency), jnp.asarray(bandwidth)))
        np.testing.assert_allclose(d_lat, [7 * 2.0] + [0.0] * (N - 1), rtol=1e-12)
        np.testing.assert_allclose(d_bw, [-7 * 5e3 / 1e3**2] + [0.0] * (N - 1), rtol=1e-12)

    def test_time_to_target_gradient_wrt_gamma_and_latency(self):
        topo = jg.topology.ring(N)
        latency, bandwidth = links()
        target = 1e-3

        def seconds(gamma, lat):
            alg = jg.algorithms.make("choco", topo, compressor=jg.compress.top_k(k=2), gamma=gamma)
            trace = consensus_scan(alg, x0_for(), 40, KEY)
            model = timing.time_model(topo, compute=0.01, latency=lat, bandwidth=bandwidth)
            return timing.time_to_target(timing.elapsed(model, trace.node_bits), trace.error, target)

        assert np.isfinite(float(seconds(0.4, latency)))
        check_against_fd(lambda g: seconds(g, latency), 0.4, num_directions=1)
        check_against_fd(lambda lat: seconds(0.4, lat), latency, num_directions=2)


def test_time_to_target_interpolates_in_log_space():
    times = np.array([0.0, 1.0, 3.0, 4.0])
    values = np.array([1.0, 1e-1, 1e-3, 1e-4])
    # 1e-2 lies halfway (in log) between 1e-1 at t=1 and 1e-3 at t=3
    np.testing.assert_allclose(timing.time_to_target(times, values, 1e-2), 2.0, rtol=1e-6)
    np.testing.assert_allclose(timing.time_to_target(times, values, 1e-3), 3.0, rtol=1e-6)
    assert float(timing.time_to_target(times, values, 2.0)) == 0.0  # reached at the start
    assert float(timing.time_to_target(times, values, 1e-5)) == np.inf  # never reached
    assert np.all(np.asarray(jax.grad(lambda t: timing.time_to_target(t, values, 1e-5))(times)) == 0)
    # onto an exact 0 (exact averaging): the first point at 0
    np.testing.assert_allclose(timing.time_to_target(times, np.array([1.0, 0.5, 0.0, 0.0]), 1e-3), 3.0)
    with pytest.raises(ValueError, match="one shape"):
        timing.time_to_target(times, values[:3], 1e-2)


def test_elapsed_refuses_bad_shapes_and_a_missing_key():
    topo = jg.topology.ring(N)
    with pytest.raises(ValueError, match=r"\[S, N\]"):
        timing.elapsed(timing.time_model(topo), np.ones((3, N + 1)))
    with pytest.raises(ValueError, match="run's key"):
        timing.elapsed(timing.time_model(topo, compute="lognormal:0.01,0.5"), np.ones((3, N)))
