"""chain, binary_tree, spanning_tree:SPEC and dumbbell: the edge sets written here from their
definitions, Metropolis-Hastings weights, symmetric double stochasticity, connectivity, degree
bounds, N - 1 edges for the trees, and the spec errors."""

import networkx as nx
import numpy as np
import pytest
import scipy.sparse.csgraph

from jaxgossip import topology as T
from jaxgossip.cli import main

SIZES = (2, 3, 4, 5, 8, 13, 16, 33)


def _edges(topo):
    w = topo.matrix(0)
    i, j = np.nonzero(np.triu(w, 1))
    return set(zip(i.tolist(), j.tolist()))


def _metropolis(n, edges):
    w = np.zeros((n, n))
    deg = np.zeros(n, int)
    for a, b in edges:
        deg[a] += 1
        deg[b] += 1
    for a, b in edges:
        w[a, b] = w[b, a] = 1 / (1 + max(deg[a], deg[b]))
    w[np.diag_indices(n)] = 1 - w.sum(1)
    return w


def _check_graph(topo, edges, max_degree=None):
    n = topo.num_nodes
    w = topo.matrix(0)
    assert _edges(topo) == {tuple(sorted(e)) for e in edges}
    np.testing.assert_allclose(w, _metropolis(n, edges), atol=1e-12)
    np.testing.assert_allclose(w, w.T, atol=0)
    np.testing.assert_allclose(w.sum(0), 1, atol=1e-12)
    np.testing.assert_allclose(w.sum(1), 1, atol=1e-12)
    assert np.all(w >= 0) and topo.is_doubly_stochastic and topo.is_symmetric and not topo.directed
    count, _ = scipy.sparse.csgraph.connected_components(w * (1 - np.eye(n)) > 0, directed=False)
    assert count == 1
    if max_degree is not None:
        assert topo.out_degree.max() <= max_degree


@pytest.mark.parametrize("n", SIZES)
def test_chain_is_the_path(n):
    topo = T.chain(n)
    _check_graph(topo, [(i, i + 1) for i in range(n - 1)], max_degree=2)
    assert len(_edges(topo)) == n - 1 and topo.period == 1


@pytest.mark.parametrize("n", SIZES)
def test_binary_tree_numbering_of_relaysgd(n):
    topo = T.binary_tree(n)
    # node 0 hangs under 1; node i >= 2 under i // 2
    edges = [(0, 1)] + [(i // 2, i) for i in range(2, n)]
    _check_graph(topo, edges, max_degree=3)
    assert len(_edges(topo)) == n - 1
    assert nx.is_tree(nx.Graph(list(_edges(topo))))


@pytest.mark.parametrize("n", (4, 5, 8, 11, 16))
def test_dumbbell_is_two_cliques_and_one_bridge(n):
    topo = T.dumbbell(n)
    half = n // 2
    left = [(i, j) for i in range(half) for j in range(i + 1, half)]
    right = [(i, j) for i in range(half, n) for j in range(i + 1, n)]
    _check_graph(topo, left + right + [(0, half)], max_degree=n - half)
    # the bridge is a bottleneck: the gap falls like 1/N^2 while a clique's is O(1)
    assert T.spectral_gap(topo) < T.spectral_gap(T.complete(half)) / 4


@pytest.mark.parametrize(
    "spec, n", [("ring", 8), ("torus", 12), ("hypercube", 16), ("erdos_renyi:0.4", 10), ("one_peer_exponential", 8)]
)
def test_spanning_tree_is_the_bfs_tree_of_the_graph(spec, n):
    base = T.make(spec, n, seed=3)
    topo = T.make(f"spanning_tree:{spec}", n, seed=3)
    # BFS from 0 over the union graph (directions ignored), neighbours in increasing order
    union = (base.matrices() > 0).any(axis=0)
    union = (union | union.T) & ~np.eye(n, dtype=bool)
    parent, seen, queue = {}, {0}, [0]
    while queue:
        node = queue.pop(0)
        for nb in np.flatnonzero(union[node]):
            if nb not in seen:
                seen.add(int(nb))
                parent[int(nb)] = node
                queue.append(int(nb))
    edges = [(p, c) for c, p in parent.items()]
    _check_graph(topo, edges)
    assert len(edges) == n - 1 and all(union[a, b] for a, b in edges)
    assert topo.name == f"spanning_tree({base.name})"


def test_spanning_tree_refuses_stochastic_and_disconnected_graphs():
    with pytest.raises(ValueError, match="draws new edges every round"):
        T.spanning_tree(T.random_matching(8))
    pieces = T.Topology("two_pairs", 4, np.array([[0, 1, 2, 3]]), np.array([[1, 0, 3, 2]]), np.ones((1, 4)), False)
    with pytest.raises(ValueError, match="not connected .* reaches 2 of 4 nodes"):
        T.spanning_tree(pieces)
    with pytest.raises(TypeError, match="needs a jaxgossip Topology"):
        T.spanning_tree("ring")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("spanning_tree", "must name the graph to span"),
        ("spanning_tree:", "must name the graph to span"),
        ("spanning_tree:rnig", "spanning_tree spec 'spanning_tree:rnig': unknown topology 'rnig'"),
        ("spanning_tree:random_matching", "draws new edges every round"),
        ("spanning_tree:hypercube", "hypercube needs n to be a power of two"),
        ("chain:3", "takes no argument"),
    ],
)
def test_bad_tree_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        T.make(spec, 6)


def test_small_sizes_are_refused():
    with pytest.raises(ValueError, match="n=3 is too small"):
        T.dumbbell(3)
    with pytest.raises(ValueError, match="n=1 is too small"):
        T.chain(1)


def test_command_line_names_a_bad_spanning_tree_spec(capsys):
    code = main(["train", "--topology=spanning_tree:rnig", "--num_nodes=8", "--print-config"])
    err = capsys.readouterr().err
    assert code == 2 and "spanning_tree:rnig" in err and "unknown topology 'rnig'" in err and "Traceback" not in err
