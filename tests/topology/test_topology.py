"""Tests for jaxgossip.topology: every constructor against a NumPy construction written here from
the definitions of docs/topologies.md (section topologies and spectral tools), derived tables,
spectral numbers (same section) and every validation error."""

import dataclasses
import math

import networkx as nx
import numpy as np
import pytest

from jaxgossip import topology as T
from jaxgossip.algorithms import oriented_pairs

SIZES = (3, 5, 6, 8, 12, 16)


# ---------------------------------------------------------------- NumPy references (docs/topologies.md, topologies)


def ref_ring(n):
    w = np.zeros((n, n))
    for i in range(n):
        for j in (i - 1, i, i + 1):
            w[i, j % n] = 1 / 3
    return w


def ref_directed_ring(n):
    w = np.zeros((n, n))
    for i in range(n):
        w[i, i] += 0.5
        w[(i + 1) % n, i] += 0.5  # i sends to i + 1
    return w


def ref_torus(rows, cols):
    n = rows * cols
    w = np.zeros((n, n))
    for r in range(rows):
        for c in range(cols):
            i = r * cols + c
            w[i, i] += 0.2
            for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                w[i, ((r + dr) % rows) * cols + (c + dc) % cols] += 0.2
    return w


def ref_hypercube(n):
    k = int(round(math.log2(n)))
    w = np.eye(n) / (k + 1)
    for i in range(n):
        for j in range(k):
            w[i, i ^ (1 << j)] = 1 / (k + 1)
    return w


def _tau(n):
    return max(1, math.ceil(math.log2(n)))


def ref_exponential(n):
    tau = _tau(n)
    w = np.eye(n) / (tau + 1)
    for i in range(n):
        for j in range(tau):
            w[(i + 2**j) % n, i] += 1 / (tau + 1)  # i sends to i + 2^j
    return w


def ref_one_peer(n, t):
    tau = _tau(n)
    w = np.eye(n) / 2
    for i in range(n):
        w[(i + 2 ** (t % tau)) % n, i] += 0.5
    return w


def ref_metropolis(adj):
    a = (np.asarray(adj) != 0).astype(float)
    np.fill_diagonal(a, 0)
    n = a.shape[0]
    deg = a.sum(1)
    w = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if a[i, j]:
                w[i, j] = 1 / (1 + max(deg[i], deg[j]))
        w[i, i] = 1 - w[i].sum()
    return w


def ref_column(adj):
    """adj[i, j] != 0 iff j -> i; each sender j splits 1/(out_deg_j + 1) over itself and targets."""
    a = (np.asarray(adj) != 0).astype(float)
    np.fill_diagonal(a, 0)
    n = a.shape[0]
    w = np.zeros((n, n))
    for j in range(n):
        out = a[:, j].sum()
        w[j, j] = 1 / (out + 1)
        for i in range(n):
            if a[i, j]:
                w[i, j] = 1 / (out + 1)
    return w


def ref_uniform(adj):
    a = (np.asarray(adj) != 0).astype(float)
    np.fill_diagonal(a, 0)
    n = a.shape[0]
    w = np.zeros((n, n))
    for i in range(n):
        din = a[i].sum()
        w[i, i] = 1 / (din + 1)
        for j in range(n):
            if a[i, j]:
                w[i, j] = 1 / (din + 1)
    return w


def random_undirected_connected(n, p, seed):
    rng = np.random.default_rng(seed)
    while True:
        a = np.triu((rng.random((n, n)) < p).astype(float), 1)
        a = a + a.T
        if nx.is_connected(nx.from_numpy_array(a)):
            return a


def random_doubly_stochastic(n, seed, num_perms=4):
    """Convex combination of the identity and random permutations (Birkhoff): doubly stochastic."""
    rng = np.random.default_rng(seed)
    coef = rng.dirichlet(np.ones(num_perms + 1))
    w = coef[0] * np.eye(n)
    for c in coef[1:]:
        w += c * np.eye(n)[rng.permutation(n)]
    # make sure it is strongly connected: add a small cycle
    cyc = np.roll(np.eye(n), 1, axis=0)
    return 0.9 * w + 0.1 * cyc


