"""The moves of a slot table's rounds: slot columns that are shifts of the node axis (circulant
graphs) or bit flips (hypercubes), which the slot kernel of :mod:`jaxgossip.ops.mixing` runs as
rolls and axis reversals instead of gathers, and the per-round shift plans of circulant graphs.
Host-side NumPy, not jittable.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from jaxgossip.topology.edges import all_nonzero

__all__ = [
    "FlipTerms",
    "flip_terms",
    "ShiftTerms",
    "shift_terms",
    "round_moves",
    "gather_free",
    "circulant_shift",
    "circulant_shifts",
    "GroupRoll",
    "group_roll",
    "SlotGraph",
]

# Rows per block where a table is rearranged or checked row by row: index arrays of a block stay
# in cache (also the layout's blocks).
ROW_BLOCK = 1 << 14


class FlipTerms(NamedTuple):
    """One round of a graph whose in-neighbours are bit flips, ``(W x)_i = self[i] x_i +
    sum_b weights[b, i] x_{i XOR masks[b]}`` (:func:`flip_terms`)."""

    masks: tuple[int, ...]  # distinct powers of two, ascending
    # [B, N] float, 0 where row i has no neighbour i XOR mask; not to be written: it may view the
    # slot table, or broadcast one weight
    weights: np.ndarray


def flip_terms(neighbors: np.ndarray, weights: np.ndarray) -> FlipTerms | None:
    """Round ``neighbors, weights [N, K]`` of a slot table as bit flips, or None.

    It is one when N is a power of two and every live slot k >= 1 of node i holds ``i XOR 2^b``
    (a hypercube, and its subgraphs): then ``x_{i XOR 2^b}`` for all i is a reversal of one axis
    of x viewed as ``[N / 2^(b+1), 2, 2^b, ...]``, no gather. O(N K) NumPy.
    """
    n = neighbors.shape[0]
    if n & (n - 1) or neighbors.shape[1] < 2:
        return None
    single = _single_flip(neighbors, weights)
    if single is not None:
        return single
    # A first pass checks the pattern without a [bits, N] table: when every slot is live at one
    # weight and every row holds the same bits (a hypercube), the weights are that value
    # broadcast, which takes no memory; a second pass writes them otherwise.
    union, uniform = 0, True
    first = weights[0, 1] if neighbors.shape[1] > 1 else None
    for lo in range(0, n, ROW_BLOCK):
        m, w, every = _block_masks(neighbors, weights, lo, min(n, lo + ROW_BLOCK))
        if m is None:
            return None
        if m.size == 0:
            uniform = False
            continue
        union |= int(np.bitwise_or.reduce(m, axis=None))
        uniform = uniform and every and bool(np.all(w == first))
    if union == 0:
        return None
    present = [b for b in range(n.bit_length()) if (union >> b) & 1]
    masks = tuple(1 << b for b in present)
    # A row's neighbours are distinct, so K - 1 live bits per row and K - 1 bits in all mean
    # every row holds every bit.
    if uniform and len(present) == neighbors.shape[1] - 1:
        return FlipTerms(masks, np.broadcast_to(np.asarray(first), (len(present), n)))
    by_bit = np.zeros((len(present), n), dtype=weights.dtype)
    row_of_bit = np.zeros(max(n.bit_length(), 1), dtype=np.int64)
    row_of_bit[present] = np.arange(len(present))
    # Each (bit, node) is written once, as a node's neighbours differ.
    for lo in range(0, n, ROW_BLOCK):
        hi = min(n, lo + ROW_BLOCK)
        m, w, every = _block_masks(neighbors, weights, lo, hi)
        if m.size == 0:
            continue
        # The bit of a power of two is the exponent field of its float32 value (exact below 2^31).
        rows = row_of_bit[(m.astype(np.float32).view(np.int32) >> 23) - 127]
        nodes = np.arange(lo, hi)[:, None]
        if every:
            by_bit[rows, nodes] = w
        else:
            live = w != 0
            by_bit[rows, np.broadcast_to(nodes, live.shape)[live]] = w[live]
    return FlipTerms(masks, by_bit)


def _block_masks(neighbors: np.ndarray, weights: np.ndarray, lo: int, hi: int):
    """Rows ``lo:hi`` of a slot table as flips: ``(masks, weights [B, K - 1], every)`` with
    ``masks`` the live slots' ``i XOR neighbour`` (all of them ``[B, K - 1]`` when ``every`` slot
    is live, else flat), or ``(None, None, False)`` when one is not a power of two."""
    nodes = np.arange(lo, hi, dtype=neighbors.dtype)
    mask = neighbors[lo:hi, 1:] ^ nodes[:, None]
    w = weights[lo:hi, 1:]
    live = w != 0
    every = bool(live.all())
    m = mask if every else mask[live]
    if np.any(m <= 0) or np.any(m & (m - 1)):
        return None, None, False
    return m, w, every


def _single_flip(neighbors: np.ndarray, weights: np.ndarray) -> FlipTerms | None:
    """:func:`flip_terms` of a round ``[N, 2]`` (N a power of two) whose second slot is live
    everywhere and holds ``i XOR m`` for one m: one comparison of that column, mirrored along the
    flipped axis, with the node ids (no per-entry mask or bit). None when it is not one, to let
    the general path decide."""
    n = neighbors.shape[0]
    m = int(neighbors[0, 1])
    if neighbors.shape[1] != 2 or m <= 0 or m & (m - 1) or not bool(np.all(weights[:, 1] != 0)):
        return None
    shape = (n // (2 * m), 2, m)
    # column[i] == i XOR m for all i, i.e. column[i XOR m] == i: the column with its flipped axis reversed.
    if not np.array_equal(neighbors[:, 1].reshape(shape)[:, ::-1], np.arange(n, dtype=neighbors.dtype).reshape(shape)):
        return None
    return FlipTerms((m,), weights[:, 1][None])  # a view: the slot table is kept anyway


class ShiftTerms(NamedTuple):
    """One round of a slot table whose every slot column is a shift of the node axis:
    ``(W x)_i = sum_k weights[i, k] x_{(i + shifts[k]) mod N}`` (:func:`shift_terms`)."""

    shifts: np.ndarray  # [K] int64 in [0, N), distinct
    weights: np.ndarray  # [N, K]


def shift_terms(neighbors: np.ndarray, weights: np.ndarray) -> ShiftTerms | None:
    """Round ``neighbors, weights [N, K]`` as distinct shifts when every slot is live and each
    column is one shift ``(i + c_k) mod N``; else None. One pass per column, O(N K)."""
    n = neighbors.shape[0]
    if not all_nonzero(weights.reshape(-1)):
        return None
    nodes = np.arange(n, dtype=neighbors.dtype)
    shifts = np.empty(neighbors.shape[1], dtype=np.int64)
    for k in range(neighbors.shape[1]):
        # Column k is shift c = column[0] when it reads nodes c.. N-1, then 0.. c-1 (ids lie in [0, N)).
        column = neighbors[:, k]
        c = int(column[0])
        if not (np.array_equal(column[: n - c], nodes[c:]) and np.array_equal(column[n - c :], nodes[:c])):
            return None
        shifts[k] = c
    if np.unique(shifts).size != shifts.size:
        return None
    return ShiftTerms(shifts, weights)


def round_moves(neighbors: np.ndarray, weights: np.ndarray) -> ShiftTerms | FlipTerms | None:
    """Round ``neighbors, weights [N, K]`` of a slot table as full distinct shifts
    (:func:`shift_terms`) or else as bit flips (:func:`flip_terms`); None when it is neither."""
    shifts = shift_terms(neighbors, weights)
    return shifts if shifts is not None else flip_terms(neighbors, weights)


def gather_free(neighbors: np.ndarray, weights: np.ndarray, moves=None) -> bool:
    """Whether every round of a slot table ``[T, N, K]`` is circulant (each slot column one shift
    over its live nodes) or bit flips (:func:`flip_terms`): the rounds the slot kernel mixes with
    shifts and flips only. ``moves``: the rounds' :func:`round_moves` if already known."""
    n = neighbors.shape[1]
    nodes = np.arange(n, dtype=np.int64)[:, None]
    for t, (nbr, w) in enumerate(zip(neighbors, weights)):
        if (moves[t] if moves is not None else shift_terms(nbr, w)) is not None:
            continue
        live = w != 0
        offsets = nbr - nodes  # in (-N, N); the shift is this mod N
        offsets += n * (offsets < 0)
        first = offsets[np.argmax(live, axis=0), np.arange(nbr.shape[1])]  # each column's first live offset
        circulant = bool(np.all((offsets == first[None, :]) | ~live))
        if not circulant and flip_terms(nbr, w) is None:
            return False
    return True


