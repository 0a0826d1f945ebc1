"""Layout policy of a graph's tables: the in-neighbour slot table and the kernel choice (the
rounds' shifts and bit flips: :mod:`jaxgossip.topology.moves`).

A :class:`~jaxgossip.topology.Topology` stores its mixing matrices in the layout chosen here, and
:mod:`jaxgossip.ops.mixing` runs one kernel per layout. The choice is measured on XLA:CPU
(``experiments/bench_mixing.py``): summing K per-slot gathers reaches 0.86x the bandwidth of a
plain copy at K = 3 and 0.65x at K = 9, ``segment_sum`` over an edge list about 0.22x, and a dense
``W @ x`` is 6x faster than slots for a complete graph (N = 64). Host-side NumPy, not jittable.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxgossip.topology.edges import TransposeCheck, all_nonzero, bincount, is_canonical
from jaxgossip.topology.moves import ROW_BLOCK, FlipTerms, ShiftTerms

__all__ = [
    "KERNELS",
    "slot_table",
    "slot_layout",
    "SlotLayout",
    "slot_edges",
    "choose_kernel",
    "regular_rows",
    "self_places",
    "RegularRound",
    "slot_transpose_check",
    "regular_transpose_check",
    "hub_split",
    "HubSplit",
    "MAX_GATHER_SLOTS",
]

KERNELS = ("auto", "slots", "dense", "segment")
# Up to this many columns a table is written column by column (NumPy's inner loop then runs over
# the nodes, not over a row of a few entries); wider tables by broadcast rows.
_NARROW = 8
# Bounded-degree graphs up to this many in-neighbour slots (self included) use the slot kernel;
# measured on XLA:CPU (experiments/bench_mixing.py): 0.86x copy bandwidth at K=3, 0.65x at K=9.
_MAX_SLOTS = 16
# Edges per block of a pass whose temporaries should stay in cache.
_EDGE_BLOCK = 1 << 16
# Above this edge density a dense matmul beats gathers (6x at N=64, K=64 on XLA:CPU).
_DENSE_FRACTION = 0.25


def slot_table(senders: np.ndarray, receivers: np.ndarray, weights: np.ndarray, num_nodes: int):
    """In-neighbour slot table of an edge list: ``(neighbors [T, N, K] int32, weights [T, N, K])``.

    ``W_t @ x == sum_k weights[t, :, k, None] * x[neighbors[t, :, k]]``. K is the largest in-degree
    (self included) over all rounds; unused slots point at the node itself with weight 0. Slot 0
    always holds the node itself (weight 0 when it has no self-loop), so the kernel reads it as
    ``x`` without a gather. Host-side NumPy, not jittable.

    Args:
      senders, receivers: [T, E] int, weights: [T, E] float; weight-0 edges are padding.
      num_nodes: N.
    """
    table = slot_layout(senders, receivers, weights, num_nodes)
    return table.neighbors, table.weights


class SlotLayout(NamedTuple):
    """The slot table of a graph (:func:`slot_layout`); the tables are None when it was too large."""

    neighbors: np.ndarray | None  # [T, N, K] int32
    weights: np.ndarray | None  # [T, N, K]
    width: int  # K
    regular: tuple = ()  # per round, its RegularRound (regular_rows) or None


def slot_layout(
    senders: np.ndarray, receivers: np.ndarray, weights: np.ndarray, num_nodes: int, max_entries: int | None = None
) -> SlotLayout:
    """:func:`slot_table` with its width K, in O(E) for canonical edges (sorted by receiver, then
    sender; what ``from_edges`` stores); other edges take one sort.

    Args:
      senders, receivers, weights, num_nodes: as for :func:`slot_table`.
      max_entries: if ``T N K`` exceeds it, the tables are left out (None): a hub's in-degree makes
        them ``O(N^2)`` although the graph has O(N) edges (a star), and only the slot kernel needs
        them. None: always built.
    """
    n, period = num_nodes, senders.shape[0]
    rounds = []
    for s, r, w in zip(senders, receivers, weights):
        if not all_nonzero(w):
            live = w != 0
            s, r, w = s[live], r[live], w[live]
        regular = regular_rows(s, r, w, n)
        rounds.append(_slot_order(s, r, w, n) if regular is None else regular)
    k = max([1] + [order.width for order in rounds])
    if max_entries is not None and period * n * k > max_entries:
        return SlotLayout(None, None, k, tuple(o if isinstance(o, RegularRound) else None for o in rounds))
    if all(isinstance(order, RegularRound) and order.width == k for order in rounds):
        # Every slot of every round holds an edge: nothing to pre-fill.
        nbr = np.empty((period, n, k), dtype=np.int32)
        slot_w = np.empty((period, n, k), dtype=weights.dtype)
    else:
        nbr = np.tile(np.arange(n, dtype=np.int32)[None, :, None], (period, 1, k))
        slot_w = np.zeros((period, n, k), dtype=weights.dtype)
    for t, order in enumerate(rounds):
        if isinstance(order, RegularRound) and _circulant_slots(order, n, nbr[t, :, : order.width], slot_w[t]):
            continue
        if isinstance(order, RegularRound) and order.width <= _NARROW:
            # Row i in sender order is its offset order rotated by the count of senders below i:
            # slot j takes entry (j + below) mod K of its row: one flat take per slot column,
            # a block of rows at a time (the index arrays stay in cache), straight into the table.
            width, below = order.width, self_places(order)
            flat_senders, flat_weights = order.senders.reshape(-1), order.weights.reshape(-1)
            for lo, hi in _blocks(0, n):
                starts = np.arange(lo * width, hi * width, width)
                for j in range(width):
                    pick = below[lo:hi] + j
                    pick -= width * (pick >= width)
                    pick += starts
                    flat_senders.take(pick, out=nbr[t, lo:hi, j], mode="clip")  # pick lies in range
                    flat_weights.take(pick, out=slot_w[t, lo:hi, j], mode="clip")
        elif isinstance(order, RegularRound):
            # As above, for wide rows by a gather; a block of rows at a time, so that the index
            # arrays stay in cache.
            width, below = order.width, self_places(order)
            for lo in range(0, n, ROW_BLOCK):
                hi = min(n, lo + ROW_BLOCK)
                slot = np.arange(width)[None, :] + below[lo:hi, None]
                slot -= width * (slot >= width)
                nbr[t, lo:hi, :width] = np.take_along_axis(order.senders[lo:hi], slot, axis=1)
                slot_w[t, lo:hi, :width] = np.take_along_axis(order.weights[lo:hi], slot, axis=1)
        else:
            nbr[t, order.receivers, order.position] = order.senders
            slot_w[t, order.receivers, order.position] = order.weights
    return SlotLayout(nbr, slot_w, k, tuple(o if isinstance(o, RegularRound) else None for o in rounds))


class RegularRound(NamedTuple):
    """A canonical round with the same number of live edges into every node, self-loops included."""

    senders: np.ndarray  # [N, K] each row ascending
    weights: np.ndarray  # [N, K]

    @property
    def width(self) -> int:
        return int(self.senders.shape[1])


def regular_rows(s: np.ndarray, r: np.ndarray, w: np.ndarray, n: int) -> RegularRound | None:
    """The round as rows ``[N, K]`` if its live edges are canonical (sorted by receiver, then
    sender, no duplicate) with K edges into every node, its self-loop among them; else None.
    A few O(E) passes, no sort: in canonical order the rows are regular when each row's first and
    last receiver is its node, and a row holds its self-loop at most once, so N self-loops are
    one per row."""
    if s.size == 0 or s.size % n or not is_canonical(s, r):
        return None
    k = s.size // n
    nodes = np.arange(n, dtype=r.dtype)
    if not (np.array_equal(r[::k], nodes) and np.array_equal(r[k - 1 :: k], nodes)):
        return None
    # A block of edges at a time: no [E] mask.
    own = sum(
        int(np.count_nonzero(s[lo : lo + _EDGE_BLOCK] == r[lo : lo + _EDGE_BLOCK]))
        for lo in range(0, s.size, _EDGE_BLOCK)
    )
    return RegularRound(s.reshape(n, k), w.reshape(n, k)) if own == n else None


def self_places(order: RegularRound) -> np.ndarray:
    """[N] int64: the place of row i's self-loop in a regular round (:func:`regular_rows`), the
    number of its senders below i. Found when a round needs it, a block of rows at a time: a
    graph's rounds do not hold [N] each."""
    rows = order.senders
    n, k = rows.shape
    below = np.empty(n, dtype=np.int64)
    for lo, hi in _blocks(0, n):
        own = np.flatnonzero(rows[lo:hi] == np.arange(lo, hi, dtype=rows.dtype)[:, None])
        np.subtract(own, k * np.arange(hi - lo), out=below[lo:hi])
    return below


