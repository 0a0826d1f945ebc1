"""The graph builders against the slow reference constructions (tests/topology/_reference_builders.py):
every table bit for bit (edges, weights, slot table) and every derived fact, for every family at
several small N, static, directed and time-varying."""

import _reference_builders as ref
import networkx as nx
import numpy as np
import pytest
from _reference_builders import Tables

import jaxgossip.topology as T
from jaxgossip.topology import edges, specs
from jaxgossip.topology.equitopo import basis_shifts, default_m

SIZES = (2, 3, 4, 5, 7, 8, 9, 16, 17, 33)


def assert_same(topo, want: Tables):
    # The slot table through ``slots``: a hub graph keeps none of its own and makes it on demand.
    tables = dict(zip(("neighbors", "slot_weights"), topo.slots))
    for field in ("senders", "receivers", "weights", "neighbors", "slot_weights"):
        got, expected = tables.get(field, getattr(topo, field, None)), getattr(want, field)
        assert got.dtype == expected.dtype and got.shape == expected.shape, (
            topo.name,
            field,
            got.shape,
            expected.shape,
        )
        assert np.array_equal(got, expected), (topo.name, field)
        assert got.tobytes() == expected.tobytes(), (topo.name, field)  # -0.0 and NaN bits too
    assert topo.directed == want.directed, topo.name
    assert topo.is_symmetric == want.symmetric, topo.name
    np.testing.assert_array_equal(topo.out_degree, want.out_degree)
    np.testing.assert_array_equal(topo.in_degree, want.in_degree)
    assert topo.self_weights.tobytes() == want.self_weights.tobytes(), topo.name


def _cases():
    for n in SIZES:
        if n >= 3:
            yield f"ring({n})", lambda n=n: (T.ring(n), ref.ring(n))
            yield f"star({n})", lambda n=n: (T.star(n), ref.star(n))
        yield f"directed_ring({n})", lambda n=n: (T.directed_ring(n), ref.directed_ring(n))
        yield f"exponential({n})", lambda n=n: (T.exponential(n), ref.exponential(n))
        yield f"one_peer_exponential({n})", lambda n=n: (T.one_peer_exponential(n), ref.one_peer_exponential(n))
        yield f"complete({n})", lambda n=n: (T.complete(n), ref.complete(n))
        yield f"chain({n})", lambda n=n: (T.chain(n), ref.chain(n))
        yield f"binary_tree({n})", lambda n=n: (T.binary_tree(n), ref.binary_tree(n))
        if n >= 4:
            yield f"dumbbell({n})", lambda n=n: (T.dumbbell(n), ref.dumbbell(n))
        if n & (n - 1) == 0:
            yield f"hypercube({n})", lambda n=n: (T.hypercube(n), ref.hypercube(n))
        for m in (1, 3, None):
            for seed in (0, 5):
                mm = default_m(n) if m is None else m
                yield (
                    f"d_equistatic({n},{m},{seed})",
                    lambda n=n, m=m, mm=mm, seed=seed: (
                        T.d_equistatic(n, m, seed),
                        ref.equistatic(n, basis_shifts(n, mm, seed), mm, False),
                    ),
                )
                yield (
                    f"u_equistatic({n},{m},{seed})",
                    lambda n=n, m=m, mm=mm, seed=seed: (
                        T.u_equistatic(n, m, seed),
                        ref.equistatic(n, basis_shifts(n, mm, seed), mm, True),
                    ),
                )
    for rows, cols in ((2, 2), (2, 3), (3, 3), (3, 5), (4, 4), (2, 7)):
        yield f"torus({rows}x{cols})", lambda r=rows, c=cols: (T.torus(r, c), ref.torus(r, c))
    for n, p, seed in ((6, 0.5, 0), (12, 0.3, 1), (20, 0.2, 2), (30, 0.9, 3)):
        yield (
            f"erdos_renyi({n},{p},{seed})",
            lambda n=n, p=p, s=seed: (T.erdos_renyi(n, p, s), ref.erdos_renyi(n, p, s)),
        )
        yield (
            f"random_directed({n},{p},{seed})",
            lambda n=n, p=p, s=seed: (T.random_directed(n, p, s), ref.random_directed(n, p, s)),
        )


