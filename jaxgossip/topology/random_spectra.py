"""What a graph drawn anew every round does in expectation, analysed on the host: the dense rounds
an algorithm sees (``sample_matrices``), ``E[W(t)^T W(t)]`` sampled (``expected_gram``) or in closed
form where the sampler knows it (``exact_gram``: ``ExchangeableGram``, ``SparseGram``), the
spectral gap of that expectation (``expected_gap``, the consensus rate of
:mod:`jaxgossip.topology.spectral` for a drawn graph) and the mean number of messages a node sends
per round (``mean_out_degree``, which the clock prices). The graphs themselves are built in
:mod:`jaxgossip.topology.stochastic`.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.checks import any_traced
from jaxgossip.topology.convolution import group_modes
from jaxgossip.topology.graph import Topology, TopologyKey
from jaxgossip.types import Array

__all__ = [
    "sample_matrices",
    "expected_gram",
    "exact_gram",
    "expected_gap",
    "ExchangeableGram",
    "SparseGram",
    "GapEstimate",
    "mean_out_degree",
]


class ExchangeableGram(NamedTuple):
    """An exact ``E[W(t)^T W(t)]`` that is the same under every relabelling of the nodes:
    ``diagonal * I + off_diagonal * (J - I)`` with ``J`` the all-ones [N, N] matrix.

    Its eigenvalues are ``diagonal + (N - 1) off_diagonal`` on the all-ones vector and
    :attr:`perp` (N - 1 times) on the vectors orthogonal to it.
    """

    num_nodes: int
    diagonal: float
    off_diagonal: float

    @property
    def perp(self) -> float:
        """The eigenvalue on the vectors orthogonal to 1: ``E ||W x||^2 = perp ||x||^2`` there."""
        return self.diagonal - self.off_diagonal

    def second_eigenvalue(self) -> float:
        """``lambda_2``, the largest eigenvalue on the vectors orthogonal to 1."""
        return self.perp if self.num_nodes > 1 else 0.0

    def matrix(self) -> np.ndarray:
        """The dense [N, N] matrix (small N: tests and analysis)."""
        n = self.num_nodes
        return np.full((n, n), self.off_diagonal) + np.eye(n) * (self.diagonal - self.off_diagonal)


class SparseGram(NamedTuple):
    """An exact ``E[W(t)^T W(t)]`` as a sparse [N, N] matrix that has 1 as an eigenvector
    (eigenvalue 1): ``sparse``, a ``scipy.sparse`` CSR matrix."""

    sparse: Any

    @property
    def num_nodes(self) -> int:
        return self.sparse.shape[0]

    def second_eigenvalue(self) -> float:
        """``lambda_2``: the largest eigenvalue on the vectors orthogonal to 1 (dense up to
        N = 256; a convolution on a group, e.g. the Gram of a ring or torus with failures, by its
        Fourier transform; else Lanczos on ``G - J``)."""
        n = self.num_nodes
        if n <= 1:
            return 0.0
        if n <= 256:
            proj = np.eye(n) - 1.0 / n
            return float(np.linalg.eigvalsh(proj @ self.sparse.toarray() @ proj)[-1])
        coo = self.sparse.tocoo()
        modes = group_modes(coo.col[None], coo.row[None], coo.data[None], n)
        if modes is not None:  # a symmetric kernel: real eigenvalues, index 0 the ones vector's
            return float(np.max(modes[0, 1:].real))
        import scipy.sparse.linalg

        def apply(x):
            x = np.asarray(x, dtype=np.float64).ravel()
            y = self.sparse @ (x - x.mean())
            return y - y.mean()

        op = scipy.sparse.linalg.LinearOperator((n, n), matvec=apply, dtype=np.float64)
        vals = scipy.sparse.linalg.eigsh(
            op, k=1, which="LA", v0=np.cos(np.arange(n) + 0.5), tol=1e-12, return_eigenvectors=False
        )
        return float(vals[0])

    def matrix(self) -> np.ndarray:
        """The dense [N, N] matrix (small N: tests and analysis)."""
        return self.sparse.toarray()


class GapEstimate(NamedTuple):
    """A spectral gap with its sampling error.

    Attributes:
      value: the gap ``1 - sqrt(lambda_2(E[W^T W]))`` (fixed graph: ``1 - |lambda_2(W)|``).
      stderr: one standard error of ``value`` from sampling; 0 when ``exact``.
      exact: whether ``value`` is computed exactly (closed form or eigenvalues), not sampled.
    """

    value: float
    stderr: float
    exact: bool


def sample_matrices(topology: Topology, keys: Any, start: int = 0) -> np.ndarray:
    """The dense ``W(t)`` an algorithm sees in rounds ``start, ..., start + R - 1``, numpy [R, N, N].

    Round ``start + r`` is drawn with the step key ``keys[r]`` exactly as an algorithm's step
    draws it (:meth:`Topology.draw`); for a fixed graph these are ``topology.matrix(t)``. For tests
    and analysis (dense, host side).

    Args:
      topology: any single graph.
      keys: [R] PRNG keys (e.g. ``jaxgossip.engine.rounds.round_keys(key, R)``, the step keys of ``run_consensus``).
      start: the round counter of the first key.
    """
    keys = jnp.asarray(keys)
    rounds = np.arange(start, start + keys.shape[0])
    if not topology.stochastic:
        return np.stack([topology.matrix(t) for t in rounds])
    dense = _dense_rounds(TopologyKey.of(topology))
    return np.asarray(dense(keys, jnp.asarray(rounds, jnp.int32)), dtype=np.float64)


@functools.lru_cache(maxsize=64)
def _dense_rounds(graph: TopologyKey):
    """Jitted ``(keys [R], rounds [R]) -> W [R, N, N]`` of one stochastic graph, cached per graph
    value (its sampler and draw arguments), so repeated analyses of equal graphs compile once."""
    topology = graph.topology
    n = topology.num_nodes

    def dense(key, t):
        g = topology.draw(key, t).graph
        w = jnp.zeros((n, n), jnp.float32)
        return w.at[g.receivers[0], g.senders[0]].add(g.weights[0])

    return jax.jit(jax.vmap(dense))


def expected_gram(topology: Topology, num_samples: int = 512, seed: int = 0) -> np.ndarray:
    """Monte Carlo estimate of ``E[W(t)^T W(t)]``, numpy [N, N], over ``num_samples`` rounds drawn
    with the fixed key ``jax.random.key(seed)`` (rounds 0, 1, ... so a wrapped schedule is covered)."""
    with jax.ensure_compile_time_eval():  # host analysis, also when called while a run is traced
        w = sample_matrices(topology, jax.random.split(jax.random.key(seed), num_samples))
    return np.einsum("rki,rkj->ij", w, w) / num_samples


def mean_out_degree(topology: Topology, num_samples: int = 512, seed: int = 0) -> Any:
    """Messages a node sends per round, on average over nodes and rounds: ``out_degree.mean()`` for
    a fixed graph; for a stochastic graph estimated over ``num_samples`` rounds drawn with the fixed
    key ``jax.random.key(seed)``, counting an edge listed twice in a round once.

    Returns a Python float; for a member of a stack of stochastic graphs traced under ``vmap`` (a
    topology sweep over failure probabilities: ``draw_args`` traced), the same estimate from the
    same draws as a traced float32 scalar.
    """
    if not topology.stochastic:
        return float(np.mean(topology.out_degree))

    def rounds():
        return jax.random.split(jax.random.key(seed), num_samples), jnp.arange(num_samples, dtype=jnp.int32)

    n = topology.num_nodes
    if any_traced(topology):
        tables = jax.vmap(functools.partial(_round_tables, topology))(*rounds())
        return _distinct_messages(*tables, n).astype(jnp.float32) / (num_samples * n)
    # A sweep builds its trainer (and the time model that asks for this degree) inside jit: the
    # fixed key and the draws must stay concrete there.
    # The sparse rounds, not dense [R, N, N] matrices (2 GB for 512 rounds at N = 1024).
    with jax.ensure_compile_time_eval():
        count = _distinct_messages(*_table_rounds(TopologyKey.of(topology))(*rounds()), n)
    return int(count) / (num_samples * n)


def _distinct_messages(senders: Array, receivers: Array, weights: Array, n: int) -> Array:
    """The messages of rounds ``[R, E]``: real edges (weight != 0, not a self loop), an edge listed
    twice in a round counted once. Sorts each round's (receiver, sender) pairs, padding edges last,
    and counts where a pair starts (no ``receiver * N + sender`` id, which overflows int32 at large N)."""
    real = (weights != 0) & (senders != receivers)
    receivers, senders = jnp.where(real, receivers, n), jnp.where(real, senders, n)
    receivers, senders = jax.lax.sort((receivers, senders), dimension=1, num_keys=2)
    changed = (receivers[:, 1:] != receivers[:, :-1]) | (senders[:, 1:] != senders[:, :-1])
    starts = jnp.concatenate([jnp.ones_like(real[:, :1]), changed], axis=1)
    return jnp.sum(starts & (receivers < n))


def exact_gram(topology: Topology) -> ExchangeableGram | SparseGram | None:
    """``E[W(t)^T W(t)]`` in closed form where the graph's sampler knows it (the ``exact_gram``
    method of the samplers of ``random_matching``, ``random_out`` and ``with_failures`` of a static
    symmetric graph), else None (sample it: :func:`expected_gap`)."""
    exact = getattr(topology.sampler, "exact_gram", None) if topology.stochastic else None
    return None if exact is None else exact(topology.draw_args)


@functools.lru_cache(maxsize=64)
def _table_rounds(graph: TopologyKey):
    """Jitted ``(keys [R], rounds [R]) -> (senders, receivers, weights) [R, E]`` of one stochastic
    graph: the sparse rounds, for matrix-free analysis at large N."""
    return jax.jit(jax.vmap(functools.partial(_round_tables, graph.topology)))


def _round_tables(topology: Topology, key: Any, t: Any) -> tuple[Any, Any, Any]:
    """Round ``t``'s drawn graph as ``(senders, receivers, weights)`` ``[E]``."""
    g = topology.draw(key, t).graph
    return g.senders[0], g.receivers[0], g.weights[0]


