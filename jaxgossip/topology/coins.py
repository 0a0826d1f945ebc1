"""``jax.random.uniform`` of a 1-D shape, bit for bit, as one fused elementwise program, and any
of its elements on their own: the coins of the failures in :mod:`jaxgossip.topology.failures`;
``jax.random.randint`` of a 1-D int32 shape, bit for bit (:func:`randint`): the out-neighbours of
:func:`jaxgossip.topology.random_out`; and :func:`hashed_coins`, cheaper coins of the same law
from other bits, for those who opt in.

On XLA:CPU ``jax.random.uniform`` lowers the threefry hash as a rolled loop of five steps, each a
pass over arrays of the output's size, and a draw of 2^20 to 3 2^20 values costs 2.5x to 8x the
same hash unrolled into one fused loop (measured, ``experiments/bench/stochastic_draws.py``).
The unrolled hash here computes the same values: element i of ``uniform(key, (M,))`` is, with
JAX's partitionable threefry (``jax_threefry_partitionable``, the default), the 2x32 threefry
hash of the counter ``(0, i)`` under the key, its two words XOR-ed, its top 23 bits taken as the
mantissa of a float in ``[1, 2)``, minus 1 (Salmon et al., *Parallel random numbers: as easy as
1, 2, 3*, SC 2011).

Because element i depends on i alone, :func:`uniform_at` draws any elements of that array where
they are needed without drawing the rest. :func:`uniform` computes the whole array into memory
(inside a conditional, which XLA does not fuse across): XLA:CPU would otherwise fuse the hash into
each gather that reads the array and evaluate it once per read, element by element (a failed
torus round at 2^20 took 3.7x longer so). Keys of another implementation, or the
non-partitionable threefry, take ``jax.random.uniform`` (``jax.random.randint``) itself.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["fused_draw", "uniform", "uniform_at", "coins", "folded_uniform", "randint", "hashed_coins", "buffered"]

# Rotations of the 2x32 threefry rounds (Random123), four per step, alternating.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def fused_draw(key: Any) -> bool:
    """Whether ``key`` (one typed PRNG key) is drawn here by the fused hash: a threefry key under
    JAX's partitionable threefry; otherwise :func:`uniform` is ``jax.random.uniform``."""
    if not jax.dtypes.issubdtype(jnp.result_type(key), jax.dtypes.prng_key):
        return False
    return str(jax.random.key_impl(key)) == "threefry2x32" and bool(jax.config.jax_threefry_partitionable)


def _rotate(v: Any, r: int) -> Any:
    return (v << np.uint32(r)) | (v >> np.uint32(32 - r))


def _threefry2(k1: Any, k2: Any, x0: Any, x1: Any) -> tuple[Any, Any]:
    """The 20-round threefry 2x32 hash of the counters ``(x0, x1)`` under the key ``(k1, k2)``,
    both words (uint32, broadcast shapes)."""
    ks = (k1, k2, k1 ^ k2 ^ _PARITY)
    x0 = x0 + ks[0]
    x1 = x1 + ks[1]
    for step in range(5):
        for r in _ROTATIONS[step % 2]:
            x0 = x0 + x1
            x1 = x0 ^ _rotate(x1, r)
        x0 = x0 + ks[(step + 1) % 3]
        x1 = x1 + ks[(step + 2) % 3] + np.uint32(step + 1)
    return x0, x1


def _threefry(k1: Any, k2: Any, x1: Any) -> Any:
    """``x0 XOR x1`` of the 20-round threefry 2x32 hash of the counters ``(0, x1)`` (uint32): the
    32 random bits of element x1 (partitionable threefry)."""
    x0, x1 = _threefry2(k1, k2, jnp.zeros(jnp.shape(x1), jnp.uint32), x1)
    return x0 ^ x1


def _to_unit(bits: Any) -> Any:
    """uint32 bits -> float32 in [0, 1): the top 23 bits as the mantissa of [1, 2), minus 1."""
    return lax.bitcast_convert_type((bits >> np.uint32(9)) | np.uint32(0x3F800000), jnp.float32) - np.float32(1)


