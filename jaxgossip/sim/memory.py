"""Memory planning of a compiled program: XLA's memory analysis, byte counts of a stacked state,
and the largest node count N whose program fits a memory size.

The pieces are pure and small; :mod:`jaxgossip.run.plan` applies them to the training chunk of a
configured run (``jaxgossip plan``).

* :func:`memory_stats` reads ``compiled.memory_analysis()``: arguments, outputs, temporaries
  (activations, gradients, buffers of fused kernels), aliased bytes and generated code. The
  program's device memory is ``arguments + outputs + temp - alias`` (:attr:`MemoryStats.total`).
* :func:`tree_bytes` counts a pytree of arrays or ``jax.ShapeDtypeStruct`` (``jax.eval_shape``: no
  allocation) by its leaf shapes, ``size * itemsize`` per leaf, and says which leaves are not
  per-node (those without a node axis: round counters, keys, the evaluation set, per-edge
  buffers).
* :func:`fit_affine` and :func:`largest_fitting`: memory is close to affine in N (every stacked
  leaf is ``[N, ...]``; the data set is split, not copied), so a line through two compiles
  predicts the largest N under a limit M; :func:`largest_fitting` then compiles at the prediction
  and walks over the valid node counts (a hypercube needs a power of two, a torus a grid) until the
  compile at N fits and the one at the next valid count does not.
* :func:`parse_memory` reads sizes such as ``16GB`` (10^9 bytes), ``16GiB`` (2^30 bytes) or
  ``800MB``; :data:`GPU_MEMORY` lists the sizes of the GPUs researchers use, in GiB.

The numbers are those of the compile they come from. A program compiled for the CPU and the same
program compiled for a GPU can differ (other fusions, cuDNN workspaces, the allocator's
fragmentation), so leave a margin when planning a GPU run from a CPU compile.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

__all__ = [
    "MemoryStats",
    "memory_stats",
    "TreeBytes",
    "tree_bytes",
    "leaf_bytes",
    "parse_memory",
    "format_bytes",
    "GPU_MEMORY",
    "GIB",
    "fit_affine",
    "predict_nodes",
    "Fit",
    "largest_fitting",
]

#: bytes in one GiB (2^30); the unit of :data:`GPU_MEMORY`.
GIB = 2**30

#: (label, bytes) of the GPU memory sizes researchers use, in GiB: 16 (V100 16 GB, T4), 24 (A10,
#: L4, RTX 4090), 40 (A100 40 GB), 80 (A100 / H100 80 GB), 141 (H200). Vendors' "GB" of GPU
#: memory are binary (an 80 GB A100 reports 81920 MiB).
GPU_MEMORY = tuple((f"{g} GiB", g * GIB) for g in (16, 24, 40, 80, 141))

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


class MemoryStats(NamedTuple):
    """XLA's memory analysis of one compiled program (bytes).

    Attributes:
      arguments: the buffers passed in (the state and the data).
      outputs: the buffers returned (the next state and the metrics).
      temp: XLA's temporary buffers: activations, gradients, intermediate results.
      alias: bytes of outputs that reuse an argument's buffer (donated arguments), counted once.
      generated_code: the compiled code's size (0 on XLA:CPU; not part of :attr:`total`).
    """

    arguments: int
    outputs: int
    temp: int
    alias: int
    generated_code: int

    @property
    def total(self) -> int:
        """Device memory of one call: ``arguments + outputs + temp - alias``."""
        return self.arguments + self.outputs + self.temp - self.alias


def memory_stats(compiled: Any) -> MemoryStats:
    """The :class:`MemoryStats` of ``compiled`` (``jax.jit(f).lower(...).compile()``).

    Raises:
      ValueError: the backend reports no memory analysis.
    """
    analysis = compiled.memory_analysis()
    if analysis is None:
        raise ValueError("this backend reports no memory analysis (compiled.memory_analysis() is None)")
    return MemoryStats(
        arguments=int(analysis.argument_size_in_bytes),
        outputs=int(analysis.output_size_in_bytes),
        temp=int(analysis.temp_size_in_bytes),
        alias=int(analysis.alias_size_in_bytes),
        generated_code=int(analysis.generated_code_size_in_bytes),
    )


def leaf_bytes(leaf: Any) -> int:
    """``size * itemsize`` of an array or ``jax.ShapeDtypeStruct`` (typed PRNG keys count their key
    data; Python scalars their NumPy dtype)."""
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        leaf = jax.eval_shape(jax.random.key_data, leaf)
        dtype = leaf.dtype
    if dtype is None:
        dtype = np.result_type(leaf)
    return int(np.prod(np.shape(leaf), dtype=np.int64)) * np.dtype(dtype).itemsize


class TreeBytes(NamedTuple):
    """Bytes of one pytree of arrays, by leaf shape.

    Attributes:
      total: bytes of all leaves.
      per_node: the bytes of the per-node leaves (those with a node axis, see
        :func:`tree_bytes`) / N.
      shared: bytes of the other leaves (round counters, keys, per-edge or per-pair buffers).
      shared_leaves: ``"path shape dtype"`` of each leaf that is not per-node.
    """

    total: int
    per_node: float
    shared: int
    shared_leaves: tuple[str, ...]


def tree_bytes(tree: Any, num_nodes: int, like: Any = None, like_nodes: int | None = None) -> TreeBytes:
    """Counts ``tree``'s bytes and splits them into per-node leaves and the rest.

    A leaf is per-node when it has a node axis, and then counts ``bytes / N`` per node. Given
    ``like``, the same pytree at another node count ``like_nodes`` (e.g. the same algorithm's state
    built at 2N), a node axis is one of length N in ``tree`` and ``like_nodes`` in ``like``: a
    ``[T, N, ...]`` buffer (one copy per period of a time-varying graph) or a per-pair ``[P, ...]``
    buffer with P = N (the pairs of a ring) is per-node; a ``[]`` counter, an ``[M_eval, ...]`` set
    or ``[2N, ...]`` per-edge buffers are not. Without ``like`` the node axis must be the leading one,
    and a leaf whose leading axis happens to equal N (say E = N edges) counts as per-node.

    Args:
      tree: a pytree of arrays or ``jax.ShapeDtypeStruct`` (e.g. ``jax.eval_shape`` of an init).
      num_nodes: N.
      like: optional, the same pytree structure at ``like_nodes`` nodes.
      like_nodes: the node count of ``like`` (required with it, != N).

    Returns:
      :class:`TreeBytes`.

    Raises:
      ValueError: a bad N, or ``like`` of another structure or without a distinct ``like_nodes``.
    """
    for name, value in (("num_nodes", num_nodes), ("like_nodes", like_nodes)):
        if value is None and name == "like_nodes" and like is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}={value!r} must be an int >= 1")
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    if like is None:
        scaled = [bool(np.shape(leaf)) and np.shape(leaf)[0] == num_nodes for _, leaf in leaves]
    else:
        others = jax.tree_util.tree_leaves(like)
        if like_nodes == num_nodes or len(others) != len(leaves):
            raise ValueError(
                f"like must be the same pytree ({len(leaves)} leaves, got {len(others)}) at like_nodes != "
                f"num_nodes={num_nodes}, got like_nodes={like_nodes}"
            )
        scaled = [
            _has_node_axis(np.shape(leaf), num_nodes, np.shape(other), like_nodes)
            for (_, leaf), other in zip(leaves, others)
        ]
    total, stacked, shared, names = 0, 0, 0, []
    for (path, leaf), per_node in zip(leaves, scaled):
        size = leaf_bytes(leaf)
        total += size
        if per_node:
            stacked += size
        else:
            shared += size
            dtype = leaf.dtype if hasattr(leaf, "dtype") else np.result_type(leaf)
            names.append(f"{jax.tree_util.keystr(path) or '.'} {list(np.shape(leaf))} {dtype}")
    return TreeBytes(total, stacked / num_nodes, shared, tuple(names))


def _has_node_axis(shape: tuple, n: int, like_shape: tuple, like_n: int) -> bool:
    """Whether an axis has length ``n`` in ``shape`` and ``like_n`` in ``like_shape``."""
    return len(shape) == len(like_shape) and any(a == n and b == like_n for a, b in zip(shape, like_shape))


def parse_memory(text: str | int | float) -> int:
    """Bytes of a memory size: ``"16GB"`` (10^9), ``"16GiB"`` (2^30), ``"800MB"``, ``"1.5e9"`` or a
    number of bytes; units B, KB, MB, GB, TB (powers of 1000, also K, M, G, T) and KiB, MiB, GiB,
    TiB (powers of 1024), any case, spaces allowed.

    Raises:
      ValueError: naming the text, for an unknown unit, a missing number, or a size that is not
        finite and > 0.
    """
    if isinstance(text, bool):
        raise ValueError(f"memory={text!r} must be a size such as 16GB, 16GiB or 800MB")
    if isinstance(text, (int, float, np.integer, np.floating)):
        number, unit = float(text), ""
    else:
        match = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
        if match is None:
            raise ValueError(f"memory={text!r} is not a size; give a number and a unit such as 16GB, 16GiB or 800MB")
        number, unit = float(match.group(1)), match.group(2).lower()
        if unit not in _UNITS:
            raise ValueError(
                f"memory={text!r}: unknown unit {match.group(2)!r}; units: B, KB, MB, GB, TB (10^3 steps), "
                "KiB, MiB, GiB, TiB (2^10 steps)"
            )
    size = number * _UNITS[unit]
    if not math.isfinite(size) or size <= 0:
        raise ValueError(f"memory={text!r} must be a finite size > 0")
    if size < 1:
        raise ValueError(f"memory={text!r} is less than one byte")
    return int(size)


def format_bytes(size: float) -> str:
    """``size`` bytes in the largest binary unit that keeps it >= 1 (``"1.50 GiB"``)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size) >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size:.0f} B"


