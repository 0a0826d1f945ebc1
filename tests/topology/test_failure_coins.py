"""The failures' coins: the fused threefry draw of :mod:`jaxgossip.topology.coins` equals
``jax.random.uniform`` bit for bit, and the slot-table draw of a fixed symmetric graph equals the
edge-list draw with ``jax.random.uniform``'s coins bit for bit (every table of the round, the
repaired weights and a mix), over several rounds. The opt-in hashed coins (``+coins:hash``) have
the law of the default ones: Bernoulli(1 - p), independent across coins and rounds, and the
rounds they make keep W(t) symmetric and doubly stochastic."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgossip as jg
from jaxgossip import topology as T
from jaxgossip.topology import coins, failures


def _bits(a):
    return np.asarray(a).view(np.uint32)


@pytest.mark.parametrize("num", [1, 2, 7, 1000, 4099])
def test_fused_uniform_is_jax_uniform_bitwise(num):
    for seed in range(3):
        key = jax.random.fold_in(jax.random.key(seed), 17)
        expected = jax.random.uniform(key, (num,))
        assert coins.fused_draw(key)
        np.testing.assert_array_equal(_bits(jax.jit(coins.uniform, static_argnums=1)(key, num)), _bits(expected))
        np.testing.assert_array_equal(np.asarray(coins.coins(key, num, 0.3)), np.asarray(expected >= 0.3))
        picks = np.array([[num - 1, 0], [num // 2, num - 1]])
        np.testing.assert_array_equal(_bits(coins.uniform_at(key, picks, num)), _bits(expected[picks]))


def test_fused_uniform_under_vmap_and_other_keys():
    keys = jax.random.split(jax.random.key(4), 5)
    fused = jax.vmap(lambda k: coins.uniform(k, 33))(keys)
    np.testing.assert_array_equal(_bits(fused), _bits(jax.vmap(lambda k: jax.random.uniform(k, (33,)))(keys)))
    # A traced probability, and keys the fused hash does not serve (another implementation, raw keys).
    p = jnp.float32(0.4)
    np.testing.assert_array_equal(
        np.asarray(jax.jit(coins.coins, static_argnums=1)(keys[0], 33, p)),
        np.asarray(jax.random.uniform(keys[0], (33,)) >= p),
    )
    for key in (jax.random.key(1, impl="rbg"), jax.random.PRNGKey(1)):
        assert not coins.fused_draw(key)
        np.testing.assert_array_equal(_bits(coins.uniform(key, 9)), _bits(jax.random.uniform(key, (9,))))


def test_folded_uniform_is_jax_fold_in_uniform_bitwise():
    # Pair codes min * N + max, int32, wrapping past 2^31 as they do at large N.
    data = jnp.array([0, 1, 7, 2**20 + 3, 2**31 - 1, -1, -(2**31), 123456789], jnp.int32)

    def plain(key, d):
        return jax.vmap(lambda c: jax.random.uniform(jax.random.fold_in(key, c)))(d)

    keys = [jax.random.fold_in(jax.random.key(seed), 3) for seed in range(3)]
    for key in keys:
        assert coins.fused_draw(key)
        np.testing.assert_array_equal(_bits(jax.jit(coins.folded_uniform)(key, data)), _bits(plain(key, data)))
    stacked = jnp.stack(keys)
    np.testing.assert_array_equal(
        _bits(jax.vmap(coins.folded_uniform, in_axes=(0, None))(stacked, data)),
        _bits(jax.vmap(plain, in_axes=(0, None))(stacked, data)),
    )
    rbg = jax.random.key(1, impl="rbg")
    np.testing.assert_array_equal(_bits(coins.folded_uniform(rbg, data)), _bits(plain(rbg, data)))


GRAPHS = {
    "ring": lambda: T.make("ring+drop:0.3", 64),
    "ring_nodes": lambda: T.make("ring+drop:0.3+nodedrop:0.2", 64),
    "torus": lambda: T.make("torus+drop:0.3+nodedrop:0.1", 64),
    "hypercube": lambda: T.with_failures(T.make("hypercube", 64), 0.3, 0.1),
    "random": lambda: T.with_failures(T.erdos_renyi(64, 0.06, 2), 0.3, 0.1),  # unequal Metropolis weights
    "random_nodes_only": lambda: T.with_failures(T.erdos_renyi(40, 0.2, 3), 0.0, 0.2),
    "star": lambda: T.with_failures(T.make("star", 40), 0.3, 0.1),
    "directed_ring": lambda: T.with_failures(T.make("directed_ring", 32), 0.3, 0.1),
    "torus_hash": lambda: T.make("torus+drop:0.3+nodedrop:0.1+coins:hash", 64),
    "availability": lambda: T.with_availability(
        T.make("torus+drop:0.2", 16), np.random.default_rng(0).integers(0, 2, (3, 16))
    ),
}


def _edge_list_draw(topo):
    """The draw of the edge list: no slot-table coins (a sampler without ``slot_unit``)."""
    sampler = dataclasses.replace(topo.sampler, slot_unit=None)
    return T.Topology.from_sampler(
        sampler,
        draw_args=topo.draw_args,
        name=topo.name,
        num_nodes=topo.num_nodes,
        directed=topo.directed,
        layout=topo.resolved_kernel,
        row_stochastic=topo.is_row_stochastic,
        column_stochastic=topo.is_column_stochastic,
    )


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_slot_draw_with_fused_coins_equals_edge_list_draw_with_jax_uniform(name, monkeypatch):
    topo = GRAPHS[name]()
    n = topo.num_nodes
    x = jax.random.normal(jax.random.key(1), (n, 3))
    key = jax.random.key(5)

    def rounds(graph):
        out = []
        for t in range(4):
            k = jax.random.fold_in(key, t)
            drawn = jax.jit(lambda g, k: g.draw(k, t))(graph, k)
            mixed = jax.jit(lambda k, x: jg.mix(graph.draw(k, t).graph, x, t))(k, x)
            out.append([np.asarray(a) for a in jax.tree_util.tree_leaves(drawn)] + [np.asarray(mixed)])
        return out

    new = rounds(topo)
    with monkeypatch.context() as patch:
        patch.setattr(failures, "draw_coins", lambda key, num, p: jax.random.uniform(key, (num,)) >= p)
        old = rounds(_edge_list_draw(topo))
    for a_round, b_round in zip(new, old):
        assert len(a_round) == len(b_round)
        for a, b in zip(a_round, b_round):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_slot_tables_and_summation_order():
    # Equal weights in each row (ring, torus): the repair sums in slot order; unequal Metropolis
    # weights in an order the slots do not follow keep the edge order.
    assert GRAPHS["ring"]().sampler.slot_order is False
    assert GRAPHS["torus"]().sampler.slot_order is False
    assert GRAPHS["random"]().sampler.slot_order is True
    topo = GRAPHS["torus"]()
    sampler, base = topo.sampler, topo.sampler.base
    nbr, slot_w = base.slots
    # Every real slot reads the coin of its undirected pair, and its mirror slot reads the same one.
    for i, k in zip(*np.nonzero(sampler.slot_unit[0] >= 0)):
        j = nbr[0, i, k]
        assert sampler.pair_codes[sampler.slot_unit[0, i, k]] == min(i, j) * base.num_nodes + max(i, j)
        assert sampler.slot_unit[0, i, k] in sampler.slot_unit[0, j]
    assert np.all(sampler.slot_unit[0, :, 0] == -1)  # the self slot holds no coin


def test_hashed_coins_are_independent_bernoulli_coins():
    p, num, rounds = 0.3, 4096, 200
    keys = jax.random.split(jax.random.key(8), rounds)
    up = np.asarray(jax.jit(jax.vmap(lambda k: coins.hashed_coins(k, num, p)))(keys), dtype=np.float64)  # [R, M]
    total = up.size
    assert abs(up.mean() - (1 - p)) < 5 * np.sqrt(p * (1 - p) / total)
    # Each coin's frequency over the rounds, and each round's over the coins: binomial spreads.
    per_coin, per_round = up.mean(axis=0), up.mean(axis=1)
    assert abs(per_coin.std() / np.sqrt(p * (1 - p) / rounds) - 1) < 0.1
    assert abs(per_round.std() / np.sqrt(p * (1 - p) / num) - 1) < 0.25
    # No correlation between consecutive rounds, or between neighbouring coins of a round.
    centred = up - (1 - p)
    bound = 5 / np.sqrt(total)
    for a, b in ((centred[1:], centred[:-1]), (centred[:, 1:], centred[:, :-1]), (centred[:, 2:], centred[:, :-2])):
        assert abs((a * b).mean() / (p * (1 - p))) < bound
    # Traced p, the same coins.
    np.testing.assert_array_equal(
        np.asarray(jax.jit(coins.hashed_coins, static_argnums=1)(keys[0], num, jnp.float32(p))), up[0] > 0
    )


def test_hashed_failures_keep_the_law_and_the_invariants():
    p, q, rounds = 0.3, 0.1, 400
    for spec in ("ring+drop:0.3+nodedrop:0.1+coins:hash", "torus+drop:0.3+nodedrop:0.1+coins:hash"):
        topo = T.make(spec, 16)
        assert topo.sampler.coins == "hash" and "coins=hash" in topo.name
        keys = jax.random.split(jax.random.key(2), rounds)
        w = T.sample_matrices(topo, keys)  # [R, N, N]
        n = topo.num_nodes
        np.testing.assert_array_equal(w, w.transpose(0, 2, 1))
        np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-6)
        np.testing.assert_allclose(w.sum(axis=2), 1.0, atol=1e-6)
        assert np.all(w >= 0)
        # Each edge of the support kept with probability (1 - p)(1 - q)^2.
        base = topo.sampler.base.matrix() * (1 - np.eye(n)) > 0
        kept = ((w * (1 - np.eye(n))) > 0)[:, base].astype(np.float64)
        law = (1 - p) * (1 - q) ** 2
        assert abs(kept.mean() - law) < 5 * np.sqrt(law * (1 - law) / kept.size * 4)
        # The slot kernel mixes by W(t) and keeps the mean.
        x = np.random.default_rng(0).normal(size=(n, 2)).astype(np.float32)
        for r in range(3):
            mixed = np.asarray(jg.mix(topo.draw(keys[r], r).graph, jnp.asarray(x), r))
            np.testing.assert_allclose(mixed, w[r] @ x, atol=1e-5)
            np.testing.assert_allclose(mixed.mean(axis=0), x.mean(axis=0), atol=1e-5)


def test_coins_option_is_checked_and_names_the_graph():
    ring = T.make("ring", 8)
    default, hashed = T.with_failures(ring, 0.2), T.with_failures(ring, 0.2, coins="hash")
    assert default.sampler != hashed.sampler and hashed.name.endswith("coins=hash)")
    assert T.make("ring+drop:0.2+coins:hash", 8).sampler == hashed.sampler
    with pytest.raises(ValueError, match="coins"):
        T.with_failures(ring, 0.2, coins="philox")
    with pytest.raises(ValueError, match="coins"):
        T.make("ring+drop:0.2+coins:fast", 8)
    T.check_spec("ring+drop:0.2+coins:hash")


def test_failed_round_of_more_than_16_slots_mixes_by_its_edges():
    # K = 18 slots (beyond the slot kernel's bit-flip threshold) with traced slot weights.
    topo = T.make("hypercube+drop:0.2+nodedrop:0.1", 1 << 17)
    x = jax.random.normal(jax.random.key(3), (topo.num_nodes, 1))
    key = jax.random.key(6)
    mixed, edges = jax.jit(lambda k, x: (jg.mix(topo.draw(k, 2).graph, x, 2), topo.draw(k, 2).graph))(key, x)
    s, r, w = (np.asarray(a[0]) for a in (edges.senders, edges.receivers, edges.weights))
    expected = np.zeros(x.shape)
    np.add.at(expected, r, w[:, None] * np.asarray(x)[s])
    np.testing.assert_allclose(np.asarray(mixed), expected, atol=1e-5)


def test_pairs_of_a_drawn_graph_beyond_46340_nodes_get_their_own_coins():
    """Above N = 46,340 the code ``min N + max`` of an undirected pair would wrap in int32 (two
    pairs could share a coin): the coin then comes from min and max folded in turn, bit for bit the
    vmapped ``fold_in`` draw, and distinct pairs whose wrapped codes collide draw independently."""
    from jaxgossip.topology import coins

    key = jax.random.key(3)
    n = 2**20
    low = jnp.asarray([1, 5, 2**19, 7], jnp.int32)
    high = jnp.asarray([2**20 - 1, 9, 2**19 + 1, 4096 + 7], jnp.int32)
    want = jax.vmap(lambda a, b: jax.random.uniform(jax.random.fold_in(jax.random.fold_in(key, a), b)))(low, high)
    got = coins.folded_uniform(key, low, high)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda: coins.folded_uniform(key, low, high))()), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # (0, 5000) and (4096, 5000) have the same int32 code a N + b at N = 2^20 (4096 N = 2^32).
    codes = (np.array([0, 4096], np.int64) * n + 5000).astype(np.int32)
    assert codes[0] == codes[1]
    pairs = coins.folded_uniform(key, jnp.asarray([0, 4096]), jnp.asarray([5000, 5000]))
    assert float(pairs[0]) != float(pairs[1])
    topo = T.with_failures(T.random_matching(n), 0.5)
    round_ = topo.draw(jax.random.key(0), 0).graph
    s, r, w = (np.asarray(v[0]) for v in (round_.senders, round_.receivers, round_.weights))
    kept = (s != r) & (w != 0)
    assert 0.45 < kept.sum() / (s != r).sum() < 0.55  # each pair kept with probability 1 - p