def _circulant_slots(order: RegularRound, n: int, out_nbr: np.ndarray, out_w: np.ndarray) -> bool:
    """Writes the slot table ``[N, K]`` of a regular round that is circulant with one weight per
    offset into the first K columns of ``out_nbr, out_w`` and returns True; False (nothing
    written) otherwise. Row 0 lists the offsets ``c`` ascending (self first) and their weights;
    the round is that circulant when every block of rows between two wrap points ``N - c`` is the
    broadcast sum of its nodes and the rotated offsets (as
    :func:`jaxgossip.topology.edges.circulant_round` writes them). Then slot k of node i is
    ``(i + c_k) mod N`` at weight ``w_k``: broadcasts, no gather."""
    rows, weights = order.senders, order.weights
    k = order.width
    c = rows[0].astype(np.int64)
    w0 = weights[0]
    bounds = np.unique(np.concatenate([[0, n], n - c[c > 0]]))
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        unwrapped = int(np.searchsorted(c, n - lo))
        order_k = np.concatenate([np.arange(unwrapped, k), np.arange(unwrapped)])
        add = c[order_k] - n * (np.arange(k) < k - unwrapped)
        nodes = np.arange(lo, hi, dtype=rows.dtype)
        if k <= _NARROW:
            same = all(
                np.array_equal(rows[lo:hi, j], nodes + rows.dtype.type(add[j]))
                and bool(np.all(weights[lo:hi, j] == w0[order_k[j]]))
                for j in range(k)
            )
        else:
            # A block of rows at a time: the broadcast sums stay in cache.
            shift, expect = add.astype(rows.dtype)[None, :], w0[order_k][None, :]
            same = all(
                np.array_equal(rows[a:b], np.arange(a, b, dtype=rows.dtype)[:, None] + shift)
                and bool(np.all(weights[a:b] == expect))
                for a, b in _blocks(lo, hi)
            )
        if not same:
            return False
    # Written in place, a column or a block of rows at a time: no [N, K] table of its own.
    nodes = np.arange(n, dtype=np.int32)
    if k <= _NARROW:
        for j in range(k):
            np.add(nodes, np.int32(c[j]), out=out_nbr[:, j])
            out_nbr[n - int(c[j]) :, j] -= np.int32(n)  # (i + c) mod N: nodes from N - c on wrap
    else:
        for a, b in _blocks(0, n):
            block = out_nbr[a:b]
            np.add(nodes[a:b, None], c.astype(np.int32)[None, :], out=block)
            block -= np.int32(n) * (block >= n)
    out_w[:, :k] = w0[None, :]
    return True


