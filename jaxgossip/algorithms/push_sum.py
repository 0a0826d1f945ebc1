"""Push-sum gossip, the communication step of Stochastic Gradient Push (SGP).

Push-sum works on directed and time-varying graphs whose mixing matrices are only column
stochastic (each sender splits its mass over itself and its out-neighbours). Every node keeps a
numerator ``x_i`` (the model parameters) and a scalar weight ``w_i``; both are mixed with the same
matrix, and the ratio ``z_i = x_i / w_i`` converges to the network average of the initial models.

References:
  Assran, Loizou, Ballas, Rabbat, "Stochastic Gradient Push for Distributed Deep Learning",
  ICML 2019 (arXiv:1811.10792).
  Kempe, Dobra, Gehrke, "Gossip-Based Computation of Aggregate Information", FOCS 2003 (push-sum).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxgossip import compress
from jaxgossip.algorithms._shared.common import per_round
from jaxgossip.algorithms.registry import check_graph, sign
from jaxgossip.ops.mixing import check_params, leaf_bits, mix, per_node
from jaxgossip.topology import Topology
from jaxgossip.types import (
    AlgorithmInfo,
    Array,
    AsyncForm,
    CostFacts,
    Execution,
    GossipAlgorithm,
    GraphNeeds,
    Params,
    StepInfo,
)

__all__ = ["push_sum", "PushSumState", "divide_by_weight", "WEIGHT_BITS_MODES", "ASYNC_SGP", "INFO"]

WEIGHT_BITS_MODES = ("always", "auto")


class PushSumState(NamedTuple):
    """State of :func:`push_sum`."""

    w: Array  # [N] float32, push-sum weights w_i (init 1); the numerators are the params
    count: Array  # [] int32, communication rounds done so far

    # Declares ``w`` push-sum weights (jaxgossip.types.carries_push_sum_weight): the final merge
    # mixes them with the numerators. A class attribute, not a field.
    push_sum_weight = True


def divide_by_weight(params: Params, w: Array) -> Params:
    """The de-biased models ``z_i = x_i / w_i`` (``w`` [N] broadcast over each leaf ``[N, ...]``)."""

    def divide(leaf):
        scale = per_node(w, leaf)
        return (leaf / scale.astype(jnp.promote_types(leaf.dtype, jnp.float32))).astype(leaf.dtype)

    return jax.tree_util.tree_map(divide, params)


def _check_weight_bits(weight_bits: str) -> str:
    if weight_bits not in WEIGHT_BITS_MODES:
        raise ValueError(f"weight_bits={weight_bits!r} is unknown; known modes: {WEIGHT_BITS_MODES}")
    return weight_bits


def push_sum(topology: Topology, weight_bits: str = "always") -> GossipAlgorithm:
    """Push-sum gossip (SGP's communication): mix numerators and weights with a column-stochastic W.

    Use it on directed, irregular or time-varying graphs (``one_peer_exponential``,
    ``directed_ring``, ``random_directed``, schedules of them), where gossip with a merely column
    stochastic matrix would bias the average. The trainer evaluates gradients at the de-biased model
    ``z_i = x_i / w_i`` (:attr:`GossipAlgorithm.debias`) and applies its updates to the numerator
    ``x_i`` (the params), as SGP does. ``sum_i x_i`` and ``sum_i w_i = N`` are preserved exactly
    (up to float rounding), and ``z_i`` converges to ``sum_i x_i / N`` on a strongly connected
    (union) graph. On a doubly stochastic W the weights stay 1 and this is plain gossip.

    .. math::

        x_i &\\leftarrow \\sum_j W_{ij}(t)\\, x_j, \\qquad
        w_i \\leftarrow \\sum_j W_{ij}(t)\\, w_j, \\qquad
        z_i = x_i / w_i

    Bits: each node sends ``32 D`` bits (fp32 model; ``leaf_bits``) plus 32 bits for its weight to
    each of its out-neighbours (self excluded) per round (see docs/algorithms.md, section push_sum).
    SGP does not send the weight when the graph is regular with uniform weights;
    ``weight_bits="auto"`` reproduces that by not charging the weight when every W(t) is doubly
    stochastic (then ``w_i = 1`` always).

    Args:
      topology: column-stochastic graph, static or time-varying (round t uses W(t mod T)), or
        stochastic (``random_out``, ``random_matching``, ``with_failures``: drawn from the step key).
      weight_bits: ``"always"`` (default: charge 32 bits for the weight in every message) or
        ``"auto"`` (charge it only when W is not doubly stochastic).

    Returns:
      A :class:`~jaxgossip.types.GossipAlgorithm` with state :class:`PushSumState`; its ``debias``
      returns ``x / w``.

    References:
      Assran, Loizou, Ballas, Rabbat, ICML 2019 (arXiv:1811.10792), Algorithm 1.
    """
    check_graph("push_sum", INFO, topology)
    _check_weight_bits(weight_bits)
    send_weight = weight_bits == "always" or not topology.is_doubly_stochastic

    def init_fn(params):
        check_params(topology, params)
        return PushSumState(w=jnp.ones([topology.num_nodes], jnp.float32), count=jnp.zeros([], jnp.int32))

    def step_fn(params, state, key):
        t = state.count
        graph = topology.draw(key, t).graph  # the topology itself unless it is stochastic
        new_params, w = mix(graph, (params, state.w), t)
        message = leaf_bits(params) + (compress.WEIGHT_BITS if send_weight else 0)
        bits = per_round(graph.out_degree, t) * message
        return new_params, PushSumState(w=w, count=t + 1), StepInfo(bits=bits)

    def debias_fn(params, state):
        return divide_by_weight(params, state.w)

    return sign(GossipAlgorithm(init_fn, step_fn, debias_fn), "push_sum", INFO)


# Without rounds: overlap SGP, delayed push-sum messages added on arrival
# (jaxgossip.engine.asynchronous runs its event rule).
ASYNC_SGP = AsyncForm("async_sgp", rule="delayed_push_sum")

INFO = AlgorithmInfo(
    push_sum,
    graph=GraphNeeds(mixing="column_stochastic", stackable=True, stochastic_graphs="any"),
    cost=CostFacts(dense_values=True),
    execution=Execution(asynchronous=(ASYNC_SGP,)),
)
