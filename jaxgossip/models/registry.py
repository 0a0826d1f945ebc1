"""Model registry and the `make_model(name, num_classes, **options)` factory."""

from __future__ import annotations

import dataclasses
import functools
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from flax import linen as nn

from jaxgossip.models.cnn import CNN
from jaxgossip.models.mlp import MLP
from jaxgossip.models.resnet import resnet20, resnet110
from jaxgossip.models.transformer import Transformer
from jaxgossip.models.vgg import vgg11, vgg16

__all__ = ["REGISTRY", "SEQUENCE_MODELS", "attributes", "check_options", "is_sequence_model", "make_model"]


def _is_size(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def _check_sizes(defaults: Mapping[str, Any], options: dict) -> None:
    # Every integer attribute of the registered models is a size or a count (widths, depth, heads,
    # groups, ...), and every tuple attribute a list of layer sizes: 0, a negative or a non-integer
    # would otherwise fail deep inside flax (a ZeroDivisionError in the initializer, a shape error).
    for key, value in options.items():
        if key not in defaults:
            continue  # the model's own constructor names an unknown attribute
        ref = defaults[key]
        if isinstance(ref, numbers.Integral) and not isinstance(ref, bool) and not _is_size(value):
            raise ValueError(f"{key}={value!r} must be a positive integer")
        if isinstance(ref, tuple) and not (isinstance(value, (tuple, list)) and all(_is_size(v) for v in value)):
            raise ValueError(
                f"{key}={value!r} must be a positive integer or a list of positive integers "
                f"(layer sizes, e.g. {key}=128 or {key}=[256,128])"
            )


def _mlp(num_classes: int = 10, **options) -> MLP:
    return MLP(num_classes=num_classes, **options)


def _cnn(num_classes: int = 10, **options) -> CNN:
    return CNN(num_classes=num_classes, **options)


def _transformer(num_classes: int = 256, **options) -> Transformer:
    # The data set's number of classes is its vocabulary; a larger vocab only adds unused rows.
    vocab = options.pop("vocab", num_classes)
    if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab < num_classes:
        raise ValueError(f"vocab={vocab} is smaller than the data's vocabulary of {num_classes} tokens")
    if options.get("dropout", 0.0) not in (0, 0.0) and not isinstance(options.get("dropout"), bool):
        # The trainer's model functions pass no dropout keys (ModelFns.apply takes none).
        raise ValueError(
            f"dropout={options['dropout']!r}: the trainer runs the model without dropout keys, so only "
            "dropout=0 trains (Transformer(dropout=...) with apply(..., rngs={'dropout': key}) outside it)"
        )
    return Transformer(vocab=vocab, **options)


REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "mlp": _mlp,
    "cnn": _cnn,
    "resnet20": resnet20,
    "resnet110": resnet110,
    "vgg11": vgg11,
    "vgg16": vgg16,
    "transformer": _transformer,
}

#: Models that read token sequences [B, T] and return next-token logits [B, T, V]; they train on
#: text data sets (jaxgossip.data.text) and have a ``context`` attribute, the example length.
SEQUENCE_MODELS = ("transformer",)


def is_sequence_model(name: str) -> bool:
    """Whether registered model ``name`` is a next-token model (:data:`SEQUENCE_MODELS`)."""
    return name in SEQUENCE_MODELS


def make_model(name: str, num_classes: int = 10, **options) -> nn.Module:
    """Builds a registered flax linen model by name.

    Args:
      name: one of `REGISTRY` ("mlp", "cnn", "resnet20", "resnet110", "vgg11", "vgg16",
        "transformer").
      num_classes: output logits (the transformer's vocab, unless `vocab` is given).
      **options: model attributes, e.g. `hidden=(128,)` for the MLP, or `norm="group"` and
        `conv_impl="matmul"` for the convolutional models.

    Returns:
      An `nn.Module` with pure `init(key, x)` / `apply(variables, x, train=...)`.

    Raises:
      ValueError: unknown name (the message lists the known ones), or a size attribute (an integer
        or a tuple of layer sizes) given a value that is not a positive integer (tuple of them).
    """
    defaults = attributes(name)  # refuses an unknown name
    if options:
        _check_sizes(defaults, options)
    return REGISTRY[name](num_classes=num_classes, **options)


def check_options(name: str, **options) -> None:
    """Checks ``options`` of model ``name`` as :func:`make_model` does, before the number of classes
    is known (a config is checked before its data set is read): the registry's builder describes
    the module at one class and the description is dropped (a flax module holds no parameters
    before ``init``). The data's class count is checked when the run's model is built (a
    transformer's ``vocab`` must hold the data's tokens).

    Raises:
      ValueError: what :func:`make_model` raises for these options.
    """
    defaults = attributes(name)  # refuses an unknown name
    if options:
        _check_sizes(defaults, options)
    REGISTRY[name](num_classes=1, **options)


def attributes(name: str) -> dict[str, Any]:
    """The attributes of registered model ``name`` at the registry's defaults (e.g. ``hidden``,
    ``conv_impl``, a transformer's ``context``), without flax's ``parent``/``name``: what a config's
    ``model_options`` may set, and their kinds (a tuple attribute takes a list of sizes).

    Raises:
      ValueError: unknown name (the message lists the known ones).
    """
    if name not in REGISTRY:
        raise ValueError(f"unknown model name {name!r}; known models: {sorted(REGISTRY)}")
    return dict(_default_attributes(name))


@functools.cache
def _default_attributes(name: str) -> tuple[tuple[str, Any], ...]:
    # The registry entries are builders (resnet20 fixes depth, the transformer its vocab), so the
    # defaults are read from the module one builds; cached, a description is read once per process.
    module = REGISTRY[name]()
    fields = [f.name for f in dataclasses.fields(module) if f.name not in ("parent", "name")]
    return tuple((key, getattr(module, key)) for key in fields)
