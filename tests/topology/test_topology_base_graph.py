"""The Base-(k+1) graph (Takezawa et al., NeurIPS 2023): exact averaging after one period for every
N = 2..64 and k = 1..4, in float64 from the matrices and in float32 through ``jg.run_consensus``;
stochasticity, degree bound, connectivity, period lengths against the authors' construction, and
the ``base:K`` spec with its errors."""

import math

import jax
import numpy as np
import pytest
import scipy.sparse.csgraph

import jaxgossip as jg
from jaxgossip import algorithms
from jaxgossip import topology as T
from jaxgossip.cli import main
from jaxgossip.topology.finite_time import hyper_hypercube_factors, smooth_part

SIZES = range(2, 65)
DEGREES = (1, 2, 3, 4)

# Periods of the authors' BaseGraph(n, k) (yukiTakezawa/BaseGraph, base_graph.py) for n = 2..32,
# obtained by running their code; ours builds the same schedule lengths.
AUTHORS_PERIODS = {
    1: [1, 3, 2, 5, 4, 5, 3, 7, 6, 7, 5, 7, 6, 7, 4, 9, 8, 9, 7, 9, 8, 9, 6, 9, 8, 9, 7, 9, 8, 9, 5],
    2: [1, 1, 2, 3, 2, 4, 3, 2, 4, 5, 3, 5, 5, 4, 4, 5, 3, 6, 5, 5, 6, 6, 4, 6, 6, 3, 6, 7, 5, 7, 5],
    3: [1, 1, 1, 3, 2, 3, 2, 2, 4, 4, 2, 4, 4, 4, 2, 5, 3, 5, 4, 4, 5, 5, 3, 5, 5, 3, 4, 5, 5, 5, 3],
    4: [1, 1, 1, 1, 2, 3, 2, 2, 2, 4, 2, 4, 4, 2, 2, 4, 3, 4, 2, 4, 4, 4, 3, 2, 5, 3, 4, 5, 3, 5, 3],
}


@pytest.mark.parametrize("k", DEGREES)
def test_one_period_multiplies_to_the_exact_average(k):
    for n in SIZES:
        topo = T.base_graph(n, k)
        w = topo.matrices()  # [T, N, N]
        product = np.eye(n)
        for wt in w:
            product = wt @ product
        np.testing.assert_allclose(product, np.full((n, n), 1 / n), rtol=0, atol=1e-12, err_msg=f"n={n}, k={k}")
        # every round symmetric, doubly stochastic, non-negative
        assert np.all(w >= 0)
        np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
        np.testing.assert_allclose(w.sum(axis=2), 1.0, atol=1e-12)
        np.testing.assert_array_equal(w, w.transpose(0, 2, 1))
        assert topo.is_doubly_stochastic and topo.is_symmetric and not topo.directed
        # at most k peers per node and round, and the union of the rounds is connected
        off = (w > 0) & ~np.eye(n, dtype=bool)
        assert off.sum(axis=2).max() <= k and off.sum(axis=1).max() <= k, (n, k)
        assert topo.out_degree.max() <= k
        count, _ = scipy.sparse.csgraph.connected_components(off.any(axis=0), directed=False)
        assert count == 1
        # the paper's bound on the period
        assert topo.period <= 2 * math.log(n, k + 1) + 2, (n, k, topo.period)


@pytest.mark.parametrize("k", DEGREES)
def test_period_lengths_match_the_authors_construction(k):
    assert [T.base_graph(n, k).period for n in range(2, 33)] == AUTHORS_PERIODS[k]


@pytest.mark.parametrize("k, p", [(1, 4), (2, 3), (3, 2), (4, 2)])
def test_powers_of_k_plus_one_are_hyper_hypercubes(k, p):
    n = (k + 1) ** p
    topo = T.base_graph(n, k)
    assert topo.period == p
    for wt in topo.matrices():  # every node averages with exactly k peers, weights 1 / (k + 1)
        off = wt * (1 - np.eye(n))
        assert np.all((off > 0).sum(axis=1) == k)
        np.testing.assert_allclose(wt[wt > 0], 1 / (k + 1))


def test_factorization_helpers():
    assert smooth_part(360, 2) == 72 and smooth_part(7, 6) == 7 and smooth_part(7, 4) == 1
    assert hyper_hypercube_factors(12, 2) == [2, 2, 3] and hyper_hypercube_factors(1, 3) == []
    with pytest.raises(ValueError, match="prime factor > k"):
        hyper_hypercube_factors(10, 3)


def _disjoint_union(graphs):
    """All graphs side by side as one topology on sum(N) nodes, period max(T) (each graph's rounds
    repeat cyclically), so that one run_consensus checks them all."""
    period = max(g.period for g in graphs)
    offsets = np.cumsum([0] + [g.num_nodes for g in graphs])
    rounds = []
    for t in range(period):
        s = np.concatenate([g.senders[t % g.period] + o for g, o in zip(graphs, offsets)])
        r = np.concatenate([g.receivers[t % g.period] + o for g, o in zip(graphs, offsets)])
        w = np.concatenate([g.weights[t % g.period] for g in graphs])
        rounds.append((s, r, w))
    width = max(s.size for s, _, _ in rounds)
    pad = [np.stack([np.pad(x[i], (0, width - x[i].size)) for x in rounds]) for i in range(3)]
    return T.Topology("union", int(offsets[-1]), pad[0], pad[1], pad[2], directed=False), offsets


