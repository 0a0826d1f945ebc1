"""A keyed pseudo-random permutation of ``[0, N)`` evaluated elementwise: a Feistel network on the
bits of the index, restricted to ``[0, N)`` by cycle walking.

``jax.random.permutation`` draws a uniformly random permutation by sorting random 32-bit keys, a
comparison sort of N elements (or several); at N = 2^20 on XLA:CPU that sort costs hundreds of
milliseconds. A Feistel network instead computes ``pi(i)`` and ``pi^{-1}(i)`` for every i
independently, in O(N) elementwise work with no sort, no scatter and no gather, which is what a
random matching drawn every round needs (:func:`feistel_matching`).

The price: the permutation is pseudo-random, one of at most ``2^(32 R)`` keyed bijections
(R rounds of 32-bit round keys, :func:`num_rounds`), not a uniform draw from all N! permutations. Matchings built from
it are close to uniform in their pairing statistics, but not exactly uniform over matchings.

Rule. Let ``b = max(2, ceil(log2 N))``, ``h = floor(b / 2)``. Round r (of R) of the network splits a
b-bit value into a top part ``a`` of ``n_r`` bits and a bottom part ``c`` of ``b - n_r`` bits
(``n_r = b - h`` for even r, h for odd r) and returns ``(c << n_r) | (a XOR (F(c, k_r) mod
2^n_r))``, a bijection of ``[0, 2^b)``; the top part of the output has the bottom part's width, so
the widths alternate and an odd b needs no padding. ``F`` is a 32-bit integer hash (murmur3's
finaliser of ``c XOR k_r``). Cycle walking applies the network again while the value is ``>= N``,
which yields a bijection of ``[0, N)`` (the walk stays on the cycle of i, and ``2^b < 2N`` keeps
the expected walk below 2 steps).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["feistel_bits", "num_rounds", "feistel_permute", "feistel_matching"]


def feistel_bits(n: int) -> int:
    """b, the bit width of the network's domain ``[0, 2^b)`` for N values: ``max(2, ceil(log2 N))``."""
    return max(2, (int(n) - 1).bit_length())


