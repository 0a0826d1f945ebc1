"""Stochastic graphs: a fresh graph every round, drawn inside the compiled run from the round's key.

* :func:`random_matching`: a random perfect (N even) or maximal (N odd) matching per round,
  ``W = (I + P) / 2``; doubly stochastic and symmetric (randomized pairwise gossip). Uniform by
  default (a sort per round), or pseudo-random in O(N) with ``draw="feistel"``.
* :func:`random_out`: every node pushes to s distinct uniformly random other nodes per round,
  weight ``1 / (s + 1)`` each, self included; column stochastic, for push-sum methods (the
  Epidemic Learning setting).
* failures of any graph, drawn the same way: :mod:`jaxgossip.topology.failures`
  (``with_failures``, ``with_availability``).

A stochastic graph is a :class:`~jaxgossip.topology.Topology` without tables whose *sampler*
(auxiliary data) draws round t's tables: ``topology.draw(key, t)`` returns a :class:`GraphRound`
whose ``graph`` is a one-round Topology with traced tables ``[1, E]`` of fixed E (padding edges
have weight 0), so every mixing kernel runs on it unchanged. The key of round t is the step key
the runner hands to the algorithm (the round driver's key schedule,
:func:`jaxgossip.engine.rounds.next_keys`), folded with a fixed stream id: the graph sequence is a pure
function of the run key, the same key gives the same sequence, and a resumed run draws the same
graphs. Which algorithms accept which stochastic graph is their metadata
(:attr:`jaxgossip.types.GraphNeeds.stochastic_graphs`); docs/topologies.md, section stochastic
graphs, explains the choices (public copies, PowerGossip's per-edge state, bits).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.checks import check_int
from jaxgossip.topology import coins
from jaxgossip.topology.feistel import feistel_matching
from jaxgossip.topology.graph import GraphRound, Topology
from jaxgossip.topology.layout import choose_kernel
from jaxgossip.topology.random_spectra import ExchangeableGram

__all__ = [
    "random_matching",
    "random_out",
    "one_round",
]


def one_round(tables: dict, n: int, name: str, layout: str, directed: bool, rows: bool, cols: bool) -> Topology:
    """A drawn round as a one-round Topology: the tables ``[E]`` (or ``[N, K]``) get the round axis."""
    return Topology.from_tables(
        {k: v[None] for k, v in tables.items()},
        name=name,
        num_nodes=n,
        directed=directed,
        layout=layout,
        row_stochastic=rows,
        column_stochastic=cols,
    )


# ---- random matching -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _MatchingSampler:
    """Round t: a random permutation pi, pairs (pi_0, pi_1), (pi_2, pi_3), ...; N odd leaves the
    last node unmatched. ``method="sort"``: pi is ``jax.random.permutation`` and every perfect
    matching is equally likely (each arises from the same number of permutations);
    ``method="feistel"``: pi is the keyed Feistel permutation of
    :func:`~jaxgossip.topology.feistel.feistel_matching` (O(N), pseudo-random). Slot layout
    ``[N, 2]``: self, partner."""

    n: int
    name: str
    method: str = "sort"
    period: int = 1
    symmetric: bool = True
    support: Any = None
    pair_codes: Any = None

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
        if self.method == "feistel":
            # In memory: the round's tables interleave the partner with the nodes, and XLA:CPU
            # would evaluate the Feistel hash in each of them per element, unvectorized (a failed
            # round at 2^20 took 3.9x longer so).
            partner = coins.buffered(jax.random.key_data(key)[..., 0], lambda: feistel_matching(key, n))
        else:
            perm = jax.random.permutation(key, n)
            half = n // 2
            partner = jnp.arange(n, dtype=jnp.int32)
            first, second = perm[: 2 * half : 2], perm[1 : 2 * half : 2]
            partner = partner.at[first].set(second.astype(jnp.int32)).at[second].set(first.astype(jnp.int32))
        nodes = jnp.arange(n, dtype=jnp.int32)
        matched = partner != nodes
        self_w = jnp.where(matched, 0.5, 1.0).astype(jnp.float32)
        other_w = jnp.where(matched, 0.5, 0.0).astype(jnp.float32)
        tables = {
            "senders": jnp.concatenate([nodes, partner]),
            "receivers": jnp.concatenate([nodes, nodes]),
            "weights": jnp.concatenate([self_w, other_w]),
            "neighbors": jnp.stack([nodes, partner], axis=1),
            "slot_weights": jnp.stack([self_w, other_w], axis=1),
        }
        return GraphRound(one_round(tables, n, self.name, "slots", False, True, True))

    def exact_gram(self, draw_args=None) -> ExchangeableGram | None:
        """``E[W^T W]`` in closed form for ``method="sort"`` (None for the pseudo-random Feistel
        draw, whose pairing law is only close to uniform). ``W = (I + P) / 2`` with P a symmetric involution, so
        ``W^T W = W^2 = (I + 2P + P^2) / 4 = W`` and ``E[W^T W] = E[W] = (I + E[P]) / 2``. N even:
        node i is paired with each other node with probability ``1 / (N - 1)``, so
        ``E[W] = I / 2 + (J - I) / (2 (N - 1))`` and ``perp = 1/2 - 1 / (2 (N - 1))``. N odd:
        node i sits out (``P_ii = 1``) with probability ``1 / N`` and is paired with a given other
        node with probability ``(N - 1) / N * 1 / (N - 1) = 1 / N``, so ``E[P] = J / N`` and
        ``perp = 1/2`` exactly."""
        del draw_args
        n = self.n
        if self.method != "sort":
            return None
        if n % 2 == 0:
            return ExchangeableGram(n, 0.5, 0.5 / (n - 1))
        return ExchangeableGram(n, 0.5 + 0.5 / n, 0.5 / n)


def random_matching(n: int, draw: str = "sort") -> Topology:
    """A fresh random matching every round: ``W(t) = (I + P(t)) / 2``.

    Every node is paired with one other node (N even: a perfect matching; N odd: one node sits out
    with ``W_ii = 1``) and the two average their models. Every ``W(t)`` is doubly stochastic and
    symmetric, so gossip, DeepSqueeze and push-sum run on it; each node sends one message per round
    (randomized pairwise gossip, Boyd et al., 2006).

    .. math::  W(t) = \\tfrac12 (I + P(t)), \\quad P(t)_{i, \\pi(\\pi^{-1}(i) \\oplus 1)} = 1

    with pi round t's permutation of the nodes: positions ``(2m, 2m + 1)`` of pi are paired.

    ``draw`` picks how pi is drawn:

    * ``"sort"`` (default): ``jax.random.permutation``, uniform over all permutations, so every
      matching is equally likely (N odd: the node that sits out is uniform). It sorts N random keys
      every round, which dominates the round at large N (hundreds of ms at N = 2^20 on a CPU).
    * ``"feistel"``: a keyed Feistel permutation (:mod:`jaxgossip.topology.feistel`), each node's
      partner computed on its own in O(1), no sort: O(N) per round. It gives up exact uniformity:
      pi is one of at most ``2^(32 R)`` keyed bijections (R = 4 rounds for N > 2^11, more below),
      so the matchings are pseudo-random, close to uniform in their pairing frequencies but not
      exactly uniform over matchings, and the rounds differ from ``"sort"``'s for the same key.
      ``exact_gram`` has no closed form for it (the spectral tools sample it).

    Args:
      n: number of nodes N >= 2.
      draw: ``"sort"`` or ``"feistel"``.

    Returns:
      A stochastic :class:`Topology` (slot layout, K = 2; E = 2N per round).

    References:
      Boyd, Ghosh, Prabhakar, Shah, "Randomized Gossip Algorithms", IEEE Trans. Inf. Theory 2006.
      Luby, Rackoff, "How to Construct Pseudorandom Permutations from Pseudorandom Functions",
      SIAM J. Comput. 1988; Black, Rogaway, "Ciphers with Arbitrary Finite Domains", CT-RSA 2002
      (cycle walking).
    """
    n = check_int("n", n, 2)
    if draw not in ("sort", "feistel"):
        raise ValueError(f"random_matching draw={draw!r}: use 'sort' (uniform) or 'feistel' (O(N), pseudo-random)")
    name = f"random_matching({n})" if draw == "sort" else f"random_matching({n}, draw=feistel)"
    return Topology.from_sampler(
        _MatchingSampler(n, name, draw),
        name=name,
        num_nodes=n,
        directed=False,
        layout="slots",
        row_stochastic=True,
        column_stochastic=True,
    )


# ---- random out-neighbours ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _OutSampler:
    """Round t: each node j draws s distinct offsets in 1..N-1 (Floyd's algorithm, uniform over
    s-subsets, O(N s^2) work) and pushes to ``(j + offset) mod N``."""

    n: int
    s: int
    name: str
    layout: str
    period: int = 1
    symmetric: bool = False
    support: Any = None
    pair_codes: Any = None

    @property
    def num_edges(self) -> int:
        return self.n * (self.s + 1)

    def draw(self, key, t, draw_args=None):
        del t, draw_args
        n, s = self.n, self.s
        keys = jax.random.split(key, s)
        nodes = jnp.arange(n, dtype=jnp.int32)

        def floyd():
            chosen = []
            # Floyd: for j = m - s, ..., m - 1 (m = N - 1 candidates) draw r in [0, j]; take j if r is
            # already chosen. Each s-subset of the m candidates is equally likely.
            for step, j in enumerate(range(n - 1 - s, n - 1)):
                r = coins.randint(keys[step], n, 0, j + 1)  # jax.random.randint, bit for bit
                if chosen:
                    dup = jnp.any(jnp.stack(chosen, axis=1) == r[:, None], axis=1)
                    r = jnp.where(dup, j, r)
                chosen.append(r)
            return (nodes[:, None] + 1 + jnp.stack(chosen, axis=1)) % n  # [N, s]

        # In memory: the receivers interleave the s targets of each node, and XLA:CPU would
        # evaluate the remainders and duplicate checks per element of that table, unvectorized.
        targets = coins.buffered(jax.random.key_data(key)[..., 0], floyd)
        tables = {
            "senders": jnp.concatenate([nodes, jnp.repeat(nodes, s)]),
            "receivers": jnp.concatenate([nodes, targets.reshape(-1)]),
            "weights": jnp.full((n * (s + 1),), 1.0 / (s + 1), jnp.float32),
        }
        return GraphRound(one_round(tables, n, self.name, self.layout, True, False, True))

    def exact_gram(self, draw_args=None) -> ExchangeableGram:
        """``E[W^T W]`` in closed form, with ``a = 1 / (s + 1)`` and ``r = s / (N - 1)`` (the
        probability that j pushes to a given other node). Column j of W has ``s + 1`` entries ``a``,
        so ``(W^T W)_jj = a``. Columns ``j != k`` are independent, ``E[W_ij] = a`` for ``i = j`` and
        ``a r`` otherwise, so ``E[(W^T W)_jk] = sum_i E[W_ij] E[W_ik]
        = a^2 (2 r + (N - 2) r^2)``."""
        del draw_args
        n, a = self.n, 1.0 / (self.s + 1)
        r = self.s / (n - 1)
        return ExchangeableGram(n, a, a * a * (2 * r + (n - 2) * r * r))


def random_out(n: int, s: int = 1) -> Topology:
    """Every node pushes to s distinct uniformly random other nodes every round (column stochastic).

    Node j keeps ``1 / (s + 1)`` of its mass and sends ``1 / (s + 1)`` to each of its s fresh
    out-neighbours, so every ``W(t)`` is column stochastic (not row stochastic: in-degrees vary):
    a graph for push-sum methods (push_sum, and Epidemic Learning's randomized communication).
    Each node sends s messages per round.

    .. math::  W(t)_{ij} = \\tfrac{1}{s + 1}\\,\\mathbb 1[i = j \\text{ or } i \\in S_j(t)],
        \\quad S_j(t) \\subset \\{1..N\\} \\setminus \\{j\\},\\ |S_j(t)| = s \\text{ uniform}

    Args:
      n: number of nodes N >= 2.
      s: out-neighbours per node and round, ``1 <= s <= N - 1`` (a node has N - 1 others).

    Returns:
      A stochastic :class:`Topology` (segment layout, or dense when ``(s + 1) / N`` is large;
      E = N (s + 1) per round).

    References:
      de Vos, Farhadkhani, Guerraoui, Kermarrec, Pires, Sharma, "Epidemic Learning: Boosting
      Decentralized Learning with Randomized Communication", NeurIPS 2023 (arXiv:2310.01972).
      Kempe, Dobra, Gehrke, FOCS 2003 (push-sum).
    """
    n = check_int("n", n, 2)
    if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
        raise TypeError(f"s must be an int, got {type(s).__name__} {s!r}")
    if not 1 <= s < n:
        raise ValueError(f"s={s} is out of range: each node pushes to 1 <= s <= N - 1 = {n - 1} other nodes")
    s = int(s)
    # The in-degree is random, so there is no bounded slot table: dense for dense graphs, else the
    # segment kernel (the measured choice of layout.choose_kernel with K unbounded).
    layout = "dense" if choose_kernel(n, n * (s + 1), n) == "dense" else "segment"
    name = f"random_out({n}, s={s})"
    return Topology.from_sampler(
        _OutSampler(n, s, name, layout),
        name=name,
        num_nodes=n,
        directed=True,
        layout=layout,
        row_stochastic=False,
        column_stochastic=True,
    )
