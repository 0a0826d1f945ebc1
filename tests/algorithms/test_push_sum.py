"""Tests for jaxgossip.algorithms.push_sum (SGP) against a NumPy per-node loop written from the
equations of docs/algorithms.md, section push_sum: invariants, convergence on directed graphs, bit
counts, errors, and the registry / column-stochastic contract shared by the push-sum family
(push_sum, sparse_push, scsp)."""

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
    node_average,
    node_sums,
    np_push_sum,
    push_x0,
    row_stochastic_only,
    run_rounds,
    to_jax,
    weighted_digraph,
)

from jaxgossip import topology as tp
from jaxgossip.algorithms import REGISTRY, make
from jaxgossip.algorithms.push_sum import push_sum
from jaxgossip.engine.consensus import run_consensus
from jaxgossip.ops.mixing import consensus_distance

RTOL, ATOL = 1e-4, 1e-5
TOPOLOGIES = column_stochastic_graphs(N)


@pytest.mark.parametrize("name", ["one_peer_exponential", "random_directed", "directed_ring"])
def test_push_sum_matches_numpy_loop(name):
    topo = TOPOLOGIES[name]()
    x0 = push_x0(1)
    x, state, bits = run_rounds(push_sum(topo), x0, fold_in_keys(7))
    ref_x, ref_w, ref_bits = np_push_sum(topo, x0, 7)
    assert_tree_close(x, ref_x, RTOL, ATOL)
    np.testing.assert_allclose(np.asarray(state.w), ref_w, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(bits, ref_bits)
    assert int(state.count) == 7
    # debias is x / w, leaf by leaf
    z = push_sum(topo).debias(x, state)
    assert_tree_close(z, {k: ref_x[k] / ref_w.reshape((N,) + (1,) * len(s)) for k, s in SHAPES.items()}, RTOL, ATOL)


def test_push_sum_conserves_mass_on_time_varying_digraph():
    topo = TOPOLOGIES["schedule"]()
    x0 = push_x0(2)
    x, state, _ = run_rounds(push_sum(topo), x0, fold_in_keys(9))
    for k, total in node_sums(x0).items():
        np.testing.assert_allclose(node_sums(x)[k], total, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(jnp.sum(state.w)), N, rtol=1e-6)


def test_push_sum_on_irregular_digraph_has_weights_but_debias_reaches_average():
    topo = TOPOLOGIES["random_directed"]()
    assert not topo.is_doubly_stochastic
    x0 = push_x0(3)
    alg = push_sum(topo)
    res = run_consensus(alg, to_jax(x0), 150, jax.random.key(0))
    assert float(jnp.max(jnp.abs(res.state.w - 1.0))) > 0.05  # the weights really de-bias
    raw_error = float(consensus_distance(res.x, {k: jnp.asarray(v) for k, v in node_average(x0).items()}))
    assert raw_error > 1e-2  # the numerators alone are not the average ...
    assert debias_error(alg, res.x, res.state, x0) < 1e-4  # ... but x / w is


@pytest.mark.parametrize("name", ["schedule", "weighted_digraph"])
def test_push_sum_converges_on_directed_graphs(name):
    topo = TOPOLOGIES["schedule"]() if name == "schedule" else weighted_digraph(N, 5)
    x0 = push_x0(4)
    alg = make("push_sum", topo)
    res = run_consensus(alg, to_jax(x0), 150, jax.random.key(0))
    assert debias_error(alg, res.x, res.state, x0) < 1e-4
    assert float(res.error[-1]) < 1e-6 * float(res.error[0])


def test_push_sum_weight_bits_option():
    d = 17
    x0 = to_jax(push_x0())
    ring = tp.directed_ring(N)  # doubly stochastic: w stays 1, SGP does not send it
    _, _, info = push_sum(ring, weight_bits="auto").step(x0, push_sum(ring).init(x0), jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(info.bits), np.full(N, 32 * d))
    _, _, info = push_sum(ring).step(x0, push_sum(ring).init(x0), jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(info.bits), np.full(N, 32 * d + 32))
    rd = TOPOLOGIES["random_directed"]()  # weights must travel here, "auto" still counts them
    _, _, info = push_sum(rd, weight_bits="auto").step(x0, push_sum(rd).init(x0), jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(info.bits), rd.out_degree[0] * (32 * d + 32))


def test_registry_entries():
    topo = TOPOLOGIES["one_peer_exponential"]()
    for name in ("push_sum", "sparse_push", "scsp"):
        assert name in REGISTRY
    assert make("push_sum", topo).name == "push_sum"
    assert make("sparse_push", topo, fraction=0.1).name == "sparse_push"
    assert make("scsp", topo, k=2, compensation=False).name == "scsp"


@pytest.mark.parametrize("name", ["push_sum", "sparse_push", "scsp"])
def test_column_stochastic_required(name):
    kw = {} if name == "push_sum" else {"fraction": 0.5}
    with pytest.raises(ValueError, match="column-stochastic"):
        make(name, row_stochastic_only(), **kw)


def test_push_sum_specific_errors():
    topo = TOPOLOGIES["one_peer_exponential"]()
    with pytest.raises(ValueError, match="weight_bits"):
        push_sum(topo, weight_bits="never")
    with pytest.raises(TypeError, match="Topology"):
        push_sum(np.eye(3))
