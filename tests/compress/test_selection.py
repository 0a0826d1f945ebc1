"""jaxgossip.compress.selection and jaxgossip.compress.native: the native top-k equals lax.top_k bit for bit and a
NumPy per-row reference; the XLA fallback gives the same; dispatch, build failures and bad input."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from jaxgossip.compress import native, selection
from jaxgossip.ops import sharding

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
# (shape, k): the sampled-threshold path (D >= 1024, 16 k <= D), the heap path (D < 1024,
# 16 k <= D), the all-words path (16 k > D), k = 1, k = D, several leading axes, one row, a
# ResNet-20-sized row at K = 1 %, a conv-kernel-sized leaf at 1 %; calls of fewer than 16,384
# entries run on one thread, larger ones on XLA's pool.
CASES = [
    ((8, 10000), 50),
    ((8, 10000), 1),
    ((8, 36864), 368),
    ((5, 4096), 256),
    ((4, 3000), 30),
    ((6, 1000), 20),
    ((40, 640), 6),
    ((2, 1024), 64),
    ((3, 5, 77), 7),
    ((1000,), 1000),
    ((16, 300), 200),
    ((4, 10), 1),
    ((33, 1000), 999),
    ((2, 272474), 2724),
]


def _order_keys(x: np.ndarray) -> np.ndarray:
    """Integers whose order is the float total order -NaN < -inf < ... < -0 < +0 < ... < +NaN."""
    bits = {2: np.int16, 4: np.int32}[x.dtype.itemsize]
    s = x.view(bits).astype(np.int64)
    width = x.dtype.itemsize * 8 - 1
    return s ^ ((s >> width) & ((1 << width) - 1))


def _numpy_top_k(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    rows = x.reshape(-1, x.shape[-1])
    values, indices = [], []
    for row in rows:
        keys = _order_keys(row)
        order = np.lexsort((np.arange(row.size), -keys))[:k]  # larger key first, then lower index
        indices.append(order)
        values.append(row[order])
    shape = x.shape[:-1] + (k,)
    return np.stack(values).reshape(shape), np.stack(indices).astype(np.int32).reshape(shape)


def _numpy_top_k_dense(x: np.ndarray, k: int) -> np.ndarray:
    rows = x.reshape(-1, x.shape[-1])
    out = np.zeros_like(rows)
    for r, row in enumerate(rows):
        mag = np.abs(row.astype(np.float32)).astype(row.dtype)
        _, idx = _numpy_top_k(mag, k)
        out[r, idx] = row[idx]
    return out.reshape(x.shape)


def _bits(a) -> np.ndarray:
    return np.asarray(a).view(np.uint8)


def _tied(rng, shape, dtype) -> jax.Array:
    """Normal values rounded to quarters: many ties, both zeros and both signs."""
    return jnp.asarray(np.round(rng.normal(size=shape) * 4).astype(dtype) / 4)


def test_native_kernels_build_and_register_here():
    status = native.load()
    assert status.available, status.reason
    assert os.path.exists(status.library)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape,k", CASES, ids=[f"{s}-k{k}" for s, k in CASES])
def test_top_k_equals_lax_and_numpy_bitwise(rng, shape, k, dtype):
    x = _tied(rng, shape, dtype)
    values, indices = jax.jit(lambda x: selection.top_k(x, k))(x)
    lax_values, lax_indices = jax.lax.top_k(x, k)
    np.testing.assert_array_equal(np.asarray(indices), np.asarray(lax_indices))
    np.testing.assert_array_equal(_bits(values), _bits(lax_values))
    if int(np.prod(shape)) <= 100_000:
        ref_values, ref_indices = _numpy_top_k(np.asarray(x), k)
        np.testing.assert_array_equal(np.asarray(indices), ref_indices)
        np.testing.assert_array_equal(_bits(values), _bits(ref_values))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape,k", CASES, ids=[f"{s}-k{k}" for s, k in CASES])
def test_top_k_dense_equals_xla_path_and_numpy_bitwise(rng, shape, k, dtype):
    x = _tied(rng, shape, dtype)
    dense = jax.jit(lambda x: selection.top_k_dense(x, k))(x)
    np.testing.assert_array_equal(_bits(dense), _bits(selection.top_k_dense(x, k, impl="xla")))
    if int(np.prod(shape)) <= 100_000:
        np.testing.assert_array_equal(_bits(dense), _bits(_numpy_top_k_dense(np.asarray(x), k)))
    kept = np.count_nonzero(np.asarray(dense).reshape(-1, shape[-1]) != 0, axis=1)
    assert (kept <= k).all()


def test_special_values_follow_the_total_order():
    x = jnp.array([1.0, jnp.nan, 3.0, -jnp.nan, jnp.inf, 3.0, -0.0, 0.0, -jnp.inf, 3.0], jnp.float32)
    values, indices = selection.top_k(x, 10)
    np.testing.assert_array_equal(np.asarray(indices), [1, 4, 2, 5, 9, 0, 7, 6, 8, 3])
    lax_values, lax_indices = jax.lax.top_k(x, 10)
    np.testing.assert_array_equal(np.asarray(indices), np.asarray(lax_indices))
    np.testing.assert_array_equal(_bits(values), _bits(lax_values))
    # magnitude: |NaN| is the largest, +-inf next; the signs of the kept entries are kept
    dense = np.asarray(selection.top_k_dense(x, 4))
    np.testing.assert_array_equal(_bits(dense), _bits(selection.top_k_dense(x, 4, impl="xla")))
    assert np.isnan(dense[[1, 3]]).all() and dense[4] == np.inf and dense[8] == -np.inf
    assert (dense[[0, 2, 5, 6, 7, 9]] == 0).all()


def test_vmap_scan_and_empty_rows(rng):
    x = jnp.asarray(rng.normal(size=(6, 3, 500)).astype(np.float32))
    via_vmap = jax.vmap(lambda r: selection.top_k_dense(r, 9))(x)
    np.testing.assert_array_equal(_bits(via_vmap), _bits(selection.top_k_dense(x, 9, impl="xla")))

    def body(carry, row):
        values, indices = selection.top_k(row + carry, 5)
        return carry + values[0] * 1e-3, indices

    carry, idx = jax.lax.scan(body, jnp.float32(0), x[:, 0])
    ref_carry, ref_idx = jax.lax.scan(
        lambda c, r: (c + jax.lax.top_k(r + c, 5)[0][0] * 1e-3, jax.lax.top_k(r + c, 5)[1]), jnp.float32(0), x[:, 0]
    )
    np.testing.assert_array_equal(np.asarray(idx), np.asarray(ref_idx))
    assert float(carry) == float(ref_carry)
    empty = jnp.zeros((0, 10), jnp.float32)
    assert selection.top_k(empty, 3)[1].shape == (0, 3)
    assert selection.top_k_dense(empty, 3).shape == (0, 10)


def test_dispatch_native_on_cpu_xla_elsewhere_and_when_sharded():
    x = jax.ShapeDtypeStruct((8, 100), jnp.float32)
    jaxpr = str(jax.make_jaxpr(lambda x: selection.top_k_dense(x, 3))(x))
    assert "jaxgossip_top_k_dense_f32" in jaxpr and "platform_index" in jaxpr
    assert "ffi_call" not in str(jax.make_jaxpr(lambda x: selection.top_k_dense(x, 3, impl="xla"))(x))
    # A program lowered for the GPU holds no call to the CPU kernel.
    f = jax.jit(lambda x: selection.top_k(x, 3))
    check = [export.DisabledSafetyCheck.custom_call("jaxgossip_top_k_f32")]
    assert "jaxgossip_top_k" not in export.export(f, platforms=("cuda",), disabled_checks=check)(x).mlir_module()
    assert "jaxgossip_top_k" in export.export(f, platforms=("cpu",), disabled_checks=check)(x).mlir_module()
    # dtypes without a native kernel (int32 here, float64 under x64) take the XLA path, silently
    assert "ffi_call" not in str(jax.make_jaxpr(lambda x: selection.top_k(x, 3))(jnp.zeros((4, 9), jnp.int32)))


def test_sharded_node_axis_takes_the_xla_path_with_equal_results(rng):
    mesh = sharding.node_mesh(8, 8)
    x = jnp.asarray(rng.normal(size=(8, 300)).astype(np.float32))
    placed = sharding.shard_nodes(x, mesh, 8)
    f = jax.jit(jax.vmap(lambda r: selection.top_k_dense(r, 4)))
    assert "ffi_call" not in str(f.trace(placed).jaxpr)
    assert "ffi_call" in str(f.trace(x).jaxpr)
    np.testing.assert_array_equal(_bits(f(placed)), _bits(f(x)))


@pytest.mark.parametrize(
    "bad,error,match",
    [
        (dict(k=0), ValueError, r"k=0 is out of range for rows of D=5"),
        (dict(k=6), ValueError, r"k=6 is out of range"),
        (dict(k=2.0), TypeError, r"static int"),
        (dict(k=True), TypeError, r"static int"),
        (dict(k=2, impl="fast"), ValueError, r"unknown top-k impl 'fast'"),
    ],
)
def test_bad_input_is_refused_with_the_reason(bad, error, match):
    x = jnp.ones((3, 5), jnp.float32)
    for fn in (selection.top_k, selection.top_k_dense):
        with pytest.raises(error, match=match):
            fn(x, **bad)


def test_bad_rank_and_dtype_for_the_native_impl():
    with pytest.raises(ValueError, match=r"rank >= 1"):
        selection.top_k(jnp.float32(1.0), 1)
    with pytest.raises(ValueError, match=r"native top-k supports"):
        selection.top_k(jnp.ones((2, 4), jnp.int32), 1, impl="native")


_FALLBACK = textwrap.dedent(
    """
    import warnings, numpy as np, jax, jax.numpy as jnp
    from jaxgossip.compress import native, selection
    x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 300)).astype(np.float32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dense = selection.top_k_dense(x, 7)
        values, idx = selection.top_k(x, 7)
        again = selection.top_k(x, 7)
    status = native.load()
    assert not status.available
    assert "ffi_call" not in str(jax.make_jaxpr(lambda x: selection.top_k(x, 7))(x))
    assert (np.asarray(idx) == np.asarray(jax.lax.top_k(x, 7)[1])).all()
    assert (np.asarray(dense) == np.asarray(selection.top_k_dense(x, 7, impl="xla"))).all()
    print("REASON", status.reason)
    print("WARNINGS", len([w for w in caught if "native CPU kernels unavailable" in str(w.message)]))
    try:
        selection.top_k(x, 7, impl="native")
    except RuntimeError as err:
        print("NATIVE", err)
    """
)


@pytest.mark.parametrize(
    "env,reason,warnings",
    [
        ({"JAXGOSSIP_NATIVE": "0"}, "turned off by JAXGOSSIP_NATIVE=0", 0),
        ({"CXX": "/bin/false"}, "/bin/false", 1),
    ],
    ids=["turned-off", "build-fails"],
)
def test_without_native_kernels_the_xla_path_gives_the_same_results(tmp_path, env, reason, warnings):
    full_env = dict(os.environ, JAXGOSSIP_NATIVE_CACHE=str(tmp_path / "cache"), **env)
    proc = subprocess.run([sys.executable, "-c", _FALLBACK], env=full_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert reason in proc.stdout and f"WARNINGS {warnings}" in proc.stdout
    assert "NATIVE native top-k requested but unavailable" in proc.stdout
    assert not any(p.suffix == ".so" for p in (tmp_path / "cache").glob("*"))


def _extreme_rows(rng, d: int) -> np.ndarray:
    """Rows that stress the histogram of KthLargest: one value repeated, a ramp of ties at the
    boundary, magnitudes over every exponent, signed zeros and NaNs among normals, denormals."""
    rows = np.empty((6, d), np.float32)
    rows[0] = 0.5
    rows[1] = np.repeat(np.arange(d // 8 + 1, dtype=np.float32), 8)[:d]
    rows[2] = rng.choice([-1, 1], d) * np.exp2(rng.uniform(-140, 127, d)).astype(np.float32)
    rows[3] = rng.normal(size=d)
    rows[3, rng.choice(d, d // 4, replace=False)] = 0.0
    rows[3, rng.choice(d, d // 4, replace=False)] = -0.0
    rows[3, rng.choice(d, 7, replace=False)] = np.nan
    rows[4] = rng.uniform(-1, 1, d) * np.float32(1e-40)
    rows[5] = rng.normal(size=d) * 1e-3
    rows[5, :: d // 4] = 1e30
    return rows


@pytest.mark.parametrize("d,k", [(200, 50), (5000, 40), (5000, 400), (40000, 1600)])
def test_histogram_selection_on_extreme_rows_is_exact(rng, d, k):
    x = jnp.asarray(_extreme_rows(rng, d))
    values, indices = jax.jit(lambda x: selection.top_k(x, k))(x)
    lax_values, lax_indices = jax.lax.top_k(x, k)
    np.testing.assert_array_equal(np.asarray(indices), np.asarray(lax_indices))
    np.testing.assert_array_equal(_bits(values), _bits(lax_values))
    dense = jax.jit(lambda x: selection.top_k_dense(x, k))(x)
    np.testing.assert_array_equal(_bits(dense), _bits(selection.top_k_dense(x, k, impl="xla")))


@pytest.mark.parametrize("dense", [False, True], ids=["top_k", "top_k_dense"])
def test_sampled_threshold_that_keeps_too_few_falls_back_exactly(rng, dense):
    # Rows of D = 65536 take the sampled threshold: 1024 entries in 64 runs of 16 at a stride of
    # 1024. Here every sampled entry is large (2) and K = 2000 exceeds the 1024 of them, so the
    # threshold keeps fewer than K entries and the row must fall back to the full selection.
    d, k = 65536, 2000
    x = rng.uniform(-1, 1, size=(3, d)).astype(np.float32)
    runs = (np.arange(64)[:, None] * 1024 + np.arange(16)[None, :]).reshape(-1)
    x[:, runs] = 2.0
    x = jnp.asarray(x)
    if dense:
        out = jax.jit(lambda x: selection.top_k_dense(x, k))(x)
        np.testing.assert_array_equal(_bits(out), _bits(selection.top_k_dense(x, k, impl="xla")))
    else:
        values, indices = jax.jit(lambda x: selection.top_k(x, k))(x)
        lax_values, lax_indices = jax.lax.top_k(x, k)
        np.testing.assert_array_equal(np.asarray(indices), np.asarray(lax_indices))
        np.testing.assert_array_equal(_bits(values), _bits(lax_values))


def _numpy_mask(x: np.ndarray, k: int) -> np.ndarray:
    _, indices = _numpy_top_k(x, k)
    mask = np.zeros(x.shape, bool)
    np.put_along_axis(mask, indices, True, axis=-1)
    return mask


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape,k", CASES + [((1329, 64), 32), ((7, 64), 64)], ids=lambda v: str(v))
def test_top_k_mask_marks_what_lax_top_k_selects(rng, shape, k, dtype):
    x = _tied(rng, shape, dtype)
    mask = np.asarray(jax.jit(lambda x: selection.top_k_mask(x, k))(x))
    _, lax_indices = jax.lax.top_k(x, k)
    expected = np.zeros(shape, bool)
    np.put_along_axis(expected, np.asarray(lax_indices), True, axis=-1)
    np.testing.assert_array_equal(mask, expected)
    assert (mask.sum(-1) == k).all()
    if int(np.prod(shape)) <= 100_000:
        np.testing.assert_array_equal(mask, _numpy_mask(np.asarray(x), k))


def test_top_k_mask_special_values_and_ties():
    x = jnp.array([1.0, jnp.nan, 3.0, -jnp.nan, jnp.inf, 3.0, -0.0, 0.0, -jnp.inf, 3.0], jnp.float32)
    for k in range(1, 11):
        np.testing.assert_array_equal(np.asarray(selection.top_k_mask(x, k)), _numpy_mask(np.asarray(x), k))
    # all equal: the lower indices win
    np.testing.assert_array_equal(np.asarray(selection.top_k_mask(jnp.zeros((2, 6)), 4)), [[1, 1, 1, 1, 0, 0]] * 2)
    # magnitudes, as a compressor uses it: |NaN| first, then +-inf
    mag = np.asarray(selection.top_k_mask(jnp.abs(x), 3))
    np.testing.assert_array_equal(np.flatnonzero(mag), [1, 3, 4])


def test_top_k_mask_refuses_bad_input():
    with pytest.raises(ValueError, match="k=0 is out of range"):
        selection.top_k_mask(jnp.ones((2, 4)), 0)
    with pytest.raises(ValueError, match="k=5 is out of range"):
        selection.top_k_mask(jnp.ones((2, 4)), 5)
    with pytest.raises(ValueError, match="floating"):
        selection.top_k_mask(jnp.ones((2, 4), jnp.int32), 2)
