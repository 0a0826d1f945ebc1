"""Per-node facts of a graph built on the host, derived once from its tables in O(E) NumPy passes
per round (no loop over nodes or edges, no dense [N, N] matrix): symmetry, degrees, the diagonal
and the least and largest row and column sums of every W(t).

Each fact has a general path (one ``np.bincount`` or one CSR-to-CSC conversion per round) and a
shortcut where the round's structure makes it exact in fewer passes: canonical edges (sorted by
receiver, then sender, no edge twice; what ``from_edges`` stores) count in-degrees by searching
the sorted receivers, and a round whose slot table is full shifts or bit flips
(:func:`jaxgossip.topology.layout.slot_transpose_check`) compares itself with its transpose by
rolls and reversals, another regular round of at most 8 edges per row by gathers along its rows
(:func:`jaxgossip.topology.layout.regular_transpose_check`). Every shortcut gives the general
path's result bit for bit. Host-side, not jittable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxgossip.topology.edges import bincount, is_canonical, transpose_check
from jaxgossip.topology.layout import (
    FlipTerms,
    ShiftTerms,
    regular_rows,
    regular_transpose_check,
    self_places,
    slot_transpose_check,
)

__all__ = ["HostFacts", "host_facts", "self_weights", "count_at", "regular_sums"]


class HostFacts(NamedTuple):
    """What a host graph derives from its tables besides the layout (:func:`host_facts`).

    The per-node tables are read-only; where every node of every round shares one value (a
    regular graph's degrees) they are that column broadcast to [T, N], which takes no memory."""

    symmetric: bool
    out_degree: np.ndarray  # [T, N] int64
    in_degree: np.ndarray  # [T, N] int64
    self_weights: np.ndarray  # [T, N] float64
    row_sum_range: np.ndarray  # [T, 2] float64: the least and the largest row sum of W(t)
    col_sum_range: np.ndarray  # [T, 2] float64: the least and the largest column sum of W(t)


class _PerNode:
    """A [T, N] table filled round by round, each round either one value for every node or an
    [N] array; :meth:`table` broadcasts a column when every round was one value, so a regular
    graph's table costs no [T, N] memory."""

    def __init__(self, period: int, n: int, dtype):
        self.values = np.zeros((period, 1), dtype=dtype)
        self.shape, self.full = (period, n), None

    def set(self, t: int, row) -> None:
        if self.full is None and np.ndim(row) == 0:
            self.values[t] = row
            return
        if self.full is None:
            self.full = np.empty(self.shape, dtype=self.values.dtype)
            self.full[:t] = self.values[:t]
        self.full[t] = row

    def table(self) -> np.ndarray:
        if self.full is not None:
            self.full.flags.writeable = False
            return self.full
        return np.broadcast_to(self.values, self.shape)


def _uniform(column: np.ndarray):
    """``column[0] + 0.0`` if every entry of ``column`` [N] float plus 0.0 reads alike (so a
    broadcast of it is bit for bit ``column + 0.0``), else ``column + 0.0``."""
    first = column[0] + 0.0
    if column.size and bool(np.all(column == first)) and first == first:
        return np.float64(first)
    return np.add(column, 0.0, dtype=np.float64)


def host_facts(
    senders: np.ndarray,
    receivers: np.ndarray,
    weights: np.ndarray,
    num_nodes: int,
    neighbors: np.ndarray | None = None,
    slot_weights: np.ndarray | None = None,
    moves: Sequence[Any] | None = None,
    regular: Sequence[Any] = (),
    atol: float = 1e-6,
) -> HostFacts:
    """The facts of tables ``senders, receivers, weights [T, E]``.

    ``symmetric``: every W(t) equals its transpose to ``atol``; degrees count the real edges
    (weight != 0, not a self-loop) per node; ``self_weights`` sums the self-loops in edge order
    (``0.0 + w_1 + ...``); the ranges of the row and column sums are for the stochasticity checks
    (to a tolerance, so their order of summation is free). One [N] buffer per sum serves every
    round: no [T, N] table of sums is kept.

    Args:
      senders, receivers, weights: [T, E] host tables (weight-0 edges are padding).
      num_nodes: N.
      neighbors, slot_weights: the slot table ``[T, N, K]``, or None.
      moves: per round, its :func:`jaxgossip.topology.moves.round_moves` (or None); with the slot
        table it lets a canonical round compare itself with its transpose by rolls and reversals.
      regular: per round, its :func:`jaxgossip.topology.layout.regular_rows` if already known.
      atol: tolerance of the symmetry of the weights.
    """
    n = num_nodes
    period = senders.shape[0]
    out_degree, in_degree = _PerNode(period, n, np.int64), _PerNode(period, n, np.int64)
    diagonal = _PerNode(period, n, np.float64)
    row_sums, col_sums = np.empty(n), np.empty(n)
    row_range, col_range = np.empty((period, 2)), np.empty((period, 2))
    symmetric = True
    for t in range(period):
        s, r, w = senders[t], receivers[t], weights[t]
        regular_t = regular[t] if regular else None
        if regular_t is not None and regular_t.senders.size == s.size:
            # The regular rows hold every edge: all are live, no mask to form.
            ls, lr, lw = s, r, w
        else:
            live = w != 0
            ls, lr, lw = (s, r, w) if live.all() else (s[live], r[live], w[live])
            if not regular:
                regular_t = regular_rows(ls, lr, lw, n)
        canonical = regular_t is not None or is_canonical(ls, lr)
        move = moves[t] if moves is not None and canonical else None
        check = None
        if move is not None:
            check = slot_transpose_check(neighbors[t], slot_weights[t], move, atol)
        elif regular_t is not None:
            check = regular_transpose_check(regular_t, atol)
        if check is None:
            check = transpose_check(s, r, w, n, atol=atol)
        symmetric = symmetric and all(check)
        if regular_t is not None:
            # K live edges into every node, one of them its self-loop.
            in_degree.set(t, regular_t.width - 1)
            regular_sums(regular_t.weights, out=row_sums)
            if neighbors is not None:
                diagonal.set(t, _uniform(slot_weights[t, :, 0]))  # slot 0 holds the self-loop
            else:
                own = np.arange(n) * regular_t.width + self_places(regular_t)
                diagonal.set(t, _uniform(regular_t.weights.reshape(-1).take(own)))
        else:
            own = ls == lr
            if canonical:
                # Sorted receivers: row i is the slice between the first edges into i and into i + 1.
                counts = np.diff(np.searchsorted(lr, np.arange(n + 1)))
                in_degree.set(t, counts - bincount(lr[own], n))
            else:
                in_degree.set(t, count_at(lr, ~own, n))
            row_sums[...] = bincount(lr, n, lw)
            diagonal.set(t, _round_self_weights(lr[own], lw[own], n))
        if isinstance(move, ShiftTerms):
            # Full distinct shifts: each column is a permutation, so every node sends once per
            # column that is not the self-loop's.
            out_degree.set(t, int(np.count_nonzero(move.shifts)))
        elif canonical and check.pattern:
            # No edge twice and a symmetric pattern: a node sends to those it receives from.
            out_degree.set(t, in_degree.values[t, 0] if in_degree.full is None else in_degree.full[t])
        else:
            out_degree.set(t, count_at(ls, ls != lr, n))
        if regular_t is None or not _pair_column_sums(slot_weights, t, move, regular_t.width, col_sums):
            col_sums[...] = bincount(ls, n, lw)
        row_range[t] = np.min(row_sums), np.max(row_sums)
        col_range[t] = np.min(col_sums), np.max(col_sums)
    return HostFacts(symmetric, out_degree.table(), in_degree.table(), diagonal.table(), row_range, col_range)


def regular_sums(rows: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``rows.sum(axis=1)`` of ``rows [N, K]`` into ``out [N]``, bit for bit. Rows of at most two
    entries, none of them zero, add one column to the other (two terms sum alike in any order;
    NumPy's reduction of short rows costs a pass per row); wider rows take ``np.sum``."""
    if rows.shape[1] > 2 or rows.dtype != out.dtype:
        out[...] = np.sum(rows, axis=1)
        return out
    np.copyto(out, rows[:, 0])
    if rows.shape[1] == 2:
        out += rows[:, 1]
    return out


def _pair_column_sums(slot_weights, t: int, move, width: int, out: np.ndarray) -> bool:
    """Writes the column sums of round t into ``out`` when its rows are a self-loop and one
    partner along one shift or one bit flip (K = 2): node j sends ``w_self[j]`` and the partner
    weight of the node it feeds, ``w_1[j - c]`` or ``w_1[j XOR m]``. Two terms add alike in any
    order, so this equals ``np.bincount`` bit for bit. False (nothing written) otherwise."""
    if width != 2 or slot_weights is None or slot_weights.dtype != np.float64:
        return False
    own, other = slot_weights[t, :, 0], slot_weights[t, :, 1]
    n = own.shape[0]
    if isinstance(move, ShiftTerms) and int(move.shifts[0]) == 0:
        c = int(move.shifts[1])
        # Node j feeds node j - c (mod N): other rolled forward by c.
        np.add(own[c:], other[: n - c], out=out[c:])
        np.add(own[:c], other[n - c :], out=out[:c])
        return True
    if isinstance(move, FlipTerms) and len(move.masks) == 1:
        m = move.masks[0]
        # Node j feeds node j XOR m: one axis of the [N / 2m, 2, m] view reversed.
        mirrored = other.reshape(n // (2 * m), 2, m)[:, ::-1]
        np.add(own.reshape(mirrored.shape), mirrored, out=out.reshape(mirrored.shape))
        return True
    return False


def count_at(endpoint: np.ndarray, keep: np.ndarray, n: int) -> np.ndarray:
    """[N] int64: how many of the kept edges have each node as ``endpoint``."""
    return bincount(endpoint if keep.all() else endpoint[keep], n)


def _round_self_weights(r: np.ndarray, w: np.ndarray, n: int) -> np.ndarray:
    """[N] float64: one round's self-loops ``r, w`` (weight != 0) summed per node in edge order.
    Loops into distinct nodes are written, not summed: ``0.0 + w`` is ``w + 0.0``."""
    if r.size < 2 or bool(np.all(r[1:] > r[:-1])):
        out = np.zeros(n)
        out[r] = w.astype(np.float64) + 0.0
        return out
    return np.bincount(r, weights=w, minlength=n).astype(np.float64)


def self_weights(senders: np.ndarray, receivers: np.ndarray, weights: np.ndarray, n: int) -> np.ndarray:
    """[T, N] float64: the diagonal of every W(t) of host tables ``[T, E]`` (self-loops summed in
    edge order)."""
    out = np.empty((senders.shape[0], n))
    for t, (s, r, w) in enumerate(zip(senders, receivers, weights)):
        own = (s == r) & (w != 0)
        out[t] = _round_self_weights(r[own], w[own], n)
    return out
