"""SPARTA against a NumPy per-node loop, its reduction to gossip at p = 1, the kept node mean, the
bit rule, the shared mask, sweeps over p, Byzantine messages and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import flat, in_neighbours, irregular_graph, node_normal, read_json, ref_gossip, run_main, to_jax

import jaxgossip as jg
from jaxgossip import algorithms
from jaxgossip import topology as T
from jaxgossip.algorithms.sparta import SEED_BITS, sparta_mask
from jaxgossip.ops.precision import with_message_dtype

N = 8
SHAPES = {"w": (6, 5), "b": (7,)}


def x0(seed=0, n=N):
    return to_jax(node_normal(n, SHAPES, seed))


def flat_mask(mask):
    """[D] bool: one node's mask in the order of :func:`flat`."""
    return np.concatenate([np.asarray(m).reshape(-1) for m in jax.tree_util.tree_leaves(mask)])


def np_sparta(w, x, m, gamma):
    """Per node and coordinate: x_id + gamma (sum_j W_ij x_jd - x_id) where m_d, else x_id (float64)."""
    out = x.copy()
    for i in range(x.shape[0]):
        for d in range(x.shape[1]):
            if m[d]:
                avg = w[i, i] * x[i, d] + sum(w[i, j] * x[j, d] for j in in_neighbours(w, i))
                out[i, d] = x[i, d] + gamma * (avg - x[i, d])
    return out


def np_bits(w, m, value_bits=32):
    """[N] bits: one message per out-neighbour, the selected values plus the seed."""
    out_degree = np.array([sum(1 for i in range(w.shape[0]) if i != j and w[i, j] != 0) for j in range(w.shape[0])])
    return out_degree * (int(m.sum()) * value_bits + SEED_BITS)