CASES = dict(_cases())


@pytest.mark.parametrize("case", sorted(CASES))
def test_builders_match_reference_bitwise(case):
    topo, want = CASES[case]()
    assert_same(topo, want)


def test_from_adjacency_and_matrix_match_reference_bitwise():
    rng = np.random.default_rng(0)
    for n in (5, 11, 24):
        a = rng.random((n, n)) < 0.4
        a = a | a.T | np.eye(n, k=1, dtype=bool) | np.eye(n, k=-1, dtype=bool)
        for scheme in ("metropolis", "column"):
            assert_same(T.from_adjacency(a, weights=scheme), ref.from_adjacency(a, scheme))
            assert_same(
                T.from_adjacency(nx.from_numpy_array(a.astype(float)), weights=scheme), ref.from_adjacency(a, scheme)
            )
        d = (rng.random((n, n)) < 0.3) | np.eye(n, k=1, dtype=bool) | np.eye(n, k=1 - n, dtype=bool)
        assert_same(T.from_adjacency(d, weights="column"), ref.from_adjacency(d, "column"))
        w = ref.metropolis_weights(a)
        assert_same(T.from_matrix(np.stack([w, w @ w])), ref.from_matrix(np.stack([w, w @ w])))


def test_schedule_matches_reference_bitwise():
    for n in (4, 6, 9):
        topo = T.schedule([T.ring(n), T.one_peer_exponential(n), T.star(n)])
        parts = [ref.ring(n), ref.one_peer_exponential(n), ref.star(n)]
        rounds = [(p.senders[t], p.receivers[t], p.weights[t]) for p in parts for t in range(p.senders.shape[0])]
        assert_same(topo, ref.from_edges(n, rounds, directed=True))


def test_merge_round_sums_duplicates_in_edge_order():
    s = np.array([3, 1, 1, 0, 1, 3])
    r = np.array([0, 2, 2, 0, 2, 0])
    w = np.array([0.1, 0.2, 0.7, 0.3, 1e-17, -0.0])
    got = edges.merge_round(s, r, w, 4)
    np.testing.assert_array_equal(got.receivers, [0, 0, 2])
    np.testing.assert_array_equal(got.senders, [0, 3, 1])
    assert got.weights.tolist() == [0.3, 0.1 + -0.0, (0.0 + 0.2 + 0.7) + 1e-17]
    canonical = edges.merge_round(got.senders, got.receivers, got.weights, 4)
    assert canonical.weights.tobytes() == got.weights.tobytes()


@pytest.mark.parametrize("n", [1, 2, 5, 16, 31])
def test_circulant_round_matches_sorted_edges(n):
    offsets = [0, -1, 3, n + 3, 2 * n - 5, 7]
    weights = [0.5, 0.25, 0.125, 1 / 3, 0.1, 0.2]
    got = edges.circulant_round(n, offsets, weights)
    nodes = np.arange(n)
    s = np.concatenate([(nodes + o) % n for o in offsets])
    r = np.concatenate([nodes] * len(offsets))
    w = np.concatenate([np.full(n, x) for x in weights])
    want = ref.from_edges(n, [(s, r, w)], directed=True)
    assert edges.is_canonical(got.senders, got.receivers)
    np.testing.assert_array_equal(got.senders, want.senders[0])
    np.testing.assert_array_equal(got.receivers, want.receivers[0])
    assert got.weights.tobytes() == want.weights[0].tobytes()
    # Written into longer int32 rows, as from_edges hands them over: the same edges, the tail untouched.
    size = edges.Circulant(offsets, weights).num_edges(n)
    rows = (np.full(size + 3, -1, np.int32), np.full(size + 3, -1, np.int32), np.full(size + 3, -1.0))
    into = edges.circulant_round(n, offsets, weights, out=rows)
    assert into.senders.size == size and all(np.all(row[size:] == -1) for row in rows)
    for a, b in zip(into, got):
        assert np.array_equal(a, b) and a.tobytes() == b.astype(a.dtype).tobytes()


