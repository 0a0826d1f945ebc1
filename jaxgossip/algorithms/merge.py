"""Final merge phase: uncompressed rounds or exact averaging applied once after training.

Usable after any algorithm: on a push-sum state (one whose type declares its weight field ``w``,
:func:`jaxgossip.types.carries_push_sum_weight`: push_sum, sparse_push, scsp) it mixes numerators
and weights together, so ``x / w`` keeps its meaning; on any other state it mixes the params alone.
SCSP's part (a) is this phase (see :mod:`jaxgossip.algorithms.scsp` and docs/algorithms.md, section
final merge). The trainer calls :func:`make_merge` once and jits the returned pure function.

References:
  Aketi, Singh, Rabaey, "Sparse-Push", arXiv:2102.05715, 2021 (gossip-only rounds at the end).
  Kempe, Dobra, Gehrke, "Gossip-Based Computation of Aggregate Information", FOCS 2003 (push-sum).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxgossip import compress
from jaxgossip.algorithms._shared.common import per_round
from jaxgossip.algorithms.registry import require_column_stochastic
from jaxgossip.checks import check_int
from jaxgossip.ops.mixing import check_params, leaf_bits, mix
from jaxgossip.topology import Topology
from jaxgossip.types import Array, Params, StepInfo, carries_push_sum_weight, round_counter

__all__ = ["merge", "make_merge"]


def _check_num_rounds(num_rounds: Any) -> Any:
    if isinstance(num_rounds, str):
        if num_rounds != "exact":
            raise ValueError(f"num_rounds={num_rounds!r} must be 'exact' or a positive int")
        return num_rounds
    return check_int("num_rounds", num_rounds, 1)


def _mean_leaf(leaf: Array) -> Array:
    mean = jnp.mean(leaf.astype(jnp.promote_types(leaf.dtype, jnp.float32)), axis=0)
    return jnp.broadcast_to(mean, leaf.shape).astype(leaf.dtype)


def merge(topology: Topology, params: Params, state: Any, num_rounds: Any = "exact") -> tuple[Params, Any, StepInfo]:
    """Final merge phase (SCSP part (a)): R uncompressed push-sum rounds or exact averaging.

    Called once after training, before the models are evaluated (see docs/algorithms.md, section
    final merge: the first author's code ends with gossip-only rounds; a third party describes a
    final global merge).
    Works on the state of any push-sum method (a state whose type declares its weight field ``w``,
    :func:`jaxgossip.types.carries_push_sum_weight`: push_sum, sparse_push, scsp) and, treating
    ``w = 1``, on the state of any other algorithm.

    .. math::

        \\text{R rounds:}\\quad x \\leftarrow W(t)\\, x,\\ w \\leftarrow W(t)\\, w
        \\ \\ (t = \\text{count}, \\dots, \\text{count} + R - 1); \\qquad
        \\text{exact:}\\quad x_i \\leftarrow \\tfrac1N \\textstyle\\sum_j x_j,\\
        w_i \\leftarrow \\tfrac1N \\textstyle\\sum_j w_j

    Both keep ``sum_i x_i`` and ``sum_i w_i``; after "exact" every node's ``x_i / w_i`` is the
    push-sum average ``sum_j x_j / sum_j w_j``. Public copies (``x_hat``, ``s``) are left as they are
    (they stay consistent: ``s`` still sums what was received), and ``count`` advances by R (by 1 for
    "exact").

    Bits (returned, not added to any training counter): per round, each node sends ``32 D + 32``
    bits (model and weight; ``32 D`` without a weight) to each out-neighbour; "exact" costs one
    full-model message per node, the all-reduce convention (docs/algorithms.md, section allreduce).

    Args:
      topology: the graph the rounds use; column stochastic for push-sum states, doubly stochastic
        otherwise (rounds only). A stochastic graph's rounds are drawn from the fixed key
        ``fold_in(jax.random.key(0), t)``.
      params: numerators, leaves [N, ...].
      state: the algorithm's state (NamedTuple, with ``w`` [N] for push-sum methods); its round
        counter ``count`` (:func:`jaxgossip.types.round_counter`), if it has one, numbers the
        rounds and advances.
      num_rounds: R, a static int >= 1, or ``"exact"``.

    Returns:
      ``(params, state, StepInfo(bits=[N] total bits each node sent during the merge))``.
    """
    return make_merge(topology, num_rounds)(params, state)


def make_merge(topology: Topology, num_rounds: Any = "exact") -> Callable[[Params, Any], tuple[Params, Any, StepInfo]]:
    """The pure, jittable ``merge_fn(params, state) -> (params, state, StepInfo)`` of :func:`merge`.

    Validates ``num_rounds`` ("exact" or an int >= 1) eagerly; the stochasticity of ``topology`` is
    checked against the state kind at the first call.
    """
    if not isinstance(topology, Topology):
        raise TypeError(f"merge needs a jaxgossip Topology, got {type(topology).__name__}")
    num_rounds = _check_num_rounds(num_rounds)

    def merge_fn(params, state):
        check_params(topology, params)
        has_w = carries_push_sum_weight(state)
        message = leaf_bits(params) + (compress.WEIGHT_BITS if has_w else 0)
        w = state.w if has_w else None
        count = round_counter(state)
        if num_rounds == "exact":
            params = jax.tree_util.tree_map(_mean_leaf, params)
            if has_w:
                w = _mean_leaf(w)
            bits = jnp.full((topology.num_nodes,), float(message), jnp.float32)
            rounds = 1
        else:
            if has_w:
                require_column_stochastic(topology, "merge of a push-sum state")
            elif not topology.is_doubly_stochastic:
                raise ValueError(
                    f"merge of a state without push-sum weights needs doubly stochastic weights; "
                    f"{topology.name} is not (mixing would bias the average)"
                )
            start = jnp.zeros([], jnp.int32) if count is None else count

            def body(carry, r):
                x, w_, bits = carry
                t = start + r
                # A stochastic graph's merge rounds are drawn from a fixed key (merge takes none).
                graph = topology.draw(jax.random.fold_in(jax.random.key(0), t), t).graph
                if has_w:
                    x, w_ = mix(graph, (x, w_), t)
                else:
                    x = mix(graph, x, t)
                return (x, w_, bits + per_round(graph.out_degree, t) * message), None

            bits0 = jnp.zeros((topology.num_nodes,), jnp.float32)
            (params, w, bits), _ = jax.lax.scan(body, (params, w, bits0), jnp.arange(num_rounds, dtype=jnp.int32))
            rounds = num_rounds
        updates = {}
        if has_w:
            updates["w"] = w
        if count is not None:
            updates["count"] = count + rounds
        if updates:
            state = state._replace(**updates)
        return params, state, StepInfo(bits=bits)

    return merge_fn
