"""A small convolutional network (~104k parameters on 28x28x1 inputs)."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from jaxgossip.models.conv import Conv
from jaxgossip.models.norm import make_norm
from jaxgossip.models.pool import max_pool

__all__ = ["CNN"]


class CNN(nn.Module):
    """Small CNN: [3x3 conv -> norm -> ReLU -> 2x2 max-pool] per entry of `features`, then a linear head.

    Use for quick MNIST / Fashion-MNIST / CIFAR experiments and as the benchmark model of
    `experiments/bench_conv.py`. With the defaults (features (32, 64, 128), no hidden dense layer)
    it has 104,202 parameters on 28x28x1 inputs (28 -> 14 -> 7 -> 3; 3*3*128 -> 10) and 113,738 on
    32x32x3 inputs.

    Attributes:
      num_classes: output logits.
      features: channels of the conv layers (one pooled stage each).
      hidden: widths of dense layers between the flattened features and the head.
      norm: "none" (default), "batch" or "group"; see `jaxgossip.models.norm`.
      norm_groups: groups for GroupNorm.
      conv_impl: "auto", "lax", "matmul" or "explicit"; see `jaxgossip.models.conv.resolve_conv_impl`.

    Input: x [B, H, W, C]. Output: logits [B, num_classes].
    """

    num_classes: int = 10
    features: Sequence[int] = (32, 64, 128)
    hidden: Sequence[int] = ()
    norm: str = "none"
    norm_groups: int = 2
    conv_impl: str = "auto"

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        for i, channels in enumerate(self.features):
            x = Conv(channels, 3, padding=1, use_bias=self.norm == "none", impl=self.conv_impl, name=f"conv{i + 1}")(x)
            x = make_norm(self.norm, train, groups=self.norm_groups, name=f"norm{i + 1}")(x)
            x = max_pool(nn.relu(x), 2)
        x = jnp.reshape(x, (x.shape[0], -1))
        for i, width in enumerate(self.hidden):
            x = nn.relu(nn.Dense(width, name=f"fc{i + 1}")(x))
        return nn.Dense(self.num_classes, name="head")(x)