def test_wide_circulant_slots_over_several_row_blocks():
    n = 40000  # more than one block of 2^14 rows, K = 2 M + 1 > 8 columns
    nbr, slot_w = T.u_equistatic(n).slots
    c = nbr[0, 0]
    np.testing.assert_array_equal(nbr[0], (np.arange(n)[:, None] + c[None, :]) % n)
    assert np.all(slot_w[0] == slot_w[0, :1])


def test_transpose_check_and_components():
    s, r, w = np.array([0, 1, 1, 2]), np.array([1, 0, 2, 1]), np.array([0.5, 0.5, 0.25, 0.25])
    assert edges.transpose_check(s, r, w, 3) == (True, True)
    assert edges.transpose_check(s, r, np.array([0.5, 0.4, 0.25, 0.25]), 3) == (True, False)
    assert edges.transpose_check(s[:3], r[:3], w[:3], 3) == (False, False)
    assert edges.count_components(s, r, 4, strong=False) == 2
    assert edges.count_components(np.array([0, 1]), np.array([1, 2]), 3, strong=True) == 3


@pytest.mark.parametrize(
    "spec",
    [
        "ring",
        "torus",
        "hypercube",
        "star",
        "chain",
        "binary_tree",
        "exponential",
        "directed_ring",
        "one_peer_exponential",
        "base:2",
        "u_equistatic:2",
        "complete",
        "erdos_renyi:0.5",
    ],
)
@pytest.mark.parametrize("n", [4, 8, 9])
def test_failure_tables_match_reference(spec, n):
    if spec == "hypercube" and n == 9:
        return
    base = specs.make(spec, n)
    sampler = T.with_failures(base, link_drop=0.25).sampler
    pair_codes, unit, slot_edge = ref.failure_tables(base)
    if pair_codes is not None:
        assert sampler.pair_codes.tobytes() == pair_codes.tobytes()
        assert sampler.unit.dtype == unit.dtype and np.array_equal(sampler.unit, unit)
    if slot_edge is not None:
        assert np.array_equal(sampler.slot_edge, slot_edge)


@pytest.mark.parametrize("spec", ["torus", "ring", "hypercube", "one_peer_exponential", "base:2"])
@pytest.mark.parametrize("root", [0, 5])
def test_spanning_tree_matches_reference_bitwise(spec, root):
    import scipy.sparse.csgraph

    base = specs.make(spec, 16)
    live = (base.weights != 0) & (base.senders != base.receivers)
    links = scipy.sparse.coo_matrix((np.ones(live.sum()), (base.senders[live], base.receivers[live])), shape=(16, 16))
    links = scipy.sparse.csr_matrix(((links + links.T) > 0).astype(np.float64))
    links.sort_indices()
    _, parent = scipy.sparse.csgraph.breadth_first_order(links, root, directed=False)
    child = np.array([i for i in range(16) if i != root])
    assert_same(T.spanning_tree(base, root=root), ref.undirected_edges(16, child, parent[child]))


def test_erdos_renyi_draws_networkx_graph_across_chunks():
    # 2900 nodes: 4.2 million pair draws, past one chunk of 2^22 draws.
    n, p, seed = 2900, 0.01, 3
    topo = T.erdos_renyi(n, p, seed)
    g = nx.gnp_random_graph(n, p, seed=int(np.random.default_rng(seed).integers(2**31 - 1)))
    assert nx.is_connected(g)
    s, r, w = topo.senders[0], topo.receivers[0], topo.weights[0]
    off = (s != r) & (w != 0)
    got = set(zip(s[off].tolist(), r[off].tolist()))
    want = {(a, b) for a, b in g.edges()} | {(b, a) for a, b in g.edges()}
    assert got == want


@pytest.mark.parametrize("symmetric", [True, False])
def test_transpose_check_over_several_blocks_of_edges(symmetric):
    # 2^17 and more edges: the cube-sum shortcut adds its blocks; the answer is the dense one.
    n = 1000
    rng = np.random.default_rng(3)
    adj = rng.random((n, n)) < 0.15
    adj = adj | adj.T if symmetric else adj
    r, s = np.nonzero(adj)
    w = np.ones(s.size)
    assert s.size > 2**17 and edges.is_canonical(s, r)
    assert edges.transpose_check(s, r, w, n) == (symmetric, symmetric)
