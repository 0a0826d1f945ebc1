"""The host plan of an asynchronous run (:mod:`jaxgossip.engine.asynchronous`): which form runs and
whether the graph suits it, the schedule of events on the simulated clock, the link delays of
each message, the per-event tables of each rule's wave and the bits every event sends.

Everything here runs on the host (NumPy, plus one small jit that draws the step durations) and
depends only on the time model, the graph and the key, never on model values; the event rules
that then run the plan (the compiled scan over waves) are :mod:`~jaxgossip.engine.asynchronous.rules`,
the stale versions, delayed messages and the packing of events into waves
:mod:`~jaxgossip.engine.asynchronous.waves`.

The schedule (:func:`async_schedule`): node i's k-th local step takes ``p_{k,i}`` seconds
(:func:`jaxgossip.sim.compute.compute_seconds`) and finishes at ``T_{k,i} = sum_{l <= k} p_{l,i}``
(a float32 running sum); events are in time order (ties: lower node first, then lower step), and
AD-PSGD's event e picks its neighbour slot ``floor(u_e deg_i)`` with
``u = uniform(key_sched, [E])``, ``key_sched, key_grad = split(key)``. That is the schedule of
free exchanges (``--time.exchange=free``); with priced ones (the default) an AD-PSGD event is the
end of an exchange that took its link time and waited for busy nodes
(:mod:`~jaxgossip.engine.asynchronous.exchanges`).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.checks import is_concrete
from jaxgossip.engine.asynchronous import churn as async_churn
from jaxgossip.engine.asynchronous import exchanges as async_exchanges
from jaxgossip.engine.asynchronous import waves as async_waves
from jaxgossip.engine.asynchronous.rates import step_rates
from jaxgossip.sim import timing
from jaxgossip.sim.compute import Compute, compute_seconds, parse_compute
from jaxgossip.sim.network import Links, Network
from jaxgossip.types import Array, AsyncForm, PRNGKey

__all__ = [
    "AsyncSchedule",
    "WaveStats",
    "resolve_algorithm",
    "neighbor_table",
    "step_durations",
    "async_schedule",
    "churn_schedule",
    "priced_schedule",
    "WaveTables",
    "AsyncPlan",
    "check_async_graph",
    "prices_exchanges",
    "plan_async",
    "event_bits",
    "message_bits",
]


class AsyncSchedule(NamedTuple):
    """The first E events of a run in time order (NumPy arrays).

    Attributes:
      time: [E] float32 finish time of each event (seconds): the end of its step, or of its
        exchange (``ad_psgd`` with priced exchanges).
      node: [E] int32 node that finishes a step.
      partner: [E] int32 the neighbour it averages with (``ad_psgd``; the node itself otherwise).
      step: [E] int32 which local step of ``node`` it is (0-based).
      request, start: [E] float32, with priced exchanges: when the node's gradient was done and
        when its exchange began (:class:`~jaxgossip.engine.asynchronous.exchanges.PricedSchedule`);
        None otherwise.
    """

    time: np.ndarray
    node: np.ndarray
    partner: np.ndarray
    step: np.ndarray
    request: np.ndarray | None = None
    start: np.ndarray | None = None


class WaveStats(NamedTuple):
    """How the events were packed (:mod:`jaxgossip.engine.asynchronous.waves`).

    Attributes:
      num_waves: M, waves of the scan.
      width: W, slots per wave (the widest wave).
      mean_width: E / M, events per wave on average.
      slots: S, versions kept per node (``async_gossip``: models; ``async_sgp``: sent
        messages); 0 (``ad_psgd``).
    """

    num_waves: int
    width: int
    mean_width: float
    slots: int


def resolve_algorithm(algorithm: str) -> AsyncForm:
    """The asynchronous form (:class:`~jaxgossip.types.AsyncForm`) that ``algorithm`` names: a
    registered form (:data:`jaxgossip.algorithms.ASYNC_FORMS`), or a registered algorithm (or
    import path) whose metadata has an asynchronous form (``execution.asynchronous``, the first one).

    Raises:
      ValueError: an unknown name, or an algorithm without an asynchronous mode (the reason, from
        :func:`jaxgossip.algorithms.check_execution`).
    """
    from jaxgossip import algorithms  # the registry imports much of the library; only needed here

    forms = algorithms.ASYNC_FORMS
    if algorithm in forms:
        return forms[algorithm]
    try:
        entry = algorithms.resolve(algorithm)
    except ValueError as err:
        raise ValueError(f"{err}; asynchronous algorithms: {', '.join(sorted(forms))}") from None
    algorithms.check_execution(algorithm, entry, "async")
    return entry.execution.asynchronous[0]


def _graph(topology: Any, algorithm: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The real edges ``(senders, receivers, weights)`` of the graph and the self weights ``[N]``.

    Raises:
      ValueError: a stochastic or time-varying graph; TypeError: a stack (traced tables).
    """
    if topology.stochastic:
        raise ValueError(f"{algorithm} needs a fixed graph; {topology.name} is drawn every round")
    if topology.period != 1:
        raise ValueError(
            f"{algorithm} needs a static graph (period T = 1): asynchronous nodes have no common "
            f"round to switch graphs on; {topology.name} has T = {topology.period}"
        )
    if not topology.host_tables:
        raise TypeError(f"{algorithm} plans its events on the host and needs a graph with host tables, not a stack")
    s, r, w = (np.asarray(a)[0] for a in (topology.senders, topology.receivers, topology.weights))
    n = topology.num_nodes
    self_w = np.zeros(n, np.float64)
    np.add.at(self_w, s[(s == r)], w[(s == r)])
    real = (w != 0) & (s != r)
    return s[real], r[real], w[real], self_w


