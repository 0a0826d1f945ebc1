"""Asynchronous runs under churn: which events happen when nodes go off and on line
(``--time.availability`` with ``--execution=async``).

Host-side NumPy, like the rest of the plan (:mod:`~jaxgossip.engine.asynchronous.planning`); it
depends only on the step durations, the online mask and the key, never on model values.

**Time.** The online mask ``[R, N]`` (:func:`jaxgossip.sim.compute.availability`, R = the run's
rounds) is laid on the simulated clock: row r covers ``[r P, (r + 1) P)``, cycled over R rows
(time t is in row ``floor(t / P)``, online by row ``floor(t / P) mod R``), with the period

    P = N / sum_i (1 / E[p_i]),

the expected time of one round of N events when every node is online
(:func:`jaxgossip.sim.compute.expected_seconds`): one row is about one round, as in a synchronous
run under the same mask.

**The rule** (an offline node neither computes nor exchanges). Node i starts its first step at
the start of its first online row (0 when online at time 0). A step of ``p`` seconds started at
``s`` finishes at ``c = s + p`` (float32); it counts (the event at c, as without churn) only if i
is online in every row from the one it started in to the one of c. Otherwise the node went
offline during the step: the work is lost (no event, the next draw of the node's step times is
used) and i starts again at the start of its next online row. After an event the node starts its
next step at once (at the event's time: it is online then). Events are in the order of
``(time, node, step)``; a node never online has no events, nor has one whose online stretches are
all shorter than its steps (it keeps losing them).

* AD-PSGD draws its partner among the out-neighbours online in the row of its request (node i's
  gradient done at c): slot ``floor(u c_i)`` of the ``c_i`` online ones in ascending order (all
  neighbours online: the draw without churn); with none online the event is i's step alone
  (partner i, no exchange, no link time). A priced exchange that has begun completes (both nodes
  keep their booking if one goes offline during it); i's next step starts at its end if i is
  online then, else at the start of its next online row.
* Asynchronous gossip and SGP: messages are sent at events only, so an offline node sends
  nothing; a message on its way to a node that is offline when it arrives *waits* for it and
  counts at its next event, as every arrived message does. Waiting keeps push-sum's mass: a
  dropped SGP message would take its share of ``sum_i x_i`` and ``sum_i w_i`` with it and bias the
  average the nodes de-bias towards; for gossip it is the delivery a retrying transport (or a
  message queue) gives.

The rows change only where a node is, so every rule of the plan without churn (stale versions,
delayed messages, waves) applies unchanged to the events this schedule gives.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Churn", "make_churn", "churn_walk", "online_partners"]

NEVER = np.int64(1) << 40  # rows: a distance meaning "not in any row"


class Churn(NamedTuple):
    """The online mask laid on the clock (module docstring).

    Attributes:
      online: [R, N] bool, row ``r mod R``.
      period: P, seconds per row.
      to_on: [R, N] int64 rows from row r to the first row >= r where the node is online
        (:data:`NEVER`: never online).
      to_off: [R, N] int64 rows from row r to the first row >= r where the node is offline
        (:data:`NEVER`: always online).
    """

    online: np.ndarray
    period: float
    to_on: np.ndarray
    to_off: np.ndarray

    def row(self, t):
        """The row of time ``t`` (seconds; float32 values as float64): ``floor(t / P)``."""
        return np.floor(np.asarray(t, np.float64) / self.period).astype(np.int64)

    def next_on(self, row, node):
        """The first row >= ``row`` in which ``node`` is online (>= :data:`NEVER`: none)."""
        return row + self.to_on[row % self.online.shape[0], node]

    def next_off(self, row, node):
        """The first row >= ``row`` in which ``node`` is offline (>= :data:`NEVER`: none)."""
        return row + self.to_off[row % self.online.shape[0], node]

    def start_of(self, row):
        """float32 seconds at which ``row`` starts (inf for :data:`NEVER` rows)."""
        row = np.asarray(row, np.int64)
        return np.where(row >= NEVER, np.inf, row.astype(np.float64) * self.period).astype(np.float32)


def _distances(state: np.ndarray) -> np.ndarray:
    """[R, N] rows from each row to the first row (cyclically) where ``state`` holds."""
    r_count = state.shape[0]
    out = np.empty(state.shape, np.int64)
    dist = np.full(state.shape[1], NEVER, np.int64)
    for r in range(2 * r_count - 1, -1, -1):  # two cycles backward: every row sees a full cycle ahead
        dist = np.where(state[r % r_count], 0, np.minimum(dist + 1, NEVER))
        if r < r_count:
            out[r] = dist
    out[out >= r_count] = NEVER
    return out


def make_churn(available: np.ndarray, expected: np.ndarray) -> Churn:
    """The :class:`Churn` of an ``[R, N]`` 0/1 mask and the nodes' expected step seconds
    ``E[p_i]`` [N] (:func:`jaxgossip.sim.compute.expected_seconds`).

    Raises:
      ValueError: a mask that is not [R, N] 0/1, no node ever online, or step times with no
        positive expected value.
    """
    online = np.asarray(available)
    expected = np.asarray(expected, np.float64)
    if online.ndim != 2 or online.shape[1] != expected.shape[0] or online.shape[0] < 1:
        raise ValueError(f"availability must be [R, N] = [R, {expected.shape[0]}]; got {online.shape}")
    if not np.all((online == 0) | (online == 1)):
        raise ValueError("availability must hold 0 (offline) or 1 (online) only")
    online = online.astype(bool)
    if not online.any():
        raise ValueError("availability: no node is ever online, so no event would happen")
    if not np.all(np.isfinite(expected)) or np.any(expected < 0) or not np.any(expected > 0):
        raise ValueError(f"expected step seconds must be finite, >= 0 and not all 0; got {expected[:4]}")
    rates = np.where(expected > 0, 1.0 / np.where(expected > 0, expected, 1.0), 0.0)
    period = float(expected.shape[0] / rates.sum())
    return Churn(online, period, _distances(online), _distances(~online))


class Walk(NamedTuple):
    """Every node's events within its first K step draws (:func:`churn_walk`), unordered.

    Attributes:
      time, node, step, row: [E'] the events (float32 time, node, its event count, its row).
      next_start: [N] float32 when each node starts its next step after the K draws (inf: never).
    """

    time: np.ndarray
    node: np.ndarray
    step: np.ndarray
    row: np.ndarray
    next_start: np.ndarray


def churn_walk(durations: np.ndarray, churn: Churn) -> Walk:
    """The events of the first K step draws ``durations [K, N]`` of every node (module docstring),
    a loop over draws vectorized over nodes."""
    steps, n = durations.shape
    nodes = np.arange(n)
    row = churn.next_on(np.zeros(n, np.int64), nodes)
    start = churn.start_of(row)
    count = np.zeros(n, np.int64)
    times, who, counts, rows = [], [], [], []
    for k in range(steps):
        active = row < NEVER
        finish = (start + durations[k]).astype(np.float32)  # float32, as the running sum without churn
        finish_row = np.maximum(row, churn.row(np.where(active, finish, 0)))
        off = churn.next_off(np.where(active, row, 0), nodes)
        ok = active & (off > finish_row)
        times.append(finish[ok])
        who.append(nodes[ok])
        counts.append(count[ok])
        rows.append(finish_row[ok])
        count += ok
        lost = active & ~ok
        back = np.where(lost, churn.next_on(np.where(lost, off, 0), nodes), NEVER)
        row = np.where(ok, finish_row, np.where(lost, back, row))
        start = np.where(ok, finish, np.where(lost, churn.start_of(back), start)).astype(np.float32)
    return Walk(
        np.concatenate(times).astype(np.float32),
        np.concatenate(who).astype(np.int32),
        np.concatenate(counts).astype(np.int32),
        np.concatenate(rows).astype(np.int64),
        np.where(row < NEVER, start, np.inf).astype(np.float32),
    )


def online_partners(
    node: np.ndarray, row: np.ndarray, u: np.ndarray, table: np.ndarray, degree: np.ndarray, churn: Churn
) -> np.ndarray:
    """[E] AD-PSGD partners: slot ``floor(u_e c_e)`` (float32) of the ``c_e`` out-neighbours of
    ``node[e]`` online in ``row[e]``, ascending; the node itself when none is online."""
    nbrs = table[node]  # [E, Dmax]
    real = np.arange(table.shape[1])[None, :] < degree[node][:, None]
    up = real & churn.online[(row % churn.online.shape[0])[:, None], nbrs]
    count = up.sum(axis=1)
    slot = np.minimum(np.floor(u * count.astype(np.float32)).astype(np.int64), np.maximum(count - 1, 0))
    rank = np.cumsum(up, axis=1) - 1  # the place of each online neighbour among them
    pick = up & (rank == slot[:, None])
    chosen = nbrs[np.arange(node.shape[0]), np.argmax(pick, axis=1)]
    return np.where(count > 0, chosen, node).astype(np.int32)
