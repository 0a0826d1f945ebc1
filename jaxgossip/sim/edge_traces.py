"""Per-edge link traces: ``--time.latency=edge_trace:PATH`` / ``--time.bandwidth=edge_trace:PATH``.

Where ``trace:PATH`` gives a value per node (its uplink), an edge trace gives one per directed edge
of the graph (a link i -> j of its own), cycled over rounds. Two layouts:

* ``.csv`` with a header ``row,sender,receiver,value`` (or ``sender,receiver,value``: one row), one
  line per (row, edge): every real edge of the graph (weight != 0, sender != receiver) in every
  row 0 .. R - 1 (with R = T > 1, row t holds graph t's edges), e.g.
  ``row,sender,receiver,value`` / ``0,0,1,1e8`` / ``0,1,0,5e6`` / ... On a time-varying graph
  (period T) an edge takes the value of its (sender, receiver) pair in every graph it belongs to.
* ``.npy`` of shape ``[P]`` or ``[R, P]``: the values of the P real edges of a static graph in
  ascending (sender, receiver) order.

Round r uses row ``r mod R``. With R > 1 the graph must be static (T = 1), or R = T (row t is
graph t's); a stochastic graph (drawn every round) has no fixed edges and is refused, as is an
all-reduce, which has no graph. Host-side NumPy, not jittable: the values become a ``[T, E]``
array aligned with ``topology.senders`` (:func:`edge_values`), or a :class:`PerRoundEdge` ``[R, E]``.
"""

from __future__ import annotations

import csv
import os
from typing import Any, NamedTuple

import numpy as np

__all__ = ["EdgeTrace", "PerRoundEdge", "load_edge_trace", "edge_values"]


class EdgeTrace(NamedTuple):
    """A parsed edge trace.

    Attributes:
      path: the file (error messages).
      pairs: ``[P, 2]`` int64 (sender, receiver) of each column (a CSV), or None (a ``.npy``:
        the graph's real edges in ascending order).
      values: ``[R, P]`` float64 (NaN: the edge is not in that row of a CSV).
    """

    path: str
    pairs: Any
    values: Any

    @property
    def rows(self) -> int:
        """R, the rows cycled over rounds."""
        return int(self.values.shape[0])


class PerRoundEdge(NamedTuple):
    """Per-edge link values that change with the round on a static graph: ``values`` ``[R, E]``
    aligned with ``topology.senders[0]``, round r uses row ``r mod R``."""

    values: Any


def _read_csv(name: str, path: str) -> EdgeTrace:
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = [h.strip().lower() for h in next(reader, [])]
        lines = [line for line in reader if line and any(c.strip() for c in line)]
    if header not in (["row", "sender", "receiver", "value"], ["sender", "receiver", "value"]):
        raise ValueError(
            f"{name}: the header must be row,sender,receiver,value (or sender,receiver,value); got {','.join(header)}"
        )
    try:
        table = np.array([[float(c) for c in line] for line in lines], np.float64)
    except ValueError:
        raise ValueError(f"{name}: every value after the header must be a number") from None
    if table.ndim != 2 or table.shape[0] == 0 or table.shape[1] != len(header):
        raise ValueError(f"{name}: every line needs {len(header)} values ({','.join(header)})")
    if len(header) == 3:
        table = np.concatenate([np.zeros([table.shape[0], 1]), table], axis=1)
    index = table[:, :3]
    if not np.all(np.isfinite(index)) or np.any(index < 0) or np.any(index != np.round(index)):
        raise ValueError(f"{name}: row, sender and receiver must be integers >= 0")
    index = index.astype(np.int64)
    loops = index[:, 1] == index[:, 2]
    if loops.any():
        node = int(index[loops][0, 1])
        raise ValueError(f"{name}: edge {node} -> {node} is a self loop, not a link")
    pairs, column = np.unique(index[:, 1:], axis=0, return_inverse=True)
    column = column.reshape(-1)
    rows = int(index[:, 0].max()) + 1
    seen = np.zeros([rows, pairs.shape[0]], np.int64)
    np.add.at(seen, (index[:, 0], column), 1)
    if np.any(seen > 1):
        r, p = np.argwhere(seen > 1)[0]
        raise ValueError(f"{name}: edge {pairs[p, 0]} -> {pairs[p, 1]} appears {seen[r, p]} times in row {r}")
    values = np.full([rows, pairs.shape[0]], np.nan)  # NaN: not in that row (refused where a graph needs it)
    values[index[:, 0], column] = table[:, 3]
    return EdgeTrace(path, pairs, values)


