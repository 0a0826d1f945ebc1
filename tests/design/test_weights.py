"""fastest_mixing: known optima, never worse than the classical weightings, the constraints of a
Markov chain, an ordinary Topology out, and the refusals of bad graphs."""

import jax
import networkx as nx
import numpy as np
import pytest

import jaxgossip as jg
from jaxgossip.design import fastest_mixing, max_degree_weights, metropolis_edge_weights, mixing_matrix, slem
from jaxgossip.topology import Topology, chain


def graphs():
    return {
        "path7": chain(7),
        "ring8": jg.topology.ring(8),
        "star6": jg.topology.star(6),
        "petersen": jg.topology.from_adjacency(nx.petersen_graph()),
        "grid3x4": jg.topology.from_adjacency(nx.convert_node_labels_to_integers(nx.grid_2d_graph(3, 4))),
        "er16": jg.topology.erdos_renyi(16, 0.3, seed=3),
    }


def dense_slem(w: np.ndarray) -> float:
    """The reference: max |eigenvalue| of W - 11^T/N by NumPy's general eigen-solver."""
    n = w.shape[0]
    return float(np.max(np.abs(np.linalg.eigvals(w - np.ones((n, n)) / n))))


@pytest.mark.parametrize("n", [3, 5, 8, 13, 20])
def test_path_optimum_is_cos_pi_over_n(n):
    """Boyd, Diaconis, Sun, Xiao (2006): the fastest-mixing chain on the n-path has w = 1/2 and
    SLEM cos(pi / n)."""
    design = fastest_mixing(chain(n))
    assert abs(design.slem - np.cos(np.pi / n)) < 1e-6
    np.testing.assert_allclose(design.weights, 0.5, atol=1e-5)
    assert design.gap_bound <= 1e-8


@pytest.mark.parametrize("name", list(graphs()))
@pytest.mark.parametrize("nonnegative", [True, False])
def test_design_is_a_doubly_stochastic_topology_never_worse_than_classical_weights(name, nonnegative):
    topo = graphs()[name]
    design = fastest_mixing(topo, nonnegative=nonnegative)
    w = design.topology.matrix()
    n = topo.num_nodes
    assert isinstance(design.topology, Topology) and design.topology.period == 1
    np.testing.assert_allclose(w, w.T, atol=1e-12)
    np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-12)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    assert design.topology.is_doubly_stochastic and design.topology.is_symmetric and not design.topology.directed
    # only the graph's own edges carry weight
    support = (topo.matrix() != 0) | np.eye(n, dtype=bool)
    assert np.all(w[~support] == 0)
    np.testing.assert_allclose(design.slem, dense_slem(w), atol=1e-9)
    np.testing.assert_allclose(w, mixing_matrix(design.edges, design.weights, n), atol=1e-12)
    slack = design.gap_bound + 1e-9
    assert design.gap_bound <= 1e-8
    assert design.slem <= design.metropolis_slem + slack
    assert design.slem <= design.max_degree_slem + slack
    if nonnegative:
        assert np.all(design.weights > 0) and np.all(w >= 0)
        assert np.all(np.diag(w) >= 0)
        # the best constant weight is a competitor where it is itself a Markov chain
        adj = (support & ~np.eye(n, dtype=bool)).astype(float)
        lam = np.linalg.eigvalsh(np.diag(adj.sum(1)) - adj)
        alpha = 2.0 / (lam[1] + lam[-1])
        if np.all(alpha * adj.sum(1) <= 1):
            assert design.slem <= design.best_constant_slem + slack
    else:
        assert design.slem <= design.best_constant_slem + slack
        chain_design = fastest_mixing(topo, nonnegative=True)
        assert design.slem <= chain_design.slem + slack
    assert design.history.ndim == 1 and design.history.size >= 1
    assert abs(design.history[-1] - design.slem) < 1e-12


def test_classical_slems_are_those_of_the_classical_weights():
    topo = graphs()["er16"]
    design = fastest_mixing(topo)
    n = topo.num_nodes
    metropolis = jg.topology.from_adjacency(topo.matrix() != 0, weights="metropolis").matrix()
    assert abs(design.metropolis_slem - dense_slem(metropolis)) < 1e-10
    np.testing.assert_allclose(
        mixing_matrix(design.edges, metropolis_edge_weights(design.edges, n), n), metropolis, atol=1e-12
    )
    deg = (topo.matrix() != 0).sum(1) - 1
    max_degree = mixing_matrix(design.edges, max_degree_weights(design.edges, n), n)
    assert np.allclose(np.diag(max_degree), 1 - deg / deg.max())
    assert abs(design.max_degree_slem - slem(max_degree)) < 1e-12