def _blocks(lo: int, hi: int):
    """Consecutive ranges ``(a, b)`` of at most ROW_BLOCK rows covering ``[lo, hi)``."""
    return [(a, min(hi, a + ROW_BLOCK)) for a in range(lo, hi, ROW_BLOCK)]


class _SlotOrder(NamedTuple):
    """Where each live edge of a round sits in the slot table."""

    senders: np.ndarray  # [E']
    receivers: np.ndarray  # [E']
    weights: np.ndarray  # [E']
    position: np.ndarray  # [E'] the slot of the edge in its receiver's row
    width: int  # the row length the round needs (its largest in-degree, self slot included)
    edge: np.ndarray | None  # [E'] the index of the edge among the live edges given; None: in order


def _slot_order(s: np.ndarray, r: np.ndarray, w: np.ndarray, n: int) -> _SlotOrder:
    """Slot positions of one round's live edges: per receiver, the self slot first, then by offset
    ``(s - r) mod N`` (so that each slot column of a circulant graph is a pure shift; mix uses
    ``jnp.roll`` for it).

    For edges in canonical order (sorted by receiver, then sender, no duplicate; what
    ``from_edges`` stores) the offset order of a row is a rotation of its sender order: the senders
    ``s >= r`` (offsets ``s - r``, the self-loop first) before the senders ``s < r`` (offsets
    ``s - r + N``). That is O(E) without a sort; other input is sorted by a three-key lexsort.
    """
    if r.size == 0:
        return _SlotOrder(s, r, w, np.zeros(0, dtype=np.int64), 1, np.zeros(0, dtype=np.int64))
    has_self = np.zeros(n, dtype=bool)
    if not is_canonical(s, r):
        edge = np.lexsort(((s.astype(np.int64) - r) % n, s != r, r))
        s, r, w = s[edge], r[edge], w[edge]
        counts = bincount(r, n)
        first = np.cumsum(counts) - counts
        has_self[r[s == r]] = True
        position = np.arange(r.size) - first[r] + (~has_self[r]).astype(np.int64)
    else:
        edge = None  # the edges keep their order
        counts = bincount(r, n)
        has_self[r[s == r]] = True
        wrap = s < r  # senders that come after the wrap
        # Rank in the row, less the wrapped senders of the row, plus the row's length for a wrapped
        # one; in place, in int32 where it fits (the slot of an edge is below K).
        index = np.int32 if r.size < 2**31 else np.int64
        position = np.arange(r.size, dtype=index)
        position -= (np.cumsum(counts) - counts).astype(index)[r]
        position -= bincount(r[wrap], n).astype(index)[r]
        np.add(position, counts.astype(index)[r], out=position, where=wrap)
        position += ~has_self[r]  # nodes without a self-loop keep slot 0 at weight 0
    return _SlotOrder(s, r, w, position, int((counts + ~has_self).max()), edge)


