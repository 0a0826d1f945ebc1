"""Tests for jaxgossip.engine.consensus with the core algorithms (gossip, allreduce): error curves, final
values and bit counts against a NumPy loop written here from docs/algorithms.md (sections gossip
and allreduce), a gamma sweep under vmap, and the algorithm-level validation errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import node_normal, to_jax

import jaxgossip as jg
from jaxgossip import algorithms
from jaxgossip import topology as T


def make_x0(n, seed=0):
    return to_jax(node_normal(n, {"a": (3, 2), "b": (4,)}, seed))


def flat(tree):
    leaves = jax.tree_util.tree_leaves(tree)
    return np.concatenate([np.asarray(leaf, np.float64).reshape(leaf.shape[0], -1) for leaf in leaves], 1)


def numpy_gossip(topo, x0, num_steps, gamma):
    """x_i <- x_i + gamma (sum_j W_ij(k) x_j - x_i); error = mean_i ||x_i - mean(x0)||^2; bits =
    32 D per (sender, receiver) message, self excluded, cumulative over all nodes."""
    x = flat(x0)
    n, d = x.shape
    mean0 = x.mean(0)
    errors = [((x - mean0) ** 2).sum() / n]
    bits = [0.0]
    for k in range(num_steps):
        w = topo.matrix(k)
        x = x + gamma * (w @ x - x)
        errors.append(((x - mean0) ** 2).sum() / n)
        messages = sum(1 for i in range(n) for j in range(n) if i != j and w[i, j] != 0)
        bits.append(bits[-1] + messages * 32 * d)
    return x, np.array(errors), np.array(bits)


CASES = [
    ("ring8", lambda: T.ring(8), 1.0),
    ("ring8_relaxed", lambda: T.ring(8), 1.308),
    ("ring8_optimal", lambda: T.ring(8), T.optimal_gamma(T.ring(8))),
    ("one_peer6", lambda: T.one_peer_exponential(6), 1.0),
    ("star7", lambda: T.star(7), 1.0),
    ("torus2x3_half", lambda: T.torus(2, 3), 0.5),
]


@pytest.mark.parametrize("name,build,gamma", CASES, ids=[c[0] for c in CASES])
def test_gossip_consensus_matches_numpy(name, build, gamma):
    topo = build()
    num_steps = 25
    x0 = make_x0(topo.num_nodes)
    result = jg.run_consensus(algorithms.make("gossip", topo, gamma=gamma), x0, num_steps, jax.random.key(0))
    x_ref, err_ref, bits_ref = numpy_gossip(topo, x0, num_steps, gamma)
    assert result.error.shape == (num_steps + 1,) and result.bits.shape == (num_steps + 1,)
    np.testing.assert_allclose(result.error, err_ref, rtol=1e-4, atol=1e-6 * err_ref[0])
    np.testing.assert_allclose(flat(result.x), x_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(result.bits, bits_ref)
    assert int(result.state.count) == num_steps
    assert result.error[-1] < 0.2 * result.error[0]
    # the node mean is preserved (doubly stochastic W)
    np.testing.assert_allclose(flat(result.x).mean(0), flat(x0).mean(0), atol=1e-5)


def test_gossip_bits_per_message():
    # ring: every node sends 32 D bits to 2 neighbours per round -> N * 2 * 32 D per round
    topo = T.ring(8)
    x0 = make_x0(8)
    d = 6 + 4
    result = jg.run_consensus(algorithms.make("gossip", topo), x0, 3, jax.random.key(0))
    np.testing.assert_array_equal(result.bits, [0, 8 * 2 * 32 * d, 2 * 8 * 2 * 32 * d, 3 * 8 * 2 * 32 * d])
    # per node per round (StepInfo): out-degree x 32 D; star(5): hub sends to 4 leaves, leaves to 1
    alg = algorithms.make("gossip", T.star(5))
    x = make_x0(5)
    _, _, info = jax.jit(alg.step)(x, alg.init(x), jax.random.key(0))
    np.testing.assert_array_equal(info.bits, np.array([4, 1, 1, 1, 1]) * 32 * d)
    # one-peer exponential: one message per node per round
    alg = algorithms.make("gossip", T.one_peer_exponential(8))
    _, _, info = alg.step(x0, alg.init(x0), jax.random.key(0))
    np.testing.assert_array_equal(info.bits, np.full(8, 32 * d))


def test_gossip_relaxation_beats_plain_on_ring8():
    topo = T.ring(8)
    x0 = make_x0(8, seed=1)
    plain = jg.run_consensus(algorithms.make("gossip", topo, gamma=1.0), x0, 40, jax.random.key(0))
    relaxed = jg.run_consensus(algorithms.make("gossip", topo, gamma=1.308), x0, 40, jax.random.key(0))
    assert relaxed.error[-1] < 0.1 * plain.error[-1]


def test_run_consensus_reports_every_nodes_bits():
    topo = T.star(5)  # irregular: the hub sends to 4 leaves, every leaf to the hub only
    x0 = make_x0(5, seed=4)
    d = 10
    result = jg.run_consensus(algorithms.make("gossip", topo), x0, 3, jax.random.key(0))
    assert result.node_bits.shape == (3, 5)
    expected = np.broadcast_to(topo.out_degree[0] * 32 * d, (3, 5))
    np.testing.assert_array_equal(np.asarray(result.node_bits), expected)
    np.testing.assert_array_equal(np.cumsum(np.asarray(result.node_bits).sum(axis=1)), result.bits[1:])


def test_allreduce_exact_in_one_step():
    topo = T.ring(8)
    x0 = make_x0(8, seed=2)
    d = 10
    result = jg.run_consensus(algorithms.make("allreduce", topo), x0, 3, jax.random.key(0))
    mean = flat(x0).mean(0)
    np.testing.assert_allclose(flat(result.x), np.broadcast_to(mean, (8, d)), rtol=1e-6, atol=1e-6)
    assert float(result.error[0]) == pytest.approx(((flat(x0) - mean) ** 2).sum() / 8, rel=1e-5)
    assert np.all(np.asarray(result.error[1:]) < 1e-10 * float(result.error[0]))
    # one full-model message (32 D bits) per node per round (docs/algorithms.md, section allreduce)
    np.testing.assert_array_equal(result.bits, np.arange(4) * 8 * 32 * d)
    # allreduce also accepts a bare node count
    alg = algorithms.allreduce(8)
    _, _, info = alg.step(x0, alg.init(x0), jax.random.key(0))
    np.testing.assert_array_equal(info.bits, np.full(8, 32 * d))


def test_consensus_scan_sweeps_gamma_under_vmap():
    topo = T.ring(6)
    x0 = make_x0(6, seed=3)
    gammas = jnp.array([0.5, 1.0, 1.3])

    def run(gamma):
        trace = jg.consensus_scan(algorithms.make("gossip", topo, gamma=gamma), x0, 10, jax.random.key(0))
        return trace.error, trace.round_bits, trace.x

    errors, bits, x = jax.jit(jax.vmap(run))(gammas)
    for i, gamma in enumerate([0.5, 1.0, 1.3]):
        x_ref, err_ref, bits_ref = numpy_gossip(topo, x0, 10, gamma)
        np.testing.assert_allclose(errors[i], err_ref, rtol=1e-4, atol=1e-6 * err_ref[0])
        np.testing.assert_allclose(flat(jax.tree_util.tree_map(lambda leaf: leaf[i], x)), x_ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(np.cumsum(bits[i]), bits_ref[1:])


def test_run_consensus_single_leaf_and_key_independence():
    topo = T.one_peer_exponential(8)
    x0 = jnp.asarray(np.random.default_rng(4).normal(size=(8, 5)), jnp.float32)
    a = jg.run_consensus(algorithms.make("gossip", topo), x0, 3, jax.random.key(0))
    b = jg.run_consensus(algorithms.make("gossip", topo), x0, 3, jax.random.key(1))
    np.testing.assert_array_equal(a.x, b.x)  # exact gossip uses no randomness
    np.testing.assert_allclose(a.x, np.broadcast_to(np.asarray(x0).mean(0), (8, 5)), atol=1e-5)
    assert float(a.error[3]) < 1e-10


# ---------------------------------------------------------------- validation errors


def test_run_consensus_rejects_bad_num_steps():
    alg = algorithms.make("gossip", T.ring(4))
    x0 = make_x0(4)
    for bad in (0, -3, 2.0, True, None):
        with pytest.raises(ValueError, match="num_steps=.* must be a positive int"):
            jg.run_consensus(alg, x0, bad, jax.random.key(0))


def test_gossip_needs_doubly_stochastic():
    with pytest.raises(ValueError, match="gossip needs doubly stochastic mixing weights"):
        algorithms.make("gossip", T.random_directed(8, 0.4, 0))
    with pytest.raises(ValueError, match="doubly stochastic"):
        algorithms.gossip(T.from_adjacency(np.array([[0, 1, 1], [1, 0, 0], [1, 0, 0]]), weights="column"))
    with pytest.raises(TypeError, match="needs a jaxgossip Topology"):
        algorithms.gossip(np.eye(4))


@pytest.mark.parametrize("gamma", [0, 0.0, -1.0, float("nan"), float("inf"), np.array([0.5, -0.1])])
def test_gossip_gamma_must_be_positive(gamma):
    with pytest.raises(ValueError, match="gamma=.*must be"):
        algorithms.make("gossip", T.ring(4), gamma=gamma)


def test_unknown_algorithm_lists_known_ones():
    with pytest.raises(ValueError, match=r"unknown algorithm 'gosip'; known algorithms: \[.*'allreduce'.*'gossip'"):
        algorithms.make("gosip", T.ring(4))


def test_unknown_hyperparameter():
    with pytest.raises(TypeError, match=r"algorithm 'gossip' does not take \['lr'\]; it takes \['gamma'\]"):
        algorithms.make("gossip", T.ring(4), lr=0.1)
    with pytest.raises(TypeError, match="does not take"):
        algorithms.make("allreduce", T.ring(4), gamma=1.0)


@pytest.mark.parametrize("name", ["gossip", "allreduce"])
def test_init_rejects_bad_params(name):
    alg = algorithms.make(name, T.ring(8))
    with pytest.raises(ValueError, match=r"leaf \['b'\] has shape \(4, 3\).*N=8"):
        alg.init({"a": jnp.ones((8, 2)), "b": jnp.ones((4, 3))})
    with pytest.raises(TypeError, match="floating"):
        alg.init({"a": jnp.ones((8, 2), jnp.int32)})
    with pytest.raises(ValueError, match="empty pytree"):
        alg.init({})
