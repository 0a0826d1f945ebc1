"""Asynchronous decentralized optimization on the simulated clock of :mod:`jaxgossip.sim.timing`.

Nodes do not wait for each other. Node i's k-th local step takes ``p_{k,i}`` seconds
(:func:`jaxgossip.sim.compute.compute_seconds`), so it finishes at ``T_{k,i} = sum_{l <= k} p_{l,i}``
(a float32 running sum); the finish of a step is an *event*, after which the node starts its next
step (AD-PSGD with priced exchanges: the end of the exchange that follows the step). A message
leaves with the sender's model at its event and counts at the receiver when it arrives,
``d = latency + bits / bandwidth`` later (the time model's links, per edge; with
``mode="serial"`` a node's messages of one event leave one after another in ascending receiver
order, so the m-th arrives after the first m transfers, and they queue on the uplink behind the
node's earlier events' messages, :func:`~jaxgossip.engine.asynchronous.waves.uplink_arrivals`).
Events are processed in time order (ties: lower node first, then lower step; a message arriving
at an event's time counts for it). A *round* is N events, as many local steps as one
synchronous round.

The event rules (:data:`~jaxgossip.types.ASYNC_RULES`) of the registered asynchronous forms
(:data:`jaxgossip.algorithms.ASYNC_FORMS`, each declared next to the algorithm it is a form of),
event e of node i at time t with gradient ``g = grad f_i(.)`` at the model i read when its step
started (right after its previous event):

* ``pairwise_averaging``, the form ``ad_psgd`` of gossip (Lian et al. 2018, Algorithm 1): with j
  a uniformly random out-neighbour, atomically ``x_i, x_j <- (x_i + x_j) / 2``, then
  ``x_i <- x_i - lr g`` with g taken at ``xhat_i``, i's model right after its previous event
  (others may have averaged with it since). Pairwise averaging keeps the node mean. With priced
  exchanges (the time model's ``exchange``, default) the event is the end of the exchange: i's
  model to j and the average back, each ``latency + 32 D / bandwidth``, both nodes busy, an
  exchange waiting for any booked before it on either node, and i's next step starting when it
  ends (:mod:`~jaxgossip.engine.asynchronous.exchanges`); with ``exchange="free"`` it is
  instantaneous, at the end of i's step (the paper's model).
* ``stale_mixing``, the form ``async_gossip`` of gossip: ``x_i <- W_ii x_i + sum_j W_ij c_ij -
  lr g(x_i)`` with ``c_ij`` the newest version of j that has arrived at i (every node sends its
  new model to all out-neighbours after each event; ``bits = 32 D``). Only node i moves, and from
  stale copies, so even with a doubly stochastic W the node mean is not kept; with zero gradients
  the nodes still reach consensus on a strongly connected graph (each update is a convex
  combination).
* ``delayed_push_sum``, the form ``async_sgp`` of push_sum (overlap SGP, Assran et al. 2019): each
  node holds ``(x_i, w_i)`` (w init 1); ``g`` at ``z_i = x_i / w_i``; ``x_i <- x_i - lr w_i g``
  (so ``z_i`` moves by ``- lr g``); it sends ``(p_ri x_i, p_ri w_i)`` to each out-neighbour r
  (``P = W`` column stochastic, ``bits = 32 D + 32``), keeps ``p_ii (x_i, w_i)`` and adds every
  message that arrived since its previous event. With zero gradients the sums
  ``sum_i x_i + in flight`` and ``sum_i w_i + in flight`` are kept.

  Why the step is scaled by ``w_i``: the paper's Algorithm 1 steps the numerator by ``- lr g``,
  which moves ``z_i`` by ``- lr g / w_i``; its analysis bounds every delay by tau iterations, which
  keeps ``w_i`` above a positive constant. Here nodes run free: a node that fires k times before
  any message reaches it keeps ``w_i = p_ii^k`` (1/3^k on a ring), so the unscaled step grows
  geometrically in ``z`` and the run diverges (exponential compute times do this within a few
  rounds). Scaling by ``w_i`` makes every event an SGD step of ``- lr g`` on ``z_i``, the step the
  paper takes whenever ``w_i = 1`` (regular graphs with uniform weights, its experiments), and
  leaves the push-sum of ``(x, w)`` and its conservation unchanged.

**Rate compensation** (``rate_compensation=True``, ``--async_rate_compensation=true``; AD-PSGD
only). Node i finishes steps at the rate ``1 / E[p_i]`` (its expected step time,
:func:`jaxgossip.sim.compute.expected_seconds`). AD-PSGD's averages keep the node mean, which
moves by the sum of the steps, so its expected drift is ``sum_i grad f_i / E[p_i]``: it optimizes
the event-rate-weighted objective, and a straggler's data counts less. The compensated rule scales
node i's step ``u`` by ``c_i = E[p_i] mean_j (1 / E[p_j])`` (mean rate over its rate;
``x_i <- avg + c_i u``), which makes the drift ``mean_j (1 / E[p_j]) sum_i grad f_i``: the uniform
objective's gradient, at the mean rate. The rates are those of the compute model alone
(availability and waiting for exchanges are not in them); equal expected times (constant,
lognormal, exponential compute) give ``c = 1`` and the plain rule bit for bit. A straggler S times
slower gets a weight about S times the others'. Asynchronous gossip and SGP refuse the option:
their fixed points weight the nodes equally already
(:func:`~jaxgossip.engine.asynchronous.rates.compensates_rates`).

**Waves.** The schedule depends only on the time model and the key, never on model values: it is
drawn first (a small jit: the ``[K, N]`` step durations; the float32 running sums, the order and
the partners on the host), then every event's stale version or delayed messages and the waves
are planned on the host (:mod:`~jaxgossip.engine.asynchronous.planning`,
:mod:`~jaxgossip.engine.asynchronous.waves`): each round's events are put on the earliest wave
that keeps every dependency (read-after-write strictly later, write-after-read not earlier), so
events that commute share a wave and the result is the sequential simulation's.
A ``lax.scan`` runs over the waves, each a vmapped gather, gradient and masked scatter over W
fixed-width slots (padding slots write out of bounds and are dropped). The metrics are taken at
the wave that ends each round (``lax.cond``). ``max_width=1`` runs one event per wave.

**Memory.** ``ad_psgd``: ``x`` and ``xhat``, ``2 N D``. ``async_gossip``: a ring of each node's
last S versions, ``N S D`` (S = max staleness + 1, computed exactly from the schedule; per-edge
copies would take ``N deg D`` plus the node's own), all stale reads gathered from it.
``async_sgp``: ``x, w`` plus a ring of each node's last S sent messages, ``N (S + 1) (D + 1)``
(S = the most versions a sender writes while one of its messages waits + 1); a receiver adds
the messages it is due straight from the senders' rings, so every event writes only its own
node's rows and the scatters are deterministic.

Keys: ``key_sched, key_grad = split(key)``; the clock's key is ``fold_in(key, TIME_STREAM)``
(:func:`jaxgossip.sim.timing.init_clock`); AD-PSGD's event e picks its neighbour slot
``floor(u_e deg_i)`` with ``u = uniform(key_sched, [E])``; event e draws its gradient with
``fold_in(key_grad, e)``. The same key gives the same schedule and the same run.

References:
  Lian, Zhang, Zhang, Liu, "Asynchronous Decentralized Parallel Stochastic Gradient Descent",
  ICML 2018 (arXiv:1710.06952), Algorithm 1.
  Assran, Loizou, Ballas, Rabbat, "Stochastic Gradient Push for Distributed Deep Learning",
  ICML 2019 (arXiv:1811.10792): overlap SGP, messages received with a delay.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxgossip.engine.asynchronous.planning import AsyncSchedule, WaveStats, plan_async, resolve_algorithm
from jaxgossip.engine.asynchronous.rates import compensates_rates, rate_weights
from jaxgossip.sim.compute import parse_compute
from jaxgossip.sim.timing import TimeModel
from jaxgossip.types import Array, PRNGKey

__all__ = [
    "AsyncResult",
    "ADPSGDState",
    "AsyncGossipState",
    "AsyncSGPState",
    "init_async_state",
    "make_wave",
    "node_models",
    "run_async_optimization",
]


class ADPSGDState(NamedTuple):
    x: Array  # [N, D] models
    x_hat: Array  # [N, D] each node's model right after its previous event (its gradient point)


class AsyncGossipState(NamedTuple):
    history: Array  # [N, S, D] ring of each node's last S versions (version m in slot m mod S)
    version: Array  # [N] int32 each node's current version (its events so far)


class AsyncSGPState(NamedTuple):
    x: Array  # [N, D] push-sum numerators
    w: Array  # [N] push-sum weights
    sent_x: Array  # [N, S, D] ring of each node's last S sent numerators (its k-th in slot k mod S)
    sent_w: Array  # [N, S] and weights; a receiver scales them by p_ri when it adds them


class AsyncResult(NamedTuple):
    """Outcome of :func:`run_async_optimization` (R rounds of N events, N nodes, D parameters).

    Attributes:
      objective: [R + 1] global objective ``(1/N) sum_i f_i(mean_j z_j)`` (full batch), z the
        models the nodes evaluate (``x / w`` for ``async_sgp``, x otherwise).
      consensus: [R + 1] ``(1/N) sum_i ||z_i - mean_j z_j||^2``.
      sim_time: [R + 1] float32 simulated seconds at the end of each round (0 first): the time of
        its last event.
      x: [N, D] final models z.
      schedule: :class:`AsyncSchedule` of the run's R N events.
      waves: :class:`WaveStats`.
      state: the final :class:`ADPSGDState`, :class:`AsyncGossipState` or :class:`AsyncSGPState`.
      algorithm: the name of the asynchronous form that ran.
      in_flight: ``(x [D], w [])``, the sums of the messages sent but not yet added at the end
        (``async_sgp``), None otherwise.
    """

    objective: Any
    consensus: Any
    sim_time: Any
    x: Any
    schedule: AsyncSchedule
    waves: WaveStats
    state: Any
    algorithm: str
    in_flight: Any = None


def make_wave(rule: str, value_and_grad: Any, update: Any, key_grad: PRNGKey, n: int, scale: Any = None):
    """The function ``state, opt, tables -> state, opt, loss`` of one wave of the event rule ``rule``
    (one of :data:`~jaxgossip.types.ASYNC_RULES`, an :class:`~jaxgossip.types.AsyncForm`'s ``rule``;
    update rules in the module docstring with ``- lr g`` replaced by ``u``).

    Args:
      value_and_grad: ``loss, g = value_and_grad(point [D], node, key)`` of one event (vmapped
        over the wave's W slots), ``key = fold_in(key_grad, event)``.
      update: ``u [W, D], rows = update(g [W, D], rows, points [W, D])``: the steps of the wave's
        events from their gradients, their nodes' rows of ``opt`` and the points the gradients were
        taken at (``lambda g, rows, points: (-lr * g, rows)`` is plain SGD).
      key_grad: the gradients' key; n: N.
      scale: None, or ``[N]`` weights ``c_i`` of the rate-compensated rule: node i's step is
        ``c_i u`` (:func:`~jaxgossip.engine.asynchronous.rates.rate_weights`).

    ``opt`` is a pytree of node-local state with leaves ``[N, ...]`` (``()``: none); an event
    reads and writes only its own node's rows. ``loss`` is the sum of the wave's event losses.
    """

    def step(opt, points, i, event):
        gi = jnp.minimum(i, n - 1)
        keys = jax.vmap(lambda e: jax.random.fold_in(key_grad, e))(event)
        loss, g = jax.vmap(value_and_grad)(points, gi, keys)
        rows = jax.tree_util.tree_map(lambda a: a[gi], opt)
        u, rows = update(g, rows, points)
        if scale is not None:
            u = scale[gi][:, None] * u
        opt = jax.tree_util.tree_map(lambda a, r: a.at[i].set(r, mode="drop"), opt, rows)
        return u, opt, jnp.sum(jnp.where(i < n, loss, jnp.zeros_like(loss)))

    def pairwise_averaging(state, opt, tab):  # ad_psgd
        i, (j,) = tab.node, tab.extra
        gi, gj = jnp.minimum(i, n - 1), jnp.minimum(j, n - 1)
        u, opt, loss = step(opt, state.x_hat[gi], i, tab.event)
        avg = 0.5 * (state.x[gi] + state.x[gj])
        new = avg + u
        x = state.x.at[j].set(avg, mode="drop").at[i].set(new, mode="drop")
        return ADPSGDState(x, state.x_hat.at[i].set(new, mode="drop")), opt, loss

    def stale_mixing(state, opt, tab):  # async_gossip
        i = tab.node
        own, write, self_w, nbr, slot, weight = tab.extra
        gi = jnp.minimum(i, n - 1)
        size = state.history.shape[1]
        # rows node * S + slot of the flattened ring: 1-D gathers and scatters (cheaper than 2-D)
        ring = state.history.reshape(n * size, -1)
        x_i = ring[gi * size + own]
        u, opt, loss = step(opt, x_i, i, tab.event)
        mixed = self_w[:, None] * x_i
        for k in range(nbr.shape[1]):  # per-slot gathers (DESIGN.md: faster than one [W, K, D])
            mixed = mixed + weight[:, k, None] * ring[nbr[:, k] * size + slot[:, k]]
        ring = ring.at[i * size + write].set(mixed + u, mode="drop")  # padded: row >= N S
        state = AsyncGossipState(ring.reshape(state.history.shape), state.version.at[i].add(1, mode="drop"))
        return state, opt, loss

    def delayed_push_sum(state, opt, tab):  # async_sgp
        i = tab.node
        write, self_p, sender, slot, p = tab.extra
        gi = jnp.minimum(i, n - 1)
        size = state.sent_w.shape[1]
        ring_x, ring_w = state.sent_x.reshape(n * size, -1), state.sent_w.reshape(-1)
        x_i, w_i = state.x[gi], state.w[gi]
        u, opt, loss = step(opt, x_i / w_i[:, None], i, tab.event)
        half = x_i + w_i[:, None] * u
        new_x, new_w = self_p[:, None] * half, self_p * w_i
        for k in range(sender.shape[1]):  # the messages it adds, from the senders' rings
            row = sender[:, k] * size + slot[:, k]
            new_x = new_x + p[:, k, None] * ring_x[row]
            new_w = new_w + p[:, k] * ring_w[row]
        row = i * size + write  # padded: row >= N S, dropped
        state = AsyncSGPState(
            state.x.at[i].set(new_x, mode="drop"),
            state.w.at[i].set(new_w, mode="drop"),
            ring_x.at[row].set(half, mode="drop").reshape(state.sent_x.shape),
            ring_w.at[row].set(w_i, mode="drop").reshape(state.sent_w.shape),
        )
        return state, opt, loss

    rules = {
        "pairwise_averaging": pairwise_averaging,
        "stale_mixing": stale_mixing,
        "delayed_push_sum": delayed_push_sum,
    }
    return rules[rule]


def node_models(rule: str, state: Any) -> Array:
    """``[N, D]`` the models the nodes evaluate in ``state`` of the event rule ``rule`` (``x / w``
    for ``delayed_push_sum``, each node's current version for ``stale_mixing``, ``x`` for
    ``pairwise_averaging``)."""
    n = jax.tree_util.tree_leaves(state)[0].shape[0]
    return _models(rule, state, n)


def _models(rule, state, n):
    """[N, D] the models the nodes evaluate."""
    if rule == "pairwise_averaging":
        return state.x
    if rule == "stale_mixing":
        return state.history[jnp.arange(n), state.version % state.history.shape[1]]
    return state.x / state.w[:, None]


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _run_waves(rule, loss_fn, full_loss_fn, state0, tables, lr, key, scale):
    n = jax.tree_util.tree_leaves(state0)[0].shape[0]
    _, key_grad = jax.random.split(key)
    sgd = lambda g, rows, points: (-lr * g, rows)  # noqa: E731
    wave = make_wave(rule, jax.value_and_grad(loss_fn), sgd, key_grad, n, scale)
    nodes = jnp.arange(n, dtype=jnp.int32)

    def metrics(state):
        z = _models(rule, state, n)
        mean = jnp.mean(z, axis=0)
        obj = jnp.mean(jax.vmap(full_loss_fn, in_axes=(None, 0, None))(mean, nodes, key_grad))
        return jnp.stack([obj, jnp.mean(jnp.sum((z - mean) ** 2, axis=-1))]).astype(jnp.float32)

    def body(state, tab):
        state, _, _ = wave(state, (), tab)
        record = jax.lax.cond(tab.end, metrics, lambda s: jnp.zeros([2], jnp.float32), state)
        return state, record

    state, records = jax.lax.scan(body, state0, tables)
    return state, metrics(state0), records


def init_async_state(rule: str, x0: Array, slots: int) -> Any:
    """The state of the event rule ``rule`` at the start from models ``x0`` [N, D] (S = ``slots``
    ring slots)."""
    n, dim = x0.shape
    if rule == "pairwise_averaging":
        return ADPSGDState(x0, x0)
    if rule == "stale_mixing":
        return AsyncGossipState(jnp.repeat(x0[:, None, :], slots, axis=1), jnp.zeros([n], jnp.int32))
    return AsyncSGPState(
        x0, jnp.ones([n], jnp.float32), jnp.zeros([n, slots, dim], jnp.float32), jnp.zeros([n, slots], jnp.float32)
    )


def run_async_optimization(
    problem: Any,
    topology: Any,
    x0: Array,
    *,
    lr: Any,
    time: Any,
    num_rounds: int,
    key: PRNGKey,
    algorithm: str = "ad_psgd",
    max_width: int | None = None,
    rate_compensation: bool = False,
) -> AsyncResult:
    """An asynchronous algorithm (module docstring) on a :class:`jaxgossip.engine.problems.Problem`.

    Args:
      problem: its ``loss_fn`` gives the (stochastic) gradients, ``full_loss_fn`` the objective.
      topology: a fixed, static graph with host tables; ``async_gossip`` mixes with its weights
        (each receiver's summing to 1), ``async_sgp`` pushes with them (column stochastic),
        ``ad_psgd`` averages along its edges.
      x0: [N, D] float32 initial models.
      lr: the step size (may be traced).
      time: a :class:`jaxgossip.sim.timing.TimeModel` (compute, per-edge links and whether
        AD-PSGD's exchanges are priced; availability under churn) or a :class:`jaxgossip.sim.compute.Compute`
        or ``--time.compute`` spec (then the default links of :class:`jaxgossip.sim.network.Network`,
        priced exchanges).
      num_rounds: R >= 1; the run processes E = R N events.
      key: a concrete PRNG key (the schedule is planned on the host).
      algorithm: an asynchronous form (:data:`jaxgossip.algorithms.ASYNC_FORMS`), or a registered
        algorithm with one (``"gossip"`` runs ``async_gossip``, ``"push_sum"`` runs ``async_sgp``),
        whose graph requirements (:func:`jaxgossip.algorithms.check_graph`) are checked too.
      max_width: at most this many events per wave (None: no limit; 1: one event per scan step).
      rate_compensation: node i's step scaled by ``c_i = E[p_i] mean_j (1 / E[p_j])`` (module
        docstring, "Rate compensation"), so that the expected update is the uniform objective's.

    Raises:
      ValueError: an unknown algorithm or one without an asynchronous mode (with the reason), a bad
        ``num_rounds`` or ``max_width``, an ``x0`` not [N, D] for the topology's N, a stochastic or
        time-varying graph, weights the algorithm cannot use, or unsupported links.
    """
    x0 = jnp.asarray(x0, jnp.float32)
    if x0.ndim != 2 or x0.shape[0] != topology.num_nodes:
        resolve_algorithm(algorithm)  # an unknown algorithm is named first
        raise ValueError(f"x0 must be [N, D] with N = {topology.num_nodes}; got shape {x0.shape}")
    n, dim = x0.shape
    async_plan = plan_async(topology, time, num_rounds, key, algorithm, dim, max_width)
    form, sched, plan, host_flight = async_plan.form, async_plan.schedule, async_plan.waves, async_plan.flight
    rule = form.rule
    tables = async_plan.tables
    state0 = init_async_state(rule, x0, async_plan.slots)
    scale = None
    if rate_compensation:
        why = compensates_rates(form)
        if why is not None:
            raise ValueError(f"rate_compensation=True with {form.name}: {why}")
        compute = time.compute if isinstance(time, TimeModel) else parse_compute(time)
        scale = jnp.asarray(rate_weights(compute, n, key))
    state, first, records = _run_waves(rule, problem.loss_fn, problem.full_loss_fn, state0, tables, lr, key, scale)
    at_end = records[jnp.asarray(plan.boundary)]
    times = sched.time.reshape(int(num_rounds), n)[:, -1]
    in_flight = None
    if host_flight is not None:
        sender, slot, p = (jnp.asarray(a, t) for a, t in zip(host_flight, (jnp.int32, jnp.int32, jnp.float32)))
        in_flight = (jnp.sum(p[:, None] * state.sent_x[sender, slot], axis=0), jnp.sum(p * state.sent_w[sender, slot]))
    return AsyncResult(
        jnp.concatenate([first[:1], at_end[:, 0]]),
        jnp.concatenate([first[1:], at_end[:, 1]]),
        jnp.concatenate([jnp.zeros([1], jnp.float32), jnp.asarray(times)]),
        _models(rule, state, n),
        sched,
        async_plan.stats,
        state,
        form.name,
        in_flight,
    )
