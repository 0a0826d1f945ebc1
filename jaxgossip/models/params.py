"""Parameter counting, PowerGossip's matrix view of parameters, and stacked initialization."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

__all__ = ["as_matrix", "count_params", "from_matrix", "init_stacked", "matrix_shapes"]


def count_params(params: Any) -> int:
    """Total number of scalar entries in a pytree (e.g. `variables["params"]` of one node).

    Pass one node's params; a stacked pytree (leaves [N, ...]) counts N times as many.
    """
    return int(sum(np.prod(np.shape(leaf), dtype=np.int64) for leaf in jax.tree.leaves(params)))


def _matrix_axes(ndim: int) -> tuple[int, ...]:
    # flax kernel (..spatial.., C_in, F) -> PyTorch order (F, C_in, ..spatial..).
    return (ndim - 1, ndim - 2) + tuple(range(ndim - 2))


def as_matrix(leaf: jax.Array) -> jax.Array:
    """Views a flax kernel as the PyTorch-style matrix [F, C_in * kh * kw] that PowerGossip compresses.

    PowerGossip reshapes every >= 2-D PyTorch tensor to (shape[0], -1)
    (docs/algorithms.md, section power_gossip); a
    PyTorch conv weight is (F, C_in, kh, kw) and a linear weight (F, C_in). Flax stores conv kernels
    as (kh, kw, C_in, F) and dense kernels as (C_in, F), so the equivalent view moves the output
    axis first and orders the rest (C_in, kh, kw): entries line up one-to-one with the PyTorch
    matrix. Assumes the flax kernel layout (output features last); do not use it for embeddings
    (V, E), which already have PyTorch's layout.

    Args:
      leaf: array of ndim >= 2, e.g. [kh, kw, C_in, F] or [C_in, F].

    Returns:
      [F, prod(other dims)] array. Invert with `from_matrix(matrix, leaf.shape)`.
    """
    if leaf.ndim < 2:
        raise ValueError(f"as_matrix needs ndim >= 2, got shape {leaf.shape}")
    return jnp.transpose(leaf, _matrix_axes(leaf.ndim)).reshape(leaf.shape[-1], -1)


def from_matrix(matrix: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Inverse of `as_matrix`: a [F, prod(rest)] matrix back to the flax kernel `shape`."""
    axes = _matrix_axes(len(shape))
    permuted = matrix.reshape(tuple(shape[a] for a in axes))
    return jnp.transpose(permuted, np.argsort(axes))


def matrix_shapes(params: Any, layout: str = "flax") -> list[tuple[int, int]]:
    """(m, n) of every leaf with ndim >= 2, in `jax.tree.leaves` order.

    Args:
      params: one node's parameter pytree (not stacked).
      layout: "flax" (default) uses the `as_matrix` view, (F, C_in * kh * kw), which matches the
        PyTorch shapes of docs/training.md, section training recipes and models
        (ResNet-20: sum m = 794, sum n = 5755); "raw" uses
        (shape[0], -1) on the flax array as stored.

    Returns:
      list of (m, n) int pairs.
    """
    if layout not in ("flax", "raw"):
        raise ValueError(f"layout must be 'flax' or 'raw', got {layout!r}")
    shapes = []
    for leaf in jax.tree.leaves(params):
        shape = np.shape(leaf)
        if len(shape) < 2:
            continue
        m = shape[-1] if layout == "flax" else shape[0]
        shapes.append((int(m), int(np.prod(shape, dtype=np.int64)) // int(m)))
    return shapes


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
