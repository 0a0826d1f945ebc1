"""Evaluation of a training state: the averaged model and every node's own on held-out data.

Metrics are those of the de-biased models ``z = debias(x)``; under a Byzantine attack (the
algorithm's honest hook) every metric but the training loss and the bits is over the honest nodes.
Shapes: model leaves [N, ...]; held-out data ``x`` [M, ...], ``y`` [M] (or [M, T] next-token
targets).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxgossip.algorithms.byzantine import honest_consensus_distance, honest_mean
from jaxgossip.ops.mixing import consensus_distance, node_mean
from jaxgossip.types import Array, GossipAlgorithm

__all__ = ["Metrics", "batched_eval", "evaluate_state"]


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
      model_sq_norm: ``||z_bar||^2`` of the averaged model (squared norms summed over leaves), the
        scale the consensus watchdog (:mod:`jaxgossip.run.watchdog`) compares ``consensus`` with.
      sim_time: simulated seconds since the start (:mod:`jaxgossip.sim.timing`), or None without a
        time model.
      comm_time: seconds of communication so far (the slowest node's per round), or None.

    With the algorithm's :attr:`~jaxgossip.types.GossipAlgorithm.honest` hook, ``test_loss``,
    ``test_acc``, ``node_*``, ``consensus`` and ``model_sq_norm`` are over the nodes it marks
    honest (the averaged model is theirs); ``train_loss`` and ``bits`` still cover every node.
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
    model_sq_norm: Array
    sim_time: Any = None
    comm_time: Any = None


def batched_eval(apply, params, batch_stats, x, y, chunk, loss_fn=None):
    """Loss and accuracy of one model over ``x`` [M, ...] in chunks of ``chunk`` samples (a custom
    ``loss_fn`` is averaged over chunks; accuracy is ``argmax(out, -1) == y``). Labels ``y`` [M, T]
    (next-token targets) are T predictions per sample: loss and accuracy are means over all M T."""
    m = x.shape[0] - x.shape[0] % chunk
    per_sample = int(np.prod(y.shape[1:], dtype=np.int64))
    xs = x[:m].reshape((m // chunk, chunk) + x.shape[1:])
    ys = y[:m].reshape((m // chunk, chunk) + y.shape[1:])

    def one(args):
        xb, yb = args
        logits, _ = apply(params, batch_stats, xb, False)
        if loss_fn is None:
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, yb).sum()
        else:
            loss = loss_fn(logits, yb) * chunk
        correct = (jnp.argmax(logits, -1) == yb).sum()
        return loss, correct

    losses, correct = jax.lax.map(one, (xs, ys))
    if loss_fn is None:  # a sum over all m * per_sample predictions; a custom loss_fn is a mean per chunk
        return losses.sum() / (m * per_sample), correct.sum() / (m * per_sample)
    return losses.sum() / m, correct.sum() / (m * per_sample)


def evaluate_state(
    apply, algorithm: GossipAlgorithm, state: Any, train_loss: Array, eval_data: tuple, eval_chunk: int, loss_fn=None
) -> Metrics:
    """The :class:`Metrics` of a training state (params, batch_stats, comm_state, round, bits,
    clock) with ``train_loss`` the mean training loss since the previous point; ``apply`` is the
    model's pure apply, ``eval_data`` ``(x [M, ...], y [M])``."""
    z = algorithm.debias(state.params, state.comm_state)
    # Under attack (the algorithm's honest hook, set by jaxgossip.algorithms.byzantine) every
    # metric is over the honest nodes only.
    honest = None if algorithm.honest is None else algorithm.honest(state.comm_state)
    if honest is None:
        z_bar, stats_bar = node_mean(z), node_mean(state.batch_stats)
    else:
        z_bar, stats_bar = honest_mean(z, honest), honest_mean(state.batch_stats, honest)
    test_loss, test_acc = batched_eval(apply, z_bar, stats_bar, *eval_data, eval_chunk, loss_fn)
    node_loss, node_acc = jax.vmap(lambda p, s: batched_eval(apply, p, s, *eval_data, eval_chunk, loss_fn))(
        z, state.batch_stats
    )
    if honest is None:
        acc_mean, acc_min, acc_max, loss_mean = node_acc.mean(), node_acc.min(), node_acc.max(), node_loss.mean()
        consensus = consensus_distance(z)
    else:
        count = jnp.sum(honest)
        acc_mean = jnp.sum(jnp.where(honest, node_acc, 0.0)) / count
        acc_min = jnp.min(jnp.where(honest, node_acc, jnp.inf))
        acc_max = jnp.max(jnp.where(honest, node_acc, -jnp.inf))
        loss_mean = jnp.sum(jnp.where(honest, node_loss, 0.0)) / count
        consensus = honest_consensus_distance(z, honest)
    return Metrics(
        round=state.round,
        train_loss=train_loss,
        test_loss=test_loss,
        test_acc=test_acc,
        node_acc_mean=acc_mean,
        node_acc_min=acc_min,
        node_acc_max=acc_max,
        node_loss_mean=loss_mean,
        consensus=consensus,
        bits=state.bits,
        model_sq_norm=sum(jnp.sum(jnp.square(leaf.astype(jnp.float32))) for leaf in jax.tree_util.tree_leaves(z_bar)),
        sim_time=None if state.clock is None else state.clock.time,
        comm_time=None if state.clock is None else state.clock.comm,
    )
