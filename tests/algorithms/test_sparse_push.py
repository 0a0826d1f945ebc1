"""Tests for jaxgossip.algorithms.sparse_push against a NumPy per-node loop written from the
equations of docs/algorithms.md, section sparse_push: public copies per graph or shared, mass
conservation, the lossless reduction to push_sum, convergence, hand-counted bits, and the
hyperparameter errors shared with scsp (built on the same validation)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import PUSH_N as N
from _reference import PUSH_SHAPES as SHAPES
from _reference import (
    assert_tree_close,
    column_stochastic_graphs,
    debias_error,
    fold_in_keys,
    node_sums,
    np_sparse_push,
    push_x0,
    run_rounds,
    to_jax,
    weighted_digraph,
)

from jaxgossip import topology as tp
from jaxgossip.algorithms.push_sum import push_sum
from jaxgossip.algorithms.scsp import scsp
from jaxgossip.algorithms.sparse_push import graph_copies, sparse_push
from jaxgossip.engine.consensus import run_consensus

RTOL, ATOL = 1e-4, 1e-5
TOPOLOGIES = column_stochastic_graphs(N)


@pytest.mark.parametrize(
    "name, fraction, gamma, mode",
    [
        ("one_peer_exponential", 0.25, 0.4, "per_graph"),
        ("random_directed", 0.5, 0.3, "per_graph"),
        ("schedule", 0.25, 0.4, "per_graph"),
        ("schedule", 0.25, 0.4, "shared"),
    ],
)
def test_sparse_push_matches_numpy_loop(name, fraction, gamma, mode):
    topo = TOPOLOGIES[name]()
    x0 = push_x0(5)
    alg = sparse_push(topo, fraction=fraction, gamma=gamma, public_copies=mode)
    x, state, bits = run_rounds(alg, x0, fold_in_keys(6))
    ref_x, ref_w, ref_bits = np_sparse_push(topo, x0, 6, gamma, fraction, mode)
    assert_tree_close(x, ref_x, RTOL, ATOL)
    np.testing.assert_allclose(np.asarray(state.w), ref_w, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(bits, ref_bits)
    num_copies = 1 if mode == "shared" else topo.period
    assert state.x_hat["a"].shape == (num_copies, N, 3, 4)


@pytest.mark.parametrize("name", ["one_peer_exponential", "random_directed", "schedule"])
def test_sparse_push_lossless_gamma_one_is_push_sum(name):
    topo = TOPOLOGIES[name]()
    x0 = push_x0(6)
    x_ref, s_ref, _ = run_rounds(push_sum(topo), x0, fold_in_keys(8))
    # k >= D_leaf keeps every entry too (checked on one graph)
    kept = {"k": 100} if name == "random_directed" else {"fraction": 1.0}
    x, state, _ = run_rounds(sparse_push(topo, gamma=1.0, **kept), x0, fold_in_keys(8))
    assert_tree_close(x, x_ref, RTOL, ATOL)
    np.testing.assert_allclose(np.asarray(state.w), np.asarray(s_ref.w), rtol=1e-5, atol=1e-6)


def test_sparse_push_conserves_mass_per_graph_but_not_shared_on_time_varying_graph():
    topo = TOPOLOGIES["schedule"]()
    # the self weights change between the two graphs, so the single accumulated s cannot conserve
    assert not np.allclose(topo.self_weights[0], topo.self_weights[1])
    x0 = push_x0(7)
    totals = node_sums(x0)
    x, state, _ = run_rounds(sparse_push(topo, fraction=0.25, gamma=0.3), x0, fold_in_keys(12))
    for k in SHAPES:
        np.testing.assert_allclose(node_sums(x)[k], totals[k], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(float(jnp.sum(state.w)), N, rtol=1e-6)
    x, state, _ = run_rounds(sparse_push(topo, fraction=0.25, gamma=0.3, public_copies="shared"), x0, fold_in_keys(12))
    drift = max(float(np.max(np.abs(node_sums(x)[k] - totals[k]))) for k in SHAPES)
    assert drift > 1e-2  # the literal rule leaks mass (the weights, sent exactly, still sum to N)
    np.testing.assert_allclose(float(jnp.sum(state.w)), N, rtol=1e-6)


def test_shared_copies_stall_away_from_the_average_on_one_peer_exponential():
    """Constant self weights: the literal rule conserves mass but its fixed point is not consensus,
    even without compression; one copy set per graph reaches the average."""
    topo = TOPOLOGIES["one_peer_exponential"]()
    x0 = push_x0(8)
    shared = sparse_push(topo, fraction=1.0, gamma=1.0, public_copies="shared")
    res = run_consensus(shared, to_jax(x0), 60, jax.random.key(0))
    for k, total in node_sums(x0).items():
        np.testing.assert_allclose(node_sums(res.x)[k], total, rtol=1e-5, atol=1e-4)
    assert debias_error(shared, res.x, res.state, x0) > 0.1
    per_graph = sparse_push(topo, fraction=1.0, gamma=1.0)
    res = run_consensus(per_graph, to_jax(x0), 60, jax.random.key(0))
    assert debias_error(per_graph, res.x, res.state, x0) < 1e-4


@pytest.mark.parametrize("name", ["one_peer_exponential", "weighted_digraph", "schedule"])
def test_sparse_push_debiased_values_converge_to_average(name):
    topo = weighted_digraph(N, 2) if name == "weighted_digraph" else TOPOLOGIES[name]()
    x0 = push_x0(9, offset=1.0)
    alg = sparse_push(topo, fraction=0.25, gamma=0.3)
    res = run_consensus(alg, to_jax(x0), 300, jax.random.key(0))
    assert debias_error(alg, res.x, res.state, x0) < 1e-4
    assert float(res.error[-1]) < 1e-7 * float(res.error[0])


def test_sparse_push_bits_hand_computed():
    # leaf a: D = 12, K = floor(0.25 * 12) = 3, index ceil(log2 12) = 4 bits
    # leaf b: D = 5,  K = max(1, floor(1.25)) = 1, index ceil(log2 5) = 3 bits
    log2_message = 3 * (32 + 4) + 1 * (32 + 3) + 32
    wide_message = 3 * (32 + 64) + 1 * (32 + 64) + 32
    assert (log2_message, wide_message) == (175, 416)
    x0 = to_jax(push_x0())
    rd = TOPOLOGIES["random_directed"]()
    assert len(set(rd.out_degree[0])) > 1  # irregular: the count must follow each node's out-degree
    for topo, index_bits, message in ((rd, "log2", log2_message), (tp.one_peer_exponential(N), 64, wide_message)):
        alg = sparse_push(topo, fraction=0.25, index_bits=index_bits)
        _, _, info = jax.jit(alg.step)(x0, alg.init(x0), jax.random.key(0))
        np.testing.assert_array_equal(np.asarray(info.bits), topo.out_degree[0] * message)


def test_graph_copies_tables():
    ope = tp.one_peer_exponential(N)
    assert list(graph_copies(ope)) == [0, 1, 2]
    assert list(graph_copies(ope, "shared")) == [0, 0, 0]
    assert list(graph_copies(tp.directed_ring(N))) == [0]
    rd0, rd1 = tp.random_directed(N, 0.35, seed=0), tp.random_directed(N, 0.35, seed=1)
    assert list(graph_copies(tp.schedule([rd0, rd1, rd0]))) == [0, 1, 0]


@pytest.mark.parametrize("factory", [sparse_push, scsp])
def test_hyperparameter_errors(factory):
    topo = TOPOLOGIES["one_peer_exponential"]()
    for fraction in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="fraction"):
            factory(topo, fraction=fraction)
    for k in (0, -3):
        with pytest.raises(ValueError, match="k="):
            factory(topo, k=k)
    with pytest.raises(ValueError, match="exactly one of fraction= or k="):
        factory(topo)
    with pytest.raises(ValueError, match="exactly one of fraction= or k="):
        factory(topo, fraction=0.1, k=2)
    for gamma in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="gamma"):
            factory(topo, fraction=0.1, gamma=gamma)
    with pytest.raises(ValueError, match="public_copies"):
        factory(topo, fraction=0.1, public_copies="global")
    with pytest.raises(ValueError, match="index_bits"):
        factory(topo, fraction=0.1, index_bits=0)
