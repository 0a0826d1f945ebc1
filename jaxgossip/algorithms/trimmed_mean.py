"""Coordinate-wise trimmed mean over a node's in-neighbours and itself (a Byzantine-robust baseline).

The round reads the models through the in-neighbour slot table (:mod:`jaxgossip.algorithms._shared.messages`),
gathers the K slots of each leaf into ``[N, K, ...]`` (every value of a coordinate is needed at
once) and sorts them. Bits: one model per directed edge per round, as gossip.

References:
  Yin, Chen, Ramchandran, Bartlett, "Byzantine-robust distributed learning: towards optimal
  statistical rates", ICML 2018 (arXiv:1803.01498); its decentralized form as a baseline in He,
  Karimireddy, Jaggi 2022 (arXiv:2202.01545).
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxgossip.algorithms._shared.messages import coordinatewise_round, fixed_slot_graph, model_algorithm
from jaxgossip.checks import check_int
from jaxgossip.ops.mixing import per_node
from jaxgossip.topology import Topology
from jaxgossip.types import AlgorithmInfo, GossipAlgorithm, TrainerHooks

__all__ = ["trimmed_mean", "trimmed_mean_receive", "INFO"]


def trimmed_mean_receive(topology: Topology, trim: int = 1):
    """The round of :func:`trimmed_mean` on the received models (``TrainerHooks.receive``)."""
    trim = check_int("trim", trim, 0)

    def rule(ranked, count, leaf):
        b = jnp.minimum(trim, (count - 1) // 2)  # [N]: at least one value is kept
        pos = jnp.arange(ranked.shape[1])[None, :]
        keep = (pos >= b[:, None]) & (pos < (count - b)[:, None])
        keep = per_node(keep, leaf)
        kept = jnp.sum(jnp.where(keep, ranked, 0.0), axis=1)
        return kept / per_node(count - 2 * b, leaf).astype(kept.dtype)

    return coordinatewise_round(topology, "trimmed_mean", INFO, rule)


def trimmed_mean(topology: Topology, trim: int = 1) -> GossipAlgorithm:
    """Coordinate-wise trimmed mean over a node's in-neighbours and itself.

    For every coordinate, node i sorts the ``m_i = deg_in(i) + 1`` values of its neighbourhood
    ``v_(1) <= ... <= v_(m_i)``, drops the ``b_i`` smallest and the ``b_i`` largest and averages
    the rest:

    .. math::  x_i \\leftarrow \\frac{1}{m_i - 2 b_i} \\sum_{r = b_i + 1}^{m_i - b_i} v_{(r)},
               \\qquad b_i = \\min(\\mathrm{trim}, \\lfloor (m_i - 1) / 2 \\rfloor)

    The mixing weights are not used, only which nodes are in-neighbours; ``trim=0`` is the
    unweighted neighbourhood mean. It does not preserve the node mean.

    Args:
      topology: any fixed or time-varying graph with host tables.
      trim: values dropped from each end per coordinate (a Python int >= 0; lowered at nodes with
        too few neighbours so that at least one value is kept).

    Returns:
      A :class:`~jaxgossip.types.GossipAlgorithm` whose state is ``CountState(count)``.

    References:
      Yin et al., ICML 2018 (arXiv:1803.01498); He et al. 2022 (arXiv:2202.01545).
    """
    return model_algorithm(topology, trimmed_mean_receive(topology, trim=trim), "trimmed_mean", INFO)


INFO = AlgorithmInfo(
    trimmed_mean,
    graph=fixed_slot_graph("any"),
    hooks=TrainerHooks(receive=trimmed_mean_receive),
)
