"""Decentralized training as one jitted ``lax.scan`` of the round driver (:func:`jaxgossip.engine.rounds.run_rounds`):
local optax steps, gossip, evaluation.

A run is ``R = num_rounds`` rounds. In every round each of the N nodes takes ``H = local_steps``
local optimizer steps, each on a fresh batch of B samples from its own shard (local SGD, Stich,
ICLR 2019), with the gradient at its *debiased* local iterate ``z_i = debias(y)_i`` (``y_i / w_i``
for push-sum methods, ``y_i`` otherwise); then the communication algorithm runs one round. The
orderings are those of :mod:`jaxgossip.engine.optimization` (docs/training.md, section orderings). With
``u^{k,h} = opt(g(debias(y^{k,h-1})))`` the update of local step h of round k and
``y^{k,0} = x^k``:

* ``"atc"`` (adapt then combine; Choco-SGD DL code, SGP, Sparse-Push):
  ``y^{k,h} = y^{k,h-1} + u^{k,h}`` for h = 1..H, then ``x^{k+1} = comm(y^{k,H})``.
* ``"same_iterate"`` (D-PSGD form, the PowerGossip repository): the same H local steps are taken
  from ``x^k``, ``x^k`` itself is gossiped, and ``x^{k+1} = comm(x^k) + sum_h u^{k,h}``; with
  H = 1, ``x^{k+1} = comm(x^k) - opt(g(z^k))``.

An algorithm's optional gradient hook runs on every gradient before the optimizer
(:func:`jaxgossip.engine.local_step.local_update`, shared with :mod:`jaxgossip.engine.optimization`).

With an outer optimizer (:mod:`jaxgossip.engine.outer`, decentralized DiLoCo; ``"atc"`` only) each node
takes an outer optimizer step on a pseudo-gradient after the communication: with
``outer_message="model"`` (default) the algorithm communicates ``y^{k,H}`` as without one and
``x^{k+1} = x^k - outer_opt(x^k - comm(y^{k,H}))``; with ``"pseudo_gradient"`` it communicates
``x^k - y^{k,H}`` and ``x^{k+1} = x^k - outer_opt(comm(x^k - y^{k,H}))``.

Local steps do not communicate, so bits per round do not depend on H. Keys: the driver's key schedule
(:func:`jaxgossip.engine.rounds.next_keys`) from the second half of ``split(key)`` (the first initialises
the models), three keys per round: ``(key_batch, key_aug, key_comm)``; with H = 1 step 1 uses ``key_batch``/``key_aug``
themselves (the one-step trainer, bitwise), with H > 1 step h uses the h-th of
``split(key_batch, H)`` / ``split(key_aug, H)``.

Optimizer state (momentum) and BatchNorm statistics are node-local and never communicated. Every
``eval_every`` rounds the run records the metrics of :class:`Metrics`; the run is split into
chunks of evaluation intervals (``run_chunk``) so the CLI can show progress and checkpoint between
chunks, and a resumed run is bitwise identical to an uninterrupted one on CPU.

References:
  Lian et al., NeurIPS 2017 (D-PSGD); Stich, ICLR 2019 (local SGD, arXiv:1805.09767);
  Assran et al., ICML 2019 (SGP, gradients at x / w); Koloskova et al., ICLR 2020 (Choco-SGD);
  Vogels et al., NeurIPS 2020 (PowerGossip).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxgossip.checks import is_concrete
from jaxgossip.engine import outer as outer_lib
from jaxgossip.engine import streaming as streaming_lib
from jaxgossip.engine.evaluation import Metrics, batched_eval, evaluate_state
from jaxgossip.engine.local_step import check_ordering, local_update
from jaxgossip.engine.rounds import next_keys, run_rounds
from jaxgossip.models.adapters import ModelFns, as_model_fns
from jaxgossip.ops.mixing import check_params, where_nodes
from jaxgossip.sim import fragment_clock, timing
from jaxgossip.sim.timing import TimeModel
from jaxgossip.types import ORDERINGS, Array, GossipAlgorithm, Params, PRNGKey

__all__ = [
    "softmax_cross_entropy",
    "cross_entropy_loss",
    "TrainState",
    "Metrics",
    "Trainer",
    "make_train",
    "ORDERINGS",
    "NaNLossError",
    "check_finite",
    "batched_eval",
]


class NaNLossError(FloatingPointError):
    """The training loss became NaN or infinite."""


def softmax_cross_entropy(logits: Array, labels: Array) -> Array:
    """The default ``loss_fn`` of :func:`make_train`: mean softmax cross-entropy of ``logits``
    [B, C] against integer ``labels`` [B]."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def cross_entropy_loss(model: ModelFns, loss_fn: Callable | None = None) -> Callable:
    """The training loss of :func:`make_train` for one node.

    Args:
      model: the model's pure functions.
      loss_fn: ``loss_fn(out [B, ...], y [B, ...]) -> scalar`` on the model's outputs; default
        :func:`softmax_cross_entropy`.

    Returns:
      ``loss, batch_stats = loss_fn(params, batch_stats, x [B, ...], y [B])``: the loss of the
      batch in training mode, and the updated normalization statistics.
    """
    loss_fn = loss_fn or softmax_cross_entropy

    def node_loss(params, batch_stats, x, y):
        logits, new_stats = model.apply(params, batch_stats, x, True)
        return loss_fn(logits, y), new_stats

    return node_loss


