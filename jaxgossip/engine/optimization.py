"""Decentralized optimization of an arbitrary objective, local steps and gossip in one ``lax.scan``.

Each of the N nodes holds its own (possibly stochastic) objective ``f_i``, given as
``loss_fn(params_i, node_index, key) -> scalar``; the nodes cooperate to minimise the global
objective ``f(x) = (1/N) sum_i f_i(x)``. A run is ``S = num_steps`` communication rounds; in every
round each node takes ``H = local_steps`` steps of its own optax optimizer on H fresh draws of its
objective (local SGD, Stich, ICLR 2019) and the communication algorithm runs one round. With H = 1
and plain gossip this is D-PSGD (Lian et al., NeurIPS 2017).

Gradients are taken at the *debiased* model ``z = debias(x, state)`` (``x_i / w_i`` for push-sum
methods, ``x_i`` otherwise) and the updates are applied to the params ``x`` (push-sum numerators),
exactly as :mod:`jaxgossip.engine.training` does (SGP, Assran et al., ICML 2019). The two orderings are those
of :data:`jaxgossip.engine.training.ORDERINGS`, extended to H local steps. With ``u_i^{k,h}`` the optimizer's
update of node i at local step h of round k (``optimizer.update`` of the gradient of
``f_i(., key_{k,i,h})`` at ``debias`` of the local iterate ``y^{k,h-1}``, ``y^{k,0} = x^k``):

* ``"atc"`` (adapt then combine): ``y^{k,h} = y^{k,h-1} + u^{k,h}`` for h = 1..H, then
  ``x^{k+1} = comm(y^{k,H})``.
* ``"same_iterate"`` (D-PSGD form): the same H local steps are computed from ``x^k`` but only their
  sum is kept, ``x^k`` itself is gossiped, and ``x^{k+1} = comm(x^k) + sum_h u^{k,h}``. For H = 1
  this is train.py's rule ``x^{k+1} = comm(x^k) - opt(g(z^k))``.

An algorithm with a gradient hook (gradient tracking, QGM) sees every gradient before the
optimizer does and may replace it: ``u = optimizer.update(hook(g, z))``, through
:func:`jaxgossip.engine.local_step.local_update`, the code path :mod:`jaxgossip.engine.training` shares.

Local steps do not communicate, so the bits per round do not depend on H. Optimizer state
(momentum, Adam moments) is node-local and never communicated.

Keys (same ``key`` gives bitwise the same run): ``key_eval, key_run = split(key)``; ``key_run``
starts the driver's key schedule (:func:`jaxgossip.engine.rounds.next_keys`), whose two keys per round are
``key_comm`` (passed to ``alg.step``) and ``key_local``; ``split(key_local, H * N)`` reshaped to
[H, N] gives node i's key for local step h. The objective is evaluated at every point with the one
fixed key ``key_eval`` (the same for all nodes and rounds), so curves of a stochastic objective are
not noisy between points; a deterministic objective ignores it.

References:
  Lian, Zhang, Zhang, Hsieh, Zhang, Liu, "Can Decentralized Algorithms Outperform Centralized
  Algorithms? A Case Study for Decentralized Parallel Stochastic Gradient Descent", NeurIPS 2017
  (arXiv:1705.09056).
  Stich, "Local SGD Converges Fast and Communicates Little", ICLR 2019 (arXiv:1805.09767).
  Assran, Loizou, Ballas, Rabbat, "Stochastic Gradient Push for Distributed Deep Learning",
  ICML 2019 (arXiv:1811.10792).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxgossip.checks import positive_int
from jaxgossip.engine.local_step import check_ordering, local_update
from jaxgossip.engine.rounds import next_keys, run_rounds
from jaxgossip.engine.training import ORDERINGS
from jaxgossip.ops.mixing import consensus_distance, node_mean
from jaxgossip.sim import timing
from jaxgossip.sim.timing import TimeModel
from jaxgossip.types import Array, GossipAlgorithm, Params, PRNGKey

__all__ = ["OptimizationResult", "OptimizationTrace", "run_optimization", "optimization_scan", "ORDERINGS"]

LossFn = Callable[[Params, Array, PRNGKey], Array]  # (params_i, node_index [] int32, key) -> []


class OptimizationTrace(NamedTuple):
    """What :func:`optimization_scan` returns (JAX arrays; S rounds, N nodes).

    Attributes:
      objective: [S + 1] ``(1/N) sum_i f_i(mean_j z_j, i, key_eval)`` before round 1 and after
        every round (z the debiased models).
      consensus: [S + 1] ``(1/N) sum_i ||z_i - mean_j z_j||^2`` (squared Frobenius over leaves).
      loss: [S] mean over nodes and local steps of the training loss at the points where
        gradients were taken.
      node_bits: [S, N] bits each node sent in each round.
      x: final params (leaves [N, ...]).
      state: final algorithm state.
      opt_state: final per-node optimizer state (leaves [N, ...]).
      sim_time: [S + 1] float32 simulated seconds (0 first) under the time model, or None.
      comm_time: [S + 1] float32 communication seconds so far, or None.
    """

    objective: Array
    consensus: Array
    loss: Array
    node_bits: Array
    x: Params
    state: Any
    opt_state: Any
    sim_time: Any = None
    comm_time: Any = None


class OptimizationResult(NamedTuple):
    """Outcome of :func:`run_optimization` over S rounds of H local steps (N nodes).

    Attributes:
      objective: [S + 1] global objective at the average of the debiased models (see
        :class:`OptimizationTrace`).
      consensus: [S + 1] consensus distance of the debiased models around their current mean.
      bits: [S + 1] cumulative bits sent by all nodes together (0 first), float64 on the host.
      x: final params (leaves [N, ...]).
      state: final algorithm state.
      opt_state: final per-node optimizer state.
      node_bits: [S, N] bits each node sent in each round, float64 on the host.
      loss: [S] mean training loss of each round (over nodes and local steps).
      round: [S + 1] int, communication rounds done at each point (0, 1, ..., S).
      local_step: [S + 1] int, local optimizer steps each node has done at each point (round * H).
      sim_time: [S + 1] simulated seconds since the start under the run's time model
        (:mod:`jaxgossip.sim.timing`), or None for a run without one.
      comm_time: [S + 1] seconds of communication so far, or None.
    """

    objective: Any
    consensus: Any
    bits: Any
    x: Params
    state: Any
    opt_state: Any
    node_bits: Any
    loss: Any
    round: Any
    local_step: Any
    sim_time: Any = None
    comm_time: Any = None


def _num_nodes(x0: Params) -> int:
    """N, the common leading axis of every leaf of ``x0``; raises naming the offending leaf."""
    leaves = jax.tree_util.tree_leaves_with_path(x0)
    if not leaves:
        raise ValueError("x0 is an empty pytree; it needs leaves of shape [N, ...]")
    num_nodes = None
    for path, leaf in leaves:
        shape, where = jnp.shape(leaf), jax.tree_util.keystr(path) or "<root>"
        if len(shape) == 0:
            raise ValueError(f"x0 leaf {where} is a scalar; every leaf needs a leading node axis [N, ...]")
        if num_nodes is None:
            num_nodes = shape[0]
        elif shape[0] != num_nodes:
            raise ValueError(
                f"x0 leaf {where} has shape {tuple(shape)}, but the first leaf has N={num_nodes} nodes; "
                "every leaf needs the same leading node axis"
            )
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
            raise TypeError(f"x0 leaf {where} has dtype {jnp.result_type(leaf)}; optimization needs floating leaves")
    return int(num_nodes)


def _check_loss_fn(name: str, fn: Any, x0: Params, key: PRNGKey) -> None:
    """Traces ``fn`` on one node's shapes (``jax.eval_shape``, nothing runs) and checks it is a scalar."""
    if not callable(fn):
        raise TypeError(f"{name} must be a callable (params_i, node_index, key) -> scalar, got {type(fn).__name__}")
    one_node = jax.tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(jnp.shape(leaf)[1:], jnp.result_type(leaf)), x0)
    key_shape = jax.ShapeDtypeStruct(jnp.shape(key), key.dtype)
    out = jax.eval_shape(fn, one_node, jax.ShapeDtypeStruct((), jnp.int32), key_shape)
    leaves = jax.tree_util.tree_leaves(out)
    if len(leaves) != 1 or jax.tree_util.tree_structure(out).num_nodes != 1:
        raise TypeError(f"{name} must return one scalar array, got the pytree {out}")
    if leaves[0].shape != ():
        raise ValueError(f"{name} must return a scalar (shape ()), got shape {leaves[0].shape}")
    if not jnp.issubdtype(leaves[0].dtype, jnp.floating):
        raise TypeError(f"{name} must return a floating scalar, got dtype {leaves[0].dtype}")


