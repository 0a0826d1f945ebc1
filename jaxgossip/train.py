"""Decentralized training as one jitted ``lax.scan``: local optax steps, gossip, evaluation.

A run is ``R = num_rounds`` rounds. In every round each of the N nodes draws a batch of B samples
from its own shard, computes a gradient at its *debiased* model ``z_i = debias(x)_i`` (``x_i / w_i``
for push-sum methods, ``x_i`` otherwise), takes a local optimizer step, and the communication
algorithm runs one round. Two orderings exist in the reference codes (docs/algorithms.md, section orderings):

* ``"atc"`` (adapt then combine; Choco-SGD DL code, SGP, Sparse-Push):
  ``x^{k+1/2} = x^k - opt(g(z^k))``, then ``x^{k+1} = comm(x^{k+1/2})``.
* ``"same_iterate"`` (D-PSGD form, the PowerGossip repository):
  the update ``u^k = opt(g(z^k))`` is computed at ``x^k``, ``x^k`` is gossiped, then
  ``x^{k+1} = comm(x^k) - u^k``.

Optimizer state (momentum) and BatchNorm statistics are node-local and never communicated. Every
``eval_every`` rounds the run records the metrics of :class:`Metrics`; the run is split into
chunks of evaluation intervals (``run_chunk``) so the CLI can show progress and checkpoint between
chunks, and a resumed run is bitwise identical to an uninterrupted one on CPU.

References:
  Lian et al., NeurIPS 2017 (D-PSGD); Assran et al., ICML 2019 (SGP, gradients at x / w);
  Koloskova et al., ICLR 2020 (Choco-SGD); Vogels et al., NeurIPS 2020 (PowerGossip).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxgossip.mixing import check_params, consensus_distance, node_mean
from jaxgossip.types import Array, GossipAlgorithm, Params, PRNGKey

__all__ = [
    "ModelFns",
    "linen_model_fns",
    "cross_entropy_loss",
    "TrainState",
    "Metrics",
    "Trainer",
    "make_train",
    "ORDERINGS",
    "NaNLossError",
    "check_finite",
]

ORDERINGS = ("atc", "same_iterate")


class NaNLossError(FloatingPointError):
    """The training loss became NaN or infinite."""


class ModelFns(NamedTuple):
    """A model as two pure functions.

    Attributes:
      init: ``params, batch_stats = init(key, x)`` for one node; ``x`` [B, ...] example inputs.
        ``batch_stats`` is a (possibly empty) pytree of node-local statistics.
      apply: ``logits, batch_stats = apply(params, batch_stats, x, train)`` for one node;
        ``logits`` [B, C]. In training mode the returned statistics are the updated ones.
    """

    init: Callable[[PRNGKey, Array], tuple[Params, Any]]
    apply: Callable[[Params, Any, Array, bool], tuple[Array, Any]]


def linen_model_fns(model) -> ModelFns:
    """Wraps a flax linen module whose ``__call__(x, train)`` may use a ``batch_stats`` collection."""

    def init(key, x):
        variables = model.init(key, x, train=False)
        return variables["params"], variables.get("batch_stats", {})

    def apply(params, batch_stats, x, train):
        variables = {"params": params}
        if batch_stats:
            variables["batch_stats"] = batch_stats
        if train and batch_stats:
            logits, mutated = model.apply(variables, x, train=True, mutable=["batch_stats"])
            return logits, mutated["batch_stats"]
        return model.apply(variables, x, train=train), batch_stats

    return ModelFns(init, apply)


def cross_entropy_loss(model: ModelFns) -> Callable:
    """The training loss of :func:`make_train` for one node.

    Returns:
      ``loss, batch_stats = loss_fn(params, batch_stats, x [B, ...], y [B])``: the mean softmax
      cross-entropy of the batch in training mode, and the updated normalization statistics.
    """

    def loss_fn(params, batch_stats, x, y):
        logits, new_stats = model.apply(params, batch_stats, x, True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), new_stats

    return loss_fn


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
    """

    params: Params
    batch_stats: Any
    opt_state: Any
    comm_state: Any
    key: Array
    round: Array
    bits: Array