class TrainState(NamedTuple):
    """Everything a run carries from round to round (all per-node leaves are [N, ...]).

    Attributes:
      params: model parameters (push-sum numerators for push-sum methods), leaves [N, ...].
      batch_stats: node-local normalization statistics, leaves [N, ...] (may be empty).
      opt_state: node-local optax state, leaves [N, ...].
      comm_state: the communication algorithm's state.
      key: [2] uint32 raw PRNG key data for the next round.
      round: [] int32, rounds done.
      bits: [N] float32, cumulative bits each node has sent.
      clock: the simulated clock (:class:`jaxgossip.sim.timing.Clock`), or None for a run without a
        time model.
      outer: the outer optimizer's state (:class:`jaxgossip.engine.outer.OuterState`), or None without one.
    """

    params: Params
    batch_stats: Any
    opt_state: Any
    comm_state: Any
    key: Array
    round: Array
    bits: Array
    clock: Any = None
    outer: Any = None


def online_nodes(time: TimeModel, t: Array) -> Array:
    """``[N]`` bool: the nodes online in round ``t`` under ``time.available``."""
    available = jnp.asarray(time.available)
    return available[jnp.asarray(t, jnp.int32) % available.shape[0]] > 0


class _LocalCarry(NamedTuple):
    """What the H local steps of one round carry (leaves [N, ...])."""

    params: Params
    batch_stats: Any
    opt_state: Any
    comm_state: Any  # the algorithm state (its gradient hook may update it)


class Trainer(NamedTuple):
    """Pure functions of one configured run (see :func:`make_train`).

    Attributes:
      init: ``state = init(key)``, or ``init(key, params)`` to start every node from given
        ``params`` (leaves [N, ...]; optimizer and algorithm state are initialised from them).
      run_chunk: ``state, metrics = run_chunk(state, num_evals)``: ``num_evals * eval_every``
        rounds with an evaluation after every ``eval_every`` (jitted; ``num_evals`` static). When
        the shards span several processes it passes them to the jitted function as an argument
        (it then has no ``lower``); otherwise it is the ``jax.jit`` function itself.
      train: ``state, metrics = train(key)`` or ``train(key, params)``: the whole run, pure and
        vmappable over keys (it closes over the shards, so it runs in one process; several
        processes use ``run_chunk``). It is differentiable: ``jax.grad`` of a metric (e.g. the
        last ``test_loss``) with respect to ``params``, the graph's weights
        (:meth:`jaxgossip.topology.Topology.with_weights`), ``gamma`` or a step size
        (``optax.inject_hyperparams``), with the algorithm and optimizer built inside the
        differentiated function (docs/topologies.md, section "gradients through runs").
      evaluate: ``metrics = evaluate(state, train_loss)`` at the current state (one point).
      num_evals: evaluation points of the whole run (``num_rounds // eval_every``).
      local_steps: H, local optimizer steps per round (local steps done = ``round * H``).
    """

    init: Callable
    run_chunk: Callable
    train: Callable
    evaluate: Callable
    num_evals: int
    local_steps: int = 1