# ---------------------------------------------------------------- constructors vs references


def _check_stochastic(topo, rows=True, cols=True):
    for t in range(topo.period):
        m = topo.matrix(t)
        assert np.all(m >= 0)
        if rows:
            np.testing.assert_allclose(m.sum(1), 1.0, atol=1e-12)
        if cols:
            np.testing.assert_allclose(m.sum(0), 1.0, atol=1e-12)
    assert topo.is_column_stochastic == cols or not cols
    if rows and cols:
        assert topo.is_doubly_stochastic


@pytest.mark.parametrize("n", SIZES)
def test_ring(n):
    topo = T.ring(n)
    np.testing.assert_allclose(topo.matrix(0), ref_ring(n), atol=1e-12)
    assert (topo.num_nodes, topo.period, topo.directed) == (n, 1, False)
    _check_stochastic(topo)
    np.testing.assert_allclose(topo.matrix(5), topo.matrix(0))  # static: t mod 1


@pytest.mark.parametrize("n", (2, 3, 5, 8))
def test_directed_ring(n):
    topo = T.directed_ring(n)
    np.testing.assert_allclose(topo.matrix(0), ref_directed_ring(n), atol=1e-12)
    assert topo.period == 1
    assert topo.directed == (n > 2)  # for n = 2, i + 1 = i - 1: the edge is reciprocated
    _check_stochastic(topo)


@pytest.mark.parametrize("rows,cols", [(2, 2), (2, 4), (3, 3), (3, 5), (4, 4)])
def test_torus(rows, cols):
    topo = T.torus(rows, cols)
    np.testing.assert_allclose(topo.matrix(0), ref_torus(rows, cols), atol=1e-12)
    assert (topo.num_nodes, topo.period, topo.directed) == (rows * cols, 1, False)
    _check_stochastic(topo)
    assert T.torus(rows, cols, num_nodes=rows * cols).num_nodes == rows * cols


@pytest.mark.parametrize("n", (2, 4, 8, 16))
def test_hypercube(n):
    topo = T.hypercube(n)
    np.testing.assert_allclose(topo.matrix(0), ref_hypercube(n), atol=1e-12)
    assert (topo.period, topo.directed) == (1, False)
    _check_stochastic(topo)


@pytest.mark.parametrize("n", (2, 3, 5, 6, 8, 12, 16))
def test_exponential(n):
    topo = T.exponential(n)
    np.testing.assert_allclose(topo.matrix(0), ref_exponential(n), atol=1e-12)
    assert topo.period == 1
    if n != 3:  # see test_exponential_3_is_undirected
        assert topo.directed == (not np.allclose(ref_exponential(n), ref_exponential(n).T))
    _check_stochastic(topo)


def test_exponential_3_is_undirected():
    assert not T.exponential(3).directed


@pytest.mark.parametrize("n", (2, 3, 5, 6, 8, 12, 16))
def test_one_peer_exponential(n):
    topo = T.one_peer_exponential(n)
    tau = _tau(n)
    assert topo.period == tau
    for t in range(2 * tau):  # the whole period, then wrap-around
        np.testing.assert_allclose(topo.matrix(t), ref_one_peer(n, t), atol=1e-12)
    assert topo.directed == (n > 2)
    _check_stochastic(topo)
    # one peer: every node sends to exactly one other node each round
    np.testing.assert_array_equal(topo.out_degree, np.ones((tau, n)))
    np.testing.assert_array_equal(topo.in_degree, np.ones((tau, n)))


@pytest.mark.parametrize("n", (2, 3, 7, 8))
def test_complete(n):
    topo = T.complete(n)
    np.testing.assert_allclose(topo.matrix(0), np.full((n, n), 1 / n), atol=1e-12)
    assert (topo.period, topo.directed) == (1, False)
    _check_stochastic(topo)


@pytest.mark.parametrize("n", (3, 5, 8, 13))
def test_star(n):
    adj = np.zeros((n, n))
    adj[0, 1:] = adj[1:, 0] = 1
    topo = T.star(n)
    np.testing.assert_allclose(topo.matrix(0), ref_metropolis(adj), atol=1e-12)
    # written out: hub and leaves all have weight 1/n on the hub edge
    assert topo.matrix(0)[0, 0] == pytest.approx(1 / n)
    assert topo.matrix(0)[1, 1] == pytest.approx(1 - 1 / n)
    assert (topo.period, topo.directed) == (1, False)
    _check_stochastic(topo)


