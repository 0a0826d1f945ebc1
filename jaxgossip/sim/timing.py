"""Simulated time inside the compiled run: each round's duration and the clock that sums them.

One model with one implementation: the compiled runs (:mod:`jaxgossip.engine.consensus`,
:mod:`jaxgossip.engine.optimization`, :mod:`jaxgossip.engine.training`) advance a clock with it every
round from the bits the round actually sent, and :func:`jaxgossip.sim.cost.simulate` prices recorded
bits with the same functions (in float64 on the host). Its parameters are one
:class:`jaxgossip.sim.network.Network` (compute per local step, availability, links);
:func:`time_model` lays it out on the run's graph as a :class:`TimeModel` (a pytree).

* **A round's communication** ``c_i``: :func:`jaxgossip.sim.network.comm_seconds`.
* **A round's compute** ``P_i = sum_h p_{rH+h, i}`` over its H local steps:
  :func:`jaxgossip.sim.compute.compute_seconds`.
* **A synchronous round** lasts until its slowest node is done (:func:`round_seconds`): ``atc``
  (compute, then send) ``tau_r = max_i (P_i + c_i)`` and ``same_iterate`` (send ``x^k`` while
  computing at it) ``tau_r = max_i max(P_i, c_i)``. ``sim_time`` after R rounds is
  ``sum_{r < R} tau_r``, accumulated with a compensated (Kahan) float32 sum so that long runs keep
  their small rounds.

.. math::

   \\tau_r = \\max_i \\big(P_{r,i} + c_{r,i}\\big), \\qquad
   c_{r,i} = I \\sum_{e:\\,s(e)=i} \\Big(l_e + \\frac{\\mathrm{bits}_{r,i}}{I\\,d_{t,i}\\,b_e}\\Big)

**Gradients.** A round's time is piecewise linear in every latency and compute time and in every
``1 / bandwidth`` (a sum of link times, a max over nodes), so ``sim_time`` is differentiable in the
link parameters wherever the slowest node of each round is unique: :func:`elapsed` recomputes a
run's clock from its recorded bits in the links' dtype (float64 under x64), with the link
parameters traced, and :func:`time_to_target` turns a curve into the simulated time at which it
first reaches a target (docs/topologies.md, section "gradients through runs").

Keys: the clock draws from ``fold_in(run key, TIME_STREAM)``, never from the run's key schedule,
so a timed run computes exactly the iterates of the same run untimed.

References:
  Lian, Zhang, Zhang, Liu, "Asynchronous Decentralized Parallel Stochastic Gradient Descent", ICML
  2018 (arXiv:1710.06952; stragglers and the cost of waiting).
  Aketi, Singh, Roy, arXiv:2102.05715, 2021 (per-node time and energy of Sparse-Push).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.sim.compute import Compute, compute_seconds
from jaxgossip.sim.network import Links, Network, comm_seconds
from jaxgossip.types import Array, PRNGKey

__all__ = [
    "TIME_STREAM",
    "TimeModel",
    "Clock",
    "time_model",
    "init_clock",
    "round_seconds",
    "advance",
    "with_ordering",
    "elapsed",
    "time_to_target",
]

# Folded into the run key for the clock's draws (an arbitrary constant, distinct from the graph
# sampler's stream).
TIME_STREAM = 0x7105


@dataclasses.dataclass(frozen=True)
class TimeModel:
    """The time model of a run: compute per local step and the links (a pytree; build it with
    :func:`time_model`).

    Attributes:
      compute: :class:`Compute`.
      links: :class:`Links` (:func:`make_links`).
      overlap: static bool, whether a node sends while it computes (the ``same_iterate`` ordering).
      exchange: static, :attr:`~jaxgossip.sim.network.Network.exchange` (``"priced"`` or ``"free"``):
        whether an asynchronous pairwise average takes its link time.
      available: ``[R, N]`` 0/1, which nodes are online in round ``t mod R`` (:func:`availability`),
        or None (always online). An offline node computes nothing and sends nothing (its graph is
        :func:`jaxgossip.topology.with_availability`), and the round waits only for online nodes.
    """

    compute: Compute
    links: Links
    overlap: bool = False
    available: Any = None
    exchange: str = "priced"


jax.tree_util.register_dataclass(
    TimeModel, data_fields=["compute", "links", "available"], meta_fields=["overlap", "exchange"]
)


def time_model(
    topology: Any,
    network: Network | None = None,
    *,
    algorithm: str | None = None,
    options: Any = None,
    ordering: str = "atc",
    exchanges: int | None = None,
    allreduce: bool | None = None,
    available: Any = None,
    seed: int | None = None,
    **fields: Any,
) -> TimeModel:
    """The :class:`TimeModel` of a run on ``topology`` under ``network``.

    Args:
      topology: the run's graph.
      network: the :class:`~jaxgossip.sim.network.Network` (default: ``Network(**fields)``).
      algorithm, options: a registered algorithm's name and options: its metadata gives the
        exchanges per round and whether a round is priced as an all-reduce (its
        :class:`jaxgossip.types.CostFacts`), by the network's ``allreduce_model``.
      ordering: ``"atc"`` (compute, then send) or ``"same_iterate"`` (overlap).
      exchanges, allreduce: explicit values instead of the metadata's (an unregistered algorithm).
      available: ``[R, N]`` online mask (:meth:`Network.online`) or None; the run's graph must then
        be :func:`jaxgossip.topology.with_availability` of the same mask.
      seed: the run's seed, from which per-node link specs (``stragglers:F,S``,
        ``lognormal:MEDIAN,SIGMA``) are drawn (:meth:`~jaxgossip.sim.network.Network.link_values`).
      fields: :class:`~jaxgossip.sim.network.Network` fields (``compute=``, ``latency=``,
        ``bandwidth=``, ``mode=``, ...) that replace those of ``network``.
    """
    network = Network(**fields) if network is None else dataclasses.replace(network, **fields) if fields else network
    if algorithm is not None:
        from jaxgossip import algorithms

        info = algorithms.resolve(algorithm)
        if exchanges is None:
            exchanges = info.cost.exchanges_per_round(dict(options or {}))
        if allreduce is None:
            allreduce = info.cost.allreduce_cost
    allreduce = bool(allreduce)
    links = network.links(topology, exchanges=1 if exchanges is None else exchanges, allreduce=allreduce, seed=seed)
    compute = network.compute_model
    if compute.kind == "trace" and np.shape(compute.trace)[1] != topology.num_nodes:
        raise ValueError(
            f"--time.compute: a trace of shape {np.shape(compute.trace)} does not fit N = {topology.num_nodes} "
            f"nodes: it must be [steps, {topology.num_nodes}]"
        )
    if available is not None:
        available = np.asarray(available, np.float32)
        if available.ndim != 2 or available.shape[1] != topology.num_nodes:
            raise ValueError(f"available must be [rounds, N] = [R, {topology.num_nodes}]; got {available.shape}")
    return TimeModel(compute, links, overlap=ordering == "same_iterate", available=available, exchange=network.exchange)


class Clock(NamedTuple):
    """The simulated clock a run carries (``time`` + ``carry`` is the exact sum of the round times).

    Attributes:
      time: [] float32, seconds since the start (the compensated sum).
      carry: [] float32, the Kahan compensation of ``time`` (what float32 lost).
      comm: [] float32, seconds of communication so far (the slowest node's ``c_i``, summed).
      round: [] int32, rounds done.
      key: [2] uint32, raw data of the clock's key ``fold_in(run key, TIME_STREAM)``.
    """

    time: Array
    carry: Array
    comm: Array
    round: Array
    key: Array


def init_clock(run_key: PRNGKey) -> Clock:
    """The clock at time 0 of a run with key ``run_key`` (typed or raw)."""
    key = jax.random.fold_in(run_key, TIME_STREAM)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    zero = jnp.zeros([], jnp.float32)
    return Clock(zero, zero, zero, jnp.zeros([], jnp.int32), key)


def round_seconds(model: TimeModel, key: PRNGKey, bits: Array, t: Any, local_steps: int) -> tuple[Array, Array]:
    """``(tau_r, max_i c_i)`` of round ``t``: its synchronous duration and its communication time.

    Args:
      model: the run's time model.
      key: the clock's key (see :func:`compute_seconds`).
      bits: ``[N]`` bits sent in the round.
      t: round counter (0-based; its H local steps are ``t H .. t H + H - 1``).
      local_steps: H (static).
    """
    n = model.links.num_nodes
    comm = comm_seconds(model.links, bits, t)
    if model.compute.is_zero or local_steps == 0:
        work = jnp.zeros([n], comm.dtype)
    else:
        first = jnp.asarray(t, jnp.int32) * local_steps
        work = sum(compute_seconds(model.compute, key, first + h, n) for h in range(local_steps)).astype(comm.dtype)
    if model.available is not None:  # an offline node computes nothing; the round does not wait for it
        avail = jnp.asarray(model.available)
        work = work * avail[jnp.asarray(t, jnp.int32) % avail.shape[0]].astype(work.dtype)
    node = jnp.maximum(work, comm) if model.overlap else work + comm
    return jnp.max(node), jnp.max(comm)


def advance(clock: Clock, model: TimeModel, bits: Array, local_steps: int = 1) -> Clock:
    """The clock after one more synchronous round that sent ``bits`` ``[N]`` and took ``local_steps``
    local steps (Kahan sum of the round times: a float32 sum alone would drop rounds of 1e-4 s
    after about 1e3 s)."""
    key = jax.random.wrap_key_data(clock.key)
    tau, comm = round_seconds(model, key, bits, clock.round, local_steps)
    y = tau.astype(jnp.float32) - clock.carry
    total = clock.time + y
    carry = (total - clock.time) - y
    return Clock(total, carry, clock.comm + comm.astype(jnp.float32), clock.round + 1, clock.key)


def with_ordering(model: TimeModel, ordering: str) -> TimeModel:
    """``model`` with the overlap of a run's ordering (``same_iterate`` sends while it computes)."""
    return dataclasses.replace(model, overlap=ordering == "same_iterate")


def elapsed(model: TimeModel, node_bits: Array, local_steps: int = 1, key: PRNGKey | None = None) -> Array:
    """``[S + 1]`` simulated seconds after 0, 1, ..., S synchronous rounds: ``sum_{r < k} tau_r``
    (:func:`round_seconds`), the run's clock recomputed from the bits its rounds sent.

    The same round times as the clock a timed run carries (:func:`advance`), summed in the dtype
    of the links (float64 under x64, where no compensation is needed) rather than a float32 Kahan
    sum: pure and differentiable in the model's traced numbers (latency, bandwidth, compute
    seconds), e.g. ``jax.grad(lambda lat: elapsed(time_model(topo, latency=lat), bits)[-1])``.

    Args:
      model: the run's time model (:func:`time_model`, with the run's ordering).
      node_bits: ``[S, N]`` bits each node sent in each round (``node_bits`` of a run's trace).
      local_steps: H, local steps per round (static).
      key: the run's key (the one given to ``run_consensus`` / ``run_optimization``); the clock's
        key is derived from it as in :func:`init_clock`. Needed only by random compute (kinds
        other than ``constant`` and ``trace``).

    Raises:
      ValueError: ``node_bits`` not ``[S, N]``; random compute without ``key``.
    """
    n = model.links.num_nodes
    if jnp.ndim(node_bits) != 2 or jnp.shape(node_bits)[1] != n:
        raise ValueError(f"node_bits must be [S, N] = [S, {n}]; got shape {jnp.shape(node_bits)}")
    if key is None:
        if model.compute.kind not in ("constant", "trace") and not model.compute.is_zero:
            raise ValueError(f"elapsed: compute of kind {model.compute.kind!r} is drawn: give the run's key")
        key = jax.random.key(0)
    clock_key = jax.random.wrap_key_data(init_clock(key).key)
    dtype = jnp.result_type(float, model.links.latency)
    rounds = jnp.arange(jnp.shape(node_bits)[0], dtype=jnp.int32)
    taus, _ = jax.vmap(lambda bits, t: round_seconds(model, clock_key, bits, t, local_steps))(
        jnp.asarray(node_bits, dtype), rounds
    )
    return jnp.concatenate([jnp.zeros([1], dtype), jnp.cumsum(taus.astype(dtype))])


def time_to_target(times: Array, values: Array, target: Any) -> Array:
    """The simulated time at which a decreasing curve first reaches ``target`` (log-linear
    interpolation between the two points around the crossing).

    With k the first point where ``values[k] <= target``:

    .. math::

       t^\\star = t_{k-1} + (t_k - t_{k-1})
           \\frac{\\log v_{k-1} - \\log v^\\star}{\\log v_{k-1} - \\log v_k}

    (``t* = t_0`` if ``k = 0``; ``inf`` if the curve never reaches the target). Consensus and
    optimization errors decay geometrically, so the interpolation is linear in ``log v``. ``t*`` is
    smooth in ``times``, ``values`` and ``target`` wherever k does not change, i.e. where
    ``v_{k-1} > target > v_k`` strictly; its gradient is 0 where it is ``inf`` or ``k = 0``.
    A crossing onto an exact 0 (exact averaging) has no logarithm: ``t* = t_k`` there.

    Args:
      times: ``[S + 1]`` seconds (e.g. :func:`elapsed`), non-decreasing.
      values: ``[S + 1]`` positive values (a consensus error, an objective gap).
      target: the value to reach (> 0).

    Raises:
      ValueError: shapes that differ or are not 1-D.
    """
    times, values = jnp.asarray(times), jnp.asarray(values)
    if times.ndim != 1 or times.shape != values.shape:
        raise ValueError(f"times and values must be [S + 1] of one shape; got {times.shape} and {values.shape}")
    dtype = jnp.result_type(times, values, float)
    positive = values > 0
    log_v = jnp.log(jnp.where(positive, values, 1).astype(dtype))
    log_target = jnp.log(jnp.asarray(target, dtype))
    reached = values <= target
    k = jnp.argmax(reached)  # first crossing (0 if none; masked below)
    before = jnp.maximum(k - 1, 0)
    inside = reached.any() & (k > 0) & positive[k]
    # Safe denominators, so that the branch not taken has a finite (zero) gradient.
    gap = jnp.where(inside, log_v[before] - log_v[k], 1.0)
    fraction = jnp.where(inside, (log_v[before] - log_target) / gap, 1.0)
    crossing = times[before] + (times[k] - times[before]) * fraction
    return jnp.where(reached.any(), jnp.where(k > 0, crossing, times[0]), jnp.inf).astype(dtype)
