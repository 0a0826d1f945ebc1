"""The round driver: one ``lax.scan`` over communication rounds for every kind of run.

Consensus (:mod:`jaxgossip.engine.consensus`), optimization (:mod:`jaxgossip.engine.optimization`) and training
(:mod:`jaxgossip.engine.training`) are programs for this driver. A program is a pure ``round_fn(carry, x)
-> (carry, record)``: ``carry`` is any pytree the program carries from round to round (params,
algorithm and optimizer state, counters, a PRNG key, and whatever per-round extras a program
needs: clocks, masks, delayed messages), ``x`` the round's slice of ``xs`` (per-round inputs such
as keys, or None) and ``record`` what the round reports (a pytree of arrays, stacked over rounds).

Rounds are grouped into *points*: with ``every = P`` the driver runs P rounds, then
``point_fn(carry, records) -> point`` turns the carry and the P stacked records into one point
(an evaluation); the run returns the points stacked, ``[num_points, ...]``. With ``every = 1`` and
no ``point_fn`` every round is a point and its record is returned as is. A run split into chunks
of whole points (a progress bar, checkpoints between chunks) is bitwise the same run: the carry is
the whole state, so ``run_rounds(f, run_rounds(f, c, 2 P)[0], P)`` equals ``run_rounds(f, c, 3 P)``.

Keys: one schedule for every program. A program carries its PRNG key in its carry and starts
each round with ``key, *round_keys = jax.random.split(key, 1 + m)`` (:func:`next_keys`): the
first key is the carry's key for the next round, the other m are the round's own keys (consensus
m = 1: the algorithm's key; optimization m = 2: communication and local steps; training m = 3:
batches, augmentation and communication). The stream depends on the initial key only, never on how
the run is chunked, checkpointed or resumed, and :func:`round_keys` materialises it for
references that drive an algorithm round by round outside the driver.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["run_rounds", "next_keys", "round_keys", "RoundFn", "PointFn"]

RoundFn = Callable[[Any, Any], tuple[Any, Any]]  # (carry, x) -> (carry, record)
PointFn = Callable[[Any, Any], Any]  # (carry, records stacked over the point's rounds) -> point


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive Python int (it fixes the scan length)")
    return int(value)


def next_keys(key: Any, num: int) -> tuple[Any, tuple[Any, ...]]:
    """The key schedule's step: ``(next_key, (k_1, ..., k_m))`` from ``split(key, 1 + m)``.

    Args:
      key: the carry's PRNG key for this round (typed, ``jax.random.key``).
      num: m, how many keys the round itself uses (static, >= 1).
    """
    keys = jax.random.split(key, 1 + _check_count("num", num))
    return keys[0], tuple(keys[i] for i in range(1, 1 + num))


def round_keys(key: Any, num_rounds: int, num: int = 1) -> Any:
    """The keys :func:`next_keys` hands to rounds 1..S from ``key``: shape ``[S, m]`` (``[S]`` if m = 1).

    Row r is what round r + 1 of a program carrying ``key`` receives, so a reference loop that
    feeds ``round_keys(key, S)[r]`` to ``alg.step`` sees the keys :func:`jaxgossip.run_consensus`
    uses.
    """
    num_rounds = _check_count("num_rounds", num_rounds)
    num = _check_count("num", num)

    def body(k, _):
        k, subs = next_keys(k, num)
        return k, jnp.stack(subs)

    _, keys = jax.lax.scan(body, key, None, length=num_rounds)
    return keys[:, 0] if num == 1 else keys


def run_rounds(
    round_fn: RoundFn,
    carry: Any,
    num_points: int,
    xs: Any = None,
    *,
    every: int = 1,
    point_fn: PointFn | None = None,
    remat: bool = False,
    checkpoint_every: int | None = None,
) -> tuple[Any, Any]:
    """Runs ``num_points * every`` rounds of ``round_fn`` in one ``lax.scan`` (pure, jittable, vmappable).

    Args:
      round_fn: ``(carry, x) -> (carry, record)``, one round.
      carry: the initial carry (any pytree).
      num_points: number of points (static).
      xs: per-round inputs with a leading axis of ``num_points * every`` (leaves ``[S, ...]``,
        ``S = num_points * every``), or None (``round_fn`` then receives None).
      every: P, rounds per point (static).
      point_fn: ``(carry, records) -> point`` with records stacked over the P rounds of the
        point (leaves ``[P, ...]``); None returns the records themselves (leaves
        ``[num_points, P, ...]``, or ``[num_points, ...]`` when ``every == 1``).
      remat: rematerialise every round under reverse-mode differentiation (``jax.checkpoint`` of
        ``round_fn``): the gradient of an S-round run then stores the S carries between rounds
        instead of every round's intermediates, and recomputes one round at a time on the way
        back. The forward values are the same.
      checkpoint_every: C, or None. With C (``every == 1`` and no ``point_fn`` only; C must
        divide ``num_points``) the rounds run as ``num_points / C`` chunks of C rounds, each chunk
        rematerialised (``jax.checkpoint`` of a scan of C rounds): the gradient stores one carry
        per chunk and, while it goes back through a chunk, that chunk's C carries (its rounds
        rematerialised too with ``remat``), so memory grows as ``S / C + C`` instead of S; with
        ``C ~ sqrt(S)`` as ``sqrt(S)``, for about one more forward pass of compute. Same values.

    Returns:
      ``(carry, points)``: the final carry and the points stacked (leaves ``[num_points, ...]``).
    """
    num_points = _check_count("num_points", num_points)
    every = _check_count("every", every)
    if not isinstance(remat, bool):
        raise TypeError(f"remat={remat!r} must be a bool")
    if remat:
        round_fn = jax.checkpoint(round_fn)
    if checkpoint_every is not None:
        chunk = _check_count("checkpoint_every", checkpoint_every)
        if every != 1 or point_fn is not None:
            raise ValueError("checkpoint_every needs every=1 and no point_fn (chunks of single rounds)")
        if num_points % chunk:
            raise ValueError(f"checkpoint_every={chunk} must divide the number of rounds {num_points}")
        return _chunked(round_fn, carry, xs, num_points // chunk, chunk)
    if every == 1 and point_fn is None:
        return jax.lax.scan(round_fn, carry, xs, length=num_points)
    if xs is not None:
        xs = jax.tree_util.tree_map(lambda a: a.reshape((num_points, every) + a.shape[1:]), xs)

    def point(carry, point_xs):
        carry, records = jax.lax.scan(round_fn, carry, point_xs, length=every)
        return carry, (records if point_fn is None else point_fn(carry, records))

    return jax.lax.scan(point, carry, xs, length=num_points)


def _chunked(round_fn: RoundFn, carry: Any, xs: Any, num_chunks: int, chunk: int) -> tuple[Any, Any]:
    """``num_chunks * chunk`` rounds as a scan over checkpointed chunks of ``chunk`` rounds; the
    records come back stacked over rounds (leaves ``[num_chunks * chunk, ...]``)."""
    if xs is not None:
        xs = jax.tree_util.tree_map(lambda a: a.reshape((num_chunks, chunk) + a.shape[1:]), xs)

    @jax.checkpoint
    def run_chunk(carry, chunk_xs):
        return jax.lax.scan(round_fn, carry, chunk_xs, length=chunk)

    carry, records = jax.lax.scan(run_chunk, carry, xs, length=num_chunks)
    return carry, jax.tree_util.tree_map(lambda a: a.reshape((num_chunks * chunk,) + a.shape[2:]), records)
