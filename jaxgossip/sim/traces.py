"""Device traces: one file of per-node, per-time compute and network capacity, read by
``--time.compute=trace:PATH``, ``--time.bandwidth=trace:PATH``, ``--time.downlink=trace:PATH`` and
``--time.latency=trace:PATH``.

**The layout** (:class:`DeviceTrace`), as ``.npz`` or as a long ``.csv`` with a header:

* ``.npz``: arrays ``compute_seconds`` ``[K, N]`` (seconds of node i's local step k, row
  ``k mod K``), ``uplink_bps`` and ``downlink_bps`` ``[R, N]`` (bit/s in round r, row
  ``r mod R``) and ``latency_s`` ``[R, N]`` (seconds per message); any subset, at least one.
* ``.csv``: a header ``row,node,`` then any of ``compute_seconds,uplink_bps,downlink_bps,latency_s``,
  and one line per (row, node) with every node of every row, e.g.
  ``row,node,compute_seconds,uplink_bps`` / ``0,0,0.02,1e7`` / ``0,1,0.05,2e6`` / ...; a column
  fills its rows 0 .. R - 1 and is empty in later rows (columns may have different R; one row:
  the same values all the time).

Each option takes its column (compute: ``compute_seconds``, bandwidth: ``uplink_bps``, downlink:
``downlink_bps``, latency: ``latency_s``); a file without it is refused naming the column (how a
downlink is priced: :mod:`jaxgossip.sim.network`). A plain ``.npy`` / header-less ``.csv`` matrix is still one
option's values (:func:`jaxgossip.sim.compute.load_trace`).

**FedScale devices** (:func:`from_fedscale`): FedScale's device profiles give per client a compute
speed (milliseconds per sample) and a communication speed (kbit/s, used both ways). Node i takes
the i-th client in ascending id: ``compute_seconds = batch_size * ms / 1000`` (one step of B
samples), ``uplink_bps = downlink_bps = 1000 kbps``, one row (fixed in time).

References:
  Lai, Dai, Zhu, Madhyastha, Chowdhury, "FedScale: Benchmarking Model and System Performance of
  Federated Learning at Scale", ICML 2022 (arXiv:2105.11367): the device profiles' fields.
"""

from __future__ import annotations

import csv
import os
from typing import Any, NamedTuple

import numpy as np

__all__ = ["COLUMNS", "DeviceTrace", "is_device_trace", "load_device_trace", "save_device_trace", "from_fedscale"]

COLUMNS = ("compute_seconds", "uplink_bps", "downlink_bps", "latency_s")
_POSITIVE = ("uplink_bps", "downlink_bps")  # > 0; the others >= 0


class DeviceTrace(NamedTuple):
    """Per-node capacity over time (module docstring); each field ``[rows, N]`` float32 or None."""

    compute_seconds: Any = None
    uplink_bps: Any = None
    downlink_bps: Any = None
    latency_s: Any = None


def _checked(trace: DeviceTrace, where: str) -> DeviceTrace:
    present = {name: v for name, v in trace._asdict().items() if v is not None}
    if not present:
        raise ValueError(f"{where}: a device trace needs at least one of {', '.join(COLUMNS)}")
    widths = {np.shape(v)[1] for v in present.values() if np.ndim(v) == 2}
    out = {}
    for name, value in present.items():
        arr = np.asarray(value)
        if arr.ndim != 2 or arr.size == 0 or arr.dtype.kind not in "iuf":
            raise ValueError(f"{where}: {name} must be a numeric [rows, N] array; got shape {arr.shape}")
        if not np.all(np.isfinite(arr)) or (np.any(arr <= 0) if name in _POSITIVE else np.any(arr < 0)):
            rule = "> 0" if name in _POSITIVE else ">= 0"
            raise ValueError(f"{where}: {name} must be finite and {rule}")
        out[name] = arr.astype(np.float32)
    if len(widths) > 1:
        raise ValueError(f"{where}: the columns have different node counts {sorted(widths)}")
    return DeviceTrace(**out)


def is_device_trace(path: str) -> bool:
    """Whether ``path`` is in the device-trace layout: a ``.npz``, or a ``.csv`` whose first line is
    a header (starts with ``row``)."""
    if path.endswith(".npz"):
        return True
    if not path.endswith(".csv") or not os.path.isfile(path):
        return False
    with open(path, newline="") as f:
        return f.readline().strip().lower().startswith("row")


