"""Tests for Choco-Gossip and DeepSqueeze: per-node NumPy references, reductions to gossip,
mean preservation, convergence, the ResNet-20 traffic targets of ALGORITHMS.md 2.9, validation."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgossip as jg
from jaxgossip import algorithms, compress
from jaxgossip.algorithms.choco import ChocoState, choco
from jaxgossip.algorithms.deepsqueeze import DeepSqueezeState, deepsqueeze
from jaxgossip.compress import resolve_compressor

RTOL, ATOL = 1e-5, 1e-5
N = 8
SHAPES = {"w": (4, 5), "b": (3,)}


def _x0(seed=0):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal((N,) + shape).astype(np.float32) for name, shape in SHAPES.items()}


_KEYS = jax.random.split(jax.random.key(0), 32)  # one PRNG compile for the whole file


def _run(alg, x0, num_rounds):
    """Jitted rounds; returns (final x, final state, bits [num_rounds, N])."""
    step = jax.jit(alg.step)
    x = jax.tree.map(jnp.asarray, x0)
    state = alg.init(x)
    bits = []
    for key in _KEYS[:num_rounds]:
        x, state, info = step(x, state, key)
        bits.append(np.asarray(info.bits))
    return x, state, np.stack(bits)


def _assert_tree_close(a, b, rtol=RTOL, atol=ATOL):
    jax.tree.map(lambda u, v: np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=rtol, atol=atol), a, b)


# ---------------------------------------------------------------- NumPy references (per node, per leaf)


def _np_top_k(v, fraction):
    flat = v.reshape(-1)
    kept = max(1, math.floor(fraction * flat.size))
    idx = np.argsort(-np.abs(flat))[:kept]
    out = np.zeros_like(flat)
    out[idx] = flat[idx]
    return out.reshape(v.shape), kept * (32 + max(1, math.ceil(math.log2(flat.size))))


def _np_sign(v):
    return np.abs(v).sum() / v.size * np.sign(v), v.size + 32


_NP_COMPRESSORS = {
    "top_k": (lambda v: _np_top_k(v, 0.25), ("top_k", {"fraction": 0.25})),
    "sign": (_np_sign, ("sign", {})),
}


def _np_out_degree(w):
    off = (w != 0) & ~np.eye(w.shape[0], dtype=bool)
    return off.sum(axis=0)  # column j: receivers of sender j


def _np_choco(topo, x0, gamma, comp, num_rounds):
    """Choco-Gossip from ALGORITHMS.md 4.4 with explicit loops over nodes and neighbours."""
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
        bits.append(round_bits * _np_out_degree(w))
    return x, x_hat, s, np.stack(bits)


def _np_deepsqueeze(topo, x0, gamma, comp, num_rounds):
    """DeepSqueeze from ALGORITHMS.md 4.5 with explicit loops over nodes and neighbours."""
    x = {k: v.astype(np.float64) for k, v in x0.items()}
    delta = {k: np.zeros_like(v) for k, v in x.items()}
    bits = []
    for t in range(num_rounds):
        w = topo.matrix(t)
        round_bits = np.zeros(N)
        for name in x:
            c = np.zeros_like(x[name])
            for i in range(N):
                v = x[name][i] + delta[name][i]
                c[i], b = comp(v)
                delta[name][i] = v - c[i]
                round_bits[i] += b
            for i in range(N):
                x[name][i] += gamma * sum((w[i, j] - (i == j)) * c[j] for j in range(N))
        bits.append(round_bits * _np_out_degree(w))
    return x, delta, np.stack(bits)


TOPOLOGIES = {
    "ring": lambda: jg.topology.ring(N),
    "torus": lambda: jg.topology.torus(2, 4),  # side 2: merged double edges (weight 2/5)
    "exponential": lambda: jg.topology.exponential(N),  # directed, out-degree 3
}


@pytest.mark.parametrize("comp_name", ["top_k", "sign"])
@pytest.mark.parametrize("topo_name", ["ring", "torus", "exponential"])
def test_choco_matches_numpy_reference(topo_name, comp_name):
    topo = TOPOLOGIES[topo_name]()
    np_comp, (name, options) = _NP_COMPRESSORS[comp_name]
    gamma, num_rounds = 0.3, 6
    x0 = _x0(1)
    x, state, bits = _run(choco(topo, gamma=gamma, compressor=name, compressor_options=options), x0, num_rounds)
    ref_x, ref_x_hat, ref_s, ref_bits = _np_choco(topo, x0, gamma, np_comp, num_rounds)
    _assert_tree_close(x, ref_x)
    _assert_tree_close(state.x_hat, ref_x_hat)
    _assert_tree_close(state.s, ref_s)
    np.testing.assert_array_equal(bits, ref_bits)
    assert int(state.count) == num_rounds


@pytest.mark.parametrize(
    "comp_name, topo_name",
    [("top_k", "ring"), ("sign", "ring"), ("sign", "exponential"), ("top_k", "torus"), ("top_k", "one_peer")],
)
def test_deepsqueeze_matches_numpy_reference(topo_name, comp_name):
    topo = jg.topology.one_peer_exponential(N) if topo_name == "one_peer" else TOPOLOGIES[topo_name]()
    np_comp, (name, options) = _NP_COMPRESSORS[comp_name]
    gamma, num_rounds = 0.2, 6
    x0 = _x0(2)
    x, state, bits = _run(deepsqueeze(topo, gamma=gamma, compressor=name, compressor_options=options), x0, num_rounds)
    ref_x, ref_delta, ref_bits = _np_deepsqueeze(topo, x0, gamma, np_comp, num_rounds)
    _assert_tree_close(x, ref_x)
    _assert_tree_close(state.delta, ref_delta)
    np.testing.assert_array_equal(bits, ref_bits)


def test_hand_counted_bits_per_message():
    # top_k(0.25): w has 20 entries -> 5 kept, 5-bit indices; b has 3 -> 1 kept, 2-bit index.
    assert _np_top_k(np.ones(20), 0.25)[1] + _np_top_k(np.ones(3), 0.25)[1] == 5 * 37 + 1 * 34
    _, _, bits = _run(
        choco(jg.topology.ring(N), gamma=0.3, compressor="top_k", compressor_options={"fraction": 0.25}), _x0(), 1
    )
    np.testing.assert_array_equal(bits[0], np.full(N, 2 * (5 * 37 + 34)))
    _, _, bits = _run(deepsqueeze(jg.topology.exponential(N), gamma=0.3, compressor="sign"), _x0(), 1)
    np.testing.assert_array_equal(bits[0], np.full(N, 3 * ((20 + 32) + (3 + 32))))


# ---------------------------------------------------------------- reductions to exact gossip


@pytest.mark.parametrize("factory", [choco, deepsqueeze])
@pytest.mark.parametrize("gamma", [1.0, 0.7])
def test_identity_compressor_reduces_to_gossip(factory, gamma):
    # Choco: q = x - x_hat, so x_hat = x and s = W x, giving x + gamma (W x - x); DeepSqueeze: delta = 0.
    topo = jg.topology.ring(N)
    x0 = _x0(3)
    x, _, bits = _run(factory(topo, gamma=gamma), x0, 10)
    ref, _, ref_bits = _run(algorithms.make("gossip", topo, gamma=gamma), x0, 10)
    _assert_tree_close(x, ref)
    np.testing.assert_array_equal(bits, ref_bits)


def test_choco_identity_is_gossip_through_the_registry_on_the_exponential_graph():
    topo = jg.topology.exponential(N)
    x0 = _x0(4)
    x, _, _ = _run(algorithms.make("choco", topo, compressor="identity", gamma=1.0), x0, 5)
    ref, _, _ = _run(algorithms.make("gossip", topo), x0, 5)
    _assert_tree_close(x, ref)


# ---------------------------------------------------------------- invariants


# Contractive compressors (Choco's assumption); unbiased random-k at d/k = 10 makes Choco diverge,
# after which the mean is only preserved up to float32 cancellation in huge values.
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
    x0 = _x0(5)
    x, state, _ = _run(choco(topo, gamma=0.4, compressor=compressor, compressor_options=options), x0, 12)
    _assert_tree_close(jg.node_mean(x), jg.node_mean(x0))
    _assert_tree_close(jax.tree.map(lambda v: v.sum(0), state.s), jax.tree.map(lambda v: v.sum(0), state.x_hat))
    _assert_tree_close(state.s, jg.mix(topo, state.x_hat))


@pytest.mark.parametrize("compressor, options", [COMPRESSORS[1], COMPRESSORS[3]])
def test_deepsqueeze_preserves_the_node_mean(compressor, options):
    # sum_i x_i changes by gamma 1^T (W - I) c = 0 for column-stochastic W.
    x0 = _x0(6)
    alg = deepsqueeze(jg.topology.ring(N), gamma=0.4, compressor=compressor, compressor_options=options)
    x, _, _ = _run(alg, x0, 12)
    _assert_tree_close(jg.node_mean(x), jg.node_mean(x0))


# ---------------------------------------------------------------- convergence (consensus only)


def _error_ratio(alg, num_steps=300):
    result = jg.run_consensus(alg, jax.tree.map(jnp.asarray, _x0(7)), num_steps, jax.random.key(0))
    error = np.asarray(result.error)
    return error[-1] / error[0]


@pytest.mark.parametrize("compressor, options", [("top_k", {"fraction": 0.1}), ("sign", {})])
def test_choco_converges_to_the_average_on_the_ring(compressor, options):
    alg = choco(jg.topology.ring(N), gamma=0.1, compressor=compressor, compressor_options=options)
    assert _error_ratio(alg) < 1e-4


def test_deepsqueeze_reduces_the_consensus_error_with_small_gamma():
    # With a biased compressor DeepSqueeze stalls in a gamma-sized neighbourhood of the average
    # (measured: ~5e-4 of the initial error at gamma 0.05 after 1000 rounds), so only a reduction.
    alg = deepsqueeze(jg.topology.ring(N), gamma=0.05, compressor="sign")
    assert _error_ratio(alg) < 1e-2


def test_gamma_is_sweepable_under_vmap():
    topo = jg.topology.ring(N)
    x0 = jax.tree.map(jnp.asarray, _x0(8))
    gammas = jnp.asarray([0.1, 0.3])

    def run(gamma):
        alg = choco(topo, gamma=gamma, compressor="sign")
        x, state = x0, alg.init(x0)
        for key in _KEYS[:3]:
            x, state, _ = alg.step(x, state, key)
        return x

    swept = jax.jit(jax.vmap(run))(gammas)
    for i, gamma in enumerate([0.1, 0.3]):
        single, _, _ = _run(choco(topo, gamma=gamma, compressor="sign"), x0, 3)
        _assert_tree_close(jax.tree.map(lambda v: v[i], swept), single)


# ---------------------------------------------------------------- ResNet-20 traffic (ALGORITHMS.md 2.9)


def _resnet20_tree(num_nodes):
    """ResNet-20 (Choco variant, 1x1-conv downsample) parameter sizes as a stacked pytree.

    22 matrices (conv kernels viewed as [out, in * kh * kw]) and 43 vectors: 21 batch norms
    (after conv1; 2 per block in 9 blocks; one per downsample in stages 2 and 3), each with a
    weight and a bias, plus the fc bias.
    """
    matrices = [(16, 27)] + [(16, 144)] * 6 + [(32, 144), (32, 16)] + [(32, 288)] * 5
    matrices += [(64, 288), (64, 32)] + [(64, 576)] * 5 + [(10, 64)]
    bn_widths = [16] + [16] * 6 + [32] * 7 + [64] * 7
    vectors = [(c,) for c in bn_widths for _ in ("scale", "bias")] + [(10,)]
    shapes = matrices + vectors
    return {f"p{i:02d}": jnp.zeros((num_nodes,) + shape, jnp.float32) for i, shape in enumerate(shapes)}


def test_resnet20_tree_has_the_reference_sizes():
    tree = _resnet20_tree(1)
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
    tree = _resnet20_tree(8)
    bits = jax.jit(lambda x, s, k: alg.step(x, s, k)[2].bits)(tree, alg.init(tree), jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(bits), np.full(8, 2 * bits_per_message, np.float32))
    per_epoch_mb = float(bits[0]) * 49 / 8 / 1e6  # 49 rounds per epoch, 1 MB = 1e6 bytes
    assert per_epoch_mb == pytest.approx(megabytes, rel=0.01)


def test_top_1_percent_keeps_2746_entries_in_resnet20():
    kept = sum(max(1, math.floor(0.01 * leaf.size)) for leaf in jax.tree.leaves(_resnet20_tree(1)))
    assert kept == 2_746


# ---------------------------------------------------------------- compressor specs and validation


def test_compressor_spec_forms_are_equivalent():
    by_name = resolve_compressor("top_k", {"fraction": 0.5, "index_bits": 64})
    by_spec = resolve_compressor({"name": "top_k", "fraction": 0.5}, {"index_bits": 64})
    built = compress.top_k(fraction=0.5, index_bits=64)
    assert resolve_compressor(built) is built
    leaf = jnp.arange(10.0) - 4.5
    for comp in (by_name, by_spec):
        dense, bits = comp.apply(leaf, jax.random.key(0))
        ref_dense, ref_bits = built.apply(leaf, jax.random.key(0))
        np.testing.assert_array_equal(dense, ref_dense)
        assert float(bits) == float(ref_bits) == 5 * 96


def test_states_have_the_documented_fields():
    x0 = jax.tree.map(jnp.asarray, _x0())
    state = choco(jg.topology.ring(N)).init(x0)
    assert isinstance(state, ChocoState) and state.count.dtype == jnp.int32
    _assert_tree_close(state.x_hat, jax.tree.map(jnp.zeros_like, x0))
    _assert_tree_close(state.s, jax.tree.map(jnp.zeros_like, x0))
    state = deepsqueeze(jg.topology.ring(N)).init(x0)
    assert isinstance(state, DeepSqueezeState)
    _assert_tree_close(state.delta, jax.tree.map(jnp.zeros_like, x0))


def _column_only_topology():
    # Column stochastic but not row stochastic (push-sum weights on a path 0 - 1 - 2).
    adj = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]])
    return jg.topology.from_adjacency(adj, weights="column")


@pytest.mark.parametrize("factory, label", [(choco, "choco"), (deepsqueeze, "deepsqueeze")])
def test_validation_errors(factory, label):
    ring = jg.topology.ring(N)
    for bad in (0.0, -0.5):
        with pytest.raises(ValueError, match="gamma=.* must be > 0"):
            factory(ring, gamma=bad)
    with pytest.raises(ValueError, match="gamma=.* must be finite"):
        factory(ring, gamma=float("nan"))
    with pytest.raises(ValueError, match=f"{label} needs doubly stochastic mixing weights"):
        factory(_column_only_topology())
    with pytest.raises(TypeError, match=f"{label} needs a jaxgossip Topology"):
        factory(np.eye(3))
    with pytest.raises(ValueError, match=rf"{label}: unknown compressor 'nope'; known compressors: \['identity'"):
        factory(ring, compressor="nope")
    with pytest.raises(ValueError, match=f"{label}: unknown compressor"):
        factory(ring, compressor={"name": "nope"})
    with pytest.raises(ValueError, match="needs a 'name' key"):
        factory(ring, compressor={"fraction": 0.1})
    with pytest.raises(ValueError, match="only apply when the compressor is given by name"):
        factory(ring, compressor=compress.sign(), compressor_options={"k": 1})
    with pytest.raises(ValueError, match=r"option\(s\) \['k'\] given both"):
        factory(ring, compressor={"name": "top_k", "k": 1}, compressor_options={"k": 2})
    with pytest.raises(ValueError, match="top_k fraction=2.0 is out of range"):
        factory(ring, compressor="top_k", compressor_options={"fraction": 2.0})
    with pytest.raises(TypeError, match="compressor 'sign' does not take option"):
        factory(ring, compressor="sign", compressor_options={"fraction": 0.1})
    with pytest.raises(TypeError, match="compressor must be a Compressor, a name or a spec mapping"):
        factory(ring, compressor=3)
    with pytest.raises(TypeError, match="compressor_options must be a mapping"):
        factory(ring, compressor="top_k", compressor_options=[("k", 1)])
    with pytest.raises(ValueError, match="leading node axis of size N=8"):
        factory(ring).init({"w": jnp.zeros((3, 2))})


def test_choco_rejects_time_varying_graphs():
    with pytest.raises(ValueError, match=r"choco needs a static topology \(period T = 1\).*T = 3"):
        choco(jg.topology.one_peer_exponential(N))
    with pytest.raises(TypeError, match="does not take"):
        algorithms.make("choco", jg.topology.ring(N), fraction=0.1)