def neighbor_table(topology: Any, algorithm: str = "ad_psgd") -> tuple[np.ndarray, np.ndarray]:
    """``(table [N, Dmax] int32, degree [N] int32)``: each node's out-neighbours in the graph (real
    edges: weight != 0, no self loop), ascending, padded with the node itself.

    Raises:
      ValueError: a stochastic or time-varying graph, or a node without out-neighbours.
    """
    s, r, _, _ = _graph(topology, algorithm)
    n = topology.num_nodes
    pairs = np.unique(np.stack([s, r], axis=1).astype(np.int64).reshape(-1, 2), axis=0)  # by sender, receiver
    degree = np.bincount(pairs[:, 0], minlength=n)
    lonely = np.flatnonzero(degree == 0).tolist()
    if lonely:
        raise ValueError(f"node(s) {lonely} of {topology.name} have no out-neighbour to average with")
    rank = np.arange(pairs.shape[0]) - np.r_[0, np.cumsum(degree)[:-1]][pairs[:, 0]]
    table = np.repeat(np.arange(n)[:, None], degree.max(), axis=1)  # padded with the node itself
    table[pairs[:, 0], rank] = pairs[:, 1]
    return table.astype(np.int32), degree.astype(np.int32)


def _edge_delays(links: Links, topology: Any, bits: float, one: bool = False) -> dict[tuple[int, int], float]:
    """(sender, receiver) -> seconds a message of ``bits`` takes on graph 0's real edges (serial
    uplinks: the cumulative transfer of the sender's messages in ascending receiver order; ``one``:
    a single message, ``latency + bits / bandwidth``), the bandwidth bounded by the receiver's
    downlink when the links have one (``min(b_e, b^down_receiver)``; messages do not queue on it)."""
    if links.kind != "graph":
        raise ValueError(f"asynchronous runs need per-edge or per-node links on the graph, not {links.kind!r} links")
    if links.cycled or links.edge_cycled:
        raise ValueError(
            f"asynchronous runs need links fixed in time; the {' and '.join(links.cycled + links.edge_cycled)} "
            "change with the round (a trace of several rows), but events are not rounds: give a trace of one row"
        )
    if np.shape(links.senders) != np.shape(topology.senders):
        raise ValueError(
            f"the time model's links have {np.shape(links.senders)} edges; the graph has {np.shape(topology.senders)}: "
            "build the time model on the same topology"
        )
    s = np.asarray(topology.senders)[0]
    r = np.asarray(topology.receivers)[0]
    real = np.flatnonzero(np.asarray(links.real)[0])
    lat = np.asarray(links.latency, np.float64)[0]
    bw = np.asarray(links.bandwidth, np.float64)[0]
    if links.downlink is not None:
        bw = np.minimum(bw, np.asarray(links.downlink, np.float64)[r])
    edges = real[np.lexsort((real, r[real], s[real]))]  # by sender, then receiver, then edge
    sent = lat[edges] + bits / bw[edges]
    if links.mode == "serial" and not one:  # running sums per sender, added in order (float64)
        first = np.r_[True, s[edges][1:] != s[edges][:-1]]
        rank = np.arange(edges.size) - np.maximum.accumulate(np.where(first, np.arange(edges.size), 0))
        for k in range(1, int(rank.max(initial=0)) + 1):
            at = np.flatnonzero(rank == k)
            sent[at] = sent[at - 1] + sent[at]
    return dict(zip(zip(s[edges].tolist(), r[edges].tolist()), sent.tolist()))