def uniform_at(key: Any, counters: Any, num: int) -> Any:
    """Elements ``counters`` of ``jax.random.uniform(key, (num,))``, bit for bit.

    Args:
      key: one PRNG key.
      counters: integer array of any shape, values in ``[0, num)``, num below 2^32.
      num: M, the length of the array the elements are taken from.

    Returns:
      float32 array of the shape of ``counters``.
    """
    if not fused_draw(key):
        return jax.random.uniform(key, (num,))[counters]
    k1, k2 = (jax.random.key_data(key)[..., i] for i in range(2))
    return _to_unit(_threefry(k1, k2, jnp.asarray(counters).astype(jnp.uint32)))


def uniform(key: Any, num: int) -> Any:
    """``jax.random.uniform(key, (num,))`` (float32 [M], M = ``num``), bit for bit, in memory."""
    return _in_memory(
        key, lambda: uniform_at(key, lax.iota(jnp.uint32, num), num), lambda: jax.random.uniform(key, (num,))
    )


def coins(key: Any, num: int, p: Any) -> Any:
    """``jax.random.uniform(key, (num,)) >= p`` (bool [M]: each up with probability 1 - p), bit for
    bit, in memory (one byte a coin for the gathers that read them)."""
    return _in_memory(
        key,
        lambda: uniform_at(key, lax.iota(jnp.uint32, num), num) >= p,
        lambda: jax.random.uniform(key, (num,)) >= p,
    )


def folded_uniform(key: Any, data: Any, second: Any = None) -> Any:
    """``jax.vmap(lambda d: jax.random.uniform(jax.random.fold_in(key, d)))(data)``, bit for bit,
    in memory: one uniform per datum, a function of the datum alone (the coin of an undirected
    pair drawn from its code, the same from both ends). With ``second``, the key is folded twice,
    ``fold_in(fold_in(key, data[m]), second[m])`` (a pair of nodes as two data, where one code
    ``a N + b`` would not fit 32 bits).

    ``fold_in(key, d)`` is the key of both words of the hash of the counter ``(0, uint32(d))``,
    and a uniform of shape () under it is :func:`uniform`'s element 0: two hashes per datum (three
    with ``second``), here one fused elementwise program. Keys :func:`fused_draw` refuses take
    ``jax.random`` itself.

    Args:
      key: one PRNG key.
      data: integer array [M] (int32 wraps to uint32, as ``fold_in`` converts it).
      second: None, or an integer array [M].

    Returns:
      float32 array [M].
    """

    def plain():
        if second is None:
            return jax.vmap(lambda d: jax.random.uniform(jax.random.fold_in(key, d)))(data)
        return jax.vmap(lambda d, e: jax.random.uniform(jax.random.fold_in(jax.random.fold_in(key, d), e)))(
            data, second
        )

    def fused():
        k = jax.random.key_data(key)
        d = jnp.asarray(data).astype(jnp.uint32)
        zero = jnp.zeros(d.shape, jnp.uint32)
        k1, k2 = _threefry2(k[..., 0], k[..., 1], zero, d)
        if second is not None:
            k1, k2 = _threefry2(k1, k2, zero, jnp.asarray(second).astype(jnp.uint32))
        return _to_unit(_threefry(k1, k2, zero))

    return _in_memory(key, fused, plain)