def load_edge_trace(name: str, path: str) -> EdgeTrace:
    """The :class:`EdgeTrace` of a ``.csv`` or ``.npy`` file (module docstring); ``name`` (the
    option) starts every error.

    Raises:
      ValueError: no such file, a wrong header or shape, a self loop, an edge missing from a row.
    """
    if not path or not os.path.isfile(path):
        raise ValueError(f"{name}: no edge trace file {path!r}")
    if path.endswith(".csv"):
        return _read_csv(name, path)
    if not path.endswith(".npy"):
        raise ValueError(f"{name}: an edge trace is a .csv (row,sender,receiver,value) or a .npy [P] / [R, P] file")
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ValueError(f"{name}: cannot read {path!r}: {err}") from None
    arr = arr[None] if arr.ndim == 1 else arr
    if arr.ndim != 2 or arr.size == 0 or arr.dtype.kind not in "iuf":
        raise ValueError(f"{name}: an edge trace .npy must be a numeric [P] or [R, P] array; got {arr.shape}")
    return EdgeTrace(path, None, arr.astype(np.float64))


def _real_pairs(topology: Any, t: int) -> tuple[np.ndarray, np.ndarray]:
    """``(edges [K], pairs [K, 2])``: graph t's real edges (weight != 0, not a self loop), in
    ascending (sender, receiver) order."""
    s, r = np.asarray(topology.senders)[t], np.asarray(topology.receivers)[t]
    real = np.flatnonzero((np.asarray(topology.weights)[t] != 0) & (s != r))
    real = real[np.lexsort((r[real], s[real]))]
    return real, np.stack([s[real], r[real]], axis=1).astype(np.int64)


def edge_values(name: str, trace: EdgeTrace, topology: Any) -> np.ndarray | PerRoundEdge:
    """The values of ``trace`` on ``topology``'s edges: ``[T, E]`` float64 aligned with
    ``topology.senders`` (R = 1, or R = T), or :class:`PerRoundEdge` ``[R, E]`` (a static graph,
    R > 1). Edges that are not links (self loops, padding) get 1 (never priced).

    Raises:
      ValueError: naming ``name``: a stochastic graph or one without host tables, rows that cannot be
        aligned with a time-varying graph, an edge of the file not in the graph, an edge of the
        graph missing from the file, a ``.npy`` of the wrong width.
    """
    if topology is None:
        raise ValueError(f"{name} prices the graph's edges; an all-reduce has none: give a number or a per-node spec")
    if topology.stochastic or not topology.host_tables:
        raise ValueError(
            f"{name} needs a fixed graph whose edges are known on the host; {topology.name} is "
            f"{'drawn every round' if topology.stochastic else 'traced (a member of a stack of graphs)'}"
        )
    period, rows = int(np.shape(topology.senders)[0]), trace.rows
    if rows > 1 and period > 1 and rows != period:
        raise ValueError(
            f"{name}: {rows} rows cannot be aligned with the {period} graphs of {topology.name} (round r uses row "
            f"r mod {rows} and graph r mod {period}): give one row, or {period}"
        )
    out = np.ones([max(rows, period), np.shape(topology.senders)[1]], np.float64)
    used = np.zeros(np.shape(trace.values), bool)  # the (row, edge) entries a graph priced
    for t in range(period):
        edges, pairs = _real_pairs(topology, t)
        if trace.pairs is None:
            if period > 1:
                raise ValueError(
                    f"{name}: a .npy edge trace needs a static graph; {topology.name} changes with the round: give a "
                    ".csv with row,sender,receiver,value"
                )
            if trace.values.shape[1] != edges.size:
                raise ValueError(
                    f"{name}: {trace.values.shape[1]} values per row, but {topology.name} has {edges.size} directed "
                    "edges (ascending sender, receiver)"
                )
            out[:, edges] = trace.values
            continue
        # the file's column of each graph edge, by (sender, receiver) key: the file's pairs are sorted
        n = max(int(topology.num_nodes), int(trace.pairs.max()) + 1)  # keys unique even for unknown nodes
        file_keys = trace.pairs[:, 0] * n + trace.pairs[:, 1]
        edge_keys = pairs[:, 0] * n + pairs[:, 1]
        k = np.minimum(np.searchsorted(file_keys, edge_keys), file_keys.size - 1)
        found = file_keys[k] == edge_keys
        need = slice(None) if period == 1 else slice(0 if rows == 1 else t, 1 if rows == 1 else t + 1)
        gaps = np.isnan(trace.values[need][:, k])  # [rows needed, K]
        bad = ~found | gaps.any(axis=0)
        if bad.any():
            first = int(np.argmax(bad))
            a, b = pairs[first]
            where = "the file" if not found[first] else f"row {int(np.argmax(gaps[:, first])) + (need.start or 0)}"
            raise ValueError(f"{name}: edge {a} -> {b} of {topology.name} (graph {t}) is missing from {where}")
        used[need, k] = True
        if period == 1:
            out[:, edges] = trace.values[:, k]
        else:
            out[t, edges] = trace.values[need][0, k]
    unused = ~np.isnan(trace.values) & ~used
    if trace.pairs is not None and unused.any():
        r, k = np.argwhere(unused)[0]
        a, b = trace.pairs[k]
        graph = f"graph {r} of {topology.name} (row {r})" if rows == period > 1 else topology.name
        raise ValueError(f"{name}: edge {a} -> {b} is not an edge of {graph}")
    return PerRoundEdge(out) if rows > 1 and period == 1 else out
