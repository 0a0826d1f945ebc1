"""Topologies in files: ``--topology=file:PATH.npz`` in every command that takes a graph spec, and
the ``topology.npz`` that ``jaxgossip design`` writes.

The format is a NumPy ``.npz`` archive with one of two forms:

* edge lists: ``senders``, ``receivers`` (integers in ``[0, N)``) and ``weights`` (floats), each
  ``[E]`` for a static graph or ``[T, E]`` for a T-periodic schedule, with ``W(t)[receivers[t, e],
  senders[t, e]] = weights[t, e]`` (duplicates summed, weight-0 entries padding), and optionally
  ``num_nodes`` (a scalar; default: the command's ``--num_nodes``);
* a dense ``matrix``: ``[N, N]`` or ``[T, N, N]``, ``matrix[t, i, j]`` the weight receiver i puts
  on j.

Either form is checked by :func:`jaxgossip.topology.from_weights`: finite weights, every W(t) row
or column stochastic, non-negative unless W is symmetric doubly stochastic, a connected union
graph. A file of N nodes serves only ``--num_nodes=N``.
"""

from __future__ import annotations

import os
import zipfile

import numpy as np

from jaxgossip.topology import Topology, from_weights

__all__ = ["FILE_PREFIX", "is_file_spec", "load_topology", "save_topology"]

FILE_PREFIX = "file:"
_EDGE_KEYS = ("senders", "receivers", "weights")


def is_file_spec(spec: object) -> bool:
    """Whether a topology spec names a file (``file:PATH``)."""
    return isinstance(spec, str) and spec.startswith(FILE_PREFIX)


def save_topology(topology: Topology, path: str) -> None:
    """Writes a fixed graph's edge lists ``[T, E]`` and ``num_nodes`` to ``path`` (``.npz``)."""
    if topology.stochastic or not topology.host_tables or topology.num_graphs is not None:
        raise ValueError(f"save_topology needs one fixed graph built on the host; got {topology.name}")
    with open(path, "wb") as f:
        np.savez(
            f,
            senders=np.asarray(topology.senders),
            receivers=np.asarray(topology.receivers),
            weights=np.asarray(topology.weights, dtype=np.float64),
            num_nodes=np.asarray(topology.num_nodes),
        )


def load_topology(path: str, num_nodes: int | None = None) -> Topology:
    """Reads the graph of a ``.npz`` file in the module's format.

    Args:
      path: the file.
      num_nodes: the node count the caller runs with; a file of another N is refused.

    Raises:
      ValueError: naming the file and the problem (missing, unreadable, neither or both forms, a
        wrong shape, another node count, or what :func:`jaxgossip.topology.from_weights` refuses).
    """
    if not os.path.isfile(path):
        raise ValueError(f"topology file {path!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise ValueError(f"topology file {path!r} is not a readable .npz archive: {err}") from None
    name = f"file:{os.path.basename(path)}"
    has_edges, has_matrix = all(k in arrays for k in _EDGE_KEYS), "matrix" in arrays
    if has_edges == has_matrix:
        raise ValueError(
            f"topology file {path!r} must hold either 'senders', 'receivers' and 'weights' or a 'matrix'; "
            f"it holds {sorted(arrays)}"
        )
    try:
        if has_matrix:
            matrix = arrays["matrix"]
            if matrix.ndim not in (2, 3) or matrix.shape[-1] != matrix.shape[-2]:
                raise ValueError(f"'matrix' must be [N, N] or [T, N, N], got shape {matrix.shape}")
            n = _node_count(matrix.shape[-1], num_nodes)
            matrix = matrix.reshape((-1, n, n))
            t, r, s = np.nonzero(matrix)
            rounds = [(s[t == k], r[t == k], matrix[k][r[t == k], s[t == k]]) for k in range(matrix.shape[0])]
            width = max(1, max(len(x[0]) for x in rounds))
            senders, receivers, weights = (np.zeros((len(rounds), width), d) for d in (np.int64, np.int64, np.float64))
            for k, (sk, rk, wk) in enumerate(rounds):
                senders[k, : len(sk)], receivers[k, : len(sk)], weights[k, : len(sk)] = sk, rk, wk
            return from_weights(senders, receivers, weights, n, name=name)
        stored = arrays.get("num_nodes")
        if stored is not None:
            if stored.shape != () or not np.issubdtype(stored.dtype, np.integer):
                raise ValueError(f"'num_nodes' must be an integer scalar, got {stored!r}")
            n = _node_count(int(stored), num_nodes)
        elif num_nodes is not None:
            n = num_nodes
        else:
            n = int(max(arrays["senders"].max(initial=0), arrays["receivers"].max(initial=0))) + 1
        return from_weights(*(arrays[k] for k in _EDGE_KEYS), n, name=name)
    except ValueError as err:
        raise ValueError(f"topology file {path!r}: {err}") from None


def _node_count(in_file: int, expected: int | None) -> int:
    if expected is not None and in_file != expected:
        raise ValueError(f"it holds a graph of {in_file} nodes, but num_nodes={expected}")
    return in_file