def _gram_apply(senders, receivers, weights, n: int, v: np.ndarray) -> np.ndarray:
    """``[R, N]`` rows ``W_r v`` (v: [N]) from the sparse rounds [R, E], no [N, N] matrix."""
    rounds = senders.shape[0]
    offset = (np.arange(rounds, dtype=np.int64) * n)[:, None]
    wv = np.bincount((offset + receivers).ravel(), (weights * v[senders]).ravel(), minlength=rounds * n)
    return wv.reshape(rounds, n)


def expected_gap(topology: Topology, num_samples: int = 512, seed: int = 0) -> GapEstimate:
    """The expected per-round gap ``1 - sqrt(lambda_2(E[W^T W]))`` of a stochastic graph.

    Exact where the sampler gives ``E[W^T W]`` in closed form (:func:`exact_gram`). Otherwise
    sampled, matrix free, over ``num_samples`` rounds drawn with the fixed key
    ``jax.random.key(seed)`` (rounds 0, 1, ...), cross-fitted: the first half estimates the
    eigenvector v of ``lambda_2`` (Lanczos on ``(1/R) sum_r W_r^T W_r`` restricted to the vectors
    orthogonal to 1), the second, independent half estimates ``v^T E[W^T W] v`` by the mean of
    ``||W_r v||^2``. That mean is an unbiased estimate of the Rayleigh quotient at v (at most
    ``lambda_2``, equal when v is exact), with a standard error from the spread of
    ``||W_r v||^2``; the gap's error bar follows by the delta method. (The top eigenvalue of a
    sampled Gram matrix itself is biased upward, so its gap is biased low.)

    Args:
      topology: a stochastic graph with doubly stochastic rounds.
      num_samples: rounds drawn, R >= 4 (sampled case only).
      seed: the key of the rounds (sampled case only).

    Returns:
      A :class:`GapEstimate` (``stderr = 0`` and ``exact = True`` for a closed form).
    """
    if not topology.stochastic:
        raise ValueError(f"expected_gap needs a stochastic graph; {topology.name} is fixed (use spectral_gap)")
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 4:
        raise ValueError(f"num_samples={num_samples!r} must be an int >= 4 (two halves of at least 2 rounds)")
    n = topology.num_nodes
    exact = exact_gram(topology)
    if exact is not None:
        lam2 = max(exact.second_eigenvalue(), 0.0)
        return GapEstimate(float(1.0 - np.sqrt(lam2)), 0.0, True)
    keys = jax.random.split(jax.random.key(seed), num_samples)
    draw = _table_rounds(TopologyKey.of(topology))
    senders, receivers, weights = (np.asarray(a) for a in draw(keys, jnp.arange(num_samples, dtype=jnp.int32)))
    weights = weights.astype(np.float64)
    half = num_samples // 2
    fit = (senders[:half], receivers[:half], weights[:half])
    test = (senders[half:], receivers[half:], weights[half:])

    def gram(v):  # P (1/R sum W^T W) P v, P the projection orthogonal to 1
        v = v - v.mean()
        wv = _gram_apply(*fit, n, v)  # [R, N]
        rounds = wv.shape[0]
        offset = (np.arange(rounds, dtype=np.int64) * n)[:, None]
        back = (
            np.bincount(
                (offset + fit[0]).ravel(), (fit[2] * np.take_along_axis(wv, fit[1], 1)).ravel(), minlength=rounds * n
            )
            .reshape(rounds, n)
            .mean(0)
        )
        return back - back.mean()

    if n <= 64:
        dense = np.stack([gram(e) for e in np.eye(n)], axis=1)
        _, vecs = np.linalg.eigh((dense + dense.T) / 2)
        v = vecs[:, -1]
    else:
        import scipy.sparse.linalg

        op = scipy.sparse.linalg.LinearOperator((n, n), matvec=gram, dtype=np.float64)
        _, vecs = scipy.sparse.linalg.eigsh(op, k=1, which="LA", v0=np.cos(np.arange(n) + 0.5), tol=1e-8)
        v = vecs[:, 0]
    v = v - v.mean()
    v = v / np.linalg.norm(v)
    norms = np.sum(_gram_apply(*test, n, v) ** 2, axis=1)  # [R/2] ||W_r v||^2
    lam2 = max(float(norms.mean()), 0.0)
    lam_err = float(norms.std(ddof=1) / np.sqrt(norms.size))
    root = np.sqrt(lam2)
    return GapEstimate(float(1.0 - root), float(lam_err / (2 * root) if root > 0 else lam_err), False)
