"""The Base-(k+1) graph: a time-varying graph of maximum degree k whose period averages exactly, for any N.

Takezawa, Sato, Bao, Niwa, Yamada, "Beyond Exponential Graph: Communication-Efficient Topologies for
Decentralized Learning via Finite-time Convergence", NeurIPS 2023 (arXiv:2305.11420).

Building blocks (each round is a set of disjoint groups that average among themselves):

* the *k-peer hyper-hypercube* of m nodes whose prime factors are all <= k + 1: write
  ``m = f_1 f_2 ... f_r`` with every ``f_t <= k + 1`` (greedily, largest factor first, as the paper
  does); label the nodes in mixed radix ``(d_1, ..., d_r)``; round t averages each clique of the
  ``f_t`` nodes that differ only in digit t (weights ``1 / f_t``, degree ``f_t - 1 <= k``). The
  product of the r rounds is the tensor product of the ``J_{f_t} / f_t``, i.e. ``J / m``.
* the *simple Base-(k+1) graph* of any m: write m in base k + 1,
  ``m = sum_l a_l (k+1)^{p_l}`` (``p_1 > p_2 > ...``, digits ``a_l`` in 1..k), and split the nodes
  into blocks ``V_l`` of ``a_l (k+1)^{p_l}`` nodes, each cut into ``a_l`` sub-blocks of
  ``(k+1)^{p_l}``. (1) Every ``V_l`` averages itself with its hyper-hypercube. (2) For l = 1, ...,
  L - 1 in turn (one round each), every node of ``V_{>l}`` links to one fresh node in each of the
  ``a_l`` sub-blocks of ``V_l`` (there are enough: ``|V_{>l}| < (k+1)^{p_l}``), with weight
  ``n_l / (S_l a_l)`` on each link (``n_l = |V_l|``, ``S_l = |V_{>=l}|``). (3) Right after its
  round, every sub-block of ``V_l`` averages itself with its hyper-hypercube. After round l of
  (2) the nodes of ``V_{>l}`` hold ``sum_{j<=l} (n_j / m) xbar_j + (S_{l+1} / m) xbar_own``, so
  ``V_L`` ends at the average, and every sub-block of ``V_l`` then holds the average's mass
  (checked in the tests to 1e-12); T = ``H_1 + p_1 + 1`` rounds with ``H_1`` the hyper-hypercube
  length of ``V_1``.
* the *Base-(k+1) graph* of N: with ``N = N_s N_r``, ``N_s`` the largest divisor of N whose prime
  factors are <= k + 1, run ``N_s`` simple Base-(k+1) graphs of ``N_r`` consecutive nodes side by
  side, then ``N_r`` hyper-hypercubes of ``N_s`` nodes (one node from each block); if the simple
  Base-(k+1) graph of all N nodes has a strictly shorter period, use it instead.

Where we depart from the authors' code (yukiTakezawa/BaseGraph): a block whose hyper-hypercube has
finished idles (self weight 1) instead of repeating its rounds, and the optional links among the
unlinked nodes of ``V_l`` in phase (2) are left out; both only average nodes that already hold equal
values, so the matrices' product is the same, with fewer messages.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxgossip.checks import check_int
from jaxgossip.topology.constructors import from_edges
from jaxgossip.topology.edges import merge_round
from jaxgossip.topology.graph import Topology

__all__ = ["base_graph", "hyper_hypercube_factors", "smooth_part"]

# One round as (senders, receivers, weights) lists of arrays (duplicates summed by from_edges).
_Round = list
# Nodes per block where a clique round is written column by column.
_NODE_BLOCK = 1 << 16


def smooth_part(n: int, k: int) -> int:
    """The largest divisor of n whose prime factors are all <= k + 1."""
    part, rest = 1, n
    for p in range(2, k + 2):
        while rest % p == 0:
            part, rest = part * p, rest // p
    return part


def hyper_hypercube_factors(m: int, k: int) -> list[int]:
    """``m = f_1 ... f_r`` with each ``2 <= f_t <= k + 1``, taken greedily largest first, in
    ascending order (the round lengths of the k-peer hyper-hypercube); [] for m = 1.

    Raises:
      ValueError: if m has a prime factor > k + 1.
    """
    factors, rest = [], m
    for f in range(k + 1, 1, -1):
        while rest % f == 0:
            factors.append(f)
            rest //= f
    if rest != 1:
        raise ValueError(f"m={m} has a prime factor > k + 1 = {k + 1}: no {k}-peer hyper-hypercube")
    return sorted(factors)


def _node_ids(n: int) -> np.ndarray:
    """[N] node ids in the tables' int32 (int64 beyond it): every round's index arrays then take
    half the memory of int64, and from_edges stores the same values."""
    return np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)


class _Clique(NamedTuple):
    """One round of the hyper-hypercube on the consecutive nodes ``first .. first + m - 1``: node
    ``a f stride + d stride + b`` (digit d) averages with the f nodes ``a f stride + j stride + b``,
    j < f, weights ``1 / f``. Canonical as written (rows by node, senders ascending); ``write``
    puts it into from_edges' table rows without arrays of its own."""

    first: int
    m: int
    stride: int
    f: int

    def num_edges(self, n: int) -> int:
        return self.m * self.f

    def write(self, n: int, out: tuple) -> tuple:
        senders, receivers, weights = (row[: self.m * self.f] for row in out)
        dtype, f, stride = senders.dtype.type, self.f, self.stride
        rows, own = senders.reshape(self.m, f), receivers.reshape(self.m, f)
        for lo in range(0, self.m, _NODE_BLOCK):
            hi = min(self.m, lo + _NODE_BLOCK)
            # Node i (digit d at this stride) takes from i + (j - d) stride, j < f: one column
            # per j over a block of nodes (long inner loops, index arrays in cache).
            nodes = np.arange(self.first + lo, self.first + hi, dtype=dtype)
            digit = np.arange(lo, hi, dtype=dtype) // dtype(stride) % dtype(f)
            start = nodes - digit * dtype(stride)
            for j in range(f):
                np.add(start, dtype(j * stride), out=rows[lo:hi, j])
            own[lo:hi] = nodes[:, None]
        weights[...] = 1.0 / f
        return senders, receivers, weights

    def arrays(self, dtype) -> tuple:
        size = self.m * self.f
        return self.write(0, (np.empty(size, dtype), np.empty(size, dtype), np.empty(size)))


