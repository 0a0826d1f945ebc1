"""Seeded partitioners that split a labelled dataset over N nodes (docs/training.md, section partitioners).

Every partitioner takes the label vector ``labels [M]`` and returns a list of N
int64 index arrays (each sorted ascending). The parts are disjoint and cover
``range(M)`` exactly: no partitioner here drops samples (where a reference
implementation drops a remainder, the deviation is documented). Every node
receives at least one sample, otherwise a ``ValueError`` names the node.

Host-side NumPy, not jittable; turn the result into on-device padded shards
with :func:`jaxgossip.data.make_node_shards`.

=====================  ========================================================
scheme string          partitioner
=====================  ========================================================
``"iid"``              :func:`iid`
``"dirichlet:ALPHA"``  :func:`dirichlet` (ALPHA > 0; 0.01 very skewed, 10 ~IID)
``"shards:PER_NODE"``  :func:`shards` (McMahan et al.; PER_NODE >= 1)
``"skew:S"``           :func:`skew` (Aketi et al.; S in [0, 1])
``"by_source"``        :func:`by_source` (whole labels per node: sources of text)
=====================  ========================================================

For a text data set the labels given to a partitioner are the sources of the training windows
(:func:`jaxgossip.data.partition_labels`), so ``dirichlet`` and ``skew`` skew the mixture of sources
and ``by_source`` gives every node whole sources.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: Scheme names accepted by :func:`partition`, with their parameter.
SCHEMES = ("iid", "dirichlet:ALPHA", "shards:PER_NODE", "skew:S", "by_source")


def _check_inputs(labels, num_nodes: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be a 1-D array [M], got shape {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {labels.dtype}")
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, (int, np.integer)) or num_nodes < 1:
        raise ValueError(f"num_nodes must be a positive int, got {num_nodes!r}")
    if num_nodes > labels.shape[0]:
        raise ValueError(
            f"num_nodes={num_nodes} is more than the number of samples M={labels.shape[0]}: "
            "some node would be left empty"
        )
    return labels


def _finish(parts: Sequence[np.ndarray], scheme: str) -> list[np.ndarray]:
    out = [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    for i, p in enumerate(out):
        if p.size == 0:
            raise ValueError(
                f"{scheme}: node {i} was left empty (received no samples); use fewer nodes or a milder skew"
            )
    return out


def iid(labels, num_nodes: int, *, seed: int = 0) -> list[np.ndarray]:
    """IID split: a seeded permutation cut into N contiguous parts.

    Part sizes differ by at most one (``np.array_split``); every index is used.

    Args:
        labels: int [M] (only its length is used).
        num_nodes: N.
        seed: NumPy seed.

    Returns:
        N sorted int64 index arrays, disjoint, covering range(M).
    """
    labels = _check_inputs(labels, num_nodes)
    rng = np.random.default_rng(seed)
    return _finish(np.array_split(rng.permutation(labels.shape[0]), num_nodes), "iid")


def dirichlet(
    labels,
    num_nodes: int,
    alpha: float,
    *,
    seed: int = 0,
    group_size: int = 10,
    min_fraction: float = 0.5,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Dirichlet label skew with the QGM/Aketi conventions (docs/training.md, section partitioners).

    The shuffled data is cut into contiguous slices, one per group of at most
    ``group_size`` workers (slice size proportional to the group's worker
    count). Within a group of k workers holding T samples, for each class c in
    increasing order:

    .. math::
        p \\sim \\mathrm{Dir}(\\alpha \\mathbf 1_k),\\quad
        p_j \\leftarrow p_j \\,[\\,|S_j| < T/k\\,],\\quad p \\leftarrow p / \\textstyle\\sum p,

    and the class's indices are split at ``floor(cumsum(p) * |c|)``. The whole
    group draw is repeated until every worker holds at least
    ``max(1, floor(min_fraction * T / k))`` samples. Smaller alpha = more skew
    (0.01 ~ one class per worker, 10 ~ IID).

    Deviation from the reference: NumPy's ``Generator`` replaces ``RandomState``
    (different draws, same distribution), and a class whose proportions all
    get zeroed (impossible unless a class is empty) is given to one random
    worker below its fair share instead of being silently dropped, so the
    parts always cover the data set exactly.

    Args:
        labels: int [M].
        num_nodes: N.
        alpha: concentration, > 0.
        seed: NumPy seed.
        group_size: workers per group ("auxiliary workers", 10 in the reference).
        min_fraction: each worker needs >= this fraction of its group's mean size.
        max_tries: maximum draws per group before giving up.

    Returns:
        N sorted int64 index arrays, disjoint, covering range(M).

    Raises:
        ValueError: alpha <= 0 or not finite; no valid draw within max_tries.

    References:
        T.-M. H. Hsu, H. Qi, M. Brown. Measuring the effects of non-identical
        data distribution for federated visual classification. arXiv:1909.06335, 2019.
        T. Lin, S. P. Karimireddy, S. U. Stich, M. Jaggi. Quasi-global momentum:
        accelerating decentralized deep learning on heterogeneous data. ICML 2021,
        arXiv:2102.04761.
    """
    labels = _check_inputs(labels, num_nodes)
    alpha = float(alpha)
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"dirichlet: alpha must be a finite number > 0, got {alpha}")
    if group_size < 1:
        raise ValueError(f"dirichlet: group_size must be >= 1, got {group_size}")
    if max_tries < 1:
        raise ValueError(f"dirichlet: max_tries must be >= 1, got {max_tries}")
    rng = np.random.default_rng(seed)
    num_samples = labels.shape[0]
    order = rng.permutation(num_samples)
    classes = np.unique(labels)

    num_groups = math.ceil(num_nodes / group_size)
    workers = [group_size] * (num_groups - 1) + [num_nodes - group_size * (num_groups - 1)]
    bounds = np.round(np.cumsum([0] + workers) / num_nodes * num_samples).astype(np.int64)

    parts: list[np.ndarray] = []
    for g, k in enumerate(workers):
        idx = order[bounds[g] : bounds[g + 1]]
        y = labels[idx]
        total = idx.shape[0]
        fair = total / k
        # As in the reference, plus: never accept an empty worker.
        threshold = max(1, int(min_fraction * total / k))
        for _ in range(max_tries):
            buckets: list[list[np.ndarray]] = [[] for _ in range(k)]
            sizes = np.zeros(k, dtype=np.int64)
            for c in classes:
                idx_c = idx[y == c]
                p = rng.dirichlet(np.full(k, alpha))
                p = np.where(sizes < fair, p, 0.0)
                if not np.isfinite(p).all() or p.sum() <= 0:
                    # Dir with tiny alpha can underflow to all zeros: give the class to one open worker.
                    open_workers = np.flatnonzero(sizes < fair)
                    p = np.zeros(k)
                    p[rng.choice(open_workers) if open_workers.size else rng.integers(k)] = 1.0
                p = p / p.sum()
                cuts = (np.cumsum(p) * idx_c.shape[0]).astype(np.int64)[:-1]
                for j, chunk in enumerate(np.split(idx_c, cuts)):
                    buckets[j].append(chunk)
                    sizes[j] += chunk.shape[0]
            if sizes.min() >= threshold:
                break
        else:
            raise ValueError(
                f"dirichlet: no draw with alpha={alpha} gave every worker of group {g} at least "
                f"{threshold} samples (min_fraction={min_fraction} of the mean {fair:.1f}) after "
                f"max_tries={max_tries} draws; increase alpha, max_tries or the data size, or use fewer nodes"
            )
        parts += [np.concatenate(b) if b else np.zeros(0, np.int64) for b in buckets]
    return _finish(parts, f"dirichlet:{alpha}")


