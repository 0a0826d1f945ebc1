"""The shortcuts of a graph's construction against the general path, bit for bit: every family at
N = 8, 64 and 1024 (and base graphs of other N) rebuilt from its own edges by the slow reference
(tests/topology/_reference_builders.py), the facts from the slot table and the rounds' moves against
the facts from the edges alone and against the plain per-round sums, the one-flip recognition
against the general bit-flip pass, every bit-flip path against a loop over the slots, and the
hypercube's rows written by block against the sorted rows of its table."""

import _reference_builders as ref
import numpy as np
import pytest

import jaxgossip.topology as T
from jaxgossip.topology import edges, facts, layout, moves

FAMILIES = (
    "ring",
    "directed_ring",
    "torus",
    "hypercube",
    "exponential",
    "one_peer_exponential",
    "star",
    "chain",
    "binary_tree",
    "base:1",
    "base:2",
    "base:3",
    "d_equistatic",
    "u_equistatic",
    "d_equistatic:2",
    "u_equistatic:3",
)
SIZES = (8, 64, 1024)
# Base graphs of N other than a power of k + 1: factored schedules (N = 96 and k = 1: N_s = 32
# simple graphs of 3 nodes; N = 1000 and k = 3), a simple one (N = 997) and a smooth one.
BASE_SIZES = (("base:1", 96), ("base:3", 1000), ("base:1", 997), ("base:2", 96))


def _rounds(topo):
    return [(topo.senders[t], topo.receivers[t], topo.weights[t]) for t in range(topo.period)]


