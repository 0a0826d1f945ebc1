"""The keyed Feistel permutation (jaxgossip.topology.feistel) and the O(N) random matching built on
it (random_matching(n, draw="feistel"), spec "random_matching:feistel"): bijections, a matching
every round, pairing frequencies close to uniform, and mixing against a NumPy per-node reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgossip as jg
from jaxgossip import topology as T
from jaxgossip.topology.feistel import feistel_bits, feistel_matching, feistel_permute


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 13, 64, 100, 1025])
def test_feistel_permute_is_a_bijection_with_its_inverse(n):
    for seed in range(3):
        key = jax.random.key(seed)
        i = jnp.arange(n)
        p = np.asarray(feistel_permute(key, n, i))
        q = np.asarray(feistel_permute(key, n, i, inverse=True))
        np.testing.assert_array_equal(np.sort(p), np.arange(n))
        np.testing.assert_array_equal(q[p], np.arange(n))
        assert p.dtype == np.int32
    assert feistel_bits(2) == 2 and feistel_bits(1024) == 10 and feistel_bits(1025) == 11


@pytest.mark.parametrize("n", [1, 2, 5, 8, 13, 100, 1024, 1025])
@pytest.mark.parametrize("inverse", [False, True])
def test_feistel_permute_of_all_nodes_equals_the_permutation_of_arange(n, inverse):
    key = jax.random.key(4)
    whole = np.asarray(jax.jit(lambda k: feistel_permute(k, n, inverse=inverse))(key))
    np.testing.assert_array_equal(whole, np.asarray(feistel_permute(key, n, jnp.arange(n), inverse=inverse)))


@pytest.mark.parametrize("n", [4096, 4093])
def test_a_loop_of_feistel_rounds_carries_no_per_node_table(n):
    """Inside a compiled loop the draw keeps its node indices inside the fused round: the while
    loop carries the round counter, x and the key schedule's small arrays, no [N] table."""
    topo = T.random_matching(n, draw="feistel")
    key = jax.random.key(0)

    def run(x):
        def body(t, x):
            return jg.mix(topo.draw(jax.random.fold_in(key, t), t).graph, x, t)

        return jax.lax.fori_loop(0, 4, body, x)

    text = jax.jit(run).lower(jnp.zeros((n, 1), jnp.float32)).compile().as_text()
    entry = text[text.index("ENTRY") :]
    loops = [line for line in entry.splitlines() if " while(" in line]
    assert loops, "no while loop in the compiled run"
    carried = loops[0].split(" while(")[0]  # the loop's carried shapes
    assert carried.count(f"[{n}") == 1, carried  # x only


@pytest.mark.parametrize("n", [2, 3, 6, 7, 64, 1001])
def test_every_round_is_a_matching(n):
    for seed in range(5):
        partner = np.asarray(feistel_matching(jax.random.key(seed), n))
        np.testing.assert_array_equal(partner[partner], np.arange(n))  # an involution
        assert np.count_nonzero(partner == np.arange(n)) == n % 2  # N even: perfect; N odd: one sits out


@pytest.mark.parametrize("n", [8, 7])
def test_feistel_rounds_are_symmetric_doubly_stochastic_and_vary(n):
    topo = T.random_matching(n, draw="feistel")
    w = T.sample_matrices(topo, jax.random.split(jax.random.key(1), 100))  # [R, N, N]
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-7)
    np.testing.assert_allclose(w.sum(axis=2), 1.0, atol=1e-7)
    np.testing.assert_array_equal(w, w.transpose(0, 2, 1))
    off = w * (1 - np.eye(n))
    assert set(np.unique(off)) <= {0.0, 0.5}
    assert np.all(((off == 0.5).sum(axis=2) == 0).sum(axis=1) == n % 2)
    assert np.mean([not np.array_equal(w[r], w[r + 1]) for r in range(99)]) > 0.5


def test_feistel_pairing_frequencies_are_close_to_uniform():
    rounds = 3000
    keys = jax.random.split(jax.random.key(2), rounds)
    # N = 6: node i's partner is each of the 5 others with probability 1/5 under a uniform matching.
    partners = np.asarray(jax.vmap(lambda k: feistel_matching(k, 6))(keys))  # [R, N]
    for i in range(6):
        freq = np.bincount(partners[:, i], minlength=6) / rounds
        assert freq[i] == 0
        np.testing.assert_allclose(np.delete(freq, i), 0.2, atol=0.03)
    # N = 4: the 3 perfect matchings, a third each.
    mate = np.asarray(jax.vmap(lambda k: feistel_matching(k, 4))(keys))[:, 0]
    np.testing.assert_allclose(np.bincount(mate, minlength=4)[1:] / rounds, 1 / 3, atol=0.03)
    # N = 7: the node that sits out is uniform over the 7.
    partners = np.asarray(jax.vmap(lambda k: feistel_matching(k, 7))(keys))
    out = np.argmax(partners == np.arange(7), axis=1)
    np.testing.assert_allclose(np.bincount(out, minlength=7) / rounds, 1 / 7, atol=0.025)


@pytest.mark.parametrize("n", [1024, 1001])
def test_feistel_round_mixes_as_the_numpy_per_node_reference(n):
    topo = T.make("random_matching:feistel", n)
    assert topo.name == f"random_matching({n}, draw=feistel)" and topo.resolved_kernel == "slots"
    x = jax.random.normal(jax.random.key(3), (n, 3), jnp.float32)
    key = jax.random.key(4)

    @jax.jit
    def one(key, x, t):
        return jg.mix(topo.draw(key, t).graph, x, t)

    got = np.asarray(one(key, x, 5))
    drawn = topo.draw(key, 5).graph
    s, r, w = (np.asarray(a[0]) for a in (drawn.senders, drawn.receivers, drawn.weights))
    partner = np.arange(n)
    other = (s != r) & (w != 0)
    partner[r[other]] = s[other]
    np.testing.assert_array_equal(partner[partner], np.arange(n))
    xh = np.asarray(x, np.float64)
    want = 0.5 * xh + 0.5 * xh[partner]  # node i: (x_i + x_partner(i)) / 2; a node sitting out keeps x_i
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_feistel_spec_options_and_facts():
    topo = T.make("random_matching:feistel", 8)
    assert topo.sampler != T.random_matching(8).sampler  # its own compile, its own draws
    assert T.exact_gram(topo) is None and T.exact_gram(T.random_matching(8)) is not None
    gap = T.expected_gap(topo, num_samples=64)
    assert not gap.exact and 0 < gap.value < 1
    T.check_spec("random_matching:feistel")
    for bad in ("random_matching:sort2", "random_matching:1"):
        with pytest.raises(ValueError, match="feistel"):
            T.make(bad, 8)
        with pytest.raises(ValueError, match="feistel"):
            T.check_spec(bad)
    with pytest.raises(ValueError, match="draw="):
        T.random_matching(8, draw="fisher_yates")
