"""Low-bit float messages: scaled casts to 16-, 8- and 4-bit floats, and an algorithm sending them.

**Quantiser.** For B in {16, 8, 4} bits every node's leaf ``x`` (one node's slice, any shape) is
sent as one float32 scale and its values in a B-bit float format,

    s = max|x| / FMAX,   q = fmt(clip(x / s, -FMAX, FMAX)),   x~ = f32(q) * s,

with ``fmt`` bfloat16 (B = 16), float8_e4m3fn (B = 8, FMAX = 448) or float4_e2m1fn (B = 4,
FMAX = 6; values 0, 0.5, 1, 1.5, 2, 3, 4, 6), rounding to nearest even. The largest value is
sent exactly (up to float32 rounding of the scale), and ``|x~ - x| <= eps / 2 * |x| + u / 2 * s``
per value, ``eps`` the format's machine epsilon and ``u`` its smallest subnormal (the
round-to-nearest bound of the format, moved by the scale). bfloat16 has float32's exponent range,
so for B = 16 the scale is 1 and is not sent; an all-zero leaf has scale 1. B = 32 sends float32
values unchanged. Streaming DiLoCo all-reduces outer gradients in 4-bit floats (Douillard et
al., 2025, arXiv:2501.18512).

**Quantised messages.** :func:`with_quantized_messages` runs an algorithm's round on the
dequantised message ``x~`` and every node keeps the round's result,

    x <- step(x~),

so gossip is ``W x~`` and all-reduce ``mean(x~)`` on every node: a node's own contribution is the
quantised one too, as in the paper's all-reduce of quantised outer gradients, so that under
all-reduce every node applies the same outer gradient and the models stay identical (the sum over
nodes is that of ``x~``; the quantisation error is not carried). The algorithm counts
32 bits per value of ``x~``; the wrapper reprices its messages at B bits per value plus 32 bits
per scale (per leaf, per message). That needs an algorithm whose messages carry all D values
(:attr:`jaxgossip.types.CostFacts.dense_values`): its bits are ``v * w + o`` for a value width
``w``, ``v`` values sent (D per message) and ``o`` bits that do not depend on the width (a push-sum
weight), so one round counted at w = 32 and at w = 16 (the same messages: same state and key)
gives ``v`` and ``o``, and the round costs ``v * B + 32 L v / D + o`` (L leaves; no scale for
B = 16). The second count's arithmetic is unused and compiled away under ``jit``.

Shapes: every leaf is node-stacked, [N, ...]; scales are [N] per leaf.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxgossip.types import GossipAlgorithm

__all__ = [
    "MESSAGE_BITS",
    "FORMATS",
    "Quantized",
    "check_message_bits",
    "quantize",
    "dequantize",
    "quantize_dequantize",
    "message_bits",
    "with_quantized_messages",
]

#: the value widths a message may have (32: float32, unchanged).
MESSAGE_BITS = (4, 8, 16, 32)
#: B -> the B-bit float format of the values (B < 32).
FORMATS = {16: jnp.bfloat16, 8: jnp.float8_e4m3fn, 4: jnp.float4_e2m1fn}
SCALE_BITS = 32


class Quantized(NamedTuple):
    """One leaf as sent.

    Attributes:
      values: [N, ...] in the B-bit format, ``x / s`` rounded.
      scale: [N] float32, ``s`` per node.
    """

    values: jax.Array
    scale: jax.Array


def check_message_bits(bits: Any, what: str = "outer_message_bits") -> int:
    """``bits`` if it is one of :data:`MESSAGE_BITS`; else ValueError naming ``what``."""
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in MESSAGE_BITS:
        raise ValueError(f"{what}={bits!r} must be one of {', '.join(map(str, MESSAGE_BITS))}")
    return bits


def quantize(x: jax.Array, bits: int) -> Quantized:
    """``x`` [N, ...] float32 as :class:`Quantized` B-bit values and per-node scales (module docstring)."""
    fmt = FORMATS.get(check_message_bits(bits))
    if fmt is None:
        raise ValueError("outer_message_bits=32 sends float32 values: there is nothing to quantise")
    num_nodes = x.shape[0]
    if bits == 16:
        return Quantized(x.astype(fmt), jnp.ones([num_nodes], jnp.float32))
    fmax = float(jnp.finfo(fmt).max)
    peak = jnp.max(jnp.abs(x.reshape(num_nodes, -1)), axis=1).astype(jnp.float32)
    scale = jnp.where(peak > 0, peak / fmax, 1.0).astype(jnp.float32)
    scaled = x.astype(jnp.float32) / scale.reshape((num_nodes,) + (1,) * (x.ndim - 1))
    # x / s may round just past FMAX, and float8_e4m3fn has no infinity: an overflow would be NaN.
    return Quantized(jnp.clip(scaled, -fmax, fmax).astype(fmt), scale)


def dequantize(q: Quantized) -> jax.Array:
    """``f32(values) * scale`` per node, [N, ...] float32."""
    values = q.values.astype(jnp.float32)
    return values * q.scale.reshape((values.shape[0],) + (1,) * (values.ndim - 1))


def quantize_dequantize(tree: Any, bits: int) -> Any:
    """Every leaf of ``tree`` (leaves [N, ...]) as it arrives after a B-bit message (float32);
    ``bits=32`` returns ``tree`` itself."""
    if check_message_bits(bits) == 32:
        return tree
    return jax.tree_util.tree_map(lambda leaf: dequantize(quantize(leaf, bits)).astype(leaf.dtype), tree)


def message_bits(bits_fp32: jax.Array, bits_bf16: jax.Array, dim: int, num_leaves: int, bits: int) -> jax.Array:
    """The [N] bits of a round's messages at B bits per value plus a scale per leaf, from the same
    round counted at 32 and at 16 bits per value (module docstring; ``dim`` = D per node)."""
    values = (bits_fp32 - bits_bf16) / 16.0
    other = bits_fp32 - 32.0 * values
    scales = 0.0 if bits == 16 else SCALE_BITS * num_leaves * values / dim
    return other + bits * values + scales


def with_quantized_messages(algorithm: GossipAlgorithm, bits: int) -> GossipAlgorithm:
    """``algorithm`` sending B-bit values (module docstring); ``bits=32`` returns it unchanged.
    The caller makes sure the algorithm's messages are dense
    (:attr:`jaxgossip.types.CostFacts.dense_values`).

    Raises:
      ValueError: ``bits`` not in :data:`MESSAGE_BITS`.
    """
    if check_message_bits(bits) == 32:
        return algorithm

    def step(params, state, key):
        sent = quantize_dequantize(params, bits)
        new, new_state, info = algorithm.step(sent, state, key)
        _, _, info_bf16 = algorithm.step(jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), sent), state, key)
        leaves = jax.tree_util.tree_leaves(params)
        dim = sum(leaf.size // leaf.shape[0] for leaf in leaves)
        priced = message_bits(info.bits, info_bf16.bits, dim, len(leaves), bits)
        # Every node keeps what the round made of the sent values, its own quantised one included.
        params = jax.tree_util.tree_map(lambda x, n: n.astype(x.dtype), params, new)
        return params, new_state, info._replace(bits=priced.astype(info.bits.dtype))

    return algorithm._replace(step=step)
