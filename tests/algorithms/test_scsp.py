"""Tests for jaxgossip.algorithms.scsp against the NumPy Sparse-Push loop with the residual-adaptive
budget of docs/algorithms.md, section scsp: the reduction to sparse_push, compensation, convergence,
vmap sweeps over gamma and the target residual, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import PUSH_N as N
from _reference import (
    assert_tree_close,
    column_stochastic_graphs,
    debias_error,
    fold_in_keys,
    np_sparse_push,
    push_x0,
    run_rounds,
    to_jax,
    weighted_digraph,
)

from jaxgossip.algorithms.scsp import scsp
from jaxgossip.algorithms.sparse_push import sparse_push
from jaxgossip.engine.consensus import run_consensus
from jaxgossip.ops.mixing import consensus_distance

RTOL, ATOL = 1e-4, 1e-5
TOPOLOGIES = column_stochastic_graphs(N)


def test_gamma_and_target_residual_are_sweepable_under_vmap():
    topo = TOPOLOGIES["one_peer_exponential"]()
    x0 = to_jax(push_x0(10))

    def one_round(gamma, target):
        alg = scsp(topo, fraction=0.25, gamma=gamma, target_residual=target)
        x, _, info = alg.step(x0, alg.init(x0), jax.random.key(0))
        return x, info.bits

    swept_x, swept_bits = jax.jit(jax.vmap(one_round))(jnp.array([0.2, 0.6]), jnp.array([0.05, 0.5]))
    for i, (g, tau) in enumerate([(0.2, 0.05), (0.6, 0.5)]):
        x, bits = jax.jit(one_round)(g, tau)
        assert_tree_close({k: v[i] for k, v in swept_x.items()}, x, RTOL, ATOL)
        np.testing.assert_array_equal(np.asarray(swept_bits[i]), np.asarray(bits))
    assert not np.array_equal(np.asarray(swept_bits[0]), np.asarray(swept_bits[1]))


def test_scsp_without_compensation_is_sparse_push():
    topo = TOPOLOGIES["one_peer_exponential"]()
    x0 = push_x0(11)
    x_sp, s_sp, b_sp = run_rounds(sparse_push(topo, fraction=0.25, gamma=0.3), x0, fold_in_keys(3))
    for alg in (
        scsp(topo, fraction=0.25, gamma=0.3, compensation=False),
        scsp(topo, fraction=0.25, gamma=0.3, max_boost=1),
    ):
        x, state, bits = run_rounds(alg, x0, fold_in_keys(3))
        assert_tree_close(x, x_sp, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(bits, b_sp)


@pytest.mark.parametrize("name", ["one_peer_exponential", "schedule"])
def test_scsp_matches_numpy_loop(name):
    topo = TOPOLOGIES[name]()
    x0 = push_x0(12, offset=0.5)
    alg = scsp(topo, fraction=0.25, gamma=0.3, target_residual=0.2, max_boost=3)
    x, state, bits = run_rounds(alg, x0, fold_in_keys(6))
    ref_x, ref_w, ref_bits = np_sparse_push(topo, x0, 6, 0.3, 0.25, tau=0.2, max_boost=3)
    assert_tree_close(x, ref_x, RTOL, ATOL)
    np.testing.assert_allclose(np.asarray(state.w), ref_w, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(bits, ref_bits)
    assert bits[0].max() > bits[-1].min()  # the budget moved within the run


def test_scsp_compensation_spends_bits_on_the_lagging_node():
    topo = TOPOLOGIES["one_peer_exponential"]()
    x0 = push_x0(13, offset=2.0)
    alg = scsp(topo, fraction=0.25, target_residual=0.05, max_boost=4)
    state = alg.init(to_jax(x0))
    # every public copy is up to date except node 3's, which lags by 30 % of its model
    lag = {k: np.zeros_like(v) for k, v in x0.items()}
    for k in lag:
        lag[k][3] = 0.3 * x0[k][3]
    state = state._replace(x_hat={k: jnp.broadcast_to(x0[k] - lag[k], state.x_hat[k].shape) for k in x0})
    _, _, info = jax.jit(alg.step)(to_jax(x0), state, jax.random.key(0))
    bits = np.asarray(info.bits)
    base = 3 * (32 + 4) + 1 * (32 + 3) + 32  # Sparse-Push's message (see the hand count above)
    # node 3: rho = 0.3 per leaf, k = clip(ceil(K * 0.3 / 0.05), K, 4 K) = 4 K = 12 (leaf a), 4 (leaf b)
    boosted = 12 * (32 + 4) + 4 * (32 + 3) + 32
    np.testing.assert_array_equal(bits, [boosted if i == 3 else base for i in range(N)])
    _, _, info = jax.jit(sparse_push(topo, fraction=0.25).step)(to_jax(x0), state, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(info.bits), np.full(N, base))


def test_scsp_converges_and_its_budget_falls_back():
    topo = weighted_digraph(N, 4)
    x0 = push_x0(14, offset=1.0)
    alg = scsp(topo, fraction=0.25, gamma=0.3)
    res = run_consensus(alg, to_jax(x0), 300, jax.random.key(0))
    assert debias_error(alg, res.x, res.state, x0) < 1e-4
    per_round = np.diff(res.bits)
    sp = run_consensus(sparse_push(topo, fraction=0.25, gamma=0.3), to_jax(x0), 300, jax.random.key(0))
    sp_round = np.diff(sp.bits)
    assert per_round[0] > sp_round[0]  # rho = 1 at the start: every node boosts
    assert per_round[-1] == sp_round[-1]  # converged copies: back to the Sparse-Push budget


def test_scsp_compensation_reduces_disagreement_under_heterogeneous_drift():
    """Label-skew stand-in: node i is pulled towards its own target c_i every round (a gradient
    step on 1/2 ||z - c_i||^2). Top-1 % of 256 entries cannot keep the public copies up to date;
    the residual-adaptive budget gets close to uncompressed push-sum for a fraction of its bits."""
    topo = TOPOLOGIES["one_peer_exponential"]()
    d, lr, rounds = 256, 0.02, 300
    c = jnp.asarray(np.random.default_rng(15).normal(size=(N, d)) + 3.0, jnp.float32)
    x_start = {"a": jnp.broadcast_to(jnp.mean(c, 0), (N, d))}

    def train(alg):
        def body(carry, key):
            x, st = carry
            z = alg.debias(x, st)
            x = {"a": x["a"] - lr * (z["a"] - c) * st.w[:, None]}
            x, st, info = alg.step(x, st, key)
            return (x, st), (consensus_distance(alg.debias(x, st)), jnp.sum(info.bits))

        init = (x_start, alg.init(x_start))
        _, (dist, bits) = jax.lax.scan(body, init, jax.random.split(jax.random.key(0), rounds))
        return jnp.mean(dist[-50:]), jnp.sum(bits)

    exact, exact_bits = jax.jit(lambda: train(sparse_push(topo, fraction=1.0, gamma=0.2)))()
    plain, plain_bits = jax.jit(lambda: train(sparse_push(topo, fraction=0.01, gamma=0.2)))()
    comp, comp_bits = jax.jit(lambda: train(scsp(topo, fraction=0.01, gamma=0.2, target_residual=0.01, max_boost=8)))()
    assert plain > 10 * exact  # compression is the bottleneck here
    assert comp < 1.2 * exact
    assert plain_bits < comp_bits < 4 * plain_bits
    assert comp_bits < exact_bits / 20


def test_scsp_specific_errors():
    topo = TOPOLOGIES["one_peer_exponential"]()
    with pytest.raises(ValueError, match="target_residual"):
        scsp(topo, fraction=0.1, target_residual=0.0)
    with pytest.raises(ValueError, match="max_boost"):
        scsp(topo, fraction=0.1, max_boost=0)
    with pytest.raises(TypeError, match="max_boost"):
        scsp(topo, fraction=0.1, max_boost=2.5)
    with pytest.raises(TypeError, match="compensation"):
        scsp(topo, fraction=0.1, compensation="yes")