def _edges(part, dtype) -> tuple:
    """A round's part as (senders, receivers, weights) arrays."""
    return part.arrays(dtype) if isinstance(part, _Clique) else part


def _clique_rounds(nodes: np.ndarray, factors: list[int]) -> list:
    """The hyper-hypercube on ``nodes`` (``len(nodes) = prod(factors)``): one part per factor, a
    :class:`_Clique` for consecutive ids (written where it is stored), else (s, r, w) arrays."""
    m = nodes.size
    # Consecutive ids (the whole graph, or one block of it): member j of a clique is an offset
    # from the first node, no gather.
    consecutive = m > 0 and int(nodes[-1]) - int(nodes[0]) == m - 1 and bool(np.all(nodes[1:] > nodes[:-1]))
    rounds, stride = [], 1
    for f in factors:
        if consecutive:
            rounds.append(_Clique(int(nodes[0]), m, stride, f))
        else:
            members = _Clique(0, m, stride, f).arrays(np.int64)[0]
            rounds.append((nodes[members], np.repeat(nodes, f), np.full(m * f, 1.0 / f)))
        stride *= f
    return rounds


def _base_digits(m: int, k: int) -> list[tuple[int, int]]:
    """``m = sum a (k+1)^p`` as [(a, p), ...] with p descending and a in 1..k."""
    digits, p = [], 0
    while (k + 1) ** (p + 1) <= m:
        p += 1
    rest = m
    for q in range(p, -1, -1):
        a, rest = divmod(rest, (k + 1) ** q)
        if a:
            digits.append((a, q))
    return digits