def fit_affine(points: list[tuple[int, int]]) -> tuple[float, float]:
    """``(a, b)`` of the line ``bytes = a + b N`` through the points ``(N, bytes)`` at the two
    largest node counts (a count given twice keeps its last bytes)."""
    by_nodes = dict(points)
    if len(by_nodes) < 2:
        raise ValueError(f"fit_affine needs points at two node counts, got {points}")
    (n0, m0), (n1, m1) = sorted(by_nodes.items())[-2:]
    b = (m1 - m0) / (n1 - n0)
    return m0 - b * n0, b


def predict_nodes(limit: float, a: float, b: float) -> float:
    """The N at which ``a + b N`` reaches ``limit`` (inf when the memory does not grow with N)."""
    if b <= 0:
        return math.inf
    return (limit - a) / b


class Fit(NamedTuple):
    """The largest node count whose program fits a memory limit (:func:`largest_fitting`).

    Attributes:
      limit: the memory limit M (bytes).
      num_nodes: the largest valid N whose compile fits (``bytes <= M``); None if none fits.
      bytes: the compiled bytes at ``num_nodes`` (None if none fits).
      next_nodes: the next valid node count above ``num_nodes`` (None if there is none up to the
        size cap, e.g. the data set cannot be split further).
      next_bytes: its compiled bytes (> M), or None.
      predicted: the prediction of the affine fit through the first two compiles.
      limited_by: ``"memory"`` (the next valid count does not fit), ``"no larger valid N"`` (none up
        to ``max_nodes``, see :func:`largest_fitting`'s ``valid``), ``"none fits"``, or
        ``"unconfirmed"`` (``max_compiles`` ran out before the next valid count was compiled;
        ``next_nodes`` is then the smallest count known not to fit).
    """

    limit: int
    num_nodes: int | None
    bytes: int | None
    next_nodes: int | None
    next_bytes: int | None
    predicted: float
    limited_by: str


