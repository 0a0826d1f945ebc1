"""DeMo (decoupled momentum): node-local momentum, only its largest DCT components are exchanged.

Every node keeps its own momentum ``m``; the gradient hook accumulates the gradients into it and
hands the local optimizer zeros, and each round ``step`` extracts the k largest components of every
chunk of ``m`` in the DCT-II basis, removes them from ``m`` (the rest stays as error feedback),
sends them, aggregates what its in-neighbours sent and moves the model by the sign of the inverse
DCT of the aggregate. The split between hook and round keeps the messages in ``step``: the
optimizer sees zero gradients, so only its weight decay acts (decoupled, as in the reference).

Shapes: N nodes; each leaf of one node (``D_leaf`` entries, flattened) is cut into
``ceil(D_leaf / C)`` chunks of C entries, the last one zero-padded; ``m`` is kept chunked,
``[N, ceil(D_leaf / C), C]`` per leaf, so the padding takes part in the error feedback exactly.

References:
  B. Peng, J. Quesnelle, D. P. Kingma, "DeMo: Decoupled Momentum Optimization", 2024
  (arXiv:2411.19870). Reference code: bloc97/DeMo (``demo.py``), read for the semantics.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.fft

from jaxgossip.algorithms._shared.common import check_positive, per_round
from jaxgossip.algorithms.registry import check_graph, sign
from jaxgossip.checks import check_int, is_concrete
from jaxgossip.compress import value_bits
from jaxgossip.compress.selection import top_k_mask
from jaxgossip.ops.mixing import check_params, mix
from jaxgossip.topology import Topology
from jaxgossip.types import (
    AlgorithmInfo,
    Array,
    Execution,
    GossipAlgorithm,
    GraphNeeds,
    Params,
    StepInfo,
    SweepFacts,
    TrainerHooks,
)

__all__ = ["demo_momentum", "DemoState", "AGGREGATES", "to_chunks", "from_chunks", "dct_matrix", "INFO"]

#: How a receiver combines the coefficients its in-neighbours sent (see :func:`demo_momentum`).
AGGREGATES = ("selected", "all")


class DemoState(NamedTuple):
    """State of :func:`demo_momentum`."""

    m: Params  # per leaf [N, ceil(D_leaf / C), C]: the node-local momentum, chunked
    count: Array  # [] int32, communication rounds done


def to_chunks(leaf: Array, chunk: int) -> Array:
    """``[N, ...]`` -> ``[N, ceil(D_leaf / C), C]``: the flattened leaf of every node in chunks of C,
    the last one zero-padded."""
    flat = leaf.reshape(leaf.shape[0], -1)
    size = flat.shape[1]
    padded = -(-size // chunk) * chunk
    flat = jnp.pad(flat, ((0, 0), (0, padded - size)))
    return flat.reshape(leaf.shape[0], padded // chunk, chunk)


def from_chunks(chunks: Array, like: Array) -> Array:
    """The inverse of :func:`to_chunks`: the padding dropped, the leaf's shape restored."""
    size = math.prod(like.shape[1:])
    return chunks.reshape(chunks.shape[0], -1)[:, :size].reshape(like.shape)


def _wide(x: Array) -> Array:
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def dct_matrix(chunk: int) -> np.ndarray:
    """``[C, C]`` float32, the orthonormal DCT-II: ``X = D @ x`` for one chunk, ``x = D.T @ X``."""
    return scipy.fft.dct(np.eye(chunk), type=2, norm="ortho", axis=0).astype(np.float32)


def _transform(x: Array, basis: np.ndarray) -> Array:
    """``x @ basis`` over the last axis at full float32 precision (accelerators would otherwise
    multiply in reduced precision): the DCT with ``D.T``, its inverse with ``D``; the basis is
    precomputed once, as in the reference code."""
    return jnp.matmul(x, jnp.asarray(basis, x.dtype), precision=jax.lax.Precision.HIGHEST)


def _top_k_mask(coefficients: Array, k: int) -> Array:
    """Bool, True at the k entries of largest magnitude of every chunk (last axis), ties to the
    lower index (``lax.top_k``'s selection, by the CPU-fast radix selection)."""
    return top_k_mask(jnp.abs(coefficients), k)


