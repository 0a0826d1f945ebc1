"""PowerGossip's matrix leaves: which leaves are matrices, and the two views of a kernel as a matrix.

A node leaf of ndim >= 2 is gossiped through a rank-R power iteration on a matrix view of it:
``"leading"`` (``[m, n]`` = the first axis against the rest, the authors' PyTorch layout) or
``"flax_kernel"`` (a flax kernel ``(kh, kw, C_in, F)`` seen as the PyTorch ``[F, C_in kh kw]``
matrix M). The flax view runs its half-steps on the free reshape M' = ``[kh kw C_in, F]`` with the
working bases ``(Pi V, U)``; these functions convert between stored and working bases.
docs/algorithms.md, section power_gossip ("Matrix views"), has the derivation.

:func:`as_matrix` / :func:`from_matrix` form the view's matrix M of one leaf explicitly (a
transpose for ``"flax_kernel"``) and :func:`matrix_shapes` lists a pytree's ``(m, n)``: the view
made visible, for checks and for sizing a model's PowerGossip traffic; the rounds never form M.

Used by :mod:`jaxgossip.algorithms.power_gossip`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.types import Array

__all__ = [
    "MATRIX_VIEWS",
    "MatrixLeaf",
    "LeafPlan",
    "leaf_plan",
    "as_matrix",
    "from_matrix",
    "matrix_shapes",
    "working_view",
    "working_side",
    "permute_rows",
    "working_bases",
    "view_bases",
]

MATRIX_VIEWS = ("leading", "flax_kernel")
_OTHER_SIDE = {"right": "left", "left": "right"}


class MatrixLeaf(NamedTuple):
    """Static facts about one matrix leaf (node leaf ndim >= 2)."""

    index: int  # position in jax.tree_util.tree_leaves(params)
    shape: tuple  # the node leaf's shape (without the N axis)
    m: int  # rows of the matrix view
    n: int  # columns of the matrix view
    rank: int  # R = min(m, n, rank)


class LeafPlan(NamedTuple):
    """Which leaves of a pytree are gossiped as matrices and which exactly (static)."""

    matrices: tuple  # a MatrixLeaf per leaf whose node part has ndim >= 2, in tree_leaves order
    vectors: tuple  # positions of the other leaves (node ndim <= 1), gossiped exactly


def _matrix_shape(shape: tuple[int, ...], view: str) -> tuple[int, int]:
    """(m, n) of one node's leaf of shape ``shape`` (ndim >= 2) under ``view``."""
    size = int(np.prod(shape, dtype=np.int64))
    m = shape[0] if view == "leading" else shape[-1]
    return int(m), size // int(m)


def _check_view(view: str) -> None:
    if view not in MATRIX_VIEWS:
        raise ValueError(f"view={view!r} is unknown; known views: {MATRIX_VIEWS}")


def _flax_axes(ndim: int) -> tuple[int, ...]:
    # flax kernel (..spatial.., C_in, F) -> PyTorch order (F, C_in, ..spatial..).
    return (ndim - 1, ndim - 2) + tuple(range(ndim - 2))


def as_matrix(leaf: Array, view: str = "flax_kernel") -> Array:
    """One node's leaf as the ``[m, n]`` matrix M of ``view`` (its entries, in M's order).

    ``"flax_kernel"``: the PyTorch matrix ``[F, C_in * kh * kw]`` of a flax kernel
    ``(kh, kw, C_in, F)`` (``(C_in, F) -> (F, C_in)`` for a dense kernel). PowerGossip reshapes
    every >= 2-D PyTorch tensor to ``(shape[0], -1)``; a PyTorch conv weight is
    ``(F, C_in, kh, kw)``, so moving the output axis first and ordering the rest
    ``(C_in, kh, kw)`` lines the entries up one-to-one with the PyTorch matrix. It assumes the flax
    kernel layout (output features last): an embedding ``(V, E)``, already in PyTorch's layout, is
    seen transposed. ``"leading"``: ``(shape[0], -1)`` of the leaf as stored.

    Args:
      leaf: array of ndim >= 2, e.g. ``[kh, kw, C_in, F]`` or ``[C_in, F]``.
      view: one of :data:`MATRIX_VIEWS`.

    Returns:
      ``[m, n]`` with ``(m, n)`` as in :func:`matrix_shapes`. Invert with
      ``from_matrix(matrix, leaf.shape, view)``.
    """
    _check_view(view)
    if leaf.ndim < 2:
        raise ValueError(f"as_matrix needs ndim >= 2, got shape {leaf.shape}")
    if view == "leading":
        return leaf.reshape(leaf.shape[0], -1)
    return jnp.transpose(leaf, _flax_axes(leaf.ndim)).reshape(leaf.shape[-1], -1)