def _slot_table(pairs: list[list[tuple[int, float]]], n: int):
    """``(table [N, K] int32 padded with the node, real [N, K], weight [N, K])`` from per-node
    lists of (neighbour, weight)."""
    width = max(1, max(len(p) for p in pairs))
    table = np.array([[nb for nb, _ in p] + [i] * (width - len(p)) for i, p in enumerate(pairs)], np.int32)
    real = np.array([[True] * len(p) + [False] * (width - len(p)) for p in pairs], bool)
    weight = np.array([[w for _, w in p] + [0.0] * (width - len(p)) for p in pairs], np.float32)
    return table.reshape(n, width), real.reshape(n, width), weight.reshape(n, width)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _durations(compute, clock_key, n, num_steps):
    key = jax.random.wrap_key_data(clock_key)
    return jax.vmap(lambda k: compute_seconds(compute, key, k, n))(jnp.arange(num_steps, dtype=jnp.int32))


def step_durations(compute: Compute, num_nodes: int, num_steps: int, key: PRNGKey) -> np.ndarray:
    """``[K, N]`` float32 seconds of every node's first K = ``num_steps`` local steps in the run
    with key ``key`` (:func:`jaxgossip.sim.compute.compute_seconds` with the clock's key), as the
    schedule draws them."""
    return np.asarray(_durations(compute, timing.init_clock(key).key, num_nodes, num_steps), np.float32)


