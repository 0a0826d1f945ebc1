"""Normalization layers for jaxgossip models, and where their state lives.

`norm="batch"`: `flax.linen.BatchNorm`. Its learnable `scale`/`bias` [C] are ordinary parameters
(1-D leaves, gossiped uncompressed by PowerGossip;
docs/training.md, section training recipes and models). Its running `mean`/`var` [C]
live in the separate `batch_stats` collection. With N stacked workers that collection is stacked
too (leaves [N, C]) and is NODE-LOCAL: the batch statistics of node i are computed from node i's
batch only (no `axis_name`, so `vmap` over nodes never reduces across nodes), and jaxgossip never
communicates `batch_stats`, following the PowerGossip reference (buffers are never gossiped).
Evaluating an averaged model may average them (a train-time option, not done here).
Momentum 0.9 in flax equals PyTorch's `momentum=0.1`; epsilon 1e-5 as in PyTorch. Unlike PyTorch,
flax stores the biased batch variance in the running `var`.

`norm="group"`: `flax.linen.GroupNorm` with `norm_groups` groups (default 2); no running
statistics, so the model has no `batch_stats` collection (Hsieh et al., ICML 2020, recommend it
for non-IID decentralized training).

`norm="none"`: identity.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
from flax import linen as nn

__all__ = ["NORMS", "make_norm"]

NORMS = ("batch", "group", "none")


def make_norm(norm: str, train: bool, *, groups: int = 2, name: str | None = None) -> Callable[[jax.Array], jax.Array]:
    """Returns the normalization layer `x [..., C] -> [..., C]` (call inside an `nn.compact` method).

    Args:
      norm: "batch", "group" or "none".
      train: BatchNorm uses batch statistics (and updates `batch_stats`, which must be passed as
        mutable to `apply`) when True, running statistics when False. Ignored otherwise.
      groups: number of groups for GroupNorm; must divide C.
      name: submodule name (e.g. "bn1"), so parameter paths stay stable.

    Returns:
      A callable layer.
    """
    if norm == "batch":
        return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, name=name)
    if norm == "group":
        layer = nn.GroupNorm(num_groups=groups, epsilon=1e-5, name=name)

        def group_norm(x: jax.Array) -> jax.Array:
            # flax's own error names neither the option nor the layer.
            if x.shape[-1] % groups:
                raise ValueError(
                    f"norm_groups={groups} must divide the {x.shape[-1]} channels of the normalized layer "
                    f"{name or 'GroupNorm'}; choose a divisor of every layer width (e.g. norm_groups=1, 2 or 4)"
                )
            return layer(x)

        return group_norm
    if norm == "none":
        return lambda x: x
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
