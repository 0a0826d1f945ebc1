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
from jaxgossip.sim.compute import availability, parse_compute
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


def _reference(problem, topology, x0, lr, dur, block, num_rounds, churn=None, downlink=None):
    """Priced AD-PSGD one happening at a time from a heap of (time, kind, order, ...): kind 0 an
    exchange ending, kind 1 a node's gradient done (it books an exchange in both nodes' queues).
    An exchange starts when it heads both queues; the average and the step apply at its end.
    ``churn`` (tests/engine/test_async.py's ``_Online``): a gradient during which its node went
    offline is lost; the partner is drawn among the neighbours online at the request (none: the
    node's step alone, no link time); the next gradient starts at the exchange's end, or when the
    node is next online. ``downlink`` [N]: each way goes at min(sender's uplink, receiver's
    downlink)."""
    n = x0.shape[0]
    draw = [1] * n
    start_row = [0] * n
    a_mat, b_vec = np.asarray(problem.features, np.float64), np.asarray(problem.targets, np.float64)

    def grad(i, v):
        return a_mat[i].T @ (a_mat[i] @ v - b_vec[i]) / a_mat.shape[1]

    s, r, w = (np.asarray(a)[0] for a in (topology.senders, topology.receivers, topology.weights))
    nbrs = [sorted({int(b) for a, b, c in zip(s, r, w) if a == i and b != i and c != 0}) for i in range(n)]

    def one_way(a, b):  # the sender's link carries the model (per-node links), b's downlink bounds it
        return LATENCY[a] + 32.0 * D / (BANDWIDTH[a] if downlink is None else min(BANDWIDTH[a], downlink[b]))

    x = np.asarray(x0, np.float64).copy()
    x_hat = x.copy()
    queues = [[] for _ in range(n)]  # booked exchanges per node, in booking order
    busy = [False] * n
    heap = []
    for i in range(n):
        first = 0 if churn is None else churn.next_up(0, i)
        if first is not None:
            start_row[i] = first
            begin = np.float32(0) if churn is None else churn.begin(first)
            heap.append((np.float32(begin + dur[0, i]), 1, i, i, 0))
    heapq.heapify(heap)

    def next_gradient(i, begin, row, step):  # i starts a gradient at begin (in row)
        start_row[i] = row
        heapq.heappush(heap, (np.float32(begin + dur[draw[i], i]), 1, i, i, step))
        draw[i] += 1

    booked, events, times, objs, cons, waited = 0, 0, [], [], [], 0

    def try_start(ex, now):
        q, i, j, _, seconds = ex
        if queues[i][0] is ex and queues[j][0] is ex and not busy[i] and not busy[j]:
            busy[i] = busy[j] = True
            heapq.heappush(heap, (np.float32(now + seconds), 0, q, i, j))

    while events < num_rounds * n:
        t, kind, order, i, extra = heapq.heappop(heap)
        if kind == 1:  # node i's gradient is done: book an exchange with a drawn neighbour
            up = nbrs[i]
            if churn is not None:
                alive, row = churn.survives(start_row[i], t, i)
                if not alive:
                    back = churn.next_up(row, i)
                    if back is not None:
                        next_gradient(i, churn.begin(back), back, extra)
                    continue
                start_row[i] = row
                up = [j for j in nbrs[i] if churn.up(row, j)]
            u = block(booked // (num_rounds * n))[booked % (num_rounds * n)]
            j, seconds = i, np.float32(0)
            if up:
                j = up[min(int(np.floor(u * np.float32(len(up)))), len(up) - 1)]
                seconds = np.float32(one_way(i, j) + one_way(j, i))
            ex = (booked, i, j, extra, seconds)
            booked += 1
            queues[i].append(ex)
            if j != i:
                queues[j].append(ex)
            waited += queues[i][0] is not ex or queues[j][0] is not ex
            try_start(ex, t)
            continue
        j = extra  # an exchange of i with j ends at t
        ex = queues[i].pop(0)
        assert j == i or queues[j].pop(0) is ex and ex[1] == i
        busy[i] = busy[j] = False
        avg = 0.5 * (x[i] + x[j])
        x[j] = avg
        x[i] = avg - lr * grad(i, x_hat[i])
        x_hat[i] = x[i]
        step = ex[3] + 1
        if churn is None:
            next_gradient(i, t, 0, step)
        else:
            row = max(start_row[i], churn.row(t))
            back = row if churn.up(row, i) else churn.next_up(row, i)
            if back is not None:
                next_gradient(i, t if back == row else churn.begin(back), back, step)
        for node in (i, j):
            if queues[node]:
                try_start(queues[node][0], t)
        events += 1
        if events % n == 0:
            times.append(t)
            objs.append(problem.objective(x.mean(0)))
            cons.append(np.mean(np.sum((x - x.mean(0)) ** 2, -1)))
    return x, np.array(times), np.array(objs), np.array(cons), waited


def _run(problem, x0, spec, key, exchange="priced", latency=LATENCY, bandwidth=BANDWIDTH, downlink=None, **kw):
    topology = T.ring(N)
    tm = timing.time_model(
        topology, compute=spec, latency=latency, bandwidth=bandwidth, downlink=downlink, exchange=exchange
    )
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


def test_a_slow_downlink_prices_each_exchange_at_the_slower_end(problem, x0):
    """Two nodes with a downlink 10x slower than every uplink: each way of an exchange goes at
    min(uplink of its sender, downlink of its receiver), as the queue reference says."""
    key = jax.random.key(7)
    downlink = np.full(N, 1e4)
    downlink[[2, 5]] = 50.0
    res = _run(problem, x0, STRAGGLERS, key, downlink=downlink)
    dur = asynchronous.step_durations(parse_compute(STRAGGLERS), N, ROUNDS * N + 1, key)
    z, times, objs, _, _ = _reference(
        problem, T.ring(N), x0, 0.05, dur, _uniform_blocks(key, ROUNDS * N), ROUNDS, downlink=downlink
    )
    np.testing.assert_allclose(np.asarray(res.sim_time[1:]), times, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(res.x), z, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(res.objective[1:]), objs, rtol=1e-4)
    fast = _run(problem, x0, STRAGGLERS, key, downlink=np.full(N, 1e4))  # above every uplink: no change
    plain = _run(problem, x0, STRAGGLERS, key)
    np.testing.assert_array_equal(np.asarray(fast.sim_time), np.asarray(plain.sim_time))
    assert float(res.sim_time[-1]) > float(plain.sim_time[-1])


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


@pytest.mark.parametrize("spec", [STRAGGLERS, LOGNORMAL])
def test_priced_exchanges_under_churn_match_the_queue_reference(problem, x0, spec):
    from test_async import _Online, _period

    key = jax.random.key(7)
    mask = availability("markov:0.3,0.5", ROUNDS, N, 4)
    topology = T.ring(N)
    tm = timing.time_model(topology, compute=spec, latency=LATENCY, bandwidth=BANDWIDTH, available=mask)
    res = asynchronous.run_async_optimization(
        problem, topology, x0, lr=0.05, time=tm, num_rounds=ROUNDS, key=key, algorithm="ad_psgd"
    )
    dur = asynchronous.step_durations(parse_compute(spec), N, 4 * ROUNDS * N, key)
    online = _Online(mask, _period(spec, dur))
    z, times, objs, cons, waited = _reference(
        problem, topology, x0, 0.05, dur, _uniform_blocks(key, ROUNDS * N), ROUNDS, online
    )
    sched = res.schedule
    rows = np.floor(sched.request.astype(np.float64) / online.period).astype(int) % ROUNDS
    assert np.all(mask[rows, sched.node] == 1) and not np.all(mask[rows] == 1)
    assert waited > 5
    np.testing.assert_allclose(np.asarray(res.sim_time[1:]), times, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(res.x), z, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(res.objective[1:]), objs, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(res.consensus[1:]), cons, rtol=1e-3, atol=1e-6)
    ones = availability("markov:0.0,1.0", ROUNDS, N, 4)  # all online: the run without churn, bit for bit
    tm = timing.time_model(topology, compute=spec, latency=LATENCY, bandwidth=BANDWIDTH, available=ones)
    a = asynchronous.run_async_optimization(
        problem, topology, x0, lr=0.05, time=tm, num_rounds=ROUNDS, key=key, algorithm="ad_psgd"
    )
    b = _run(problem, x0, spec, key)
    for name in ("time", "node", "partner", "step", "request", "start"):
        np.testing.assert_array_equal(getattr(a.schedule, name), getattr(b.schedule, name))
    np.testing.assert_array_equal(np.asarray(a.x), np.asarray(b.x))