def slot_edges(senders: np.ndarray, receivers: np.ndarray, weights: np.ndarray, num_nodes: int, width: int):
    """[T, N, K] int32: the edge (index into round t's edge list) behind slot k of node i, in O(E)
    for canonical edges. Slots without an edge (padding, and the weight-0 self slot of a node
    without a self-loop) point at the node's self-loop edge if it has one, else at edge 0: their
    weight is 0 whatever that edge does.

    Args:
      senders, receivers, weights, num_nodes: as for :func:`slot_table`.
      width: K, the width of the graph's slot table.
    """
    n, period = num_nodes, senders.shape[0]
    out = np.zeros((period, n, width), dtype=np.int32)
    for t in range(period):
        live = np.flatnonzero(weights[t] != 0)
        s, r, w = senders[t][live], receivers[t][live], weights[t][live]
        own = s == r
        out[t, r[own]] = live[own][:, None]
        regular = regular_rows(s, r, w, n)
        if regular is not None:
            slot = np.arange(regular.width)[None, :] + self_places(regular)[:, None]
            slot -= regular.width * (slot >= regular.width)
            out[t, :, : regular.width] = np.take_along_axis(live.reshape(n, regular.width), slot, axis=1)
        else:
            order = _slot_order(s, r, w, n)
            out[t, order.receivers, order.position] = live if order.edge is None else live[order.edge]
    return out


