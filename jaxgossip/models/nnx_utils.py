"""Using flax NNX models as pure `(params, x) -> logits` functions that stack over nodes.

jaxgossip's training code is functional: it needs `apply_fn(params, batch)` whose `params` can be
stacked [N, ...] and vmapped. An NNX module is stateful, but `nnx.split` separates it into a static
`graphdef` and `nnx.State` pytrees, and `nnx.merge` rebuilds it inside a traced function, so the
module is used only transiently and never mutated across calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

__all__ = ["nnx_apply_fn", "nnx_init_stacked"]


def nnx_apply_fn(model: nnx.Module) -> tuple[Any, nnx.State, Callable[..., Any]]:
    """Splits an NNX model into (graphdef, params, apply_fn) with a pure `apply_fn(params, *args)`.

    Parameters are the `nnx.Param` variables; every other variable (BatchNorm statistics, RNG
    counters) is frozen into `apply_fn` as a constant, so use this for models without mutable state
    in the forward pass (or in inference mode).

    Args:
      model: an `nnx.Module`.

    Returns:
      graphdef: static structure.
      params: `nnx.State` pytree of one node's parameters.
      apply_fn: `apply_fn(params, *args, **kwargs) -> model(*args, **kwargs)`; pure, so
        `jax.vmap(apply_fn)(stacked_params, xs)` runs N stacked models (params leaves [N, ...],
        xs [N, B, ...]).
    """
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def apply_fn(params: nnx.State, *args, **kwargs):
        return nnx.merge(graphdef, params, rest)(*args, **kwargs)

    return graphdef, params, apply_fn


def nnx_init_stacked(make: Callable[[nnx.Rngs], nnx.Module], keys: jax.Array) -> tuple[Callable[..., Any], nnx.State]:
    """Builds N NNX models from keys [N] and returns (apply_fn, stacked params [N, ...]).

    Args:
      make: `make(rngs) -> nnx.Module`, e.g. `lambda rngs: MyModel(rngs=rngs)`.
      keys: [N] PRNG keys (N copies of one key give identical models).

    Returns:
      apply_fn: as in `nnx_apply_fn` (non-parameter state taken from the model built from keys[0]).
      params: `nnx.State` whose leaves are [N, ...].
    """
    _, _, apply_fn = nnx_apply_fn(make(nnx.Rngs(keys[0])))
    params = jax.vmap(lambda key: nnx.split(make(nnx.Rngs(key)), nnx.Param, ...)[1])(keys)
    return apply_fn, params