class Metrics(NamedTuple):
    """Metrics at each evaluation point; every field is [num_evals] (``bits`` [num_evals, N]).

    Attributes:
      round: rounds done at the evaluation point.
      train_loss: mean training loss over nodes and over the rounds since the previous point.
      test_loss, test_acc: loss / accuracy of the averaged model ``mean_i debias(x)_i`` (with
        averaged normalization statistics) on the evaluation set.
      node_acc_mean, node_acc_min, node_acc_max: accuracy of each node's own debiased model.
      node_loss_mean: mean over nodes of each node's evaluation loss.
      consensus: ``(1/N) sum_i ||z_i - z_bar||^2`` of the debiased models.
      bits: [N] cumulative bits sent by each node.
    """

    round: Array
    train_loss: Array
    test_loss: Array
    test_acc: Array
    node_acc_mean: Array
    node_acc_min: Array
    node_acc_max: Array
    node_loss_mean: Array
    consensus: Array
    bits: Array


class Trainer(NamedTuple):
    """Pure functions of one configured run (see :func:`make_train`).

    Attributes:
      init: ``state = init(key)``.
      run_chunk: ``state, metrics = run_chunk(state, num_evals)``: ``num_evals * eval_every``
        rounds with an evaluation after every ``eval_every`` (jitted; ``num_evals`` static).
      train: ``state, metrics = train(key)``: the whole run, pure and vmappable over keys.
      evaluate: ``metrics = evaluate(state, train_loss)`` at the current state (one point).
      num_evals: evaluation points of the whole run (``num_rounds // eval_every``).
    """

    init: Callable
    run_chunk: Callable
    train: Callable
    evaluate: Callable
    num_evals: int