def _simple_rounds(nodes: np.ndarray, k: int) -> list[_Round]:
    """The simple Base-(k+1) graph on ``nodes``: a list of rounds, each a list of (s, r, w)."""
    m = nodes.size
    if smooth_part(m, k) == m:
        return [[r] for r in _clique_rounds(nodes, hyper_hypercube_factors(m, k))]
    digits = _base_digits(m, k)
    sizes = [a * (k + 1) ** p for a, p in digits]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    blocks = [nodes[starts[i] : starts[i + 1]] for i in range(len(sizes))]
    head = len(hyper_hypercube_factors(sizes[0], k))
    p_first = digits[0][1]
    rounds: list[_Round] = [[] for _ in range(head + p_first + 1)]
    # (1) every block averages itself
    for block, size in zip(blocks, sizes):
        for t, part in enumerate(_clique_rounds(block, hyper_hypercube_factors(size, k))):
            rounds[t].append(part)
    for l in range(len(blocks) - 1):
        a, p = digits[l]
        sub = (k + 1) ** p
        later = np.concatenate(blocks[l + 1 :])  # V_{>l}, fewer than sub nodes
        share = sizes[l] / int(starts[-1] - starts[l])  # n_l / S_l
        # (2) round head + l: each node of V_{>l} links to node i of every sub-block of V_l
        partners = blocks[l][(np.arange(a)[:, None] * sub + np.arange(later.size)[None, :])]  # [a, |V_{>l}|]
        later_rep = np.broadcast_to(later, partners.shape)
        link = share / a
        rounds[head + l].append(
            (
                np.concatenate([partners.ravel(), later_rep.ravel(), later, partners.ravel()]),
                np.concatenate([later_rep.ravel(), partners.ravel(), later, partners.ravel()]),
                np.concatenate(
                    [
                        np.full(partners.size, link),
                        np.full(partners.size, link),
                        np.full(later.size, 1.0 - share),
                        np.full(partners.size, 1.0 - link),
                    ]
                ),
            )
        )
        # (3) then every sub-block of V_l averages itself
        for s in range(a):
            part = blocks[l][s * sub : (s + 1) * sub]
            for t, piece in enumerate(_clique_rounds(part, [k + 1] * p)):
                rounds[head + l + 1 + t].append(piece)
    return rounds


def _simple_period(m: int, k: int) -> int:
    """T of the simple Base-(k+1) graph of m nodes (the length of :func:`_simple_rounds`)."""
    if smooth_part(m, k) == m:
        return len(hyper_hypercube_factors(m, k))
    digits = _base_digits(m, k)
    a, p = digits[0]
    return len(hyper_hypercube_factors(a * (k + 1) ** p, k)) + p + 1


class _Tiled(NamedTuple):
    """A round of ``copies`` disjoint blocks of ``size`` consecutive nodes, each block's edges
    those of one canonical round ``senders, receivers, weights`` on nodes ``0 .. size - 1``
    shifted to the block: canonical, and written into from_edges' table rows by broadcasts, so
    that N / size side-by-side simple graphs take O(E) array operations, not a loop over blocks."""

    senders: np.ndarray  # [M] canonical, ids below size
    receivers: np.ndarray  # [M]
    weights: np.ndarray  # [M] float64
    size: int
    copies: int

    def num_edges(self, n: int) -> int:
        return self.copies * self.senders.size

    def write(self, n: int, out: tuple) -> tuple:
        count = self.senders.size
        senders, receivers, weights = (row[: self.copies * count].reshape(self.copies, count) for row in out)
        dtype = senders.dtype.type
        starts = np.arange(self.copies, dtype=senders.dtype)[:, None] * dtype(self.size)
        np.add(starts, self.senders.astype(senders.dtype)[None, :], out=senders)
        np.add(starts, self.receivers.astype(receivers.dtype)[None, :], out=receivers)
        weights[...] = self.weights[None, :]
        return senders.reshape(-1), receivers.reshape(-1), weights.reshape(-1)


