"""Tests for jaxgossip.engine.problems: the least-squares and logistic-regression problems' minimisers,
heterogeneity across nodes, input validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgossip.engine import problems

N, D, M = 8, 6, 10
PROBLEM = problems.least_squares(N, D, M, heterogeneity=1.0, noise=0.1, seed=3)  # as in test_optimization.py


def test_least_squares_x_star_is_stationary():
    grad = jax.jit(
        jax.grad(lambda x: jnp.mean(jax.vmap(PROBLEM.full_loss_fn, (None, 0, None))(x, jnp.arange(N), None)))
    )
    assert np.abs(np.asarray(grad(jnp.asarray(PROBLEM.x_star, jnp.float32)))).max() < 1e-4
    assert PROBLEM.f_star <= PROBLEM.objective(PROBLEM.x_star + 1e-3)


def test_logistic_regression_x_star_and_heterogeneity():
    prob = problems.logistic_regression(N, D, 40, heterogeneity=2.0, reg=0.05, seed=0)
    x_star = prob.x_star
    a, y = np.asarray(prob.features, np.float64).reshape(-1, D), np.asarray(prob.targets, np.float64).reshape(-1)
    p = 1.0 / (1.0 + np.exp(y * (a @ x_star)))
    assert np.linalg.norm(-(a.T @ (y * p)) / len(y) + 0.05 * x_star) < 1e-10
    assert set(np.unique(y)) == {-1.0, 1.0}
    jax_f = np.mean([float(prob.full_loss_fn(jnp.asarray(x_star, jnp.float32), i, None)) for i in range(N)])
    np.testing.assert_allclose(jax_f, prob.f_star, rtol=1e-5)
    # node distributions differ: local minimisers are spread far more than with heterogeneity 0
    local = [
        np.linalg.lstsq(np.asarray(prob.features[i]), np.asarray(prob.targets[i]), rcond=None)[0] for i in range(N)
    ]
    iid = problems.logistic_regression(N, D, 40, heterogeneity=0.0, reg=0.05, seed=0)
    local_iid = [
        np.linalg.lstsq(np.asarray(iid.features[i]), np.asarray(iid.targets[i]), rcond=None)[0] for i in range(N)
    ]
    assert np.var(local, axis=0).sum() > np.var(local_iid, axis=0).sum()


def test_problem_bad_input():
    with pytest.raises(ValueError, match="heterogeneity"):
        problems.least_squares(4, 3, 5, heterogeneity=-1.0)
    with pytest.raises(ValueError, match="batch_size"):
        problems.least_squares(4, 3, 5, batch_size=0)
    with pytest.raises(ValueError, match="reg"):
        problems.logistic_regression(4, 3, 5, reg=0.0)
