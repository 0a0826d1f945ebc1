"""Model adapters: any model as pure functions whose parameters stack over nodes.

jaxgossip's runners are functional: they need ``init`` / ``apply`` functions whose ``params`` can be
stacked ``[N, ...]`` and vmapped. :class:`ModelFns` is that pair for one node, with node-local
normalization statistics carried beside the parameters; :func:`as_model_fns` builds it from a
flax linen module (:func:`linen_model_fns`), a flax NNX module (:func:`nnx_model_fns`) or a pure
``(init, apply)`` pair (:func:`pure_model_fns`).

An NNX module is stateful, but ``nnx.split`` separates it into a static ``graphdef`` and
``nnx.State`` pytrees, and ``nnx.merge`` rebuilds it inside a traced function, so the module is
used only transiently and never mutated across calls. :func:`nnx_apply_fn` and
:func:`nnx_init_stacked` are the parameters-only form of the same split (a forward function of the
``nnx.Param`` state, N models built from N keys).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
from flax import nnx

from jaxgossip.types import Array, Params, PRNGKey

__all__ = [
    "ModelFns",
    "linen_model_fns",
    "pure_model_fns",
    "nnx_model_fns",
    "as_model_fns",
    "nnx_apply_fn",
    "nnx_init_stacked",
]


class ModelFns(NamedTuple):
    """A model as two pure functions.

    Attributes:
      init: ``params, batch_stats = init(key, x)`` for one node; ``x`` [B, ...] example inputs.
        ``batch_stats`` is a (possibly empty) pytree of node-local statistics.
      apply: ``logits, batch_stats = apply(params, batch_stats, x, train)`` for one node;
        ``logits`` [B, C]. In training mode the returned statistics are the updated ones.
    """

    init: Callable[[PRNGKey, Array], tuple[Params, Any]]
    apply: Callable[[Params, Any, Array, bool], tuple[Array, Any]]


def linen_model_fns(model) -> ModelFns:
    """Wraps a flax linen module whose ``__call__(x, train)`` may use a ``batch_stats`` collection."""

    def init(key, x):
        variables = model.init(key, x, train=False)
        return variables["params"], variables.get("batch_stats", {})

    def apply(params, batch_stats, x, train):
        variables = {"params": params}
        if batch_stats:
            variables["batch_stats"] = batch_stats
        if train and batch_stats:
            logits, mutated = model.apply(variables, x, train=True, mutable=["batch_stats"])
            return logits, mutated["batch_stats"]
        return model.apply(variables, x, train=train), batch_stats

    return ModelFns(init, apply)


def pure_model_fns(init: Callable, apply: Callable) -> ModelFns:
    """Wraps a pure pair ``params = init(key, x)``, ``out = apply(params, x)`` (no normalization
    statistics; ``train`` is ignored) as :class:`ModelFns`."""

    def init_fn(key, x):
        return init(key, x), {}

    def apply_fn(params, batch_stats, x, train):
        del train
        return apply(params, x), batch_stats

    return ModelFns(init_fn, apply_fn)


def _nnx_split(module: nnx.Module) -> tuple[Any, nnx.State, nnx.State, nnx.State]:
    """``(graphdef, params, stats, rest)`` of an NNX module: its ``nnx.Param`` state, its
    ``nnx.BatchStat`` state and everything else (RNG counters, ...); ``nnx.merge`` of the four
    rebuilds the module."""
    return nnx.split(module, nnx.Param, nnx.BatchStat, ...)


def nnx_model_fns(module: nnx.Module) -> ModelFns:
    """Wraps a constructed flax NNX module ``out = module(x)`` as :class:`ModelFns` via
    ``nnx.split`` / ``nnx.merge``: the ``nnx.Param`` state is the params, the ``nnx.BatchStat``
    state the node-local statistics (both ``nnx.State`` pytrees), anything else is held fixed.
    ``train`` selects ``module.train()`` / ``module.eval()`` on the merged copy. The module is
    already initialized, so ``init`` ignores its key: every node starts from the module's weights
    (use ``identical_init=True``)."""
    graphdef, params, stats, rest = _nnx_split(module)

    def init(key, x):
        del key, x
        return params, stats

    def apply(params_i, stats_i, x, train):
        model = nnx.merge(graphdef, params_i, stats_i, rest)
        if train:
            model.train()
        else:
            model.eval()
        out = model(x)
        return out, nnx.state(model, nnx.BatchStat)

    return ModelFns(init, apply)


def nnx_apply_fn(model: nnx.Module) -> tuple[Any, nnx.State, Callable[..., Any]]:
    """Splits an NNX model into (graphdef, params, apply_fn) with a pure ``apply_fn(params, *args)``.

    Parameters are the ``nnx.Param`` variables; every other variable (BatchNorm statistics, RNG
    counters) is frozen into ``apply_fn`` as a constant, and the module's train / eval mode is kept
    as it is, so use this for models without mutable state in the forward pass (or in inference
    mode); :func:`nnx_model_fns` carries the statistics.

    Args:
      model: an ``nnx.Module``.

    Returns:
      graphdef: static structure.
      params: ``nnx.State`` pytree of one node's parameters.
      apply_fn: ``apply_fn(params, *args, **kwargs) -> model(*args, **kwargs)``; pure, so
        ``jax.vmap(apply_fn)(stacked_params, xs)`` runs N stacked models (params leaves [N, ...],
        xs [N, B, ...]).
    """
    graphdef, params, stats, rest = _nnx_split(model)

    def apply_fn(params: nnx.State, *args, **kwargs):
        return nnx.merge(graphdef, params, stats, rest)(*args, **kwargs)

    return graphdef, params, apply_fn


def nnx_init_stacked(make: Callable[[nnx.Rngs], nnx.Module], keys: jax.Array) -> tuple[Callable[..., Any], nnx.State]:
    """Builds N NNX models from keys [N] and returns (apply_fn, stacked params [N, ...]).

    Args:
      make: ``make(rngs) -> nnx.Module``, e.g. ``lambda rngs: MyModel(rngs=rngs)``.
      keys: [N] PRNG keys (N copies of one key give identical models).

    Returns:
      apply_fn: as in :func:`nnx_apply_fn` (non-parameter state taken from the model built from
        ``keys[0]``).
      params: ``nnx.State`` whose leaves are [N, ...].
    """
    _, _, apply_fn = nnx_apply_fn(make(nnx.Rngs(keys[0])))
    params = jax.vmap(lambda key: _nnx_split(make(nnx.Rngs(key)))[1])(keys)
    return apply_fn, params


def as_model_fns(model) -> ModelFns:
    """:class:`ModelFns` of ``model``: ModelFns as is, a pure ``(init, apply)`` tuple
    (:func:`pure_model_fns`), a flax NNX module (:func:`nnx_model_fns`) or a linen module
    (:func:`linen_model_fns`)."""
    if isinstance(model, ModelFns):
        return model
    if isinstance(model, tuple) and len(model) == 2 and all(callable(f) for f in model):
        return pure_model_fns(*model)
    if isinstance(model, nnx.Module):
        return nnx_model_fns(model)
    if callable(getattr(model, "init", None)) and callable(getattr(model, "apply", None)):
        return linen_model_fns(model)
    raise TypeError(
        f"model must be a ModelFns, a pure (init, apply) pair, a flax linen module or an NNX module, "
        f"got {type(model).__name__}"
    )
