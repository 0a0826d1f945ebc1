"""The slot kernel of :mod:`jaxgossip.ops.mixing`: ``y = sum_k w[:, k] * x[nbr[:, k]]`` over the
K in-neighbour slots ``[T, N, K]`` of a graph, with the helpers every kernel shares (a round's
table, the accumulation dtype, per-node factors).

A slot column of host tables moves x without a gather where it can: a shift reads a slice of x
padded by its wrapped rows (a round of short shifts only, slices of x itself and a small copy of
the wrapped rows), a rotation of groups of nodes (:func:`jaxgossip.topology.moves.group_roll`)
rolls one axis of x, and beyond 16 slots a hypercube's bit flips reverse one axis (or, for rows of
at most 4 values, pick between two padded slices). A traced round (inside a scan) of host tables
rolls by the round's shift where a column is a shift in every round, switches between the static
rounds where every round is such moves (rows of at most 2 values), and reads uniform weight
columns as scalars.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxgossip.topology import Topology
from jaxgossip.topology.layout import MAX_GATHER_SLOTS
from jaxgossip.topology.moves import GroupRoll, circulant_shift, flip_terms, group_roll
from jaxgossip.types import Array

__all__ = ["mix_slots", "traced_plan", "TracedPlan", "round_table", "acc_dtype", "per_node"]


def round_table(array: Any, idx: Any, dtype=None) -> Any:
    """Round ``idx`` of a ``[T, ...]`` table: a NumPy slice when both are static, else traced."""
    if isinstance(array, np.ndarray) and isinstance(idx, int):
        return array[idx] if dtype is None else array[idx].astype(dtype)
    table = jnp.asarray(array, dtype)
    return table[idx]


def acc_dtype(dtype) -> Any:
    # Low-precision leaves accumulate in float32 so that mixing many neighbours does not drift.
    return jnp.promote_types(dtype, jnp.float32)


def per_node(v: Array, leaf: Array, cast: bool = False) -> Array:
    """``v`` with leading axes ``[N]`` (or ``[N, K]``) reshaped to broadcast against ``leaf``
    ``[N, ...]``: one trailing axis of size 1 per axis of the leaf after the node axis; with
    ``cast``, in the leaf's dtype (so that a product with the leaf stays in it)."""
    v = jnp.reshape(v, jnp.shape(v) + (1,) * (jnp.ndim(leaf) - 1))
    return v.astype(jnp.result_type(leaf)) if cast else v


def mix_slots(topology: Topology, leaf: Array, idx: Any, plan: TracedPlan | None = None) -> Array:
    """``plan``: :func:`traced_plan` of host tables mixed at a traced round, computed once per
    ``mix`` call for all leaves; None computes it here."""
    nbr, slot_w = topology.slots
    acc = acc_dtype(leaf.dtype)
    x = leaf.astype(acc)
    cast = np.float32 if acc == jnp.float32 else None
    if isinstance(nbr, np.ndarray) and isinstance(idx, int):
        w = slot_w[idx] if cast is None else slot_w[idx].astype(cast)
        return _slot_round(nbr[idx], w, x).astype(leaf.dtype)
    if isinstance(nbr, np.ndarray) and isinstance(slot_w, np.ndarray):
        plan = traced_plan(nbr, slot_w) if plan is None else plan
        if plan.branches and x.size <= _MAX_SWITCH_ROW * x.shape[0]:
            # Every round moves x by shifts and group rotations only (a Base-(k+1) round rotates
            # groups of a different stride each round): one static round per branch, no table
            # read, and the same program as the round mixed on its own. Only for narrow rows: the
            # branch's output is one more copy of x, which for wide rows costs more than the
            # tables' reads it saves (measured at N = 2^20: 3.2x faster at D = 1, 1.3x slower at
            # D = 64).
            rounds = [
                functools.partial(_slot_round, nbr[t], slot_w[t] if cast is None else slot_w[t].astype(cast))
                for t in range(nbr.shape[0])
            ]
            return lax.switch(idx, rounds, x).astype(leaf.dtype)
    w = round_table(slot_w, idx, cast)
    uniform = None if plan is None else plan.uniform
    out = _traced_weight(uniform, w, idx, 0, acc, x) * x  # slot 0 is the node itself
    for k in range(1, nbr.shape[-1]):
        if plan is not None and (shifts := plan.shifts[k]) is not None:
            # A traced round (inside a scan) of host tables whose slot column is a shift in every
            # round: roll by the round's shift, contiguous reads of x and no [N] index column read
            # per slot, instead of a gather. The same values, so the same bits.
            gathered = jnp.roll(x, -jnp.asarray(shifts)[idx], axis=0)
        else:
            gathered = x[round_table(nbr, idx)[:, k]]
        # Product first: XLA:CPU then fuses each step into one multiply-add the same way for host
        # and traced tables (single graph, stack member), so they agree bitwise.
        out = _traced_weight(uniform, w, idx, k, acc, x) * gathered + out
    return out.astype(leaf.dtype)


