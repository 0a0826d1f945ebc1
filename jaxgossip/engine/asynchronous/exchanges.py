"""Priced pairwise exchanges (AD-PSGD with ``--time.exchange=priced``): the schedule of events when
an average takes its link time and keeps both nodes busy.

Host-side NumPy, like the rest of the plan (:mod:`~jaxgossip.engine.asynchronous.planning`); it
depends only on the step durations, the link delays and the key, never on model values.

**The rule.** Node i computes its k-th gradient for ``p_{k,i}`` seconds, from the end of its
previous exchange (0 first), and *requests* an exchange at the end, ``c = start + p_{k,i}``, with
the neighbour j it draws. The exchange is the model going to j and the average coming back (Lian et
al. 2018, Section 5: an active worker sends its model, the passive one averages and replies),
``d_ij = (l_ij + B / b_ij) + (l_ji + B / b_ji)`` with B = 32 D bits (the reply priced on the edge j -> i,
or on i -> j when the graph has no such edge); with downlinks each way goes at the slower of its two
ends, ``b_ij = min(b_ij, b^down_j)`` and ``b_ji = min(b_ji, b^down_i)``. A node takes part in one
exchange at a time (the paper's atomic averaging, with its cost): requests are served in the order
they are made (time, then node), each after every exchange already booked on either node, so the
exchange runs over ``[b, a]``, ``b = max(c, free_i, free_j)``, ``a = b + d_ij`` (float32), with
``free_x`` the end of the last exchange booked on node x. The average and i's step take effect at
``a``, the *event*; i starts its next gradient at ``a``. The passive node j keeps computing while it
serves (its communication runs beside its computation, as in the paper's implementation) and
receives the average at ``a``. Events are in the order of ``(a, request)``: the exchanges of one
node are disjoint and in request order, so this is the order in which every node sees them. With
zero delays ``a = c`` and the schedule is the free one's (the events at the steps' ends).

Partner draws: request q (in the order requests are made) picks slot ``floor(u_q deg_i)`` with
``u_q`` entry ``q mod E`` of block ``q // E`` of uniforms (block 0: ``uniform(key_sched, [E])``,
the free schedule's draw; block m: ``uniform(fold_in(key_sched, m), [E])``): a request's draw does
not depend on how many requests the run makes, and with zero delays the events, their times and
their partners are the free schedule's, bit for bit.

References:
  Lian, Zhang, Zhang, Liu, "Asynchronous Decentralized Parallel Stochastic Gradient Descent",
  ICML 2018 (arXiv:1710.06952), Algorithm 1 and Section 5.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from jaxgossip.engine.asynchronous.churn import NEVER, Churn

__all__ = ["PricedSchedule", "pair_seconds", "priced_exchanges"]


class PricedSchedule(NamedTuple):
    """The first E events of a run with priced exchanges, in event order (NumPy arrays).

    Attributes:
      time: [E] float32 the end of each exchange (the event).
      node: [E] int32 the node that requested it (and takes its step).
      partner: [E] int32 the neighbour it averaged with.
      step: [E] int32 which local step of ``node`` it is.
      request: [E] float32 when the node's gradient was done and it asked for the exchange.
      start: [E] float32 when the exchange began (``start - request``: the wait for busy nodes).
    """

    time: np.ndarray
    node: np.ndarray
    partner: np.ndarray
    step: np.ndarray
    request: np.ndarray
    start: np.ndarray


def pair_seconds(table: np.ndarray, degree: np.ndarray, one_way: dict[tuple[int, int], float]) -> np.ndarray:
    """``[N, Dmax]`` float32 seconds of an exchange of node i with its k-th out-neighbour
    ``table[i, k]``: ``one_way[(i, j)] + one_way[(j, i)]`` (the reply on ``(i, j)`` when the graph
    has no edge ``(j, i)``); 0 in padded slots.

    Args:
      table, degree: :func:`jaxgossip.engine.asynchronous.neighbor_table`.
      one_way: (sender, receiver) -> seconds of one model on that edge (latency + bits / bandwidth).
    """
    out = np.zeros(table.shape, np.float64)
    for i in range(table.shape[0]):
        for k in range(int(degree[i])):
            j = int(table[i, k])
            forward = one_way[(i, j)]
            out[i, k] = forward + one_way.get((j, i), forward)
    return out.astype(np.float32)


def _float32(cell: array) -> Callable[[float], float]:
    """``x -> float32(x)`` as a Python float (a C cast through a one-slot ``array('f')``): a sum
    or product of two float32 values computed in float64 and rounded once to float32 is the
    float32 operation's result (float64 has more than 2 * 24 + 2 bits), so the loop below does
    float32 arithmetic on Python floats, without NumPy scalars."""

    def round32(x: float) -> float:
        cell[0] = x
        return cell[0]

    return round32


def priced_exchanges(
    durations: np.ndarray,
    uniforms: Callable[[int], np.ndarray],
    table: np.ndarray,
    degree: np.ndarray,
    seconds: np.ndarray,
    num_events: int,
    churn: Churn | None = None,
) -> PricedSchedule | None:
    """The first ``num_events`` (E) events (module docstring), or None when some node needs more
    than the K steps of ``durations`` (draw more and call again).

    Args:
      durations: [K, N] float32 seconds of every node's first K local steps (step draws, lost
        ones included under churn).
      uniforms: ``block -> [E] float32`` uniforms of requests ``block E .. block E + E - 1``.
      table, degree: each node's out-neighbours (padded) and their count.
      seconds: [N, Dmax] float32 exchange seconds per neighbour slot (:func:`pair_seconds`).
      churn: the online mask on the clock (:mod:`~jaxgossip.engine.asynchronous.churn`: lost
        steps, partners drawn among online neighbours), or None (always online).
    """
    steps, n = durations.shape
    f32 = _float32(array("f", [0.0]))
    dur = durations.T.astype(np.float64).tolist()  # [N][K]: float32 values as Python floats
    sec = seconds.astype(np.float64).tolist()
    nbrs = [table[i, : int(degree[i])].tolist() for i in range(n)]
    free = [0.0] * n  # end of the last exchange booked on each node
    step = [0] * n  # events so far
    draw = [0] * n  # step draws so far (lost ones included)
    row = [0] * n  # under churn: the row each node's current step started in, then its request's row
    pending = []  # (request time, node): one per node
    if churn is None:
        pending = [(dur[i][0], i) for i in range(n)]
        draw = [1] * n
    else:
        online = churn.online.tolist()
        to_on, to_off = churn.to_on.tolist(), churn.to_off.tolist()
        cycle, period = len(online), churn.period

        retry: list = [None] * n  # (start, row) of a node's next step after a lost one

        def request(i: int, start: float, start_row: int) -> bool:
            """Pushes i's next step from ``start``: its request when it stays online for it, else
            (the step lost) a retry at the start of its next online row, processed in time order
            like the requests (a node whose online stretches are all shorter than its steps
            retries for ever, which only the stopping point ends); False when it needs more than
            K draws."""
            if start_row >= NEVER:
                return True  # never online again: no more requests
            if draw[i] >= steps:
                return False
            c = f32(start + dur[i][draw[i]])
            draw[i] += 1
            c_row = max(start_row, math.floor(c / period))
            off = start_row + to_off[start_row % cycle][i]
            if off > c_row:
                row[i] = c_row
                heapq.heappush(pending, (c, i))
                return True
            back = off + to_on[off % cycle][i]  # offline during the step: lost
            if back < NEVER:
                restart = f32(back * period)
                retry[i] = (restart, back)
                heapq.heappush(pending, (restart, i))
            return True

        for i in range(n):
            first = to_on[0][i]
            if not request(i, f32(first * period) if first < NEVER else math.inf, first):
                return None
    heapq.heapify(pending)
    push, pop = heapq.heappush, heapq.heappop
    cell = array("f", [0.0])  # float32 rounding inline (see _float32)
    degrees = sorted({int(d) for d in degree})
    slot_of: dict[int, dict[int, list[int]]] = {}  # block -> degree -> slot of each request (no churn)
    uniform_of: dict[int, list[float]] = {}  # block -> uniforms (churn: the count varies)
    # per request, in request order: its end, node, partner, step, request and start time (typed
    # arrays: cheap appends, read by NumPy without a copy)
    ends, starts, requests = array("d"), array("d"), array("d")
    nodes, partners, steps_done = array("q"), array("q"), array("q")
    q, check_at = 0, num_events
    block, index = 0, -1  # divmod(q, num_events), kept by counting
    slots_now = None  # slot_of[block] (no churn)
    while pending:
        if q >= check_at:  # stop once every later request starts after the E-th earliest end
            threshold = np.partition(np.frombuffer(ends), num_events - 1)[num_events - 1]
            if pending[0][0] >= threshold:
                break
            check_at = q + max(n, 16)
        c, i = pop(pending)
        if churn is not None and retry[i] is not None:  # a lost step: the node starts again
            restart, restart_row = retry[i]
            retry[i] = None
            if not request(i, restart, restart_row):
                return None
            continue
        index += 1
        if index == num_events:
            block, index = block + 1, 0
            slots_now = None
        mine = nbrs[i]
        if churn is None:
            if slots_now is None:
                if block not in slot_of:
                    u32 = uniforms(block)
                    slot_of[block] = {
                        d: np.minimum(np.floor(u32 * np.float32(d)).astype(np.int64), d - 1).tolist() for d in degrees
                    }
                slots_now = slot_of[block]
            slot = slots_now[len(mine)][index]
            j = mine[slot]
        else:
            if block not in uniform_of:
                uniform_of[block] = uniforms(block).astype(np.float64).tolist()
            up = online[row[i] % cycle]
            slots = [k for k, j in enumerate(mine) if up[j]]
            if slots:
                cell[0] = uniform_of[block][index] * len(slots)
                slot = slots[min(int(cell[0]), len(slots) - 1)]
                j = mine[slot]
            else:  # no neighbour online: the node's step alone
                j = i
        fi, fj = free[i], free[j]
        start = c if c >= fi and c >= fj else (fi if fi >= fj else fj)
        if j != i:
            cell[0] = start + sec[i][slot]
            end = cell[0]
        else:
            end = start
        free[i] = free[j] = end
        ends.append(end)
        nodes.append(i)
        partners.append(j)
        steps_done.append(step[i])
        requests.append(c)
        starts.append(start)
        step[i] += 1
        q += 1
        if churn is None:
            k = draw[i]
            if k >= steps:
                return None
            cell[0] = end + dur[i][k]
            push(pending, (cell[0], i))
            draw[i] = k + 1
            continue
        end_row = max(row[i], math.floor(end / period))
        if online[end_row % cycle][i]:
            ok = request(i, end, end_row)
        else:
            back = end_row + to_on[end_row % cycle][i]
            ok = request(i, f32(back * period) if back < NEVER else math.inf, back)
        if not ok:
            return None
    end = np.frombuffer(ends).astype(np.float32)
    first = np.lexsort((np.arange(end.shape[0]), end))[:num_events]
    return PricedSchedule(
        end[first],
        np.frombuffer(nodes, np.int64)[first].astype(np.int32),
        np.frombuffer(partners, np.int64)[first].astype(np.int32),
        np.frombuffer(steps_done, np.int64)[first].astype(np.int32),
        np.frombuffer(requests)[first].astype(np.float32),
        np.frombuffer(starts)[first].astype(np.float32),
    )
