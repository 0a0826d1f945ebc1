"""AD-PSGD with priced exchanges (jaxgossip.engine.asynchronous.exchanges, --time.exchange): the
compiled run against a discrete-event reference in NumPy with a queue of booked exchanges per
node, zero delays against the free schedule bit for bit, and link speed showing in the clock."""

import heapq

import jax
import numpy as np
import pytest
from tiny import tiny_config

from jaxgossip import topology as T
from jaxgossip.engine import asynchronous, problems
from jaxgossip.run.runner import run_training
from jaxgossip.sim import timing
from jaxgossip.sim.compute import parse_compute
from jaxgossip.sim.network import Network

N, D, ROUNDS = 8, 3, 15  # 120 events
STRAGGLERS = "stragglers:1.0,0.25,4"
LOGNORMAL = "lognormal:1.0,0.5"
LATENCY = np.linspace(0.1, 0.6, N)  # per sender: an exchange costs about one step
BANDWIDTH = np.full(N, 500.0)


@pytest.fixture(scope="module")
def problem():
    return problems.least_squares(N, D, 8, heterogeneity=2.0, seed=1)


@pytest.fixture(scope="module")
def x0(problem):
    return problem.init_params(jax.random.key(3))


def _uniform_blocks(key, num_events):
    key_sched, _ = jax.random.split(key)

    def block(m):
        k = key_sched if m == 0 else jax.random.fold_in(key_sched, m)
        return np.asarray(jax.random.uniform(k, (num_events,)), np.float32)

    return block