def choose_kernel(num_nodes: int, max_edges: int, max_slots: int, gather_free: bool = False) -> str:
    """The measured kernel choice for ``kernel="auto"``.

    Args:
      num_nodes: N.
      max_edges: the most weight != 0 edges (self-loops included) of any round.
      max_slots: K of the slot table.
      gather_free: whether every slot column moves the node axis without a gather
        (:func:`gather_free`: shifts of a circulant graph, bit flips of a hypercube), so that the
        slot kernel reads x K times in one fused loop whatever K.
    """
    density = max_edges / num_nodes**2
    # Measured (experiments/bench_mixing.py): dense wins for complete graphs at every N, slots
    # win for bounded degree; beyond 16 slots a moderately dense graph also prefers the matmul.
    if density > 0.5 or (max_slots > _MAX_SLOTS and density > _DENSE_FRACTION):
        return "dense"
    if max_slots <= _MAX_SLOTS or gather_free:
        return "slots"
    # The segment kernel of host tables mixes a round of a few hubs by hub_split (a star).
    return "segment"


# Up to this many rows above _MAX_SLOTS in-neighbours a host graph's segment layout mixes by
# hub_split: one reduction over each hub's in-neighbours plus the slot kernel for the other rows.
_MAX_HUBS = 16


class HubSplit(NamedTuple):
    """One round as a few dense rows (the hubs) plus a narrow slot table for every other row
    (:func:`hub_split`): ``(W x)_h = hub_weights[h] . x[hub_senders[h]]`` for each hub h, and
    ``(W x)_i = sum_k weights[i, k] x[neighbors[i, k]]`` for the other nodes i."""

    hubs: tuple[int, ...]  # H node ids, ascending
    hub_senders: tuple[np.ndarray, ...]  # per hub [M_h] int32, its in-neighbours in edge order
    hub_weights: tuple[np.ndarray, ...]  # per hub [M_h], their weights
    neighbors: np.ndarray  # [N, K] int32: the slot table of the other rows (hub rows: weight 0)
    weights: np.ndarray  # [N, K]


def hub_split(
    senders: np.ndarray, receivers: np.ndarray, weights: np.ndarray, num_nodes: int, max_hubs: int = _MAX_HUBS
) -> HubSplit | None:
    """One round ``senders, receivers, weights [E]`` as hubs plus a narrow slot table, or None.

    The hubs are the rows with more than 16 live in-edges (self included); the round splits when
    there are 1 to ``max_hubs`` of them and every other row fits 16 slots (a star: one hub, K = 2).
    A segment layout's round then mixes in about two reads and one write of x (one reduction per
    hub, the slot kernel for the rest) instead of a gather of E rows and a scatter. O(E) NumPy.
    """
    live = weights != 0
    s, r, w = (senders, receivers, weights) if live.all() else (senders[live], receivers[live], weights[live])
    hubs = np.flatnonzero(bincount(r, num_nodes) > _MAX_SLOTS)
    if hubs.size == 0 or hubs.size > max_hubs:
        return None
    is_hub = np.zeros(num_nodes, dtype=bool)
    is_hub[hubs] = True
    at_hub = is_hub[r]
    rest = slot_layout(*(a[~at_hub][None] for a in (s, r, w)), num_nodes)
    if rest.width > _MAX_SLOTS:
        return None
    hs, hr, hw = s[at_hub], r[at_hub], w[at_hub]
    rows = [np.flatnonzero(hr == h) for h in hubs]
    return HubSplit(
        tuple(int(h) for h in hubs),
        tuple(hs[row].astype(np.int32) for row in rows),
        tuple(hw[row] for row in rows),
        rest.neighbors[0],
        rest.weights[0],
    )


