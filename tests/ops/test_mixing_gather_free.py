"""Graphs with more than 16 in-neighbour slots whose slot columns are shifts (circulant graphs) or
bit flips (hypercubes): the slot layout with shifts and flips only, against a NumPy per-node loop
(float64) and the segment kernel, equal up to float reassociation.

Bound: both kernels sum the K + 1 float32 products ``w_ij x_j`` of node i in some order, so each is
within ``K u sum_j |w_ij x_j|`` of the exact sum (u = 2^-24, first order), and the two are within
twice that of each other.
"""

import jax
import numpy as np
import pytest

import jaxgossip as jg
from jaxgossip import topology as T
from jaxgossip.topology import moves

U = 2.0**-24


def loop_mix(topo, x):
    """y_i = sum over the in-edges of i of w * x_sender, one node at a time, in float64."""
    s, r, w = topo.senders[0], topo.receivers[0], topo.weights[0]
    order = np.argsort(r, kind="stable")
    starts = np.searchsorted(r[order], np.arange(topo.num_nodes + 1))
    x64 = x.astype(np.float64)
    y = np.zeros_like(x64)
    scale = np.zeros_like(x64)
    for i in range(topo.num_nodes):
        edges = order[starts[i] : starts[i + 1]]
        terms = w[edges, None] * x64[s[edges]]
        y[i] = terms.sum(axis=0)
        scale[i] = np.abs(terms).sum(axis=0)
    return y, scale


GRAPHS = {
    "hypercube(2^12)": lambda: T.hypercube(2**12),  # K = 13: the slot loop with gathers
    "hypercube(2^16)": lambda: T.hypercube(2**16),  # K = 17: bit flips
    "u_equistatic(1000)": lambda: T.u_equistatic(1000, seed=1),  # K = 21: shifts, N not a power of two
}
LARGE = {
    "hypercube(2^18)": lambda: T.hypercube(2**18),
    "exponential(2^17)": lambda: T.exponential(2**17),  # K = 18: shifts
}


@pytest.mark.parametrize(
    "name", sorted(GRAPHS) + [pytest.param(name, marks=pytest.mark.slow) for name in sorted(LARGE)]
)
def test_gather_free_slots_match_loop_and_segment_kernel(name):
    topo = {**GRAPHS, **LARGE}[name]()
    k = topo.max_slots
    assert topo.resolved_kernel == "slots"
    assert moves.gather_free(*topo.slots)
    x = np.random.default_rng(0).standard_normal((topo.num_nodes, 3)).astype(np.float32)
    got = np.asarray(jax.jit(lambda v: jg.mix(topo, v))(x), np.float64)
    segment = T.Topology(
        topo.name, topo.num_nodes, topo.senders, topo.receivers, topo.weights, topo.directed, "segment"
    )
    other = np.asarray(jax.jit(lambda v: jg.mix(segment, v))(x), np.float64)
    want, scale = loop_mix(topo, x)
    bound = k * U * scale + 1e-30
    assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) / bound)
    assert np.all(np.abs(got - other) <= 2 * bound)
    # Doubly stochastic: the node mean is kept to float32 rounding.
    np.testing.assert_allclose(got.mean(0), x.astype(np.float64).mean(0), atol=1e-6)


def test_flip_terms_of_a_hypercube_and_refusals():
    topo = T.hypercube(32)
    nbr, w = topo.slots
    flips = moves.flip_terms(nbr[0], w[0])
    assert flips.masks == (1, 2, 4, 8, 16)
    np.testing.assert_array_equal(flips.weights, np.full((5, 32), 1 / 6))
    ring = T.ring(32)
    assert moves.flip_terms(*(a[0] for a in ring.slots)) is None  # i - 1 is no bit flip for even i
    assert moves.flip_terms(*(a[0] for a in T.ring(12).slots)) is None  # N not a power of two
    assert moves.gather_free(*ring.slots) and not moves.gather_free(*T.star(9).slots)


def test_small_graphs_keep_their_kernel():
    # Up to 16 slots nothing changes: the choice and the per-slot loop are the measured ones.
    assert T.hypercube(2**15).resolved_kernel == "slots"
    assert T.exponential(2**15).max_slots == 16
    assert T.star(40).resolved_kernel == "segment"


@pytest.mark.parametrize(
    "make",
    [
        lambda: T.one_peer_exponential(64),
        lambda: T.one_peer_exponential(61),
        lambda: T.schedule([T.ring(16), T.one_peer_exponential(16)]),
    ],
)
def test_a_traced_round_of_a_circulant_schedule_rolls_and_equals_the_static_round(make):
    """Inside a scan the round is traced: slot columns that are shifts in every round roll x by the
    round's shift (no gather through the index table), bitwise equal to the round mixed on its own."""
    topo = make()
    x = jax.random.normal(jax.random.key(0), (topo.num_nodes, 3))
    traced = jax.jit(lambda x, t: jg.mix(topo, x, t))
    assert " gather(" not in traced.lower(x, 0).compile().as_text()
    for t in range(2 * topo.period):
        np.testing.assert_array_equal(np.asarray(traced(x, t)), np.asarray(jax.jit(lambda x: jg.mix(topo, x, t))(x)))