class _DataBound(NamedTuple):
    """``run_chunk(state, num_evals)`` of a multi-process run: the jitted
    ``chunk(state, num_evals, data)`` with the node-sharded ``data`` passed as a traced argument
    on every call (closing over arrays that span other processes' devices is refused by JAX)."""

    chunk: Callable
    data: Any

    def __call__(self, state, num_evals):
        return self.chunk(state, num_evals, self.data)


def _spans_processes(tree: Any) -> bool:
    """Whether a leaf of ``tree`` lives partly on another process's devices. A tracer does not: the
    trainer is then built inside a trace that takes the shards as arguments (``jaxgossip.run.plan``
    compiles the chunk on abstract shards)."""
    return any(
        isinstance(leaf, jax.Array) and is_concrete(leaf) and not leaf.is_fully_addressable
        for leaf in jax.tree_util.tree_leaves(tree)
    )


def _check_scalar_loss(model: ModelFns, node_loss: Callable, shards: Any, batch_size: int) -> None:
    """Traces one node's loss on a batch's shapes (``jax.eval_shape``, nothing runs); raises a
    ValueError unless it is a floating scalar."""
    x = jax.ShapeDtypeStruct((batch_size,) + tuple(shards.x.shape[2:]), shards.x.dtype)
    y = jax.ShapeDtypeStruct((batch_size,) + tuple(shards.y.shape[2:]), shards.y.dtype)
    params, stats = jax.eval_shape(model.init, jax.random.key(0), jax.ShapeDtypeStruct((1,) + x.shape[1:], x.dtype))
    loss, _ = jax.eval_shape(node_loss, params, stats, x, y)
    if not hasattr(loss, "shape") or loss.shape != () or not jnp.issubdtype(loss.dtype, jnp.floating):
        raise ValueError(
            f"loss_fn must return a floating scalar (the mean loss of the batch), got {loss}; e.g. "
            "reduce per-sample losses with .mean()"
        )


def _check_given_params(model: ModelFns, example: Array, num_nodes: int, params: Params) -> None:
    """Raises a ValueError unless ``params`` has the model's structure with leaves ``[N, ...]``."""
    one = jax.eval_shape(lambda k: model.init(k, example)[0], jax.random.key(0))
    want = jax.tree_util.tree_map(lambda a: (num_nodes,) + tuple(a.shape), one)
    got = jax.tree_util.tree_map(jnp.shape, params)
    if jax.tree_util.tree_structure(one) != jax.tree_util.tree_structure(params) or jax.tree_util.tree_leaves(
        want, is_leaf=lambda v: isinstance(v, tuple)
    ) != jax.tree_util.tree_leaves(got, is_leaf=lambda v: isinstance(v, tuple)):
        raise ValueError(
            f"params must have the model's structure with a leading node axis of N = {num_nodes}: "
            f"expected shapes {want}, got {got}"
        )


