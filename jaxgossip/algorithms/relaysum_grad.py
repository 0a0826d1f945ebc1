"""RelaySum/Grad: RelaySum over the updates of a spanning tree.

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

__all__ = ["relaysum_grad", "RelaySumGradState", "INFO"]


class RelaySumGradState(NamedTuple):
    """State of :func:`relaysum_grad`: edge messages and counts, the initial and the last models."""

    messages: Params  # leaves [E, ...]: m_{src -> dst}, a sum of updates over a subtree
    counts: Array  # [E] int32: c_{src -> dst}, how many nodes' initial models have travelled on it
    x0: Params  # [N, ...] initial models: sent once with the first update; the stand-in until heard
    x: Params  # [N, ...] the models after the last round; the update of a round is params - x
    count: Array  # [] int32, communication rounds done


def relaysum_grad(topology: Topology) -> GossipAlgorithm:
    """RelaySum/Grad: RelaySum over the updates of a spanning tree.

    Each round node i relays its update ``Delta_i^t = x_i^{t+1/2} - x_i^t`` (whatever the local
    optimizer did since the last round) and adds 1/N of every update that reached it:

    .. math::

        m_{i \\to j}^{t} &= v_i^{t} + \\sum_{k \\in N(i) \\setminus j} m_{k \\to i}^{t-1},\\qquad
        c_{i \\to j}^{t} = 1 + \\sum_{k \\in N(i) \\setminus j} c_{k \\to i}^{t-1},\\qquad
        v_i^{t} = \\Delta_i^{t} + [t = 0]\\, x_i^{0} \\\\
        x_i^{t+1} &= x_i^{t} + \\frac{1}{N}\\Big(\\Delta_i^{t} + \\sum_{j \\in N(i)} m_{j \\to i}^{t}
            - (n_i^{t} - n_i^{t-1})\\, x_i^{0}\\Big),\\qquad n_i^{t} = \\sum_{j \\in N(i)} c_{j \\to i}^{t}

    Unrolled: ``x_i^{t+1} = (1/N) (sum of x_k^0 over the nodes heard from, i included,
    + (N - 1 - n_i^t) x_i^0) + (1/N) sum_k sum_{s <= t + 1 - max(1, d_ik)} Delta_k^s``: every
    update reaches every model exactly once, with weight 1/N, delayed by the tree distance (delay 0
    for a node's own and its neighbours' updates). So once updates stop, all models agree after
    ``diam`` rounds (the tree's diameter) on ``mean(x^0) + mean(sum Delta)``, what all-reduce SGD
    reaches; with a constant update per node every model moves by exactly ``mean(Delta)`` per round
    from round ``diam`` on.

    Where we depart from the paper: its rule (``x_i += (Delta_i + sum_j m_{j->i}) / N``, no counts
    used) assumes one common initial model x^0 and leaves different initial models apart forever.
    Here each initial model travels once, with the node's first update, and counts let a node stand
    in its own x_i^0 for the nodes not heard from yet. With a common start the two rules are the
    same (the x^0 terms cancel), and the iterates equal the reference simulator's; from different
    starts the models are the exact average after ``diam`` rounds (``run_consensus``). Shapes:
    messages ``[E, ...]`` (E = 2 (N - 1)), counts ``[E]``, models ``[N, ...]``.

    Ordering ``atc`` only: the update is read as ``params - x`` at the start of ``step``; under
    ``same_iterate`` the runner adds the update after ``step`` as well, so a node would apply its
    own update in full and again at 1/N.

    Args:
      topology: an undirected tree (``chain``, ``binary_tree``, ``spanning_tree:SPEC``); its mixing
        weights are not used. Other graphs are refused, naming the cycle or the disconnection.

    Returns:
      A :class:`~jaxgossip.types.GossipAlgorithm` with state :class:`RelaySumGradState`. Each
      round node i sends ``deg_i (D_bits + 32)`` bits: one update and one count per tree neighbour.

    References:
      Vogels et al., NeurIPS 2021 (arXiv:2110.04175), RelaySGD/Grad; epfml/relaysgd
      ``paper-figures/algorithms.py`` (``relaysum_grad``).
    """
    check_graph("relaysum_grad", INFO, topology)
    tables = tree_tables(topology, "relaysum_grad")
    n = topology.num_nodes
    num_edges = int(tables.src.size)

    def init_fn(params):
        check_params(topology, params)
        return RelaySumGradState(
            messages=edge_zeros(params, num_edges),
            counts=jnp.zeros([num_edges], jnp.int32),
            x0=params,
            x=params,
            count=jnp.zeros([], jnp.int32),
        )

    def step_fn(params, state, key):
        del key
        first = state.count == 0
        delta = jax.tree_util.tree_map(jnp.subtract, params, state.x)
        payload = jax.tree_util.tree_map(lambda d, x0: jnp.where(first, d + x0, d), delta, state.x0)
        relayed = relay(tables, n, payload, state.messages, state.counts)
        arrived = relayed.heard - relayed.heard_before  # [N], nodes whose x^0 reached i this round

        def update(x, d, received, x0):
            arrived_x = per_node(arrived, x, cast=True)
            return x + (d + received - arrived_x * x0) / n

        new_params = jax.tree_util.tree_map(update, state.x, delta, relayed.received, state.x0)
        new_state = RelaySumGradState(relayed.messages, relayed.counts, state.x0, new_params, state.count + 1)
        return new_params, new_state, StepInfo(bits=relay_bits(topology, params))

    def debias_fn(params, state):
        del state
        return params

    return sign(GossipAlgorithm(init_fn, step_fn, debias_fn), "relaysum_grad", INFO)


INFO = AlgorithmInfo(
    relaysum_grad,
    graph=GraphNeeds(time_varying=False, stackable=False, tree=True, reasons=RELAY_GRAPH_REASONS),
    hooks=TrainerHooks(reasons=RELAY_RECEIVE_REASONS),
    execution=Execution(orderings=("atc",)),
)
