"""CIFAR ResNets (ResNet-20, ResNet-110) in the variant used by Choco-SGD and PowerGossip.

The CIFAR ResNet of He et al. (2016, section 4.2) has a 3x3 stem conv with 16 channels, three
stages of `n` basic blocks with 16, 32 and 64 channels (stride 2 at the start of stages 2 and 3),
global average pooling and a linear classifier; depth = 6n + 2. The paper's parameter-free
shortcut ("option A") is replaced here, as in the Choco-SGD (Koloskova et al., ICLR 2020) and
PowerGossip code, by a projection shortcut (1x1 conv, stride 2, no bias, then BatchNorm) in the
first block of stages 2 and 3. Convolutions have no bias. With 10 classes ResNet-20 has exactly
272,474 trainable parameters (65 tensors; docs/training.md, section training recipes and models) and
ResNet-110 has 1,730,714.

Padding is PyTorch-style (1 on every side for 3x3 convs, 0 for 1x1), so a stride-2 3x3 conv sees
the same windows as the PyTorch reference (lax "SAME" would pad (0, 1) instead).

References:
  He, Zhang, Ren, Sun. Deep Residual Learning for Image Recognition. CVPR 2016, arXiv 1512.03385.
  Koloskova*, Lin*, Stich, Jaggi. Decentralized Deep Learning with Arbitrary Communication
  Compression. ICLR 2020, arXiv 1907.09356.
  Vogels, Karimireddy, Jaggi. PowerGossip. NeurIPS 2020, arXiv 2008.01425.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from jaxgossip.models.conv import Conv
from jaxgossip.models.norm import make_norm

__all__ = ["BasicBlock", "ResNet", "resnet20", "resnet110"]

# He et al. (2015) normal init with fan = kh * kw * C_out, as in the reference CIFAR ResNets.
_he_fan_out = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


class BasicBlock(nn.Module):
    """Two 3x3 convs with norm and ReLU plus a shortcut; x [B, H, W, C] -> [B, H/s, W/s, F]."""

    features: int
    strides: int = 1
    norm: str = "batch"
    norm_groups: int = 2
    conv_impl: str = "auto"

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        def conv(features, kernel, strides, name):
            return Conv(
                features,
                kernel,
                strides=strides,
                padding=kernel // 2,
                use_bias=False,
                impl=self.conv_impl,
                kernel_init=_he_fan_out,
                name=name,
            )

        def norm(name):
            return make_norm(self.norm, train, groups=self.norm_groups, name=name)

        y = nn.relu(norm("bn1")(conv(self.features, 3, self.strides, "conv1")(x)))
        y = norm("bn2")(conv(self.features, 3, 1, "conv2")(y))
        shortcut = x
        if self.strides != 1 or x.shape[-1] != self.features:
            shortcut = conv(self.features, 1, self.strides, "downsample_conv")(x)
            shortcut = norm("downsample_bn")(shortcut)
        return nn.relu(y + shortcut)


class ResNet(nn.Module):
    """CIFAR ResNet of depth 6n + 2 (3 stages of n basic blocks, 16/32/64 channels).

    Attributes:
      depth: 20, 32, 44, 56, 110, ... (must be 6n + 2).
      num_classes: output logits.
      width: channels of the first stage (16 in the reference; stages use width * (1, 2, 4)).
      norm: "batch" (default; running stats are node-local, see `jaxgossip.models.norm`),
        "group" or "none".
      norm_groups: groups for GroupNorm.
      conv_impl: "auto", "lax", "matmul" or "explicit"; see `jaxgossip.models.conv.resolve_conv_impl`.

    Input: x [B, H, W, 3] (32x32 for CIFAR; any size works, pooling is global).
    Output: logits [B, num_classes].
    With norm="batch", call `apply(..., train=True, mutable=["batch_stats"])` for training.
    """

    depth: int = 20
    num_classes: int = 10
    width: int = 16
    norm: str = "batch"
    norm_groups: int = 2
    conv_impl: str = "auto"

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        if (self.depth - 2) % 6 != 0 or self.depth < 8:
            raise ValueError(f"depth must be 6n + 2 with n >= 1, got {self.depth}")
        blocks_per_stage = (self.depth - 2) // 6
        x = Conv(self.width, 3, padding=1, use_bias=False, impl=self.conv_impl, kernel_init=_he_fan_out, name="conv1")(
            x
        )
        x = nn.relu(make_norm(self.norm, train, groups=self.norm_groups, name="bn1")(x))
        for stage in range(3):
            for block in range(blocks_per_stage):
                strides = 2 if stage > 0 and block == 0 else 1
                x = BasicBlock(
                    self.width * 2**stage,
                    strides,
                    self.norm,
                    self.norm_groups,
                    self.conv_impl,
                    name=f"layer{stage + 1}_{block}",
                )(x, train)
        x = jnp.mean(x, axis=(-3, -2))
        return nn.Dense(self.num_classes, name="fc")(x)


def _no_depth(name: str, options: dict) -> None:
    if "depth" in options:
        raise ValueError(
            f"depth={options['depth']!r}: {name}'s depth is fixed (its name); use model resnet20 or resnet110, "
            "or jaxgossip.models.resnet.ResNet(depth=6n + 2) in Python"
        )


def resnet20(num_classes: int = 10, **options) -> ResNet:
    """ResNet-20 (Choco/PowerGossip variant; 272,474 parameters for 10 classes). See `ResNet`."""
    _no_depth("resnet20", options)
    return ResNet(depth=20, num_classes=num_classes, **options)


def resnet110(num_classes: int = 10, **options) -> ResNet:
    """ResNet-110 (18 blocks per stage; 1,730,714 parameters for 10 classes). See `ResNet`."""
    _no_depth("resnet110", options)
    return ResNet(depth=110, num_classes=num_classes, **options)