@pytest.mark.parametrize("n,p,seed", [(8, 0.3, 0), (10, 0.5, 3), (16, 0.3, 1)])
def test_erdos_renyi(n, p, seed):
    topo = T.erdos_renyi(n, p, seed)
    w = topo.matrix(0)
    adj = (w != 0) & ~np.eye(n, dtype=bool)
    assert np.array_equal(adj, adj.T)
    assert nx.is_connected(nx.from_numpy_array(adj.astype(float)))
    np.testing.assert_allclose(w, ref_metropolis(adj), atol=1e-12)
    assert (topo.period, topo.directed) == (1, False)
    _check_stochastic(topo)
    np.testing.assert_array_equal(T.erdos_renyi(n, p, seed).matrix(0), w)  # seeded
    assert T.erdos_renyi(n, 1.0, seed).matrix(0) == pytest.approx(np.full((n, n), 1 / n))


def test_erdos_renyi_seeds_differ():
    mats = {T.erdos_renyi(10, 0.4, s).matrix(0).tobytes() for s in range(5)}
    assert len(mats) > 1


@pytest.mark.parametrize("n,p,seed", [(6, 0.4, 0), (8, 0.3, 2)])
def test_random_directed(n, p, seed):
    topo = T.random_directed(n, p, seed)
    w = topo.matrix(0)
    adj = (w != 0) & ~np.eye(n, dtype=bool)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from((j, i) for i, j in zip(*np.nonzero(adj)))
    assert nx.is_strongly_connected(g)
    np.testing.assert_allclose(w, ref_column(adj), atol=1e-12)
    assert topo.directed and topo.period == 1
    _check_stochastic(topo, rows=False, cols=True)
    np.testing.assert_array_equal(T.random_directed(n, p, seed).matrix(0), w)


# ---------------------------------------------------------------- from_adjacency / from_matrix / schedule


@pytest.mark.parametrize("n,seed", [(5, 0), (8, 1), (11, 2)])
def test_from_adjacency_metropolis_numpy(n, seed):
    adj = random_undirected_connected(n, 0.4, seed)
    topo = T.from_adjacency(adj)  # default scheme
    np.testing.assert_allclose(topo.matrix(0), ref_metropolis(adj), atol=1e-12)
    np.testing.assert_allclose(T.from_adjacency(adj, weights="metropolis").matrix(0), ref_metropolis(adj))
    assert not topo.directed
    _check_stochastic(topo)
    # non-binary positive entries and self-loops only define the pattern
    adj2 = adj * 3.5 + np.eye(n)
    np.testing.assert_allclose(T.from_adjacency(adj2).matrix(0), ref_metropolis(adj), atol=1e-12)


def test_from_adjacency_uniform_regular():
    n = 9
    # 4-regular circulant graph (offsets +-1, +-3): uniform weights 1/5 are doubly stochastic
    adj = np.zeros((n, n))
    for i in range(n):
        for o in (1, -1, 3, -3):
            adj[i, (i + o) % n] = 1
    topo = T.from_adjacency(adj, weights="uniform")
    np.testing.assert_allclose(topo.matrix(0), ref_uniform(adj), atol=1e-12)
    np.testing.assert_allclose(topo.matrix(0)[adj != 0], 0.2)
    _check_stochastic(topo)
    # a directed regular graph (in-degree 2 everywhere, circulant) is also fine
    dadj = np.zeros((n, n))
    for i in range(n):
        dadj[(i + 1) % n, i] = dadj[(i + 4) % n, i] = 1
    dtopo = T.from_adjacency(dadj, weights="uniform")
    np.testing.assert_allclose(dtopo.matrix(0), ref_uniform(dadj), atol=1e-12)
    assert dtopo.directed
    _check_stochastic(dtopo)


