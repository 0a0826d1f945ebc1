"""Asynchronous decentralized training: the events of :mod:`jaxgossip.engine.asynchronous` on a model.

Each node's parameters are flattened to one vector (``jax.flatten_util.ravel_pytree`` of one
node's params, D values), so the asynchronous engine runs on ``[N, D]`` as it does for
optimization problems. Event e of node i (finishing its local step at time t) takes the gradient
of the model loss on a fresh batch of B samples drawn from node i's shard (with replacement, as
:func:`jaxgossip.data.sample_batch`; ``key_batch, key_aug = split(fold_in(key_grad, e))``), at
the model i read when the step started (stale, as in :mod:`jaxgossip.engine.asynchronous`), and turns it
into a step ``u`` with node i's own optax state (momentum, Adam moments; plain SGD gives
``u = -lr g``, AD-PSGD's rule). The rules, with ``u`` in place of ``- lr g``:

* ``ad_psgd``: ``x_i, x_j <- (x_i + x_j) / 2``, then ``x_i <- x_i + u(xhat_i)``.
* ``async_gossip``: ``x_i <- W_ii x_i + sum_j W_ij c_ij + u(x_i)`` (``c_ij`` stale copies).
* ``async_sgp``: ``x_i <- x_i + w_i u(x_i / w_i)`` (``z_i = x_i / w_i`` moves by ``u``), push
  ``p_ri (x_i, w_i)``, add the arrived messages.

A *round* is N events (N local steps in total, as one synchronous round with one local step), so
``num_rounds`` means the same amount of computation in both modes; the metrics are taken after
every ``eval_every`` rounds, ``sim_time`` being the time of the round's last event. The optimizer
counts each node's own steps (a learning-rate schedule runs per node, on its own events).

The whole run's schedule and waves are planned once on the host from the key given to
:func:`make_async_train` (the schedule depends only on the time model and the key); each chunk
runs its rounds' waves (a ``fori_loop`` over the waves of each round, indexed by the state's
round counter), so a run split into chunks, checkpointed and resumed, is bitwise the run in one
piece. Normalization statistics are not carried (refused): they would be node-local state that
a node's averaging partners cannot read consistently.

Bits: an AD-PSGD event exchanges two models (``32 D`` bits sent by each of i and j); an
``async_gossip`` event sends ``32 D`` bits to each out-neighbour, an ``async_sgp`` event
``32 D + 32``. ``comm_time`` (the synchronous rounds' waiting for messages) is 0: asynchronous
gossip and SGP never wait, their links make the reads stale; AD-PSGD's priced exchanges (the time
model's ``exchange``) make the node wait, which ``sim_time`` shows (the event is the exchange's end).

References:
  Lian, Zhang, Zhang, Liu, "Asynchronous Decentralized Parallel Stochastic Gradient Descent",
  ICML 2018 (arXiv:1710.06952). Assran, Loizou, Ballas, Rabbat, "Stochastic Gradient Push for
  Distributed Deep Learning", ICML 2019 (arXiv:1811.10792).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from jaxgossip.checks import is_concrete, positive_int
from jaxgossip.engine.asynchronous import planning, rates, rules
from jaxgossip.engine.training import Metrics, Trainer, TrainState, batched_eval, cross_entropy_loss
from jaxgossip.models.adapters import as_model_fns
from jaxgossip.ops.mixing import consensus_distance, node_mean
from jaxgossip.sim import timing
from jaxgossip.sim.compute import parse_compute
from jaxgossip.types import Array, PRNGKey

__all__ = ["AsyncTables", "make_async_train"]


class AsyncTables(NamedTuple):
    """What the compiled chunks read from the host plan (device arrays).

    Attributes:
      waves: :class:`jaxgossip.engine.asynchronous.WaveTables` of all M waves, ``[M, W, ...]``.
      round_start: [R + 1] int32, the first wave of each round (and M at the end).
      sim_time: [R + 1] float32, the time of the last event of each round (0 first).
      bits: [R + 1, N] float32 cumulative bits each node sent after each round (0 first).
      scale: [N] float32 step weights of the rate-compensated rule, or None (the plain rule).
    """

    waves: Any
    round_start: Array
    sim_time: Array
    bits: Array
    scale: Any = None


class _Bound(NamedTuple):
    """``run_chunk(state, num_evals)``: the jitted chunk with the plan's tables as arguments
    (not constants of the compiled program, which would grow with the run)."""

    chunk: Callable
    tables: AsyncTables

    def __call__(self, state, num_evals):
        return self.chunk(state, num_evals, self.tables)


def make_async_train(
    model: Any,
    topology: Any,
    shards: Any,
    eval_data: tuple[Array, Array],
    optimizer: optax.GradientTransformation,
    *,
    algorithm: str,
    time: Any,
    key: PRNGKey,
    num_rounds: int,
    batch_size: int,
    eval_every: int,
    identical_init: bool = True,
    augment: Callable[[PRNGKey, Array], Array] | None = None,
    eval_chunk: int = 500,
    loss_fn: Callable[[Array, Array], Array] | None = None,
    max_width: int | None = None,
    rate_compensation: bool = False,
) -> Trainer:
    """An asynchronous training run (module docstring) with the interface of
    :func:`jaxgossip.engine.training.make_train`.

    Args:
      model: as :func:`jaxgossip.engine.training.make_train`, without normalization statistics.
      topology: a fixed, static graph with host tables (as
        :func:`jaxgossip.engine.asynchronous.run_async_optimization`).
      shards: ``NodeShards(x [N, M_max, ...], y [N, M_max], counts [N])`` in this process.
      eval_data: ``(x [M, ...], y [M])`` held-out data.
      optimizer: an optax transformation, one state per node, updated at the node's events.
      algorithm: ``"ad_psgd"``, ``"async_gossip"``, ``"async_sgp"`` or a registered algorithm with
        an asynchronous form (``"gossip"``, ``"push_sum"``).
      time: a :class:`jaxgossip.sim.timing.TimeModel` (per-edge links, priced or free exchanges,
        availability under churn), a :class:`jaxgossip.sim.compute.Compute` or a ``--time.compute`` spec.
      key: the run's key (concrete): the schedule is drawn from its second half, as
        :meth:`Trainer.init` derives the run's keys (``key_init, key_run = split(key)``;
        the engine's keys come from ``key_run``). Pass the same key to ``init``.
      num_rounds: R rounds of N events; a multiple of ``eval_every``.
      batch_size: B samples per event.
      eval_every: rounds between evaluation points.
      identical_init, augment, eval_chunk, loss_fn: as :func:`jaxgossip.engine.training.make_train`.
      max_width: at most this many events per wave (None: no limit).
      rate_compensation: node i's step ``u`` scaled by ``c_i = E[p_i] mean_j (1 / E[p_j])``, so
        that the expected update is the uniform objective's
        (:func:`jaxgossip.engine.asynchronous.rates.rate_weights`; docs/training.md).

    Returns:
      A :class:`jaxgossip.engine.training.Trainer` (``local_steps = 1``). Its state is a
      :class:`jaxgossip.engine.training.TrainState` whose ``comm_state`` is the engine's state, whose
      ``params`` are the nodes' models at the last evaluation point (the engine's models as the
      model's pytree), and whose ``clock`` holds the time of the last round's last event.

    Raises:
      ValueError: bad counts, a model with normalization statistics, non-float32 parameters, and
        every refusal of :func:`jaxgossip.engine.asynchronous.plan_async`.
    """
    for name, value in (("num_rounds", num_rounds), ("batch_size", batch_size), ("eval_every", eval_every)):
        positive_int(name, value)
    if num_rounds % eval_every:
        raise ValueError(f"num_rounds={num_rounds} must be a multiple of eval_every={eval_every}")
    if not is_concrete(key):
        raise ValueError("key must be concrete: the schedule is drawn and planned on the host")
    model = as_model_fns(model)
    n = int(shards.counts.shape[0])
    if n != topology.num_nodes:
        raise ValueError(f"the shards hold {n} nodes; the topology {topology.name} has {topology.num_nodes}")
    x_eval, y_eval = (jnp.asarray(a) for a in eval_data)
    eval_chunk = min(eval_chunk, int(x_eval.shape[0]))
    if eval_chunk < 1:
        raise ValueError("eval_data is empty")
    example = shards.x[0, :1]
    shapes, stats_shapes = jax.eval_shape(model.init, jax.random.key(0), example)
    if jax.tree_util.tree_leaves(stats_shapes):
        raise ValueError(
            "execution='async' cannot carry normalization statistics (batch_stats): a node's running "
            "statistics are state its averaging partners never see; use a model without batch norm "
            "(e.g. --model_options.norm=none or group)"
        )
    bad = [s.dtype for s in jax.tree_util.tree_leaves(shapes) if s.dtype != jnp.float32]
    if bad:
        raise ValueError(f"execution='async' flattens float32 parameters; the model has {bad[0]} leaves")
    zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    flat0, unravel = ravel_pytree(zeros)
    dim = int(flat0.shape[0])

    key_run = jax.random.split(key)[1]
    plan = planning.plan_async(topology, time, int(num_rounds), key_run, algorithm, dim, max_width)
    rule = plan.form.rule
    start = np.r_[0, plan.waves.boundary + 1].astype(np.int32)
    times = np.r_[np.float32(0), plan.schedule.time.reshape(int(num_rounds), n)[:, -1]].astype(np.float32)
    bits = np.cumsum(np.r_[np.zeros((1, n)), planning.event_bits(plan, dim, n)], axis=0).astype(np.float32)
    scale = None
    if rate_compensation:
        why = rates.compensates_rates(plan.form)
        if why is not None:
            raise ValueError(f"rate_compensation=True with {plan.form.name}: {why}")
        compute = time.compute if isinstance(time, timing.TimeModel) else parse_compute(time)
        scale = jnp.asarray(rates.rate_weights(compute, n, key_run))
    tables = AsyncTables(
        jax.tree_util.tree_map(jnp.asarray, plan.tables),
        jnp.asarray(start),
        jnp.asarray(times),
        jnp.asarray(bits),
        scale,
    )
    clock_key = timing.init_clock(key_run).key
    node_loss = cross_entropy_loss(model, loss_fn)

    def value_and_grad(point, node, event_key):
        key_batch, key_aug = jax.random.split(event_key)
        idx = jax.random.randint(key_batch, (batch_size,), 0, shards.counts[node])
        x, y = shards.x[node][idx], shards.y[node][idx]
        if augment is not None:
            x = augment(key_aug, x)
        return jax.value_and_grad(lambda flat: node_loss(unravel(flat), {}, x, y)[0])(point)

    def update(g, rows, points):
        def one(g_i, state_i, p_i):
            u, state_i = optimizer.update(unravel(g_i), state_i, unravel(p_i))
            return ravel_pytree(u)[0], state_i

        return jax.vmap(one)(g, rows, points)

    def models(engine):
        return jax.vmap(unravel)(rules.node_models(rule, engine))

    def init(key: PRNGKey) -> TrainState:
        key_init, key_run = jax.random.split(key)
        if identical_init:
            params, _ = model.init(key_init, example)
            params = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (n,) + a.shape), params)
        else:
            params, _ = jax.vmap(model.init, in_axes=(0, None))(jax.random.split(key_init, n), example)
        x0 = jax.vmap(lambda p: ravel_pytree(p)[0])(params)
        zero = jnp.zeros([], jnp.float32)
        return TrainState(
            params=params,
            batch_stats={},
            opt_state=jax.vmap(optimizer.init)(params),
            comm_state=rules.init_async_state(rule, x0, plan.slots),
            key=jax.random.key_data(key_run),
            round=jnp.zeros([], jnp.int32),
            bits=jnp.zeros([n], jnp.float32),
            clock=timing.Clock(zero, zero, zero, jnp.zeros([], jnp.int32), clock_key),
        )

    def evaluate(state: TrainState, train_loss: Array) -> Metrics:
        z = state.params
        z_bar = node_mean(z)
        test_loss, test_acc = batched_eval(model.apply, z_bar, {}, x_eval, y_eval, eval_chunk, loss_fn)
        node_loss_, node_acc = jax.vmap(
            lambda p: batched_eval(model.apply, p, {}, x_eval, y_eval, eval_chunk, loss_fn)
        )(z)
        return Metrics(
            round=state.round,
            train_loss=train_loss,
            test_loss=test_loss,
            test_acc=test_acc,
            node_acc_mean=node_acc.mean(),
            node_acc_min=node_acc.min(),
            node_acc_max=node_acc.max(),
            node_loss_mean=node_loss_.mean(),
            consensus=consensus_distance(z),
            bits=state.bits,
            model_sq_norm=sum(jnp.sum(jnp.square(leaf)) for leaf in jax.tree_util.tree_leaves(z_bar)),
            sim_time=state.clock.time,
            comm_time=state.clock.comm,
        )

    def chunk_impl(state: TrainState, num_evals: int, tabs: AsyncTables) -> tuple[TrainState, Metrics]:
        key_grad = jax.random.split(jax.random.wrap_key_data(state.key))[1]
        wave = rules.make_wave(rule, value_and_grad, update, key_grad, n, tabs.scale)

        def one_round(carry, _):
            engine, opt, r = carry

            def body(m, c):
                eng, o, total = c
                tab = jax.tree_util.tree_map(lambda a: a[m], tabs.waves)
                eng, o, loss = wave(eng, o, tab)
                return eng, o, total + loss

            engine, opt, total = jax.lax.fori_loop(
                tabs.round_start[r], tabs.round_start[r + 1], body, (engine, opt, jnp.zeros([], jnp.float32))
            )
            return (engine, opt, r + 1), total / n

        def one_eval(st: TrainState, _):
            (engine, opt, r), losses = jax.lax.scan(
                one_round, (st.comm_state, st.opt_state, st.round), None, length=eval_every
            )
            clock = st.clock._replace(time=tabs.sim_time[r], round=r)
            st = st._replace(
                params=models(engine), opt_state=opt, comm_state=engine, round=r, bits=tabs.bits[r], clock=clock
            )
            return st, evaluate(st, jnp.mean(losses))

        return jax.lax.scan(one_eval, state, None, length=num_evals)

    chunk = jax.jit(chunk_impl, static_argnums=1)

    def train(key: PRNGKey) -> tuple[TrainState, Metrics]:
        return chunk_impl(init(key), num_rounds // eval_every, tables)

    return Trainer(
        init=jax.jit(init),
        run_chunk=_Bound(chunk, tables),
        train=train,
        evaluate=evaluate,
        num_evals=num_rounds // eval_every,
        local_steps=1,
    )
