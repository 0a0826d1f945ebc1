"""EquiTopo: graphs whose consensus rate does not depend on N (static and one-peer dynamic).

Song, Li, Jin, Shi, Yan, Yin, Yuan, "Communication-Efficient Topologies for Decentralized Learning
with O(1) Consensus Rate", NeurIPS 2022 (arXiv:2210.07881); code kexinjinnn/EquiTopo.

Everything is built from the *basis* graphs ``A(u) = I / N + (N-1)/N P_u``, u in 1..N-1, with
``(P_u x)_i = x_{(i + u) mod N}``: receiver i keeps 1/N of its value and takes (N-1)/N from node
i + u. Their mean over u is exactly ``J = 11^T / N``, which is why random mixtures of a few of
them average fast at any N.

* :func:`d_equistatic`: ``W = (1/M) sum_m A(u_m)``, u_m drawn uniformly; directed, doubly
  stochastic, at most M in- and out-neighbours per node.
* :func:`u_equistatic`: ``W = (1/(2M)) sum_m (A(u_m) + A(u_m)^T)``; symmetric, at most 2M neighbours.
* :func:`od_equidyn`: every round ``W(t) = (1 - eta) I + eta A(u_t)``, u_t uniform in 1..N-1;
  one in-neighbour and one out-neighbour per node.
* :func:`ou_equidyn`: every round a matching along the shift u_t: starting at a uniform node s and
  going through the nodes in increasing order (cyclically), node i pairs with i + u_t if neither
  is paired yet; a pair mixes with ``(1 - eta) I + eta (I/N + (N-1)/N P)`` on its two nodes,
  unpaired nodes keep their value. Symmetric, one neighbour at most.

The dynamic graphs draw u_t (and s) from the round's key inside the compiled run, like
:func:`~jaxgossip.topology.random_matching`. The greedy matching of OU-EquiDyn runs without a
sequential loop: along each cycle of the shift the scan times of the pairs' first nodes increase
by ``c = min(u, N - u)`` between wrap-arounds, so the greedy choice has a closed form: node i
starts the pair (i, i + u) iff, with ``tau = (i - s) mod N``, ``floor(tau / c)`` is even and
``tau + c < N`` (tested against the sequential greedy scan). The dynamic variants draw u from all
of 1..N-1 (the authors' "Complete" variants, those of their comparisons); ``eta`` defaults to 1/2,
the value of their consensus experiments: with ``eta = 1``, ``E||W x||^2 = (1 - 2/N) ||x||^2`` for
x orthogonal to 1, with ``eta = 1/2`` it is ``(N-1)/(2N) ||x||^2`` (OD-EquiDyn).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.checks import check_int
from jaxgossip.topology.constructors import from_edges
from jaxgossip.topology.edges import Circulant
from jaxgossip.topology.graph import GraphRound, Topology

__all__ = ["d_equistatic", "u_equistatic", "od_equidyn", "ou_equidyn", "ou_partners", "default_m", "basis_shifts"]


def default_m(n: int) -> int:
    """M when a spec gives none: ``ceil(log2 N)``, the out-degree of the exponential graph (the
    authors compare the two at equal degree)."""
    return max(1, math.ceil(math.log2(n)))


def _check_m(m: Any, n: int) -> int:
    if m is None:
        return default_m(n)
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)):
        raise TypeError(f"M must be an int, got {type(m).__name__} {m!r}")
    if m < 1:
        raise ValueError(f"M={m} is too small: EquiTopo needs M >= 1 basis graphs")
    return int(m)


def basis_shifts(n: int, m: int, seed: int = 0, max_tries: int = 1000) -> np.ndarray:
    """The M shifts u_1..u_M of an EquiStatic graph, [M] int64, drawn uniformly from 1..N-1 with
    replacement by ``numpy.random.default_rng(seed)``, redrawn until ``gcd(N, u_1, .., u_M) = 1``
    (else the circulant graph falls apart into gcd components)."""
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        shifts = rng.integers(1, n, size=m)
        if math.gcd(n, *shifts.tolist()) == 1:
            return shifts
    raise ValueError(f"EquiStatic(N={n}, M={m}) drew no connected graph in {max_tries} tries; increase M")


def _basis_offsets(n: int, shifts: np.ndarray, scale: float, transpose: bool) -> tuple[np.ndarray, np.ndarray]:
    """``scale * sum_u A(u)`` (or its transpose) as in-offsets and weights: receiver i takes
    ``scale * M / N`` from itself and ``scale * (N-1) / N`` from ``i + u`` (``i - u`` transposed)."""
    offsets = np.concatenate([[0], -shifts if transpose else shifts])
    weights = np.concatenate([[scale * shifts.size / n], np.full(shifts.size, scale * (n - 1) / n)])
    return offsets, weights


def d_equistatic(n: int, m: int | None = None, seed: int = 0) -> Topology:
    """D-EquiStatic: the mean of M random basis graphs, directed and doubly stochastic.

    .. math::  W = \\frac1M \\sum_{m=1}^M \\Big(\\frac1N I + \\frac{N-1}N P_{u_m}\\Big),
        \\quad u_m \\sim \\mathcal U\\{1..N-1\\}

    With ``M >= 8 ln(2N/p) / (3 eps^2)`` the paper proves ``||W - J||_2 <= eps`` with probability
    >= 1 - p, whatever N (tested). Each node has at most M in- and M out-neighbours.

    Args:
      n: number of nodes N >= 2.
      m: M >= 1 basis graphs (default ``ceil(log2 N)``).
      seed: the seed of the shifts (:func:`basis_shifts`).
    """
    n = check_int("n", n, 2)
    m = _check_m(m, n)
    shifts = basis_shifts(n, m, seed)
    edges = Circulant(*_basis_offsets(n, shifts, 1.0 / m, transpose=False))
    return from_edges(f"d_equistatic({n}, M={m}, seed={seed})", n, [edges])


def u_equistatic(n: int, m: int | None = None, seed: int = 0) -> Topology:
    """U-EquiStatic: the symmetrised mean of M random basis graphs.

    .. math::  W = \\frac1{2M} \\sum_{m=1}^M \\big(A(u_m) + A(u_m)^\\top\\big)

    Symmetric and doubly stochastic, at most 2M neighbours per node; the same ``||W - J||_2``
    bound as :func:`d_equistatic`.

    Args:
      n: number of nodes N >= 2.
      m: M >= 1 basis graphs (default ``ceil(log2 N)``).
      seed: the seed of the shifts (:func:`basis_shifts`).
    """
    n = check_int("n", n, 2)
    m = _check_m(m, n)
    shifts = basis_shifts(n, m, seed)
    # Offsets that meet (u and N - u, or u = N / 2) sum their weights in this order, forward first.
    forward = _basis_offsets(n, shifts, 0.5 / m, transpose=False)
    backward = _basis_offsets(n, shifts, 0.5 / m, transpose=True)
    edges = Circulant(*(np.concatenate([a, b]) for a, b in zip(forward, backward)))
    return from_edges(f"u_equistatic({n}, M={m}, seed={seed})", n, [edges], directed=False)


# ---- one-peer dynamic variants ---------------------------------------------------------------------


def _check_eta(eta: Any) -> float:
    if isinstance(eta, bool) or not isinstance(eta, numbers.Real):
        raise TypeError(f"eta={eta!r} must be a real number in (0, 1]")
    eta = float(eta)
    if not 0.0 < eta <= 1.0:  # also rejects NaN
        raise ValueError(f"eta={eta!r} must lie in (0, 1] (the weight of the basis graph against I)")
    return eta


def ou_partners(n: int, shift: Any, start: Any) -> Any:
    """[N] int32 partner of every node in OU-EquiDyn's greedy matching along ``shift`` (a node
    without a partner is its own); jittable, ``shift`` in 1..N-1 and ``start`` in 0..N-1 traced."""
    nodes = jnp.arange(n, dtype=jnp.int32)
    c = jnp.minimum(shift, n - shift)
    tau = (nodes - start) % n
    first = ((tau // c) % 2 == 0) & (tau + c < n)
    other = (nodes + shift) % n
    partner = jnp.where(first, other, nodes)
    return partner.at[jnp.where(first, other, n)].set(nodes, mode="drop")


def _slot_round(n: int, name: str, partner: Any, weight: Any, directed: bool) -> Topology:
    """One round with slots [N, 2] (self, partner): node i takes ``weight[i]`` from ``partner[i]``."""
    nodes = jnp.arange(n, dtype=jnp.int32)
    self_w = (1.0 - weight).astype(jnp.float32)
    other_w = weight.astype(jnp.float32)
    tables = {
        "senders": jnp.concatenate([nodes, partner])[None],
        "receivers": jnp.concatenate([nodes, nodes])[None],
        "weights": jnp.concatenate([self_w, other_w])[None],
        "neighbors": jnp.stack([nodes, partner], axis=1)[None],
        "slot_weights": jnp.stack([self_w, other_w], axis=1)[None],
    }
    return Topology.from_tables(
        tables,
        name=name,
        num_nodes=n,
        directed=directed,
        layout="slots",
        row_stochastic=True,
        column_stochastic=True,
    )


@dataclasses.dataclass(frozen=True)
class _EquiDynSampler:
    """Round t: a shift u uniform in 1..N-1 (and for ``undirected`` a start node s uniform in
    0..N-1); slot layout ``[N, 2]`` (self, partner)."""

    n: int
    eta: float
    undirected: bool
    name: str
    period: int = 1
    support: Any = None
    pair_codes: Any = None

    @property
    def symmetric(self) -> bool:
        return self.undirected or self.n == 2

    @property
    def num_edges(self) -> int:
        return 2 * self.n

    @property
    def slot_edge(self) -> np.ndarray:
        """[1, N, 2]: slot 0 of node i is edge i (self), slot 1 is edge N + i (partner)."""
        nodes = np.arange(self.n, dtype=np.int32)
        return np.stack([nodes, nodes + self.n], axis=1)[None]

    def draw(self, key, t, draw_args=None):
        del t, draw_args
        n = self.n
        key_u, key_s = jax.random.split(key)
        shift = jax.random.randint(key_u, (), 1, n, dtype=jnp.int32)
        link = self.eta * (n - 1) / n
        if self.undirected:
            start = jax.random.randint(key_s, (), 0, n, dtype=jnp.int32)
            partner = ou_partners(n, shift, start)
            weight = jnp.where(partner != jnp.arange(n), link, 0.0)
        else:
            partner = (jnp.arange(n, dtype=jnp.int32) + shift) % n
            weight = jnp.full((n,), link)
        return GraphRound(_slot_round(n, self.name, partner, weight, directed=not self.symmetric))


def _equidyn(n: int, eta: float, undirected: bool, label: str) -> Topology:
    n = check_int("n", n, 2)
    eta = _check_eta(eta)
    name = f"{label}({n}, eta={eta:g})"
    sampler = _EquiDynSampler(n, eta, undirected, name)
    return Topology.from_sampler(
        sampler,
        name=name,
        num_nodes=n,
        directed=not sampler.symmetric,
        layout="slots",
        row_stochastic=True,
        column_stochastic=True,
    )


def od_equidyn(n: int, eta: float = 0.5) -> Topology:
    """OD-EquiDyn: a fresh one-peer directed basis graph every round.

    .. math::  W(t) = (1 - \\eta) I + \\eta \\Big(\\frac1N I + \\frac{N-1}N P_{u_t}\\Big),
        \\quad u_t \\sim \\mathcal U\\{1..N-1\\}

    Node i takes ``eta (N-1)/N`` from node ``i + u_t`` (and sends to ``i - u_t``): one message per
    node and round; every W(t) is doubly stochastic (a permutation mixed with I), so gossip runs on
    it. ``E[W^T W]`` restricted to the vectors orthogonal to 1 is
    ``a^2 + b^2 - 2ab / (N-1)`` times I (``a = 1 - eta (N-1)/N``, ``b = eta (N-1)/N``), below 1/2 for
    ``eta = 1/2`` at every N.

    Args:
      n: number of nodes N >= 2.
      eta: weight of the basis graph, in (0, 1] (default 1/2).

    Returns:
      A stochastic :class:`Topology` (slot layout, K = 2; E = 2N per round).
    """
    return _equidyn(n, eta, undirected=False, label="od_equidyn")


def ou_equidyn(n: int, eta: float = 0.5) -> Topology:
    """OU-EquiDyn: a fresh one-peer undirected matching along a random shift every round.

    .. math::  W(t)_{ii} = 1 - \\eta \\tfrac{N-1}N,\\ W(t)_{ij} = W(t)_{ji} = \\eta \\tfrac{N-1}N
        \\text{ for each pair } \\{i, j = i + u_t\\} \\text{ of the greedy matching}

    The matching is the authors' greedy scan from a random start node (module docstring); every
    W(t) is symmetric and doubly stochastic, each node sends at most one message per round.

    Args:
      n: number of nodes N >= 2.
      eta: weight of the basis graph, in (0, 1] (default 1/2).

    Returns:
      A stochastic :class:`Topology` (slot layout, K = 2; E = 2N per round).
    """
    return _equidyn(n, eta, undirected=True, label="ou_equidyn")
