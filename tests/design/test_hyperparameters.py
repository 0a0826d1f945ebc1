"""Hyperparameters by gradient (:func:`jaxgossip.design.tune_by_gradient`) against the grid of
``tune-gamma`` (:data:`jaxgossip.engine.tuning.DEFAULT_GAMMAS`, 31 values): on small problems the
gradient method reaches the grid's best final objective or better in fewer evaluations, one
evaluation being one value-and-gradient call (a forward and a backward pass) for the gradient
method and one forward run for the grid."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxgossip as jg
from jaxgossip.design import (
    metropolis_edge_weights,
    symmetric_weights,
    tune_by_gradient,
    undirected_edges,
    weighted_topology,
)
from jaxgossip.engine.consensus import consensus_scan
from jaxgossip.engine.optimization import optimization_scan
from jaxgossip.engine.tuning import DEFAULT_GAMMAS

N, DIM, STEPS = 8, 20, 30
KEY = jax.random.key(0)


@pytest.fixture(autouse=True)
def float64():
    with jax.enable_x64(True):
        yield


def least_squares():
    """f_i(x) = 1/2 ||A_i x - b_i||^2, heterogeneous across nodes."""
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(N, 10, DIM)) / np.sqrt(10), rng.normal(size=(N, 10))

    def loss_fn(x, node, key):
        del key
        r = jnp.asarray(a)[node] @ x - jnp.asarray(b)[node]
        return 0.5 * jnp.sum(r * r)

    return loss_fn


def final_objective(algorithm, options, learning_rate):
    loss_fn, topo = least_squares(), jg.topology.ring(N)

    def objective(params):
        alg = jg.algorithms.make(algorithm, topo, gamma=params["gamma"], **options)
        return optimization_scan(alg, jnp.zeros((N, DIM)), loss_fn, optax.sgd(learning_rate), STEPS, KEY).objective[-1]

    return objective


def grid_best(objective, make_params):
    f = jax.jit(objective)
    values = np.array([float(f(make_params(g))) for g in DEFAULT_GAMMAS])
    return float(np.nanmin(values)), len(values)


@pytest.mark.parametrize(
    "algorithm,options",
    [("choco", {"compressor": jg.compress.top_k(k=2)}), ("gossip", {})],
    ids=["choco_top_k", "relaxed_gossip"],
)
def test_gamma_by_gradient_beats_the_tune_gamma_grid(algorithm, options):
    objective = final_objective(algorithm, options, 0.3)
    best, grid_evaluations = grid_best(objective, lambda g: {"gamma": g})
    fit = tune_by_gradient(objective, {"gamma": 0.05}, max_evaluations=20)
    assert fit.evaluations <= 20 < grid_evaluations
    assert fit.value <= best
    np.testing.assert_allclose(float(objective(fit.params)), fit.value, rtol=1e-12)  # the value is honest
    assert np.all(np.diff(fit.best_values) <= 0) and fit.best_values[-1] == fit.value


def test_per_round_step_sizes_beat_the_best_constant_step_size():
    loss_fn = least_squares()
    alg = jg.algorithms.make("gossip", jg.topology.ring(N))

    def objective(params):
        steps = params["learning_rate"]  # [S], one step size per round
        optimizer = optax.sgd(lambda count: steps[jnp.minimum(count, STEPS - 1)])
        return optimization_scan(alg, jnp.zeros((N, DIM)), loss_fn, optimizer, STEPS, KEY).objective[-1]

    best, grid_evaluations = grid_best(objective, lambda g: {"learning_rate": jnp.full(STEPS, g)})
    fit = tune_by_gradient(objective, {"learning_rate": np.full(STEPS, 0.05)}, max_evaluations=25)
    assert fit.evaluations < grid_evaluations
    assert fit.value < best
    assert fit.params["learning_rate"].shape == (STEPS,) and np.all(fit.params["learning_rate"] > 0)


def test_tune_by_gradient_on_a_known_minimum_and_bad_input():
    fit = tune_by_gradient(lambda p: (jnp.log(p) - 1.0) ** 2, 0.5, max_evaluations=60, min_step=1e-9)
    np.testing.assert_allclose(float(fit.params), np.e, rtol=1e-3)
    # a diverging trial (non-finite) is refused, not kept
    fit = tune_by_gradient(lambda g: jnp.where(g > 2.0, jnp.inf, (g - 1.5) ** 2), 0.1, max_evaluations=30)
    assert np.isinf(fit.values).any() and abs(float(fit.params) - 1.5) < 0.05
    with pytest.raises(ValueError, match="positive"):
        tune_by_gradient(lambda g: g**2, 0.1, max_evaluations=0)
    with pytest.raises(ValueError, match="<= 0"):
        tune_by_gradient(lambda g: g**2, -0.1)
    with pytest.raises(ValueError, match="not finite"):
        tune_by_gradient(lambda g: jnp.inf * g, 0.1)


def test_mixing_weights_by_gradient_improve_on_metropolis():
    """Symmetric edge weights (W = I - L(w), w > 0) minimising the consensus error after 6 rounds,
    from the Metropolis weights of a random graph."""
    topo = jg.topology.erdos_renyi(10, 0.4, seed=2)
    edges = undirected_edges(topo)
    w0 = np.asarray(metropolis_edge_weights(edges, 10), np.float64)
    base = weighted_topology(edges, w0, 10, "parametrized")
    x0 = jnp.asarray(np.random.default_rng(1).normal(size=(10, 3)))

    def objective(w):
        alg = jg.algorithms.make("gossip", base.with_weights(symmetric_weights(edges, w, 10)))
        return consensus_scan(alg, x0, 6, KEY).error[-1]

    start = float(objective(jnp.asarray(w0)))
    fit = tune_by_gradient(objective, w0, max_evaluations=15)
    assert fit.value < 0.9 * start and fit.evaluations <= 15
    assert np.all(np.asarray(fit.params) > 0)
