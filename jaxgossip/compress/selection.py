"""Exact top-k selection over the last axis, fast on XLA:CPU.

``top_k(x, k)`` is ``jax.lax.top_k`` (same values, same indices, bit for bit: the float total order
-NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN, ties to the lower index, values in descending
order); ``top_k_dense(x, k)`` is the dense message of a top-k compressor, the K largest ``|x|`` of
each row kept in place and every other entry zero; ``top_k_mask(x, k)`` marks the entries
``lax.top_k(x, k)`` selects. Shapes: ``x`` [..., D]; ``top_k`` returns values and int32 indices
[..., K]; ``top_k_dense`` and ``top_k_mask`` return [..., D].

Why: XLA:CPU's TopK sorts each row with a scalar loop; on the project's 2-core CPU, the
``[8, 10000]``, K = 50 selection of a Choco top-k consensus round took 0.17-0.21 ms, about 60 % of
the round. On the CPU these functions call the C++ kernels of :mod:`jaxgossip.compress.native` (one pass per
row against the K-th best key so far, blocks without a better key skipped) through the XLA FFI;
measured side by side in experiments/bench/selection.py. Elsewhere (GPU, TPU), or when the native
kernels are unavailable or turned off (``JAXGOSSIP_NATIVE=0``), or for dtypes other than float32 /
bfloat16 / float16, they are ``lax.top_k`` and a scatter. The choice is made per platform inside
the compiled program (``lax.platform_dependent``), so one jitted function serves CPU and GPU.

Sharded inputs: an FFI call is opaque to XLA's partitioner, which would gather the whole operand
onto every device; when ``x`` sits on a mesh of more than one device the XLA path is taken.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.compress import native

__all__ = ["top_k", "top_k_dense", "top_k_mask", "kept_mask", "IMPLS", "on_multi_device_mesh"]

Array = Any

IMPLS = ("auto", "native", "xla")
_DTYPES = {jnp.dtype(jnp.float32): "f32", jnp.dtype(jnp.bfloat16): "bf16", jnp.dtype(jnp.float16): "f16"}


def _check(x: Array, k: Any, impl: str) -> int:
    if impl not in IMPLS:
        raise ValueError(f"unknown top-k impl {impl!r}; choose one of {IMPLS}")
    if jnp.ndim(x) < 1:
        raise ValueError(f"top_k needs an array of rank >= 1, got shape {jnp.shape(x)}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"top_k k must be a static int, got {k!r}")
    d = jnp.shape(x)[-1]
    if not 1 <= k <= d:
        raise ValueError(f"top_k k={k} is out of range for rows of D={d} entries: need 1 <= k <= D")
    return int(k)


def on_multi_device_mesh(x: Array) -> bool:
    """Whether ``x`` (traced or not) is placed on a mesh of more than one device."""
    mesh = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
    return mesh is not None and not getattr(mesh, "empty", False) and int(np.prod(list(mesh.shape.values()))) > 1


def _use_native(x: Array, impl: str) -> bool:
    """Trace-time choice; the platform is chosen later, in the compiled program."""
    if impl == "xla":
        return False
    supported = jnp.dtype(x.dtype) in _DTYPES
    if impl == "native":
        if not supported:
            raise ValueError(f"native top-k supports {sorted(map(str, _DTYPES))}, got {x.dtype}")
        status = native.load()
        if not status.available:
            raise RuntimeError(f"native top-k requested but unavailable: {status.reason}")
        return True
    return supported and not on_multi_device_mesh(x) and native.load().available


def _xla_top_k(x: Array, k: int) -> tuple[Array, Array]:
    values, indices = jax.lax.top_k(x, k)
    return values, indices


def _xla_top_k_dense(x: Array, k: int) -> Array:
    rows = x.reshape(-1, x.shape[-1])

    def one(row):
        _, idx = jax.lax.top_k(jnp.abs(row), k)
        return jnp.zeros_like(row).at[idx].set(row[idx])

    return jax.vmap(one)(rows).reshape(x.shape)


def top_k(x: Array, k: int, *, impl: str = "auto") -> tuple[Array, Array]:
    """The K largest entries of each row of ``x`` [..., D] and their indices, as ``lax.top_k``.

    Args:
      x: array [..., D].
      k: static, 1 <= k <= D.
      impl: ``"auto"`` (native on CPU when available, else XLA), ``"native"`` (raise when the
        native kernel is unavailable), ``"xla"`` (``lax.top_k`` everywhere).

    Returns:
      ``(values [..., K], indices [..., K] int32)``, values in descending total order.

    Derivative: the values carry the tangent of the entries they select; the indices carry none
    (as ``lax.top_k``, also for the native kernel).
    """
    k = _check(x, k, impl)
    return _top_k(jnp.asarray(x), k, impl)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _top_k(x: Array, k: int, impl: str) -> tuple[Array, Array]:
    if not _use_native(x, impl):
        return _xla_top_k(x, k)
    name = f"jaxgossip_top_k_{_DTYPES[jnp.dtype(x.dtype)]}"
    out = (jax.ShapeDtypeStruct(x.shape[:-1] + (k,), x.dtype), jax.ShapeDtypeStruct(x.shape[:-1] + (k,), jnp.int32))

    def cpu(x):
        return tuple(jax.ffi.ffi_call(name, out, vmap_method="broadcast_all")(x, k=np.int64(k)))

    return jax.lax.platform_dependent(x, cpu=cpu, default=lambda x: _xla_top_k(x, k))


@_top_k.defjvp
def _top_k_jvp(k, impl, primals, tangents):
    (x,), (dx,) = primals, tangents
    values, indices = _top_k(x, k, impl)
    return (values, indices), (jnp.take_along_axis(dx, indices, axis=-1), np.zeros(indices.shape, jax.dtypes.float0))


def top_k_dense(x: Array, k: int, *, impl: str = "auto") -> Array:
    """``x`` [..., D] with the K largest-magnitude entries of each row kept and the rest +0.

    Ties in ``|x|`` go to the lower index (as ``lax.top_k(|x|)``). Bitwise equal to scattering
    ``x[idx]`` into zeros at ``idx = lax.top_k(|x|, K)[1]``. ``impl`` as in :func:`top_k`.

    Derivative (mask passing): the kept entries pass their tangent, every other entry and the
    choice of indices pass none: ``d out = m * d x`` with ``m`` the 0/1 mask of the kept entries,
    the derivative of that scatter (the mask is recomputed with ``lax.top_k``, the same kept set).
    """
    k = _check(x, k, impl)
    return _top_k_dense(jnp.asarray(x), k, impl)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _top_k_dense(x: Array, k: int, impl: str) -> Array:
    if not _use_native(x, impl):
        return _xla_top_k_dense(x, k)
    name = f"jaxgossip_top_k_dense_{_DTYPES[jnp.dtype(x.dtype)]}"
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)

    def cpu(x):
        return jax.ffi.ffi_call(name, out, vmap_method="broadcast_all")(x, k=np.int64(k))

    return jax.lax.platform_dependent(x, cpu=cpu, default=lambda x: _xla_top_k_dense(x, k))


def _order_keys(x: Array) -> Array:
    """uint32 keys in the float total order of ``x`` (-NaN < -inf < ... < -0 < +0 < ... < +NaN):
    the sign bit flipped for non-negative floats, every bit flipped for negative ones."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    negative = (bits >> 31).astype(bool)
    return jnp.where(negative, ~bits, bits | jnp.uint32(1 << 31))


