"""random_out's draws: :func:`jaxgossip.topology.coins.randint` (the threefry hash unrolled) equals
``jax.random.randint`` bit for bit (typed and raw keys, constant and traced bounds, under jit and
vmap, other key implementations falling back), and random_out's rounds equal the Floyd draw with
``jax.random.randint`` bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgossip import topology as T
from jaxgossip.topology import coins

SIZES = [1, 7, 2**10 + 3, 2**16]
# (minval, maxval): the spans of random_out's steps, the widest int32 spans, and empty ranges.
BOUNDS = [(0, 2), (0, 3), (0, 2**20 - 1), (0, 2**31 - 1), (-(2**31), 2**31 - 1), (5, 17), (-7, 3), (4, 4), (9, -2)]


def _keys():
    return [jax.random.fold_in(jax.random.key(seed), 11) for seed in range(3)]


@pytest.mark.parametrize("num", SIZES)
def test_fused_randint_is_jax_randint_bitwise(num):
    traced = jax.jit(coins.randint, static_argnums=1)
    for key in _keys():
        assert coins.fused_draw(key)
        for lo, hi in BOUNDS:
            expected = np.asarray(jax.random.randint(key, (num,), lo, hi, dtype=jnp.int32))
            constant = jax.jit(lambda k, lo=lo, hi=hi: coins.randint(k, num, lo, hi))(key)
            np.testing.assert_array_equal(np.asarray(constant), expected)
            np.testing.assert_array_equal(np.asarray(traced(key, num, jnp.int32(lo), jnp.int32(hi))), expected)
    raw = jax.random.PRNGKey(3)
    np.testing.assert_array_equal(
        np.asarray(coins.randint(raw, num, 0, 3)), np.asarray(jax.random.randint(raw, (num,), 0, 3, dtype=jnp.int32))
    )


def test_fused_randint_under_vmap_and_other_keys():
    keys = jax.random.split(jax.random.key(4), 5)
    for lo, hi in [(0, 3), (0, 2**20 - 1)]:
        expected = jax.vmap(lambda k, lo=lo, hi=hi: jax.random.randint(k, (33,), lo, hi, dtype=jnp.int32))(keys)
        fused = jax.jit(jax.vmap(lambda k, lo=lo, hi=hi: coins.randint(k, 33, lo, hi)))(keys)
        np.testing.assert_array_equal(np.asarray(fused), np.asarray(expected))
        raw = jax.vmap(jax.random.PRNGKey)(jnp.arange(4))
        expected = jax.vmap(lambda k, lo=lo, hi=hi: jax.random.randint(k, (33,), lo, hi, dtype=jnp.int32))(raw)
        np.testing.assert_array_equal(np.asarray(jax.vmap(lambda k: coins.randint(k, 33, lo, hi))(raw)), expected)
    # Traced bounds batched with the keys.
    his = jnp.arange(2, 7, dtype=jnp.int32)
    expected = jax.vmap(lambda k, h: jax.random.randint(k, (9,), 0, h, dtype=jnp.int32))(keys, his)
    np.testing.assert_array_equal(np.asarray(jax.vmap(lambda k, h: coins.randint(k, 9, 0, h))(keys, his)), expected)
    # Keys the fused hash does not serve take jax.random.randint.
    for key in (jax.random.key(1, impl="rbg"), jax.random.key(1, impl="unsafe_rbg")):
        assert not coins.fused_draw(key)
        np.testing.assert_array_equal(
            np.asarray(coins.randint(key, 9, 0, 5)), np.asarray(jax.random.randint(key, (9,), 0, 5, dtype=jnp.int32))
        )
    with jax.threefry_partitionable(False):
        key = jax.random.key(1)
        assert not coins.fused_draw(key)
        np.testing.assert_array_equal(
            np.asarray(coins.randint(key, 9, 0, 5)), np.asarray(jax.random.randint(key, (9,), 0, 5, dtype=jnp.int32))
        )


def _floyd_targets(key, n, s):
    """The s out-neighbours [N, s] of every node, Floyd's algorithm with ``jax.random.randint``."""
    keys = jax.random.split(key, s)
    chosen = []
    for step, j in enumerate(range(n - 1 - s, n - 1)):
        r = jax.random.randint(keys[step], (n,), 0, j + 1, dtype=jnp.int32)
        if chosen:
            r = jnp.where(jnp.any(jnp.stack(chosen, axis=1) == r[:, None], axis=1), j, r)
        chosen.append(r)
    return (jnp.arange(n, dtype=jnp.int32)[:, None] + 1 + jnp.stack(chosen, axis=1)) % n


@pytest.mark.parametrize("s", [1, 2, 3])
@pytest.mark.parametrize("n", [5, 1000])
def test_random_out_rounds_are_the_floyd_draw_with_jax_randint(n, s):
    topo = T.random_out(n, s)
    draw = jax.jit(lambda k, t: topo.sampler.draw(k, t).graph)
    nodes = np.arange(n)
    for t in range(4):
        key = jax.random.fold_in(jax.random.key(7), t)
        graph = draw(key, t)
        targets = np.asarray(_floyd_targets(key, n, s)).reshape(-1)
        np.testing.assert_array_equal(np.asarray(graph.receivers[0]), np.concatenate([nodes, targets]))
        np.testing.assert_array_equal(np.asarray(graph.senders[0]), np.concatenate([nodes, np.repeat(nodes, s)]))
        np.testing.assert_array_equal(np.asarray(graph.weights[0]), np.full(n * (s + 1), 1 / (s + 1), np.float32))