def _batched_eval(apply, params, batch_stats, x, y, chunk):
    """Loss and accuracy of one model over ``x`` [M, ...] in chunks of ``chunk`` samples."""
    m = x.shape[0] - x.shape[0] % chunk
    xs = x[:m].reshape((m // chunk, chunk) + x.shape[1:])
    ys = y[:m].reshape(m // chunk, chunk)

    def one(args):
        xb, yb = args
        logits, _ = apply(params, batch_stats, xb, False)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, yb).sum()
        correct = (jnp.argmax(logits, -1) == yb).sum()
        return loss, correct

    losses, correct = jax.lax.map(one, (xs, ys))
    return losses.sum() / m, correct.sum() / m


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
) -> Trainer:
    """Configures a decentralized training run and returns its pure functions.

    Args:
      model: :class:`ModelFns` or a flax linen module (wrapped with :func:`linen_model_fns`).
      algorithm: the communication algorithm (``jaxgossip.algorithms.make(...)``).
      shards: per-node data ``NodeShards(x [N, M_max, ...], y [N, M_max], counts [N])``.
      eval_data: ``(x [M, ...], y [M])`` held-out data; the first multiple of ``eval_chunk``
        samples are used.
      optimizer: any optax transformation, applied per node (vmapped).
      num_rounds: R, communication rounds (= local steps); a multiple of ``eval_every``.
      batch_size: B, samples per node per round.
      eval_every: rounds between evaluation points.
      ordering: ``"atc"`` or ``"same_iterate"`` (see the module docstring).
      identical_init: all nodes start from the same model (True) or from independent draws.
      augment: optional ``augment(key, x [B, ...]) -> x`` applied to each node's batch.
      eval_chunk: evaluation batch size.
      sampler: ``sampler(shards, key, batch_size) -> (x [N, B, ...], y [N, B])``; defaults to
        :func:`jaxgossip.data.sample_batch`.
      node_batch: if set, local gradients are computed ``node_batch`` nodes at a time
        (``lax.map`` over groups of ``vmap``) instead of one ``vmap`` over all N. Measured on
        XLA:CPU (``experiments/bench_training.py``): for conv nets one node at a time was 1.4x
        (N = 16) to 2.6x (N = 64) faster than a full vmap; for MLPs the full vmap (None) is faster,
        and on accelerators a full vmap is the expected fast path (not yet measured).

    Returns:
      A :class:`Trainer`.
    """
    from jaxgossip import data as _data

    if not isinstance(model, ModelFns):
        model = linen_model_fns(model)
    if ordering not in ORDERINGS:
        raise ValueError(f"ordering={ordering!r} is unknown; known orderings: {ORDERINGS}")
    for name, value in (("num_rounds", num_rounds), ("batch_size", batch_size), ("eval_every", eval_every)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive int")
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

    single_grad = jax.value_and_grad(cross_entropy_loss(model), has_aux=True)
    if node_batch is not None and (not isinstance(node_batch, (int, np.integer)) or node_batch < 1):
        raise ValueError(f"node_batch={node_batch!r} must be None or a positive int")

    def grad_fn(z, stats, x, y):
        if node_batch is None or node_batch >= num_nodes:
            return jax.vmap(single_grad)(z, stats, x, y)
        return jax.lax.map(lambda args: single_grad(*args), (z, stats, x, y), batch_size=int(node_batch))

    def init(key: PRNGKey) -> TrainState:
        key_init, key_run = jax.random.split(key)
        example = shards.x[0, :1]
        if identical_init:
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
            comm_state=algorithm.init(params),
            key=jax.random.key_data(key_run),
            round=jnp.zeros([], jnp.int32),
            bits=jnp.zeros([num_nodes], jnp.float32),
        )

    def round_fn(state: TrainState, _) -> tuple[TrainState, Array]:
        key, key_batch, key_aug, key_comm = jax.random.split(jax.random.wrap_key_data(state.key), 4)
        x, y = sampler(shards, key_batch, batch_size)
        if augment is not None:
            x = jax.vmap(augment)(jax.random.split(key_aug, num_nodes), x)
        z = algorithm.debias(state.params, state.comm_state)
        (loss, stats), grads = grad_fn(z, state.batch_stats, x, y)
        updates, opt_state = jax.vmap(optimizer.update)(grads, state.opt_state, z)
        if ordering == "atc":
            params = optax.apply_updates(state.params, updates)
            params, comm_state, info = algorithm.step(params, state.comm_state, key_comm)
        else:
            params, comm_state, info = algorithm.step(state.params, state.comm_state, key_comm)
            params = optax.apply_updates(params, updates)
        new_state = TrainState(
            params=params,
            batch_stats=stats,
            opt_state=opt_state,
            comm_state=comm_state,
            key=jax.random.key_data(key),
            round=state.round + 1,
            bits=state.bits + info.bits,
        )
        return new_state, jnp.mean(loss)

    def evaluate(state: TrainState, train_loss: Array) -> Metrics:
        z = algorithm.debias(state.params, state.comm_state)
        z_bar, stats_bar = node_mean(z), node_mean(state.batch_stats)
        test_loss, test_acc = _batched_eval(model.apply, z_bar, stats_bar, x_eval, y_eval, eval_chunk)
        node_loss, node_acc = jax.vmap(lambda p, s: _batched_eval(model.apply, p, s, x_eval, y_eval, eval_chunk))(
            z, state.batch_stats
        )
        return Metrics(
            round=state.round,
            train_loss=train_loss,
            test_loss=test_loss,
            test_acc=test_acc,
            node_acc_mean=node_acc.mean(),
            node_acc_min=node_acc.min(),
            node_acc_max=node_acc.max(),
            node_loss_mean=node_loss.mean(),
            consensus=consensus_distance(z),
            bits=state.bits,
        )

    def interval(state: TrainState, _) -> tuple[TrainState, Metrics]:
        state, losses = jax.lax.scan(round_fn, state, None, length=eval_every)
        return state, evaluate(state, losses.mean())

    def run_chunk_impl(state: TrainState, num_evals: int) -> tuple[TrainState, Metrics]:
        return jax.lax.scan(interval, state, None, length=num_evals)

    run_chunk = jax.jit(run_chunk_impl, static_argnums=1)

    def train(key: PRNGKey) -> tuple[TrainState, Metrics]:
        return run_chunk_impl(init(key), num_rounds // eval_every)

    return Trainer(init=init, run_chunk=run_chunk, train=train, evaluate=evaluate, num_evals=num_rounds // eval_every)


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
