"""Quasi-global momentum (QGM): heavy-ball momentum whose buffer follows the gossiped model's
displacement instead of the local gradients, robust to heterogeneous data.

References:
  Lin, Karimireddy, Stich, Jaggi, "Quasi-Global Momentum: Accelerating Decentralized Deep Learning
  on Heterogeneous Data", ICML 2021 (arXiv:2102.04761). The official code (epfml/
  quasi-global-momentum, ``decentralized_qg_sgd.py``) was read for the buffer rule; nothing is
  copied from it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.algorithms._shared.common import check_positive, per_round
from jaxgossip.algorithms.registry import check_graph, sign
from jaxgossip.checks import is_concrete
from jaxgossip.ops.mixing import check_params, leaf_bits, mix
from jaxgossip.topology import Topology
from jaxgossip.types import AlgorithmInfo, Array, GossipAlgorithm, GraphNeeds, Params, StepInfo, TrainerHooks

__all__ = ["qgm", "QGMState", "INFO"]


class QGMState(NamedTuple):
    """State of :func:`qgm` (model-shaped leaves ``[N, ...]``)."""

    m_hat: Params  # [N, ...] quasi-global momentum buffer, in gradient units
    x_start: Params  # [N, ...] params at the first local step of round `hook_round`
    hook_round: Array  # [] int32, round of the last hook call (-1 before the first)
    steps: Array  # [] int32, local steps (hook calls) taken in round `hook_round`
    count: Array  # [] int32, communication rounds done


def qgm(topology: Topology, lr: Any = None, beta: Any = 0.9, nesterov: bool = False) -> GossipAlgorithm:
    """Quasi-global momentum on exact gossip (QG-DSGDm): the local optimizer is fed a heavy-ball
    direction built from a buffer that tracks how the *gossiped* model moved, an estimate of the
    global descent direction rather than of the node's own biased gradient.

    With ``g_t`` node i's gradient at ``x_t``, ``eta = lr``, all vectors ``[N, D]``:

    .. math::

        m_t = \\beta \\hat m_{t-1} + g_t \\quad(\\text{Nesterov: } g_t + \\beta m_t),\\qquad
        x_{t+1} = W(t)\\,(x_t - \\eta\\, m_t) \\\\
        d_t = (x_t - x_{t+1}) / \\eta, \\qquad
        \\hat m_t = \\beta \\hat m_{t-1} + (1 - \\beta)\\, d_t,\\qquad \\hat m_{-1} = 0

    (the ``"atc"`` form of the paper; under ``"same_iterate"`` it is ``x_{t+1} = W x_t - eta m_t``
    with the same buffer rule). The gradient hook returns ``m_t`` and must be followed by
    ``optax.sgd(lr)`` *without* momentum (QGM replaces it). ``d_t`` is measured by the hook at
    the first local step of round t + 1, between the params it saw at the first local step of
    round t and now, so it holds under either ordering; with ``local_steps = H`` it is divided by
    H (the mean displacement per local step). ``step`` is plain gossip (D_bits per
    out-neighbour): the buffer is local and never sent.

    Weight decay in the optimizer chain (``optax.add_decayed_weights``) acts on ``m_t``; the
    authors' code adds it to ``g_t`` before the momentum (so it enters the buffer). ``lr`` must
    equal the optimizer's step size: the buffer converts a model displacement into
    gradient units with it. Under a learning-rate schedule pass the peak value; the buffer is then
    scaled down while the rate decays (the paper's code divides by the current rate).

    Args:
      topology: doubly stochastic graph, static, time-varying or stochastic (``random_matching``,
        ``with_failures`` of an undirected graph).
      lr: eta > 0, the local optimizer's learning rate (float or array, sweepable).
      beta: momentum in [0, 1) (float or array), also the buffer's averaging rate (the authors'
        code defaults that rate to 0.9, their momentum).
      nesterov: Nesterov form of the local heavy-ball step (Python bool).

    Returns:
      A :class:`~jaxgossip.types.GossipAlgorithm` with a ``gradient`` hook and state
      :class:`QGMState` (two model copies).

    References:
      Lin et al., ICML 2021 (arXiv:2102.04761).
    """
    check_graph("qgm", INFO, topology)
    if lr is None:
        raise ValueError(
            "qgm needs lr=, the local optimizer's learning rate (it scales the momentum buffer), and an "
            "optimizer without momentum: its buffer replaces the momentum (in a training run: momentum=0, "
            "--momentum=0 on the command line)"
        )
    check_positive("lr", lr)
    if is_concrete(beta) and not np.all((np.asarray(beta, np.float64) >= 0) & (np.asarray(beta, np.float64) < 1)):
        raise ValueError(f"beta={beta!r} must be in [0, 1)")
    if not isinstance(nesterov, bool):
        raise TypeError(f"nesterov={nesterov!r} must be True or False")

    def init_fn(params):
        check_params(topology, params)
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return QGMState(
            m_hat=zeros,
            x_start=params,
            hook_round=jnp.full([], -1, jnp.int32),
            steps=jnp.zeros([], jnp.int32),
            count=jnp.zeros([], jnp.int32),
        )

    def gradient_fn(grads, params, state):
        first = state.hook_round != state.count  # first local step of this round
        update_buffer = first & (state.hook_round >= 0)  # a previous round's start is recorded
        scale = 1.0 / (lr * jnp.maximum(state.steps, 1).astype(jnp.float32))

        def buffer(m_hat, x_start, z):
            d = (x_start - z) * jnp.asarray(scale, m_hat.dtype)
            b = jnp.asarray(beta, m_hat.dtype)
            return jnp.where(update_buffer, b * m_hat + (1 - b) * d, m_hat)

        m_hat = jax.tree_util.tree_map(buffer, state.m_hat, state.x_start, params)
        x_start = jax.tree_util.tree_map(lambda old, z: jnp.where(first, z, old), state.x_start, params)

        def direction(g, m_hat):
            b = jnp.asarray(beta, m_hat.dtype)
            m = b * m_hat + g.astype(m_hat.dtype)
            return g + b * m if nesterov else m

        new_grads = jax.tree_util.tree_map(direction, grads, m_hat)
        new_state = state._replace(
            m_hat=m_hat,
            x_start=x_start,
            hook_round=state.count,
            steps=jnp.where(first, 1, state.steps + 1).astype(jnp.int32),
        )
        return new_grads, new_state

    def step_fn(params, state, key):
        t = state.count
        # The buffer is built from the node's own displacement, whatever graph moved it, so a W(t)
        # drawn anew every round (mean-preserving) serves as well as a fixed one.
        graph = topology.draw(key, t).graph
        new_params = mix(graph, params, t)
        bits = per_round(graph.out_degree, t) * leaf_bits(params)
        return new_params, state._replace(count=t + 1), StepInfo(bits=bits)

    def debias_fn(params, state):
        del state
        return params

    return sign(GossipAlgorithm(init_fn, step_fn, debias_fn, gradient=gradient_fn), "qgm", INFO)


# lr must be the local optimizer's learning rate (0.05 is the trainer's default --lr).
INFO = AlgorithmInfo(
    qgm,
    graph=GraphNeeds(mixing="doubly_stochastic", stackable=True, stochastic_graphs="any"),
    hooks=TrainerHooks(example_options={"lr": 0.05}),
)
