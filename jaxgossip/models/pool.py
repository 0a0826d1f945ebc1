"""Non-overlapping max pooling written as reshape + max (fast gradient on XLA:CPU).

`flax.linen.max_pool` lowers to `reduce_window`, whose gradient is `select_and_scatter`; on this
XLA:CPU (jax 0.10.2) the gradient of a 2x2 max-pool over [16 nodes, B=32, 28, 28, 32] took ~860 ms
vmapped (~950 ms as 16 single calls), against ~220 ms for the reshape + max formulation below, so it
dominated the CNN training step. For non-overlapping windows (window == stride, VALID padding) the
two have identical forward values; the gradient differs only at ties within a window (jnp.max
splits the cotangent equally among tied maxima, select_and_scatter picks one), e.g. all-zero
windows after a ReLU, where the ReLU's zero derivative makes both vanish anyway.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["max_pool"]


def max_pool(x: jax.Array, window: int = 2) -> jax.Array:
    """Max over non-overlapping `window x window` patches (VALID: trailing rows/cols are dropped).

    Args:
      x: [..., H, W, C].
      window: patch size (also the stride).

    Returns:
      [..., H // window, W // window, C], equal to
      `flax.linen.max_pool(x, (window, window), strides=(window, window))`.
    """
    *batch, h, w, c = x.shape
    ho, wo = h // window, w // window
    x = x[..., : ho * window, : wo * window, :]
    x = x.reshape(*batch, ho, window, wo, window, c)
    return jnp.max(x, axis=(-4, -2))
