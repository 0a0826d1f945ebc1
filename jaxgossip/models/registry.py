"""Model registry and the `make_model(name, num_classes, **options)` factory."""

from __future__ import annotations

from collections.abc import Callable

from flax import linen as nn

from jaxgossip.models.cnn import CNN
from jaxgossip.models.mlp import MLP
from jaxgossip.models.resnet import resnet20, resnet110
from jaxgossip.models.vgg import vgg11, vgg16

__all__ = ["REGISTRY", "make_model"]


def _mlp(num_classes: int = 10, **options) -> MLP:
    return MLP(num_classes=num_classes, **options)


def _cnn(num_classes: int = 10, **options) -> CNN:
    return CNN(num_classes=num_classes, **options)


REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "mlp": _mlp,
    "cnn": _cnn,
    "resnet20": resnet20,
    "resnet110": resnet110,
    "vgg11": vgg11,
    "vgg16": vgg16,
}


def make_model(name: str, num_classes: int = 10, **options) -> nn.Module:
    """Builds a registered flax linen model by name.

    Args:
      name: one of `REGISTRY` ("mlp", "cnn", "resnet20", "resnet110", "vgg11", "vgg16").
      num_classes: output logits.
      **options: model attributes, e.g. `hidden=(128,)` for the MLP, or `norm="group"` and
        `conv_impl="matmul"` for the convolutional models.

    Returns:
      An `nn.Module` with pure `init(key, x)` / `apply(variables, x, train=...)`.

    Raises:
      ValueError: unknown name (the message lists the known ones).
    """
    if name not in REGISTRY:
        raise ValueError(f"unknown model name {name!r}; known models: {sorted(REGISTRY)}")
    return REGISTRY[name](num_classes=num_classes, **options)
