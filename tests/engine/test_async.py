"""Asynchronous runs (jaxgossip.engine.asynchronous) against a heapq discrete-event reference in NumPy:
AD-PSGD, asynchronous gossip with stale copies and asynchronous (overlap) SGP."""

import heapq

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgossip import algorithms
from jaxgossip import topology as T
from jaxgossip.engine import asynchronous, problems
from jaxgossip.engine.asynchronous import waves as async_waves
from jaxgossip.sim import timing
from jaxgossip.sim.compute import availability, parse_compute

N, D, ROUNDS = 8, 3, 15  # 120 events
STRAGGLERS = "stragglers:1.0,0.25,4"
LOGNORMAL = "lognormal:1.0,0.5"
LATENCY = np.linspace(0.1, 0.6, N)  # per sender node: delays of the order of a step
BANDWIDTH = np.full(N, 500.0)


def _edges(topology):
    s, r, w = (np.asarray(a)[0] for a in (topology.senders, topology.receivers, topology.weights))
    return [(int(a), int(b), float(c)) for a, b, c in zip(s, r, w) if c != 0]


def _delays(topology, bits, mode):
    """(sender, receiver) -> float32 seconds; serial: a sender's messages leave in ascending
    receiver order, one after another."""
    out = {}
    for a in range(topology.num_nodes):
        sent = 0.0
        for b in sorted(b for s, b, _ in _edges(topology) if s == a and b != a):
            one = LATENCY[a] + bits / BANDWIDTH[a]
            sent = sent + one if mode == "serial" else one
            out[(a, b)] = np.float32(sent)
    return out


class _Online:
    """Churn for the references: ``mask [R, N]`` on the clock, row ``floor(t / period) mod R``."""

    def __init__(self, mask, period):
        self.mask, self.period = np.asarray(mask, bool), period

    def up(self, row, i):
        return bool(self.mask[row % self.mask.shape[0], i])

    def row(self, t):
        return int(np.floor(np.float64(t) / self.period))

    def next_up(self, row, i):  # the first row >= row where i is online (None: never)
        for r in range(row, row + self.mask.shape[0] + 1):
            if self.up(r, i):
                return r
        return None

    def begin(self, row):
        return np.float32(row * self.period)

    def survives(self, start_row, t, i):
        """(whether i stays online from start_row to the row of t, that row or the first offline one)"""
        end = max(start_row, self.row(t))
        for r in range(start_row, end + 1):
            if not self.up(r, i):
                return False, r
        return True, end


