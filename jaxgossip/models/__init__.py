"""Flax models for jaxgossip: MLP, small CNN, CIFAR ResNet-20/110, VGG-11/16, a transformer LM, plus helpers.

Every model is a flax linen module with pure `init`/`apply`, so N workers stack as
`jax.vmap(model.init, in_axes=(0, None))(keys, x)` (see `init_stacked`). Convolutional models take
`conv_impl="auto" | "lax" | "matmul" | "explicit"` (see `conv.resolve_conv_impl`) and `norm="batch" | "group" |
"none"`; BatchNorm running statistics live in the node-local `batch_stats` collection and are never
communicated (see `norm`).

The model adapters (`adapters`) turn a linen module, an NNX module or a pure `(init, apply)` pair
into `ModelFns`, the two pure per-node functions the runners stack over nodes.
"""

from jaxgossip.models.adapters import (
    ModelFns,
    as_model_fns,
    linen_model_fns,
    nnx_apply_fn,
    nnx_init_stacked,
    nnx_model_fns,
    pure_model_fns,
)
from jaxgossip.models.cnn import CNN
from jaxgossip.models.conv import CONV_IMPLS, Conv, conv_output_pads, resolve_conv_impl
from jaxgossip.models.mlp import MLP
from jaxgossip.models.norm import NORMS, make_norm
from jaxgossip.models.params import count_params, init_stacked
from jaxgossip.models.pool import max_pool
from jaxgossip.models.registry import (
    REGISTRY,
    SEQUENCE_MODELS,
    attributes,
    check_options,
    is_sequence_model,
    make_model,
)
from jaxgossip.models.resnet import BasicBlock, ResNet, resnet20, resnet110
from jaxgossip.models.transformer import POSITIONS, Transformer, causal_mask, rotary
from jaxgossip.models.vgg import VGG, VGG_CONFIGS, vgg11, vgg16

__all__ = [
    "attributes",
    "check_options",
    "BasicBlock",
    "CNN",
    "CONV_IMPLS",
    "Conv",
    "MLP",
    "ModelFns",
    "NORMS",
    "POSITIONS",
    "REGISTRY",
    "ResNet",
    "SEQUENCE_MODELS",
    "Transformer",
    "VGG",
    "VGG_CONFIGS",
    "as_model_fns",
    "causal_mask",
    "conv_output_pads",
    "count_params",
    "init_stacked",
    "is_sequence_model",
    "linen_model_fns",
    "make_model",
    "make_norm",
    "max_pool",
    "nnx_apply_fn",
    "nnx_init_stacked",
    "nnx_model_fns",
    "pure_model_fns",
    "resnet110",
    "resolve_conv_impl",
    "rotary",
    "resnet20",
    "vgg11",
    "vgg16",
]
