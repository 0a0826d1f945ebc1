"""Slow reference constructions of the graph families, for bitwise comparisons with the builders.

Each family is written the plain way: the edge list of every round, merged with ``np.unique`` and
``np.add.at`` in edge order, dense ``[N, N]`` Metropolis-Hastings weights with NumPy's row sums, a
Python set for the direction test, and the slot table by a three-key ``lexsort``. Small N only.
``tables(name, ...)`` returns what a :class:`~jaxgossip.topology.Topology` must hold, bit for bit.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import networkx as nx
import numpy as np
import scipy.sparse
import scipy.sparse.csgraph


class Tables(NamedTuple):
    senders: np.ndarray  # [T, E] int32
    receivers: np.ndarray  # [T, E] int32
    weights: np.ndarray  # [T, E] float64
    directed: bool
    neighbors: np.ndarray  # [T, N, K] int32
    slot_weights: np.ndarray  # [T, N, K] float64
    symmetric: bool
    out_degree: np.ndarray  # [T, N]
    in_degree: np.ndarray  # [T, N]
    self_weights: np.ndarray  # [T, N]


def slot_table(senders, receivers, weights, n):
    period = senders.shape[0]
    lists = []
    for t in range(period):
        keep = weights[t] != 0
        s, r, w = senders[t][keep], receivers[t][keep], weights[t][keep]
        order = np.lexsort(((s.astype(np.int64) - r) % n, s != r, r))
        lists.append((s[order], r[order], w[order]))
    k = 1
    for s, r, _ in lists:
        for i in range(n):
            k = max(k, int(np.sum(r == i)) + int(not np.any((r == i) & (s == i))))
    nbr = np.tile(np.arange(n, dtype=np.int32)[None, :, None], (period, 1, k))
    slot_w = np.zeros((period, n, k), dtype=weights.dtype)
    for t, (s, r, w) in enumerate(lists):
        for i in range(n):
            mine = np.flatnonzero(r == i)
            pos = 0 if np.any(s[mine] == i) else 1
            for e in mine:
                nbr[t, i, pos], slot_w[t, i, pos] = s[e], w[e]
                pos += 1
    return nbr, slot_w


def from_edges(n, rounds, directed=None) -> Tables:
    merged = []
    for s, r, w in rounds:
        s, r, w = (np.asarray(a).ravel() for a in (s, r, w))
        code = r.astype(np.int64) * n + s
        uniq, inv = np.unique(code, return_inverse=True)
        ws = np.zeros(uniq.size)
        np.add.at(ws, inv, w.astype(np.float64))
        merged.append((uniq % n, uniq // n, ws))
    e = max(x[0].size for x in merged)
    period = len(merged)
    senders = np.zeros((period, e), dtype=np.int32)
    receivers = np.zeros((period, e), dtype=np.int32)
    weights = np.zeros((period, e))
    for t, (s, r, w) in enumerate(merged):
        senders[t, : s.size], receivers[t, : s.size], weights[t, : s.size] = s, r, w
    if directed is None:
        directed = False
        for s, r, w in merged:
            keep = w != 0
            forward = set(zip(s[keep].tolist(), r[keep].tolist()))
            if any((b, a) not in forward for a, b in forward):
                directed = True
    nbr, slot_w = slot_table(senders, receivers, weights, n)
    symmetric = True
    out_deg = np.zeros((period, n), dtype=np.int64)
    in_deg = np.zeros((period, n), dtype=np.int64)
    diag = np.zeros((period, n))
    for t in range(period):
        dense = np.zeros((n, n))
        np.add.at(dense, (receivers[t], senders[t]), weights[t])
        off = dense.copy()
        np.fill_diagonal(off, 0)
        symmetric = symmetric and np.array_equal(off != 0, (off != 0).T) and np.allclose(off, off.T, atol=1e-6)
        in_deg[t] = (off != 0).sum(axis=1)
        out_deg[t] = (off != 0).sum(axis=0)
        for s, r, w in zip(senders[t], receivers[t], weights[t]):
            if s == r:
                diag[t, r] += w
    return Tables(senders, receivers, weights, bool(directed), nbr, slot_w, bool(symmetric), out_deg, in_deg, diag)


def metropolis_weights(adj):
    a = (adj != 0).astype(np.float64)
    np.fill_diagonal(a, 0.0)
    deg = a.sum(axis=1)
    w = a / (1.0 + np.maximum(deg[:, None], deg[None, :]))
    np.fill_diagonal(w, 1.0 - w.sum(axis=1))
    return w


def from_matrix(w, directed=None) -> Tables:
    w = np.asarray(w, dtype=np.float64)
    if w.ndim == 2:
        w = w[None]
    if directed is None:
        directed = not all(np.allclose(m != 0, (m != 0).T) for m in w)
    rounds = []
    for m in w:
        r, s = np.nonzero(m)
        rounds.append((s, r, m[r, s]))
    return from_edges(w.shape[1], rounds, directed=bool(directed))


def circulant(n, offsets, weight):
    nodes = np.arange(n)
    s = np.concatenate([nodes] + [nodes for _ in offsets])
    r = np.concatenate([nodes] + [(nodes + o) % n for o in offsets])
    return s, r, np.full(s.size, weight)


def ring(n):
    return from_edges(n, [circulant(n, (1, -1), 1 / 3)], directed=False)


def directed_ring(n):
    return from_edges(n, [circulant(n, (1,), 0.5)], directed=n > 2)


def torus(rows, cols):
    n = rows * cols
    s, r = [], []
    for i in range(n):
        row, col = divmod(i, cols)
        for nbr in (
            i,
            ((row + 1) % rows) * cols + col,
            ((row - 1) % rows) * cols + col,
            row * cols + (col + 1) % cols,
            row * cols + (col - 1) % cols,
        ):
            s.append(i)
            r.append(nbr)
    return from_edges(n, [(np.array(s), np.array(r), np.full(len(s), 0.2))], directed=False)


def hypercube(n):
    k = n.bit_length() - 1
    s = [i for i in range(n) for _ in range(k + 1)]
    r = [i ^ (1 << j) if j >= 0 else i for i in range(n) for j in range(-1, k)]
    return from_edges(n, [(np.array(s), np.array(r), np.full(len(s), 1 / (k + 1)))], directed=False)


def exponential(n):
    tau = max(1, math.ceil(math.log2(n)))
    return from_edges(n, [circulant(n, [2**j for j in range(tau)], 1 / (tau + 1))])


def one_peer_exponential(n):
    tau = max(1, math.ceil(math.log2(n)))
    return from_edges(n, [circulant(n, (2**t,), 0.5) for t in range(tau)], directed=n > 2)


def complete(n):
    s, r = np.meshgrid(np.arange(n), np.arange(n))
    return from_edges(n, [(s, r, np.full(s.size, 1 / n))], directed=False)


def star(n):
    adj = np.zeros((n, n))
    adj[0, 1:] = adj[1:, 0] = 1
    return from_matrix(metropolis_weights(adj))


def dumbbell(n):
    half = n // 2
    adj = np.zeros((n, n))
    adj[:half, :half] = 1
    adj[half:, half:] = 1
    adj[0, half] = adj[half, 0] = 1
    np.fill_diagonal(adj, 0)
    return from_matrix(metropolis_weights(adj), directed=False)


def erdos_renyi(n, p, seed=0):
    rng = np.random.default_rng(seed)
    while True:
        g = nx.gnp_random_graph(n, p, seed=int(rng.integers(2**31 - 1)))
        if nx.is_connected(g):
            return from_adjacency(nx.to_numpy_array(g, nodelist=range(n), weight=None).T, "metropolis")


def random_directed(n, p, seed=0):
    rng = np.random.default_rng(seed)
    while True:
        adj = (rng.random((n, n)) < p).astype(np.float64)
        np.fill_diagonal(adj, 0)
        count, _ = scipy.sparse.csgraph.connected_components(
            scipy.sparse.csr_matrix(adj), directed=True, connection="strong"
        )
        if count == 1:
            return from_adjacency(adj, "column")


def from_adjacency(adj, weights):
    a = (np.asarray(adj, dtype=np.float64) != 0).astype(np.float64)
    np.fill_diagonal(a, 0)
    n = a.shape[0]
    directed = not np.array_equal(a != 0, (a != 0).T)
    if weights == "metropolis":
        w = metropolis_weights(a)
    elif weights == "uniform":
        w = (a + np.eye(n)) / (a.sum(axis=1, keepdims=True) + 1)
    else:
        w = (a + np.eye(n)) / (a.sum(axis=0, keepdims=True) + 1)
    return from_matrix(w, directed=directed)


def undirected_edges(n, a, b):
    """Metropolis-Hastings weights on the undirected edges {a_e, b_e}, by loops."""
    deg = np.zeros(n, dtype=np.int64)
    for x, y in zip(a, b):
        deg[x] += 1
        deg[y] += 1
    w = np.array([1.0 / (1.0 + max(deg[x], deg[y])) for x, y in zip(a, b)])
    kept = np.zeros(n)
    for x, v in zip(np.concatenate([a, b]), np.concatenate([w, w])):
        kept[x] += v
    kept = 1.0 - kept
    nodes = np.arange(n)
    return from_edges(
        n,
        [(np.concatenate([nodes, a, b]), np.concatenate([nodes, b, a]), np.concatenate([kept, w, w]))],
        directed=False,
    )


def chain(n):
    return undirected_edges(n, np.arange(n - 1), np.arange(1, n))


def binary_tree(n):
    child = np.arange(2, n) if n > 2 else np.arange(0)
    a = np.concatenate([[0], child])
    b = np.concatenate([[1], child // 2])
    return undirected_edges(n, a, b)


def equistatic(n, shifts, m, undirected):
    nodes = np.arange(n)
    far = (nodes[None, :] + shifts[:, None]) % n
    near = np.broadcast_to(nodes, far.shape)
    scale = (0.5 if undirected else 1.0) / m
    parts = []
    for transpose in (False, True) if undirected else (False,):
        senders, receivers = (near, far) if transpose else (far, near)
        parts.append(
            (
                np.concatenate([nodes, senders.ravel()]),
                np.concatenate([nodes, receivers.ravel()]),
                np.concatenate([np.full(n, scale * shifts.size / n), np.full(far.size, scale * (n - 1) / n)]),
            )
        )
    edges = tuple(np.concatenate(x) for x in zip(*parts))
    return from_edges(n, [edges], directed=False if undirected else None)


def failure_tables(topo):
    """The per-edge failure units, pair codes and slot edges of ``with_failures`` over a fixed graph,
    by sorting and searching."""
    n = topo.num_nodes
    senders, receivers, weights = topo.senders, topo.receivers, topo.weights
    real = (senders != receivers) & (weights != 0)
    pair_codes = unit = None
    if topo.is_doubly_stochastic and topo.is_symmetric:
        codes = np.minimum(senders, receivers).astype(np.int64) * n + np.maximum(senders, receivers)
        pair_codes = np.unique(codes[real])
        unit = np.where(real, np.searchsorted(pair_codes, codes), 0).astype(np.int32)
    slot_edge = None
    if topo.resolved_kernel == "slots":
        nbr, _ = topo.slots
        slot_edge = np.zeros(nbr.shape, dtype=np.int32)
        for t in range(topo.period):
            for i in range(n):
                for k in range(nbr.shape[2]):
                    hits = [
                        e
                        for e in range(senders.shape[1])
                        if weights[t, e] != 0 and receivers[t, e] == i and senders[t, e] == nbr[t, i, k]
                    ]
                    slot_edge[t, i, k] = hits[0] if hits else 0
    return pair_codes, unit, slot_edge
