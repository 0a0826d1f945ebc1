"""Edge-list tools of the graph builders, in O(E) NumPy array operations (no loop over nodes or
edges, no dense [N, N] matrix), so that graphs of millions of nodes build in seconds.

A round's edges are *canonical* when their codes ``receiver * N + sender`` increase strictly: the
edges sorted by receiver, then sender, each (receiver, sender) pair once. That is the order
:func:`jaxgossip.topology.constructors.from_edges` stores, and the structured families emit their
edges in it directly (:func:`circulant_round`, :func:`sorted_rows`), so that no sort of E items is
needed on their build path. Host-side NumPy, not jittable.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import scipy.sparse
import scipy.sparse.csgraph

# Up to this many offsets a circulant round is written column by column, wider ones by rows.
_NARROW = 8
# Edges per block of a pass whose temporaries should stay in cache.
_EDGE_BLOCK = 1 << 16

__all__ = [
    "Round",
    "edge_codes",
    "is_canonical",
    "bincount",
    "all_nonzero",
    "merge_round",
    "circulant_round",
    "Circulant",
    "sorted_rows",
    "SortedRows",
    "XorRows",
    "transpose_check",
    "TransposeCheck",
    "count_components",
]


class Round(NamedTuple):
    """One round's edges, canonical: ``senders, receivers`` [E] int, ``weights`` [E] float64."""

    senders: np.ndarray
    receivers: np.ndarray
    weights: np.ndarray


def edge_codes(senders: np.ndarray, receivers: np.ndarray, n: int) -> np.ndarray:
    """[E] int64 codes ``receiver * N + sender``: the canonical order sorts by them."""
    return receivers.astype(np.int64) * n + senders


def is_canonical(senders: np.ndarray, receivers: np.ndarray) -> bool:
    """Whether the edges are canonical: sorted by receiver, then sender, no edge twice (their codes
    increase strictly). O(E) passes over the index arrays, without forming the int64 codes, a block
    of edges at a time (each block overlapping the next by one edge): the temporaries stay in cache
    instead of taking E fresh entries each."""
    for lo in range(0, max(senders.size - 1, 0), _EDGE_BLOCK):
        hi = min(senders.size, lo + _EDGE_BLOCK + 1)
        r, s = receivers[lo:hi], senders[lo:hi]
        step = r[1:] > r[:-1]
        step |= (r[1:] == r[:-1]) & (s[1:] > s[:-1])
        if not step.all():
            return False
    return True


def all_nonzero(values: np.ndarray) -> bool:
    """``bool(np.all(values != 0))``, a block of entries at a time: no [E] mask."""
    return all(
        np.count_nonzero(values[lo : lo + _EDGE_BLOCK]) == values[lo : lo + _EDGE_BLOCK].size
        for lo in range(0, values.size, _EDGE_BLOCK)
    )


def bincount(index: np.ndarray, n: int, weights: np.ndarray | None = None) -> np.ndarray:
    """``np.bincount(index, weights, minlength=n)`` bit for bit ([N] int64, or float64 with
    weights), a block of entries at a time by ``np.add.at``: both add in the order of the input,
    one value at a time from 0, and the blocks keep NumPy's index and weight conversions in cache
    instead of taking E fresh entries each."""
    out = np.zeros(n, dtype=np.int64 if weights is None else np.float64)
    for lo in range(0, index.size, _EDGE_BLOCK):
        hi = lo + _EDGE_BLOCK
        np.add.at(out, index[lo:hi], 1 if weights is None else weights[lo:hi])
    return out


