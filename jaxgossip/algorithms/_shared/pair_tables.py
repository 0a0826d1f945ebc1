"""Oriented node pairs of an undirected graph and the slot tables of edge-wise algorithms.

PowerGossip keeps state per undirected edge ``e = (a, b)``, ``a < b`` (a pair), not per node. This
module turns a topology's public edge list (``senders``, ``receivers``, ``weights`` [T, E]) into
host-side NumPy tables, once, at construction:

* :func:`oriented_pairs`: per round, every pair with ``W_t[a, b]`` and ``W_t[b, a]`` ([T, P']);
* :func:`pair_tables`: the union of the pairs over all rounds (P) and, per round, the slot of each
  pair at each of its two endpoints (``[T, N, K]``), so a node works on its own K incident pairs
  without gathering anything per edge;
* :func:`pair_round`: the tables of one round as device arrays (static or traced round counter).

Host-side construction is NumPy and not jittable (graphs are index arrays).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxgossip.types import Array

__all__ = [
    "OrientedPairs",
    "PairTables",
    "PairRound",
    "oriented_pairs",
    "require_symmetric",
    "pair_tables",
    "pair_round",
]

_SYM_TOL = 1e-6


class OrientedPairs(NamedTuple):
    """Per-round unordered pairs ``{a, b}``, ``a < b``, sorted by ``(a, b)`` (NumPy).

    P' = the largest number of pairs in one round; padding pairs are ``(0, 0)`` with weights 0.
    """

    a: np.ndarray  # [T, P'] int32, smaller endpoint
    b: np.ndarray  # [T, P'] int32, larger endpoint
    w_ab: np.ndarray  # [T, P'] float64, W_t[a, b]: what a takes from b
    w_ba: np.ndarray  # [T, P'] float64, W_t[b, a]: what b takes from a


class PairTables(NamedTuple):
    """Edge-list and node-slot tables of a symmetric topology (NumPy, host side).

    P = pairs that are an edge in at least one round, sorted by ``(a, b)``; K = the largest number
    of pairs at one node in one round.
    """

    a: np.ndarray  # [P] int, smaller endpoint
    b: np.ndarray  # [P] int, larger endpoint
    inc: np.ndarray  # [T, N, K] int32, pair in slot k of node i (padding: pair 0)
    coef: np.ndarray  # [T, N, K] float32, +W_ab on the a side, -W_ba on the b side, 0 for padding
    flat_a: np.ndarray  # [T, P] int32, i * K + k of the pair's slot at node a (0 when inactive)
    flat_b: np.ndarray  # [T, P] int32, same at node b
    active: np.ndarray  # [T, P] bool, the pair is an edge in round t
    degree: np.ndarray  # [T, N] int, neighbours of each node in round t


class PairRound(NamedTuple):
    """The rows of :class:`PairTables` that round ``t`` uses, as device arrays, and the pair ids."""

    inc: Array  # [N, K] int32, pair in slot k of node i
    coef: Array  # [N, K] float32, coefficient of the pair's update in x_i (+W_ab at a, -W_ba at b)
    flat_a: Array  # [P] int32, the pair's slot at node a in the flattened [N * K] slot axis
    flat_b: Array  # [P] int32, same at node b
    active: Array  # [P] bool, the pair is an edge this round
    degree: Array  # [N] int, neighbours of each node this round
    codes: Array  # [P] uint32, a * N + b: the pair's id, which seeds its shared randomness


def oriented_pairs(topology: Any) -> OrientedPairs:
    """The pairs of every round of ``topology`` with their two weights (self-loops and weight-0
    padding edges dropped; parallel edges summed)."""
    n = topology.num_nodes
    senders, receivers, weights = (np.asarray(x) for x in (topology.senders, topology.receivers, topology.weights))
    per_t = []
    for t in range(senders.shape[0]):
        keep = (weights[t] != 0) & (senders[t] != receivers[t])
        s, r, w = senders[t][keep], receivers[t][keep], weights[t][keep]
        lo, hi = np.minimum(s, r), np.maximum(s, r)
        uniq, inv = np.unique(lo.astype(np.int64) * n + hi, return_inverse=True)
        w_ab, w_ba = np.zeros(uniq.size), np.zeros(uniq.size)
        # Edge s -> r puts weight w on W[r, s]: it is W[a, b] when the receiver is the smaller end.
        np.add.at(w_ab, inv[r == lo], w[r == lo])
        np.add.at(w_ba, inv[r == hi], w[r == hi])
        per_t.append((uniq // n, uniq % n, w_ab, w_ba))
    width = max(1, max(x[0].size for x in per_t))
    out = [np.zeros((len(per_t), width), dtype=np.int32) for _ in range(2)]
    out += [np.zeros((len(per_t), width)) for _ in range(2)]
    for t, arrays in enumerate(per_t):
        for o, arr in zip(out, arrays):
            o[t, : arr.size] = arr
    return OrientedPairs(*out)


def require_symmetric(topology: Any, algorithm: str) -> None:
    """Raises ValueError unless every ``W(t)`` is symmetric, naming the first asymmetric entry."""
    a, b, w_ab, w_ba = oriented_pairs(topology)
    gap = np.abs(w_ab - w_ba)
    if np.any(gap > _SYM_TOL):
        t, p = np.unravel_index(np.argmax(gap), gap.shape)
        raise ValueError(
            f"{algorithm} needs a symmetric (undirected) mixing matrix, W(t) = W(t)^T in every "
            f"round; {topology.name} is not (directed={topology.directed}): round {t} has "
            f"W[{a[t, p]}, {b[t, p]}] = {w_ab[t, p]:.4g} but W[{b[t, p]}, {a[t, p]}] = {w_ba[t, p]:.4g}. "
            "Use an undirected graph, or a push-sum method for directed graphs"
        )


def pair_tables(topology: Any) -> PairTables:
    """Builds the :class:`PairTables` of a symmetric ``topology`` (host side, NumPy).

    In round t, node i's slot k holds one of its incident pairs e and the coefficient with which
    the pair's update enters x_i: ``+W_ab`` at ``a``, ``-W_ba`` at ``b``. ``flat_a`` / ``flat_b``
    locate the pair's slot at each endpoint in the flattened ``[N * K]`` slot axis, so a per-pair
    value is a difference of two gathered slot rows.
    """
    n, period = topology.num_nodes, topology.period
    a, b, w_ab, w_ba = oriented_pairs(topology)
    real = (w_ab != 0) | (w_ba != 0)
    codes = a.astype(np.int64) * n + b
    union = np.unique(codes[real])
    if union.size == 0:  # no edges at all: a dummy pair (0, 0) that is never active
        union = np.zeros(1, dtype=np.int64)
    num_pairs = union.size
    ends = []
    for t in range(period):
        e = np.searchsorted(union, codes[t][real[t]])
        nodes = np.concatenate([a[t][real[t]], b[t][real[t]]])
        ends.append((nodes, np.concatenate([e, e]), np.concatenate([w_ab[t][real[t]], -w_ba[t][real[t]]])))
    k = max([1] + [int(np.bincount(nodes, minlength=n).max()) for nodes, _, _ in ends if nodes.size])
    inc = np.zeros((period, n, k), dtype=np.int32)
    coef = np.zeros((period, n, k), dtype=np.float32)
    flat_a = np.zeros((period, num_pairs), dtype=np.int32)
    flat_b = np.zeros((period, num_pairs), dtype=np.int32)
    active = np.zeros((period, num_pairs), dtype=bool)
    degree = np.zeros((period, n), dtype=np.int64)
    for t, (nodes, e, c) in enumerate(ends):
        if nodes.size == 0:
            continue
        order = np.argsort(nodes, kind="stable")
        nodes, e, c = nodes[order], e[order], c[order]
        slot = np.arange(nodes.size) - np.searchsorted(nodes, nodes)
        inc[t, nodes, slot] = e
        coef[t, nodes, slot] = c
        flat = (nodes * k + slot).astype(np.int32)
        side_a = nodes == (union[e] // n)
        flat_a[t, e[side_a]] = flat[side_a]
        flat_b[t, e[~side_a]] = flat[~side_a]
        active[t, e] = True
        degree[t] = np.bincount(nodes, minlength=n)
    return PairTables(union // n, union % n, inc, coef, flat_a, flat_b, active, degree)


def pair_round(tables: PairTables, count: Any) -> PairRound:
    """Rows ``count mod T`` of the per-round tables (``count`` a Python int or a traced scalar)."""
    period = tables.inc.shape[0]

    def pick(table):
        if period == 1:  # static graph: a constant, no gather in the program
            return jnp.asarray(table[0])
        return jnp.asarray(table)[count % period]

    rows = (pick(t) for t in (tables.inc, tables.coef, tables.flat_a, tables.flat_b, tables.active, tables.degree))
    codes = jnp.asarray(tables.a * tables.inc.shape[1] + tables.b, jnp.uint32)
    return PairRound(*rows, codes)