def shards(labels, num_nodes: int, per_node: int, *, seed: int = 0) -> list[np.ndarray]:
    """Label-sorted shards (McMahan et al., 2017; docs/training.md, section partitioners).

    Sorts the indices by label (ties in seeded random order), cuts them into
    ``per_node * N`` contiguous shards (sizes differ by at most one, so every
    index is used), and gives each node ``per_node`` shards chosen by a seeded
    permutation. With ``per_node=2`` most nodes see only two classes.

    Args:
        labels: int [M].
        num_nodes: N.
        per_node: shards per node, >= 1.
        seed: NumPy seed.

    Returns:
        N sorted int64 index arrays, disjoint, covering range(M).

    References:
        H. B. McMahan, E. Moore, D. Ramage, S. Hampson, B. Agüera y Arcas.
        Communication-efficient learning of deep networks from decentralized
        data. AISTATS 2017, arXiv:1602.05629.
    """
    labels = _check_inputs(labels, num_nodes)
    if isinstance(per_node, bool) or not isinstance(per_node, (int, np.integer)) or per_node < 1:
        raise ValueError(f"shards: per_node must be an int >= 1, got {per_node!r}")
    num_shards = per_node * num_nodes
    if num_shards > labels.shape[0]:
        raise ValueError(f"shards: per_node * num_nodes = {num_shards} shards but only M={labels.shape[0]} samples")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(labels.shape[0])
    order = perm[np.argsort(labels[perm], kind="stable")]
    pieces = np.array_split(order, num_shards)
    assign = rng.permutation(num_shards).reshape(num_nodes, per_node)
    return _finish([np.concatenate([pieces[j] for j in row]) for row in assign], f"shards:{per_node}")