@pytest.mark.parametrize("seed", [0, 1])
def test_from_adjacency_column_numpy(seed):
    n = 7
    rng = np.random.default_rng(seed)
    adj = (rng.random((n, n)) < 0.35).astype(float)
    for i in range(n):  # add a directed cycle so the graph is strongly connected
        adj[(i + 1) % n, i] = 1
    np.fill_diagonal(adj, 0)
    topo = T.from_adjacency(adj, weights="column")
    np.testing.assert_allclose(topo.matrix(0), ref_column(adj), atol=1e-12)
    assert topo.directed
    _check_stochastic(topo, rows=False, cols=True)
    assert not topo.is_row_stochastic  # random out-degrees: rows do not sum to 1
    np.testing.assert_array_equal(topo.out_degree[0], adj.sum(0))
    np.testing.assert_array_equal(topo.in_degree[0], adj.sum(1))


def test_from_adjacency_networkx_graph():
    g = nx.petersen_graph()  # 3-regular, 10 nodes
    a = nx.to_numpy_array(g)  # symmetric
    for scheme, ref in (("metropolis", ref_metropolis), ("uniform", ref_uniform), ("column", ref_column)):
        topo = T.from_adjacency(g, weights=scheme)
        np.testing.assert_allclose(topo.matrix(0), ref(a), atol=1e-12)
        assert not topo.directed
    # irregular graph (karate club): metropolis
    k = nx.karate_club_graph()
    np.testing.assert_allclose(T.from_adjacency(k).matrix(0), ref_metropolis(nx.to_numpy_array(k)), atol=1e-12)


def test_from_adjacency_networkx_digraph():
    g = nx.DiGraph()
    n = 6
    g.add_nodes_from(range(n))
    g.add_edges_from([(i, (i + 1) % n) for i in range(n)] + [(0, 3), (2, 5), (4, 1)])
    topo = T.from_adjacency(g, weights="column")
    adj = np.zeros((n, n))
    for u, v in g.edges():
        adj[v, u] = 1  # u -> v: v receives from u
    np.testing.assert_allclose(topo.matrix(0), ref_column(adj), atol=1e-12)
    assert topo.directed
    # node 0 sends to 1 and 3: weight 1/3 each, itself 1/3
    np.testing.assert_allclose(topo.matrix(0)[[0, 1, 3], 0], 1 / 3)
    _check_stochastic(topo, rows=False, cols=True)


def test_from_matrix_roundtrip():
    for seed, n in ((0, 5), (1, 8)):
        w = random_doubly_stochastic(n, seed)
        topo = T.from_matrix(w)
        np.testing.assert_allclose(topo.matrix(0), w, atol=1e-12)
        assert topo.period == 1
        _check_stochastic(topo)
    ws = np.stack([random_doubly_stochastic(6, s) for s in range(3)])
    topo = T.from_matrix(ws)
    assert topo.period == 3
    for t in range(6):
        np.testing.assert_allclose(topo.matrix(t), ws[t % 3], atol=1e-12)
    np.testing.assert_allclose(topo.matrices(), ws, atol=1e-12)
    sym = T.from_matrix(ref_ring(6))
    assert not sym.directed and T.from_matrix(ref_directed_ring(6)).directed
    assert not T.from_matrix(ref_directed_ring(6), directed=False).directed  # explicit override


def test_schedule():
    parts = [T.ring(8), T.one_peer_exponential(8), T.complete(8)]
    topo = T.schedule(parts)
    assert topo.period == 1 + 3 + 1
    expected = [ref_ring(8)] + [ref_one_peer(8, t) for t in range(3)] + [np.full((8, 8), 1 / 8)]
    for t in range(2 * topo.period):
        np.testing.assert_allclose(topo.matrix(t), expected[t % 5], atol=1e-12)
    assert topo.directed  # one part is directed
    assert not T.schedule([T.ring(8), T.complete(8)]).directed
    _check_stochastic(topo)
    # a schedule of directed perfect matchings whose union is connected
    m1 = np.kron(np.eye(3), np.full((2, 2), 0.5))
    m2 = np.roll(np.roll(m1, 1, 0), 1, 1)
    sched = T.schedule([T.from_matrix(np.stack([m1, m2]))])
    assert sched.period == 2


# ---------------------------------------------------------------- derived tables