def _factored_rounds(n: int, k: int) -> list:
    """The Base-(k+1) schedule of n nodes (see the module docstring): per round its parts, or one
    :class:`_Tiled` or :class:`_Clique` round over all nodes."""
    nodes = _node_ids(n)
    smooth = smooth_part(n, k)
    rest = n // smooth
    if rest == 1 or smooth == 1:
        return _simple_rounds(nodes, k)
    factors = hyper_hypercube_factors(smooth, k)
    if _simple_period(n, k) < _simple_period(rest, k) + len(factors):
        return _simple_rounds(nodes, k)
    # Block b (nodes b rest .. b rest + rest - 1) runs the simple graph of rest nodes: its rounds,
    # written once on nodes 0 .. rest - 1, tiled over the blocks.
    local = _node_ids(rest)
    rounds: list = [
        _Tiled(*merge_round(*_round_edges(parts, local), rest), size=rest, copies=smooth)
        for parts in _simple_rounds(local, k)
    ]
    # Then the hyper-hypercube of the nodes b rest + c (c fixed) across the blocks: node i's
    # clique differs from i in one digit of b, i.e. one clique round over all N nodes at stride
    # rest times the digit's.
    stride = rest
    for f in factors:
        rounds.append([_Clique(0, n, stride, f)])
        stride *= f
    return rounds


def _round_edges(parts: list, nodes: np.ndarray) -> tuple:
    """One round's parts on ``nodes`` (ids 0 .. N - 1) as concatenated (senders, receivers,
    weights), the nodes no part touches idling with a self-loop of weight 1 (last)."""
    n = nodes.size
    busy = np.zeros(n, dtype=bool)
    for part in parts:
        if isinstance(part, _Clique):
            busy[part.first : part.first + part.m] = True
        else:
            busy[part[1]] = True
    idle = nodes[~busy]
    parts = [_edges(part, nodes.dtype) for part in parts]
    s = np.concatenate([p[0] for p in parts] + [idle])
    r = np.concatenate([p[1] for p in parts] + [idle])
    w = np.concatenate([p[2] for p in parts] + [np.ones(idle.size)])
    return s, r, w


def base_graph(n: int, max_degree: int = 1) -> Topology:
    """The Base-(k+1) graph: T rounds of degree <= k whose product is exactly ``J = 11^T / N``.

    A time-varying undirected graph for any N and any maximum degree k: every ``W(t)`` is symmetric
    and doubly stochastic, each node has at most k neighbours per round, and
    ``W(T-1) ... W(0) = J / N`` exactly, so gossip with ``gamma = 1`` reaches the exact average after
    one period. T is at most about ``2 log_{k+1}(N) + 2``; for N a power of k + 1 it is the
    hyper-hypercube with ``T = log_{k+1} N``. The construction is in the module docstring.

    .. math::  \\prod_{t=0}^{T-1} W(t) = \\tfrac1N \\mathbf 1 \\mathbf 1^\\top, \\quad
        \\max_i |\\{j \\ne i : W(t)_{ij} > 0\\}| \\le k

    Args:
      n: number of nodes N >= 2.
      max_degree: k >= 1, the most peers a node talks to in a round (``"base:K"`` in specs).

    Returns:
      A time-varying :class:`Topology` with period T (nodes idle in a round keep weight 1).

    References:
      Takezawa, Sato, Bao, Niwa, Yamada, "Beyond Exponential Graph: Communication-Efficient
      Topologies for Decentralized Learning via Finite-time Convergence", NeurIPS 2023
      (arXiv:2305.11420).
    """
    n = check_int("n", n, 2)
    k = check_int("max_degree", max_degree, 1)
    out = []
    for parts in _factored_rounds(n, k):
        if isinstance(parts, _Tiled):
            out.append(parts)
        elif len(parts) == 1 and isinstance(parts[0], _Clique) and parts[0].m == n:
            out.append(parts[0])  # one clique round over every node: written in place
        else:
            out.append(_round_edges(parts, _node_ids(n)))
    return from_edges(f"base_graph({n}, k={k})", n, out, directed=False)