def skew(labels, num_nodes: int, s: float, *, seed: int = 0) -> list[np.ndarray]:
    """Aketi et al.'s label skew ``s`` in [0, 1] (docs/training.md, section partitioners).

    Indices are grouped by label in increasing label order (seeded random
    order within a class). For each class the first ``int(s * |class|)``
    indices go to a *sorted pool* (kept in label order), the rest to a
    *random pool* (seeded shuffle). Node i receives the i-th contiguous part of
    the sorted pool plus the i-th part of the random pool. ``s = 0`` is IID;
    ``s = 1`` gives label-sorted contiguous shards.

    Deviation from the reference, which gives every node exactly
    ``floor(s * M / N)`` + ``floor((1 - s) * M / N)`` indices and drops the
    rest: here both pools are split with ``np.array_split``, so every index is
    used and per-pool part sizes differ from the reference by at most one.
    The random pool uses NumPy's ``Generator`` instead of Python's ``Random``.

    Args:
        labels: int [M].
        num_nodes: N.
        s: skew in [0, 1].
        seed: NumPy seed.

    Returns:
        N sorted int64 index arrays, disjoint, covering range(M).

    References:
        S. A. Aketi, A. Singh, J. Rabaey. Sparse-Push: communication- and
        energy-efficient decentralized distributed learning over directed and
        time-varying graphs with non-IID datasets. arXiv:2102.05715, 2021
        (code: aparna-aketi/qgm-sgp ``gossip_avg.py``).
        S. A. Aketi, S. Kodge, K. Roy. Low precision decentralized distributed
        training over IID and non-IID data. arXiv:2111.09389, 2021
        (code: aparna-aketi/Low_Precision_DL).
    """
    labels = _check_inputs(labels, num_nodes)
    s = float(s)
    if not 0.0 <= s <= 1.0:
        raise ValueError(f"skew: s must be in [0, 1], got {s}")
    rng = np.random.default_rng(seed)
    sorted_pool, random_pool = [], []
    for c in np.unique(labels):
        idx_c = rng.permutation(np.flatnonzero(labels == c))
        cut = int(s * idx_c.shape[0])
        sorted_pool.append(idx_c[:cut])
        random_pool.append(idx_c[cut:])
    sorted_pool = np.concatenate(sorted_pool)
    random_pool = rng.permutation(np.concatenate(random_pool))
    sorted_parts = np.array_split(sorted_pool, num_nodes)
    random_parts = np.array_split(random_pool, num_nodes)
    return _finish([np.concatenate(pair) for pair in zip(sorted_parts, random_parts)], f"skew:{s}")