def make_train(
    model: ModelFns | Any,
    algorithm: GossipAlgorithm,
    shards: Any,
    eval_data: tuple[Array, Array],
    optimizer: optax.GradientTransformation,
    *,
    num_rounds: int,
    batch_size: int,
    eval_every: int,
    ordering: str = "atc",
    identical_init: bool = True,
    augment: Callable[[PRNGKey, Array], Array] | None = None,
    eval_chunk: int = 500,
    sampler: Callable | None = None,
    node_batch: int | None = None,
    local_steps: int = 1,
    loss_fn: Callable[[Array, Array], Array] | None = None,
    time: TimeModel | None = None,
    outer: optax.GradientTransformation | None = None,
    outer_message: str = "model",
    streaming: streaming_lib.Streaming | None = None,
    outer_message_bits: int = 32,
) -> Trainer:
    """Configures a decentralized training run and returns its pure functions.

    Args:
      model: anything :func:`jaxgossip.models.adapters.as_model_fns` takes: a
        :class:`~jaxgossip.models.adapters.ModelFns`, a pure ``(init, apply)`` pair, a flax NNX
        module or a flax linen module.
      algorithm: the communication algorithm (``jaxgossip.algorithms.make(...)``). With an
        :attr:`~jaxgossip.types.GossipAlgorithm.honest` hook (the Byzantine wrapper's) the
        evaluation metrics are over the nodes it marks honest only (:class:`Metrics`).
      shards: per-node data ``NodeShards(x [N, M_max, ...], y [N, M_max], counts [N])``.
      eval_data: ``(x [M, ...], y [M])`` held-out data; the first multiple of ``eval_chunk``
        samples are used.
      optimizer: any optax transformation, applied per node (vmapped).
      num_rounds: R, communication rounds; a multiple of ``eval_every``.
      batch_size: B, samples per node per local step.
      eval_every: rounds between evaluation points.
      ordering: ``"atc"`` or ``"same_iterate"`` (see the module docstring).
      identical_init: all nodes start from the same model (True) or from independent draws.
      augment: optional ``augment(key, x [B, ...]) -> x`` applied to each node's batch.
      eval_chunk: evaluation batch size.
      sampler: ``sampler(shards, key, batch_size) -> (x [N, B, ...], y [N, B])``; defaults to
        :func:`jaxgossip.data.sample_batch`.
      node_batch: if set, local gradients are computed ``node_batch`` nodes at a time
        (``lax.map`` over groups of ``vmap``) instead of one ``vmap`` over all N. Measured on
        XLA:CPU (``experiments/bench_training.py``): for conv nets one node at a time is 1.4x
        (N = 16) to 2.6x (N = 64) faster than a full vmap; for MLPs the full vmap (None) is faster,
        and on accelerators a full vmap is the expected fast path (not yet measured).
      local_steps: H >= 1 local optimizer steps per round, each on a fresh batch (local SGD),
        between communication rounds; bits per round do not depend on H (update rules in the
        module docstring). The optimizer counts local steps: a schedule in rounds needs
        ``count // H`` (``jaxgossip.run.resolve.make_optimizer`` does this).
      loss_fn: ``loss_fn(out [B, ...], y [B, ...]) -> scalar``, the loss of one node's batch on
        the model's outputs, used for training and for the evaluation losses (accuracy is always
        ``argmax(out, -1) == y``); default :func:`softmax_cross_entropy`.
      time: optional :class:`jaxgossip.sim.timing.TimeModel` (:func:`jaxgossip.sim.timing.time_model`): the
        state then carries a simulated clock advanced every round from the bits the round sent
        (the ordering sets the model's overlap), and every :class:`Metrics` point has
        ``sim_time`` and ``comm_time``. The iterates are those of the same run untimed.
      outer: optional outer optax transformation (:func:`jaxgossip.engine.outer.make_outer_optimizer`):
        each node then takes an outer step on the pseudo-gradient of its round (decentralized
        DiLoCo, :mod:`jaxgossip.engine.outer`); ``"atc"`` ordering only. None: no outer step.
      outer_message: with ``outer``, what the algorithm communicates: ``"model"`` (the inner
        result ``y^{k,H}``, as without an outer optimizer; the models reach consensus) or
        ``"pseudo_gradient"`` (``x^k - y^{k,H}``: the original DiLoCo under ``allreduce``, drifting
        apart under gossip); :data:`jaxgossip.engine.outer.OUTER_MESSAGES`.
      streaming: with ``outer``, optional :class:`jaxgossip.engine.streaming.Streaming` (F
        fragments synchronised at staggered inner steps, tau steps of overlap, mixing factor):
        Streaming DiLoCo (:mod:`jaxgossip.engine.streaming`). None: the whole model at the end of
        the round.
      outer_message_bits: B in 4, 8, 16, 32, the width of the floats the outer gradients are sent
        in (``"pseudo_gradient"`` only, with a float32 scale per node and leaf;
        :func:`jaxgossip.engine.outer.quantized_sender`), bits counted at B per value and 32 per
        scale; 32 sends float32 as without it.

    Returns:
      A :class:`Trainer`.

    Raises:
      ValueError: a non-positive ``num_rounds``, ``batch_size``, ``eval_every`` or ``local_steps``,
        an unknown ``ordering`` or ``outer_message``, an outer optimizer with ``"same_iterate"``, a
        ``loss_fn`` that does not return a scalar, streaming without an outer optimizer or with
        options that do not fit H or the model (:func:`jaxgossip.engine.streaming.check_streaming`),
        ``outer_message_bits`` refused by :func:`jaxgossip.engine.outer.quantized_sender`.
    """
    from jaxgossip import data as _data

    model = as_model_fns(model)
    check_ordering(algorithm, ordering)
    time = None if time is None else timing.with_ordering(time, ordering)
    for name, value in (
        ("num_rounds", num_rounds),
        ("batch_size", batch_size),
        ("eval_every", eval_every),
        ("local_steps", local_steps),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive int")
    outer_lib.check_outer_message(outer_message)
    if outer is not None and ordering != "atc":
        raise ValueError(
            f"ordering={ordering!r}: an outer optimizer needs ordering='atc' (its pseudo-gradient is that of the "
            "local steps' result)"
        )
    sender = outer_lib.quantized_sender(algorithm, outer_message_bits, outer, outer_message)
    if streaming is not None:
        if outer is None:
            raise ValueError("outer_fragments / outer_overlap (streaming DiLoCo) need an outer optimizer")
        streaming_lib.check_streaming(streaming, int(local_steps))
    if num_rounds % eval_every:
        raise ValueError(f"num_rounds={num_rounds} must be a multiple of eval_every={eval_every}")
    sampler = sampler or _data.sample_batch
    # Batches are drawn with replacement, but a batch larger than a node's whole shard means that
    # node's "epoch" is shorter than one step: almost always a configuration mistake.
    _data.check_batch_size(shards, batch_size, replace=False)
    num_nodes = int(shards.counts.shape[0])
    x_eval, y_eval = (jnp.asarray(a) for a in eval_data)
    eval_chunk = min(eval_chunk, int(x_eval.shape[0]))
    if eval_chunk < 1:
        raise ValueError("eval_data is empty")

    train_loss = cross_entropy_loss(model, loss_fn)
    _check_scalar_loss(model, train_loss, shards, batch_size)
    single_grad = jax.value_and_grad(train_loss, has_aux=True)
    if node_batch is not None and (not isinstance(node_batch, (int, np.integer)) or node_batch < 1):
        raise ValueError(f"node_batch={node_batch!r} must be None or a positive int")

    comm = algorithm  # the algorithm as the local steps and the evaluation see it
    if streaming is not None:
        shapes = jax.eval_shape(lambda k: model.init(k, shards.x[0, :1])[0], jax.random.key(0))
        fragments = streaming_lib.make_fragments(shapes, streaming.fragments)
        events = streaming_lib.round_events(int(local_steps), streaming)
        launch_steps, merge_steps = streaming_lib.launch_and_merge_steps(int(local_steps), streaming)
        comm = streaming_lib.fragmented(algorithm, fragments)

    def grad_fn(z, stats, x, y):
        if node_batch is None or node_batch >= num_nodes:
            return jax.vmap(single_grad)(z, stats, x, y)
        return jax.lax.map(lambda args: single_grad(*args), (z, stats, x, y), batch_size=int(node_batch))

    def init(key: PRNGKey, params: Params | None = None) -> TrainState:
        key_init, key_run = jax.random.split(key)
        example = shards.x[0, :1]
        if params is not None:  # given initial models (a traced input of a differentiated run)
            _check_given_params(model, example, num_nodes, params)
            stats = model.init(key_init, example)[1]
            stats = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (num_nodes,) + a.shape), stats)
        elif identical_init:
            params, stats = model.init(key_init, example)
            params, stats = jax.tree_util.tree_map(
                lambda a: jnp.broadcast_to(a, (num_nodes,) + a.shape), (params, stats)
            )
        else:
            params, stats = jax.vmap(model.init, in_axes=(0, None))(jax.random.split(key_init, num_nodes), example)
        check_params(num_nodes, params)
        return TrainState(
            params=params,
            batch_stats=stats,
            opt_state=jax.vmap(optimizer.init)(params),
            comm_state=comm.init(params),
            key=jax.random.key_data(key_run),
            round=jnp.zeros([], jnp.int32),
            bits=jnp.zeros([num_nodes], jnp.float32),
            clock=None if time is None else timing.init_clock(key),
            outer=(
                None
                if outer is None
                else outer_lib.outer_init(outer, params)
                if streaming is None
                else streaming_lib.stream_init(outer, fragments, params)
            ),
        )

    # The data shards travel as an argument (``data``) rather than a closure: a multi-process run
    # cannot close over arrays that span other processes' devices.
    def local_step(data, carry: _LocalCarry, keys) -> tuple[_LocalCarry, tuple[Any, Array]]:
        """One optimizer step of every node on a fresh batch, gradient at the debiased ``y``
        (through the algorithm's gradient hook, if any)."""
        y, stats, opt_state, comm_state = carry
        key_batch, key_aug = keys
        x, labels = sampler(data, key_batch, batch_size)
        if augment is not None:
            x = jax.vmap(augment)(jax.random.split(key_aug, num_nodes), x)
        z = comm.debias(y, comm_state)
        (loss, stats), grads = grad_fn(z, stats, x, labels)
        updates, opt_state, comm_state = local_update(comm, optimizer, grads, z, opt_state, comm_state)
        new = _LocalCarry(optax.apply_updates(y, updates), stats, opt_state, comm_state)
        return new, (updates, jnp.mean(loss))

    def local_steps_fn(data, state: TrainState, key_batch, key_aug):
        """The H local steps of one round: ``(y^{k,H}, stats, opt_state, comm_state), sum_h u^{k,h},
        mean loss``."""
        carry = _LocalCarry(state.params, state.batch_stats, state.opt_state, state.comm_state)
        if local_steps == 1:  # no scan, so that H = 1 compiles to exactly the one-step trainer
            carry, (updates, loss) = local_step(data, carry, (key_batch, key_aug))
            return carry, updates, loss
        keys = (jax.random.split(key_batch, local_steps), jax.random.split(key_aug, local_steps))

        def body(c, k):
            inner, total = c
            inner, (updates, loss) = local_step(data, inner, k)
            return (inner, jax.tree_util.tree_map(jnp.add, total, updates)), loss

        zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
        (carry, total), losses = jax.lax.scan(body, (carry, zeros), keys)
        return carry, total, jnp.mean(losses)

    def streaming_round_fn(data, state: TrainState, key_batch, key_aug, key_comm):
        """The H local steps cut at the fragments' launch and merge steps (:mod:`jaxgossip.engine.streaming`)."""
        online = None
        if time is not None and time.available is not None:
            online = online_nodes(time, state.round)
        if local_steps > 1:
            keys = (jax.random.split(key_batch, local_steps), jax.random.split(key_aug, local_steps))

        def inner(c, start, stop):
            carry, losses = c
            if local_steps == 1:  # the one-step trainer's keys, as without fragments
                new, (_, loss) = local_step(data, carry, (key_batch, key_aug))
                loss = loss[None]
            else:
                segment = jax.tree_util.tree_map(lambda k: k[start:stop], keys)
                new, (_, loss) = jax.lax.scan(lambda cc, k: local_step(data, cc, k), carry, segment)
            if online is not None:  # an offline node computes nothing
                kept = where_nodes(online, new[:3], carry[:3])  # params, batch_stats, opt_state
                new = _LocalCarry(*kept, new.comm_state)
            return new, [*losses, loss]

        carry = (_LocalCarry(state.params, state.batch_stats, state.opt_state, state.comm_state), [])
        (carry, losses), comm_states, stream, bits = streaming_lib.stream_round(
            sender,
            outer,
            outer_message,
            streaming,
            fragments,
            events,
            inner,
            carry,
            lambda c: c[0].params,
            lambda c, y: (c[0]._replace(params=y), c[1]),
            carry[0].comm_state,
            state.outer,
            key_comm,
            online,
        )
        loss = jnp.mean(jnp.concatenate(losses))
        clock = state.clock
        if time is not None:
            clock, arrivals = fragment_clock.advance_stream(
                clock, time, jnp.stack(bits), local_steps, launch_steps, merge_steps, stream.arrivals
            )
            stream = stream._replace(arrivals=arrivals)
        return carry._replace(comm_state=comm_states), stream, functools.reduce(jnp.add, bits), clock, loss

    def round_fn(data, state: TrainState, _) -> tuple[TrainState, Array]:
        key, (key_batch, key_aug, key_comm) = next_keys(jax.random.wrap_key_data(state.key), 3)
        if streaming is not None:
            carry, stream, bits, clock, loss = streaming_round_fn(data, state, key_batch, key_aug, key_comm)
            new_state = TrainState(
                params=carry.params,
                batch_stats=carry.batch_stats,
                opt_state=carry.opt_state,
                comm_state=carry.comm_state,
                key=jax.random.key_data(key),
                round=state.round + 1,
                bits=state.bits + bits,
                clock=clock,
                outer=stream,
            )
            return new_state, loss
        (y, stats, opt_state, comm_state), updates, loss = local_steps_fn(data, state, key_batch, key_aug)
        online = None
        if time is not None and time.available is not None:
            # An offline node computes nothing: its model, statistics and optimizer state stay.
            online = online_nodes(time, state.round)
            old = (state.params, state.batch_stats, state.opt_state)
            y, stats, opt_state = where_nodes(online, (y, stats, opt_state), old)
            updates = where_nodes(online, updates, jax.tree_util.tree_map(jnp.zeros_like, updates))
        outer_state = state.outer
        if outer is not None:
            anchor = (state.params, state.comm_state)  # x^k and the state it is read with
            params, comm_state, outer_state, info = outer_lib.outer_round(
                sender, outer, outer_message, state.outer, *anchor, y, comm_state, key_comm, online
            )
        elif ordering == "atc":
            params, comm_state, info = algorithm.step(y, comm_state, key_comm)
        else:
            params, comm_state, info = algorithm.step(state.params, comm_state, key_comm)
            params = optax.apply_updates(params, updates)
        new_state = TrainState(
            params=params,
            batch_stats=stats,
            opt_state=opt_state,
            comm_state=comm_state,
            key=jax.random.key_data(key),
            round=state.round + 1,
            bits=state.bits + info.bits,
            clock=None if time is None else timing.advance(state.clock, time, info.bits, local_steps),
            outer=outer_state,
        )
        return new_state, loss

    def evaluate(state: TrainState, train_loss: Array) -> Metrics:
        return evaluate_state(model.apply, comm, state, train_loss, (x_eval, y_eval), eval_chunk, loss_fn)

    def point(state: TrainState, losses: Array) -> Metrics:
        return evaluate(state, losses.mean())

    def run_chunk_impl(state: TrainState, num_evals: int, data) -> tuple[TrainState, Metrics]:
        return run_rounds(functools.partial(round_fn, data), state, num_evals, every=eval_every, point_fn=point)

    if _spans_processes(shards):
        run_chunk = _DataBound(jax.jit(run_chunk_impl, static_argnums=1), shards)
    else:
        # One process: the shards stay closed over (constants of the compiled chunk), so it takes (state) only.
        run_chunk = jax.jit(lambda state, num_evals: run_chunk_impl(state, num_evals, shards), static_argnums=1)

    def train(key: PRNGKey, params: Params | None = None) -> tuple[TrainState, Metrics]:
        return run_chunk_impl(init(key, params), num_rounds // eval_every, shards)

    return Trainer(
        init=init,
        run_chunk=run_chunk,
        train=train,
        evaluate=evaluate,
        num_evals=num_rounds // eval_every,
        local_steps=int(local_steps),
    )


def check_finite(metrics: Metrics, offset_round: int = 0) -> None:
    """Raises :class:`NaNLossError` naming the first evaluation point whose train loss is not finite."""
    loss = np.asarray(metrics.train_loss)
    bad = np.flatnonzero(~np.isfinite(loss))
    if bad.size:
        at = int(np.asarray(metrics.round)[bad[0]])
        raise NaNLossError(
            f"training loss became {loss[bad[0]]} by round {at}; try a smaller learning rate, gradient "
            "clipping (optax.clip_by_global_norm), or a smaller consensus step gamma"
        )