def _check(topology, lr, k, chunk, beta, aggregate) -> int:
    check_graph("demo_momentum", INFO, topology)
    if lr is None:
        raise ValueError(
            "demo_momentum needs lr=, the step size of its sign update x <- x - lr sign(u) (it replaces the "
            "local optimizer's step: the optimizer sees zero gradients, only its weight decay acts)"
        )
    check_positive("lr", lr)
    chunk = check_int("chunk", chunk, 1)
    check_int("k", k, 1, chunk)
    if is_concrete(beta):
        b = np.asarray(beta, np.float64)
        if not np.all(np.isfinite(b) & (b >= 0) & (b < 1)):
            raise ValueError(f"beta={beta!r} must be in [0, 1)")
    if aggregate not in AGGREGATES:
        raise ValueError(f"aggregate={aggregate!r} is unknown; known: {', '.join(map(repr, AGGREGATES))}")
    return chunk


def demo_momentum(
    topology: Topology,
    lr: Any = None,
    k: int = 32,
    chunk: int = 64,
    beta: Any = 0.999,
    aggregate: str = "selected",
) -> GossipAlgorithm:
    """DeMo over a graph: decoupled momentum, top-k DCT components exchanged, sign update.

    Per node i and chunk c (vectors of C entries), with the gradients ``g`` of the round's local
    steps (the gradient hook; one per round with ``local_steps = 1``, the paper's algorithm):

    .. math::

        m_i \\leftarrow \\beta m_i + g_i \\quad (\\text{hook}), \\qquad
        X_i = \\mathrm{DCT}(m_i), \\quad q_i = \\mathrm{top}_k(X_i), \\quad
        m_i \\leftarrow m_i - \\mathrm{IDCT}(q_i) \\\\
        Q_i = \\frac{\\sum_j W_{ij}(t)\\, q_j}{\\sum_j W_{ij}(t)\\, s_j} \\ (\\text{selected}) \\ \\text{or} \\
        \\sum_j W_{ij}(t)\\, q_j \\ (\\text{all}), \\qquad
        x_i \\leftarrow x_i - \\mathrm{lr}\\, \\mathrm{sign}(\\mathrm{IDCT}(Q_i))

    with DCT the orthonormal DCT-II over the C entries of a chunk, ``top_k`` keeping the k
    coefficients of largest magnitude per chunk (ties: the lower index), ``s_j`` the 0/1 indicator
    of the coefficients node j sent and ``Q_i = 0`` where no in-neighbour (self included) sent one.
    ``"selected"`` averages each coefficient over the nodes that sent it, as the reference code's
    all-gather does (on the complete graph with uniform weights it is exactly that);
    ``"all"`` is the plain weighted mean of the zero-filled messages.

    Reductions: with ``k = C`` and ``beta = 0`` every coefficient is sent and ``m`` is emptied each
    round, so a round is averaged sign-SGD, ``x_i <- x_i - lr sign(sum_j W_ij g_j)``. On the complete
    graph every node gets the same update, so identical models stay identical (data-parallel DeMo).
    On other graphs nothing averages the models: each node follows the sign of its neighbourhood's
    momentum components.

    The reference code accumulates ``lr g`` instead of ``g``; with a constant ``lr`` the two runs
    are the same (top-k, the residual and the sign are scale-equivariant). It cuts a matrix into
    2-D blocks (2-D DCT) whose sides divide its dimensions; here every leaf is flattened and cut into
    1-D chunks of C entries, the last one zero-padded.

    Bits per (sender, receiver) message: ``k (b + ceil(log2 C))`` per chunk, ``b`` the bits of the
    momentum's dtype (32 for float32), summed over the ``ceil(D_leaf / C)`` chunks of every leaf.

    Args:
      topology: doubly stochastic graph, static, time-varying or stochastic; the complete graph is
        the all-reduce (all-gather) form of the paper.
      lr: the step size of the sign update, > 0 (float or array, sweepable). Required: the local
        optimizer's learning rate does not act (it sees zero gradients).
      k: components kept per chunk, 1 <= k <= chunk (Python int; the reference's 32).
      chunk: C, entries per chunk (Python int >= 1; the reference's 64).
      beta: momentum decay in [0, 1) (float or array; the reference's 0.999).
      aggregate: ``"selected"`` or ``"all"`` (above).

    Returns:
      A :class:`~jaxgossip.types.GossipAlgorithm` with a ``gradient`` hook and state
      :class:`DemoState` (one chunked model copy).

    Raises:
      ValueError: ``lr`` missing or not > 0, ``k`` outside [1, chunk], ``chunk`` < 1, ``beta``
        outside [0, 1), an unknown ``aggregate``, a graph that is not doubly stochastic.

    References:
      Peng, Quesnelle, Kingma, arXiv:2411.19870; bloc97/DeMo.
    """
    chunk = _check(topology, lr, k, chunk, beta, aggregate)
    index_bits = math.ceil(math.log2(chunk)) if chunk > 1 else 0
    basis = dct_matrix(chunk)
    forward, inverse = basis.T, basis

    def init_fn(params):
        check_params(topology, params)
        m = jax.tree_util.tree_map(lambda leaf: to_chunks(jnp.zeros_like(leaf), chunk), params)
        return DemoState(m=m, count=jnp.zeros([], jnp.int32))

    def gradient_fn(grads, params, state):
        del params

        def accumulate(m, g):
            return jnp.asarray(beta, m.dtype) * m + to_chunks(g.astype(m.dtype), chunk)

        m = jax.tree_util.tree_map(accumulate, state.m, grads)
        return jax.tree_util.tree_map(jnp.zeros_like, grads), state._replace(m=m)

    def step_fn(params, state, key):
        t = state.count
        graph = topology.draw(key, t).graph  # the topology itself unless it is stochastic
        # The transforms run in at least float32; the momentum and the messages keep their dtype
        # (bfloat16 under --message_dtype=bf16).
        coefficients = jax.tree_util.tree_map(lambda m: _transform(_wide(m), forward), state.m)
        sent = jax.tree_util.tree_map(lambda x: _top_k_mask(x, k), coefficients)
        q = jax.tree_util.tree_map(lambda x, s, m: jnp.where(s, x, 0).astype(m.dtype), coefficients, sent, state.m)
        m = jax.tree_util.tree_map(lambda m, q: (m - _transform(_wide(q), inverse)).astype(m.dtype), state.m, q)
        total = mix(graph, q, t)
        if aggregate == "selected":
            weight = mix(graph, jax.tree_util.tree_map(lambda s, x: s.astype(x.dtype), sent, q), t)
            total = jax.tree_util.tree_map(
                lambda num, den: jnp.where(den > 0, num / jnp.where(den > 0, den, 1), 0), total, weight
            )

        def move(x, aggregate_q):
            u = from_chunks(_transform(_wide(aggregate_q), inverse), x)
            return x - jnp.asarray(lr, x.dtype) * jnp.sign(u).astype(x.dtype)

        new_params = jax.tree_util.tree_map(move, params, total)
        per_message = sum(
            leaf.shape[1] * k * (value_bits(leaf) + index_bits) for leaf in jax.tree_util.tree_leaves(state.m)
        )
        bits = per_round(graph.out_degree, t) * float(per_message)
        return new_params, DemoState(m=m, count=t + 1), StepInfo(bits=bits)

    def debias_fn(params, state):
        del state
        return params

    return sign(GossipAlgorithm(init_fn, step_fn, debias_fn, gradient=gradient_fn), "demo_momentum", INFO)


INFO = AlgorithmInfo(
    demo_momentum,
    graph=GraphNeeds(mixing="doubly_stochastic", stackable=True, stochastic_graphs="any"),
    sweep=SweepFacts(shape_options={"k": "the number of components kept per chunk", "chunk": "the chunk length C"}),
    # lr is the sign step's size: 0.003 trains the default digits task (ring, MLP) to 92 % in 40 rounds.
    hooks=TrainerHooks(
        example_options={"lr": 0.003},
        reasons={"receive": "its messages are DCT components of momenta, not models"},
    ),
    execution=Execution(reasons={"asynchronous": "its sign update needs the round's aggregated components"}),
)
