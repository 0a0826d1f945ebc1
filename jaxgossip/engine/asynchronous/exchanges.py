"""Priced pairwise exchanges (AD-PSGD with ``--time.exchange=priced``): the schedule of events when
an average takes its link time and keeps both nodes busy.

Host-side NumPy, like the rest of the plan (:mod:`~jaxgossip.engine.asynchronous.planning`); it
depends only on the step durations, the link delays and the key, never on model values.

**The rule.** Node i computes its k-th gradient for ``p_{k,i}`` seconds, from the end of its
previous exchange (0 first), and *requests* an exchange at the end, ``c = start + p_{k,i}``, with
the neighbour j it draws. The exchange is the model going to j and the average coming back
(Lian et al. 2018, Section 5: an active worker sends its model, the passive one averages and
replies), ``d_ij = (l_ij + B / b_ij) + (l_ji + B / b_ji)`` with B = 32 D bits (the reply priced on
the edge j -> i, or on i -> j when the graph has no such edge). A node takes part in one exchange
at a time (the paper's atomic averaging, with its cost): requests are served in the order they are
made (time, then node), each after every exchange already booked on either node, so the exchange
runs over ``[b, a]``, ``b = max(c, free_i, free_j)``, ``a = b + d_ij`` (float32), with ``free_x``
the end of the last exchange booked on node x. The average and i's step take effect at ``a``, the
*event*; i starts its next gradient at ``a``. The passive node j keeps computing while it serves
(its communication runs beside its computation, as in the paper's implementation) and receives
the average at ``a``. Events are in the order of ``(a, request)``: the exchanges of one node are
disjoint and in request order, so this is the order in which every node sees them. With zero
delays ``a = c`` and the schedule is the free one's (the events at the steps' ends).

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
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

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


def priced_exchanges(
    durations: np.ndarray,
    uniforms: Callable[[int], np.ndarray],
    table: np.ndarray,
    degree: np.ndarray,
    seconds: np.ndarray,
    num_events: int,
) -> PricedSchedule | None:
    """The first ``num_events`` (E) events (module docstring), or None when some node needs more
    than the K steps of ``durations`` (draw more and call again).

    Args:
      durations: [K, N] float32 seconds of every node's first K local steps.
      uniforms: ``block -> [E] float32`` uniforms of requests ``block E .. block E + E - 1``.
      table, degree: each node's out-neighbours (padded) and their count.
      seconds: [N, Dmax] float32 exchange seconds per neighbour slot (:func:`pair_seconds`).
    """
    steps, n = durations.shape
    free = np.zeros(n, np.float32)  # end of the last exchange booked on each node
    pending = [(durations[0, i], i) for i in range(n)]  # (request time, node): one per node
    heapq.heapify(pending)
    step = np.zeros(n, np.int64)
    blocks: dict[int, np.ndarray] = {}
    done: list[tuple] = []  # (a, q, node, partner, step, request, start)
    latest: list[tuple] = []  # max-heap of the E earliest events, (-a, -q)
    q = 0
    while pending:
        c, i = pending[0]
        if len(latest) == num_events and (c, q) >= (-latest[0][0], -latest[0][1]):
            break  # every later request ends after the E earliest events
        heapq.heappop(pending)
        block, index = divmod(q, num_events)
        if block not in blocks:
            blocks[block] = uniforms(block)
        slot = min(int(np.floor(blocks[block][index] * np.float32(degree[i]))), int(degree[i]) - 1)
        j = int(table[i, slot])
        start = max(c, free[i], free[j])
        end = np.float32(start + seconds[i, slot])
        free[i] = free[j] = end
        done.append((end, q, i, j, int(step[i]), c, start))
        heapq.heappush(latest, (-end, -q))
        if len(latest) > num_events:
            heapq.heappop(latest)
        step[i] += 1
        if step[i] >= steps:
            return None
        heapq.heappush(pending, (np.float32(end + durations[step[i], i]), i))
        q += 1
    done.sort(key=lambda ev: (ev[0], ev[1]))
    first = done[:num_events]
    cols = list(zip(*first))
    return PricedSchedule(
        np.array(cols[0], np.float32),
        np.array(cols[2], np.int32),
        np.array(cols[3], np.int32),
        np.array(cols[4], np.int32),
        np.array(cols[5], np.float32),
        np.array(cols[6], np.float32),
    )