def _same_bits(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert got.tobytes() == want.tobytes(), what


@pytest.mark.parametrize("spec, n", [(spec, n) for spec in FAMILIES for n in SIZES] + list(BASE_SIZES))
def test_every_table_and_fact_equals_the_reference_build(spec, n):
    topo = T.make(spec, n)
    want = ref.from_edges(n, _rounds(topo), directed=topo.directed)
    for field in ("senders", "receivers", "weights"):
        _same_bits(getattr(topo, field), getattr(want, field), (topo.name, field))
    # A hub graph (a star) keeps no slot table of its own; ``slots`` makes the same one on demand.
    for got, field in zip(topo.slots, ("neighbors", "slot_weights")):
        _same_bits(got, getattr(want, field), (topo.name, field))
    assert topo.is_symmetric == want.symmetric
    np.testing.assert_array_equal(topo.out_degree, want.out_degree)
    np.testing.assert_array_equal(topo.in_degree, want.in_degree)
    _same_bits(topo.self_weights, want.self_weights, (topo.name, "self_weights"))
    mats = topo.matrices()
    assert topo.row_stochastic == bool(np.allclose(mats.sum(axis=2), 1.0, atol=1e-6))
    assert topo.column_stochastic == bool(np.allclose(mats.sum(axis=1), 1.0, atol=1e-6))


def _plain_sums(s, r, w, n):
    """Row and column sums of one round as the general path forms them: a regular round's rows
    summed by ``np.sum``, any other round's by ``np.bincount``; columns by ``np.bincount``."""
    live = w != 0
    s, r, w = s[live], r[live], w[live]
    regular = layout.regular_rows(s, r, w, n)
    rows = np.sum(regular.weights, axis=1) if regular is not None else np.bincount(r, weights=w, minlength=n)
    return rows, np.bincount(s, weights=w, minlength=n)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("spec", FAMILIES)
def test_facts_from_the_slot_table_equal_the_facts_from_the_edges(spec, n):
    topo = T.make(spec, n)
    s, r, w = topo.senders, topo.receivers, topo.weights
    slots = layout.slot_layout(s, r, w, n)
    round_moves = [moves.round_moves(a, b) for a, b in zip(slots.neighbors, slots.weights)]
    fast = facts.host_facts(s, r, w, n, slots.neighbors, slots.weights, round_moves, slots.regular)
    plain = facts.host_facts(s, r, w, n)
    assert fast.symmetric == plain.symmetric
    for field in ("out_degree", "in_degree", "self_weights", "row_sum_range", "col_sum_range"):
        _same_bits(np.asarray(getattr(fast, field)), np.asarray(getattr(plain, field)), (topo.name, field))
    for t in range(topo.period):
        rows, cols = _plain_sums(s[t], r[t], w[t], n)
        _same_bits(fast.row_sum_range[t], np.array([rows.min(), rows.max()]), (topo.name, t, "row_sums"))
        _same_bits(fast.col_sum_range[t], np.array([cols.min(), cols.max()]), (topo.name, t, "col_sums"))


@pytest.mark.parametrize("spec", ["base:1", "hypercube", "one_peer_exponential"])
def test_one_flip_rounds_equal_the_general_bit_flip_pass(spec):
    n = 1024
    nbr, slot_w = T.make(spec, n).slots
    for a, b in zip(nbr, slot_w):
        got = moves.flip_terms(a, b)
        # A third, empty slot takes the round off the one-flip shortcut.
        wide = moves.flip_terms(
            np.concatenate([a, np.arange(n, dtype=a.dtype)[:, None]], axis=1),
            np.concatenate([b, np.zeros((n, 1))], axis=1),
        )
        assert (got is None) == (wide is None)
        if got is not None:
            assert got.masks == wide.masks
            _same_bits(got.weights, wide.weights, spec)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("spec", FAMILIES)
def test_regular_transpose_check_equals_the_edge_check(spec, n):
    topo = T.make(spec, n)
    for t in range(topo.period):
        s, r, w = topo.senders[t], topo.receivers[t], topo.weights[t]
        live = w != 0
        regular = layout.regular_rows(s[live], r[live], w[live], n)
        if regular is None or regular.width > 8:
            continue
        assert layout.regular_transpose_check(regular) == edges.transpose_check(s, r, w, n), (topo.name, t)
        # An asymmetric copy: one weight nudged beyond the tolerance.
        nudged = w.copy()
        nudged[np.flatnonzero((s != r) & live)[:1]] += 1e-3
        live_w = nudged[live]
        got = layout.regular_transpose_check(layout.regular_rows(s[live], r[live], live_w, n))
        assert got == edges.transpose_check(s, r, nudged, n), (topo.name, t)


@pytest.mark.parametrize("k", [1, 2, 3, 9])
def test_regular_sums_equal_numpy_row_sums(k):
    rows = np.random.default_rng(k).standard_normal((1000, k))
    _same_bits(facts.regular_sums(rows, np.empty(1000)), np.sum(rows, axis=1), k)


def _flips_by_loop(nbr, w):
    """The bit-flip weights ``[B, N]`` of a slot table, one entry at a time (the reference)."""
    n = nbr.shape[0]
    by_bit = {}
    for i in range(n):
        for k in range(1, nbr.shape[1]):
            if w[i, k] != 0:
                bit = int(nbr[i, k] ^ i).bit_length() - 1
                by_bit.setdefault(bit, np.zeros(n, dtype=w.dtype))[i] = w[i, k]
    bits = sorted(by_bit)
    return tuple(1 << b for b in bits), np.stack([by_bit[b] for b in bits])


@pytest.mark.parametrize("change", ["none", "nudge", "drop"])
def test_bit_flip_weights_equal_a_loop_over_the_slots(change):
    """Every path of flip_terms (one weight broadcast, every slot live, some slots empty) against
    the loop."""
    nbr, slot_w = T.make("hypercube", 64).slots
    a, b = nbr[0], slot_w[0].copy()
    if change == "nudge":
        b[5, 2] += 1e-3
    elif change == "drop":
        b[5, 2] = 0.0
    got = moves.flip_terms(a, b)
    masks, want = _flips_by_loop(a, b)
    assert got.masks == masks
    _same_bits(np.ascontiguousarray(got.weights), want, change)


def test_xor_rows_write_the_sorted_rows_of_their_table():
    n, masks = 64, np.array([0, 4, 1, 32])
    table = np.arange(n, dtype=np.int32)[:, None] ^ masks.astype(np.int32)[None, :]
    want = edges.sorted_rows(n, table, 0.25)
    out = (np.zeros(n * 4, np.int32), np.zeros(n * 4, np.int32), np.zeros(n * 4))
    got = edges.XorRows(masks, 0.25).write(n, out)
    for g, w_, name in zip(got, want, ("senders", "receivers", "weights")):
        _same_bits(g, w_.astype(g.dtype), name)


@pytest.mark.parametrize("spec, n", [("torus", 40000), ("base:3", 4**8)])
def test_regular_transpose_check_over_blocks_of_rows_equals_the_edge_check(spec, n):
    """Rounds of more rows than one block of the check, nudged in the first and in the last block."""
    topo = T.make(spec, n)
    s, r, w = topo.senders[0], topo.receivers[0], topo.weights[0]
    regular = layout.regular_rows(s, r, w, n)
    assert layout.regular_transpose_check(regular) == edges.transpose_check(s, r, w, n)
    for edge in (np.flatnonzero(s != r)[0], np.flatnonzero(s != r)[-1]):
        nudged = w.copy()
        nudged[edge] += 1e-3
        got = layout.regular_transpose_check(layout.regular_rows(s, r, nudged, n))
        assert got == edges.transpose_check(s, r, nudged, n) == (True, False), (spec, edge)