def _slot_round(nbr: np.ndarray, w: np.ndarray, x: Array) -> Array:
    """One round of host neighbours ``nbr [N, K]`` and weights ``w [N, K]`` (host, or traced for a
    drawn round) on x ``[N, ...]`` (accumulation dtype): ``y = sum_k w[:, k] * x[nbr[:, k]]``, each
    slot column moving x by a shift, a group rotation (:func:`jaxgossip.topology.moves.group_roll`)
    or, failing both, a gather."""
    n = x.shape[0]
    # Bit flips need the live slots, known for host weights only (a drawn round's are traced).
    flips = flip_terms(nbr, w) if isinstance(w, np.ndarray) and nbr.shape[-1] > MAX_GATHER_SLOTS else None
    columns = [w[:, 0]] + (list(flips.weights) if flips is not None else [w[:, k] for k in range(1, nbr.shape[-1])])
    weights = _weights(columns, x)
    out = weights[0] * x  # slot 0 is the node itself
    if flips is not None:
        # Beyond 16 slots a hypercube mixes by bit flips, one per bit, in one fused loop: the sum
        # runs over the bits instead of the slots. A flip is a reversal of one axis; for rows of
        # at most 4 values it is instead a choice per node between two contiguous slices of x
        # padded by its wrapped rows, which XLA:CPU vectorises (measured 11x faster at N = 2^20,
        # D = 1, the same values; a reversal is faster for wide rows, where the padded copy costs).
        flipped = _flip if x.size // max(n, 1) > 4 else _padded_flips(x, max(flips.masks))
        for mask, w_mask in zip(flips.masks, weights[1:]):
            out = w_mask * flipped(x, mask) + out
        return out
    shifts = {k: circulant_shift(nbr[:, k]) for k in range(1, nbr.shape[-1])}
    signed = {k: c - n * (c > n // 2) for k, c in shifts.items() if c is not None}
    if signed:
        # The shifted columns are slices of one copy of x padded at both ends by its wrapped rows:
        # contiguous reads that XLA:CPU vectorises in the fused sum, where a roll per column is a
        # concatenation per element (measured 2.5-10x slower at N = 2^20 for 20 shifts).
        below, above = max(0, -min(signed.values())), max(0, max(signed.values()))
        if len(signed) == nbr.shape[-1] - 1 and 0 < below + above <= n // 4:
            # Short shifts only (a ring): few rows wrap, so the rows in between read slices of x
            # itself and only the wrapped rows a small padded copy; no copy of x at all
            # (measured 2x faster at N = 2^20, D = 1; the same products in the same order).
            return _short_shifts(x, weights, [signed[k] for k in range(1, nbr.shape[-1])], below, above)
        padded = jnp.concatenate([x[n - below :], x, x[:above]], axis=0) if below or above else x
    for k in range(1, nbr.shape[-1]):
        if k in signed:
            gathered = lax.slice_in_dim(padded, below + signed[k], below + signed[k] + n, axis=0)
        elif (rotation := group_roll(nbr[:, k])) is not None:
            gathered = _rotate_groups(x, rotation)
        else:
            gathered = x[nbr[:, k]]
        out = weights[k] * gathered + out
    return out


def _short_shifts(x: Array, weights: list, shifts: list[int], below: int, above: int) -> Array:
    """``sum_k weights[k] * x[(i + shifts[k - 1]) mod N]`` (slot 0 the node itself) in three row
    ranges: ``[0, below)`` and ``[N - above, N)``, whose shifted rows wrap, from small copies of
    the rows they read, and the rows in between from slices of x; every row sums its terms in slot
    order."""
    n = x.shape[0]

    def rows(source: Array, start: int, lo: int, hi: int) -> Array:
        # Rows [lo, hi) of the round; source holds x[j] at j - start for the rows they read.
        def take(shift):
            return lax.slice_in_dim(source, lo + shift - start, hi + shift - start, axis=0)

        def weight(w):
            return w if jnp.ndim(w) == 0 else lax.slice_in_dim(w, lo, hi, axis=0)

        out = weight(weights[0]) * take(0)
        for w, shift in zip(weights[1:], shifts):
            out = weight(w) * take(shift) + out
        return out

    pieces = []
    if below:
        head = jnp.concatenate([x[n - below :], x[: below + above]], axis=0)  # x[-below, below + above)
        pieces.append(rows(head, -below, 0, below))
    pieces.append(rows(x, 0, below, n - above))
    if above:
        tail = jnp.concatenate([x[n - above - below :], x[:above]], axis=0)  # x[N - above - below, N + above)
        pieces.append(rows(tail, n - above - below, n - above, n))
    return jnp.concatenate(pieces, axis=0) if len(pieces) > 1 else pieces[0]


def _weights(columns: list[np.ndarray], x: Array) -> list[Array]:
    """Weight columns ``[N]`` as factors of x: a scalar for a host column of one weight (XLA would
    fold that constant into a broadcast scalar anyway), else per node."""
    return [
        jnp.asarray(c[0], x.dtype)
        if isinstance(c, np.ndarray) and c.size and c[0] == c[-1] and bool(np.all(c == c[0]))
        else per_node(jnp.asarray(c, x.dtype), x)
        for c in columns
    ]


def _traced_weight(uniform: np.ndarray | None, w: Any, idx: Any, k: int, acc: Any, x: Array) -> Array:
    """Slot k's weight at a traced round: the round's scalar where column k has one weight in every
    round (``uniform [T, K]``, NaN elsewhere), else the round's column."""
    if uniform is not None and not np.isnan(uniform[:, k]).any():
        return jnp.asarray(uniform[:, k], acc)[idx]
    return per_node(jnp.asarray(w[:, k], acc), x)


# Up to this many rounds, and this many values per node, a traced round of gather-free host
# tables switches between the static rounds (one compiled branch per round).
_MAX_BRANCHES = 64
_MAX_SWITCH_ROW = 2


class TracedPlan(NamedTuple):
    """What a traced round of host slot tables ``[T, N, K]`` can skip reading (:func:`traced_plan`)."""

    shifts: tuple  # per slot column k, its shift in every round ([T] int32), or None
    uniform: np.ndarray  # [T, K]: the weight of column k in round t when it is one for all nodes, else NaN
    # Every round moves x by shifts and group rotations only, some column is no shift in every
    # round (those roll by the round's shift), and T <= _MAX_BRANCHES.
    branches: bool


def traced_plan(nbr: np.ndarray, slot_w: np.ndarray) -> TracedPlan:
    period, _, width = nbr.shape
    shifts = (None,) + tuple(_round_shifts(nbr, k) for k in range(1, width))
    uniform = np.full((period, width), np.nan)
    for t in range(period):
        for k in range(width):
            column = slot_w[t, :, k]
            if bool(np.all(column == column[0])):
                uniform[t, k] = column[0]
    branches = (
        period <= _MAX_BRANCHES
        and any(s is None for s in shifts[1:])
        and all(
            circulant_shift(nbr[t, :, k]) is not None or group_roll(nbr[t, :, k]) is not None
            for t in range(period)
            for k in range(1, width)
        )
    )
    return TracedPlan(shifts, uniform, branches)


def _round_shifts(nbr: np.ndarray, k: int) -> np.ndarray | None:
    """``[T]`` int32: the shift ``c_t`` of slot column k in every round t (``nbr[t, i, k] = (i + c_t)
    mod N`` for all i), or None when some round's column is not a shift."""
    shifts = []
    for t in range(nbr.shape[0]):
        shift = circulant_shift(nbr[t, :, k])
        if shift is None:
            return None
        shifts.append(shift)
    return np.asarray(shifts, np.int32)


def _padded_flips(x: Array, largest: int):
    """``flip(x, mask)`` for masks up to ``largest``: ``x[i XOR mask]`` is ``x[i + mask]`` where bit
    ``mask`` of i is clear and ``x[i - mask]`` where it is set, two slices of one copy of x padded
    by ``largest`` wrapped rows at both ends (the wrapped rows are never chosen)."""
    n = x.shape[0]
    padded = jnp.concatenate([x[n - largest :], x, x[:largest]], axis=0)
    node = lax.broadcasted_iota(jnp.int32, x.shape, 0)

    def flipped(_, mask):
        up = lax.slice_in_dim(padded, largest + mask, largest + mask + n, axis=0)
        down = lax.slice_in_dim(padded, largest - mask, largest - mask + n, axis=0)
        return jnp.where((node & mask) == 0, up, down)

    return flipped


def _rotate_groups(x: Array, rotation: GroupRoll) -> Array:
    """``x`` with every group of ``rotation.size`` nodes spaced ``rotation.stride`` apart rotated by
    ``rotation.step``: a roll of one axis of x viewed as ``[N / (G S), G, S, ...]``, no gather."""
    n, size, stride = x.shape[0], rotation.size, rotation.stride
    if size == 2:
        return _flip(x, stride)  # a reversal: one op, where a roll is two slices and a concatenation
    blocks = jnp.reshape(x, (n // (size * stride), size, stride) + x.shape[1:])
    return jnp.reshape(jnp.roll(blocks, -rotation.step, axis=1), x.shape)


def _flip(x: Array, mask: int) -> Array:
    """``x[i XOR mask]`` for every node i (mask a power of two): reverses one axis of x viewed as
    ``[N / (2 mask), 2, mask, ...]``, a permutation without a gather."""
    n = x.shape[0]
    blocks = jnp.reshape(x, (n // (2 * mask), 2, mask) + x.shape[1:])
    return jnp.reshape(jnp.flip(blocks, axis=1), x.shape)
