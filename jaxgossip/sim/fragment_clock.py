"""The clock of a Streaming DiLoCo round: fragments sent while the node keeps computing.

A round of H inner steps (:mod:`jaxgossip.engine.streaming`) launches fragment f after inner step
``L_f`` and needs its result ``tau`` steps later, at its merge step ``M_f`` (in the next round when
``L_f + tau > H``). Each node i follows its own timeline from the round's start: inner step h
takes ``p_{rH+h, i}`` (:func:`jaxgossip.sim.compute.compute_seconds`, 0 while offline); a launch
puts the fragment's message on the node's link, after the messages still on it
(``start = max(T_i, link_i)``, ``end = start + c_{f,i}`` with
:func:`jaxgossip.sim.network.comm_seconds` of the fragment's bits); a merge waits for its message
(``T_i = max(T_i, end_{f,i})``). The round lasts until its slowest node is done,
``tau_r = max_i T_i``, and a message still in flight at the end arrives ``end - tau_r`` into the
next round. Communication hidden behind the overlap costs no time when it fits; a message longer
than the steps it overlaps makes the node wait for the rest.

With one fragment and no overlap the timeline is ``P_i + c_i`` and the round is
:func:`jaxgossip.sim.timing.round_seconds`'s ``max_i (P_i + c_i)`` bit for bit. Like the
synchronous model, a node's message is priced by its own links (with downlinks, each message
bounded by its receiver's downlink and, in serial mode, the node's link busy for the longer of its
uploads and downloads: :func:`jaxgossip.sim.network.comm_seconds`): it does not wait for its
neighbours to launch.

Shapes: N nodes, F fragments; ``bits`` [F, N], arrivals [F, N] (seconds after the round's start).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from jaxgossip.sim.compute import compute_seconds
from jaxgossip.sim.network import comm_seconds
from jaxgossip.sim.timing import Clock, TimeModel
from jaxgossip.types import Array, PRNGKey

__all__ = ["stream_round_seconds", "advance_stream"]


def stream_round_seconds(
    model: TimeModel,
    key: PRNGKey,
    bits: Array,
    t: Array,
    local_steps: int,
    launches: Sequence[int],
    merges: Sequence[int],
    arrivals: Array,
) -> tuple[Array, Array, Array]:
    """``(tau_r, comm, arrivals)`` of round ``t`` (module docstring).

    Args:
      model: the run's time model.
      key: the clock's key.
      bits: [F, N] bits of every fragment's message this round.
      t: round counter (its inner steps are ``t H .. t H + H - 1``).
      local_steps: H (static).
      launches: L_f in [1, H] per fragment (static).
      merges: M_f per fragment (static): the inner step of its merge, ``L_f + tau`` (past H: in
        the next round, at ``L_f + tau - H``).
      arrivals: [F, N] when each fragment launched in the previous round arrives, in seconds after
        this round's start (<= 0: already there).

    Returns:
      ``tau_r`` the round's duration, ``comm`` the slowest node's seconds on its link, and the
      arrivals of this round's late messages in the next round ([F, N], 0 for the others).
    """
    n, count = model.links.num_nodes, len(launches)
    first = jnp.asarray(t, jnp.int32) * local_steps
    online = None
    if model.available is not None:
        avail = jnp.asarray(model.available)
        online = avail[jnp.asarray(t, jnp.int32) % avail.shape[0]]
    sends = [comm_seconds(model.links, bits[k], t) for k in range(count)]
    dtype = sends[0].dtype
    clock, link = jnp.zeros([n], dtype), jnp.zeros([n], dtype)
    ends: dict[int, Array] = {}
    for step in range(1, local_steps + 1):
        if not model.compute.is_zero:
            work = compute_seconds(model.compute, key, first + step - 1, n).astype(dtype)
            clock = clock + (work if online is None else work * online.astype(dtype))
        for k in range(count):
            if launches[k] == step:
                start = jnp.maximum(clock, link)
                ends[k] = link = start + sends[k]
        for k in range(count):
            if merges[k] == step:
                # a merge before its launch step waits for the previous round's message
                arrived = ends[k] if merges[k] >= launches[k] else arrivals[k].astype(dtype)
                clock = jnp.maximum(clock, arrived)
    tau = jnp.max(clock)
    late = [ends[k] - tau if merges[k] < launches[k] else jnp.zeros([n], dtype) for k in range(count)]
    return tau, jnp.max(sum(sends)), jnp.stack(late).astype(jnp.float32)


def advance_stream(
    clock: Clock,
    model: TimeModel,
    bits: Array,
    local_steps: int,
    launches: Sequence[int],
    merges: Sequence[int],
    arrivals: Array,
) -> tuple[Clock, Array]:
    """The clock after one more streaming round (Kahan sum as
    :func:`jaxgossip.sim.timing.advance`) and the next round's arrivals [F, N]."""
    key = jax.random.wrap_key_data(clock.key)
    tau, comm, arrivals = stream_round_seconds(model, key, bits, clock.round, local_steps, launches, merges, arrivals)
    y = tau.astype(jnp.float32) - clock.carry
    total = clock.time + y
    carry = (total - clock.time) - y
    return Clock(total, carry, clock.comm + comm.astype(jnp.float32), clock.round + 1, clock.key), arrivals
