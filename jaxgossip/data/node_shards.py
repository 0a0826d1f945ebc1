"""Per-node data shards held on device, and a pure jittable batch sampler.

Unequal (non-IID) partitions are padded to a common length ``M_max`` and come
with ``counts``; the sampler only ever draws positions ``< counts[i]`` on node
i, so padding is never read (jraph-style padding + mask).

Memory: ``x`` is stored once per node *position*, ``N * M_max`` samples in
total, i.e. ``M * M_max / mean(counts)``; for IID splits this equals M, for
very skewed Dirichlet splits it can be a few times M.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.compress import selection


class NodeShards(NamedTuple):
    """Per-node training data, padded to a common length.

    Attributes:
        x: [N, M_max, ...] inputs; rows ``counts[i]:`` of node i are padding.
        y: [N, M_max, ...] int32 labels (``[N, M_max, T]`` next-token targets of text); padding rows
            hold ``-1``.
        counts: [N] int32 number of real samples per node (>= 1).
    """

    x: jax.Array
    y: jax.Array
    counts: jax.Array


def make_node_shards(
    x: np.ndarray,
    y: np.ndarray,
    parts: Sequence[np.ndarray],
    *,
    pad_value: float = 0.0,
    pad_label: int = -1,
) -> NodeShards:
    """Gathers each node's samples and pads them into a :class:`NodeShards` (host NumPy, not jittable).

    Args:
        x: [M, ...] inputs (e.g. ``dataset.x_train``).
        y: [M, ...] integer labels ([M] classes, or [M, T] next-token targets).
        parts: N index arrays into ``range(M)`` (e.g. from
            :func:`jaxgossip.data.partition`), each non-empty.
        pad_value: value of padding inputs.
        pad_label: value of padding labels (-1: not a class).

    Returns:
        NodeShards with x [N, M_max, ...] (dtype of ``x``), y [N, M_max, ...] int32
        and counts [N] int32, as device arrays.
    """
    x = np.asarray(x)
    y = np.asarray(y)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y disagree on the number of samples: {x.shape[0]} vs {y.shape[0]}")
    if len(parts) == 0:
        raise ValueError("parts is empty: need one index array per node")
    counts = np.array([len(p) for p in parts], dtype=np.int32)
    if counts.min() < 1:
        raise ValueError(f"node {int(np.argmin(counts))} has no samples; every node needs at least one")
    max_count = int(counts.max())
    xs = np.full((len(parts), max_count, *x.shape[1:]), pad_value, dtype=x.dtype)
    ys = np.full((len(parts), max_count, *y.shape[1:]), pad_label, dtype=np.int32)
    for i, p in enumerate(parts):
        p = np.asarray(p, dtype=np.int64)
        xs[i, : p.shape[0]] = x[p]
        ys[i, : p.shape[0]] = y[p]
    return NodeShards(jnp.asarray(xs), jnp.asarray(ys), jnp.asarray(counts))


def shard_dataset(dataset, parts: Sequence[np.ndarray], **kwargs) -> NodeShards:
    """:func:`make_node_shards` on ``dataset.x_train`` / ``dataset.y_train``.

    Args:
        dataset: a :class:`jaxgossip.data.Dataset`.
        parts: N index arrays into the training set.
        **kwargs: forwarded (``pad_value``, ``pad_label``).
    """
    return make_node_shards(dataset.x_train, dataset.y_train, parts, **kwargs)


def check_batch_size(shards: NodeShards, batch_size: int, *, replace: bool = True) -> None:
    """Host-side validation of a per-node batch size (call once, outside jit).

    Args:
        shards: the node shards.
        batch_size: B.
        replace: whether batches are drawn with replacement (as in
            :func:`sample_batch`'s default). Without replacement every node
            must hold at least B samples.

    Raises:
        ValueError: B < 1, or "batch size larger than a shard" when sampling
            without replacement and B > min(counts).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    from jaxgossip.ops.sharding import to_host

    counts = np.asarray(to_host(shards.counts))  # sharded over the processes of a multi-process run
    if not replace and batch_size > counts.min():
        raise ValueError(
            f"batch size larger than a shard: batch_size={batch_size} > {int(counts.min())} samples on node "
            f"{int(np.argmin(counts))}; sampling without replacement needs batch_size <= min(counts)"
        )


def sample_node_batch(
    x: jax.Array, y: jax.Array, count: jax.Array, key: jax.Array, batch_size: int, replace: bool = True
) -> tuple[jax.Array, jax.Array]:
    """Draws one node's batch, uniformly among its first ``count`` samples.

    Args:
        x: [M_max, ...] this node's padded inputs.
        y: [M_max] labels.
        count: scalar int, number of real samples.
        key: PRNG key.
        batch_size: B (static).
        replace: with replacement (``randint`` in [0, count)) or without
            (top-B of uniform scores with padding scored -1; needs
            B <= count, see :func:`check_batch_size`).

    Returns:
        ``(x_batch [B, ...], y_batch [B])``.
    """
    if replace:
        idx = jax.random.randint(key, (batch_size,), 0, count)
    else:
        max_count = y.shape[0]
        if batch_size > max_count:
            raise ValueError(f"batch size larger than a shard: batch_size={batch_size} > M_max={max_count}")
        scores = jax.random.uniform(key, (max_count,))
        scores = jnp.where(jnp.arange(max_count) < count, scores, -1.0)
        _, idx = selection.top_k(scores, batch_size)
    return x[idx], y[idx]


def sample_batch(
    shards: NodeShards, key: jax.Array, batch_size: int, *, replace: bool = True
) -> tuple[jax.Array, jax.Array]:
    """Draws a batch on every node, pure and jittable (usable inside ``lax.scan``).

    Node i draws B positions uniformly from ``[0, counts[i])`` with its own
    key (``jax.random.split(key, N)[i]``), so padding is never sampled. With
    replacement by default (the usual "sample a minibatch" SGD model; also
    valid when B > counts[i]); without replacement the caller must first run
    :func:`check_batch_size` with ``replace=False``.

    Args:
        shards: NodeShards with x [N, M_max, ...], y [N, M_max], counts [N].
        key: PRNG key.
        batch_size: B (static Python int).
        replace: sample with replacement (default) or without.

    Returns:
        ``(x [N, B, ...], y [N, B])``.
    """
    keys = jax.random.split(key, shards.counts.shape[0])
    return jax.vmap(lambda x, y, c, k: sample_node_batch(x, y, c, k, batch_size, replace))(
        shards.x, shards.y, shards.counts, keys
    )
