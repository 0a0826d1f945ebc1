"""Parameter counting and stacked initialization."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from flax import linen as nn

__all__ = ["count_params", "init_stacked"]


def count_params(params: Any) -> int:
    """Total number of scalar entries in a pytree (e.g. `variables["params"]` of one node).

    Pass one node's params; a stacked pytree (leaves [N, ...]) counts N times as many.
    """
    return int(sum(np.prod(np.shape(leaf), dtype=np.int64) for leaf in jax.tree.leaves(params)))


def init_stacked(model: nn.Module, keys: jax.Array, *args, **kwargs) -> Any:
    """Initializes N workers at once: `jax.vmap(model.init)` over keys [N], shared example inputs.

    Args:
      model: a flax linen module.
      keys: [N] PRNG keys; pass N copies of one key for identical initial models (the PowerGossip
        setup), e.g. `jnp.broadcast_to(key, (N,))` for new-style keys.
      *args, **kwargs: example inputs for one node, e.g. x [B, H, W, C], not stacked.

    Returns:
      variables dict whose leaves are [N, ...] ("params" and, with BatchNorm, "batch_stats").
    """
    return jax.vmap(lambda key: model.init(key, *args, **kwargs))(keys)
