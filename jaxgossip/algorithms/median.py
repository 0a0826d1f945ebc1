"""Coordinate-wise median over a node's in-neighbours and itself (a Byzantine-robust baseline).

The round reads the models through the in-neighbour slot table (:mod:`jaxgossip.algorithms._shared.messages`),
gathers the K slots of each leaf into ``[N, K, ...]`` and sorts them. Bits: one model per
directed edge per round, as gossip.

References:
  Yin, Chen, Ramchandran, Bartlett, "Byzantine-robust distributed learning: towards optimal
  statistical rates", ICML 2018 (arXiv:1803.01498); its decentralized form as a baseline in He,
  Karimireddy, Jaggi 2022 (arXiv:2202.01545).
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxgossip.algorithms._shared.messages import coordinatewise_round, fixed_slot_graph, model_algorithm
from jaxgossip.topology import Topology
from jaxgossip.types import AlgorithmInfo, GossipAlgorithm, TrainerHooks

__all__ = ["median", "median_receive", "INFO"]


def median_receive(topology: Topology):
    """The round of :func:`median` on the received models (``TrainerHooks.receive``)."""

    def rule(ranked, count, leaf):
        def pick(pos):  # the pos-th smallest value of every coordinate, pos [N]
            idx = jnp.reshape(pos, (-1, 1) + (1,) * (leaf.ndim - 1))
            idx = jnp.broadcast_to(idx, (ranked.shape[0], 1) + ranked.shape[2:])
            return jnp.take_along_axis(ranked, idx, axis=1)[:, 0]

        return 0.5 * (pick((count - 1) // 2) + pick(count // 2))

    return coordinatewise_round(topology, "median", INFO, rule)


def median(topology: Topology) -> GossipAlgorithm:
    """Coordinate-wise median over a node's in-neighbours and itself.

    .. math::  x_i \\leftarrow \\mathrm{median}\\{x_j : j \\in N_{in}(i) \\cup \\{i\\}\\}
               \\quad\\text{per coordinate}

    With an even neighbourhood size the two middle values are averaged. The mixing weights are not
    used, only which nodes are in-neighbours. It does not preserve the node mean, and from some
    starts it stops short of consensus: on a ring, a median over three neighbours keeps every
    locally monotone sequence of models (a root signal of the median filter).

    Args:
      topology: any fixed or time-varying graph with host tables.

    Returns:
      A :class:`~jaxgossip.types.GossipAlgorithm` whose state is ``CountState(count)``.

    References:
      Yin et al., ICML 2018 (arXiv:1803.01498); He et al. 2022 (arXiv:2202.01545).
    """
    return model_algorithm(topology, median_receive(topology), "median", INFO)


INFO = AlgorithmInfo(
    median,
    graph=fixed_slot_graph("any"),
    hooks=TrainerHooks(receive=median_receive),
)