def test_group_roll_finds_rotations_of_groups_and_refuses_the_rest():
    n = 72
    i = np.arange(n, dtype=np.int32)
    assert moves.group_roll((i + 5) % n) == moves.GroupRoll(1, n, 5)  # a circulant shift
    assert moves.group_roll(i ^ 4) == moves.GroupRoll(4, 2, 1)  # a bit flip (72 = 9 * 8)
    place = (i // 3) % 4
    assert moves.group_roll(i + ((place + 3) % 4 - place) * 3) == moves.GroupRoll(3, 4, 3)
    # Step 2 of groups of 4 is step 1 of groups of 2 at twice the stride.
    place = i % 4
    assert moves.group_roll(i + ((place + 2) % 4 - place)) == moves.GroupRoll(2, 2, 1)
    assert moves.group_roll(i) == moves.GroupRoll(1, 1, 0)
    assert moves.group_roll(np.random.default_rng(0).permutation(n).astype(np.int32)) is None
    broken = (i + 5) % n
    broken[40] = 0
    assert moves.group_roll(broken) is None
    place = i % 5  # groups of 5 do not tile 72 nodes
    assert moves.group_roll(np.where(i < 70, i + ((place + 1) % 5 - place), i)) is None


def loop_round(topo, x, t):
    """Round t of ``topo`` one node at a time in float64, and each node's sum of |terms|."""
    t %= topo.period
    s, r, w = topo.senders[t], topo.receivers[t], topo.weights[t]
    x64 = x.astype(np.float64)
    y, scale = np.zeros_like(x64), np.zeros_like(x64)
    for i in range(topo.num_nodes):
        edges = np.flatnonzero(r == i)
        terms = w[edges, None] * x64[s[edges]]
        y[i], scale[i] = terms.sum(axis=0), np.abs(terms).sum(axis=0)
    return y, scale


@pytest.mark.parametrize("dim", [1, 3])
@pytest.mark.parametrize("spec, n", [("base:3", 256), ("base:2", 243), ("base:1", 64), ("base:3", 60), ("base:2", 100)])
def test_base_rounds_rotate_groups_and_equal_a_loop(spec, n, dim):
    """Base-(k+1) rounds are cliques of k + 1 nodes spaced (k + 1)^t apart: when N is a power of
    k + 1 every slot column rotates those groups, and a traced round (inside a scan) of rows of
    at most 2 values runs each round's rotations in a switch, reading no index or weight table
    (wider rows gather through the round's tables); other N keep gathers for the
    rounds that are not rotations. Either way each round is within ``K u sum |w x|`` of the
    float64 loop (the same terms; XLA may contract a product and its sum into one rounding),
    keeps the mean, and the traced round equals the round mixed on its own bit for bit."""
    topo = T.make(spec, n)
    x = np.random.default_rng(1).standard_normal((n, dim)).astype(np.float32)
    traced = jax.jit(lambda x, t: jg.mix(topo, x, t))
    rotations = all(
        moves.group_roll(topo.slots[0][t, :, k]) is not None for t in range(topo.period) for k in range(topo.max_slots)
    )
    assert rotations == (n in (256, 243, 64))
    if rotations and dim == 1:
        assert " gather(" not in traced.lower(x, 0).compile().as_text()
    for t in range(topo.period + 1):
        got = np.asarray(traced(x, t))
        np.testing.assert_array_equal(got, np.asarray(jax.jit(lambda x: jg.mix(topo, x, t))(x)))
        want, scale = loop_round(topo, x, t)
        bound = topo.max_slots * U * scale + 1e-30
        assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) / bound)
        np.testing.assert_allclose(got.mean(0), x.astype(np.float64).mean(0), atol=1e-6)


@pytest.mark.parametrize("dim", [1, 3])
@pytest.mark.parametrize(
    "make",
    [
        lambda: T.ring(64),
        lambda: T.ring(1001),
        lambda: T.directed_ring(100),
        lambda: T.from_matrix(
            np.roll(np.eye(40), 1, axis=1) * np.linspace(0.1, 0.5, 40)[:, None]
            + np.roll(np.eye(40), -2, axis=1) * 0.2
            + np.eye(40) * (0.8 - np.linspace(0.1, 0.5, 40))[:, None],
            name="short shifts, per-node weights",
        ),
    ],
)
def test_short_shift_rounds_equal_a_loop(make, dim):
    """A round of short shifts only (a ring) mixes the rows that do not wrap from slices of x and
    the wrapped rows from a small copy: within ``K u sum |w x|`` of the float64 per-node loop (the
    same terms in slot order; XLA may contract a product and its sum into one rounding), mean kept
    where W is doubly stochastic, and a scan's rounds equal the round mixed on its own."""
    topo = make()
    n = topo.num_nodes
    x = np.random.default_rng(2).standard_normal((n, dim)).astype(np.float32)
    got = np.asarray(jax.jit(lambda v: jg.mix(topo, v))(x))
    want, scale = loop_round(topo, x, 0)
    bound = topo.max_slots * U * scale + 1e-30
    assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) / bound)
    if topo.is_row_stochastic and topo.is_column_stochastic:
        np.testing.assert_allclose(got.mean(0), x.astype(np.float64).mean(0), atol=1e-6)
    looped = jax.jit(lambda v: jax.lax.fori_loop(0, 3, lambda t, v: jg.mix(topo, v, t), v))(x)
    once = x
    for _ in range(3):
        once = jax.jit(lambda v: jg.mix(topo, v))(once)
    np.testing.assert_allclose(np.asarray(looped), np.asarray(once), rtol=0, atol=1e-5)
