"""DeepSqueeze: gossip of error-compensated compressed models.

Each node compresses its model plus the error it dropped before (error feedback on the model, not
on the gradient), sends the compressed value, and moves towards its neighbours' compressed values
with a small consensus step size ``gamma``.

References:
  Tang, Lian, Yu, Zhang, Liu, "DeepSqueeze: Decentralization Meets Error-Compensated
  Compression", 2019 (arXiv:1907.07346).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxgossip import compress
from jaxgossip.algorithms._shared.common import check_positive, per_round
from jaxgossip.algorithms.registry import check_graph, sign
from jaxgossip.ops.mixing import check_params, mix
from jaxgossip.topology import Topology
from jaxgossip.types import AlgorithmInfo, Array, GossipAlgorithm, GraphNeeds, Params, StepInfo, SweepFacts

__all__ = ["deepsqueeze", "DeepSqueezeState", "INFO"]


class DeepSqueezeState(NamedTuple):
    """State of :func:`deepsqueeze`."""

    delta: Params  # leaves [N, ...], error memory delta_i = v_i - C(v_i) of the previous round
    count: Array  # [] int32, communication rounds done so far


def deepsqueeze(
    topology: Topology,
    gamma: Any = 1.0,
    compressor: compress.CompressorSpec = "identity",
    compressor_options: Mapping[str, Any] | None = None,
) -> GossipAlgorithm:
    """DeepSqueeze: error-compensated compressed gossip of the models themselves.

    A baseline for compressed decentralized training with one extra model copy (the error memory
    ``delta``) instead of Choco's two. With strong compressors it needs a very small ``gamma``
    (0.01 for sign on the CIFAR-10 8-ring in the PowerGossip tuning). With the identity
    compressor ``delta`` stays 0 and the step is relaxed gossip ``x <- x + gamma (W x - x)``.

    One round, for every node i (``C`` the compressor, W = W(t)):

    .. math::

        v_i &= x_i + \\delta_i \\\\
        c_i &= C(v_i), \\qquad \\delta_i \\leftarrow v_i - c_i \\\\
        x_i &\\leftarrow x_i + \\gamma \\sum_j \\big(W_{ij} - \\mathbb 1[i = j]\\big)\\, c_j

    The node mean is preserved for column-stochastic W (the columns of ``W - I`` sum to 0). Unlike
    Choco, consensus-only DeepSqueeze with a biased compressor (top-k, sign) stops in a
    neighbourhood of the average whose size shrinks with ``gamma`` instead of converging to it.

    Ordering: ``step`` compresses the model it is given. The paper and the ChocoSGD code take the
    local gradient step first (``x^{k+1/2} = x^k - eta g``, then this step on ``x^{k+1/2}``); the
    PowerGossip code forms ``v_i`` from the pre-update model and applies the update afterwards.
    Which one is used is the trainer's ordering choice.

    Bits: node i's message ``c_i`` (its compressed cost, all leaves) is charged once per
    out-neighbour, self excluded.

    Args:
      topology: doubly stochastic graph, static, time-varying or stochastic (no state is tied to
        neighbours, so a round's failed links simply carry nothing).
      gamma: consensus step size > 0; float or array (sweepable under vmap).
      compressor: a :class:`~jaxgossip.compress.Compressor`, a compressor name or a spec mapping
        ``{"name": ..., **options}``; see :func:`jaxgossip.compress.resolve_compressor`.
      compressor_options: keyword options of a compressor given by name.

    Returns:
      A :class:`~jaxgossip.types.GossipAlgorithm` with state :class:`DeepSqueezeState`; ``step``
      uses its key for random compressors.

    References:
      Tang, Lian, Yu, Zhang, Liu, arXiv:1907.07346, 2019.
    """
    check_graph("deepsqueeze", INFO, topology)
    check_positive("gamma", gamma)
    comp = compress.resolve_compressor(compressor, compressor_options, "deepsqueeze")

    def init_fn(params):
        check_params(topology, params)
        return DeepSqueezeState(delta=jax.tree_util.tree_map(jnp.zeros_like, params), count=jnp.zeros([], jnp.int32))

    def step_fn(params, state, key):
        t = state.count
        v = jax.tree_util.tree_map(jnp.add, params, state.delta)
        c, msg_bits = compress.compress_tree(comp, v, key)
        delta = jax.tree_util.tree_map(jnp.subtract, v, c)
        graph = topology.draw(key, t).graph  # the topology itself unless it is stochastic
        mixed = mix(graph, c, t)
        new_params = jax.tree_util.tree_map(
            lambda x, wc, ci: x + jnp.asarray(gamma, x.dtype) * (wc - ci), params, mixed, c
        )
        bits = per_round(graph.out_degree, t) * msg_bits
        return new_params, DeepSqueezeState(delta=delta, count=t + 1), StepInfo(bits=bits)

    def debias_fn(params, state):
        del state
        return params

    return sign(GossipAlgorithm(init_fn, step_fn, debias_fn), "deepsqueeze", INFO)


INFO = AlgorithmInfo(
    deepsqueeze,
    graph=GraphNeeds(mixing="doubly_stochastic", stackable=True, stochastic_graphs="any"),
    sweep=SweepFacts(
        shape_options={"compressor_options": "compressor options fix the kept entries, a static shape"},
        step_size="gamma",
        relaxation_gamma=True,
    ),
)