def largest_fitting(
    measure: Callable[[int], int],
    limit: int,
    valid: Callable[[int], bool],
    *,
    start: tuple[int, int],
    max_nodes: int,
    max_compiles: int = 12,
) -> Fit:
    """The largest valid node count N <= ``max_nodes`` whose ``measure(N) <= limit``.

    Fits a line through ``measure`` at the two ``start`` counts, compiles at the prediction (the
    largest valid count below it), and then moves on the valid counts: down while the compile does
    not fit, up while the next valid count fits, interpolating between the largest count known to
    fit and the smallest known not to (bisection when the line does not help). The answer is
    confirmed: ``measure(N) <= limit < measure(next valid N)``, unless no valid count above N
    exists up to ``max_nodes`` (or the compiles run out: ``limited_by="unconfirmed"``).

    Args:
      measure: bytes of the program at N nodes (one compile; callers cache it).
      limit: M, bytes.
      valid: whether N nodes can be built (topology rules, data set size); cheap.
      start: two valid node counts to fit the line through.
      max_nodes: the largest N to consider.
      max_compiles: a bound on calls of ``measure`` beyond the two starts.

    Returns:
      :class:`Fit`.
    """
    known: dict[int, int] = {n: measure(n) for n in start}
    a, b = fit_affine(list(known.items()))
    predicted = predict_nodes(limit, a, b)

    def floor_valid(n: int, above: int) -> int | None:
        """The largest valid count in (above, n]."""
        return next((m for m in range(min(n, max_nodes), above, -1) if valid(m)), None)

    def next_valid(n: int, below: int) -> int | None:
        """The smallest valid count in (n, below)."""
        return next((m for m in range(n + 1, min(below, max_nodes + 1)) if valid(m)), None)

    for step in range(max_compiles + 1):
        over = [n for n, m in known.items() if m > limit]
        hi = min(over) if over else max_nodes + 1  # the smallest count known not to fit
        lo = max((n for n, m in known.items() if m <= limit and n < hi), default=0)  # the largest below it
        if lo:
            nxt = next_valid(lo, hi)
            if nxt is None:  # confirmed: lo fits and the next valid count does not (or there is none)
                if hi <= max_nodes:
                    return Fit(limit, lo, known[lo], hi, known[hi], predicted, "memory")
                return Fit(limit, lo, known[lo], None, None, predicted, "no larger valid N")
        if step == max_compiles:
            break
        # the line through the two counts whose bytes are closest to the limit
        nearest = sorted(known.items(), key=lambda item: abs(item[1] - limit))[:2]
        a, b = fit_affine(nearest)
        guess = predict_nodes(limit, a, b)
        target = hi - 1 if not math.isfinite(guess) else int(math.floor(guess))
        if lo and hi <= max_nodes and step >= 2:  # the line creeps: bisect the bracket
            target = (lo + hi) // 2
        target = min(max(target, lo + 1), hi - 1)
        candidate = (floor_valid(target, lo) or next_valid(target, hi)) if target > lo else None
        if candidate is None:  # no valid count below the smallest that does not fit
            return Fit(limit, None, None, None, None, predicted, "none fits")
        known[candidate] = measure(candidate)
    # out of compiles (memory far from affine): the best count known to fit, not confirmed
    over = [n for n, m in known.items() if m > limit]
    hi = min(over) if over else None
    lo = max((n for n, m in known.items() if m <= limit and (hi is None or n < hi)), default=None)
    if lo is None:
        return Fit(limit, None, None, None, None, predicted, "none fits")
    return Fit(limit, lo, known[lo], hi, None if hi is None else known[hi], predicted, "unconfirmed")