def _validate(alg, x0, loss_fn, optimizer, num_steps, key, local_steps, ordering, objective_fn) -> None:
    """Shape-level checks shared by the pure core and the host entry point (no data is read)."""
    if not all(callable(getattr(alg, name, None)) for name in ("init", "step", "debias")):
        raise TypeError(f"alg must be a GossipAlgorithm (jaxgossip.algorithms.make), got {type(alg).__name__}")
    if not hasattr(key, "dtype") or not hasattr(key, "shape"):
        raise TypeError(f"key must be a PRNG key (jax.random.key(seed)), got {type(key).__name__}")
    positive_int("num_steps", num_steps)
    positive_int("local_steps", local_steps)
    if ordering not in ORDERINGS:
        raise ValueError(f"ordering={ordering!r} is unknown; known orderings: {ORDERINGS}")
    check_ordering(alg, ordering)
    if not (callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))):
        raise TypeError(f"optimizer must be an optax GradientTransformation, got {type(optimizer).__name__}")
    _num_nodes(x0)
    try:
        jax.eval_shape(alg.init, x0)
    except ValueError as err:
        raise ValueError(f"x0 does not fit algorithm {getattr(alg, 'name', '')!r}: {err}") from err
    _check_loss_fn("loss_fn", loss_fn, x0, key)
    if objective_fn is not None:
        _check_loss_fn("objective_fn", objective_fn, x0, key)


