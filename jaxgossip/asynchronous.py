"""Asynchronous decentralized SGD (AD-PSGD) driven by the simulated clock of :mod:`jaxgossip.timing`.

Every node runs its own loop without waiting for the others. Node i's k-th local step takes
``p_{k,i}`` seconds (:func:`jaxgossip.timing.compute_seconds`), so it finishes at
``T_{k,i} = sum_{l <= k} p_{l,i}``. When node i finishes a step (an *event*) it has the gradient
``g = grad f_i(xhat_i)`` of the model ``xhat_i`` it read when the step started (its model right
after its previous event; other nodes may have averaged with it since: the gradient is stale).
Then, atomically, with ``j`` a uniformly random out-neighbour of i in the graph:

.. math::

   x_i, x_j \\leftarrow \\tfrac12 (x_i + x_j), \\qquad x_i \\leftarrow x_i - \\gamma\\, g,
   \\qquad \\hat x_i \\leftarrow x_i

and node i starts its next step. Events are processed in time order (ties: lower node first,
then lower step). Pairwise averaging keeps the node mean, so with zero gradients the mean of x
never moves.

The schedule depends only on the time model and the key, never on model values, so it is drawn
ahead inside the jit (:func:`async_schedule`): ``[K, N]`` durations with K = E (a node can at most
do every event), their cumulative sums, one sort, and the first E = R N events. A "round" is N
events (N local steps in total, as many as one synchronous round). The events are then processed
one per ``lax.scan`` step (a gather and a scatter of two rows), an exact sequential simulation.

Keys: ``key_sched, key_grad = split(key)``; the clock's key is ``fold_in(key, TIME_STREAM)``
(:func:`jaxgossip.timing.init_clock`); event e (0-based, in time order) picks its neighbour
slot ``floor(u_e deg_i)`` with ``u = uniform(key_sched, [E])`` and draws its gradient with
``fold_in(key_grad, e)``.

Reference:
  Lian, Zhang, Zhang, Liu, "Asynchronous Decentralized Parallel Stochastic Gradient Descent",
  ICML 2018 (arXiv:1710.06952), Algorithm 1.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip import timing
from jaxgossip.types import Array, PRNGKey

__all__ = ["AsyncSchedule", "AsyncResult", "neighbor_table", "async_schedule", "run_async_optimization"]


class AsyncSchedule(NamedTuple):
    """The first E events of a run in time order.

    Attributes:
      time: [E] float32 finish time of each event (seconds).
      node: [E] int32 node that finishes a step.
      partner: [E] int32 the neighbour it averages with.
      step: [E] int32 which local step of ``node`` it is (0-based).
    """

    time: Array
    node: Array
    partner: Array
    step: Array


class AsyncResult(NamedTuple):
    """Outcome of :func:`run_async_optimization` (R rounds of N events, N nodes, D parameters).

    Attributes:
      objective: [R + 1] global objective ``(1/N) sum_i f_i(mean_j x_j)`` (full batch).
      consensus: [R + 1] ``(1/N) sum_i ||x_i - mean_j x_j||^2``.
      sim_time: [R + 1] float32 simulated seconds at the end of each round (0 first): the time of
        its last event.
      x: [N, D] final models.
      schedule: :class:`AsyncSchedule` of the run's R N events.
    """

    objective: Any
    consensus: Any
    sim_time: Any
    x: Any
    schedule: AsyncSchedule


def neighbor_table(topology: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(table [N, Dmax] int32, degree [N] int32)``: each node's out-neighbours in graph 0 (real
    edges: weight != 0, no self loop), ascending, padded with the node itself.

    Raises:
      ValueError: a stochastic graph (no fixed edge list), or a node without out-neighbours.
    """
    if topology.stochastic:
        raise ValueError(f"asynchronous runs need a fixed graph; {topology.name} is drawn every round")
    n = topology.num_nodes
    s = np.asarray(topology.senders)[0]
    r = np.asarray(topology.receivers)[0]
    w = np.asarray(topology.weights)[0]
    real = (w != 0) & (s != r)
    lists = [sorted(set(r[real & (s == i)].tolist())) for i in range(n)]
    lonely = [i for i, nb in enumerate(lists) if not nb]
    if lonely:
        raise ValueError(f"node(s) {lonely} of {topology.name} have no out-neighbour to average with")
    width = max(len(nb) for nb in lists)
    table = np.array([nb + [i] * (width - len(nb)) for i, nb in enumerate(lists)], np.int32)
    return table, np.array([len(nb) for nb in lists], np.int32)


