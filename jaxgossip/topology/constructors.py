"""Graph constructors: the paper topologies, graphs from adjacency or mixing matrices, schedules.

Weights follow docs/topologies.md, section topologies and spectral tools: uniform weights on
regular graphs, Metropolis-Hastings weights on irregular undirected graphs, and column-stochastic
weights (each sender splits its mass over itself and its out-neighbours) for push-sum.
Every constructor checks its arguments and the connectivity of the graph (ValueError / TypeError
naming the argument).

Host-side construction is NumPy and not jittable; the result is a :class:`Topology` with NumPy
tables, closed over by jitted functions as constants.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import scipy.sparse
import scipy.sparse.csgraph

from jaxgossip.checks import check_int
from jaxgossip.topology.edges import (
    Circulant,
    SortedRows,
    XorRows,
    count_components,
    is_canonical,
    merge_round,
    transpose_check,
)
from jaxgossip.topology.graph import Topology

__all__ = [
    "ring",
    "directed_ring",
    "torus",
    "hypercube",
    "exponential",
    "one_peer_exponential",
    "complete",
    "star",
    "erdos_renyi",
    "random_directed",
    "from_adjacency",
    "from_matrix",
    "from_weights",
    "schedule",
    "WEIGHT_SCHEMES",
]

WEIGHT_SCHEMES = ("metropolis", "uniform", "column")
_TOL = 1e-6


# ---- construction helpers -----------------------------------------------------------------------


def from_edges(name: str, n: int, rounds: Iterable[Any], directed: bool | None = None) -> Topology:
    """Builds a topology from per-round (senders, receivers, weights); duplicate edges are summed.

    Each round is stored in canonical order (sorted by receiver, then sender;
    :func:`jaxgossip.topology.edges.merge_round`): rounds given in that order cost O(E), others one
    sort (given by a generator, a round's raw arrays go once it is merged). A round may also write
    itself into the ``[T, E]`` tables (``num_edges(n)`` and ``write(n, rows)``, e.g.
    :class:`jaxgossip.topology.edges.Circulant`): then it takes no arrays of its own.
    ``directed=None`` derives it from the pattern: directed iff some round has an edge j -> i
    without i -> j (O(E), :func:`jaxgossip.topology.edges.transpose_check`).
    """
    # Canonical rounds stay as given (their weights are added to 0.0 in the tables below), others
    # are merged first; then the sizes are known.
    rounds = [_flat_round(edges, n) for edges in rounds]
    period, e = len(rounds), max(_round_size(edges, n) for edges in rounds)
    senders = np.zeros((period, e), dtype=np.int32)
    receivers = np.zeros((period, e), dtype=np.int32)
    weights = np.zeros((period, e))
    symmetric, widest = True, 0
    for t, edges in enumerate(rounds):
        if _writes(edges):
            s, r, w = edges.write(n, (senders[t], receivers[t], weights[t]))
            if not is_canonical(s, r):
                s, r, w = merge_round(s, r, w, n)  # new arrays, so the rows may take them
                senders[t], receivers[t], weights[t] = 0, 0, 0.0
                senders[t, : s.size], receivers[t, : s.size] = s, r
        else:
            s, r, w = edges
            senders[t, : s.size], receivers[t, : s.size] = s, r
        # merge_round's canonical form, written in place: + 0.0 makes a -0.0 weight read 0.0.
        np.add(w, 0.0, out=weights[t, : s.size])
        if directed is None and symmetric:
            symmetric = transpose_check(senders[t, : s.size], receivers[t, : s.size], weights[t, : s.size], n).pattern
        widest = max(widest, s.size)
    if widest < e:
        # A round that wrote itself merged repeated edges: the tables are as wide as the widest round.
        senders, receivers, weights = (table[:, :widest].copy() for table in (senders, receivers, weights))
    if directed is None:
        directed = not symmetric
    del rounds, s, r, w  # the tables hold the edges now: the round arrays go before the layout is built
    return Topology(name, n, senders, receivers, weights, bool(directed))


def _writes(edges) -> bool:
    """Whether a round writes itself into from_edges' table rows: ``edges.write(n, (senders,
    receivers, weights))`` fills their first ``edges.num_edges(n)`` entries and returns those views
    (canonical, or merged by from_edges, which then trims the tables to the widest round)."""
    return callable(getattr(edges, "write", None)) and callable(getattr(edges, "num_edges", None))


def _flat_round(edges, n: int):
    """A round as flat canonical arrays (merged when it is not canonical); a round that writes
    itself (a Circulant) as it is."""
    if _writes(edges):
        return edges
    s, r, w = (np.asarray(a).ravel() for a in edges)
    return (s, r, w) if is_canonical(s, r) else merge_round(s, r, w, n)


def _round_size(edges, n: int) -> int:
    return edges.num_edges(n) if _writes(edges) else edges[0].size


def _circulant(n: int, offsets: Sequence[int], weight: float) -> Circulant:
    """One round where every node i sends to i + o (mod n) for o in offsets, plus a self-loop."""
    return Circulant([0] + [-o for o in offsets], weight)


def _check_probability(p: Any, what: str) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise ValueError(f"p={p!r} must be an {what} probability in (0, 1], a real number")
    p = float(p)
    if not 0 < p <= 1:  # also rejects NaN
        raise ValueError(f"p={p!r} must be an {what} probability in (0, 1]")
    return p


def _check_connected(adj: np.ndarray, directed: bool, what: str = "graph") -> None:
    """adj [N, N] with adj[i, j] != 0 for an edge j -> i."""
    receivers, senders = np.nonzero(adj)
    _check_edges_connected(senders, receivers, adj.shape[0], directed, what)


def _check_edges_connected(senders, receivers, n: int, directed: bool, what: str = "graph") -> None:
    """The connectivity check on an edge list (O(E), scipy.sparse.csgraph)."""
    count = count_components(senders, receivers, n, strong=directed)
    if count > 1:
        kind = "strongly connected" if directed else "connected"
        raise ValueError(
            f"the {what} is not {kind}: it has {count} {'strongly ' if directed else ''}connected "
            "components, so gossip can never reach consensus"
        )


# ---- constructors -------------------------------------------------------------------------------


def ring(n: int) -> Topology:
    """Undirected ring: i talks to i-1 and i+1 (mod n), uniform weights 1/3.

    Args:
      n: number of nodes N >= 3.
    """
    n = check_int("n", n, 3)
    return from_edges(f"ring({n})", n, [_circulant(n, (1, -1), 1 / 3)], directed=False)


def directed_ring(n: int) -> Topology:
    """Directed ring: i sends to i+1 (mod n); weights 1/2 self, 1/2 to the successor.

    Both row and column stochastic, so it serves gossip and push-sum alike.

    Args:
      n: number of nodes N >= 2.
    """
    n = check_int("n", n, 2)
    return from_edges(f"directed_ring({n})", n, [_circulant(n, (1,), 0.5)], directed=n > 2)


def torus(rows: int, cols: int, num_nodes: int | None = None) -> Topology:
    """2-D torus (rows x cols grid with wrap-around): 4 neighbours + self, uniform weights 1/5.

    With a side of 2 the two neighbours along it coincide and their weights add up (2/5).

    Args:
      rows, cols: grid sides, each >= 2.
      num_nodes: optional N to check against ``rows * cols``.
    """
    rows, cols = check_int("rows", rows, 2), check_int("cols", cols, 2)
    n = rows * cols
    if num_nodes is not None and num_nodes != n:
        raise ValueError(f"torus rows*cols = {rows}*{cols} = {n} does not match num_nodes={num_nodes}")
    # In the tables' int32 (int64 beyond it), written column by column: no [N, 5] int64 stack.
    index = np.int32 if 2 * n < 2**31 else np.int64
    nodes = np.arange(n, dtype=index)
    row, col = np.divmod(nodes, index(cols))
    table = np.empty((n, 5), dtype=index)
    table[:, 0] = nodes
    base = row * index(cols)
    table[:, 1] = np.where(row == rows - 1, col, nodes + index(cols))  # (row + 1) mod rows
    table[:, 2] = np.where(row == 0, (rows - 1) * cols + col, nodes - index(cols))  # (row - 1) mod rows
    table[:, 3] = np.where(col == cols - 1, base, nodes + index(1))  # (col + 1) mod cols
    table[:, 4] = np.where(col == 0, base + index(cols - 1), nodes - index(1))  # (col - 1) mod cols
    # Receiver i takes 1/5 from itself and each neighbour (the graph is symmetric).
    return from_edges(f"torus({rows}x{cols})", n, [SortedRows(table, 0.2)], directed=False)


def hypercube(n: int) -> Topology:
    """Hypercube on n = 2^k nodes: i talks to i XOR 2^j, j < k; uniform weights 1/(k+1).

    Args:
      n: number of nodes N, a power of two >= 2.
    """
    n = check_int("n", n, 2)
    if n & (n - 1):
        raise ValueError(f"hypercube needs n to be a power of two, got n={n}")
    k = n.bit_length() - 1
    # Row i is i XOR {0, 2^j}, written into the tables a block of rows at a time.
    masks = np.concatenate([[0], 1 << np.arange(k)])
    return from_edges(f"hypercube({n})", n, [XorRows(masks, 1 / (k + 1))], directed=False)


def _log2_ceil(n: int) -> int:
    return max(1, math.ceil(math.log2(n)))


def exponential(n: int) -> Topology:
    """Static exponential graph: i sends to i + 2^j (mod n), j < ceil(log2 n); uniform weights.

    Each node keeps ``1/(tau+1)`` and receives ``1/(tau+1)`` from each of its tau in-neighbours,
    ``tau = ceil(log2 n)``. The graph is directed but circulant, hence doubly stochastic.

    Args:
      n: number of nodes N >= 2.

    References:
      Assran et al., "Stochastic Gradient Push for Distributed Deep Learning", ICML 2019.
      Ying et al., "Exponential Graph is Provably Efficient for Decentralized Deep Training",
      NeurIPS 2021 (arXiv:2110.13363).
    """
    n = check_int("n", n, 2)
    tau = _log2_ceil(n)
    offsets = [2**j for j in range(tau)]
    rounds = [_circulant(n, offsets, 1 / (tau + 1))]
    return from_edges(f"exponential({n})", n, rounds)


def one_peer_exponential(n: int) -> Topology:
    """Time-varying one-peer exponential graph: at round t, i sends to i + 2^(t mod tau), 1/2 each.

    Period ``T = tau = ceil(log2 n)``. Every round is a circulant permutation plus identity, so
    each W(t) is doubly stochastic (gossip) and column stochastic (push-sum). For n = 2^k the
    product of tau consecutive rounds is exactly ``J = 11^T / n`` (exact averaging).

    Args:
      n: number of nodes N >= 2.

    References:
      Assran et al., ICML 2019 (SGP graph type 5 with one peer);
      Ying et al., NeurIPS 2021 (arXiv:2110.13363), exact averaging after log2(n) rounds.
    """
    n = check_int("n", n, 2)
    tau = _log2_ceil(n)
    rounds = [_circulant(n, (2**t,), 0.5) for t in range(tau)]
    return from_edges(f"one_peer_exponential({n})", n, rounds, directed=n > 2)


def complete(n: int) -> Topology:
    """Complete graph with weights 1/n: one round of mixing is exact averaging.

    Args:
      n: number of nodes N >= 2.
    """
    n = check_int("n", n, 2)
    nodes = np.arange(n)
    s, r = np.meshgrid(nodes, nodes)
    return from_edges(f"complete({n})", n, [(s, r, np.full(s.size, 1 / n))], directed=False)


def metropolis_weights(adj: np.ndarray) -> np.ndarray:
    """W_ij = 1/(1 + max(d_i, d_j)) on edges, W_ii = 1 - sum_j W_ij (symmetric adj)."""
    a = (adj != 0).astype(np.float64)
    np.fill_diagonal(a, 0.0)
    deg = a.sum(axis=1)
    w = a / (1.0 + np.maximum(deg[:, None], deg[None, :]))
    np.fill_diagonal(w, 1.0 - w.sum(axis=1))
    return w


def star(n: int) -> Topology:
    """Star: node 0 is the hub linked to every other node; Metropolis-Hastings weights.

    Args:
      n: number of nodes N >= 3.
    """
    n = check_int("n", n, 3)
    link = 1.0 / (1.0 + float(n - 1))  # 1 / (1 + max(d_hub, d_leaf)), as metropolis_weights forms it
    # The hub's row as metropolis_weights sums it (NumPy's pairwise sum of the row, zero on the
    # diagonal), so that its self weight is bitwise the dense construction's; O(N), not O(N^2).
    hub_row = np.full(n, link)
    hub_row[0] = 0.0
    leaves = np.arange(1, n)
    senders = np.concatenate([np.arange(n), np.stack([np.zeros(n - 1, dtype=np.int64), leaves], axis=1).ravel()])
    receivers = np.concatenate([np.zeros(n, dtype=np.int64), np.repeat(leaves, 2)])
    weights = np.concatenate([[1.0 - hub_row.sum()], np.full(n - 1, link), np.tile([link, 1.0 - link], n - 1)])
    return from_edges(f"star({n})", n, [(senders, receivers, weights)], directed=False)


def erdos_renyi(n: int, p: float, seed: int = 0, max_tries: int = 1000) -> Topology:
    """Erdos-Renyi G(n, p), resampled until connected; Metropolis-Hastings weights.

    Args:
      n: number of nodes N >= 2.
      p: edge probability in (0, 1].
      seed: seed of the sampler (the same seed gives the same graph).
      max_tries: samples drawn before giving up on connectivity.
    """
    n = check_int("n", n, 2)
    p = _check_probability(p, "edge")
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        a, b = _gnp_pairs(n, p, int(rng.integers(2**31 - 1)))
        if count_components(a, b, n, strong=False) == 1:
            adj = np.zeros((n, n))
            adj[a, b] = adj[b, a] = 1.0
            return from_adjacency(adj, weights="metropolis", name=f"erdos_renyi({n}, p={p}, seed={seed})")
    raise ValueError(
        f"erdos_renyi(n={n}, p={p}) drew no connected graph in {max_tries} tries; increase p "
        f"(connectivity needs p > ln(n)/n = {math.log(n) / n:.3f} roughly)"
    )


def _gnp_pairs(n: int, p: float, seed: int, chunk: int = 1 << 22) -> tuple[np.ndarray, np.ndarray]:
    """The edges ``(a, b)``, ``a < b``, of ``networkx.gnp_random_graph(n, p, seed=seed)``, drawn in
    array operations: networkx keeps pair (a, b) of ``itertools.combinations(range(n), 2)`` when its
    ``random.Random(seed).random()`` is below p; ``numpy.random.RandomState([seed])`` seeds the same
    Mersenne Twister the same way (init_by_array) and ``random_sample`` forms doubles the same way
    (53 bits from two 32-bit outputs), so the draws are the same numbers (tested against networkx).
    Drawn ``chunk`` at a time: O(N^2) draws, memory O(E + chunk)."""
    state = np.random.RandomState([seed])
    lengths = n - 1 - np.arange(n - 1)  # row a holds the pairs (a, a + 1), ..., (a, n - 1)
    ends = np.cumsum(lengths)
    firsts, seconds = [], []
    row = 0
    while row < n - 1:
        done = int(ends[row - 1]) if row else 0
        stop = max(row + 1, int(np.searchsorted(ends, done + chunk, side="right")))
        stop = min(stop, n - 1)
        starts = np.concatenate([[done], ends[row : stop - 1]]) - done
        hit = np.flatnonzero(state.random_sample(int(ends[stop - 1]) - done) < p)
        local = np.searchsorted(starts, hit, side="right") - 1
        firsts.append(row + local)
        seconds.append(row + local + 1 + hit - starts[local])
        row = stop
    return np.concatenate(firsts), np.concatenate(seconds)


def random_directed(n: int, p: float, seed: int = 0, max_tries: int = 1000) -> Topology:
    """Random directed graph (each arc j -> i with probability p), resampled until strongly
    connected, with column-stochastic weights (each sender splits its mass uniformly over itself
    and its out-neighbours). For push-sum methods.

    Args:
      n: number of nodes N >= 2.
      p: arc probability in (0, 1].
      seed: seed of the sampler.
    """
    n = check_int("n", n, 2)
    p = _check_probability(p, "arc")
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        adj = (rng.random((n, n)) < p).astype(np.float64)
        np.fill_diagonal(adj, 0)
        graph = scipy.sparse.csr_matrix(adj)
        count, _ = scipy.sparse.csgraph.connected_components(graph, directed=True, connection="strong")
        if count == 1:
            return from_adjacency(adj, weights="column", name=f"random_directed({n}, p={p}, seed={seed})")
    raise ValueError(f"random_directed(n={n}, p={p}) drew no strongly connected graph in {max_tries} tries")


def _adjacency_array(adj: Any) -> tuple[np.ndarray, bool]:
    """Returns (A [N, N] with A[i, j] != 0 for an edge j -> i, directed)."""
    try:
        import networkx as nx
    except ImportError:  # pragma: no cover - networkx is a dependency
        nx = None
    if nx is not None and isinstance(adj, nx.Graph):
        nodes = sorted(adj.nodes())
        if nodes != list(range(len(nodes))):
            raise ValueError("a networkx graph must have nodes labelled 0..N-1")
        # networkx: A[u, v] = 1 for an edge u -> v; ours is receiver-major, hence the transpose.
        a = nx.to_numpy_array(adj, nodelist=nodes, weight=None).T
        return a, adj.is_directed()
    a = np.asarray(adj)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"adjacency must be a square [N, N] array, got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.number) and a.dtype != bool:
        raise TypeError(f"adjacency must be numeric, got dtype {a.dtype}")
    a = a.astype(np.float64)
    if not np.all(np.isfinite(a)):
        raise ValueError("adjacency contains NaN or inf entries")
    if np.any(a < 0):
        raise ValueError("adjacency has negative entries; use 0/1 (or non-negative) entries")
    pattern = a != 0
    np.fill_diagonal(pattern, False)
    return a, not np.array_equal(pattern, pattern.T)


def from_adjacency(adj: Any, weights: str = "metropolis", name: str | None = None) -> Topology:
    """Topology from an adjacency structure and a weight scheme.

    Args:
      adj: numpy [N, N] with ``adj[i, j] != 0`` iff i receives from j (self-loops ignored), or a
        networkx ``Graph``/``DiGraph`` with nodes 0..N-1 (a DiGraph edge u -> v: v receives from u).
      weights: ``"metropolis"`` (undirected graphs: ``W_ij = 1/(1 + max(d_i, d_j))``, doubly
        stochastic), ``"uniform"`` (``W_ij = 1/(d_i + 1)`` over in-neighbours and self; doubly
        stochastic only on regular graphs, an error otherwise) or ``"column"`` (``W_ij =
        1/(d_out_j + 1)`` over out-neighbours and self: column stochastic, for push-sum).
      name: optional display name.
    """
    if weights not in WEIGHT_SCHEMES:
        raise ValueError(f"weights={weights!r} is unknown; known weight schemes: {WEIGHT_SCHEMES}")
    a, directed = _adjacency_array(adj)
    n = a.shape[0]
    if n < 2:
        raise ValueError(f"adjacency has N={n} nodes; gossip needs at least 2")
    a = (a != 0).astype(np.float64)
    np.fill_diagonal(a, 0)
    _check_connected(a, directed, "graph given to from_adjacency")
    if weights == "metropolis":
        if directed:
            raise ValueError(
                "weights='metropolis' needs an undirected (symmetric) adjacency; for a directed "
                "graph use weights='column' (push-sum)"
            )
        w = metropolis_weights(a)
    elif weights == "uniform":
        w = (a + np.eye(n)) / (a.sum(axis=1, keepdims=True) + 1)
        if not np.allclose(w.sum(axis=0), 1.0, atol=_TOL):
            raise ValueError(
                "weights='uniform' is not doubly stochastic on this irregular graph (in-degrees "
                f"range {int(a.sum(1).min())}..{int(a.sum(1).max())}); use 'metropolis' for an "
                "undirected graph or 'column' for push-sum"
            )
    else:
        w = (a + np.eye(n)) / (a.sum(axis=0, keepdims=True) + 1)
    label = name or f"from_adjacency(N={n}, {weights})"
    return from_matrix(w, name=label, directed=directed)


def from_matrix(w: Any, name: str | None = None, directed: bool | None = None) -> Topology:
    """Topology from explicit mixing matrices.

    Args:
      w: [N, N] or [T, N, N] array, ``w[t, i, j]`` = weight receiver i puts on j. Entries must be
        finite and non-negative; every row sum or every column sum must be 1 (checked again, in
        the required direction, by the algorithm that uses it). The union graph over the period
        must be strongly connected.
      name: optional display name.
      directed: override the directedness inferred from symmetry.
    """
    w = np.asarray(w, dtype=np.float64)
    if w.ndim == 2:
        w = w[None]
    if w.ndim != 3 or w.shape[1] != w.shape[2]:
        raise ValueError(f"mixing matrix must be [N, N] or [T, N, N], got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError("mixing matrix contains NaN or inf entries")
    if np.any(w < 0):
        bad = np.argwhere(w < 0)[0]
        raise ValueError(
            f"mixing matrix has negative weights (e.g. W[{bad[0]}][{bad[1]}, {bad[2]}] = {w[tuple(bad)]:.3g})"
        )
    period, n, _ = w.shape
    if n < 2:
        raise ValueError(f"mixing matrix has N={n} nodes; gossip needs at least 2")
    rows_ok = np.allclose(w.sum(axis=2), 1.0, atol=_TOL)
    cols_ok = np.allclose(w.sum(axis=1), 1.0, atol=_TOL)
    if not (rows_ok or cols_ok):
        raise ValueError(
            "mixing matrix is neither row nor column stochastic: row sums span "
            f"[{w.sum(2).min():.4g}, {w.sum(2).max():.4g}], column sums span "
            f"[{w.sum(1).min():.4g}, {w.sum(1).max():.4g}]"
        )
    union = (w != 0).any(axis=0).astype(np.float64)
    np.fill_diagonal(union, 0)
    if directed is None:
        directed = not all(np.allclose(m != 0, (m != 0).T) for m in w)
    _check_connected(union, True, "union graph of the mixing matrices")
    rounds = []
    for m in w:
        r, s = np.nonzero(m)
        rounds.append((s, r, m[r, s]))
    return from_edges(name or f"from_matrix(N={n}, T={period})", n, rounds, directed=bool(directed))


def from_weights(senders: Any, receivers: Any, weights: Any, num_nodes: int, name: str | None = None) -> Topology:
    """Topology from explicit edge lists with weights, checked (e.g. weights read from a file).

    ``W(t)[receivers[t, e], senders[t, e]] += weights[t, e]``; duplicate edges are summed and
    weight-0 edges are padding. Negative weights are accepted only in a symmetric doubly
    stochastic W (a linear averaging iteration such as
    :func:`jaxgossip.design.fastest_mixing` with ``nonnegative=False`` designs); every other W
    must be non-negative.

    Args:
      senders, receivers: [E] or [T, E] integers in ``[0, num_nodes)``.
      weights: [E] or [T, E] finite floats.
      num_nodes: N >= 2.
      name: optional display name.

    Raises:
      ValueError: naming the problem: shapes that differ or are not [E] / [T, E], non-integer or
        out-of-range node indices, NaN or inf weights, a W(t) neither row nor column stochastic,
        negative weights in a W that is not symmetric doubly stochastic, a union graph that is
        not strongly connected.
    """
    n = check_int("num_nodes", num_nodes, 2)
    arrays = {"senders": np.asarray(senders), "receivers": np.asarray(receivers), "weights": np.asarray(weights)}
    shapes = {key: a.shape for key, a in arrays.items()}
    if len(set(shapes.values())) != 1 or arrays["weights"].ndim not in (1, 2):
        raise ValueError(f"senders, receivers and weights must share one [E] or [T, E] shape; got {shapes}")
    for key in ("senders", "receivers"):
        a = arrays[key]
        if not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{key} must hold integer node indices, got dtype {a.dtype}")
        if a.size and (a.min() < 0 or a.max() >= n):
            raise ValueError(f"{key} must lie in [0, {n}) for num_nodes={n}; got values in [{a.min()}, {a.max()}]")
    if not np.issubdtype(arrays["weights"].dtype, np.number):
        raise ValueError(f"weights must be numbers, got dtype {arrays['weights'].dtype}")
    s, r, w = (a.reshape((-1, a.shape[-1])) for a in arrays.values())
    w = w.astype(np.float64)
    if not np.all(np.isfinite(w)):
        raise ValueError("weights contain NaN or inf entries")
    matrices = np.zeros((w.shape[0], n, n))
    for t in range(w.shape[0]):
        np.add.at(matrices[t], (r[t], s[t]), w[t])
    rows, cols = matrices.sum(axis=2), matrices.sum(axis=1)
    rows_ok, cols_ok = np.allclose(rows, 1.0, atol=_TOL), np.allclose(cols, 1.0, atol=_TOL)
    if not (rows_ok or cols_ok):
        raise ValueError(
            "the weights are not stochastic: every W(t) needs rows or columns summing to 1; row sums span "
            f"[{rows.min():.4g}, {rows.max():.4g}], column sums span [{cols.min():.4g}, {cols.max():.4g}]"
        )
    if np.any(matrices < 0):
        symmetric = all(np.allclose(m, m.T, atol=_TOL) for m in matrices)
        if not (rows_ok and cols_ok and symmetric):
            t, i, j = np.argwhere(matrices < 0)[0]
            raise ValueError(
                f"negative weight W[{t}][{i}, {j}] = {matrices[t, i, j]:.3g}: negative weights need a symmetric "
                "doubly stochastic W (a linear averaging iteration); this one is "
                f"{'not symmetric' if not symmetric else 'not doubly stochastic'}"
            )
    union = (matrices != 0).any(axis=0).astype(np.float64)
    np.fill_diagonal(union, 0)
    _check_connected(union, True, "union graph of the weights")
    directed = not all(np.array_equal(m != 0, (m != 0).T) for m in matrices)
    rounds = [(s[t], r[t], w[t]) for t in range(w.shape[0])]
    return from_edges(name or f"from_weights(N={n}, T={w.shape[0]})", n, rounds, directed=directed)


def schedule(topologies: Sequence[Topology], name: str | None = None) -> Topology:
    """Concatenates topologies on the same N into one time-varying topology (round t uses
    ``topologies[t mod len]``, each of them expanded over its own period)."""
    if not topologies:
        raise ValueError("schedule needs at least one topology")
    n = topologies[0].num_nodes
    rounds = []
    for topo in topologies:
        if topo.num_nodes != n:
            raise ValueError(f"schedule mixes node counts: {topo.name} has N={topo.num_nodes}, expected {n}")
        for t in range(topo.period):
            rounds.append((topo.senders[t], topo.receivers[t], topo.weights[t]))
    directed = any(t.directed for t in topologies)
    label = name or "schedule(" + ", ".join(t.name for t in topologies) + ")"
    topo = from_edges(label, n, rounds, directed)
    live = topo.weights != 0
    _check_edges_connected(topo.senders[live], topo.receivers[live], n, True, "union graph of the schedule")
    return topo