def merge_round(senders, receivers, weights, n: int) -> Round:
    """The canonical form of one round: edges sorted by (receiver, sender), duplicates summed in
    the order given (``0.0 + w_1 + w_2 + ...``, as ``np.add.at`` sums them).

    Canonical input is returned as it is, after one O(E) check (the weights as float64, plus
    ``0.0`` so that a ``-0.0`` weight reads ``0.0`` exactly as a sum would give it); other input
    without repeated edges is sorted by scipy's CSR conversion (a counting sort by receiver, then
    each row); input with repeated edges is sorted once by ``np.unique`` and summed in order.

    Args:
      senders, receivers: [E] int node ids in 0..N-1; weights: [E] float.
      n: N.
    """
    s, r, w = (np.asarray(a).ravel() for a in (senders, receivers, weights))
    if is_canonical(s, r):
        return Round(s, r, np.add(w, 0.0, dtype=np.float64))  # one pass, one new array
    # A counting sort by receiver and a sort within each row (scipy, O(E) plus the rows' sorts);
    # exact when no edge repeats: every weight then stands alone.
    # (The conversion to CSR makes new arrays, so the input is not copied first.)
    matrix = scipy.sparse.csr_matrix((w.astype(np.float64, copy=False), (r, s)), shape=(n, n))
    if matrix.nnz == s.size:
        matrix.sort_indices()
        receivers = np.repeat(np.arange(n, dtype=matrix.indices.dtype), np.diff(matrix.indptr))
        return Round(matrix.indices, receivers, np.add(matrix.data, 0.0, out=matrix.data))
    uniq, inv = np.unique(edge_codes(s, r, n), return_inverse=True)
    # bincount adds in the order of the input, one double at a time: the sums np.add.at gives.
    summed = np.bincount(inv.ravel(), weights=w.astype(np.float64), minlength=uniq.size)
    return Round(uniq % n, uniq // n, summed)


class Circulant(NamedTuple):
    """A circulant round not yet written out (:func:`circulant_round` of ``n``, these offsets and
    weights): :func:`jaxgossip.topology.constructors.from_edges` has it write itself into its
    tables, without a round of fresh arrays."""

    offsets: Any  # [M] int in-offsets (0 is the self-loop)
    weights: Any  # [M] float, or one float for all

    def num_edges(self, n: int) -> int:
        """N K: K the distinct offsets mod N."""
        return n * np.unique(np.asarray(self.offsets, dtype=np.int64) % n).size

    def write(self, n: int, out: tuple) -> Round:
        """The round written into the first N K entries of ``out = (senders, receivers, weights)``."""
        return circulant_round(n, self.offsets, self.weights, out=out)


def circulant_round(n: int, offsets, weights, out: tuple | None = None) -> Round:
    """A circulant round, canonical: receiver i takes ``weights[m]`` from node ``(i + offsets[m])
    mod N``; offsets equal mod N are one edge whose weights are summed in the order given.

    Row i of the canonical order is the sorted in-offsets ``c_1 < ... < c_K`` rotated so that the
    senders that wrap past N - 1 come first: ``(i + c) mod N`` is ``i + c - N`` (below i) for
    ``c >= N - i`` and ``i + c`` otherwise. O(N K) work, no sort of the N K edges.

    Args:
      n: N.
      offsets: [M] int in-offsets (0 is the self-loop; negative values count back).
      weights: [M] float, or one float for all.
      out: optional ``(senders, receivers, weights)`` 1-D arrays of at least N K entries (index
        arrays of one integer type): the round is written into their first N K entries and the
        returned Round views them.
    """
    c = np.asarray(offsets, dtype=np.int64) % n
    w = np.broadcast_to(np.asarray(weights, dtype=np.float64), c.shape)
    uniq, inv = np.unique(c, return_inverse=True)
    per_offset = np.bincount(inv, weights=w, minlength=uniq.size)
    k = uniq.size
    if out is None:
        index = np.int32 if 2 * n < 2**31 else np.int64
        senders, weights_out = np.empty((n, k), dtype=index), np.empty((n, k))
        receivers = np.repeat(np.arange(n, dtype=index), k)
    else:
        index = out[0].dtype.type
        senders, weights_out = out[0][: n * k].reshape(n, k), out[2][: n * k].reshape(n, k)
        receivers = out[1][: n * k]
        receivers.reshape(n, k)[...] = np.arange(n, dtype=index)[:, None]
    # The rotation (how many offsets do not wrap) is constant between the nodes n - c where an
    # offset c starts to wrap: K + 1 blocks of rows, each one broadcast add, no gather.
    bounds = np.unique(np.concatenate([[0, n], n - uniq[uniq > 0]]))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        unwrapped = int(np.searchsorted(uniq, n - lo))  # offsets c < N - i for every i in the block
        order = np.concatenate([np.arange(unwrapped, k), np.arange(unwrapped)])
        add = uniq[order] - n * (np.arange(k) < k - unwrapped)  # wrapped ones come back by N
        if k <= _NARROW:
            # Column by column: NumPy's inner loop then runs over the nodes, not over k entries.
            nodes = np.arange(lo, hi, dtype=index)
            for j in range(k):
                np.add(nodes, index(add[j]), out=senders[lo:hi, j])
                weights_out[lo:hi, j] = per_offset[order[j]]
        else:
            senders[lo:hi] = np.arange(lo, hi, dtype=index)[:, None] + add.astype(index)[None, :]
            weights_out[lo:hi] = per_offset[order][None, :]
    return Round(senders.reshape(-1), receivers, weights_out.reshape(-1))


def sorted_rows(n: int, table: np.ndarray, weight: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges of the in-neighbour table ``table [N, K]`` (receiver i takes ``weight`` from each
    ``table[i, k]``), each row sorted: canonical unless a row repeats a sender, which
    :func:`merge_round` then merges (equal weights, so the order of the sum does not matter)."""
    rows = np.sort(table, axis=1)
    nodes = np.arange(n, dtype=rows.dtype)
    return rows.ravel(), np.repeat(nodes, table.shape[1]), np.full(rows.size, weight)


class SortedRows(NamedTuple):
    """:func:`sorted_rows` not yet written out: from_edges has it write itself into its tables
    (each row of ``table`` copied and sorted in place), without a round of fresh arrays; a row
    that repeats a sender is merged there."""

    table: np.ndarray  # [N, K] in-neighbours
    weight: float

    def num_edges(self, n: int) -> int:
        return self.table.size

    def write(self, n: int, out: tuple) -> Round:
        """The round written into the first N K entries of ``out = (senders, receivers, weights)``."""
        k = self.table.shape[1]
        senders, receivers, weights = (row[: n * k] for row in out)
        rows = senders.reshape(n, k)
        for lo in range(0, n, _EDGE_BLOCK):
            # A block of rows at a time: copied, then sorted while in cache.
            block = rows[lo : lo + _EDGE_BLOCK]
            block[...] = self.table[lo : lo + _EDGE_BLOCK]
            block.sort(axis=1)
        receivers.reshape(n, k)[...] = np.arange(n, dtype=receivers.dtype)[:, None]
        weights[...] = self.weight
        return Round(senders, receivers, weights)


class XorRows(NamedTuple):
    """The in-neighbour rows ``i XOR masks`` (receiver i takes ``weight`` from each), each row
    sorted, written by from_edges into its tables a block of rows at a time: the edges of
    ``sorted_rows(n, nodes[:, None] ^ masks, weight)`` without an [N, K] table of their own (a
    hypercube: masks 0 and the powers of two below N)."""

    masks: np.ndarray  # [K] int, distinct, each below N (a power of two)
    weight: float

    def num_edges(self, n: int) -> int:
        return n * len(self.masks)

    def write(self, n: int, out: tuple) -> Round:
        """The round written into the first N K entries of ``out = (senders, receivers, weights)``."""
        k = len(self.masks)
        senders, receivers, weights = (row[: n * k] for row in out)
        rows = senders.reshape(n, k)
        masks = np.asarray(self.masks).astype(rows.dtype)[None, :]
        for lo in range(0, n, _EDGE_BLOCK):
            block = rows[lo : lo + _EDGE_BLOCK]
            np.bitwise_xor(np.arange(lo, lo + block.shape[0], dtype=rows.dtype)[:, None], masks, out=block)
            block.sort(axis=1)
        receivers.reshape(n, k)[...] = np.arange(n, dtype=receivers.dtype)[:, None]
        weights[...] = self.weight
        return Round(senders, receivers, weights)


class TransposeCheck(NamedTuple):
    """Whether a round's weighted pattern equals its transpose (:func:`transpose_check`)."""

    pattern: bool  # the (receiver, sender) pairs with a non-zero weight are symmetric
    weights: bool  # and the weights per pair agree with their transposes (to atol 1e-6)


def transpose_check(senders, receivers, weights, n: int, atol: float = 1e-6) -> TransposeCheck:
    """Compares a round's matrix with its transpose in O(E) (a CSR-to-CSC conversion, no sort).

    Only the edges of non-zero weight count; duplicate edges are summed first. Self-loops compare
    with themselves, so including them changes nothing.
    """
    keep = weights != 0
    if keep.all():
        s, r, w = senders, receivers, np.asarray(weights, dtype=np.float64)
    else:
        s, r, w = senders[keep], receivers[keep], np.asarray(weights[keep], dtype=np.float64)
    if is_canonical(s, r):
        # Pairs (i, j), (j, i) cancel in a sum of an odd function of i - j (exactly, in wrapping
        # integer arithmetic), so a non-zero sum of cubes proves asymmetry in a few passes (a
        # directed circulant); a zero sum proves nothing and the full check follows.
        wide = np.int32 if n < 2**30 else np.int64
        if _cube_sum(s, r, wide) != 0:
            return TransposeCheck(False, False)
        index = np.int32 if s.size < 2**31 and n < 2**31 else np.int64
        indptr = np.zeros(n + 1, dtype=index)
        np.cumsum(bincount(r, n), out=indptr[1:])
        matrix = scipy.sparse.csr_matrix((w, s.astype(index, copy=False), indptr), shape=(n, n))
    else:
        matrix = scipy.sparse.csr_matrix((w, (r, s)), shape=(n, n))
        matrix.sum_duplicates()
    transposed = matrix.tocsc()  # column j's rows ascending: the CSR of the transpose
    same = np.array_equal(transposed.indptr, matrix.indptr) and np.array_equal(transposed.indices, matrix.indices)
    if not same:
        return TransposeCheck(False, False)
    close = np.array_equal(transposed.data, matrix.data) or np.allclose(transposed.data, matrix.data, atol=atol)
    return TransposeCheck(True, bool(close))


def _cube_sum(s: np.ndarray, r: np.ndarray, wide) -> int:
    """``sum (r - s)^3`` in ``wide``'s wrapping arithmetic (as a Python int modulo its range), a
    block of edges at a time: wrapping sums add alike in any grouping, so this is the sum of
    the whole arrays without E fresh entries per temporary."""
    total = 0
    for lo in range(0, s.size, _EDGE_BLOCK):
        gap = r[lo : lo + _EDGE_BLOCK].astype(wide)
        gap -= s[lo : lo + _EDGE_BLOCK].astype(wide)
        total += int(np.sum(gap * gap * gap, dtype=wide))
    return total % (1 << (8 * np.dtype(wide).itemsize))


def count_components(senders, receivers, n: int, strong: bool) -> int:
    """Connected components of the graph with edges ``sender -> receiver`` (strongly connected
    ones for ``strong``), by ``scipy.sparse.csgraph`` on the edge list."""
    graph = scipy.sparse.csr_matrix((np.ones(senders.size, dtype=np.int32), (receivers, senders)), shape=(n, n))
    count, _ = scipy.sparse.csgraph.connected_components(
        graph, directed=strong, connection="strong" if strong else "weak"
    )
    return int(count)
