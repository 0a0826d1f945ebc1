"""The round driver (jaxgossip.engine.rounds.run_rounds) against a plain Python loop over rounds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgossip as jg
from jaxgossip.engine.rounds import next_keys, run_rounds


def round_fn(carry, x):
    """A toy program: a counter, a running sum of the inputs and a carried key split each round."""
    count, total, key = carry
    key, sub = jax.random.split(key)
    noise = jax.random.uniform(sub)
    total = total + (0.0 if x is None else x) + noise
    return (count + 1, total, key), {"total": total, "noise": noise}


def loop(carry, num_rounds, xs=None):
    records = []
    for r in range(num_rounds):
        carry, record = round_fn(carry, None if xs is None else xs[r])
        records.append(record)
    return carry, jax.tree_util.tree_map(lambda *a: np.stack(a), *records)


def start():
    return (jnp.int32(0), jnp.float32(0.0), jax.random.key(3))


def test_every_round_a_point_matches_the_python_loop():
    xs = jnp.arange(6, dtype=jnp.float32)
    (count, total, _), records = jax.jit(lambda c, x: run_rounds(round_fn, c, 6, x))(start(), xs)
    (want_count, want_total, _), want = loop(start(), 6, xs)
    assert int(count) == 6 == int(want_count)
    np.testing.assert_allclose(float(total), float(want_total), rtol=1e-6)
    np.testing.assert_allclose(records["total"], want["total"], rtol=1e-6)
    assert records["total"].shape == (6,)


def test_points_of_several_rounds_see_the_stacked_records():
    xs = jnp.arange(12, dtype=jnp.float32)

    def point_fn(carry, records):
        return {"count": carry[0], "last": records["total"][-1], "mean_noise": records["noise"].mean()}

    _, points = run_rounds(round_fn, start(), 4, xs, every=3, point_fn=point_fn)
    _, want = loop(start(), 12, xs)
    np.testing.assert_array_equal(points["count"], [3, 6, 9, 12])
    np.testing.assert_allclose(points["last"], want["total"][2::3], rtol=1e-6)
    np.testing.assert_allclose(points["mean_noise"], want["noise"].reshape(4, 3).mean(1), rtol=1e-6)
    _, raw = run_rounds(round_fn, start(), 4, xs, every=3)
    assert raw["total"].shape == (4, 3)


def test_chunks_of_whole_points_equal_one_run_bitwise():
    run = jax.jit(lambda c, n: run_rounds(round_fn, c, n, every=2, point_fn=lambda c, r: r["total"][-1]), static_argnums=1)
    carry, first = run(start(), 2)
    carry, second = run(carry, 3)
    whole_carry, whole = run(start(), 5)
    np.testing.assert_array_equal(np.concatenate([first, second]), whole)
    np.testing.assert_array_equal(carry[1], whole_carry[1])
    np.testing.assert_array_equal(jax.random.key_data(carry[2]), jax.random.key_data(whole_carry[2]))


def test_vmap_over_initial_carries_equals_separate_runs():
    starts = (jnp.zeros(2, jnp.int32), jnp.array([0.0, 1.0], jnp.float32), jax.random.split(jax.random.key(0), 2))
    _, batched = jax.vmap(lambda c: run_rounds(round_fn, c, 4))(starts)
    for i in range(2):
        one = jax.tree_util.tree_map(lambda a: a[i], starts)
        _, alone = run_rounds(round_fn, one, 4)
        np.testing.assert_array_equal(batched["total"][i], alone["total"])


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_counts_must_be_positive_ints(bad):
    with pytest.raises(ValueError, match="num_points=.*positive Python int"):
        run_rounds(round_fn, start(), bad)
    with pytest.raises(ValueError, match="every=.*positive Python int"):
        run_rounds(round_fn, start(), 2, every=bad)


def test_round_keys_are_the_chain_of_next_keys():
    key = jax.random.key(3)
    rows = jg.rounds.round_keys(key, 5, num=2)
    assert rows.shape == (5, 2)
    k = key
    for r in range(5):
        expected = jax.random.split(k, 3)  # the documented rule: key, *round_keys = split(key, 1 + m)
        k, subs = next_keys(k, 2)
        np.testing.assert_array_equal(jax.random.key_data(k), jax.random.key_data(expected[0]))
        for j in range(2):
            np.testing.assert_array_equal(jax.random.key_data(rows[r, j]), jax.random.key_data(subs[j]))
            np.testing.assert_array_equal(jax.random.key_data(subs[j]), jax.random.key_data(expected[1 + j]))
    assert jg.rounds.round_keys(key, 4).shape == (4,)
    with pytest.raises(ValueError, match="num=0"):
        next_keys(key, 0)


def test_consensus_hands_each_round_the_schedules_key():
    # a compressor that draws from its key, so a wrong key changes the iterates
    topo = jg.topology.ring(6)
    alg = jg.algorithms.make("choco", topo, compressor="random_k", compressor_options={"fraction": 0.5}, gamma=0.3)
    x0 = jax.random.normal(jax.random.key(0), (6, 9))
    key = jax.random.key(11)
    result = jg.run_consensus(alg, x0, 7, key)

    @jax.jit
    def loop(keys):  # the rounds as a Python loop over the given keys (unrolled in one compile)
        x, state = x0, alg.init(x0)
        for step_key in keys:
            x, state, _ = alg.step(x, state, step_key)
        return x

    np.testing.assert_allclose(result.x, loop(jg.rounds.round_keys(key, 7)), rtol=1e-6, atol=1e-6)
    # any other stream gives other iterates
    assert not np.allclose(result.x, loop(jax.random.split(key, 7)), atol=1e-3)