def _reference(problem, topology, x0, lr, dur, block, num_rounds):
    """Priced AD-PSGD one happening at a time from a heap of (time, kind, order, ...): kind 0 an
    exchange ending, kind 1 a node's gradient done (it books an exchange in both nodes' queues).
    An exchange starts when it heads both queues; the average and the step apply at its end."""
    n = x0.shape[0]
    a_mat, b_vec = np.asarray(problem.features, np.float64), np.asarray(problem.targets, np.float64)

    def grad(i, v):
        return a_mat[i].T @ (a_mat[i] @ v - b_vec[i]) / a_mat.shape[1]

    s, r, w = (np.asarray(a)[0] for a in (topology.senders, topology.receivers, topology.weights))
    nbrs = [sorted({int(b) for a, b, c in zip(s, r, w) if a == i and b != i and c != 0}) for i in range(n)]

    def one_way(a):  # the sender's link carries the model (per-node links)
        return LATENCY[a] + 32.0 * D / BANDWIDTH[a]

    x = np.asarray(x0, np.float64).copy()
    x_hat = x.copy()
    queues = [[] for _ in range(n)]  # booked exchanges per node, in booking order
    busy = [False] * n
    heap = [(np.float32(dur[0, i]), 1, i, i, 0) for i in range(n)]
    heapq.heapify(heap)
    booked, events, times, objs, cons, waited = 0, 0, [], [], [], 0

    def try_start(ex, now):
        q, i, j, _, seconds = ex
        if queues[i][0] is ex and queues[j][0] is ex and not busy[i] and not busy[j]:
            busy[i] = busy[j] = True
            heapq.heappush(heap, (np.float32(now + seconds), 0, q, i, j))

    while events < num_rounds * n:
        t, kind, order, i, extra = heapq.heappop(heap)
        if kind == 1:  # node i's gradient is done: book an exchange with a drawn neighbour
            u = block(booked // (num_rounds * n))[booked % (num_rounds * n)]
            j = nbrs[i][min(int(np.floor(u * np.float32(len(nbrs[i])))), len(nbrs[i]) - 1)]
            ex = (booked, i, j, extra, np.float32(one_way(i) + one_way(j)))
            booked += 1
            queues[i].append(ex)
            queues[j].append(ex)
            waited += queues[i][0] is not ex or queues[j][0] is not ex
            try_start(ex, t)
            continue
        j = extra  # an exchange of i with j ends at t
        ex = queues[i].pop(0)
        assert queues[j].pop(0) is ex and ex[1] == i
        busy[i] = busy[j] = False
        avg = 0.5 * (x[i] + x[j])
        x[i], x[j] = avg - lr * grad(i, x_hat[i]), avg
        x_hat[i] = x[i]
        step = ex[3] + 1
        heapq.heappush(heap, (np.float32(t + dur[step, i]), 1, i, i, step))
        for node in (i, j):
            if queues[node]:
                try_start(queues[node][0], t)
        events += 1
        if events % n == 0:
            times.append(t)
            objs.append(problem.objective(x.mean(0)))
            cons.append(np.mean(np.sum((x - x.mean(0)) ** 2, -1)))
    return x, np.array(times), np.array(objs), np.array(cons), waited


def _run(problem, x0, spec, key, exchange="priced", latency=LATENCY, bandwidth=BANDWIDTH, **kw):
    topology = T.ring(N)
    tm = timing.time_model(topology, compute=spec, latency=latency, bandwidth=bandwidth, exchange=exchange)
    return asynchronous.run_async_optimization(
        problem, topology, x0, lr=0.05, time=tm, num_rounds=ROUNDS, key=key, algorithm="ad_psgd", **kw
    )


@pytest.mark.parametrize("spec", [STRAGGLERS, LOGNORMAL])
def test_priced_exchanges_match_the_queue_reference(problem, x0, spec):
    key = jax.random.key(7)
    res = _run(problem, x0, spec, key)
    dur = asynchronous.step_durations(parse_compute(spec), N, ROUNDS * N + 1, key)
    z, times, objs, cons, waited = _reference(
        problem, T.ring(N), x0, 0.05, dur, _uniform_blocks(key, ROUNDS * N), ROUNDS
    )
    sched = res.schedule
    assert waited > 5 and np.sum(sched.start > sched.request) > 5  # busy nodes make exchanges wait
    assert np.all(np.diff(sched.time) >= 0) and np.all(sched.time > sched.start)
    np.testing.assert_allclose(np.asarray(res.sim_time[1:]), times, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(res.x), z, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(res.objective[1:]), objs, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(res.consensus[1:]), cons, rtol=1e-3, atol=1e-6)
    # no node is in two exchanges at once
    for node in range(N):
        mine = (sched.node == node) | (sched.partner == node)
        assert np.all(sched.start[mine][1:] >= sched.time[mine][:-1])
    single = _run(problem, x0, spec, key, max_width=1)  # the waves compute the sequential run
    np.testing.assert_allclose(np.asarray(res.x), np.asarray(single.x), rtol=1e-6, atol=1e-7)
    assert res.waves.mean_width > 1.5


def test_zero_delays_give_the_free_run_bit_for_bit(problem, x0):
    key = jax.random.key(7)
    free = _run(problem, x0, STRAGGLERS, key, exchange="free")
    zero = _run(problem, x0, STRAGGLERS, key, latency=0.0, bandwidth=1e30)
    for name in ("time", "node", "partner", "step"):
        np.testing.assert_array_equal(getattr(zero.schedule, name), getattr(free.schedule, name))
    for a, b in zip(jax.tree_util.tree_leaves(zero.state), jax.tree_util.tree_leaves(free.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(zero.sim_time), np.asarray(free.sim_time))
    # the free schedule is the one that ignores the links (the paper's instantaneous averaging)
    slow = _run(problem, x0, STRAGGLERS, key, exchange="free", bandwidth=1.0)
    np.testing.assert_array_equal(np.asarray(slow.sim_time), np.asarray(free.sim_time))


def test_priced_zero_gradients_keep_the_mean(problem, x0):
    topology = T.ring(N)
    tm = timing.time_model(topology, compute=STRAGGLERS, latency=LATENCY, bandwidth=BANDWIDTH)
    res = asynchronous.run_async_optimization(
        problem, topology, x0, lr=0.0, time=tm, num_rounds=ROUNDS, key=jax.random.key(7), algorithm="ad_psgd"
    )
    np.testing.assert_allclose(np.asarray(res.x).mean(0), np.asarray(x0).mean(0), atol=1e-5)
    assert res.consensus[-1] < 1e-2 * res.consensus[0]


def test_the_exchange_option():
    assert Network().exchange == "priced" and Network(exchange="free").exchange == "free"
    with pytest.raises(ValueError, match=r"--time.exchange='cheap' is unknown; known: priced, free"):
        Network.from_options({"exchange": "cheap"})


def test_link_speed_shows_in_the_simulated_time(tmp_path):
    """The training command's AD-PSGD: priced exchanges at 10 Mbit/s take longer than at 1 Gbit/s;
    free exchanges take the same time at both."""

    def sim_time(bandwidth, exchange):
        time = {"compute": "stragglers:0.01,0.125,10", "latency": 1e-3, "bandwidth": bandwidth, "exchange": exchange}
        config = tiny_config(execution="async", async_form="ad_psgd", time=time, num_rounds=10, eval_every=10)
        out = tmp_path / f"{bandwidth}{exchange}"
        rows = run_training(config, str(out), progress=False, log=lambda s: None).rows
        return rows[-1]["sim_time"]

    slow, fast = sim_time(1e5, "priced"), sim_time(1e9, "priced")
    assert slow > 1.5 * fast
    assert sim_time(1e5, "free") == sim_time(1e9, "free") < fast


@pytest.mark.slow
def test_the_documented_ad_psgd_command_pays_for_slow_links(tmp_path):
    """The AD-PSGD command of docs/usage.md at 10 Mbit/s and 1 Gbit/s (85,002 parameters: 2.7
    Mbit per model, about 0.27 s each way at 10 Mbit/s)."""
    import json

    from jaxgossip.cli import main

    base = (
        "train --dataset=digits --model=mlp --num_rounds=40 --eval_every=10 --execution=async "
        "--async_form=ad_psgd --time.compute=stragglers:0.01,0.125,10 --time.latency=1e-3"
    ).split()

    def last(*flags):
        out = tmp_path / "_".join(f.split("=")[1] for f in flags)
        assert main([*base, *flags, "--out", str(out)]) == 0
        return json.loads((out / "metrics.json").read_text())["rows"][-1]

    slow, fast = last("--time.bandwidth=1e7"), last("--time.bandwidth=1e9")
    assert slow["sim_time"] > 20 * fast["sim_time"]
    assert slow["test_acc"] > 0.85 and fast["test_acc"] > 0.85
    free = [last("--time.bandwidth=1e7", "--time.exchange=free"), last("--time.bandwidth=1e9", "--time.exchange=free")]
    assert free[0]["sim_time"] == free[1]["sim_time"] < fast["sim_time"]
