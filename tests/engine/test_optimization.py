"""Tests for run_optimization: per-node NumPy loops on heterogeneous least squares (gossip, choco
identity / top-k, push-sum; H = 1 and 3; both orderings), the allreduce reduction to centralized
gradient descent, determinism, bits, vmap sweeps, validation. The problems module:
test_problems.py."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _reference import np_top_k, top_k_count

import jaxgossip as jg
from jaxgossip.algorithms.push_sum import PushSumState
from jaxgossip.engine import problems

N, D, M = 8, 6, 10
LR, STEPS = 0.05, 12
RTOL, ATOL = 1e-5, 1e-5

PROBLEM = problems.least_squares(N, D, M, heterogeneity=1.0, noise=0.1, seed=3)
A = np.asarray(PROBLEM.features, np.float64)  # [N, M, D]
B = np.asarray(PROBLEM.targets, np.float64)  # [N, M]
X0 = np.asarray(problems.least_squares(N, D, M).init_params(jax.random.key(1), 0.5))  # distinct per node
KEY = jax.random.key(0)
SGD = optax.sgd(LR)  # one object: optimizer, loss_fn and alg are static jit arguments (hashed by identity)


# ---------------------------------------------------------------- NumPy references (per node loops)


def _np_grad(i, x):
    return A[i].T @ (A[i] @ x - B[i]) / M


def _np_run(comm, init_comm, debias, num_steps=STEPS, local_steps=1, ordering="atc"):
    """SGD with ``local_steps`` local steps per round and the communication ``comm(src, cstate)``.

    Returns the objective at the mean of the debiased models [S + 1] and the final params [N, D].
    """
    x = X0.astype(np.float64).copy()
    cstate = init_comm(x)

    def record(x, cstate):
        z = debias(x, cstate)
        return PROBLEM.objective(z.mean(axis=0))

    objectives = [record(x, cstate)]
    for _ in range(num_steps):
        y, total = x.copy(), np.zeros_like(x)
        for _ in range(local_steps):
            z = debias(y, cstate)
            for i in range(N):
                u = -LR * _np_grad(i, z[i])
                y[i] += u
                total[i] += u
        if ordering == "atc":
            x, cstate = comm(y, cstate)
        else:
            x, cstate = comm(x, cstate)
            x = x + total
        objectives.append(record(x, cstate))
    return np.array(objectives), debias(x, cstate)


def _np_mix(w, x):
    out = np.zeros_like(x)
    for i in range(N):
        for j in range(N):
            if w[i, j] != 0:
                out[i] += w[i, j] * x[j]
    return out


def _np_gossip(w):
    return (lambda x, c: (_np_mix(w, x), c)), (lambda x: None), (lambda x, c: x)


def _np_choco(w, gamma, fraction):
    def comm(x, c):
        x_hat, s = c
        q = np.stack([np_top_k(x[i] - x_hat[i], top_k_count(D, fraction)) for i in range(N)])
        x_hat = x_hat + q
        s = s + _np_mix(w, q)
        return x + gamma * (s - x_hat), (x_hat, s)

    return comm, (lambda x: (np.zeros_like(x), np.zeros_like(x))), (lambda x, c: x)


def _np_push_sum(w):
    def comm(x, c):
        return _np_mix(w, x), _np_mix(w, c[:, None])[:, 0]

    return comm, (lambda x: np.ones(N)), (lambda x, c: x / c[:, None])


def _run(alg, local_steps=1, ordering="atc", **kwargs):
    return jg.run_optimization(
        alg, jnp.asarray(X0), PROBLEM.loss_fn, SGD, STEPS, KEY, local_steps=local_steps, ordering=ordering,
        **kwargs,
    )


def _check_against(result, reference):
    objectives, x = reference
    np.testing.assert_allclose(np.asarray(result.objective), objectives, rtol=RTOL, atol=ATOL)
    z = np.asarray(result.x)
    if isinstance(result.state, PushSumState):
        z = z / np.asarray(result.state.w)[:, None]
    np.testing.assert_allclose(z, x, rtol=1e-4, atol=ATOL)


RING = jg.topology.ring(N)
GOSSIP = jg.algorithms.make("gossip", RING)  # shared, so identical runs hit the jit cache


@pytest.mark.parametrize("ordering", ["atc", "same_iterate"])
@pytest.mark.parametrize("local_steps", [1, 3])
def test_gossip_matches_numpy(local_steps, ordering):
    result = _run(GOSSIP, local_steps, ordering)
    _check_against(result, _np_run(*_np_gossip(RING.matrix()), local_steps=local_steps, ordering=ordering))
    assert result.loss.shape == (STEPS,) and result.node_bits.shape == (STEPS, N)
    np.testing.assert_array_equal(result.round, np.arange(STEPS + 1))
    np.testing.assert_array_equal(result.local_step, local_steps * np.arange(STEPS + 1))


@pytest.mark.parametrize("local_steps", [1, 3])
@pytest.mark.parametrize("compressor,fraction,gamma", [("identity", 1.0, 0.8), ("top_k", 0.5, 0.4)])
def test_choco_matches_numpy(compressor, fraction, gamma, local_steps):
    options = {"fraction": fraction} if compressor == "top_k" else None
    alg = jg.algorithms.make("choco", RING, gamma=gamma, compressor=compressor, compressor_options=options)
    result = _run(alg, local_steps)
    _check_against(result, _np_run(*_np_choco(RING.matrix(), gamma, fraction), local_steps=local_steps))
    kept = max(1, math.floor(fraction * D))
    per_message = D * 32 if compressor == "identity" else kept * (32 + math.ceil(math.log2(D)))
    np.testing.assert_allclose(result.bits, N * 2 * per_message * np.arange(STEPS + 1))


def test_choco_top_k_same_iterate_matches_numpy():
    alg = jg.algorithms.make("choco", RING, gamma=0.4, compressor="top_k", compressor_options={"fraction": 0.5})
    result = _run(alg, 3, "same_iterate")
    _check_against(result, _np_run(*_np_choco(RING.matrix(), 0.4, 0.5), local_steps=3, ordering="same_iterate"))


def test_push_sum_debiased_gradients_match_numpy():
    """Gradients at z = x / w, updates applied to the numerators x (SGP), on a directed ring."""
    topo = jg.topology.directed_ring(N)
    result = _run(jg.algorithms.make("push_sum", topo), local_steps=2)
    _check_against(result, _np_run(*_np_push_sum(topo.matrix()), local_steps=2))


def test_allreduce_is_centralized_gradient_descent():
    """Identical starts, H = 1, atc: every node follows GD on the global objective f = mean_i f_i."""
    start = np.broadcast_to(X0[0], (N, D))
    result = jg.run_optimization(
        jg.algorithms.make("allreduce", RING), jnp.asarray(start), PROBLEM.loss_fn, SGD, STEPS, KEY
    )
    x, objectives = X0[0].astype(np.float64), [PROBLEM.objective(X0[0])]
    for _ in range(STEPS):
        x = x - LR * np.mean([_np_grad(i, x) for i in range(N)], axis=0)
        objectives.append(PROBLEM.objective(x))
    np.testing.assert_allclose(np.asarray(result.objective), objectives, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.asarray(result.x), np.broadcast_to(x, (N, D)), rtol=1e-4, atol=ATOL)
    np.testing.assert_allclose(np.asarray(result.consensus), 0.0, atol=1e-10)


def test_same_key_same_result_and_minibatch_keys_matter():
    stochastic = problems.least_squares(N, D, M, heterogeneity=1.0, seed=3, batch_size=4)
    alg = GOSSIP

    def run(key):
        return jg.run_optimization(
            alg, jnp.asarray(X0), stochastic.loss_fn, SGD, STEPS, key, local_steps=2,
            objective_fn=stochastic.full_loss_fn,
        )

    first, second, other = run(KEY), run(KEY), run(jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(first.objective), np.asarray(second.objective))
    np.testing.assert_array_equal(np.asarray(first.x), np.asarray(second.x))
    assert not np.array_equal(np.asarray(first.x), np.asarray(other.x))
    # the reported objective is the exact full-batch f at the mean model
    np.testing.assert_allclose(
        float(first.objective[-1]), PROBLEM.objective(np.asarray(first.x, np.float64).mean(0)), rtol=RTOL
    )


def test_bits_do_not_depend_on_local_steps():
    alg = GOSSIP
    x = jnp.asarray(X0)
    _, _, info = alg.step(x, alg.init(x), KEY)
    one, three = _run(alg, 1), _run(alg, 3)
    expected = float(np.sum(info.bits)) * np.arange(STEPS + 1)
    np.testing.assert_array_equal(one.bits, expected)
    np.testing.assert_array_equal(three.bits, expected)
    assert one.bits.dtype == np.float64
    np.testing.assert_array_equal(three.node_bits, np.broadcast_to(np.asarray(info.bits), (STEPS, N)))


def test_vmap_over_learning_rates_matches_separate_runs():
    alg = GOSSIP
    lrs = jnp.array([0.02, 0.05])

    def sweep(lr):
        return jg.optimization_scan(alg, jnp.asarray(X0), PROBLEM.loss_fn, optax.sgd(lr), 5, KEY, local_steps=2)

    swept = jax.jit(jax.vmap(sweep))(lrs)
    for i, lr in enumerate([0.02, 0.05]):
        single = jg.run_optimization(alg, jnp.asarray(X0), PROBLEM.loss_fn, optax.sgd(lr), 5, KEY, local_steps=2)
        np.testing.assert_allclose(np.asarray(swept.objective[i]), np.asarray(single.objective), rtol=1e-6)


def test_pytree_params_and_momentum():
    """Leaves of different ranks and a stateful optimizer (per-node momentum) run and descend."""
    x0 = {"w": jnp.zeros((N, D)), "b": jnp.zeros((N, 1))}

    def loss_fn(p, i, key):
        del key
        return PROBLEM.loss_fn(p["w"], i, None) + 0.5 * jnp.sum(p["b"] ** 2)

    result = jg.run_optimization(GOSSIP, x0, loss_fn, optax.sgd(0.05, momentum=0.9), 30, KEY)
    assert float(result.objective[-1]) < 0.5 * float(result.objective[0])
    assert result.opt_state[0].trace["w"].shape == (N, D)


# ---------------------------------------------------------------- bad input



@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_local_steps_must_be_positive_int(value):
    with pytest.raises(ValueError, match="local_steps"):
        _run(GOSSIP, local_steps=value)


def test_bad_num_steps_and_ordering():
    with pytest.raises(ValueError, match="num_steps"):
        jg.run_optimization(GOSSIP, jnp.asarray(X0), PROBLEM.loss_fn, SGD, 0, KEY)
    with pytest.raises(ValueError, match="ordering.*atc"):
        _run(GOSSIP, ordering="cta")


def test_non_scalar_loss_fn():
    with pytest.raises(ValueError, match="loss_fn must return a scalar.*\\(2,\\)"):
        jg.run_optimization(GOSSIP, jnp.asarray(X0), lambda x, i, k: x[:2] ** 2, SGD, 3, KEY)
    with pytest.raises(TypeError, match="loss_fn must return one scalar"):
        jg.run_optimization(GOSSIP, jnp.asarray(X0), lambda x, i, k: (x.sum(), x.sum()), SGD, 3, KEY)
    with pytest.raises(TypeError, match="loss_fn must return a floating"):
        jg.run_optimization(GOSSIP, jnp.asarray(X0), lambda x, i, k: i, SGD, 3, KEY)
    with pytest.raises(ValueError, match="objective_fn must return a scalar"):
        _run(GOSSIP, objective_fn=lambda x, i, k: x)


def test_bad_x0_and_optimizer():
    with pytest.raises(ValueError, match="x0 leaf .*same leading node axis"):
        jg.run_optimization(GOSSIP, {"a": jnp.zeros((N, 2)), "b": jnp.zeros((N - 1, 2))}, lambda p, i, k: 0.0, SGD, 3, KEY)
    with pytest.raises(ValueError, match="x0 does not fit algorithm 'gossip'.*N=8"):
        jg.run_optimization(GOSSIP, jnp.zeros((N - 1, D)), PROBLEM.loss_fn, SGD, 3, KEY)
    with pytest.raises(ValueError, match="x0 leaf .*NaN"):
        jg.run_optimization(GOSSIP, jnp.asarray(X0).at[2, 1].set(jnp.nan), PROBLEM.loss_fn, SGD, 3, KEY)
    with pytest.raises(TypeError, match="floating"):
        jg.run_optimization(GOSSIP, jnp.zeros((N, D), jnp.int32), PROBLEM.loss_fn, SGD, 3, KEY)
    with pytest.raises(TypeError, match="optimizer"):
        jg.run_optimization(GOSSIP, jnp.asarray(X0), PROBLEM.loss_fn, lambda g: g, 3, KEY)
    with pytest.raises(TypeError, match="alg must be a GossipAlgorithm"):
        jg.run_optimization("gossip", jnp.asarray(X0), PROBLEM.loss_fn, SGD, 3, KEY)
