"""Multi-layer perceptron classifier."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

__all__ = ["MLP"]


class MLP(nn.Module):
    """Fully connected ReLU network on flattened inputs.

    Use for small problems (e.g. MNIST-like data or logistic regression with `hidden=()`), where it
    is the cheapest model to stack over many nodes.

    Attributes:
      hidden: widths of the hidden layers; `()` gives a linear (softmax-regression) model.
      num_classes: output logits.

    Input: x [B, ...] (flattened to [B, D_in]). Output: logits [B, num_classes].
    Stack N workers with `jax.vmap(model.init, in_axes=(0, None))(keys, x)`.
    """

    hidden: Sequence[int] = (256, 256)
    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        del train  # no dropout or normalization
        x = jnp.reshape(x, (x.shape[0], -1))
        for i, width in enumerate(self.hidden):
            x = nn.relu(nn.Dense(width, name=f"fc{i + 1}")(x))
        return nn.Dense(self.num_classes, name="head")(x)