TOPOLOGIES = {
    "ring8": lambda: T.ring(8),
    "dring5": lambda: T.directed_ring(5),
    "torus2x3": lambda: T.torus(2, 3),
    "hypercube8": lambda: T.hypercube(8),
    "exponential6": lambda: T.exponential(6),
    "one_peer6": lambda: T.one_peer_exponential(6),
    "complete5": lambda: T.complete(5),
    "star7": lambda: T.star(7),
    "er9": lambda: T.erdos_renyi(9, 0.4, 0),
    "rdir7": lambda: T.random_directed(7, 0.4, 1),
    "sched": lambda: T.schedule([T.ring(6), T.one_peer_exponential(6)]),
}


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_derived_tables_match_matrices(name):
    topo = TOPOLOGIES[name]()
    n = topo.num_nodes
    nbr, slot_w = topo.slots
    assert nbr.shape == slot_w.shape == (topo.period, n, topo.max_slots)
    a, b, w_ab, w_ba = oriented_pairs(topo)  # PowerGossip's pair tables, built from the edge list
    for t in range(topo.period):
        m = topo.matrix(t)
        off = m * (1 - np.eye(n))
        np.testing.assert_array_equal(topo.out_degree[t], (off != 0).sum(0))
        np.testing.assert_array_equal(topo.in_degree[t], (off != 0).sum(1))
        np.testing.assert_allclose(topo.self_weights[t], np.diag(m))
        # slot table reconstructs W(t); slot 0 is the node itself
        rec = np.zeros((n, n))
        for i in range(n):
            for k in range(nbr.shape[2]):
                rec[i, nbr[t, i, k]] += slot_w[t, i, k]
        np.testing.assert_allclose(rec, m, atol=1e-12)
        np.testing.assert_array_equal(nbr[t, :, 0], np.arange(n))
        # oriented pairs reconstruct the off-diagonal part
        rec = np.zeros((n, n))
        for p in range(a.shape[1]):
            if w_ab[t, p] or w_ba[t, p]:
                assert a[t, p] < b[t, p]
                rec[a[t, p], b[t, p]] += w_ab[t, p]
                rec[b[t, p], a[t, p]] += w_ba[t, p]
        np.testing.assert_allclose(rec, off, atol=1e-12)
        expected_pairs = {(i, j) for i, j in zip(*np.nonzero(off + off.T)) if i < j}
        got = {(int(x), int(y)) for x, y, u, v in zip(a[t], b[t], w_ab[t], w_ba[t]) if u or v}
        assert got == expected_pairs


def test_padding_edges_have_zero_weight():
    topo = T.schedule([T.complete(6), T.one_peer_exponential(6)])
    assert topo.num_edges == 36
    for t in range(1, topo.period):
        assert (topo.weights[t] != 0).sum() == 12  # 6 self-loops + 6 one-peer edges


def test_resolved_kernel_and_replace():
    assert T.ring(8).resolved_kernel == "slots"
    for kernel in ("slots", "dense", "segment"):
        assert dataclasses.replace(T.ring(8), kernel=kernel).resolved_kernel == kernel
    assert T.complete(64).resolved_kernel == "dense"  # K = 64 > 16 slots, fully dense


@pytest.mark.parametrize("n", (8, 16))
def test_auto_kernel_is_dense_for_complete_graphs(n):
    assert T.complete(n).resolved_kernel == "dense"


# ---------------------------------------------------------------- spectral numbers (docs/topologies.md, topologies)


@pytest.mark.parametrize(
    "make,expected",
    [
        (lambda: T.ring(8), 0.1953),
        (lambda: T.ring(16), 0.0507),
        (lambda: T.ring(32), 0.0128),
        (lambda: T.torus(2, 4), 0.4),
        (lambda: T.torus(4, 4), 0.4),
        (lambda: T.torus(4, 8), 0.1172),
        (lambda: T.hypercube(8), 0.5),
        (lambda: T.hypercube(16), 0.4),
        (lambda: T.hypercube(32), 0.3333),
        (lambda: T.exponential(8), 0.5),
        (lambda: T.exponential(16), 0.4),
        (lambda: T.exponential(32), 0.3333),
        (lambda: T.star(8), 0.125),
        (lambda: T.star(16), 0.0625),
        (lambda: T.star(32), 0.0312),
        (lambda: T.complete(8), 1.0),
        (lambda: T.complete(16), 1.0),
        (lambda: T.complete(32), 1.0),
    ],
)
def test_spectral_gap_reference_values(make, expected):
    assert T.spectral_gap(make()) == pytest.approx(expected, abs=1e-4)