def _reference(rule, problem, topology, x0, lr, dur, delay, num_rounds, u=None, serial=False, churn=None, scale=None):
    """One event at a time from a heap of (time, kind, node, step, tag): kind 0 a message arriving
    (before a step finishing at the same time), kind 1 a step finishing. ``serial``: a node's
    messages queue on its uplink, an event's leaving when the previous event's last one arrived.
    ``churn`` (:class:`_Online`): a step during which its node went offline is lost (the node
    starts again at its next online row, with its next step draw); AD-PSGD averages with a
    neighbour online at the event (itself if none); messages to an offline node wait for it.
    ``scale`` [N]: node i's step is ``scale_i`` times the plain one (rate compensation)."""
    n = x0.shape[0]
    step_lr = lr * (np.ones(n) if scale is None else np.asarray(scale, np.float64))
    draw = [0] * n  # each node's step draws so far
    start_row = [0] * n
    a_mat, b_vec = np.asarray(problem.features, np.float64), np.asarray(problem.targets, np.float64)

    def grad(i, v):
        return a_mat[i].T @ (a_mat[i] @ v - b_vec[i]) / a_mat.shape[1]

    w_mat = np.zeros((n, n))
    for a, b, c in _edges(topology):
        w_mat[b, a] += c
    x = np.asarray(x0, np.float64).copy()
    x_hat, w = x.copy(), np.ones(n)
    copies = {(b, a): (0, x[a].copy()) for a, b, _ in _edges(topology) if a != b}  # (receiver, sender)
    pending_x, pending_w = np.zeros_like(x), np.zeros(n)
    heap, payload, tag = [], {}, 0
    for i in range(n):
        first = 0 if churn is None else churn.next_up(0, i)
        if first is not None:
            start_row[i] = first
            begin = np.float32(0) if churn is None else churn.begin(first)
            heap.append((np.float32(begin + dur[0, i]), 1, i, 0, 0))
    uplink_free = np.full(n, -np.inf, np.float32)
    heapq.heapify(heap)
    events, times, objs, cons = 0, [], [], []
    while events < num_rounds * n:
        t, kind, i, k, key = heapq.heappop(heap)
        if kind == 0:
            src, version, mx, mw = payload.pop(key)
            if rule == "async_gossip" and version > copies[(i, src)][0]:
                copies[(i, src)] = (version, mx)
            if rule == "async_sgp":
                pending_x[i] += mx
                pending_w[i] += mw
            continue
        draw[i] += 1
        row = 0
        if churn is not None:
            alive, row = churn.survives(start_row[i], t, i)
            if not alive:  # offline during the step: lost; start again when back online
                back = churn.next_up(row, i)
                if back is not None:
                    start_row[i] = back
                    heapq.heappush(heap, (np.float32(churn.begin(back) + dur[draw[i], i]), 1, i, k, 0))
                continue
            start_row[i] = row
        out = [b for b in range(n) if b != i and w_mat[b, i] != 0]
        messages = []
        if rule == "ad_psgd":
            nbrs = sorted(b for b in out if churn is None or churn.up(row, b))
            j = i
            if nbrs:
                j = nbrs[min(int(np.floor(np.float32(u[events]) * np.float32(len(nbrs)))), len(nbrs) - 1)]
            avg = 0.5 * (x[i] + x[j])
            x[j] = avg  # j == i (no neighbour online): the step alone
            x[i] = avg - step_lr[i] * grad(i, x_hat[i])
            x_hat[i] = x[i]
        elif rule == "async_gossip":
            new = w_mat[i, i] * x[i] - step_lr[i] * grad(i, x[i])
            for j in range(n):
                if j != i and w_mat[i, j] != 0:
                    new = new + w_mat[i, j] * copies[(i, j)][1]
            x[i] = new
            messages = [(b, (i, k + 1, x[i].copy(), 0.0)) for b in out]
        else:
            half = x[i] - step_lr[i] * w[i] * grad(i, x[i] / w[i])  # z = x / w moves by lr g
            messages = [(b, (i, k + 1, w_mat[b, i] * half, w_mat[b, i] * w[i])) for b in out]
            x[i], w[i] = w_mat[i, i] * half + pending_x[i], w_mat[i, i] * w[i] + pending_w[i]
            pending_x[i], pending_w[i] = 0.0, 0.0
        leave = max(t, uplink_free[i]) if serial else t
        for b, p in messages:
            tag += 1
            payload[tag] = p
            arrival = np.float32(leave + delay[(i, b)])
            uplink_free[i] = max(uplink_free[i], arrival)
            heapq.heappush(heap, (arrival, 0, b, 0, tag))
        heapq.heappush(heap, (np.float32(t + dur[draw[i], i]), 1, i, k + 1, 0))
        events += 1
        if events % n == 0:
            z = x / w[:, None]
            times.append(t)
            objs.append(problem.objective(z.mean(0)))
            cons.append(np.mean(np.sum((z - z.mean(0)) ** 2, -1)))
    in_flight = (
        pending_x.sum(0) + sum((p[2] for p in payload.values()), np.zeros(x.shape[1])),
        pending_w.sum() + sum(p[3] for p in payload.values()),
    )
    return x / w[:, None], np.array(times), np.array(objs), np.array(cons), (x, w, in_flight)


@pytest.fixture(scope="module")
def problem():
    return problems.least_squares(N, D, 8, heterogeneity=2.0, seed=1)


@pytest.fixture(scope="module")
def x0(problem):
    return problem.init_params(jax.random.key(3))


def _directed(n):
    """i -> i + 1 and i -> i + 3 (mod n), column-stochastic weights 1/3 (push-sum)."""
    adjacency = np.zeros((n, n))
    for i in range(n):
        adjacency[i, (i + 1) % n] = adjacency[i, (i + 3) % n] = 1
    return T.from_adjacency(adjacency, weights="column")


