"""SPARTA: sparse parameter averaging. Each round every node gossips a random subset of coordinates.

Every round a Bernoulli(p) mask over the D coordinates of the model is drawn from a key every node
shares (the round's step key), so all nodes pick the same coordinates; on those coordinates the
node takes the relaxed gossip average with its in-neighbours, the others stay local:

    m_d ~ Bernoulli(p)  (d = 1..D, the same for every node in round t)
    x_{i,d} <- x_{i,d} + gamma (sum_j W_ij(t) x_{j,d} - x_{i,d})   where m_d = 1
    x_{i,d} <- x_{i,d}                                             where m_d = 0

With p = 1 the mask is full and the round is :func:`jaxgossip.algorithms.gossip`'s, bit for bit.
On a doubly stochastic W the node mean of every coordinate is kept.

Bits per (sender, receiver) message: the selected values at their dtype width plus one 64-bit
seed from which the receiver rebuilds the mask (the indices are not sent).

References:
  SPARTA (sparse parameter averaging), the ``SPARTAStrategy`` of exo-explore/gym
  (``exogym/strategy/sparta.py``): a Bernoulli(p) mask per parameter tensor each step, the
  selected entries all-reduced, default p = 0.005.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxgossip.algorithms._shared.common import CountState, check_positive, per_round, relax
from jaxgossip.algorithms._shared.messages import check_fixed_graph, read_slot
from jaxgossip.algorithms.registry import check_graph, sign
from jaxgossip.compress import value_bits
from jaxgossip.ops.mixing import check_params, mix, per_node
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

__all__ = ["sparta", "sparta_receive", "sparta_mask", "SEED_BITS", "INFO"]

#: Bits of the seed a message carries so that the receiver draws the sender's mask.
SEED_BITS = 64

# The mask's stream of the step key; the graph of a stochastic topology is drawn from the step key
# itself, as gossip draws it, so that p = 1 is gossip bit for bit on every graph.
_MASK_STREAM = 0x5A7


def sparta_mask(key: Array, params: Params, fraction: Any) -> Params:
    """The round's coordinate mask: per leaf a bool ``[1, ...]`` (one node's shape, broadcast over
    the N nodes), each entry True with probability ``fraction``, drawn from ``key`` (shared by all
    nodes). ``fraction`` may be traced."""
    mask_key = jax.random.fold_in(key, _MASK_STREAM)
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(mask_key, len(leaves)) if leaves else []
    p = jnp.asarray(fraction, jnp.float32)
    masks = [jax.random.bernoulli(k, p, (1,) + leaf.shape[1:]) for k, leaf in zip(keys, leaves)]
    return jax.tree_util.tree_unflatten(treedef, masks)


def _message_bits(params: Params, mask: Params) -> Array:
    """[] float32 bits of one message: the selected values at their dtype width plus the seed."""
    values = [
        jnp.sum(m, dtype=jnp.float32) * value_bits(leaf)
        for m, leaf in zip(jax.tree_util.tree_leaves(mask), jax.tree_util.tree_leaves(params))
    ]
    return sum(values, jnp.float32(SEED_BITS))


def _masked_merge(params: Params, mixed: Params, mask: Params, gamma: Any) -> Params:
    relaxed = relax(params, mixed, gamma)
    return jax.tree_util.tree_map(jnp.where, mask, relaxed, params)


def _check(topology: Topology, fraction: Any, gamma: Any) -> None:
    check_graph("sparta", INFO, topology)
    check_positive("fraction", fraction, upper=1.0)
    check_positive("gamma", gamma)


def sparta(topology: Topology, fraction: Any = 0.005, gamma: Any = 1.0) -> GossipAlgorithm:
    """SPARTA: relaxed gossip on a random subset of about ``p D`` coordinates per round.

    .. math::  x_i \\leftarrow x_i + \\gamma\\, m_t \\odot \\Big(\\sum_j W_{ij}(t)\\, x_j - x_i\\Big),
               \\qquad m_t \\sim \\mathrm{Bernoulli}(p)^D

    Shapes: params leaves ``[N, ...]`` (D coordinates per node in all); the mask ``m_t`` has one
    node's shape per leaf and is the same on every node (drawn from the round's step key, so a
    resumed run draws the same masks). Each node sends ``sum_d m_{t,d} * 32 + 64`` bits (fp32
    values and the mask's seed) to each of its out-neighbours.

    Args:
      topology: doubly stochastic graph, static, time-varying or stochastic (drawn from the step
        key, as :func:`~jaxgossip.algorithms.gossip` does); the complete graph is the all-reduce
        form of the reference.
      fraction: p in (0, 1], the probability that a coordinate is averaged this round (the expected
        fraction of the model sent); a float or an array (sweepable under vmap). The default is the
        reference's ``p_sparta = 0.005``.
      gamma: relaxation (consensus step size) > 0 on the selected coordinates.

    Returns:
      A :class:`~jaxgossip.types.GossipAlgorithm` whose state is ``CountState(count)``.

    Raises:
      ValueError: ``fraction`` not in (0, 1] or not finite, ``gamma`` <= 0, a graph that is not
        doubly stochastic.

    References:
      exo-explore/gym, ``exogym/strategy/sparta.py`` (SPARTA, sparse parameter averaging).
    """
    _check(topology, fraction, gamma)

    def init_fn(params):
        check_params(topology, params)
        return CountState(count=jnp.zeros([], jnp.int32))

    def step_fn(params, state, key):
        t = state.count
        graph = topology.draw(key, t).graph  # the topology itself unless it is stochastic
        mask = sparta_mask(key, params, fraction)
        new_params = _masked_merge(params, mix(graph, params, t), mask, gamma)
        bits = per_round(graph.out_degree, t) * _message_bits(params, mask)
        return new_params, CountState(count=t + 1), StepInfo(bits=bits)

    def debias_fn(params, state):
        del state
        return params

    return sign(GossipAlgorithm(init_fn, step_fn, debias_fn), "sparta", INFO)


def sparta_receive(topology: Topology, fraction: Any = 0.005, gamma: Any = 1.0):
    """The round of :func:`sparta` as a function of the models each receiver reads per
    in-neighbour slot (``TrainerHooks.receive``, :class:`~jaxgossip.algorithms.Received`): only the
    masked coordinates of what is read enter the average. Fixed or time-varying graphs."""
    _check(topology, fraction, gamma)
    check_fixed_graph(topology, "sparta")

    def round_fn(params, state, received, key):
        t = state.count
        mixed = None
        for k in range(received.neighbors.shape[1]):
            w = received.weights[:, k]
            term = jax.tree_util.tree_map(lambda r, w=w: per_node(w, r, cast=True) * r, read_slot(received, k))
            mixed = term if mixed is None else jax.tree_util.tree_map(jnp.add, term, mixed)
        mask = sparta_mask(key, params, fraction)
        new_params = _masked_merge(params, mixed, mask, gamma)
        bits = per_round(topology.out_degree, t) * _message_bits(params, mask)
        return new_params, CountState(count=t + 1), StepInfo(bits=bits)

    return round_fn


INFO = AlgorithmInfo(
    sparta,
    graph=GraphNeeds(mixing="doubly_stochastic", stackable=True, stochastic_graphs="any"),
    sweep=SweepFacts(step_size="gamma", relaxation_gamma=True, traced_options=("fraction",)),
    hooks=TrainerHooks(receive=sparta_receive),
    execution=Execution(reasons={"asynchronous": "its mask is drawn per synchronous round from a key all nodes share"}),
)