def test_spectral_gap_is_norm_convention():
    # 1 - |lambda_2| equals 1 - ||W - J||_2 for the normal matrices above
    # (docs/topologies.md, section topologies and spectral tools)
    for topo in (T.ring(8), T.torus(4, 4), T.exponential(16), T.star(8)):
        w = topo.matrix(0)
        n = w.shape[0]
        assert T.spectral_gap(topo) == pytest.approx(1 - np.linalg.norm(w - 1 / n, 2), abs=1e-9)


def test_spectral_gap_time_varying_not_exact():
    # n = 6: a period of 3 one-peer rounds does not average exactly
    gap = T.spectral_gap(T.one_peer_exponential(6))
    assert 0 < gap < 1


@pytest.mark.parametrize("n", (8, 16))
def test_spectral_gap_one_peer_power_of_two_is_one(n):
    assert T.spectral_gap(T.one_peer_exponential(n)) == pytest.approx(1.0, abs=1e-9)


def test_optimal_gamma():
    assert T.optimal_gamma(T.ring(8)) == pytest.approx(1.3084, abs=1e-4)
    assert T.optimal_gamma(T.ring(16)) == pytest.approx(1.445, abs=1e-3)
    # from the definition, on another graph
    w = T.torus(3, 4).matrix(0)
    lam = np.sort(np.linalg.eigvalsh(w))
    assert T.optimal_gamma(T.torus(3, 4)) == pytest.approx(2 / ((1 - lam[-2]) + (1 - lam[0])))
    # the relaxed 8-ring improves its gap from 0.195 to ~0.256
    # (docs/topologies.md, section topologies and spectral tools)
    g = T.optimal_gamma(T.ring(8))
    wg = np.eye(8) + g * (T.ring(8).matrix(0) - np.eye(8))
    assert 1 - np.sort(np.abs(np.linalg.eigvalsh(wg)))[-2] == pytest.approx(0.256, abs=1e-3)


# ---------------------------------------------------------------- validation errors


def test_disconnected_adjacency():
    adj = np.zeros((6, 6))
    adj[0, 1] = adj[1, 0] = adj[2, 3] = adj[3, 2] = adj[4, 5] = adj[5, 4] = 1
    with pytest.raises(ValueError, match="not connected"):
        T.from_adjacency(adj)
    with pytest.raises(ValueError, match="not connected"):
        T.from_adjacency(nx.Graph([(0, 1), (2, 3)]))


def test_disconnected_matrix():
    with pytest.raises(ValueError, match="not strongly connected"):
        T.from_matrix(np.eye(4))
    block = np.kron(np.eye(2), np.full((2, 2), 0.5))
    with pytest.raises(ValueError, match="not strongly connected"):
        T.from_matrix(block)
    with pytest.raises(ValueError, match="not strongly connected"):
        T.schedule([T.from_matrix(np.stack([block, block]))])


def test_not_strongly_connected_digraph():
    # a directed path 0 -> 1 -> 2 -> 3 is weakly but not strongly connected
    adj = np.zeros((4, 4))
    adj[1, 0] = adj[2, 1] = adj[3, 2] = 1
    with pytest.raises(ValueError, match="not strongly connected"):
        T.from_adjacency(adj, weights="column")
    with pytest.raises(ValueError, match="not strongly connected"):
        T.from_adjacency(nx.DiGraph([(0, 1), (1, 2), (2, 3)]), weights="column")
    w = np.eye(3) * 0.5
    w[1, 0] = w[2, 1] = 0.5
    w[2, 2] = 1.0
    with pytest.raises(ValueError, match="not strongly connected"):
        T.from_matrix(w)


