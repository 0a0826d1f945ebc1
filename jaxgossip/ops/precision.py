"""Mixed precision: bfloat16 compute over float32 master weights, and bfloat16 messages.

**Compute policy** (``--precision``). ``fp32`` runs everything in float32. ``bf16`` keeps the
master weights, the optimizer state and the communication in float32 and runs each node's forward
and backward pass in bfloat16: :func:`mixed_precision` wraps any model's pure ``apply`` so that

    out = f32(apply(bf16(theta), bf16(s), bf16(x)))

where ``theta`` are one node's float32 parameters, ``s`` its normalization statistics and ``x``
its batch (integer inputs such as token ids are left alone). The gradient of the float32 loss with
respect to ``theta`` flows back through the casts, so it is float32 (rounded to bfloat16 on the
way through each layer) and the optax update is applied to the float32 master copy, as in
Micikevicius et al., "Mixed Precision Training", ICLR 2018 (bfloat16 needs no loss scaling: its
exponent range is float32's). The normalization statistics a model returns are stored back as
float32, so only the batch moments of one step are bfloat16. The policy wraps the model, not a
layer, so it holds for every model (MLP, CNN, ResNet, VGG, the transformer, plug-ins).

**Message dtype** (``--message_dtype``). With ``bf16`` every algorithm communicates bfloat16
values: :func:`with_message_dtype` runs the algorithm's round on ``q = bf16(x)`` and adds the change
it makes to the float32 models,

    x <- x + (f32(step(q)) - f32(q)),

so gossip becomes ``x + (W - I) q`` (still mean preserving for doubly stochastic W, mass
preserving for column stochastic W) and the bit accounting, which prices a value at its dtype's
width (:func:`jaxgossip.compress.value_bits`), counts 16 bits per value. The algorithm's state
(Choco-style public copies, push-sum weights, trackers) mirrors what was sent, so it is kept in
bfloat16 too; a gradient hook (gradient tracking, QGM) sees bfloat16 gradients and hands float32
ones to the local optimizer.

Shapes: every leaf is node-stacked, [N, ...].
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxgossip.types import GossipAlgorithm

__all__ = ["PRECISIONS", "MESSAGE_DTYPES", "DTYPES", "cast_floats", "mixed_precision", "with_message_dtype"]

#: ``--precision`` values: the dtype of each node's forward and backward pass.
PRECISIONS = ("fp32", "bf16")
#: ``--message_dtype`` values: the dtype of the values the algorithm sends.
MESSAGE_DTYPES = ("fp32", "bf16")
#: name -> dtype.
DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16}


def _dtype(name: str, known: tuple[str, ...], what: str):
    if name not in known:
        raise ValueError(f"{what}={name!r} is unknown; known: {', '.join(known)}")
    return DTYPES[name]


def cast_floats(tree: Any, dtype) -> Any:
    """``tree`` with its floating-point leaves cast to ``dtype`` (integer and key leaves kept)."""

    def cast(leaf):
        if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating):
            return leaf.astype(dtype)
        return leaf

    return jax.tree_util.tree_map(cast, tree)


def mixed_precision(model: Any, precision: str = "fp32") -> Any:
    """``model`` (a :class:`jaxgossip.models.adapters.ModelFns`) under the compute policy ``precision``
    (module docstring); ``fp32`` returns it unchanged.

    Raises:
      ValueError: an unknown ``precision`` (e.g. ``"fp8"``).
    """
    compute = _dtype(precision, PRECISIONS, "precision")
    if compute == jnp.float32:
        return model

    def apply(params, batch_stats, x, train):
        out, new_stats = model.apply(
            cast_floats(params, compute), cast_floats(batch_stats, compute), cast_floats(x, compute), train
        )
        # The loss and the stored statistics are float32: only the pass itself is bfloat16.
        return cast_floats(out, jnp.float32), cast_floats(new_stats, jnp.float32)

    return model._replace(apply=apply)


def with_message_dtype(algorithm: GossipAlgorithm, message_dtype: str = "fp32") -> GossipAlgorithm:
    """``algorithm`` sending ``message_dtype`` values (module docstring); ``fp32`` returns it
    unchanged.

    Raises:
      ValueError: an unknown ``message_dtype``.
    """
    dtype = _dtype(message_dtype, MESSAGE_DTYPES, "message_dtype")
    if dtype == jnp.float32:
        return algorithm

    def init(params):
        return algorithm.init(cast_floats(params, dtype))

    def step(params, state, key):
        sent = cast_floats(params, dtype)
        new, state, info = algorithm.step(sent, state, key)
        # The round's change, computed from what was sent, applied to the float32 models.
        params = jax.tree_util.tree_map(lambda x, n, q: x + (n.astype(x.dtype) - q.astype(x.dtype)), params, new, sent)
        return params, state, info

    def debias(params, state):
        return cast_floats(algorithm.debias(params, state), jnp.float32)

    gradient = None
    if algorithm.gradient is not None:

        def gradient(grads, params, state):
            grads, state = algorithm.gradient(cast_floats(grads, dtype), cast_floats(params, dtype), state)
            return cast_floats(grads, jnp.float32), state

    return algorithm._replace(init=init, step=step, debias=debias, gradient=gradient)