def randint(key: Any, num: int, minval: Any, maxval: Any) -> Any:
    """``jax.random.randint(key, (num,), minval, maxval, dtype=jnp.int32)`` (int32 [M],
    M = ``num``), bit for bit, in memory.

    JAX's rule, for int32 bounds: the key is split in two, ``(a, b) = split(key)`` (key i of a
    split is both words of the hash of the counter ``(0, i)``), element i takes the 32-bit draws
    ``h_i`` under a and ``l_i`` under b (element i of :func:`jax.random.bits`, as in
    :func:`uniform`), and with the span ``S = uint32(maxval - minval)`` (1 if ``maxval <= minval``)
    and ``c = (2^16 mod S)^2 mod S`` (uint32 arithmetic, wrapping mod 2^32 as JAX's does)

    .. math::  r_i = \\mathrm{minval} + \\big(((h_i \\bmod S)\\, c + l_i \\bmod S) \\bmod S\\big)

    Here both draws are one fused elementwise program, computed into memory, and the remainders
    a second elementwise pass (a division by a constant when the bounds are). Raw uint32 keys are
    taken as keys of the default implementation, as ``jax.random.randint`` takes them; keys
    :func:`fused_draw` refuses, and bounds that are not int32 scalars (Python ints in range,
    int32 arrays of shape ()), take ``jax.random.randint`` itself.

    Args:
      key: one PRNG key, typed or raw.
      num: M, the number of draws.
      minval, maxval: int32 scalars (Python ints or traced), the range ``[minval, maxval)``.

    Returns:
      int32 array [M].
    """
    if not jax.dtypes.issubdtype(jnp.result_type(key), jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    lo, hi = jnp.asarray(minval), jnp.asarray(maxval)
    if not fused_draw(key) or any(v.dtype != jnp.int32 or v.ndim for v in (lo, hi)):
        return jax.random.randint(key, (num,), minval, maxval, dtype=jnp.int32)

    data = jax.random.key_data(key)

    def bits():
        # split(key): key j is both words of the hash of the counter (0, j).
        a = _threefry2(data[..., 0], data[..., 1], np.uint32(0), np.uint32(0))
        b = _threefry2(data[..., 0], data[..., 1], np.uint32(0), np.uint32(1))
        i = lax.iota(jnp.uint32, num)
        return _threefry(*a, i), _threefry(*b, i)

    def reduce(high, low):
        span = jnp.where(hi <= lo, np.uint32(1), lax.convert_element_type(hi - lo, jnp.uint32))
        c = lax.rem(np.uint32(1 << 16), span)
        c = lax.rem(c * c, span)
        offset = lax.rem(lax.rem(high, span) * c + lax.rem(low, span), span)
        return lo + lax.convert_element_type(offset, jnp.int32)

    # The bits go to memory and the remainders run in a pass of their own: fused with the hash,
    # the integer divisions keep XLA:CPU from vectorizing the whole loop (measured 1.3x slower for
    # a constant span, 2.2x for a traced one).
    return reduce(*buffered(data[..., 0], bits))


def _in_memory(key: Any, fused: Any, plain: Any) -> Any:
    """``fused()`` computed into a buffer for a key :func:`fused_draw` takes, else ``plain()``."""
    if not fused_draw(key):
        return plain()
    return buffered(jax.random.key_data(key)[..., 0], fused)


def buffered(word: Any, compute: Any) -> Any:
    """``compute()`` computed into memory: inside a conditional on the scalar ``word`` (uint32 or
    float32; a value XLA does not know at compile time, e.g. a word of the round's key or an entry
    of x), which XLA neither fuses into the conditional's consumers nor removes, so its output is a
    buffer that they read instead of an elementwise program they each evaluate again per element
    they read (or, for rows of x, a copy taken before x is overwritten in place)."""
    # Always true (a float is equal to itself or NaN), but not known to XLA; the branches agree.
    floating = jnp.issubdtype(jnp.result_type(word), jnp.floating)
    witness = word if floating else lax.bitcast_convert_type(word, jnp.float32)
    return lax.cond((witness == witness) | (witness != witness), compute, compute)


def _mix32(h: Any) -> Any:
    """murmur3's 32-bit finaliser, a bijection of uint32 that spreads every input bit."""
    h = (h ^ (h >> np.uint32(16))) * np.uint32(0x85EBCA6B)
    h = (h ^ (h >> np.uint32(13))) * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def hashed_coins(key: Any, num: int, p: Any) -> Any:
    """Coins up with probability 1 - p, bool [M] (M = ``num``), from a cheap keyed hash instead of
    threefry: not ``jax.random``'s bits, about half the cost of :func:`coins` per coin on XLA:CPU
    (``with_failures(..., coins="hash")``).

    Coin i is up iff ``u_i >= p``, ``u_i`` the top 23 bits of ``h_i`` as a float in [0, 1), with

    .. math::  h_i = \\mathrm{fmix}(\\mathrm{fmix}((i \\phi) \\oplus a) \\oplus b)

    fmix murmur3's finaliser, phi the golden-ratio constant 0x9E3779B9 and (a, b) two words drawn
    from ``key`` by ``jax.random.bits``: a new pair every round, and i -> h_i a bijection of the
    32-bit counters for each pair (no two coins of a round share their hash).
    """
    a, b = jax.random.bits(key, (2,), jnp.uint32)

    def compute():
        h = _mix32(_mix32(lax.iota(jnp.uint32, num) * np.uint32(0x9E3779B9) ^ a) ^ b)
        return _to_unit(h) >= p

    return buffered(a, compute)