def test_negative_and_nonfinite_weights():
    w = ref_ring(5)
    w[0, 1] = -0.1
    w[0, 0] += 0.1 + 1 / 3
    with pytest.raises(ValueError, match="negative"):
        T.from_matrix(w)
    for bad in (np.nan, np.inf):
        w = ref_ring(5)
        w[2, 3] = bad
        with pytest.raises(ValueError, match="NaN or inf"):
            T.from_matrix(w)
        adj = np.ones((4, 4))
        adj[1, 2] = bad
        with pytest.raises(ValueError, match="NaN or inf"):
            T.from_adjacency(adj)
    adj = np.ones((4, 4))
    adj[0, 1] = -1
    with pytest.raises(ValueError, match="negative"):
        T.from_adjacency(adj)


def test_matrix_not_stochastic():
    with pytest.raises(ValueError, match="neither row nor column stochastic"):
        T.from_matrix(np.full((4, 4), 0.3))


@pytest.mark.parametrize(
    "build,minimum",
    [
        (lambda n: T.ring(n), 3),
        (lambda n: T.directed_ring(n), 2),
        (lambda n: T.hypercube(n), 2),
        (lambda n: T.exponential(n), 2),
        (lambda n: T.one_peer_exponential(n), 2),
        (lambda n: T.complete(n), 2),
        (lambda n: T.star(n), 3),
        (lambda n: T.erdos_renyi(n, 0.5), 2),
        (lambda n: T.random_directed(n, 0.5), 2),
    ],
)
def test_n_too_small(build, minimum):
    with pytest.raises(ValueError, match=f"n={minimum - 1} is too small"):
        build(minimum - 1)
    with pytest.raises(ValueError, match="too small"):
        build(0)
    with pytest.raises(TypeError, match="must be an int"):
        build(8.0)


def test_torus_errors():
    with pytest.raises(ValueError, match="rows=1 is too small"):
        T.torus(1, 4)
    with pytest.raises(ValueError, match="cols=1 is too small"):
        T.torus(4, 1)
    with pytest.raises(ValueError, match="does not match num_nodes=12"):
        T.torus(3, 5, num_nodes=12)


def test_adjacency_and_matrix_too_small_or_malformed():
    with pytest.raises(ValueError, match="at least 2"):
        T.from_adjacency(np.zeros((1, 1)))
    with pytest.raises(ValueError, match="at least 2"):
        T.from_matrix(np.ones((1, 1)))
    with pytest.raises(ValueError, match="square"):
        T.from_adjacency(np.ones((3, 4)))
    with pytest.raises(ValueError, match=r"\[N, N\] or \[T, N, N\]"):
        T.from_matrix(np.ones((3, 4)) / 3)
    with pytest.raises(ValueError, match="nodes labelled 0..N-1"):
        T.from_adjacency(nx.relabel_nodes(nx.cycle_graph(4), {i: i + 1 for i in range(4)}))
    with pytest.raises(ValueError, match="schedule needs at least one"):
        T.schedule([])
    with pytest.raises(ValueError, match="mixes node counts"):
        T.schedule([T.ring(6), T.ring(8)])


def test_hypercube_not_power_of_two():
    for n in (3, 6, 12):
        with pytest.raises(ValueError, match="power of two"):
            T.hypercube(n)


def test_unknown_weight_scheme_and_kernel():
    with pytest.raises(ValueError, match="known weight schemes"):
        T.from_adjacency(ref_ring(5), weights="laplacian")
    with pytest.raises(ValueError, match="known kernels"):
        dataclasses.replace(T.ring(8), kernel="fft")


def test_weight_scheme_misuse():
    with pytest.raises(ValueError, match="metropolis.*undirected"):
        T.from_adjacency(ref_directed_ring(5) - np.eye(5) * 0.5)
    star = np.zeros((5, 5))
    star[0, 1:] = star[1:, 0] = 1
    with pytest.raises(ValueError, match="not doubly stochastic on this irregular graph"):
        T.from_adjacency(star, weights="uniform")


@pytest.mark.parametrize("p", [0, 0.0, -0.1, 1.5, float("nan"), "0.5", None])
def test_erdos_renyi_p_out_of_range(p):
    with pytest.raises(ValueError, match="edge probability in"):
        T.erdos_renyi(8, p)
    with pytest.raises(ValueError, match="arc probability in"):
        T.random_directed(8, p)