def from_matrix(matrix: Array, shape: tuple[int, ...], view: str = "flax_kernel") -> Array:
    """Inverse of :func:`as_matrix`: the ``[m, n]`` matrix of ``view`` back to a leaf of ``shape``."""
    _check_view(view)
    if view == "leading":
        return matrix.reshape(shape)
    axes = _flax_axes(len(shape))
    permuted = matrix.reshape(tuple(shape[a] for a in axes))
    return jnp.transpose(permuted, np.argsort(axes))


def matrix_shapes(params: Any, view: str = "flax_kernel") -> list[tuple[int, int]]:
    """``(m, n)`` of the matrix view of every leaf with ndim >= 2, in ``jax.tree.leaves`` order.

    Args:
      params: one node's parameter pytree (not stacked).
      view: one of :data:`MATRIX_VIEWS`; ``"flax_kernel"`` gives the PyTorch shapes of
        docs/training.md, section training recipes and models (ResNet-20: sum m = 794,
        sum n = 5755).

    Returns:
      list of ``(m, n)`` int pairs.
    """
    _check_view(view)
    return [_matrix_shape(tuple(np.shape(leaf)), view) for leaf in jax.tree.leaves(params) if np.ndim(leaf) >= 2]


def leaf_plan(leaves: list, matrix_view: str, rank: int) -> LeafPlan:
    """Splits stacked leaves ``[N, ...]`` into matrix leaves (with their view) and vector leaves."""
    matrices, vectors = [], []
    for i, leaf in enumerate(leaves):
        shape = tuple(jnp.shape(leaf)[1:])
        if len(shape) >= 2:
            m, n = _matrix_shape(shape, matrix_view)
            matrices.append(MatrixLeaf(i, shape, m, n, min(m, n, rank)))
        else:
            vectors.append(i)
    return LeafPlan(tuple(matrices), tuple(vectors))


# free reshape (kh * kw * C_in, F) of a flax kernel, so a step on M is the other-side step on M'
# with the working bases (Pi V, U) in the roles of (U, V). See docs/algorithms.md, section
# power_gossip ("Matrix views") for the derivation.


def working_view(leaf: Array, view: str) -> Array:
    """[N, *s] -> the matrix the half-steps run on, by a free reshape: [N, m, n] ("leading") or
    [N, n, m] = M' ("flax_kernel", rows in the leaf's (kh, kw, C_in) order), float32."""
    x = leaf.astype(jnp.promote_types(leaf.dtype, jnp.float32))
    if view == "flax_kernel":
        return x.reshape(leaf.shape[0], -1, leaf.shape[-1])
    return x.reshape(leaf.shape[0], leaf.shape[1], -1)


def working_side(side: str, view: str) -> str:
    """The half-step on the working matrix that is a ``side`` step on the view's matrix M."""
    return _OTHER_SIDE[side] if view == "flax_kernel" else side


def permute_rows(basis: Array, shape: tuple[int, ...], to_flax: bool) -> Array:
    """Rows of a right basis ``[P, n, R]`` of the flax view between the PyTorch column order
    (C_in, kh, kw) of M and the (kh, kw, C_in) row order of M' (``to_flax``) or back. ``shape`` is
    the node leaf shape (kh, kw, C_in, F); identity for 2-D leaves."""
    if len(shape) <= 2:
        return basis
    torch_dims = (shape[-2],) + tuple(shape[:-2])  # (C_in, kh, kw)
    k = len(torch_dims)
    if to_flax:
        x = basis.reshape((basis.shape[0],) + torch_dims + (basis.shape[-1],))
        perm = (0,) + tuple(range(2, k + 1)) + (1, k + 1)  # (P, C_in, kh, kw, R) -> (P, kh, kw, C_in, R)
    else:
        x = basis.reshape((basis.shape[0],) + tuple(shape[:-2]) + (shape[-2], basis.shape[-1]))
        perm = (0, k) + tuple(range(1, k)) + (k + 1,)  # (P, kh, kw, C_in, R) -> (P, C_in, kh, kw, R)
    return jnp.transpose(x, perm).reshape(basis.shape)


def working_bases(u: tuple, v: tuple, matrices: tuple[MatrixLeaf, ...], view: str) -> tuple[tuple, tuple]:
    """The stored bases (U, V) of the view's matrices as working bases: (U, V) or (Pi V, U)."""
    if view != "flax_kernel":
        return tuple(u), tuple(v)
    return tuple(permute_rows(b, leaf.shape, True) for b, leaf in zip(v, matrices)), tuple(u)


def view_bases(u: tuple, v: tuple, matrices: tuple[MatrixLeaf, ...], view: str) -> tuple[tuple, tuple]:
    """Inverse of :func:`working_bases`: working bases back to the stored (U, V)."""
    if view != "flax_kernel":
        return tuple(u), tuple(v)
    return tuple(v), tuple(permute_rows(b, leaf.shape, False) for b, leaf in zip(u, matrices))