def circulant_shift(column: np.ndarray) -> int | None:
    """c if ``column[i] == (i + c) mod N`` for all i, else None."""
    n = column.shape[0]
    c = int(column[0])
    return c if np.array_equal(column, (np.arange(n) + c) % n) else None


class GroupRoll(NamedTuple):
    """A slot column that rotates every group of G nodes spaced S apart: with x viewed as
    ``[N / (G S), G, S, ...]``, node ``(b, p, s)`` takes from ``(b, (p + step) mod G, s)``
    (:func:`group_roll`). A circulant shift c is ``G S = N``; a bit flip ``i XOR S`` is G = 2,
    step 1; the cliques of consecutive nodes of a Base-(k+1) round are ``G = k + 1``, S = 1."""

    stride: int  # S
    size: int  # G
    step: int  # in [0, G)


def group_roll(column: np.ndarray) -> GroupRoll | None:
    """Slot column ``[N]`` (node i takes from ``column[i]``) as a :class:`GroupRoll`, or None.

    Node 0 sits at place 0 of its group, so ``column[0] = step S``; the first node whose offset
    differs is the first to wrap, at offset ``(step - G) S``: their difference is ``G S`` and S
    their greatest common divisor (a rotation by ``step`` of G groups of stride S equals one by
    ``step / d`` of ``G / d`` groups of stride ``d S``). Then one O(N) comparison of the column
    with that rotation of the node ids decides. An identity column is ``GroupRoll(1, 1, 0)``."""
    n = column.shape[0]
    nodes = np.arange(n, dtype=column.dtype)
    ahead = int(column[0])
    offsets = column - nodes
    wrapped = offsets != ahead
    first = int(np.argmax(wrapped))
    if not wrapped[first]:
        return GroupRoll(1, 1, 0) if ahead == 0 else None
    back = int(offsets[first])
    if ahead <= 0 or back >= 0 or n % (ahead - back):
        return None
    stride = int(np.gcd(ahead, -back))
    size, step = (ahead - back) // stride, ahead // stride
    shape = (n // (size * stride), size, stride)
    grouped, ids = column.reshape(shape), nodes.reshape(shape)
    if np.array_equal(grouped[:, : size - step], ids[:, step:]) and np.array_equal(
        grouped[:, size - step :], ids[:, :step]
    ):
        return GroupRoll(stride, size, step)
    return None


class SlotGraph(Protocol):
    """What :func:`circulant_shifts` reads of a graph; a :class:`~jaxgossip.topology.Topology` has
    it all. Named here so that this module, on which the graph type is built, imports nothing of it."""

    @property
    def name(self) -> str: ...

    @property
    def num_nodes(self) -> int: ...

    @property
    def period(self) -> int: ...

    @property
    def slots(self) -> tuple[np.ndarray, np.ndarray]:
        """The in-neighbour slot table: neighbours and weights, each ``[T, N, K]``."""
        ...


def circulant_shifts(topology: SlotGraph) -> tuple[tuple[tuple[int, np.ndarray], ...], ...]:
    """Writes every round of a circulant schedule as weighted shifts of the node axis.

    Round t is ``((c_1, w_1), (c_2, w_2), ...)`` with distinct shifts ``c`` in ``[0, N)`` and
    per-node weights ``w`` (numpy [N] float64), such that

    .. math::  (W^{(t)} x)_i = \\sum_c w_c[i] \\, x_{(i + c) \\bmod N}.

    Built from ``Topology.slots``: each in-neighbour slot column must be a single shift over the
    nodes where its weight is non-zero (weight-0 padding may point anywhere). Slots with the same
    shift are merged; shifts keep slot order (self first), so the sum runs in ``mix``'s order.

    Raises:
      ValueError: some round of ``topology`` is not circulant in its node labelling (e.g. star,
        erdos_renyi, torus, hypercube with N >= 4).
    """
    nbr, slot_w = topology.slots
    n = topology.num_nodes
    nodes = np.arange(n)
    rounds = []
    for t in range(topology.period):
        terms: dict[int, np.ndarray] = {}
        for k in range(nbr.shape[2]):
            w = slot_w[t, :, k]
            live = w != 0
            if not live.any():
                continue
            offsets = (nbr[t, live, k].astype(np.int64) - nodes[live]) % n
            if np.any(offsets != offsets[0]):
                raise ValueError(
                    f"topology {topology.name} is not circulant: in round {t} the in-neighbour slot {k} takes "
                    f"from offsets {sorted(set(offsets.tolist()))[:6]} (need one offset c with neighbour "
                    "(i + c) mod N for every node i); mix_ppermute serves circulant graphs only (ring, "
                    "directed_ring, exponential, one_peer_exponential, complete): use mixing.mix on "
                    "inputs placed with shard_nodes instead"
                )
            c = int(offsets[0])
            terms[c] = terms.get(c, np.zeros(n)) + w
        rounds.append(tuple(terms.items()))
    return tuple(rounds)