@pytest.mark.parametrize("k", DEGREES)
def test_gossip_reaches_the_exact_average_after_one_period_in_float32(k):
    graphs = [T.base_graph(n, k) for n in SIZES]
    union, offsets = _disjoint_union(graphs)
    x0 = np.asarray(jax.random.normal(jax.random.key(k), (union.num_nodes, 3)))
    steps = max(g.period for g in graphs)
    result = jg.run_consensus(algorithms.make("gossip", union, gamma=1.0), x0, steps, jax.random.key(0))
    x = np.asarray(result.x)
    for lo, hi in zip(offsets[:-1], offsets[1:]):
        np.testing.assert_allclose(x[lo:hi], np.broadcast_to(x0[lo:hi].mean(0), (hi - lo, 3)), atol=2e-6, rtol=0)


def test_one_graph_through_run_consensus_stops_at_the_average_after_its_period():
    topo = T.make("base:2", 25)
    x0 = jax.random.normal(jax.random.key(3), (25, 4))
    result = jg.run_consensus(algorithms.make("gossip", topo, gamma=1.0), x0, topo.period, jax.random.key(0))
    error = np.asarray(result.error)
    assert error[-1] < 1e-12 * error[0] and np.all(error[1:-1] > 1e-6 * error[0])


def test_spec_builds_the_named_constructor():
    for n in (5, 12, 30):
        assert T.make("base:3", n).value_key() == T.base_graph(n, 3).value_key()
        assert T.make("base", n).value_key() == T.base_graph(n, 1).value_key()
    assert "base" in T.FAMILIES


@pytest.mark.parametrize("spec", ["base:0", "base:-1", "base:x", "base:1.5"])
def test_bad_degree_is_a_clear_error(spec):
    with pytest.raises(ValueError, match=r"base spec '" + spec.replace(".", r"\.") + "': K .* must be an int >= 1"):
        T.make(spec, 8)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="max_degree=0 is too small"):
        T.base_graph(8, 0)
    with pytest.raises(TypeError, match="max_degree must be an int"):
        T.base_graph(8, 2.0)
    with pytest.raises(ValueError, match="n=1 is too small"):
        T.base_graph(1, 2)


def test_command_line_refuses_base_0_with_exit_2(capsys):
    code = main(["train", "--topology=base:0", "--num_nodes=8", "--print-config"])
    err = capsys.readouterr().err
    assert code == 2 and "base:0" in err and "K (the maximum degree) must be an int >= 1" in err
    assert "Traceback" not in err


GOOD_SPECS = [
    "ring",
    "torus:2x4",
    "erdos_renyi:0.5",
    "random_out:2",
    "base",
    "base:3",
    "u_equistatic:2",
    "d_equistatic",
    "od_equidyn:1",
    "ou_equidyn",
    "chain",
    "dumbbell",
    "spanning_tree:erdos_renyi:0.6",
    "spanning_tree:spanning_tree:torus",
    "base:2+drop:0.2",
    "ring+nodedrop:0.1",
]
BAD_SPECS = [
    ("base:0", "K .* must be an int >= 1"),
    ("base:two", "K .* must be an int >= 1"),
    ("u_equistatic:0", "M .* must be an int >= 1"),
    ("d_equistatic:-1", "M .* must be an int >= 1"),
    ("od_equidyn:0", "ETA must lie in"),
    ("ou_equidyn:nan", "ETA must lie in"),
    ("spanning_tree", "must name the graph to span"),
    ("spanning_tree:rnig", "unknown topology 'rnig'"),
    ("spanning_tree:base:0", "K .* must be an int >= 1"),
    ("erdos_renyi:0", "P must be a probability"),
    ("random_out:0", "S .* must be an int >= 1"),
    ("torus:1x8", "ROWSxCOLS"),
    ("chain:2", "takes no argument"),
    ("base:2+drop:1.5", r"link_drop=1.5 must be a probability in \[0, 1\)"),
    ("ring+loss:0.1", "unknown topology suffix"),
]


@pytest.mark.parametrize("spec", GOOD_SPECS)
def test_check_spec_accepts_what_make_builds(spec):
    T.check_spec(spec)
    assert T.make(spec, 8, seed=1).num_nodes == 8


@pytest.mark.parametrize("spec, message", BAD_SPECS)
def test_check_spec_refuses_without_a_size_and_make_agrees(spec, message):
    with pytest.raises(ValueError, match=message) as caught:
        T.check_spec(spec)
    assert repr(spec) in str(caught.value) or repr(spec.split(":", 1)[1]) in str(caught.value)
    with pytest.raises(ValueError):
        T.make(spec, 8)


@pytest.mark.parametrize("n, k", [(12, 1), (40, 1), (96, 1), (45, 2), (60, 3), (210, 4)])
def test_a_factored_schedule_is_the_blocks_simple_graphs_then_the_hypercube_across(n, k):
    """N = N_s N_r: the first rounds are N_s simple graphs of N_r consecutive nodes side by side,
    ``kron(I, W_r(t))``; then the hyper-hypercube of N_s nodes across the blocks,
    ``kron(W_s(t), I)``: the same matrices exactly (N_r has no factor <= k + 1, so its graph is
    the simple one)."""
    smooth = smooth_part(n, k)
    rest = n // smooth
    inner, across = T.base_graph(rest, k).matrices(), T.base_graph(smooth, k).matrices()
    topo = T.base_graph(n, k)
    assert topo.period == len(inner) + len(across), (n, k)
    want = [np.kron(np.eye(smooth), w) for w in inner] + [np.kron(w, np.eye(rest)) for w in across]
    for t, (got, w) in enumerate(zip(topo.matrices(), want)):
        np.testing.assert_array_equal(got, w, err_msg=f"n={n}, k={k}, round {t}")