def _round_keys(key: PRNGKey, local_steps: int, num_nodes: int):
    """``(next key, key_comm, key_local [H, N])`` of one round (module docstring); split inside the
    scan so no ``[S, H, N]`` key array is materialised."""
    key, (key_comm, key_local) = next_keys(key, 2)
    local = jax.random.split(key_local, local_steps * num_nodes)
    return key, key_comm, local.reshape((local_steps, num_nodes) + local.shape[1:])


def optimization_scan(
    alg: GossipAlgorithm,
    x0: Params,
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    num_steps: int,
    key: PRNGKey,
    local_steps: int = 1,
    ordering: str = "atc",
    objective_fn: LossFn | None = None,
    time: TimeModel | None = None,
    *,
    remat: bool = False,
    checkpoint_every: int | None = None,
) -> OptimizationTrace:
    """Pure, jittable and vmappable core of :func:`run_optimization` (same arguments).

    Everything a user may sweep is traced: ``key``, ``x0``, and optimizer hyperparameters such as
    ``optax.sgd(lr)`` with a traced ``lr``, so ``jax.vmap`` over seeds or step sizes compiles once.
    ``num_steps``, ``local_steps`` and ``ordering`` are Python values (static).

    The same traced inputs are differentiable: ``jax.grad`` of the final objective with respect
    to ``x0``, a step size (``optax.inject_hyperparams(optax.sgd)(learning_rate=lr)``), the
    algorithm's ``gamma`` or a graph's weights (:meth:`jaxgossip.topology.Topology.with_weights`),
    with the algorithm and optimizer built inside the differentiated function. ``remat=True``
    rematerialises each round in the backward pass and ``checkpoint_every=C`` each chunk of C
    rounds (:func:`jaxgossip.engine.rounds.run_rounds`): the gradient's memory then grows as
    ``S / C + C`` rather than S (long runs in bounded memory).

    Returns:
      An :class:`OptimizationTrace` of JAX arrays (``node_bits`` per round, not accumulated).
    """
    _validate(alg, x0, loss_fn, optimizer, num_steps, key, local_steps, ordering, objective_fn)
    objective_fn = loss_fn if objective_fn is None else objective_fn
    num_nodes = _num_nodes(x0)
    nodes = jnp.arange(num_nodes, dtype=jnp.int32)
    key_eval, key_run = jax.random.split(key)
    node_grad = jax.vmap(jax.value_and_grad(loss_fn), in_axes=(0, 0, 0))

    def objective(x, state):
        z_bar = node_mean(alg.debias(x, state))
        return jnp.mean(jax.vmap(objective_fn, in_axes=(None, 0, None))(z_bar, nodes, key_eval))

    def local_step(carry, keys):
        """One optimizer step of every node at the debiased local iterate (through the algorithm's
        gradient hook, if any); carry = (y, sum u, opt, algorithm state)."""
        y, total, opt_state, state = carry
        z = alg.debias(y, state)
        loss, grads = node_grad(z, nodes, keys)
        updates, opt_state, state = local_update(alg, optimizer, grads, z, opt_state, state)
        y = optax.apply_updates(y, updates)
        total = jax.tree_util.tree_map(jnp.add, total, updates)
        return (y, total, opt_state, state), loss

    time = None if time is None else timing.with_ordering(time, ordering)

    def round_fn(carry, _):
        x, state, opt_state, key, clock = carry
        key, round_key_comm, round_keys_local = _round_keys(key, int(local_steps), num_nodes)
        zeros = jax.tree_util.tree_map(jnp.zeros_like, x)
        (y, total, opt_state, state), losses = jax.lax.scan(local_step, (x, zeros, opt_state, state), round_keys_local)
        if ordering == "atc":
            x, state, info = alg.step(y, state, round_key_comm)
        else:
            x, state, info = alg.step(x, state, round_key_comm)
            x = optax.apply_updates(x, total)
        z = alg.debias(x, state)
        if time is not None:
            clock = timing.advance(clock, time, info.bits, int(local_steps))
        record = (objective(x, state), consensus_distance(z), jnp.mean(losses), info.bits, clock)
        return (x, state, opt_state, key, clock), record

    state0 = alg.init(x0)
    opt_state0 = jax.vmap(optimizer.init)(x0)
    clock0 = None if time is None else timing.init_clock(key)
    (x, state, opt_state, _, _), (objs, cons, loss, bits, clocks) = run_rounds(
        round_fn,
        (x0, state0, opt_state0, key_run, clock0),
        int(num_steps),
        remat=remat,
        checkpoint_every=checkpoint_every,
    )
    sim_time = comm_time = None
    if time is not None:
        sim_time = jnp.concatenate([clock0.time[None], clocks.time])
        comm_time = jnp.concatenate([clock0.comm[None], clocks.comm])
    obj0 = objective(x0, state0)
    cons0 = consensus_distance(alg.debias(x0, state0))
    return OptimizationTrace(
        objective=jnp.concatenate([obj0[None].astype(objs.dtype), objs]),
        consensus=jnp.concatenate([cons0[None].astype(cons.dtype), cons]),
        loss=loss,
        node_bits=bits,
        x=x,
        state=state,
        opt_state=opt_state,
        sim_time=sim_time,
        comm_time=comm_time,
    )


