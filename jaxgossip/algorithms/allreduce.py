"""Exact all-reduce averaging: the centralised (mini-batch SGD) baseline."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgossip.algorithms._shared.common import CountState
from jaxgossip.algorithms.registry import check_graph, sign
from jaxgossip.ops.mixing import check_params, leaf_bits
from jaxgossip.topology import Topology
from jaxgossip.types import AlgorithmInfo, CostFacts, GossipAlgorithm, GraphNeeds, StepInfo

__all__ = ["allreduce", "INFO"]


def allreduce(topology: Topology | int) -> GossipAlgorithm:
    """Exact averaging of all node models every round, ignoring the graph's edges.

    .. math::  x_i \\leftarrow \\frac{1}{N} \\sum_j x_j

    Bits follow the PowerGossip code's convention (see docs/algorithms.md, section allreduce): one
    full-model message of ``32 D`` bits per node per round (a ring all-reduce would move about
    twice that).

    The graph is ignored, stochastic graphs and their failures included: the all-reduce is the
    reliable centralised reference line of a failure study (docs/topologies.md, section stochastic
    graphs).

    Args:
      topology: a Topology (only its N is used) or the node count N.

    References:
      Goyal et al., "Accurate, Large Minibatch SGD", 2017 (arXiv:1706.02677).
    """
    check_graph("allreduce", INFO, topology)
    num_nodes = topology.num_nodes if hasattr(topology, "num_nodes") else int(topology)
    if num_nodes < 1:
        raise ValueError(f"allreduce needs at least one node, got N={num_nodes}")

    def init_fn(params):
        check_params(num_nodes, params)
        return CountState(count=jnp.zeros([], jnp.int32))

    def step_fn(params, state, key):
        del key
        mean = jax.tree_util.tree_map(
            lambda x: jnp.broadcast_to(jnp.mean(x.astype(jnp.promote_types(x.dtype, jnp.float32)), 0), x.shape).astype(
                x.dtype
            ),
            params,
        )
        bits = jnp.full((num_nodes,), float(leaf_bits(params)), jnp.float32)
        return mean, CountState(count=state.count + 1), StepInfo(bits=bits)

    def debias_fn(params, state):
        del state
        return params

    return sign(GossipAlgorithm(init_fn, step_fn, debias_fn), "allreduce", INFO)


INFO = AlgorithmInfo(
    allreduce,
    graph=GraphNeeds(stackable=True, stochastic_graphs="any"),
    cost=CostFacts(allreduce_cost=True, dense_values=True),
)
