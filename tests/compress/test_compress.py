"""Tests for jaxgossip.compress: values against NumPy references, expectations, exact bit costs,
validation errors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import np_top_k

from jaxgossip import compress
from jaxgossip.compress import resolve_compressor

RTOL, ATOL = 1e-5, 1e-6


def _normal(seed, shape, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _apply(comp, leaf, key=None):
    key = jax.random.key(0) if key is None else key
    dense, bits = comp.apply(jnp.asarray(leaf), key)
    return np.asarray(dense), float(bits)


def _monte_carlo(comps, leaf, num_keys, seed=0):
    """Outputs [num_keys, ...] of each compressor's apply over num_keys independent keys.

    One jit for all compressors (compiling the PRNG dominates the cost on CPU).
    """

    @jax.jit
    def run(leaf, key):
        keys = jax.random.split(key, num_keys)
        return [jax.vmap(c.apply, in_axes=(None, 0))(leaf, keys)[0] for c in comps]

    return [np.asarray(out) for out in run(jnp.asarray(leaf), jax.random.key(seed))]


# ---------------------------------------------------------------- identity


def test_identity_returns_the_leaf_and_counts_dtype_bits():
    leaf = _normal(0, (3, 4))
    dense, bits = _apply(compress.identity(), leaf)
    np.testing.assert_array_equal(dense, leaf)
    assert bits == 12 * 32
    assert compress.identity().lossless
    _, bits16 = _apply(compress.identity(), leaf.astype(jnp.bfloat16))
    assert bits16 == 12 * 16


# ---------------------------------------------------------------- top-k


@pytest.mark.parametrize(
    "shape, options, kept",
    [
        ((40,), {"fraction": 0.1}, 4),
        ((6, 7), {"fraction": 0.25}, 10),  # floor(0.25 * 42) = 10
        ((2, 3, 5), {"k": 7}, 7),
        ((3, 4), {"k": 50}, 12),  # k larger than the leaf keeps everything
        ((3, 4), {"fraction": 1.0}, 12),
        ((10,), {"fraction": 0.01}, 1),  # floor(0.1) = 0 -> at least one entry
    ],
)
def test_top_k_matches_numpy_argsort_reference(shape, options, kept):
    leaf = _normal(1, shape)
    dense, _ = _apply(compress.top_k(**options), leaf)
    np.testing.assert_array_equal(dense, np_top_k(leaf, kept))
    assert np.count_nonzero(dense) == kept


def test_top_k_keeps_at_least_one_entry_per_leaf_in_a_tree():
    x = {"scalar": _normal(2, (4,)), "vec": _normal(3, (4, 5)), "mat": _normal(4, (4, 3, 6))}
    comp = compress.top_k(fraction=0.01)
    dense, _ = jax.jit(lambda x, k: compress.compress_tree(comp, x, k))(jax.tree.map(jnp.asarray, x), jax.random.key(0))
    for name, leaf in x.items():
        for i in range(4):
            got = np.asarray(dense[name][i])
            assert np.count_nonzero(got) == 1
            np.testing.assert_array_equal(got, np_top_k(leaf[i], 1))


@pytest.mark.parametrize(
    "d, options, expected_bits",
    [
        (12, {"fraction": 0.25}, 3 * (32 + 4)),  # ceil(log2 12) = 4
        (12, {"fraction": 0.25, "index_bits": 64}, 3 * (32 + 64)),
        (16, {"k": 5}, 5 * (32 + 4)),  # log2 16 = 4 exactly
        (17, {"k": 5}, 5 * (32 + 5)),
        (12, {"k": 50}, 12 * (32 + 4)),
        (1, {"fraction": 0.5}, 1 * (32 + 1)),  # a one-entry leaf still pays one index bit
        (2, {"k": 1, "index_bits": 8}, 1 * (32 + 8)),
    ],
)
def test_top_k_and_random_k_bit_costs(d, options, expected_bits):
    leaf = _normal(5, (d,))
    assert _apply(compress.top_k(**options), leaf)[1] == expected_bits
    assert _apply(compress.random_k(unbiased=True, **options), leaf)[1] == expected_bits


# ---------------------------------------------------------------- random-k


def test_random_k_keeps_exactly_k_entries_with_the_right_values():
    d, k = 20, 6
    leaf = _normal(6, (4, 5))
    comps = [compress.random_k(k=k), compress.random_k(k=k, unbiased=True)]
    for scale, outs in zip([1.0, d / k], _monte_carlo(comps, leaf, 16)):
        supports = set()
        for out in outs:
            mask = out != 0
            assert mask.sum() == k
            np.testing.assert_allclose(out[mask], scale * leaf[mask], rtol=RTOL)
            supports.add(tuple(np.flatnonzero(mask)))
        assert len(supports) > 1  # different keys pick different subsets


def test_random_k_fraction_keeps_at_least_one_entry():
    (outs,) = _monte_carlo([compress.random_k(fraction=0.05)], _normal(7, (10,)), 8)
    assert all(np.count_nonzero(out) == 1 for out in outs)


def test_random_k_expectation_monte_carlo():
    d, k, num_keys = 10, 3, 4000
    leaf = _normal(8, (d,))
    comps = [compress.random_k(k=k, unbiased=True), compress.random_k(k=k)]
    unbiased, biased = _monte_carlo(comps, leaf, num_keys)
    unbiased = unbiased.mean(0)
    # Std of the mean per entry is |v| sqrt(d/k - 1) / sqrt(num_keys) ~ 0.025 |v|; 6 sigma.
    np.testing.assert_allclose(unbiased, leaf, atol=0.15 * np.abs(leaf).max())
    np.testing.assert_allclose(biased.mean(0), (k / d) * leaf, atol=0.05 * np.abs(leaf).max())
    # Every coordinate is kept with probability k / d.
    np.testing.assert_allclose((biased != 0).mean(0), k / d, atol=0.05)


def test_compress_tree_gives_each_node_its_own_randomness():
    x = jnp.asarray(_normal(9, (8, 30)))
    comp = compress.random_k(k=3)
    dense, bits = jax.jit(lambda x, k: compress.compress_tree(comp, x, k))(x, jax.random.key(1))
    masks = {tuple(np.flatnonzero(np.asarray(row))) for row in dense}
    assert len(masks) > 1
    np.testing.assert_array_equal(np.asarray(bits), np.full(8, 3 * (32 + 5), np.float32))


# ---------------------------------------------------------------- sign


def test_sign_is_scaled_sign_with_one_bit_per_entry():
    leaf = _normal(10, (3, 7))
    leaf[1, 2] = 0.0
    dense, bits = _apply(compress.sign(), leaf)
    expected = np.abs(leaf).sum() / leaf.size * np.sign(leaf)
    np.testing.assert_allclose(dense, expected, rtol=RTOL, atol=ATOL)
    assert bits == 21 + 32


# ---------------------------------------------------------------- QSGD


@pytest.mark.parametrize("levels, per_entry", [(1, 2), (3, 3), (4, 4), (15, 5), (16, 6)])
def test_qsgd_bits_are_norm_plus_sign_and_level_bits(levels, per_entry):
    # per entry: 1 sign bit + ceil(log2(levels + 1)) bits for xi in {0, ..., levels}
    assert per_entry == 1 + math.ceil(math.log2(levels + 1))
    leaf = _normal(11, (4, 3))
    assert _apply(compress.qsgd(levels=levels), leaf)[1] == 32 + 12 * per_entry
    assert _apply(compress.qsgd(levels=levels, rescale=True), leaf)[1] == 32 + 12 * per_entry


@pytest.mark.parametrize("levels, rescale", [(1, False), (4, True), (16, False)])
def test_qsgd_values_lie_on_the_level_grid(levels, rescale):
    d = 12
    leaf = _normal(12, (d,))
    (outs,) = _monte_carlo([compress.qsgd(levels=levels, rescale=rescale)], leaf, 64)
    norm = np.linalg.norm(leaf)
    factor = 1.0 / (min(d / levels**2, math.sqrt(d) / levels) + 1.0) if rescale else 1.0
    grid = np.abs(outs) / (norm * factor) * levels  # must be integers in [0, levels]
    np.testing.assert_allclose(grid, np.round(grid), atol=1e-4)
    assert grid.max() <= levels + 1e-4
    # xi is floor or ceil of levels |v_i| / ||v||, and the sign is kept.
    ratio = np.abs(leaf) / norm * levels
    assert np.all((np.round(grid) == np.floor(ratio)) | (np.round(grid) == np.ceil(ratio)))
    nonzero = outs != 0
    assert np.all(np.sign(outs)[nonzero] == np.broadcast_to(np.sign(leaf), outs.shape)[nonzero])


def test_qsgd_is_unbiased_and_rescale_scales_the_expectation():
    d, levels, num_keys = 8, 2, 4000
    leaf = _normal(13, (d,))
    plain, scaled = _monte_carlo(
        [compress.qsgd(levels=levels), compress.qsgd(levels=levels, rescale=True)], leaf, num_keys
    )
    plain, scaled = plain.mean(0), scaled.mean(0)
    # Per-entry std of one sample <= ||v|| / (2 levels); of the mean <= 0.004 ||v||.
    tol = 0.03 * np.linalg.norm(leaf)
    np.testing.assert_allclose(plain, leaf, atol=tol)
    factor = 1.0 / (min(d / levels**2, math.sqrt(d) / levels) + 1.0)
    np.testing.assert_allclose(scaled, factor * leaf, atol=tol)


def test_qsgd_of_zero_is_zero():
    dense, _ = _apply(compress.qsgd(levels=4), np.zeros((5,), np.float32))
    np.testing.assert_array_equal(dense, np.zeros(5))


# ---------------------------------------------------------------- trees, make, jit


def test_compress_tree_bits_sum_over_leaves():
    x = {"a": jnp.asarray(_normal(14, (3, 10))), "b": jnp.asarray(_normal(15, (3, 2, 4)))}
    dense, bits = jax.jit(lambda x, k: compress.compress_tree(compress.sign(), x, k))(x, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(bits), np.full(3, (10 + 32) + (8 + 32), np.float32))
    assert jax.tree.map(jnp.shape, dense) == jax.tree.map(jnp.shape, x)


def test_make_builds_each_registered_compressor():
    assert compress.make("identity").lossless
    assert compress.make("top_k", fraction=0.5).name == "top_k(fraction=0.5)"
    assert compress.make("random_k", k=2, unbiased=True).name.startswith("random_k(k=2")
    assert compress.make("sign").name == "sign"
    assert compress.make("qsgd", levels=3).name == "qsgd(levels=3, rescale=False)"


# ---------------------------------------------------------------- compressor specs (resolve_compressor)


def test_compressor_spec_forms_are_equivalent():
    by_name = resolve_compressor("top_k", {"fraction": 0.5, "index_bits": 64})
    by_spec = resolve_compressor({"name": "top_k", "fraction": 0.5}, {"index_bits": 64})
    built = compress.top_k(fraction=0.5, index_bits=64)
    assert resolve_compressor(built) is built
    leaf = jnp.arange(10.0) - 4.5
    for comp in (by_name, by_spec):
        dense, bits = comp.apply(leaf, jax.random.key(0))
        ref_dense, ref_bits = built.apply(leaf, jax.random.key(0))
        np.testing.assert_array_equal(dense, ref_dense)
        assert float(bits) == float(ref_bits) == 5 * 96


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("factory", [compress.top_k, compress.random_k])
def test_k_and_fraction_validation(factory):
    with pytest.raises(ValueError, match="k=0 is out of range"):
        factory(k=0)
    with pytest.raises(ValueError, match="k=-2 is out of range"):
        factory(k=-2)
    with pytest.raises(TypeError, match="k must be an int"):
        factory(k=1.5)
    for bad in (0, 0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="fraction=.* is out of range"):
            factory(fraction=bad)
    with pytest.raises(TypeError, match="fraction must be a float"):
        factory(fraction=float("nan"))
    with pytest.raises(ValueError, match="exactly one of fraction= or k="):
        factory()
    with pytest.raises(ValueError, match="exactly one of fraction= or k="):
        factory(fraction=0.1, k=3)


@pytest.mark.parametrize("bad", [0, -3, "log", True, 8.0])
@pytest.mark.parametrize("factory", [compress.top_k, compress.random_k])
def test_index_bits_validation(factory, bad):
    with pytest.raises(ValueError, match="index_bits must be 'log2' or a positive int"):
        factory(k=1, index_bits=bad)


def test_qsgd_levels_validation():
    with pytest.raises(ValueError, match="levels=0 is out of range"):
        compress.qsgd(levels=0)
    with pytest.raises(TypeError, match="levels must be an int"):
        compress.qsgd(levels=2.0)


def test_make_unknown_name_lists_known_compressors():
    with pytest.raises(ValueError, match=r"unknown compressor 'nope'; known compressors: \['identity', 'qsgd'"):
        compress.make("nope")
