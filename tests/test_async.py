"""AD-PSGD (jaxgossip.asynchronous) against a heapq discrete-event reference in NumPy."""

import heapq

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgossip import asynchronous, problems, timing
from jaxgossip import topology as T

N, D, ROUNDS = 6, 3, 20  # 120 events
SPEC = "stragglers:1.0,0.34,3"


def _reference(problem, topology, x0, lr, compute, num_rounds, key):
    """One event at a time from a heap of (finish time, node, step); gradients at the model each
    node read when its step started."""
    n = x0.shape[0]
    num_events = num_rounds * n
    clock_key = jax.random.wrap_key_data(timing.init_clock(key).key)
    # a straggler's step always takes S C: one draw of the per-node seconds serves every step
    assert compute.kind == "stragglers"
    durations = np.tile(np.asarray(timing.compute_seconds(compute, clock_key, 0, n)), (num_events, 1))
    key_sched, _ = jax.random.split(key)
    u = np.asarray(jax.random.uniform(key_sched, (num_events,)))
    s, r, w = (np.asarray(a)[0] for a in (topology.senders, topology.receivers, topology.weights))
    nbrs = [sorted({int(b) for a, b, c in zip(s, r, w) if a == i and b != i and c != 0}) for i in range(n)]
    a_mat, b_vec = np.asarray(problem.features, np.float64), np.asarray(problem.targets, np.float64)
    x = np.asarray(x0, np.float64).copy()
    snap = x.copy()
    heap = [(np.float32(durations[0, i]), i, 0) for i in range(n)]
    heapq.heapify(heap)
    times, objs = [], []
    for e in range(num_events):
        t, i, k = heapq.heappop(heap)
        j = nbrs[i][min(int(np.floor(np.float32(u[e]) * len(nbrs[i]))), len(nbrs[i]) - 1)]
        g = a_mat[i].T @ (a_mat[i] @ snap[i] - b_vec[i]) / a_mat.shape[1]
        avg = 0.5 * (x[i] + x[j])
        x[i], x[j] = avg - lr * g, avg
        snap[i] = x[i]
        heapq.heappush(
            heap, (np.float32(t + np.float32(durations[k + 1, i])) if k + 1 < num_events else np.inf, i, k + 1)
        )
        if (e + 1) % n == 0:
            times.append(t)
            objs.append(problem.objective(x.mean(axis=0)))
    return x, np.array(times), np.array(objs)


@pytest.fixture(scope="module")
def setup():
    problem = problems.least_squares(N, D, 8, heterogeneity=2.0, seed=1)
    topology = T.ring(N)
    x0 = problem.init_params(jax.random.key(3))
    return problem, topology, x0


def test_matches_heapq_reference(setup):
    problem, topology, x0 = setup
    key = jax.random.key(7)
    res = asynchronous.run_async_optimization(problem, topology, x0, lr=0.1, time=SPEC, num_rounds=ROUNDS, key=key)
    x_ref, times_ref, obj_ref = _reference(problem, topology, x0, 0.1, timing.parse_compute(SPEC), ROUNDS, key)
    # the stragglers really straggle: the fast nodes do more events
    counts = np.bincount(np.asarray(res.schedule.node), minlength=N)
    assert counts.max() >= 2 * counts.min()
    np.testing.assert_allclose(np.asarray(res.sim_time[1:]), times_ref, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(res.x), x_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(res.objective[1:]), obj_ref, rtol=1e-4)


def test_zero_gradients_keep_mean_and_contract(setup):
    problem, topology, x0 = setup
    res = asynchronous.run_async_optimization(
        problem, topology, x0, lr=0.0, time=SPEC, num_rounds=ROUNDS, key=jax.random.key(0)
    )
    np.testing.assert_allclose(np.asarray(res.x).mean(0), np.asarray(x0).mean(0), atol=1e-5)
    assert res.consensus[-1] < 1e-2 * res.consensus[0]


def test_same_key_same_run(setup):
    problem, topology, x0 = setup
    run = lambda k: asynchronous.run_async_optimization(  # noqa: E731
        problem, topology, x0, lr=0.1, time=SPEC, num_rounds=ROUNDS, key=jax.random.key(k)
    )
    a, b, c = run(1), run(1), run(2)
    for left, right in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(left), np.asarray(right))
    assert not np.array_equal(np.asarray(a.schedule.partner), np.asarray(c.schedule.partner))


def test_bad_input(setup):
    problem, topology, x0 = setup
    with pytest.raises(ValueError, match="num_rounds"):
        asynchronous.run_async_optimization(
            problem, topology, x0, lr=0.1, time=1.0, num_rounds=0, key=jax.random.key(0)
        )
    with pytest.raises(ValueError, match="x0 must be"):
        asynchronous.run_async_optimization(
            problem, topology, jnp.zeros((N + 1, D)), lr=0.1, time=1.0, num_rounds=1, key=jax.random.key(0)
        )