def async_schedule(
    compute: timing.Compute, table: Array, degree: Array, num_events: int, key: PRNGKey
) -> AsyncSchedule:
    """The first ``num_events`` (E) events of the run with key ``key`` (module docstring).

    Memory is ``[E, N]`` (every node's first E step times), fine for small runs only.
    """
    n = table.shape[0]
    clock_key = jax.random.wrap_key_data(timing.init_clock(key).key)
    steps = jnp.arange(num_events, dtype=jnp.int32)
    durations = jax.vmap(lambda k: timing.compute_seconds(compute, clock_key, k, n))(steps)  # [K, N]
    finish = jnp.cumsum(durations.astype(jnp.float32), axis=0)  # [K, N]
    step_idx = jnp.broadcast_to(steps[:, None], finish.shape).reshape(-1)
    node_idx = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32)[None, :], finish.shape).reshape(-1)
    order = jnp.lexsort((step_idx, node_idx, finish.reshape(-1)))[:num_events]
    node = node_idx[order]
    key_sched, _ = jax.random.split(key)
    u = jax.random.uniform(key_sched, (num_events,))
    slot = jnp.minimum(jnp.floor(u * degree[node]).astype(jnp.int32), degree[node] - 1)
    partner = jnp.asarray(table)[node, slot]
    return AsyncSchedule(finish.reshape(-1)[order], node, partner, step_idx[order])


@functools.partial(jax.jit, static_argnums=(1, 2, 6))
def _run(x0, loss_fn, full_loss_fn, table, degree, compute, num_rounds, lr, key):
    n = x0.shape[0]
    num_events = num_rounds * n
    sched = async_schedule(compute, table, degree, num_events, key)
    _, key_grad = jax.random.split(key)
    grad = jax.grad(loss_fn)
    nodes = jnp.arange(n, dtype=jnp.int32)

    def event(carry, e):
        x, snap = carry
        i, j = sched.node[e], sched.partner[e]
        g = grad(snap[i], i, jax.random.fold_in(key_grad, e))
        avg = 0.5 * (x[i] + x[j])
        x = x.at[j].set(avg).at[i].set(avg - lr * g)
        snap = snap.at[i].set(x[i])
        return (x, snap), None

    def metrics(x):
        mean = jnp.mean(x, axis=0)
        obj = jnp.mean(jax.vmap(full_loss_fn, in_axes=(None, 0, None))(mean, nodes, key_grad))
        return obj, jnp.mean(jnp.sum((x - mean) ** 2, axis=-1))

    def round_fn(carry, r):
        carry, _ = jax.lax.scan(event, carry, r * n + nodes)
        return carry, metrics(carry[0])

    (x, _), (objs, cons) = jax.lax.scan(round_fn, (x0, x0), jnp.arange(num_rounds))
    obj0, cons0 = metrics(x0)
    times = sched.time.reshape(num_rounds, n)[:, -1]
    zero = jnp.zeros([1], jnp.float32)
    return AsyncResult(
        jnp.concatenate([obj0[None], objs]),
        jnp.concatenate([cons0[None], cons]),
        jnp.concatenate([zero, times]),
        x,
        sched,
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
) -> AsyncResult:
    """AD-PSGD (module docstring) on a :class:`jaxgossip.problems.Problem` over ``topology``.

    Args:
      problem: its ``loss_fn`` gives the (stochastic) gradients, ``full_loss_fn`` the objective.
      topology: a fixed graph (graph 0 of a time-varying one); events average along its edges.
      x0: [N, D] float32 initial models.
      lr: gamma, the step size (may be traced).
      time: a :class:`jaxgossip.timing.TimeModel` or a :class:`jaxgossip.timing.Compute` (or a
        ``--time.compute`` spec); only the compute part is used (averaging is instantaneous).
      num_rounds: R >= 1; the run processes E = R N events.
      key: PRNG key; the same key gives the same schedule and run.

    Raises:
      ValueError: a bad ``num_rounds``, an ``x0`` not [N, D] for the topology's N, a stochastic
        graph or a node without neighbours.
    """
    if isinstance(num_rounds, bool) or not isinstance(num_rounds, (int, np.integer)) or num_rounds < 1:
        raise ValueError(f"num_rounds={num_rounds!r} must be a positive int")
    x0 = jnp.asarray(x0, jnp.float32)
    if x0.ndim != 2 or x0.shape[0] != topology.num_nodes:
        raise ValueError(f"x0 must be [N, D] with N = {topology.num_nodes}; got shape {x0.shape}")
    compute = time.compute if isinstance(time, timing.TimeModel) else timing.parse_compute(time)
    table, degree = neighbor_table(topology)
    return _run(x0, problem.loss_fn, problem.full_loss_fn, table, degree, compute, int(num_rounds), lr, key)