def by_source(labels, num_nodes: int, *, seed: int = 0) -> list[np.ndarray]:
    """Whole sources per node: every value of ``labels`` (a source, e.g. a document) goes to one node.

    Balanced greedily by size (longest processing time first): the sources, in decreasing size with
    ties in seeded random order, each go to the node holding the fewest samples so far (ties to the
    first in a seeded random order of the nodes). No source is split, so nodes differ in size by at
    most the largest source; with text this is the non-IID-by-source split.

    Args:
        labels: int [M], the source of every sample.
        num_nodes: N, at most the number of distinct sources S.
        seed: NumPy seed.

    Returns:
        N sorted int64 index arrays, disjoint, covering range(M).

    Raises:
        ValueError: fewer sources than nodes.
    """
    labels = _check_inputs(labels, num_nodes)
    sources, sizes = np.unique(labels, return_counts=True)
    if sources.shape[0] < num_nodes:
        raise ValueError(
            f"by_source: {sources.shape[0]} sources cannot give each of num_nodes={num_nodes} nodes a whole "
            "source; use fewer nodes, or partition=iid / dirichlet:ALPHA"
        )
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(sources.shape[0])
    order = shuffled[np.argsort(-sizes[shuffled], kind="stable")]
    node_order = rng.permutation(num_nodes)
    load = np.zeros(num_nodes, np.int64)
    owner = np.empty(sources.shape[0], np.int64)
    for s in order:
        node = node_order[np.argmin(load[node_order])]
        owner[s] = node
        load[node] += sizes[s]
    node_of = owner[np.searchsorted(sources, labels)]
    return _finish([np.flatnonzero(node_of == i) for i in range(num_nodes)], "by_source")


def partition(labels, num_nodes: int, scheme: str = "iid", seed: int = 0) -> list[np.ndarray]:
    """Splits ``labels`` over ``num_nodes`` nodes with a scheme given as a string.

    Args:
        labels: int [M].
        num_nodes: N.
        scheme: "iid", "dirichlet:ALPHA", "shards:PER_NODE", "skew:S" or "by_source",
            e.g. "dirichlet:0.1", "shards:2", "skew:0.8".
        seed: NumPy seed.

    Returns:
        N sorted int64 index arrays, disjoint, covering range(M).

    Raises:
        ValueError: unknown scheme (lists the known ones), missing or bad
            parameter, more nodes than samples, or a node left empty.
    """
    if not isinstance(scheme, str):
        raise ValueError(f"scheme must be a string like 'dirichlet:0.1', got {scheme!r}")
    name, sep, arg = scheme.strip().partition(":")
    name, arg = name.strip().lower(), arg.strip()
    known = ", ".join(repr(s) for s in SCHEMES)
    if name == "iid":
        if sep and arg:
            raise ValueError(f"scheme 'iid' takes no parameter, got {scheme!r}")
        return iid(labels, num_nodes, seed=seed)
    if name == "by_source":
        if sep and arg:
            raise ValueError(f"scheme 'by_source' takes no parameter, got {scheme!r}")
        return by_source(labels, num_nodes, seed=seed)
    if name not in ("dirichlet", "shards", "skew"):
        raise ValueError(f"unknown partition scheme {scheme!r}; known: {known}")
    if not arg:
        example = {"dirichlet": "dirichlet:0.1", "shards": "shards:2", "skew": "skew:0.8"}[name]
        raise ValueError(f"scheme {name!r} needs a parameter, e.g. {example!r}; got {scheme!r}")
    try:
        value = int(arg) if name == "shards" else float(arg)
    except ValueError:
        kind = "an integer" if name == "shards" else "a number"
        raise ValueError(f"parameter of scheme {name!r} must be {kind}, got {arg!r}") from None
    if name == "dirichlet":
        return dirichlet(labels, num_nodes, value, seed=seed)
    if name == "shards":
        return shards(labels, num_nodes, value, seed=seed)
    return skew(labels, num_nodes, value, seed=seed)


def label_histograms(labels, parts: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """Per-node label counts, for reports and tests.

    Args:
        labels: int [M], values in [0, num_classes).
        parts: N index arrays (e.g. from :func:`partition`).
        num_classes: C.

    Returns:
        int64 [N, C]: entry (i, c) = number of samples of class c on node i.
    """
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must be in [0, {num_classes}), got range [{labels.min()}, {labels.max()}]")
    return np.stack([np.bincount(labels[np.asarray(p, np.int64)], minlength=num_classes) for p in parts]).astype(
        np.int64
    )