def _radix_top_k_mask(x: Array, k: int) -> Array:
    """Radix selection: the K-th largest key of each row is built bit by bit from the top (keep a
    bit when at least K keys reach the prefix with it), then the keys above it are taken and the
    ties at it from the lower indices. 32 compare-and-count passes over the row, no sort."""
    keys = _order_keys(x)
    kth = jnp.zeros(x.shape[:-1] + (1,), jnp.uint32)
    for bit in range(31, -1, -1):
        candidate = kth | jnp.uint32(1 << bit)
        kth = jnp.where(jnp.sum(keys >= candidate, axis=-1, keepdims=True) >= k, candidate, kth)
    above = keys > kth
    tied = keys == kth
    room = k - jnp.sum(above, axis=-1, keepdims=True)
    return above | (tied & (jnp.cumsum(tied, axis=-1) <= room))


def _xla_top_k_mask(x: Array, k: int) -> Array:
    _, idx = jax.lax.top_k(x, k)
    return jnp.put_along_axis(jnp.zeros(x.shape, bool), idx, True, axis=-1, inplace=False)


def top_k_mask(x: Array, k: int) -> Array:
    """Bool [..., D], True at the K entries of each row of ``x`` [..., D] that ``lax.top_k(x, k)``
    selects (float total order, ties to the lower index), bit for bit.

    On the CPU, for ``8 K <= D`` the indices of :func:`top_k` (the native kernel) scattered into a
    mask, and above it a radix selection (32 vectorised compare-and-count passes, whose cost does
    not grow with K: at D = 64 it overtakes the native kernel, and XLA:CPU's sorting TopK, between
    K = 8 and 16); elsewhere ``lax.top_k`` and a scatter. Floating dtypes up to 32 bits (a wider
    dtype takes ``lax.top_k`` everywhere).
    """
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"top_k_mask needs a floating array, got {x.dtype}")
    k = _check(x, k, "xla")
    if jnp.dtype(x.dtype).itemsize > 4:
        return _xla_top_k_mask(x, k)
    if 8 * k <= x.shape[-1] and _use_native(x, "auto"):

        def cpu(x):
            _, idx = top_k(x, k)
            return jnp.put_along_axis(jnp.zeros(x.shape, bool), idx, True, axis=-1, inplace=False)

    else:

        def cpu(x):
            return _radix_top_k_mask(x, k)

    return jax.lax.platform_dependent(x, cpu=cpu, default=lambda x: _xla_top_k_mask(x, k))


def kept_mask(x: Array, k: Any) -> Array:
    """``[..., D]`` 0/1 mask (dtype of ``x``) of the K largest ``|x|`` of each row, ties to the
    lower index (the entries :func:`top_k_dense` keeps). ``k``: a static int or an int array
    broadcastable to ``x.shape[:-1]`` (a K per row), each in ``[0, D]``; with an array the row is
    fully sorted (used under differentiation only)."""
    d = x.shape[-1]
    if isinstance(k, (int, np.integer)):
        if k == 0:
            return jnp.zeros(x.shape, x.dtype)
        return top_k_mask(jnp.abs(x), int(k)).astype(x.dtype)
    order = jax.lax.top_k(jnp.abs(x), d)[1]
    rank = jnp.arange(d, dtype=jnp.int32)
    hit = (rank < jnp.asarray(k, jnp.int32)[..., None]).astype(x.dtype)
    rows = order.reshape(-1, order.shape[-1])
    mask = jax.vmap(lambda idx, h: jnp.zeros([d], x.dtype).at[idx].set(h))(rows, hit.reshape(rows.shape))
    return mask.reshape(x.shape)


@_top_k_dense.defjvp
def _top_k_dense_jvp(k, impl, primals, tangents):
    (x,), (dx,) = primals, tangents
    return _top_k_dense(x, k, impl), kept_mask(x, k) * dx