def _graph(rule):
    return _directed(N) if rule == "async_sgp" else T.ring(N)


def _run(rule, problem, x0, spec, key, mode="parallel", lr=0.05, exchange="priced", **kw):
    topology = _graph(rule)
    tm = timing.time_model(topology, compute=spec, latency=LATENCY, bandwidth=BANDWIDTH, mode=mode, exchange=exchange)
    return asynchronous.run_async_optimization(
        problem, topology, x0, lr=lr, time=tm, num_rounds=ROUNDS, key=key, algorithm=rule, **kw
    )


@pytest.mark.parametrize(
    "rule, spec, mode",
    [
        ("ad_psgd", STRAGGLERS, "parallel"),
        ("ad_psgd", LOGNORMAL, "parallel"),
        ("async_gossip", STRAGGLERS, "parallel"),
        ("async_gossip", LOGNORMAL, "serial"),
        ("async_sgp", STRAGGLERS, "serial"),
        ("async_sgp", LOGNORMAL, "parallel"),
    ],
)
def test_matches_heapq_reference(problem, x0, rule, spec, mode):
    """AD-PSGD with free (instantaneous) averaging, the paper's model; priced exchanges are checked
    against their own reference in tests/engine/test_async_exchanges.py."""
    key = jax.random.key(7)
    res = _run(rule, problem, x0, spec, key, mode, exchange="free")
    topology = _graph(rule)
    bits = 32.0 * D + (32.0 if rule == "async_sgp" else 0.0)
    # the time model's draws as the run makes them (a jitted vmap; the test compiles without
    # XLA's optimizations, where an eager draw can differ in the last bit)
    dur = asynchronous.step_durations(parse_compute(spec), N, ROUNDS * N + 1, key)
    u = np.asarray(jax.random.uniform(jax.random.split(key)[0], (ROUNDS * N,)))
    z, times, objs, cons, (_, _, flight) = _reference(
        rule, problem, topology, x0, 0.05, dur, _delays(topology, bits, mode), ROUNDS, u, mode == "serial"
    )
    if spec == STRAGGLERS:  # the stragglers really straggle: the fast nodes do more events
        counts = np.bincount(res.schedule.node, minlength=N)
        assert counts.max() >= 2 * counts.min()
    if rule != "ad_psgd":  # the delays matter: some reads are stale or some messages wait
        assert res.waves.slots >= 2
    np.testing.assert_allclose(np.asarray(res.sim_time[1:]), times, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(res.x), z, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(res.objective[1:]), objs, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(res.consensus[1:]), cons, rtol=1e-3, atol=1e-6)
    assert res.waves.mean_width > 1.5  # events really share waves
    if rule == "async_sgp":
        np.testing.assert_allclose(np.asarray(res.in_flight[0]), flight[0], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(float(res.in_flight[1]), flight[1], rtol=1e-5)
    if spec == LOGNORMAL:  # the waves compute the one-event-per-step simulation
        single = _run(rule, problem, x0, spec, key, mode, exchange="free", max_width=1)
        assert single.waves.num_waves == ROUNDS * N and single.waves.width == 1
        for a, b in zip(jax.tree_util.tree_leaves(res.state), jax.tree_util.tree_leaves(single.state)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(np.asarray(res.objective), np.asarray(single.objective), rtol=1e-6)


def test_ad_psgd_zero_gradients_keep_mean_and_contract(problem, x0):
    res = _run("ad_psgd", problem, x0, STRAGGLERS, jax.random.key(7), lr=0.0)
    np.testing.assert_allclose(np.asarray(res.x).mean(0), np.asarray(x0).mean(0), atol=1e-5)
    assert res.consensus[-1] < 1e-2 * res.consensus[0]


def test_async_gossip_zero_gradients_reach_consensus(problem, x0):
    res = _run("async_gossip", problem, x0, LOGNORMAL, jax.random.key(7), "serial", lr=0.0)
    assert res.consensus[-1] < 1e-2 * res.consensus[0]
    # stale copies: the node mean drifts although W is doubly stochastic (docs/training.md)
    assert np.abs(np.asarray(res.x).mean(0) - np.asarray(x0).mean(0)).max() > 1e-4


@pytest.mark.parametrize("mode", ["parallel", "serial"])
def test_async_sgp_keeps_mass_in_flight(problem, x0, mode):
    res = _run("async_sgp", problem, x0, STRAGGLERS, jax.random.key(7), mode, lr=0.0)
    flight_x, flight_w = (np.asarray(a, np.float64) for a in res.in_flight)
    mass_x = np.asarray(res.state.x, np.float64).sum(0) + flight_x
    mass_w = float(np.asarray(res.state.w, np.float64).sum() + flight_w)
    np.testing.assert_allclose(mass_x, np.asarray(x0, np.float64).sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mass_w, N, rtol=1e-6)
    assert flight_w > 0.1  # some messages are still in flight
    # serial: a fast node's uplink needs longer per event than its step, so its messages queue
    # (more than half of the weight is queued at the end) and consensus comes more slowly
    assert res.consensus[-1] < (1e-2 if mode == "parallel" else 5e-2) * res.consensus[0]
    assert (flight_w > 0.5 * N) == (mode == "serial")


@pytest.mark.parametrize("rule", sorted(algorithms.ASYNC_FORMS))
def test_same_key_same_run(problem, x0, rule):
    mode = "serial" if rule == "async_gossip" else "parallel"
    a, b = (_run(rule, problem, x0, LOGNORMAL, jax.random.key(7), mode) for _ in range(2))
    for left, right in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(left), np.asarray(right))
    other = asynchronous.async_schedule(parse_compute(LOGNORMAL), N, ROUNDS * N, jax.random.key(8))
    assert not np.array_equal(a.schedule.time, other.time)


def test_schedule_equals_full_draw():
    """Drawing K < E steps per node gives the first E events of drawing all E steps."""
    compute = parse_compute("lognormal:1.0,2.0")  # heavy tails: some nodes run far ahead
    key = jax.random.key(5)
    sched = asynchronous.async_schedule(compute, 4, 200, key)
    assert sched.step.max() < 150  # it drew fewer than E steps per node
    finish = np.cumsum(asynchronous.step_durations(compute, 4, 200, key), axis=0, dtype=np.float32)
    step, node = np.meshgrid(np.arange(200), np.arange(4), indexing="ij")
    order = np.lexsort((step.ravel(), node.ravel(), finish.ravel()))[:200]
    np.testing.assert_array_equal(sched.node, node.ravel()[order])
    np.testing.assert_array_equal(sched.step, step.ravel()[order])
    np.testing.assert_array_equal(sched.time, finish.ravel()[order])


def test_constant_compute_fills_waves(problem, x0):
    """Equal clocks: all N events of a round happen at once and read only older versions."""
    res = _run("async_gossip", problem, x0, 1.0, jax.random.key(0))
    assert res.waves == asynchronous.WaveStats(ROUNDS, N, float(N), res.waves.slots)


def test_pack_waves_respects_rounds_and_width():
    level = np.array([0, 0, 0, 1, 2, 2, 2, 2])
    plan = async_waves.pack_waves(level, 4, max_width=2)
    np.testing.assert_array_equal(plan.events, [[0, 1], [2, -1], [3, -1], [4, 5], [6, 7]])
    np.testing.assert_array_equal(plan.boundary, [2, 4])


def test_algorithm_names_and_execution_metadata():
    assert asynchronous.resolve_algorithm("gossip").name == "async_gossip"
    assert asynchronous.resolve_algorithm("push_sum").name == "async_sgp"
    assert sorted(algorithms.ASYNC_FORMS) == ["ad_psgd", "async_gossip", "async_sgp"]
    assert algorithms.info("gossip").execution.modes == ("sync", "async")
    assert algorithms.info("choco").execution.modes == ("sync",)
    with pytest.raises(ValueError, match=r"choco cannot run with execution='async'.*gossip, push_sum"):
        asynchronous.resolve_algorithm("choco")
    with pytest.raises(ValueError, match=r"unknown algorithm 'hogwild'.*ad_psgd"):
        asynchronous.resolve_algorithm("hogwild")
    with pytest.raises(ValueError, match="execution='lazy' is unknown"):
        algorithms.check_execution("gossip", algorithms.info("gossip"), "lazy")
    with pytest.raises(TypeError, match="asynchronous="):
        algorithms.Execution(asynchronous="async_gossip")
    with pytest.raises(TypeError, match="asynchronous="):  # a form is an AsyncForm, not a name
        algorithms.Execution(asynchronous=("async_gossip",))
    # a plug-in's metadata: its reason is the refusal's, and an unknown event rule is named
    lockstep = algorithms.Execution(reasons={"asynchronous": "it counts rounds"})
    algorithms.register("lockstep_gossip", algorithms.gossip, execution=lockstep)
    try:
        with pytest.raises(ValueError, match=r"lockstep_gossip cannot run.*\(it counts rounds\)"):
            asynchronous.resolve_algorithm("lockstep_gossip")
        with pytest.raises(ValueError, match="rule='hogwild' is unknown; known: pairwise_averaging, stale_mixing"):
            algorithms.AsyncForm("hogwild", rule="hogwild")
    finally:
        algorithms.unregister("lockstep_gossip")
    # a plug-in's own form of a known rule joins the registry's forms and runs; one name, one form
    stale = algorithms.AsyncForm("stale_plugin", rule="stale_mixing")
    algorithms.register("stale_gossip", algorithms.gossip, execution=algorithms.Execution(asynchronous=(stale,)))
    try:
        assert algorithms.ASYNC_FORMS["stale_plugin"] is stale and stale.weights == "receiver_stochastic"
        assert asynchronous.resolve_algorithm("stale_gossip") is stale
        with pytest.raises(ValueError, match="'stale_plugin' is registered by stale_gossip with rule='stale_mixing'"):
            algorithms.register(
                "other_gossip",
                algorithms.gossip,
                execution=algorithms.Execution(
                    asynchronous=(algorithms.AsyncForm("stale_plugin", "delayed_push_sum"),)
                ),
            )
    finally:
        algorithms.unregister("stale_gossip")
    assert "stale_plugin" not in algorithms.ASYNC_FORMS


def test_bad_input(problem, x0):
    def run(**kw):
        args = dict(lr=0.1, time=1.0, num_rounds=1, key=jax.random.key(0))
        topology = kw.pop("topology", T.ring(N))
        return asynchronous.run_async_optimization(problem, topology, kw.pop("x0", x0), **{**args, **kw})

    with pytest.raises(ValueError, match="num_rounds"):
        run(num_rounds=0)
    with pytest.raises(ValueError, match="max_width=0"):
        run(max_width=0)
    with pytest.raises(ValueError, match="x0 must be"):
        run(x0=jnp.zeros((N + 1, D)))
    with pytest.raises(ValueError, match="choco cannot run with execution='async'"):
        run(algorithm="choco")
    with pytest.raises(ValueError, match="needs a fixed graph; random_matching"):
        run(topology=T.random_matching(N), algorithm="async_gossip")
    with pytest.raises(ValueError, match="period T = 1"):
        run(topology=T.one_peer_exponential(N), algorithm="async_sgp")
    star = np.zeros((N, N))
    star[0, 1:] = star[1:, 0] = star[1, 2] = 1  # irregular and directed: columns sum to 1, rows do not
    with pytest.raises(ValueError, match="async_gossip needs each receiver's weights.*at node"):
        run(topology=T.from_adjacency(star, weights="column"), algorithm="async_gossip")
    with pytest.raises(ValueError, match="gossip is registered with mixing='doubly_stochastic'"):
        run(topology=T.from_adjacency(star, weights="column"), algorithm="gossip")


@pytest.mark.parametrize("algorithm", ["ad_psgd", "async_gossip", "async_sgp"])
def test_event_bits_per_node_loop(algorithm):
    topology = T.exponential(N) if algorithm == "async_sgp" else T.ring(N)
    plan = asynchronous.plan_async(topology, STRAGGLERS, ROUNDS, jax.random.key(3), algorithm, D)
    sched = plan.schedule
    want = np.zeros((ROUNDS, N))
    s, r = (np.asarray(a)[0] for a in (topology.senders, topology.receivers))
    for e, i in enumerate(sched.node):
        if algorithm == "ad_psgd":
            for j in (i, sched.partner[e]):
                want[e // N, j] += 32 * D
        else:
            out_neighbours = {int(b) for a, b in zip(s, r) if a == i and b != i}
            want[e // N, i] += (32 * D + (32 if algorithm == "async_sgp" else 0)) * len(out_neighbours)
    np.testing.assert_array_equal(asynchronous.event_bits(plan, D, N), want)


def test_uplink_arrivals_queue_in_serial_mode():
    """Node 0 sends to 1 and 2 at its events (t = 0, 1, 5); serial: cumulative transfers 0.5 and
    1.5, and an event's messages wait for the previous event's; parallel: 0.5 and 1.0 each."""
    time = np.array([0.0, 1.0, 5.0], np.float32)
    node = np.zeros(3, np.int32)
    serial = async_waves.uplink_arrivals(time, node, {(0, 1): 0.5, (0, 2): 1.5}, True, 3)
    np.testing.assert_array_equal(serial[(0, 1)], [0.5, 2.0, 5.5])
    np.testing.assert_array_equal(serial[(0, 2)], [1.5, 3.0, 6.5])
    parallel = async_waves.uplink_arrivals(time, node, {(0, 1): 0.5, (0, 2): 1.0}, False, 3)
    np.testing.assert_array_equal(parallel[(0, 1)], [0.5, 1.5, 5.5])
    np.testing.assert_array_equal(parallel[(0, 2)], [1.0, 2.0, 6.0])


# Churn (--time.availability with --execution=async, jaxgossip/engine/asynchronous/churn.py)
CHURN_CASES = [
    ("ad_psgd", STRAGGLERS, "parallel"),
    ("async_gossip", LOGNORMAL, "serial"),
    ("async_sgp", STRAGGLERS, "serial"),
]


def _mask(spec="markov:0.3,0.5", seed=4):
    return availability(spec, ROUNDS, N, seed)


def _period(spec, dur):
    """P = N / sum_i 1 / E[p_i]: the stragglers' step times are their constant ones; lognormal
    steps have mean MEDIAN exp(SIGMA^2 / 2) on every node."""
    expected = dur[0].astype(np.float64) if spec == STRAGGLERS else np.full(N, np.exp(0.5**2 / 2))
    return N / np.sum(1.0 / expected)


def _churn_run(rule, problem, x0, spec, key, mode, mask, lr=0.05, **kw):
    topology = _graph(rule)
    tm = timing.time_model(
        topology, compute=spec, latency=LATENCY, bandwidth=BANDWIDTH, mode=mode, exchange="free", available=mask
    )
    return asynchronous.run_async_optimization(
        problem, topology, x0, lr=lr, time=tm, num_rounds=ROUNDS, key=key, algorithm=rule, **kw
    )


@pytest.mark.parametrize("rule, spec, mode", CHURN_CASES)
def test_churn_matches_heapq_reference(problem, x0, rule, spec, mode):
    key, mask = jax.random.key(7), _mask()
    res = _churn_run(rule, problem, x0, spec, key, mode, mask)
    topology = _graph(rule)
    bits = 32.0 * D + (32.0 if rule == "async_sgp" else 0.0)
    dur = asynchronous.step_durations(parse_compute(spec), N, 4 * ROUNDS * N, key)
    online = _Online(mask, _period(spec, dur))
    u = np.asarray(jax.random.uniform(jax.random.split(key)[0], (ROUNDS * N,)))
    z, times, objs, cons, (_, _, flight) = _reference(
        rule, problem, topology, x0, 0.05, dur, _delays(topology, bits, mode), ROUNDS, u, mode == "serial", online
    )
    sched = res.schedule
    rows = np.floor(sched.time.astype(np.float64) / online.period).astype(int) % ROUNDS
    assert np.all(mask[rows, sched.node] == 1)  # every event's node is online
    assert not np.all(mask[rows] == 1)  # and some nodes were offline meanwhile
    free = _run(rule, problem, x0, spec, key, mode, exchange="free")
    assert sched.time[-1] > free.schedule.time[-1]  # churn slows the run down
    np.testing.assert_allclose(np.asarray(res.sim_time[1:]), times, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(res.x), z, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(res.objective[1:]), objs, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(res.consensus[1:]), cons, rtol=1e-3, atol=1e-6)
    if rule == "async_sgp":
        np.testing.assert_allclose(np.asarray(res.in_flight[0]), flight[0], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(float(res.in_flight[1]), flight[1], rtol=1e-5)


@pytest.mark.parametrize("rule, spec, mode", CHURN_CASES)
def test_all_online_mask_is_the_run_without_churn(problem, x0, rule, spec, mode):
    """A mask of ones plans through the churn schedule and gives the run without one, bit for bit."""
    key = jax.random.key(7)
    ones = _mask("markov:0.0,1.0")
    assert np.all(ones == 1)
    a = _churn_run(rule, problem, x0, spec, key, mode, ones)
    b = _run(rule, problem, x0, spec, key, mode, exchange="free")
    for name in ("time", "node", "partner", "step"):
        np.testing.assert_array_equal(getattr(a.schedule, name), getattr(b.schedule, name))
    for left, right in zip(jax.tree_util.tree_leaves(a.state), jax.tree_util.tree_leaves(b.state)):
        np.testing.assert_array_equal(np.asarray(left), np.asarray(right))


def test_churn_keeps_the_sums(problem, x0):
    """Zero gradients under churn: AD-PSGD keeps the node mean, SGP keeps x and w with what is in
    flight (messages to offline nodes wait, none is lost)."""
    mask = _mask("markov:0.4,0.4", seed=2)
    res = _churn_run("ad_psgd", problem, x0, STRAGGLERS, jax.random.key(7), "parallel", mask, lr=0.0)
    np.testing.assert_allclose(np.asarray(res.x).mean(0), np.asarray(x0).mean(0), atol=1e-5)
    res = _churn_run("async_sgp", problem, x0, STRAGGLERS, jax.random.key(7), "serial", mask, lr=0.0)
    flight_x, flight_w = (np.asarray(a, np.float64) for a in res.in_flight)
    mass_x = np.asarray(res.state.x, np.float64).sum(0) + flight_x
    np.testing.assert_allclose(mass_x, np.asarray(x0, np.float64).sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(np.asarray(res.state.w, np.float64).sum() + flight_w), N, rtol=1e-6)


def test_a_node_offline_half_the_time_does_fewer_steps(problem, x0, tmp_path):
    trace = np.ones((2, N))
    trace[1, 0] = 0  # node 0 is offline in every other row
    path = tmp_path / "online.csv"
    np.savetxt(path, trace, delimiter=",")
    mask = availability(f"trace:{path}", ROUNDS, N, 0)
    res = _churn_run("async_gossip", problem, x0, 1.0, jax.random.key(0), "parallel", mask)
    counts = np.bincount(res.schedule.node, minlength=N)
    # P = 1 s = one step: a step started at a row's start ends in the next row, so node 0 (online
    # one row in two) loses every step; the others go on
    assert counts[0] == 0 and counts[1:].min() > 0
    topology = T.ring(N)
    tm = timing.time_model(topology, compute=1.0, latency=0.0, bandwidth=1e30, available=mask)
    res = asynchronous.run_async_optimization(
        problem, topology, x0, lr=0.05, time=tm, num_rounds=ROUNDS, key=jax.random.key(0), algorithm="ad_psgd"
    )  # priced exchanges: the node that never finishes a step does not stall the planner
    assert np.bincount(res.schedule.node, minlength=N)[0] == 0
    with pytest.raises(ValueError, match="no node is ever online"):
        _churn_run("async_gossip", problem, x0, 1.0, jax.random.key(0), "parallel", np.zeros((ROUNDS, N)))


# Rate compensation (rate_compensation=True, --async_rate_compensation=true)
@pytest.mark.parametrize("rule, mode", [("ad_psgd", "parallel")])
def test_rate_compensation_matches_heapq_reference(problem, x0, rule, mode):
    key = jax.random.key(7)
    res = _run(rule, problem, x0, STRAGGLERS, key, mode, exchange="free", rate_compensation=True)
    dur = asynchronous.step_durations(parse_compute(STRAGGLERS), N, ROUNDS * N + 1, key)
    expected = dur[0].astype(np.float64)  # a straggler's steps all take S C, the others' C
    scale = expected * np.mean(1.0 / expected)
    assert scale.max() > 2 * scale.min()
    bits = 32.0 * D + (32.0 if rule == "async_sgp" else 0.0)
    u = np.asarray(jax.random.uniform(jax.random.split(key)[0], (ROUNDS * N,)))
    topology = _graph(rule)
    z, times, objs, _, _ = _reference(
        rule, problem, topology, x0, 0.05, dur, _delays(topology, bits, mode), ROUNDS, u, mode == "serial", None, scale
    )
    np.testing.assert_allclose(np.asarray(res.x), z, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(res.objective[1:]), objs, rtol=1e-4)
    plain = _run(rule, problem, x0, STRAGGLERS, key, mode, exchange="free")
    assert not np.allclose(np.asarray(plain.x), np.asarray(res.x))


@pytest.mark.parametrize("spec", [LOGNORMAL, 1.0])
def test_rate_compensation_with_equal_rates_is_the_plain_rule(problem, x0, spec):
    """Equal expected step times give weights of exactly 1: the plain run, bit for bit."""
    key = jax.random.key(7)
    assert np.array_equal(asynchronous.rate_weights(parse_compute(spec), N, key), np.ones(N, np.float32))
    for exchange in ("free", "priced"):
        a = _run("ad_psgd", problem, x0, spec, key, exchange=exchange, rate_compensation=True)
        b = _run("ad_psgd", problem, x0, spec, key, exchange=exchange)
        for left, right in zip(jax.tree_util.tree_leaves(a.state), jax.tree_util.tree_leaves(b.state)):
            np.testing.assert_array_equal(np.asarray(left), np.asarray(right))


def test_rate_compensation_moves_towards_the_uniform_minimizer():
    """Two nodes 4x slower, full-batch gradients, small steps: plain AD-PSGD settles near the
    minimizer of the event-rate-weighted objective sum_i f_i / E[p_i], the compensated one near x*
    of sum_i f_i. Asynchronous gossip and SGP settle near x* without it (why they refuse it)."""
    problem = problems.least_squares(N, D, 8, heterogeneity=3.0, seed=2)
    x0 = jnp.zeros((N, D), jnp.float32)
    spec, key = "stragglers:1.0,0.25,4", jax.random.key(1)
    expected = asynchronous.step_durations(parse_compute(spec), N, 1, key)[0].astype(np.float64)
    a, b = np.asarray(problem.features, np.float64), np.asarray(problem.targets, np.float64)
    rate = 1.0 / expected
    x_rate = np.linalg.solve(np.einsum("n,nmd,nme->de", rate, a, a), np.einsum("n,nmd,nm->d", rate, a, b))
    x_star = np.asarray(problem.x_star, np.float64)
    assert np.linalg.norm(x_rate - x_star) > 1.0  # the two objectives differ

    def final_mean(algorithm, compensate=False):
        topology = _graph(algorithm)
        tm = timing.time_model(topology, compute=spec, exchange="free")
        res = asynchronous.run_async_optimization(
            problem,
            topology,
            x0,
            lr=0.005,
            time=tm,
            num_rounds=600,
            key=key,
            algorithm=algorithm,
            rate_compensation=compensate,
        )
        return np.asarray(res.x, np.float64).mean(0)

    plain, fair = final_mean("ad_psgd"), final_mean("ad_psgd", True)
    assert np.linalg.norm(plain - x_rate) < 0.25 * np.linalg.norm(plain - x_star)
    assert np.linalg.norm(fair - x_star) < 0.25 * np.linalg.norm(plain - x_star)
    for algorithm in ("async_gossip", "async_sgp"):
        mean = final_mean(algorithm)
        assert np.linalg.norm(mean - x_star) < 0.25 * np.linalg.norm(mean - x_rate)
        with pytest.raises(ValueError, match=f"rate_compensation=True with {algorithm}: .* already"):
            final_mean(algorithm, True)