def num_rounds(bits: int) -> int:
    """R, the rounds of the network on b bits: ``max(4, 2 ceil(24 / b))``.

    Four rounds make a pseudo-random permutation from random round functions (Luby-Rackoff), and
    at b >= 12 four rounds of murmur3's finaliser showed no pairing bias (six cost 1.5-2x more per
    draw at N = 2^20). Halves of a few bits admit few distinct round functions, and four rounds
    left the pairing frequencies of N <= 64 measurably biased (up to 14 standard errors at N = 5
    to 12 over 4000 rounds); 2 ceil(24 / b) rounds brought them to the noise (within 3.2).
    """
    return max(4, 2 * -(-24 // bits))


def _hash(c: Any, k: Any) -> Any:
    """murmur3's 32-bit finaliser of ``c XOR k`` (uint32 in, uint32 out)."""
    h = c ^ k
    h = (h ^ (h >> 16)) * jnp.uint32(0x85EBCA6B)
    h = (h ^ (h >> 13)) * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _widths(bits: int) -> list[int]:
    """n_r, the width of the top part that round r rewrites, for r = 0 .. R - 1."""
    half = bits // 2
    return [bits - half if r % 2 == 0 else half for r in range(num_rounds(bits))]


def _network(v: Any, round_keys: Any, bits: int, inverse: bool, first: tuple | None = None) -> Any:
    """The Feistel network (or its inverse) on uint32 values in ``[0, 2^bits)``; ``first``, when
    given, is the split ``(v >> w, v & (2^w - 1))`` of v that the first round applied reads."""
    widths = _widths(bits)
    if not inverse:
        for r, top in enumerate(widths):
            if r == 0 and first is not None:
                a, c = first
            else:
                a, c = v >> (bits - top), v & jnp.uint32((1 << (bits - top)) - 1)
            a = a ^ (_hash(c, round_keys[r]) & jnp.uint32((1 << top) - 1))
            v = (c << top) | a
        return v
    for r in reversed(range(len(widths))):
        top = widths[r]
        # The forward round wrote c (bits - top wide) on top of the rewritten a (top wide).
        if r == len(widths) - 1 and first is not None:
            c, a = first
        else:
            c, a = v >> top, v & jnp.uint32((1 << top) - 1)
        a = a ^ (_hash(c, round_keys[r]) & jnp.uint32((1 << top) - 1))
        v = (a << (bits - top)) | c
    return v


def _first_split(n: int, bits: int, inverse: bool) -> tuple:
    """``(v >> w, v & (2^w - 1))`` for ``v = 0 .. N - 1``, w the low width of the network's first
    round, read off the two axes of a ``[ceil(N / 2^w), 2^w]`` iota.

    Why not ``arange(N) >> w``: those per-node tables depend on nothing that changes from round to
    round, so inside a compiled loop XLA hoists them out and reads them back from memory in every
    round (two N-element uint32 tables) instead of computing them in the fused draw; an iota
    that is only reshaped and sliced stays inside the draw. Same values, so the same bits.
    """
    widths = _widths(bits)
    low = widths[-1] if inverse else bits - widths[0]
    shape = (-(-n // (1 << low)), 1 << low)
    return tuple(jax.lax.broadcasted_iota(jnp.uint32, shape, axis).reshape(-1)[:n] for axis in (0, 1))


def feistel_permute(key: Any, n: int, i: Any = None, inverse: bool = False) -> Any:
    """``pi(i)`` (or ``pi^{-1}(i)``) of the keyed pseudo-random permutation pi of ``[0, N)``.

    Elementwise: every entry of ``i`` is mapped on its own, O(R) integer operations per
    entry and step of cycle walking (R = :func:`num_rounds`) (a ``lax.while_loop`` runs until no entry lies outside
    ``[0, N)``; none does when N is a power of two).

    Args:
      key: a PRNG key; it fixes pi (its R 32-bit round keys).
      n: N >= 1, static.
      i: integer array of indices in ``[0, N)``, any shape; None: all of them, ``arange(N)``
        (computed inside the draw, so that a compiled loop does not carry per-node tables).
      inverse: map by ``pi^{-1}`` instead.

    Returns:
      int32 array like ``i`` (``[N]`` for None).
    """
    bits = feistel_bits(n)
    return _permute(jax.random.bits(key, (num_rounds(bits),), jnp.uint32), n, i, inverse)


def _permute(round_keys: Any, n: int, i: Any, inverse: bool) -> Any:
    """:func:`feistel_permute` from the network's round keys ``[R]`` uint32."""
    bits = feistel_bits(n)
    if i is None:
        v = _network(None, round_keys, bits, inverse, _first_split(n, bits, inverse))
    else:
        v = _network(jnp.asarray(i).astype(jnp.uint32), round_keys, bits, inverse)
    if n != 1 << bits:
        outside = jnp.uint32(n)

        def walk(v):
            return jnp.where(v >= outside, _network(v, round_keys, bits, inverse), v)

        v = jax.lax.while_loop(lambda v: jnp.any(v >= outside), walk, v)
    return v.astype(jnp.int32)


def feistel_matching(key: Any, n: int) -> Any:
    """The partner of every node in the matching that pairs positions ``(2m, 2m + 1)`` of the
    keyed permutation pi: node i at position ``p = pi^{-1}(i)`` is paired with ``pi(p XOR 1)``;
    for odd N the node at position N - 1 is unmatched (its own partner).

    .. math::  \\text{partner}(i) = \\pi(\\pi^{-1}(i) \\oplus 1)

    Args:
      key: a PRNG key (fixes pi).
      n: N >= 2, static.

    Returns:
      partner ``[N]`` int32, an involution of ``[0, N)``: no fixed point for even N, one for odd N.
    """
    # One draw of the round keys for both directions: inside a compiled loop XLA hoists parts of
    # each draw's key schedule before it could merge two equal draws, and then runs both.
    round_keys = jax.random.bits(key, (num_rounds(feistel_bits(n)),), jnp.uint32)
    mate = _permute(round_keys, n, None, inverse=True) ^ 1
    if n % 2 == 0:
        return _permute(round_keys, n, mate, inverse=False)
    # Odd N: the last position's mate N lies outside the domain; map an in-range stand-in, keep i.
    inside = mate < n
    partner = _permute(round_keys, n, jnp.where(inside, mate, 0), inverse=False)
    return jnp.where(inside, partner, jnp.arange(n, dtype=jnp.int32))