def test_erdos_renyi_never_connected():
    with pytest.raises(ValueError, match="no connected graph in 5 tries"):
        T.erdos_renyi(30, 0.01, max_tries=5)
    with pytest.raises(ValueError, match="no strongly connected graph in 5 tries"):
        T.random_directed(30, 0.01, max_tries=5)


def test_spectral_tools_errors():
    with pytest.raises(ValueError, match="doubly stochastic"):
        T.spectral_gap(T.random_directed(8, 0.4, 0))
    with pytest.raises(ValueError, match="static topology"):
        T.optimal_gamma(T.one_peer_exponential(8))
    with pytest.raises(ValueError, match="symmetric"):
        T.optimal_gamma(T.exponential(8))


def test_from_adjacency_directedness_from_pattern():
    adj = np.zeros((5, 5))
    for i in range(5):
        adj[i, (i + 1) % 5], adj[(i + 1) % 5, i] = 2.0, 1.0
    topo = T.from_adjacency(adj)
    np.testing.assert_allclose(topo.matrix(0), ref_ring(5), atol=1e-12)
    assert not topo.directed


def test_erdos_renyi_accepts_numpy_float32():
    assert T.erdos_renyi(8, np.float32(0.5), 0).num_nodes == 8
    assert T.random_directed(8, np.float32(0.5), 0).num_nodes == 8


def test_is_symmetric():
    for topo in (T.ring(8), T.torus(2, 3), T.star(7), T.complete(4), T.erdos_renyi(9, 0.4, 0), T.directed_ring(2)):
        assert topo.is_symmetric, topo
    for topo in (T.exponential(8), T.one_peer_exponential(8), T.directed_ring(5), T.random_directed(7, 0.4, 1)):
        assert not topo.is_symmetric, topo
    assert T.ring(5000).is_symmetric  # large graphs are checked too (on the pair list)


def test_make_by_name():
    for name, ref in (("ring", ref_ring), ("directed_ring", ref_directed_ring), ("exponential", ref_exponential)):
        np.testing.assert_allclose(T.make(name, 6).matrix(0), ref(6), atol=1e-12)
    np.testing.assert_allclose(T.make("torus", 12).matrix(0), ref_torus(3, 4), atol=1e-12)  # most square
    np.testing.assert_allclose(T.make("torus:2x6", 12).matrix(0), ref_torus(2, 6), atol=1e-12)
    np.testing.assert_allclose(T.make("hypercube", 8).matrix(0), ref_hypercube(8), atol=1e-12)
    assert T.make("one_peer_exponential", 8).period == 3
    np.testing.assert_array_equal(T.make("erdos_renyi:0.5", 9, seed=2).matrix(0), T.erdos_renyi(9, 0.5, 2).matrix(0))
    np.testing.assert_array_equal(T.make("erdos_renyi", 9).matrix(0), T.erdos_renyi(9, 0.3, 0).matrix(0))
    np.testing.assert_array_equal(
        T.make("random_directed:0.4", 7, seed=1).matrix(0), T.random_directed(7, 0.4, 1).matrix(0)
    )


def test_make_errors():
    with pytest.raises(ValueError, match=r"unknown topology 'rign'; known topologies: \[.*'ring'"):
        T.make("rign", 8)
    with pytest.raises(TypeError, match="spec must be a string"):
        T.make(T.ring, 8)
    with pytest.raises(ValueError, match="takes no argument"):
        T.make("ring:3", 8)
    with pytest.raises(ValueError, match="torus:ROWSxCOLS"):
        T.make("torus:4by4", 16)
    with pytest.raises(ValueError, match="does not match num_nodes=12"):
        T.make("torus:3x3", 12)
    with pytest.raises(ValueError, match="must look like 'erdos_renyi:P'"):
        T.make("erdos_renyi:high", 8)
    with pytest.raises(ValueError, match="edge probability"):
        T.make("erdos_renyi:1.5", 8)
    with pytest.raises(ValueError, match="rows=1 is too small"):  # a prime N has no 2-D torus
        T.make("torus", 7)