def async_schedule(
    compute: Compute, num_nodes: int, num_events: int, key: PRNGKey, table=None, degree=None
) -> AsyncSchedule:
    """The first ``num_events`` (E) events of the run with key ``key`` (module docstring), on the host.

    Every node's first K step durations are drawn (K doubled from about 2 E / N until no node has
    K events among the first E, so no later step can precede them; K <= E), summed in float32 in
    step order, and sorted. With ``table, degree`` (:func:`neighbor_table`) each event gets its
    AD-PSGD partner; otherwise the partner is the node itself.
    """
    n = num_nodes
    steps = min(num_events, 2 * -(-num_events // n) + 16)
    while True:
        durations = step_durations(compute, n, steps, key)  # [K, N]
        finish = np.cumsum(durations, axis=0, dtype=np.float32)  # sequential float32 sums
        step_idx = np.repeat(np.arange(steps, dtype=np.int32), n)
        node_idx = np.tile(np.arange(n, dtype=np.int32), steps)
        flat = finish.reshape(-1)
        order = np.lexsort((step_idx, node_idx, flat))[:num_events]
        node = node_idx[order]
        if steps == num_events or np.bincount(node, minlength=n).max() < steps:
            break
        steps = min(num_events, 2 * steps)
    partner = node.copy()
    if table is not None:
        key_sched, _ = jax.random.split(key)
        u = np.asarray(jax.random.uniform(key_sched, (num_events,)), np.float32)
        deg = np.asarray(degree)[node]
        slot = np.minimum(np.floor(u * deg.astype(np.float32)).astype(np.int32), deg - 1)
        partner = np.asarray(table)[node, slot].astype(np.int32)
    return AsyncSchedule(flat[order], node, partner, step_idx[order])


def _draw_limit(num_events: int, num_nodes: int) -> int:
    return 64 * (num_events + num_nodes)


def churn_schedule(
    compute: Compute, num_nodes: int, num_events: int, key: PRNGKey, churn, table=None, degree=None
) -> AsyncSchedule:
    """The first ``num_events`` (E) events of the run with key ``key`` under churn
    (:mod:`~jaxgossip.engine.asynchronous.churn`: the steps a node stays online for), in the
    order of ``(time, node, step)``; K step draws per node, doubled until no node can have an
    event before the E-th. With ``table, degree`` each event gets its AD-PSGD partner among the
    neighbours online at its time (free exchanges); otherwise the partner is the node itself.

    Raises:
      ValueError: fewer than E events within a bounded number of draws (nodes almost never online).
    """
    n = num_nodes
    steps = 2 * -(-num_events // n) + 16
    while True:
        walk = async_churn.churn_walk(step_durations(compute, n, steps, key), churn)
        order = np.lexsort((walk.step, walk.node, walk.time))[:num_events]
        if order.size == num_events and np.all(walk.next_start > walk.time[order[-1]]):
            break
        if steps > _draw_limit(num_events, n):
            raise ValueError(
                f"--time.availability: fewer than {num_events} events in {steps} step draws per node; the "
                "nodes are online too rarely for this run"
            )
        steps *= 2
    node = walk.node[order]
    partner = node.copy()
    if table is not None:
        key_sched, _ = jax.random.split(key)
        u = np.asarray(jax.random.uniform(key_sched, (num_events,)), np.float32)
        partner = async_churn.online_partners(node, walk.row[order], u, np.asarray(table), np.asarray(degree), churn)
    return AsyncSchedule(walk.time[order], node, partner, walk.step[order])


def priced_schedule(
    compute: Compute, num_nodes: int, num_events: int, key: PRNGKey, table, degree, seconds, churn=None
) -> AsyncSchedule:
    """The first ``num_events`` (E) AD-PSGD events of the run with key ``key`` when every exchange
    takes ``seconds [N, Dmax]`` (:func:`jaxgossip.engine.asynchronous.exchanges.priced_exchanges`;
    K steps per node drawn, doubled until enough), under ``churn`` when given."""
    key_sched, _ = jax.random.split(key)

    def uniforms(block):  # block 0 is the free schedule's draw: zero delays give its partners
        block_key = key_sched if block == 0 else jax.random.fold_in(key_sched, block)
        return np.asarray(jax.random.uniform(block_key, (num_events,)), np.float32)

    steps = 2 * -(-num_events // num_nodes) + 16
    while True:
        durations = step_durations(compute, num_nodes, steps, key)
        sched = async_exchanges.priced_exchanges(durations, uniforms, table, degree, seconds, num_events, churn)
        if sched is not None:
            return AsyncSchedule(sched.time, sched.node, sched.partner, sched.step, sched.request, sched.start)
        if steps > _draw_limit(num_events, num_nodes):
            raise ValueError(
                f"--time.availability: fewer than {num_events} events in {steps} step draws per node; the "
                "nodes are online too rarely for this run"
            )
        steps *= 2


class WaveTables(NamedTuple):
    """Per-wave tables ([M, W, ...]) of the compiled scan; ``node`` pads with N (dropped)."""

    event: Array  # [M, W] int32, 0 in padded slots (only the gradient key reads it)
    node: Array  # [M, W] int32, N in padded slots
    end: Array  # [M] bool, the wave ends a round
    extra: Any  # rule-specific tables, [M, W, ...]


def _check_topology_weights(topology, form, s, r, w, self_w):
    """Raises unless the graph has the weights ``form``'s rule reads (:attr:`AsyncForm.weights`)."""
    n = topology.num_nodes
    if form.weights == "receiver_stochastic":
        sums = self_w + np.bincount(r, weights=w, minlength=n)
        what = "each receiver's weights W_ij (self included) summing to 1, so every update is an average"
    else:
        sums = self_w + np.bincount(s, weights=w, minlength=n)
        what = "column-stochastic weights (each sender's outgoing weights, self included, summing to 1)"
    bad = np.flatnonzero(np.abs(sums - 1) > 1e-5)
    if bad.size:
        raise ValueError(
            f"{form.name} needs {what}; {topology.name} has sums {sums[bad[:3]].round(6).tolist()} "
            f"at node(s) {bad[:3].tolist()}"
        )


class _HostPlan(NamedTuple):
    plan: async_waves.Plan
    extra: tuple  # per-event tables [E, ...] of the rule's wave
    written: tuple  # which of them hold nodes written to (padded slots: N, dropped)
    slots: int  # S (0 for ad_psgd)
    flight: Any  # (sender, ring slot, weight) of the messages in flight at the end, or None


def _arrivals(topology, links, bits, sched):
    """(sender, receiver) -> ``[#events of sender]`` arrival times of its messages
    (:func:`async_waves.uplink_arrivals`; serial uplinks queue)."""
    delays = _edge_delays(links, topology, bits)
    return async_waves.uplink_arrivals(sched.time, sched.node, delays, links.mode == "serial", topology.num_nodes)


def message_bits(rule: str, dim: int) -> float:
    """Bits of one message of the event rule ``rule`` (:data:`~jaxgossip.types.ASYNC_RULES`) over
    D = ``dim`` float32 values: a model (``32 D``), with the push-sum weight of
    ``delayed_push_sum`` (``32 D + 32``)."""
    return 32.0 * dim + (32.0 if rule == "delayed_push_sum" else 0.0)


def event_bits(plan: AsyncPlan, dim: int, num_nodes: int) -> np.ndarray:
    """``[R, N]`` float64 bits each node sends in each round (N events) of ``plan``: an AD-PSGD
    event swaps two models (node and partner send one each; none without an online neighbour);
    otherwise the node sends one message per out-neighbour."""
    sched, n = plan.schedule, num_nodes
    rounds = np.arange(sched.node.shape[0]) // n
    out = np.zeros((int(rounds[-1]) + 1, n), np.float64)
    per = message_bits(plan.form.rule, dim)
    if plan.form.rule == "pairwise_averaging":  # no exchange when no neighbour was online (partner = node)
        swap = sched.partner != sched.node
        np.add.at(out, (rounds[swap], sched.node[swap]), per)
        np.add.at(out, (rounds[swap], sched.partner[swap]), per)
    else:
        np.add.at(out, (rounds, sched.node), per * plan.out_degree[sched.node])
    return out


def _plan(form, topology, sched, dim, links, max_width) -> _HostPlan:
    """The waves and the tables of ``form``'s event rule (host)."""
    n, rule = topology.num_nodes, form.rule
    if rule == "pairwise_averaging":
        level = async_waves.ad_psgd_levels(sched.node, sched.partner, n)
        return _HostPlan(async_waves.pack_waves(level, n, max_width), (sched.partner,), (True,), 0, None)
    s, r, w, self_w = _graph(topology, form.name)
    step, i = sched.step.astype(np.int64), sched.node
    if rule == "stale_mixing":
        pairs = [sorted((int(a), float(c)) for a, b, c in zip(s, r, w) if b == node) for node in range(n)]
        table, real, weight = _slot_table(pairs, n)
        arrivals = _arrivals(topology, links, message_bits(rule, dim), sched)
        version, producer, slots = async_waves.read_versions(sched.time, i, table, real, arrivals, n)
        level = async_waves.read_levels(i, table[i], real[i], producer, n)
        extra = (step % slots, (step + 1) % slots, self_w[i], table[i], version % slots, weight[i])
        return _HostPlan(async_waves.pack_waves(level, n, max_width), extra, (False,) * 6, slots, None)
    pairs = [sorted((int(b), float(c)) for a, b, c in zip(s, r, w) if a == node) for node in range(n)]
    table, real, weight = _slot_table(pairs, n)
    arrivals = _arrivals(topology, links, message_bits(rule, dim), sched)
    sender, out_slot, absorber = async_waves.deliveries(sched.time, i, table, real, arrivals, n)
    due = async_waves.due_reads(i, sender, absorber, weight[i[sender], out_slot], n)
    level = async_waves.read_levels(i, due.node, due.real, due.producer, n)
    extra = ((step + 1) % due.slots, self_w[i], due.node, due.version % due.slots, due.weight)
    m = due.pending
    flight = (i[sender[m]], (step[sender[m]] + 1) % due.slots, weight[i[sender[m]], out_slot[m]])
    return _HostPlan(async_waves.pack_waves(level, n, max_width), extra, (False,) * 5, due.slots, flight)


class AsyncPlan(NamedTuple):
    """The host plan of a whole asynchronous run (:func:`plan_async`; R rounds, E = R N events).

    Attributes:
      form: the :class:`~jaxgossip.types.AsyncForm` that runs (its ``rule`` the event rule).
      schedule: :class:`AsyncSchedule` of the E events.
      tables: :class:`WaveTables` of the M waves (NumPy, ``[M, W, ...]``).
      waves: :class:`async_waves.Plan` (wave events, round ends, boundaries).
      stats: :class:`WaveStats`.
      slots: S, versions kept per node (0 for ``pairwise_averaging``).
      flight: ``(sender [P], ring slot [P], weight [P])`` of the messages still in flight at the
        end (``async_sgp``), None otherwise.
      out_degree: [N] int, each node's real out-neighbours (the messages of one of its events).
    """

    form: AsyncForm
    schedule: AsyncSchedule
    tables: WaveTables
    waves: async_waves.Plan
    stats: WaveStats
    slots: int
    flight: Any
    out_degree: np.ndarray


def prices_exchanges(form: AsyncForm) -> bool:
    """Whether ``form``'s events are exchanges that ``--time.exchange`` prices (AD-PSGD's pairwise
    averaging); the other rules send messages, which always take their link time."""
    return form.rule == "pairwise_averaging"


def check_async_graph(algorithm: str, topology: Any) -> AsyncForm:
    """The asynchronous form that ``algorithm`` names (:func:`resolve_algorithm`) after checking
    that it can run on ``topology`` (a registered algorithm's own graph requirements, a fixed
    static graph, and what the form's rule reads, :attr:`~jaxgossip.types.AsyncForm.weights`:
    an out-neighbour for every node to average with, or the weights it mixes or pushes with),
    before anything is drawn.

    Raises:
      ValueError: naming the algorithm, the graph and the form; TypeError: a graph stack.
    """
    form = resolve_algorithm(algorithm)
    if algorithm != form.name:  # a registered algorithm: its own graph requirements hold too
        from jaxgossip import algorithms

        algorithms.check_graph(algorithm, algorithms.resolve(algorithm), topology)
    if form.weights == "none":
        neighbor_table(topology, form.name)
    else:
        _check_topology_weights(topology, form, *_graph(topology, form.name))
    return form


def _split_time(topology: Any, time: Any) -> tuple[Compute, Links, str, Any]:
    """``(compute, links, exchange, available [R, N] or None)`` of ``time``."""
    if isinstance(time, timing.TimeModel):
        return time.compute, time.links, time.exchange, time.available
    network = Network()  # the default links
    return parse_compute(time), network.links(topology), network.exchange, None


def plan_async(
    topology: Any,
    time: Any,
    num_rounds: int,
    key: PRNGKey,
    algorithm: str,
    dim: int,
    max_width: int | None = None,
) -> AsyncPlan:
    """Draws the schedule of ``num_rounds`` (R) rounds of N events with ``key`` and plans its
    waves on the host (:func:`check_async_graph` first); ``dim`` (D) prices the messages.

    Args: as :func:`run_async_optimization` (``time`` a TimeModel, Compute or spec).

    Raises:
      ValueError: as :func:`run_async_optimization`.
    """
    form = check_async_graph(algorithm, topology)
    if isinstance(num_rounds, bool) or not isinstance(num_rounds, (int, np.integer)) or num_rounds < 1:
        raise ValueError(f"num_rounds={num_rounds!r} must be a positive int")
    if max_width is not None and (
        isinstance(max_width, bool) or not isinstance(max_width, (int, np.integer)) or max_width < 1
    ):
        raise ValueError(f"max_width={max_width!r} must be None or a positive int")
    if not is_concrete(key):
        raise ValueError("key must be concrete: the schedule is drawn and planned on the host")
    n = topology.num_nodes
    compute, links, exchange, available = _split_time(topology, time)
    num_events = int(num_rounds) * n
    churn = None
    if available is not None:
        churn = async_churn.make_churn(available, step_rates(compute, n, key))
    if not prices_exchanges(form):
        if churn is None:
            sched = async_schedule(compute, n, num_events, key)
        else:
            sched = churn_schedule(compute, n, num_events, key, churn)
    else:
        table, degree = neighbor_table(topology, form.name)
        if exchange == "free":
            if churn is None:
                sched = async_schedule(compute, n, num_events, key, table, degree)
            else:
                sched = churn_schedule(compute, n, num_events, key, churn, table, degree)
        else:
            one_way = _edge_delays(links, topology, message_bits(form.rule, dim), one=True)
            seconds = async_exchanges.pair_seconds(table, degree, one_way)
            sched = priced_schedule(compute, n, num_events, key, table, degree, seconds, churn)
    host = _plan(form, topology, sched, dim, links, max_width)
    plan = host.plan
    valid = plan.events >= 0
    ev = np.where(valid, plan.events, 0)
    node = np.where(valid, sched.node[ev], n).astype(np.int32)
    rows = []
    for tab, writes_to in zip(host.extra, host.written):
        row = tab[ev]
        if writes_to:  # a padded slot's writes go to node N: dropped
            row = np.where(valid.reshape(valid.shape + (1,) * (row.ndim - 2)), row, n)
        rows.append(row.astype(np.float32 if row.dtype.kind == "f" else np.int32))
    tables = WaveTables(ev.astype(np.int32), node, plan.round_end, tuple(rows))
    stats = WaveStats(
        int(plan.events.shape[0]), int(plan.events.shape[1]), num_events / plan.events.shape[0], host.slots
    )
    s, r, _, _ = _graph(topology, form.name)
    pairs = np.unique(np.stack([s, r], axis=1).astype(np.int64).reshape(-1, 2), axis=0)
    out_degree = np.bincount(pairs[:, 0], minlength=n).astype(np.int64)
    return AsyncPlan(form, sched, tables, plan, stats, int(host.slots), host.flight, out_degree)
