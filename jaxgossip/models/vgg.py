"""VGG-11 and VGG-16 for CIFAR (3x3 convs with BatchNorm, 512 -> num_classes classifier).

This is the common CIFAR adaptation of Simonyan & Zisserman's configurations "A" (VGG-11) and
"D" (VGG-16): every 3x3 conv (padding 1, with bias, as PyTorch's default) is followed by
normalization and ReLU, 2x2 max-pools shrink 32x32 inputs to 1x1x512, and the classifier is a
single linear layer 512 -> num_classes, as in most public CIFAR code bases (which head the
Sparse-Push experiments used was not verified here). Parameter counts for 10 classes: VGG-11
9,231,114; VGG-16 14,728,266.
`classifier_hidden=(512, 512)` gives the larger 512-512-512-10 head of some reference codes
(without dropout).

References:
  Simonyan, Zisserman. Very Deep Convolutional Networks for Large-Scale Image Recognition.
  ICLR 2015, arXiv 1409.1556.
  Ioffe, Szegedy. Batch Normalization. ICML 2015, arXiv 1502.03167.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from jaxgossip.models.conv import Conv
from jaxgossip.models.norm import make_norm
from jaxgossip.models.pool import max_pool

__all__ = ["VGG", "VGG_CONFIGS", "vgg11", "vgg16"]

# Channel counts of the conv layers; "M" is a 2x2 max-pool.
VGG_CONFIGS: dict[str, tuple[int | str, ...]] = {
    "vgg11": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg16": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
}


class VGG(nn.Module):
    """CIFAR VGG with normalization after every conv.

    Attributes:
      config: a key of `VGG_CONFIGS` ("vgg11" or "vgg16").
      num_classes: output logits.
      classifier_hidden: hidden widths of the classifier; `()` (default) is a linear 512 -> classes.
      norm: "batch" (default; node-local running stats, see `jaxgossip.models.norm`), "group" or
        "none".
      norm_groups: groups for GroupNorm.
      conv_impl: "auto", "lax", "matmul" or "explicit".

    Input: x [B, 32, 32, 3] (other sizes change the flattened feature size).
    Output: logits [B, num_classes].
    """

    config: str = "vgg11"
    num_classes: int = 10
    classifier_hidden: Sequence[int] = ()
    norm: str = "batch"
    norm_groups: int = 2
    conv_impl: str = "auto"

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        if self.config not in VGG_CONFIGS:
            raise ValueError(f"config must be one of {sorted(VGG_CONFIGS)}, got {self.config!r}")
        index = 0
        for layer in VGG_CONFIGS[self.config]:
            if layer == "M":
                x = max_pool(x, 2)
                continue
            index += 1
            x = Conv(int(layer), 3, padding=1, use_bias=True, impl=self.conv_impl, name=f"conv{index}")(x)
            x = nn.relu(make_norm(self.norm, train, groups=self.norm_groups, name=f"bn{index}")(x))
        x = jnp.reshape(x, (x.shape[0], -1))
        for i, width in enumerate(self.classifier_hidden):
            x = nn.relu(nn.Dense(width, name=f"fc{i + 1}")(x))
        return nn.Dense(self.num_classes, name="classifier")(x)


def vgg11(num_classes: int = 10, **options) -> VGG:
    """VGG-11 with BN for CIFAR (9,231,114 parameters for 10 classes). See `VGG`."""
    return VGG(config="vgg11", num_classes=num_classes, **options)


def vgg16(num_classes: int = 10, **options) -> VGG:
    """VGG-16 with BN for CIFAR (14,728,266 parameters for 10 classes). See `VGG`."""
    return VGG(config="vgg16", num_classes=num_classes, **options)
