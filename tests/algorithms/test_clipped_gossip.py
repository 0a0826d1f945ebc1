"""ClippedGossip, coordinate-wise trimmed mean and median: NumPy per-node references of one round,
the reduction to gossip without clipping, bits, and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import flat, irregular_graph, ref_clipped, ref_median, ref_trimmed

import jaxgossip as jg
from jaxgossip import algorithms
from jaxgossip import topology as T
from jaxgossip.algorithms.clipped_gossip import adaptive_tau


def models(n=10, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "w": jnp.asarray(rng.standard_normal((n, 3, 2)), jnp.float32),
        "b": jnp.asarray(rng.standard_normal((n, 4)), jnp.float32),
    }


def one_round(alg, x, t_rounds=1, seed=0):
    state = alg.init(x)
    step = jax.jit(alg.step)
    outs = []
    for r in range(t_rounds):
        x, state, info = step(x, state, jax.random.key(seed + r))
        outs.append((x, info))
    return outs


CASES = [
    ("clipped_gossip", {}, lambda w, x: ref_clipped(w, x)),
    ("clipped_gossip", {"num_clipped": 2}, lambda w, x: ref_clipped(w, x, num_clipped=2)),
    ("clipped_gossip", {"tau": 0.7}, lambda w, x: ref_clipped(w, x, tau=0.7)),
    ("trimmed_mean", {}, lambda w, x: ref_trimmed(w, x, trim=1)),
    ("trimmed_mean", {"trim": 2}, lambda w, x: ref_trimmed(w, x, trim=2)),
    ("trimmed_mean", {"trim": 0}, lambda w, x: ref_trimmed(w, x, trim=0)),
    ("median", {}, lambda w, x: ref_median(w, x)),
]


@pytest.mark.parametrize("name,options,ref", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_one_round_matches_the_numpy_reference_on_an_irregular_graph(name, options, ref):
    topo = irregular_graph()
    x = models()
    ((y, info),) = one_round(algorithms.make(name, topo, **options), x)
    want = ref(topo.matrix(), flat(x))
    np.testing.assert_allclose(flat(y), want, rtol=1e-5, atol=1e-5)
    # one model per directed edge, as gossip
    d_bits = 32 * (3 * 2 + 4)
    np.testing.assert_array_equal(np.asarray(info.bits), topo.out_degree[0] * d_bits)


@pytest.mark.parametrize("name,options,ref", CASES[:1] + CASES[3:4] + CASES[6:], ids=["clipped", "trimmed", "median"])
def test_time_varying_graph_uses_round_t(name, options, ref):
    topo = T.schedule([T.ring(8), T.hypercube(8)])
    x = models(8, seed=1)
    outs = one_round(algorithms.make(name, topo, **options), x, t_rounds=3)
    current = flat(x)
    for t, (y, _) in enumerate(outs):
        current = ref(topo.matrix(t), current)
        np.testing.assert_allclose(flat(y), current, rtol=1e-4, atol=1e-5)


def test_adaptive_tau_is_the_second_largest_distance_by_default():
    dist = jnp.asarray([[0.0, 3.0, 1.0, 2.0], [0.0, 5.0, 0.0, 0.0], [0.0, 4.0, 9.0, 0.0]])
    nbrs = jnp.asarray([[False, True, True, True], [False, True, False, False], [False, True, True, False]])
    np.testing.assert_allclose(adaptive_tau(dist, nbrs, 1), [2.0, 5.0, 4.0])
    np.testing.assert_allclose(adaptive_tau(dist, nbrs, 2), [1.0, 5.0, 4.0])
    assert np.isinf(adaptive_tau(dist, jnp.zeros_like(nbrs), 1)).all()


@pytest.mark.parametrize("topo", [T.torus(4, 4), irregular_graph(), T.schedule([T.ring(8), T.hypercube(8)])], ids=str)
def test_without_clipping_clipped_gossip_is_gossip_and_trim_0_on_uniform_weights_is_gossip(topo):
    n = topo.num_nodes
    x = models(n, seed=2)
    plain = one_round(algorithms.make("gossip", topo), x, t_rounds=4)
    clipped = one_round(algorithms.make("clipped_gossip", topo, tau=1e6), x, t_rounds=4)
    for (a, ia), (b, ib) in zip(plain, clipped):
        np.testing.assert_allclose(flat(b), flat(a), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(ia.bits), np.asarray(ib.bits))
    if topo.name.startswith("torus"):  # uniform weights 1/5: the unweighted mean is W x
        mean = one_round(algorithms.make("trimmed_mean", topo, trim=0), x, t_rounds=4)
        for (a, _), (b, _) in zip(plain, mean):
            np.testing.assert_allclose(flat(b), flat(a), rtol=1e-5, atol=1e-6)


def test_clipping_bounds_how_far_any_neighbour_pulls():
    topo = T.torus(4, 4)
    x = models(16, seed=3)
    far = jax.tree_util.tree_map(lambda leaf: leaf.at[5].add(1e3), x)  # node 5 far from the rest
    ((y, _),) = one_round(algorithms.make("clipped_gossip", topo, tau=0.5), far)
    moved = np.linalg.norm(flat(y) - flat(far), axis=1)
    # every node moves by at most sum_j W_ij tau = (4/5) * 0.5 (float32 rounding of |x| ~ 1e3)
    assert np.all(moved <= 0.4 + 1e-3), moved.max()
    # the far node's neighbours were pulled by exactly W tau = 0.1 towards it (plus their own moves)
    np.testing.assert_allclose(flat(y), ref_clipped(topo.matrix(), flat(far), tau=0.5), rtol=1e-5, atol=1e-3)


def test_fixed_tau_is_sweepable_under_vmap():
    topo = T.ring(8)
    x = models(8, seed=4)

    def run(tau):
        alg = algorithms.clipped_gossip(topo, tau=tau)
        y, _, _ = alg.step(x, alg.init(x), jax.random.key(0))
        return y

    taus = jnp.asarray([0.3, 5.0])
    batched = jax.jit(jax.vmap(run))(taus)
    for k, tau in enumerate([0.3, 5.0]):
        np.testing.assert_allclose(
            flat(jax.tree_util.tree_map(lambda leaf: leaf[k], batched)),
            ref_clipped(topo.matrix(), flat(x), tau=tau),
            rtol=1e-5,
            atol=1e-5,
        )


def test_bad_options_and_graphs_are_refused_with_a_clear_error():
    ring = T.ring(8)
    with pytest.raises(ValueError, match="tau=0"):
        algorithms.make("clipped_gossip", ring, tau=0.0)
    with pytest.raises(ValueError, match="num_clipped=0"):
        algorithms.make("clipped_gossip", ring, num_clipped=0)
    with pytest.raises(TypeError, match="num_clipped"):
        algorithms.make("clipped_gossip", ring, num_clipped=1.5)
    with pytest.raises(ValueError, match="trim=-1"):
        algorithms.make("trimmed_mean", ring, trim=-1)
    for name in ("clipped_gossip", "trimmed_mean", "median"):
        with pytest.raises(ValueError, match=f"{name} cannot run on the stochastic graph"):
            algorithms.make(name, T.random_matching(8))
        with pytest.raises(TypeError, match="Topology"):
            algorithms.make(name, np.eye(4))
    with pytest.raises(ValueError, match="doubly stochastic"):
        algorithms.make("clipped_gossip", T.random_directed(8, 0.4, 0))
    # the neighbourhood rules ignore the weights: a column-stochastic digraph is fine
    directed = T.random_directed(8, 0.4, 0)
    ((y, _),) = one_round(algorithms.make("median", directed), models(8))
    np.testing.assert_allclose(flat(y), ref_median(directed.matrix(), flat(models(8))), rtol=1e-6)


def test_metadata_says_the_messages_are_models():
    for name in ("gossip", "clipped_gossip", "trimmed_mean", "median"):
        assert algorithms.info(name).hooks.receive is not None
    for name in ("choco", "push_sum", "power_gossip"):
        assert algorithms.info(name).hooks.receive is None
    assert jg.algorithms.info("clipped_gossip").graph.stochastic_graphs == "none"
