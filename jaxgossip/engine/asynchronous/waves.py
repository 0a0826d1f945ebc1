"""Host-side planning of an asynchronous run (:mod:`jaxgossip.engine.asynchronous`): which stale version
or which delayed message every event reads, and the packing of events into waves.

Everything here is NumPy on the host, computed from the schedule (event times and nodes), which
depends only on the time model and the key, never on model values. The compiled run then scans
over waves with fixed-width tables.

**Events.** Event e (0-based, in time order; ties: lower node, then lower step) is node
``node[e]`` finishing its local step ``step[e]`` at ``time[e]``. Event e belongs to round
``e // N``.

**Arrivals** (:func:`uplink_arrivals`). Every event of node j sends one message to each
out-neighbour r. On independent links (``parallel``) the message arrives ``d_jr`` after the event
(float32 sum; ``d_jr = latency + bits / bandwidth``, the bandwidth bounded by r's downlink when the
links have one: ``min(b_jr, b^down_r)``; messages do not queue on a downlink). On a shared uplink
(``serial``) the messages of an event leave one after another in ascending receiver order, ``d_jr``
being the cumulative transfer up to r's message, and they queue behind the previous event's: they
start at ``max(t, free_j)``, ``free_j`` the arrival of j's previous last message, so the message
arrives at ``max(t, free_j) + d_jr`` (float32). Messages on one link arrive in the order they were
sent. Queued messages get older: when the uplink is slower than the node computes, the queue and the
staleness grow with the run.

**Stale versions** (:func:`read_versions`). Version 0 of node j is its initial model, known to
everyone at time 0; version m >= 1 is its model after its m-th event, sent to every out-neighbour
i when it is produced (at ``T_j(m)``, the time of that event) and arriving at ``A_ji(m)``
(:func:`uplink_arrivals`). Node i's event e at time t reads from j the newest version that has
arrived (``A_ji(m) <= t``: a message arriving at the event's time counts) and was produced by an
earlier event (``< e``: a float32 tie can make ``A_ji(m) == T_j(m)``). The staleness of a read
is j's current version minus the version read; ``S = max staleness + 1`` versions per node suffice.

**Delayed messages** (:func:`deliveries`). A push-sum message sent by event a (node j) to
out-neighbour i arrives at ``A`` (:func:`uplink_arrivals`) and is added by i's first event at or after A
that comes after a: i's event number ``s_b = max(#{i-events before a}, #{i-events with time < A})``
(none in the run: still in flight at the end). The message is what j sent, kept in j's ring of
sent messages until it is added; the ring needs as many slots as j sends versions while one
waits, plus one.

**Waves** (:func:`pack_waves`). Within each round, every event gets the earliest level that keeps
each dependency: *strict* (a later level) for an event reading what another writes (same node,
a version or a message it produced, AD-PSGD's two nodes), *weak* (the same level or later) for
an event that overwrites a ring slot an earlier event reads: in a wave all reads happen before
all writes. Every event writes only its own node's rows, so no two writes of a wave meet (the
scatters are deterministic). Events of one level are a wave (split in event order when wider
than ``max_width``). Events that do not depend on each other commute, so the waves compute
exactly the sequential simulation; rounds never share a wave, so the metrics at round boundaries
are those after exactly r N events.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "Plan",
    "event_lists",
    "uplink_arrivals",
    "read_versions",
    "deliveries",
    "DueReads",
    "due_reads",
    "ad_psgd_levels",
    "read_levels",
    "pack_waves",
]


class Plan(NamedTuple):
    """The waves of a run (M waves, padded width W).

    Attributes:
      events: [M, W] int32 event indices in event order, -1 in padded slots.
      round_end: [M] bool, the wave that ends a round (its last one).
      boundary: [R] int64, the index of the wave that ends each round.
    """

    events: np.ndarray
    round_end: np.ndarray
    boundary: np.ndarray


def event_lists(node: np.ndarray, n: int) -> list[np.ndarray]:
    """Per node the ascending indices of its events (``[N]`` arrays)."""
    order = np.argsort(node, kind="stable")
    counts = np.bincount(node, minlength=n)
    return np.split(order, np.cumsum(counts)[:-1])


def uplink_arrivals(
    time: np.ndarray, node: np.ndarray, delays: dict[tuple[int, int], float], serial: bool, n: int
) -> dict[tuple[int, int], np.ndarray]:
    """(sender j, receiver r) -> ``[#events of j]`` float32 arrival times at r of the messages of
    j's events, in event order (module docstring, "Arrivals").

    Args:
      time: [E] float32 event times; node: [E] int32 event nodes.
      delays: (sender, receiver) -> seconds ``d_jr`` of the real edges (``serial``: cumulative
        over the sender's messages in ascending receiver order).
      serial: the messages share the sender's uplink and queue behind its earlier events'.
    """
    lists = event_lists(node, n)
    out_of: dict[int, list[tuple[int, np.float32]]] = {}
    for (j, r), d in sorted(delays.items()):
        out_of.setdefault(j, []).append((r, np.float32(d)))
    arrivals: dict[tuple[int, int], np.ndarray] = {}
    for j, outs in out_of.items():
        sent = time[lists[j]]
        if not serial:
            for r, d in outs:
                arrivals[(j, r)] = (sent + d).astype(np.float32)
            continue
        table = np.empty((sent.size, len(outs)), np.float32)
        free = np.float32(-np.inf)
        for m, t in enumerate(sent):
            start = max(t, free)
            for k, (_, d) in enumerate(outs):
                table[m, k] = np.float32(start + d)
            free = table[m].max()
        for k, (r, _) in enumerate(outs):
            arrivals[(j, r)] = table[:, k]
    return arrivals


def read_versions(
    time: np.ndarray,
    node: np.ndarray,
    in_table: np.ndarray,
    in_real: np.ndarray,
    arrivals: dict[tuple[int, int], np.ndarray],
    n: int,
) -> tuple[np.ndarray, np.ndarray, int]:
    """``(version [E, K], producer [E, K], S)``: the version of in-neighbour ``in_table[i, k]``
    that each event of node i reads (module docstring), the event that produced it (-1: version
    0, or a padded slot), and the versions a node must keep.

    Args:
      time: [E] float32 event times; node: [E] int32 event nodes.
      in_table: [N, K] int32 in-neighbours per receiver (padded with the node itself).
      in_real: [N, K] bool, the real slots.
      arrivals: :func:`uplink_arrivals`.
    """
    e_count = time.shape[0]
    lists = event_lists(node, n)
    steps = np.empty(e_count, np.int64)
    for events in lists:
        steps[events] = np.arange(events.size)
    k_count = in_table.shape[1]
    version = np.repeat(steps[:, None], k_count, axis=1)  # padded slots read the node's own model
    producer = np.full((e_count, k_count), -1, np.int64)
    staleness = 0
    for i in range(n):
        mine = lists[i]
        for k in range(k_count):
            if not in_real[i, k]:
                continue
            j = int(in_table[i, k])
            theirs = lists[j]
            arrival = arrivals[(j, i)]
            arrived = np.searchsorted(arrival, time[mine], side="right")
            before = np.searchsorted(theirs, mine, side="left")
            m = np.minimum(arrived, before)
            version[mine, k] = m
            if theirs.size:
                producer[mine, k] = np.where(m > 0, theirs[np.maximum(m - 1, 0)], -1)
            if mine.size:
                staleness = max(staleness, int(np.max(before - m)))
    return version, producer, staleness + 1


def deliveries(
    time: np.ndarray,
    node: np.ndarray,
    out_table: np.ndarray,
    out_real: np.ndarray,
    arrivals: dict[tuple[int, int], np.ndarray],
    n: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(sender_event [P], slot [P], absorber [P])``: every message of the run (event
    ``sender_event`` to out-neighbour ``out_table[node, slot]``) and the receiver's event that
    adds it (module docstring), -1 when it is still in flight at the end.

    Args:
      out_table: [N, K] int32 out-neighbours per sender (padded with the node itself).
      out_real: [N, K] bool, the real slots.
      arrivals: :func:`uplink_arrivals`.
    """
    lists = event_lists(node, n)
    senders, slots, absorbers = [], [], []
    for j in range(n):
        mine = lists[j]
        for k in np.flatnonzero(out_real[j]):
            theirs = lists[int(out_table[j, k])]
            arrival = arrivals[(j, int(out_table[j, k]))]
            s_a = np.searchsorted(theirs, mine, side="left")
            s_b = np.maximum(s_a, np.searchsorted(time[theirs], arrival, side="left"))
            absorber = np.full(mine.size, -1, np.int64)
            if theirs.size:
                absorber = np.where(s_b < theirs.size, theirs[np.minimum(s_b, theirs.size - 1)], -1)
            senders.append(mine)
            slots.append(np.full(mine.size, k, np.int64))
            absorbers.append(absorber)
    if not senders:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    return np.concatenate(senders), np.concatenate(slots), np.concatenate(absorbers)


class DueReads(NamedTuple):
    """What each event adds (M = the most messages one event adds; padded slots read the node
    itself with weight 0).

    Attributes:
      node: [E, M] int32 the sender of each message added; real: [E, M] bool.
      producer: [E, M] the sending event (-1: padding).
      version: [E, M] int64 the sender's version of the message (its k-th sent message: k).
      weight: [E, M] float32 the message's push weight.
      slots: S, the sender's ring length that keeps every message until it is added (or the end).
      pending: [P'] indices (into the messages) still in flight at the end.
    """

    node: np.ndarray
    real: np.ndarray
    producer: np.ndarray
    version: np.ndarray
    weight: np.ndarray
    slots: int
    pending: np.ndarray


def due_reads(node: np.ndarray, sender_event: np.ndarray, absorber: np.ndarray, weight: np.ndarray, n: int) -> DueReads:
    """Per event the messages (:func:`deliveries`, with their push ``weight`` [P]) it adds, in
    send order, and the ring length S: a message's staleness is the number of messages its
    sender sent after it until it is added (or until the end, for one still in flight)."""
    e_count = node.shape[0]
    lists = event_lists(node, n)
    steps = np.empty(e_count, np.int64)
    for events in lists:
        steps[events] = np.arange(events.size)
    sender = node[sender_event]
    version = steps[sender_event] + 1
    now = np.array(
        [np.searchsorted(lists[j], b) if b >= 0 else lists[j].size for j, b in zip(sender, absorber)], np.int64
    )
    slots = int(np.max(now - version, initial=0)) + 1
    due: list[list[int]] = [[] for _ in range(e_count)]
    for m in np.argsort(sender_event, kind="stable"):
        if absorber[m] >= 0:
            due[absorber[m]].append(int(m))
    width = max(1, max(len(d) for d in due))
    out = DueReads(
        np.repeat(node[:, None], width, axis=1).astype(np.int32),
        np.zeros((e_count, width), bool),
        np.full((e_count, width), -1, np.int64),
        np.zeros((e_count, width), np.int64),
        np.zeros((e_count, width), np.float32),
        slots,
        np.flatnonzero(absorber < 0),
    )
    for e, msgs in enumerate(due):
        c = len(msgs)
        out.node[e, :c], out.real[e, :c], out.producer[e, :c] = sender[msgs], True, sender_event[msgs]
        out.version[e, :c], out.weight[e, :c] = version[msgs], weight[msgs]
    return out


def ad_psgd_levels(node: np.ndarray, partner: np.ndarray, n: int) -> np.ndarray:
    """[E] levels of AD-PSGD events: an event depends strictly on every earlier event of the round
    that touches either of its two nodes."""
    level = np.empty(node.shape[0], np.int64)
    last = np.full(n, -1, np.int64)
    base = top = 0
    for e in range(node.shape[0]):
        if e % n == 0:  # a new round: rounds never share a level
            base, last[:] = top, -1
        i, j = int(node[e]), int(partner[e])
        lvl = max(base, last[i] + 1, last[j] + 1)
        level[e] = last[i] = last[j] = lvl
        top = max(top, lvl + 1)
    return level


def read_levels(
    node: np.ndarray, read_node: np.ndarray, read_real: np.ndarray, producer: np.ndarray, n: int
) -> np.ndarray:
    """[E] levels of events that read other nodes' rings of versions (asynchronous gossip: the
    in-neighbours' models; asynchronous SGP: the senders' messages): strictly after the node's
    previous event and after the producers of what it reads; not before an earlier reader of the
    node's ring (its new version may overwrite the slot that reader reads).

    Args:
      read_node: [E, K] the node whose ring each read goes to; read_real: [E, K] the real reads.
      producer: [E, K] the event that wrote what is read (-1: an initial version or padding).
    """
    e_count = node.shape[0]
    level = np.empty(e_count, np.int64)
    last = np.full(n, -1, np.int64)
    readers = np.full(n, -1, np.int64)  # the highest level that read each node's ring
    base = top = 0
    for e in range(e_count):
        if e % n == 0:  # a new round: rounds never share a level
            base, last[:], readers[:] = top, -1, -1
        i = int(node[e])
        lvl = max(base, last[i] + 1, readers[i])
        for p in producer[e]:
            if p >= 0:
                lvl = max(lvl, level[p] + 1)
        level[e] = last[i] = lvl
        for j in read_node[e][read_real[e]]:
            readers[j] = max(readers[j], lvl)
        top = max(top, lvl + 1)
    return level


def pack_waves(level: np.ndarray, n: int, max_width: int | None = None) -> Plan:
    """The :class:`Plan` of events with these levels: one wave per level (levels of different
    rounds differ), split in event order into waves of at most ``max_width`` events (None: no
    limit; 1: one event per wave, the sequential simulation)."""
    e_count = level.shape[0]
    order = np.lexsort((np.arange(e_count), level))
    sorted_levels = level[order]
    starts = np.flatnonzero(np.r_[True, sorted_levels[1:] != sorted_levels[:-1]])
    groups = np.split(order, starts[1:])
    if max_width is not None:
        groups = [g[s : s + max_width] for g in groups for s in range(0, g.size, max_width)]
    width = max(g.size for g in groups)
    events = np.full((len(groups), width), -1, np.int32)
    for m, g in enumerate(groups):
        events[m, : g.size] = g
    rounds = np.array([g[0] // n for g in groups])
    round_end = np.r_[rounds[1:] != rounds[:-1], True]
    return Plan(events, round_end, np.flatnonzero(round_end))
