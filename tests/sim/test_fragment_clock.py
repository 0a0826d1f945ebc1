"""The clock of a Streaming DiLoCo round (jaxgossip.sim.fragment_clock) against a NumPy per-node
timeline, one fragment without overlap bitwise the synchronous round, and overlap hiding a link."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgossip import topology
from jaxgossip.engine.streaming import Streaming, launch_and_merge_steps
from jaxgossip.sim import fragment_clock, timing
from jaxgossip.sim.compute import compute_seconds
from jaxgossip.sim.network import Network, comm_seconds

N = 6
COMPUTES = ["0.01", "stragglers:0.01,0.34,5", "exponential:0.01", "lognormal:0.01,0.5"]


def _model(compute, available=None, **links):
    network = Network(compute=compute, bandwidth=links.get("bandwidth", 1e6), latency=links.get("latency", 1e-3))
    return timing.time_model(topology.make("ring", N), network, exchanges=1, allreduce=False, available=available)


@pytest.mark.parametrize("compute", COMPUTES)
@pytest.mark.parametrize("h", [1, 4])
def test_one_fragment_without_overlap_is_the_synchronous_round_bitwise(compute, h):
    rng = np.random.default_rng(0)
    available = (rng.random((3, N)) > 0.3).astype(np.float32)
    for model in (_model(compute), _model(compute, available=available)):
        key = jax.random.key(3)
        launch, merge = launch_and_merge_steps(h, Streaming(1, 0, 0.0))
        arrivals = jnp.zeros([1, N], jnp.float32)
        for t in range(5):
            bits = jnp.asarray(rng.integers(1e4, 1e6, size=N), jnp.float32)
            want = timing.round_seconds(model, key, bits, t, h)
            tau, comm, late = fragment_clock.stream_round_seconds(model, key, bits[None], t, h, launch, merge, arrivals)
            np.testing.assert_array_equal(np.asarray(tau), np.asarray(want[0]))
            np.testing.assert_array_equal(np.asarray(comm), np.asarray(want[1]))
            assert not np.any(np.asarray(late))


def _numpy_rounds(work, sends, h, launch, merge, rounds):
    """Per-node timelines: ``work`` [R, H, N] step seconds, ``sends`` [R, F, N] message seconds."""
    f = len(launch)
    arrivals, taus = np.zeros((f, N)), []
    for r in range(rounds):
        clock, link, ends = np.zeros(N), np.zeros(N), {}
        for step in range(1, h + 1):
            clock = clock + work[r, step - 1]
            for k in range(f):
                if launch[k] == step:
                    ends[k] = np.maximum(clock, link) + sends[r, k]
                    link = ends[k]
            for k in range(f):
                if merge[k] == step:
                    clock = np.maximum(clock, ends[k] if merge[k] >= launch[k] else arrivals[k])
        tau = clock.max()
        arrivals = np.stack([ends[k] - tau if merge[k] < launch[k] else np.zeros(N) for k in range(f)])
        taus.append(tau)
    return np.array(taus)


@pytest.mark.parametrize("h, f, tau", [(4, 2, 1), (6, 3, 2), (5, 2, 4), (8, 4, 7), (3, 1, 2)])
@pytest.mark.parametrize("compute", ["stragglers:0.01,0.34,5", "exponential:0.01"])
def test_timelines_match_numpy(h, f, tau, compute):
    """Slow links (1 Mbit/s, messages of 1e4-2e5 bits: up to 0.2 s against steps of 0.01-0.05 s)."""
    model = _model(compute)
    rng, rounds = np.random.default_rng(2), 6
    launch, merge = launch_and_merge_steps(h, Streaming(f, tau, 0.0))
    bits = rng.integers(1e4, 2e5, size=(rounds, f, N)).astype(np.float32)
    clock = timing.init_clock(jax.random.key(0))
    work = np.stack(
        [
            [
                np.asarray(compute_seconds(model.compute, jax.random.wrap_key_data(clock.key), r * h + s, N))
                for s in range(h)
            ]
            for r in range(rounds)
        ]
    )
    sends = np.stack(
        [[np.asarray(comm_seconds(model.links, jnp.asarray(bits[r, k]), r)) for k in range(f)] for r in range(rounds)]
    )
    arrivals, taus = jnp.zeros([f, N], jnp.float32), []
    for r in range(rounds):
        before = clock.time
        clock, arrivals = fragment_clock.advance_stream(clock, model, jnp.asarray(bits[r]), h, launch, merge, arrivals)
        taus.append(float(clock.time - before))
    want = _numpy_rounds(work.astype(np.float64), sends.astype(np.float64), h, launch, merge, rounds)
    np.testing.assert_allclose(taus, want, rtol=1e-5)


def test_overlap_hides_a_message_that_fits_and_waits_for_the_rest():
    """Constant steps of p = 10 ms, H = 4, one fragment: DiLoCo's round is H p + c; with tau = 2 a
    message of c <= 2 p costs nothing and a longer one costs c - 2 p (in the next round)."""
    h, p = 4, 0.01
    model = _model(p, bandwidth=1e6, latency=0.0)
    key = jax.random.key(0)
    for c in (0.015, 0.05):
        bits = jnp.full([1, N], c * 1e6, jnp.float32)  # the round's bits of a node, at 1 Mbit/s
        c_node = float(np.asarray(comm_seconds(model.links, bits[0], 0))[0])
        assert c_node == pytest.approx(c, rel=1e-6)
        diloco = fragment_clock.stream_round_seconds(model, key, bits, 0, h, (4,), (4,), jnp.zeros([1, N]))[0]
        assert float(diloco) == pytest.approx(h * p + c, rel=1e-6)
        launch, merge = launch_and_merge_steps(h, Streaming(1, 2, 0.0))
        arrivals, taus = jnp.zeros([1, N], jnp.float32), []
        for t in range(3):
            tau, _, arrivals = fragment_clock.stream_round_seconds(model, key, bits, t, h, launch, merge, arrivals)
            taus.append(float(tau))
        assert taus[0] == pytest.approx(h * p)  # nothing in flight in the first round
        assert taus[1] == pytest.approx(h * p + max(0.0, c - 2 * p), rel=1e-5)
