"""Consensus-only simulation: communication rounds without gradients, one program of the round
driver (:func:`jaxgossip.engine.rounds.run_rounds`)."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.engine.rounds import next_keys, run_rounds
from jaxgossip.ops.mixing import consensus_distance, node_mean
from jaxgossip.sim import timing
from jaxgossip.sim.timing import TimeModel
from jaxgossip.types import Array, GossipAlgorithm, Params, PRNGKey

__all__ = ["ConsensusResult", "ConsensusTrace", "run_consensus", "consensus_scan"]


class ConsensusResult(NamedTuple):
    """Outcome of :func:`run_consensus` over ``S = num_steps`` rounds.

    Attributes:
      error: [S + 1] ``(1/N) sum_i ||debias(x)_i - mean(x0)||^2`` (squared Frobenius norms summed over
        leaves) before round 1 and after every round.
      bits: [S + 1] cumulative bits sent by all nodes together (0 first), float64 on the host.
      x: final params (leaves [N, ...]).
      state: final algorithm state.
      node_bits: [S, N] float32, the bits each node sent in each round (``StepInfo.bits``; the time
        of a round under :mod:`jaxgossip.sim.cost` depends on what each node sent).
      sim_time: [S + 1] simulated seconds since the start (0 first) under the run's time model
        (:mod:`jaxgossip.sim.timing`), or None for a run without one.
      comm_time: [S + 1] seconds of communication so far (the slowest node's, summed over rounds),
        or None.
    """

    error: Any
    bits: Any
    x: Params
    state: Any
    node_bits: Any = None
    sim_time: Any = None
    comm_time: Any = None


class ConsensusTrace(NamedTuple):
    """What :func:`consensus_scan` returns (JAX arrays, ``S = num_steps``).

    Attributes:
      error: [S + 1] consensus error before round 1 and after every round (as ``ConsensusResult``).
      round_bits: [S] float32, bits sent by all nodes together in each round (not cumulative).
      node_bits: [S, N] float32, bits each node sent in each round; ``round_bits`` is its row sum.
      x: final params (leaves [N, ...]).
      state: final algorithm state.
      sim_time: [S + 1] float32 simulated seconds (0 first), or None without a time model.
      comm_time: [S + 1] float32 communication seconds so far, or None.
    """

    error: Array
    round_bits: Array
    node_bits: Array
    x: Params
    state: Any
    sim_time: Any = None
    comm_time: Any = None


def consensus_scan(
    alg: GossipAlgorithm,
    x0: Params,
    num_steps: int,
    key: PRNGKey,
    time: TimeModel | None = None,
    *,
    remat: bool = False,
    checkpoint_every: int | None = None,
) -> ConsensusTrace:
    """Pure, jittable and vmappable core of :func:`run_consensus`: one ``lax.scan`` over rounds.

    Differentiable with respect to every traced input: ``x0``, the algorithm's traced
    hyperparameters (``gamma``) and a graph's traced weights
    (:meth:`jaxgossip.topology.Topology.with_weights`), when the algorithm is built inside the
    differentiated function. ``remat=True`` rematerialises each round in the backward pass and
    ``checkpoint_every=C`` each chunk of C rounds (:func:`jaxgossip.engine.rounds.run_rounds`): the
    gradient's memory then grows as ``S / C + C`` rather than S (long runs in bounded memory).

    Returns:
      :class:`ConsensusTrace` with ``error`` [S + 1], ``round_bits`` [S], ``node_bits`` [S, N],
      final ``x`` and ``state``, and with a time model ``sim_time`` / ``comm_time`` [S + 1].
    """
    target = node_mean(x0)
    state0 = alg.init(x0)

    def body(carry, _):
        x, state, key, clock = carry
        key, (step_key,) = next_keys(key, 1)
        x, state, info = alg.step(x, state, step_key)
        err = consensus_distance(alg.debias(x, state), target)
        if time is not None:  # no local steps: a round is its communication
            clock = timing.advance(clock, time, info.bits, local_steps=0)
        return (x, state, key, clock), (err, jnp.sum(info.bits), info.bits, clock)

    err0 = consensus_distance(alg.debias(x0, state0), target)
    clock0 = None if time is None else timing.init_clock(key)
    (x, state, _, _), (errors, bits, node_bits, clocks) = run_rounds(
        body, (x0, state0, key, clock0), int(num_steps), remat=remat, checkpoint_every=checkpoint_every
    )
    sim_time = comm_time = None
    if time is not None:
        sim_time = jnp.concatenate([clock0.time[None], clocks.time])
        comm_time = jnp.concatenate([clock0.comm[None], clocks.comm])
    return ConsensusTrace(jnp.concatenate([err0[None], errors]), bits, node_bits, x, state, sim_time, comm_time)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _consensus_jit(alg, x0, num_steps, key, time):
    return consensus_scan(alg, x0, num_steps, key, time)


def run_consensus(
    alg: GossipAlgorithm, x0: Params, num_steps: int, key: PRNGKey, time: TimeModel | None = None
) -> ConsensusResult:
    """Runs ``num_steps`` communication rounds of ``alg`` from ``x0`` in one jitted ``lax.scan``.

    Args:
      alg: a :class:`~jaxgossip.types.GossipAlgorithm`.
      x0: pytree of leaves ``[N, ...]``, the initial node values.
      num_steps: S, number of rounds (static).
      key: PRNG key; round k uses the k-th of :func:`jaxgossip.engine.rounds.round_keys` ``(key, S)`` (the
        driver's key schedule).
      time: optional :class:`jaxgossip.sim.timing.TimeModel` (e.g. :func:`jaxgossip.sim.timing.time_model`);
        the run then records ``sim_time`` and ``comm_time`` (rounds without local steps: a round
        lasts as long as its slowest node's communication).

    Returns:
      :class:`ConsensusResult` with ``error`` [S + 1], ``bits`` [S + 1] cumulative over all nodes
      (accumulated in float64 on the host), final ``x`` and ``state``, and ``node_bits`` [S, N].
    """
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
        raise ValueError(f"num_steps={num_steps!r} must be a positive int")
    trace = _consensus_jit(alg, x0, int(num_steps), key, time)
    cumulative = np.concatenate([[0.0], np.cumsum(np.asarray(trace.round_bits, dtype=np.float64))])
    return ConsensusResult(
        error=trace.error,
        bits=cumulative,
        x=trace.x,
        state=trace.state,
        node_bits=trace.node_bits,
        sim_time=trace.sim_time,
        comm_time=trace.comm_time,
    )