def test_known_optima_of_edge_transitive_graphs():
    """On an edge-transitive graph, averaging an optimum over the automorphisms gives an optimum
    with one weight on every edge (Boyd, Diaconis, Parrilo, Xiao, SIAM J. Optim. 2009), so the
    FDLA optimum is the best constant weight's SLEM."""
    for topo in (jg.topology.ring(8), jg.topology.from_adjacency(nx.petersen_graph()), jg.topology.hypercube(8)):
        design = fastest_mixing(topo, nonnegative=False)
        assert abs(design.slem - design.best_constant_slem) < 1e-7


def test_designed_topology_runs_gossip_at_its_slem():
    topo = graphs()["er16"]
    design = fastest_mixing(topo)
    x0 = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    key = jax.random.key(0)
    fast = np.asarray(jg.run_consensus(jg.algorithms.make("gossip", design.topology), x0, 20, key).error)
    slow = np.asarray(jg.run_consensus(jg.algorithms.make("gossip", topo), x0, 20, key).error)
    assert fast[-1] < slow[-1]
    # ||W^k (x - mean)||^2 <= slem^(2k) ||x - mean||^2, up to float32 rounding
    bound = fast[0] * design.slem ** (2 * np.arange(21))
    assert np.all(fast <= bound * (1 + 1e-4) + 1e-6)


def test_bad_graphs_are_refused_naming_the_problem():
    with pytest.raises(ValueError, match="connected"):
        adj = np.zeros((4, 4))
        adj[0, 1] = adj[1, 0] = adj[2, 3] = adj[3, 2] = 1
        w = np.eye(4) * 0.5 + adj * 0.5
        fastest_mixing(Topology("two pairs", 4, *_edges(w), directed=False))
    with pytest.raises(ValueError, match="directed"):
        fastest_mixing(jg.topology.directed_ring(5))
    with pytest.raises(ValueError, match="NaN or inf"):
        w = jg.topology.ring(5).matrix()
        w[0, 1] = np.nan
        fastest_mixing(Topology("nan ring", 5, *_edges(w), directed=False))
    with pytest.raises(ValueError, match="static"):
        fastest_mixing(jg.topology.one_peer_exponential(8))
    with pytest.raises(ValueError, match="fixed graph"):
        fastest_mixing(jg.topology.random_matching(8))
    with pytest.raises(ValueError, match="tol"):
        fastest_mixing(jg.topology.ring(5), tol=0.0)
    with pytest.raises(TypeError, match="Topology"):
        fastest_mixing(np.eye(4))
    with pytest.raises(TypeError, match="nonnegative"):
        fastest_mixing(jg.topology.ring(5), nonnegative="yes")


def _edges(w):
    r, s = np.nonzero(np.isnan(w) | (w != 0))
    return s[None].astype(np.int32), r[None].astype(np.int32), w[r, s][None]


# Optima certified (gap_bound <= 1e-8) by the barrier method with full Newton convergence in every
# centering, the reference for the faster path-following that stops each centering early.
_CERTIFIED = {
    ("torus12x12", True): 0.9351836383665656,
    ("torus12x12", False): 0.9351836383735993,
    ("er128", True): 0.9336701925994817,
    ("er128", False): 0.9158738125865535,
    ("er256", True): 0.8569231540771091,
}


def _certified_graph(name):
    if name == "torus12x12":
        return jg.topology.torus(12, 12)
    n = int(name[2:])
    return jg.topology.erdos_renyi(n, 5.0 / (n - 1), seed=0)


def _check_certified(name, nonnegative):
    design = fastest_mixing(_certified_graph(name), nonnegative=nonnegative)
    assert design.gap_bound <= 1e-8
    assert abs(design.slem - _CERTIFIED[name, nonnegative]) < 1e-6
    assert design.history.size < 300


@pytest.mark.parametrize("name", ["torus12x12", "er128"])
@pytest.mark.parametrize("nonnegative", [True, False])
def test_graphs_of_128_to_144_nodes_reach_the_certified_optimum(name, nonnegative):
    _check_certified(name, nonnegative)


@pytest.mark.slow
def test_random_graph_of_256_nodes_reaches_the_certified_optimum():
    """The chain on an Erdos-Renyi graph of mean degree 5 with 256 nodes: about 140 Newton steps,
    5 s on a shared 2-core CPU."""
    _check_certified("er256", True)