def _read_csv(path: str) -> DeviceTrace:
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader)]
        rows = [line for line in reader if line and any(c.strip() for c in line)]
    if header[:2] != ["row", "node"] or not set(header[2:]) <= set(COLUMNS) or len(header) < 3:
        raise ValueError(
            f"{path}: the header must be row,node followed by some of {','.join(COLUMNS)}; got {','.join(header)}"
        )
    if len(set(header)) != len(header):
        raise ValueError(f"{path}: a column is named twice in the header {','.join(header)}")
    try:  # an empty cell: the column has fewer rows (NaN here, checked below)
        table = np.array([[float(c) if c.strip() else np.nan for c in line] for line in rows], np.float64)
    except ValueError:
        raise ValueError(f"{path}: every value after the header must be a number or empty") from None
    if table.ndim != 2 or table.shape[1] != len(header):
        raise ValueError(f"{path}: every line needs {len(header)} values ({','.join(header)})")
    index = table[:, :2]
    if not np.all(np.isfinite(index)) or np.any(index < 0) or np.any(index != np.round(index)):
        raise ValueError(f"{path}: row and node must be integers >= 0")
    r, n = index[:, 0].astype(np.int64), index[:, 1].astype(np.int64)
    shape = (int(r.max()) + 1, int(n.max()) + 1)
    seen = np.zeros(shape, np.int64)
    np.add.at(seen, (r, n), 1)
    if np.any(seen != 1):
        missing = np.argwhere(seen != 1)[0]
        raise ValueError(
            f"{path}: every (row, node) of the {shape[0]} x {shape[1]} grid must appear once; "
            f"(row {missing[0]}, node {missing[1]}) appears {seen[tuple(missing)]} times"
        )
    columns = {}
    for k, name in enumerate(header[2:], start=2):
        grid = np.empty(shape, np.float64)
        grid[r, n] = table[:, k]
        filled = ~np.isnan(grid).any(axis=1)
        rows_of = int(np.argmin(filled)) if not filled.all() else shape[0]
        if rows_of == 0 or filled[rows_of:].any() or not np.isnan(grid[rows_of:]).all():
            raise ValueError(f"{path}: column {name} must fill rows 0 .. R - 1 for every node and be empty after them")
        columns[name] = grid[:rows_of]
    return DeviceTrace(**columns)


def load_device_trace(path: str) -> DeviceTrace:
    """The :class:`DeviceTrace` of a ``.npz`` or headed ``.csv`` file (module docstring).

    Raises:
      ValueError: naming the file and the rule it breaks (no such file, unknown columns, a grid
        with a missing or repeated (row, node), values out of range).
    """
    if not os.path.isfile(path):
        raise ValueError(f"no device trace file {path!r}")
    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as z:
            unknown = sorted(set(z.files) - set(COLUMNS))
            if unknown:
                raise ValueError(f"{path}: unknown arrays {unknown}; a device trace holds {', '.join(COLUMNS)}")
            trace = DeviceTrace(**{name: z[name] for name in z.files})
    elif path.endswith(".csv"):
        trace = _read_csv(path)
    else:
        raise ValueError(f"{path}: a device trace is a .npz or a .csv file")
    return _checked(trace, path)


def save_device_trace(path: str, trace: DeviceTrace) -> None:
    """Writes ``trace`` as ``.npz`` or long ``.csv`` (by the name's ending)."""
    trace = _checked(trace, path)
    present = {name: v for name, v in trace._asdict().items() if v is not None}
    if path.endswith(".npz"):
        np.savez(path, **present)
        return
    if not path.endswith(".csv"):
        raise ValueError(f"{path}: a device trace is written as .npz or .csv")
    rows = max(v.shape[0] for v in present.values())
    n = next(iter(present.values())).shape[1]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["row", "node", *present])
        for r in range(rows):
            for i in range(n):
                writer.writerow([r, i, *(repr(float(v[r, i])) if r < v.shape[0] else "" for v in present.values())])


def from_fedscale(path: str, num_nodes: int, batch_size: int) -> DeviceTrace:
    """A one-row :class:`DeviceTrace` of N = ``num_nodes`` devices from a FedScale-style device
    file (module docstring): a ``.csv`` with the header ``client_id,compute_speed,communication_kbps``
    (compute speed in ms per sample, communication in kbit/s), one line per client.

    Raises:
      ValueError: a missing column, non-numeric or non-positive values, fewer clients than N.
    """
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes={num_nodes!r} must be a positive int")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive int")
    if not os.path.isfile(path):
        raise ValueError(f"no FedScale device file {path!r}")
    need = ("client_id", "compute_speed", "communication_kbps")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in need if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: FedScale device columns {missing} missing; expected {','.join(need)}")
        try:
            clients = sorted(
                (int(row["client_id"]), float(row["compute_speed"]), float(row["communication_kbps"])) for row in reader
            )
        except (TypeError, ValueError):
            raise ValueError(
                f"{path}: client_id must be an int, compute_speed and communication_kbps numbers"
            ) from None
    if len(clients) < num_nodes:
        raise ValueError(f"{path}: {len(clients)} clients for {num_nodes} nodes; give at least {num_nodes}")
    chosen = np.array([c[1:] for c in clients[:num_nodes]], np.float64)
    if not np.all(np.isfinite(chosen)) or np.any(chosen <= 0):
        raise ValueError(f"{path}: compute_speed and communication_kbps must be > 0")
    bps = chosen[None, :, 1] * 1e3
    return _checked(DeviceTrace(batch_size * chosen[None, :, 0] / 1e3, bps, bps.copy()), path)
