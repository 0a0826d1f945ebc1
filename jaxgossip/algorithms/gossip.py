"""Exact (uncompressed) relaxed gossip, the communication step of D-PSGD.

References:
  Lian et al., "Can Decentralized Algorithms Outperform Centralized Algorithms? A Case Study for
  Decentralized Parallel Stochastic Gradient Descent", NeurIPS 2017 (arXiv:1705.09056).
  Vogels et al., "PowerGossip", NeurIPS 2020 (arXiv:2008.01425): over-relaxation gamma = 1.308 on
  the 8-ring.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxgossip.algorithms._shared.common import CountState, check_positive, per_round, relax
from jaxgossip.algorithms._shared.messages import check_fixed_graph, read_slot
from jaxgossip.algorithms.registry import check_graph, sign
from jaxgossip.ops.mixing import check_params, leaf_bits, mix, per_node
from jaxgossip.topology import Topology
from jaxgossip.types import (
    AlgorithmInfo,
    AsyncForm,
    CostFacts,
    Execution,
    GossipAlgorithm,
    GraphNeeds,
    StepInfo,
    SweepFacts,
    TrainerHooks,
)

__all__ = ["gossip", "gossip_receive", "ASYNC_GOSSIP", "AD_PSGD", "INFO"]


def gossip(topology: Topology, gamma: Any = 1.0) -> GossipAlgorithm:
    """Exact relaxed gossip: every node sends its full model to each out-neighbour.

    .. math::  x_i \\leftarrow x_i + \\gamma \\Big(\\sum_j W_{ij}(t)\\, x_j - x_i\\Big)

    ``gamma = 1`` is plain averaging with W; ``gamma > 1`` is over-relaxation (see
    :func:`jaxgossip.topology.optimal_gamma`). Preserves the node mean for doubly stochastic W.
    Each node sends ``D * 32`` bits (fp32 leaves) to each of its out-neighbours per round.

    Args:
      topology: doubly stochastic graph, static, time-varying or stochastic (``random_matching``,
        ``with_failures`` of an undirected graph; round t's graph is drawn from the step key).
      gamma: relaxation (consensus step size) > 0; a float or an array (sweepable under vmap).

    Returns:
      A :class:`~jaxgossip.types.GossipAlgorithm` whose state is ``CountState(count)``.

    References:
      Lian et al., NeurIPS 2017 (arXiv:1705.09056).
    """
    check_graph("gossip", INFO, topology)
    check_positive("gamma", gamma)

    def init_fn(params):
        check_params(topology, params)
        return CountState(count=jnp.zeros([], jnp.int32))

    def step_fn(params, state, key):
        t = state.count
        graph = topology.draw(key, t).graph  # the topology itself unless it is stochastic
        mixed = mix(graph, params, t)
        new_params = relax(params, mixed, gamma)
        bits = per_round(graph.out_degree, t) * leaf_bits(params)
        return new_params, CountState(count=t + 1), StepInfo(bits=bits)

    def debias_fn(params, state):
        del state
        return params

    return sign(GossipAlgorithm(init_fn, step_fn, debias_fn), "gossip", INFO)


def gossip_receive(topology: Topology, gamma: Any = 1.0):
    """The round of :func:`gossip` as a function of the models each receiver reads per
    in-neighbour slot (``TrainerHooks.receive``, :class:`~jaxgossip.algorithms.Received`):
    ``x_i + gamma (sum_k w_ik r_ik - x_i)``. Fixed or time-varying graphs with host tables."""
    check_graph("gossip", INFO, topology)
    check_fixed_graph(topology, "gossip")
    check_positive("gamma", gamma)

    def round_fn(params, state, received, key):
        del key
        t = state.count
        mixed = None
        for k in range(received.neighbors.shape[1]):
            w = received.weights[:, k]
            term = jax.tree_util.tree_map(
                lambda r, w=w: per_node(w, r, cast=True) * r, read_slot(received, k)
            )
            mixed = term if mixed is None else jax.tree_util.tree_map(jnp.add, term, mixed)
        new_params = relax(params, mixed, gamma)
        bits = per_round(topology.out_degree, t) * leaf_bits(params)
        return new_params, CountState(count=t + 1), StepInfo(bits=bits)

    return round_fn


# Without rounds: mixing with the newest copies of the neighbours that have arrived (the default),
# or AD-PSGD's pairwise averaging (jaxgossip.engine.asynchronous runs their event rules).
ASYNC_GOSSIP = AsyncForm("async_gossip", rule="stale_mixing")
AD_PSGD = AsyncForm("ad_psgd", rule="pairwise_averaging")

INFO = AlgorithmInfo(
    gossip,
    graph=GraphNeeds(mixing="doubly_stochastic", stackable=True, stochastic_graphs="any"),
    sweep=SweepFacts(step_size="gamma", relaxation_gamma=True),
    hooks=TrainerHooks(receive=gossip_receive),
    cost=CostFacts(dense_values=True),
    execution=Execution(asynchronous=(ASYNC_GOSSIP, AD_PSGD)),
)