@pytest.mark.parametrize(
    "topo,fraction,gamma",
    [(T.ring(N), 0.3, 1.0), (T.one_peer_exponential(N), 0.5, 1.0), (T.torus(2, 4), 0.2, 1.3)],
    ids=["ring", "one_peer_exponential", "torus_gamma1.3"],
)
def test_rounds_match_the_numpy_per_node_loop(topo, fraction, gamma):
    alg = algorithms.make("sparta", topo, fraction=fraction, gamma=gamma)
    x = x0(1)
    state = alg.init(x)
    step = jax.jit(alg.step)
    ref = flat(x)
    for t, key in enumerate(jg.rounds.round_keys(jax.random.key(3), 5)):
        m = flat_mask(sparta_mask(key, x, fraction))
        assert 0 < m.sum() < m.size
        x, state, info = step(x, state, key)
        ref = np_sparta(topo.matrix(t), ref, m, gamma)
        np.testing.assert_allclose(flat(x), ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(np.asarray(info.bits), np_bits(topo.matrix(t), m))
    assert int(state.count) == 5


@pytest.mark.parametrize(
    "topo,gamma",
    [(T.ring(N), 1.0), (T.exponential(N), 1.3084), (T.random_matching(N), 1.0)],
    ids=["ring", "exponential_gamma", "random_matching"],
)
def test_fraction_one_is_gossip_bit_for_bit(topo, gamma):
    a = jg.run_consensus(algorithms.make("sparta", topo, fraction=1.0, gamma=gamma), x0(2), 6, jax.random.key(5))
    b = jg.run_consensus(algorithms.make("gossip", topo, gamma=gamma), x0(2), 6, jax.random.key(5))
    for u, v in zip(jax.tree_util.tree_leaves(a.x), jax.tree_util.tree_leaves(b.x)):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
    np.testing.assert_array_equal(np.asarray(a.error), np.asarray(b.error))
    # the same values on the wire, plus the mask's seed per message
    extra = np.diff(np.asarray(a.bits)) - np.diff(np.asarray(b.bits))
    if topo.stochastic:
        assert np.all(extra >= 0) and np.all(extra % SEED_BITS == 0)
    else:
        np.testing.assert_array_equal(extra, np.sum(topo.out_degree[0]) * SEED_BITS)


def test_node_mean_is_kept_and_unselected_coordinates_stay_local():
    topo = T.erdos_renyi(N, 0.4, seed=1)  # Metropolis weights: doubly stochastic, not uniform
    alg = algorithms.make("sparta", topo, fraction=0.1)
    x = x0(3)
    mean0 = flat(x).mean(0)
    state = alg.init(x)
    step = jax.jit(alg.step)
    for key in jg.rounds.round_keys(jax.random.key(0), 20):
        m = flat_mask(sparta_mask(key, x, 0.1))
        before = flat(x)
        x, state, _ = step(x, state, key)
        after = flat(x)
        np.testing.assert_array_equal(after[:, ~m], before[:, ~m])
    np.testing.assert_allclose(flat(x).mean(0), mean0, rtol=0, atol=2e-6)


def test_mask_is_shared_by_all_nodes_is_new_each_round_and_has_fraction_p():
    x = {"w": jnp.zeros((N, 200, 100), jnp.float32), "b": jnp.zeros((N, 50), jnp.float32)}
    keys = jg.rounds.round_keys(jax.random.key(0), 2)
    masks = [sparta_mask(k, x, 0.05) for k in keys]
    for mask in masks:
        for leaf, m in zip(jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(mask)):
            assert m.shape == (1,) + leaf.shape[1:]  # one mask, broadcast over the nodes
    a, b = flat_mask(masks[0]), flat_mask(masks[1])
    d = a.size
    # Binomial(D, p): mean p D = 1002.5, std ~ 30.8; 5 sigma either way
    assert abs(a.sum() - 0.05 * d) < 5 * np.sqrt(d * 0.05 * 0.95)
    assert (a & b).sum() < 0.1 * a.sum()  # independent draws overlap in about p of the entries


def test_bits_count_message_width_values_and_the_seed():
    topo = T.ring(N)
    x = x0(4)
    key = jax.random.key(9)
    m = flat_mask(sparta_mask(key, x, 0.4))
    bf16 = with_message_dtype(algorithms.make("sparta", topo, fraction=0.4), "bf16")
    _, _, info = bf16.step(x, bf16.init(x), key)
    np.testing.assert_array_equal(np.asarray(info.bits), np_bits(topo.matrix(), m, value_bits=16))


def test_fraction_sweeps_in_one_compile():
    topo = T.ring(N)
    x = x0(5)
    keys = jnp.stack([jax.random.key(0)])
    points, error, bits = jg.sweep_consensus(
        lambda fraction: algorithms.make("sparta", topo, fraction=fraction), x, 10, keys, fraction=[0.1, 0.5, 1.0]
    )
    for g, p in enumerate(np.asarray(points["fraction"])):
        one = jg.run_consensus(algorithms.make("sparta", topo, fraction=float(p)), x, 10, keys[0])
        np.testing.assert_allclose(np.asarray(error[g, 0]), np.asarray(one.error), rtol=1e-5)
        np.testing.assert_array_equal(np.cumsum(np.asarray(bits[g, 0], np.float64)), np.asarray(one.bits)[1:])
    # more coordinates averaged per round: faster consensus, more bits
    order = np.argsort(np.asarray(points["fraction"]))
    assert np.all(np.diff(np.asarray(error[order, 0, -1])) < 0)
    assert np.all(np.diff(np.asarray(bits[order, 0]).sum(-1)) > 0)


def test_byzantine_messages_enter_only_on_the_selected_coordinates():
    topo = irregular_graph()
    ids = [3, 6]
    rng = np.random.default_rng(0)
    x = {"w": jnp.asarray(rng.standard_normal((10, 2, 3)), jnp.float32)}
    alg = algorithms.byzantine("sparta", topo, "signflip", ids=ids, options={"fraction": 0.5})
    key = jax.random.key(2)
    y, _, _ = jax.jit(alg.step)(x, alg.init(x), key)
    w, xf = topo.matrix(), flat(x)
    msgs = {(j, i): -xf[j] for i in range(10) if i not in ids for j in in_neighbours(w, i) if j in ids}
    m = flat_mask(sparta_mask(key, x, 0.5))
    want = np.where(m[None, :], ref_gossip(w, xf, msgs), xf)
    np.testing.assert_allclose(flat(y), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("fraction", [0, -0.1, 1.5, float("nan"), float("inf")])
def test_bad_fraction_is_refused_naming_it(fraction):
    with pytest.raises(ValueError, match="fraction="):
        algorithms.make("sparta", T.ring(N), fraction=fraction)


def test_a_graph_that_is_not_doubly_stochastic_is_refused():
    column = T.from_adjacency(np.array([[0, 1, 1], [1, 0, 0], [1, 0, 0]]), weights="column")
    with pytest.raises(ValueError, match="sparta needs doubly stochastic"):
        algorithms.make("sparta", column)


@pytest.mark.parametrize("value", ["0", "1.5", "nan"])
def test_cli_refuses_a_bad_fraction_with_exit_2_naming_it(value, tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = run_main(
        capsys, "train", "--algorithm=sparta", f"--algorithm_options.fraction={value}", "--out", str(out)
    )
    assert code == 2 and "Traceback" not in err, err
    assert "fraction" in err and err.strip().count("\n") == 0, err
    assert not out.exists()


def test_cli_trains_digits_with_a_tenth_of_the_model_per_round(tmp_path, capsys):
    out = tmp_path / "run"
    argv = [
        "--dataset=digits",
        "--model=mlp",
        "--topology=ring",
        "--num_nodes=8",
        "--num_rounds=40",
        "--eval_every=20",
        "--no-progress",
    ]
    code, _, err = run_main(
        capsys, "train", "--algorithm=sparta", "--algorithm_options.fraction=0.1", *argv, "--out", str(out)
    )
    assert code == 0, err
    payload = read_json(out / "metrics.json")
    assert payload["rows"][-1]["test_acc"] > 0.8
    # about a tenth of the model per message (plus a seed): about a tenth of gossip's bits
    gossip_bits = 40 * 2 * 32 * payload["num_params"]  # the ring: two out-neighbours
    assert 0.09 < payload["rows"][-1]["bits_mean"] / gossip_bits < 0.11
