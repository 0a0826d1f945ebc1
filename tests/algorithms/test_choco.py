"""Tests for jaxgossip.algorithms.choco (Choco-Gossip): a per-node NumPy reference, the reduction to
gossip, mean preservation, convergence, validation, and the ResNet-20 traffic table of
docs/training.md (section training recipes and models; its gossip and DeepSqueeze rows included).
DeepSqueeze's own tests: test_deepsqueeze.py; the validation both share: _reference.py."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import (
    NP_COMPRESSORS,
    assert_identity_compressor_is_gossip,
    assert_tree_close,
    check_compressed_gossip_validation,
    compressed_gossip_graphs,
    consensus_error_ratio,
    node_normal,
    np_out_degree,
    np_top_k_message,
    resnet20_tree,
    run_rounds,
    split_keys,
)

import jaxgossip as jg
from jaxgossip import algorithms
from jaxgossip.algorithms.choco import ChocoState, choco

N = 8
SHAPES = {"w": (4, 5), "b": (3,)}


# ---------------------------------------------------------------- NumPy reference (per node, per leaf)


def _np_choco(topo, x0, gamma, comp, num_rounds):
    """Choco-Gossip (docs/algorithms.md, section choco) with explicit loops over nodes and neighbours."""
    x = {k: v.astype(np.float64) for k, v in x0.items()}
    x_hat = {k: np.zeros_like(v) for k, v in x.items()}
    s = {k: np.zeros_like(v) for k, v in x.items()}
    bits = []
    for t in range(num_rounds):
        w = topo.matrix(t)
        round_bits = np.zeros(N)
        for name in x:
            q = np.zeros_like(x[name])
            for i in range(N):
                q[i], b = comp(x[name][i] - x_hat[name][i])
                round_bits[i] += b
            for i in range(N):
                x_hat[name][i] += q[i]
                for j in range(N):
                    s[name][i] += w[i, j] * q[j]
            for i in range(N):
                x[name][i] += gamma * (s[name][i] - x_hat[name][i])
        bits.append(round_bits * np_out_degree(w))
    return x, x_hat, s, np.stack(bits)


TOPOLOGIES = compressed_gossip_graphs()


@pytest.mark.parametrize("comp_name", ["top_k", "sign"])
@pytest.mark.parametrize("topo_name", ["ring", "torus", "exponential"])
def test_choco_matches_numpy_reference(topo_name, comp_name):
    topo = TOPOLOGIES[topo_name]()
    np_comp, (name, options) = NP_COMPRESSORS[comp_name]
    gamma, num_rounds = 0.3, 6
    x0 = node_normal(N, SHAPES, 1)
    x, state, bits = run_rounds(
        choco(topo, gamma=gamma, compressor=name, compressor_options=options), x0, split_keys(num_rounds)
    )
    ref_x, ref_x_hat, ref_s, ref_bits = _np_choco(topo, x0, gamma, np_comp, num_rounds)
    assert_tree_close(x, ref_x)
    assert_tree_close(state.x_hat, ref_x_hat)
    assert_tree_close(state.s, ref_s)
    np.testing.assert_array_equal(bits, ref_bits)
    assert int(state.count) == num_rounds


def test_hand_counted_bits_per_message():
    # top_k(0.25): w has 20 entries -> 5 kept, 5-bit indices; b has 3 -> 1 kept, 2-bit index.
    assert np_top_k_message(np.ones(20), 0.25)[1] + np_top_k_message(np.ones(3), 0.25)[1] == 5 * 37 + 1 * 34
    _, _, bits = run_rounds(
        choco(jg.topology.ring(N), gamma=0.3, compressor="top_k", compressor_options={"fraction": 0.25}),
        node_normal(N, SHAPES),
        split_keys(1),
    )
    np.testing.assert_array_equal(bits[0], np.full(N, 2 * (5 * 37 + 34)))


# ---------------------------------------------------------------- reductions to exact gossip


@pytest.mark.parametrize("factory", [choco])
@pytest.mark.parametrize("gamma", [1.0, 0.7])
def test_identity_compressor_reduces_to_gossip(factory, gamma):
    # q = x - x_hat, so x_hat = x and s = W x, giving x + gamma (W x - x).
    assert_identity_compressor_is_gossip(factory, gamma, N, SHAPES)


def test_choco_identity_is_gossip_through_the_registry_on_the_exponential_graph():
    topo = jg.topology.exponential(N)
    x0 = node_normal(N, SHAPES, 4)
    x, _, _ = run_rounds(algorithms.make("choco", topo, compressor="identity", gamma=1.0), x0, split_keys(5))
    ref, _, _ = run_rounds(algorithms.make("gossip", topo), x0, split_keys(5))
    assert_tree_close(x, ref)


# ---------------------------------------------------------------- invariants


COMPRESSORS = [
    ("top_k", {"fraction": 0.1}),
    ("sign", {}),
    ("random_k", {"k": 2}),
    ("qsgd", {"levels": 4, "rescale": True}),
]


@pytest.mark.parametrize("compressor, options", COMPRESSORS)
def test_choco_preserves_the_node_mean_and_s_equals_w_x_hat(compressor, options):
    # sum_i x_i changes by gamma sum_i (s_i - x_hat_i). Starting from s = x_hat = 0 and adding W q
    # to s and q to x_hat, column sums of 1 give sum_i s_i = sum_i x_hat_i after every round; for a
    # static W, s = W x_hat exactly.
    topo = jg.topology.torus(2, 4)
    x0 = node_normal(N, SHAPES, 5)
    x, state, _ = run_rounds(
        choco(topo, gamma=0.4, compressor=compressor, compressor_options=options), x0, split_keys(12)
    )
    assert_tree_close(jg.node_mean(x), jg.node_mean(x0))
    assert_tree_close(jax.tree.map(lambda v: v.sum(0), state.s), jax.tree.map(lambda v: v.sum(0), state.x_hat))
    assert_tree_close(state.s, jg.mix(topo, state.x_hat))


# ---------------------------------------------------------------- convergence (consensus only)


@pytest.mark.parametrize("compressor, options", [("top_k", {"fraction": 0.1}), ("sign", {})])
def test_choco_converges_to_the_average_on_the_ring(compressor, options):
    alg = choco(jg.topology.ring(N), gamma=0.1, compressor=compressor, compressor_options=options)
    assert consensus_error_ratio(alg, node_normal(N, SHAPES, 7)) < 1e-4


def test_gamma_is_sweepable_under_vmap():
    topo = jg.topology.ring(N)
    x0 = jax.tree.map(jnp.asarray, node_normal(N, SHAPES, 8))
    gammas = jnp.asarray([0.1, 0.3])

    def run(gamma):
        alg = choco(topo, gamma=gamma, compressor="sign")
        x, state = x0, alg.init(x0)
        for key in split_keys(3):
            x, state, _ = alg.step(x, state, key)
        return x

    swept = jax.jit(jax.vmap(run))(gammas)
    for i, gamma in enumerate([0.1, 0.3]):
        single, _, _ = run_rounds(choco(topo, gamma=gamma, compressor="sign"), x0, split_keys(3))
        assert_tree_close(jax.tree.map(lambda v: v[i], swept), single)


# ---------------------------------------------------------------- ResNet-20 traffic
# docs/training.md, section training recipes and models


def test_resnet20_tree_has_the_reference_sizes():
    tree = resnet20_tree(1)
    leaves = jax.tree.leaves(tree)
    vectors = [leaf for leaf in leaves if leaf.ndim == 2]
    assert len(leaves) == 65 and len(vectors) == 43
    assert sum(leaf.size for leaf in leaves) == 272_474
    assert sum(leaf.size for leaf in vectors) == 1_578


@pytest.mark.parametrize(
    "name, hyperparameters, bits_per_message, megabytes",
    [
        ("gossip", {}, 272_474 * 32, 106.8),
        ("choco", {"compressor": "sign", "gamma": 0.45}, 272_474 + 65 * 32, 3.36),
        # top-1 % per tensor, max(1, floor(0.01 d)) entries: 2,703 in the matrices + 43 vectors x 1.
        ("choco", {"compressor": {"name": "top_k", "fraction": 0.01, "index_bits": 64}}, 2_746 * 96, 3.23),
        ("deepsqueeze", {"compressor": "sign", "gamma": 0.01}, 272_474 + 65 * 32, 3.36),
    ],
)
def test_resnet20_traffic_per_worker_per_epoch_on_the_8_ring(name, hyperparameters, bits_per_message, megabytes):
    alg = algorithms.make(name, jg.topology.ring(8), **hyperparameters)
    tree = resnet20_tree(8)
    bits = jax.jit(lambda x, s, k: alg.step(x, s, k)[2].bits)(tree, alg.init(tree), jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(bits), np.full(8, 2 * bits_per_message, np.float32))
    per_epoch_mb = float(bits[0]) * 49 / 8 / 1e6  # 49 rounds per epoch, 1 MB = 1e6 bytes
    assert per_epoch_mb == pytest.approx(megabytes, rel=0.01)


def test_top_1_percent_keeps_2746_entries_in_resnet20():
    kept = sum(max(1, math.floor(0.01 * leaf.size)) for leaf in jax.tree.leaves(resnet20_tree(1)))
    assert kept == 2_746


# ---------------------------------------------------------------- state and validation


def test_states_have_the_documented_fields():
    x0 = jax.tree.map(jnp.asarray, node_normal(N, SHAPES))
    state = choco(jg.topology.ring(N)).init(x0)
    assert isinstance(state, ChocoState) and state.count.dtype == jnp.int32
    assert_tree_close(state.x_hat, jax.tree.map(jnp.zeros_like, x0))
    assert_tree_close(state.s, jax.tree.map(jnp.zeros_like, x0))


@pytest.mark.parametrize("factory, label", [(choco, "choco")])
def test_validation_errors(factory, label):
    check_compressed_gossip_validation(factory, label)


def test_choco_rejects_time_varying_graphs():
    with pytest.raises(ValueError, match=r"choco needs a static topology \(period T = 1\).*T = 3"):
        choco(jg.topology.one_peer_exponential(N))
    with pytest.raises(TypeError, match="does not take"):
        algorithms.make("choco", jg.topology.ring(N), fraction=0.1)