@functools.partial(jax.jit, static_argnums=(0, 2, 3, 4, 6, 7, 8))
def _optimization_jit(alg, x0, loss_fn, optimizer, num_steps, key, local_steps, ordering, objective_fn, time):
    return optimization_scan(alg, x0, loss_fn, optimizer, num_steps, key, local_steps, ordering, objective_fn, time)


def _check_finite_x0(x0: Params) -> None:
    for path, leaf in jax.tree_util.tree_leaves_with_path(x0):
        try:
            values = np.asarray(leaf)
        except jax.errors.TracerArrayConversionError:  # traced x0 (under jit/vmap): cannot be read
            continue
        if not np.all(np.isfinite(values)):
            raise ValueError(f"x0 leaf {jax.tree_util.keystr(path) or '<root>'} contains NaN or inf")


def run_optimization(
    alg: GossipAlgorithm,
    x0: Params,
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    num_steps: int,
    key: PRNGKey,
    local_steps: int = 1,
    ordering: str = "atc",
    *,
    objective_fn: LossFn | None = None,
    time: TimeModel | None = None,
) -> OptimizationResult:
    """Minimises ``(1/N) sum_i f_i`` with N nodes: H local optimizer steps, then one round of ``alg``.

    The whole run is one jitted ``lax.scan`` over S rounds (an inner scan over the H local steps).
    ``alg``, ``loss_fn``, ``optimizer`` and ``objective_fn`` are static jit arguments hashed by
    identity: reuse the same objects to avoid recompiling, and sweep step sizes or seeds with
    ``jax.vmap`` over :func:`optimization_scan` (``optax.sgd(lr)`` with a traced ``lr``).
    Update rules per ordering, key derivation and references: see the module docstring. In short,
    with ``u = optimizer.update(grad f_i(debias(y), key), ...)``:

    .. math::

        \\text{atc:}\\quad & y^{k,h} = y^{k,h-1} + u^{k,h}\\ (h = 1..H),\\ y^{k,0} = x^k,\\quad
            x^{k+1} = \\mathrm{comm}(y^{k,H}) \\\\
        \\text{same\\_iterate:}\\quad & x^{k+1} = \\mathrm{comm}(x^k) + \\textstyle\\sum_{h=1}^{H} u^{k,h}

    Args:
      alg: a :class:`~jaxgossip.types.GossipAlgorithm` (``jaxgossip.algorithms.make(...)``).
      x0: pytree of floating leaves ``[N, ...]``, the initial params of every node (finite).
      loss_fn: ``loss_fn(params_i, node_index, key) -> scalar``, node i's (stochastic) objective
        ``f_i`` for one node's params (leaves ``[...]``), a traced int32 ``node_index`` in
        ``[0, N)`` and a fresh key per node, round and local step. Must be differentiable in params.
      optimizer: any optax transformation, applied per node (``vmap`` of ``init`` and ``update``;
        ``update`` receives the debiased params).
      num_steps: S, communication rounds (static).
      key: PRNG key; the same key gives bitwise the same result.
      local_steps: H >= 1 local optimizer steps per round (static); bits per round do not depend
        on H.
      ordering: ``"atc"`` or ``"same_iterate"``.
      objective_fn: optional ``f_i`` used only for the reported ``objective`` (same signature),
        e.g. the full-batch loss when ``loss_fn`` draws minibatches; defaults to ``loss_fn``. It is
        evaluated with one fixed key (``key_eval``, module docstring).
      time: optional :class:`jaxgossip.sim.timing.TimeModel`; the run then records ``sim_time`` and
        ``comm_time`` (a round's H local steps, then its communication, overlapped under
        ``same_iterate``: the run's ordering sets the model's overlap).

    Returns:
      :class:`OptimizationResult`: ``objective``, ``consensus`` and cumulative ``bits`` [S + 1],
      final ``x``, algorithm ``state`` and ``opt_state``, ``node_bits`` [S, N], ``loss`` [S],
      ``round`` and ``local_step`` [S + 1].

    Raises:
      ValueError: ``num_steps`` or ``local_steps`` not a positive int, unknown ``ordering``, x0
        leaves without a common leading node axis (or not matching the algorithm's N), NaN or inf
        in x0, a ``loss_fn`` that returns a non-scalar.
      TypeError: non-floating x0 leaves, a ``loss_fn`` returning a pytree or an integer, an
        ``optimizer`` that is not an optax transformation, an ``alg`` that is not a GossipAlgorithm.
    """
    _validate(alg, x0, loss_fn, optimizer, num_steps, key, local_steps, ordering, objective_fn)
    _check_finite_x0(x0)
    num_steps, local_steps = int(num_steps), int(local_steps)
    trace = _optimization_jit(alg, x0, loss_fn, optimizer, num_steps, key, local_steps, ordering, objective_fn, time)
    node_bits = np.asarray(trace.node_bits, dtype=np.float64)
    rounds = np.arange(num_steps + 1)
    return OptimizationResult(
        objective=trace.objective,
        consensus=trace.consensus,
        bits=np.concatenate([[0.0], np.cumsum(node_bits.sum(axis=1))]),
        x=trace.x,
        state=trace.state,
        opt_state=trace.opt_state,
        node_bits=node_bits,
        loss=trace.loss,
        round=rounds,
        local_step=rounds * local_steps,
        sim_time=trace.sim_time,
        comm_time=trace.comm_time,
    )
