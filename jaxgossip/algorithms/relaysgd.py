"""RelaySGD: RelaySum over the models of a spanning tree (RelaySum/Model).

The relay (one message per tree neighbour per round, each value reaching every node once, delayed by
the tree distance, with a count) is :mod:`jaxgossip.algorithms._shared.tree_tables`.

References:
  Vogels, He, Koloskova, Lin, Karimireddy, Stich, Jaggi, "RelaySum for Decentralized Deep Learning
  on Heterogeneous Data", NeurIPS 2021 (arXiv:2110.04175); code github.com/epfml/relaysgd
  (``paper-figures/algorithms.py``: ``relaysum_model``, ``relaysum_grad``; ``utils/communication.py``:
  ``RelayMechanism``, whose stand-in for missing values is each worker's initial model for
  RelaySum/Model and 0 for RelaySum/Grad).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxgossip.algorithms._shared.tree_tables import (
    RELAY_GRAPH_REASONS,
    RELAY_RECEIVE_REASONS,
    edge_zeros,
    relay,
    relay_bits,
    tree_tables,
)
from jaxgossip.algorithms.registry import check_graph, sign
from jaxgossip.ops.mixing import check_params, per_node
from jaxgossip.topology import Topology
from jaxgossip.types import AlgorithmInfo, Array, Execution, GossipAlgorithm, GraphNeeds, Params, StepInfo, TrainerHooks

__all__ = ["relaysgd", "RelaySumState", "INFO"]


class RelaySumState(NamedTuple):
    """State of :func:`relaysgd`: the last round's message and count on every directed tree edge."""

    messages: Params  # leaves [E, ...], E = 2 (N - 1): m_{src -> dst}, a sum of models over a subtree
    counts: Array  # [E] int32: c_{src -> dst}, how many nodes' models m_{src -> dst} sums
    x0: Params  # [N, ...] each node's initial model, its stand-in for models not yet received
    count: Array  # [] int32, communication rounds done


def relaysgd(topology: Topology) -> GossipAlgorithm:
    """RelaySGD: RelaySum over the models of a spanning tree (RelaySum/Model).

    Each round node i relays its model (after the local step, ``x_i^{t+1/2}``) with what the other
    neighbours sent it, and averages what reached it with weight 1/N each, standing in its initial
    model for the nodes not heard from yet:

    .. math::

        m_{i \\to j}^{t} &= x_i^{t+1/2} + \\sum_{k \\in N(i) \\setminus j} m_{k \\to i}^{t-1},\\qquad
        c_{i \\to j}^{t} = 1 + \\sum_{k \\in N(i) \\setminus j} c_{k \\to i}^{t-1} \\\\
        n_i^{t} &= 1 + \\sum_{j \\in N(i)} c_{j \\to i}^{t},\\qquad
        x_i^{t+1} = \\frac{1}{N}\\Big(x_i^{t+1/2} + \\sum_{j \\in N(i)} m_{j \\to i}^{t}
            + (N - n_i^{t})\\, x_i^{0}\\Big)

    with ``m^{-1} = 0, c^{-1} = 0``. Unrolled: ``x_i^{t+1} = (1/N) sum_j x_j^{(t + 1 - max(1, d_ij)) + 1/2}``,
    a uniform average over all nodes of models delayed by the tree distance ``d_ij`` (own model and
    neighbours' with delay 0), where a model from before round 0 reads as i's own initial model. After
    ``diam`` rounds (the tree's diameter) every ``n_i = N``. Shapes: messages ``[E, ...]`` with
    E = 2 (N - 1) directed edges, counts ``[E]``, models ``[N, ...]``.

    The mean of the models is not preserved; what is: with one common initial model x^0 (the
    paper's setting; the trainer's default ``identical_init``) the delay-weighted sum
    ``V^t = (1/N) sum_k sum_{d >= 1} #{i : max(1, d_ik) >= d} y_k^{t+1-d}`` of the half-step
    models y moves by exactly the sum of the round's updates, so after updates Delta stop the nodes
    agree on ``x^0 + mean(sum Delta) / dbar``, ``dbar = (1/N^2) sum_ik max(1, d_ik)``: RelaySGD
    damps the effective step size by ``dbar`` (the "learning-rate correction" of the paper's
    Appendix, figure 6 of epfml/relaysgd). From *different* initial models the nodes reach a
    consensus that is not their mean (each node's stand-in is its own initial model); use
    :func:`relaysum_grad` to average different models exactly.

    Ordering ``atc`` only: the update a node makes must be inside the model it relays (under
    ``same_iterate`` the runner would add it after the average, outside every other node's view).

    Args:
      topology: an undirected tree (``chain``, ``binary_tree``, ``spanning_tree:SPEC``); its mixing
        weights are not used. Other graphs are refused, naming the cycle or the disconnection.

    Returns:
      A :class:`~jaxgossip.types.GossipAlgorithm` with state :class:`RelaySumState`. Each round
      node i sends ``deg_i (D_bits + 32)`` bits: one model and one count per tree neighbour.

    References:
      Vogels et al., "RelaySum for Decentralized Deep Learning on Heterogeneous Data", NeurIPS
      2021 (arXiv:2110.04175), Algorithm 1.
    """
    check_graph("relaysgd", INFO, topology)
    tables = tree_tables(topology, "relaysgd")
    n = topology.num_nodes
    num_edges = int(tables.src.size)

    def init_fn(params):
        check_params(topology, params)
        return RelaySumState(
            messages=edge_zeros(params, num_edges),
            counts=jnp.zeros([num_edges], jnp.int32),
            x0=params,
            count=jnp.zeros([], jnp.int32),
        )

    def step_fn(params, state, key):
        del key
        relayed = relay(tables, n, params, state.messages, state.counts)
        missing = n - 1 - relayed.heard  # [N], nodes not heard from yet

        def average(x, received, x0):
            missing_x = per_node(missing, x, cast=True)
            return (x + received + missing_x * x0) / n

        new_params = jax.tree_util.tree_map(average, params, relayed.received, state.x0)
        new_state = RelaySumState(relayed.messages, relayed.counts, state.x0, state.count + 1)
        return new_params, new_state, StepInfo(bits=relay_bits(topology, params))

    def debias_fn(params, state):
        del state
        return params

    return sign(GossipAlgorithm(init_fn, step_fn, debias_fn), "relaysgd", INFO)


INFO = AlgorithmInfo(
    relaysgd,
    graph=GraphNeeds(time_varying=False, stackable=False, tree=True, reasons=RELAY_GRAPH_REASONS),
    hooks=TrainerHooks(reasons=RELAY_RECEIVE_REASONS),
    execution=Execution(orderings=("atc",)),
)