# Above this many slots the slot kernel of a host graph moves x only by shifts and bit flips
# (choose_kernel puts a graph there only when it is gather_free).
MAX_GATHER_SLOTS = _MAX_SLOTS


def slot_transpose_check(
    neighbors: np.ndarray, weights: np.ndarray, moves: ShiftTerms | FlipTerms, atol: float = 1e-6
) -> TransposeCheck:
    """:func:`jaxgossip.topology.edges.transpose_check` of one round from its slot table
    ``[N, K]`` and its :func:`round_moves`, in O(N K) elementwise passes. The round's live edges
    must be canonical (no edge twice), as those ``from_edges`` stores are. Entry ``W[i, i + c]``
    meets its transpose ``W[i + c, i]`` in the column of shift ``-c``, rolled by c; entry
    ``W[i, i XOR m]`` meets ``W[i XOR m, i]`` in the flip's own weights, reversed."""
    n = neighbors.shape[0]
    if isinstance(moves, ShiftTerms):
        column = {int(c): k for k, c in enumerate(moves.shifts)}
        if any((n - c) % n not in column for c in column):
            return TransposeCheck(False, False)
        close = True
        for c, k in column.items():
            other, own = weights[:, column[(n - c) % n]], weights[:, k]
            # other rolled back by c, compared in its two slices before any copy is made.
            same = np.array_equal(other[c:], own[: n - c]) and np.array_equal(other[:c], own[n - c :])
            close = close and (same or bool(np.allclose(np.roll(other, -c), own, atol=atol)))
        return TransposeCheck(True, close)
    pattern, close = True, True
    for mask, w in zip(moves.masks, moves.weights):
        mirrored = w.reshape(n // (2 * mask), 2, mask)[:, ::-1].ravel()  # w[i XOR mask]
        pattern = pattern and bool(np.array_equal(mirrored != 0, w != 0))
        close = close and (np.array_equal(mirrored, w) or bool(np.allclose(mirrored, w, atol=atol)))
    return TransposeCheck(pattern, pattern and close)


def regular_transpose_check(order: RegularRound, atol: float = 1e-6) -> TransposeCheck | None:
    """:func:`jaxgossip.topology.edges.transpose_check` of a regular round (:func:`regular_rows`)
    of at most 8 edges per row, by K gathers of whole rows (no CSR or CSC copy of the round);
    None for wider rows. Entry ``W[i, j]`` in column k of row i meets its transpose
    ``W[j, i]`` in the column of row j that holds i (rows are canonical: at most one); the weights
    compare as ``np.allclose(W[j, i], W[i, j], atol)`` does, entry by entry."""
    rows, weights = order.senders, order.weights
    n, k = rows.shape
    if k > _NARROW:
        return None
    close = True
    # A block of rows at a time: the gathered rows and the masks stay in cache, no [N, K] copy.
    for lo, hi in _blocks(0, n):
        nodes = np.arange(lo, hi, dtype=rows.dtype)
        found, hit, flat = np.empty(hi - lo, bool), np.empty(hi - lo, bool), np.empty(hi - lo, np.int64)
        for j in range(k):
            partner = rows[lo:hi, j]
            theirs = rows.take(partner, axis=0)  # [B, K]: row rows[i, j] for every i of the block
            np.multiply(partner, k, out=flat, dtype=np.int64)
            found[...] = False
            for p in range(k):
                # Column by column over the nodes (NumPy reduces a row of K entries slowly).
                np.equal(theirs[:, p], nodes, out=hit)
                found |= hit
                if p:
                    np.add(flat, p, out=flat, where=hit)
            if not found.all():
                return TransposeCheck(False, False)
            back, own = weights.reshape(-1).take(flat), weights[lo:hi, j]
            close = close and (np.array_equal(back, own) or bool(np.allclose(back, own, atol=atol)))
    return TransposeCheck(True, close)
