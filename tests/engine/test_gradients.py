"""Gradients through runs: ``jax.grad`` of a run's final scalar equals central finite differences
in float64, with respect to the mixing weights (static, time-varying, every kernel layout; the
symmetric edge weights of a design), the initial values, the relaxation gamma and the local step
size (optax ``inject_hyperparams``)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _gradcheck import check_against_fd

import jaxgossip as jg
from jaxgossip.design import symmetric_weights, undirected_edges, weighted_topology
from jaxgossip.engine.consensus import consensus_scan
from jaxgossip.engine.optimization import optimization_scan
from jaxgossip.topology import Topology


@pytest.fixture(autouse=True)
def float64():
    with jax.enable_x64(True):
        yield


def x0_for(n, dim=3, seed=1):
    return np.random.default_rng(seed).normal(size=(n, dim))


def ring_on(kernel, n=6):
    """The n-ring on another mixing kernel (at W = J, e.g. a complete graph, the error and its
    gradient are 0 and finite differences are pure rounding; the ring stays away from it)."""
    ring = jg.topology.ring(n)
    return Topology(f"ring ({kernel} kernel)", n, ring.senders, ring.receivers, ring.weights, False, kernel=kernel)


GRAPHS = {
    "ring_slots": lambda: jg.topology.ring(6),
    "ring_segment": lambda: ring_on("segment"),
    "ring_dense": lambda: ring_on("dense"),
    "one_peer_exponential_time_varying": lambda: jg.topology.one_peer_exponential(6),
    "erdos_renyi_metropolis": lambda: jg.topology.erdos_renyi(10, 0.4, seed=2),
}


@pytest.mark.parametrize("name", list(GRAPHS))
def test_consensus_error_gradient_wrt_mixing_weights(name):
    topo = GRAPHS[name]()
    x0, key = x0_for(topo.num_nodes), jax.random.key(0)

    def final_error(weights):
        alg = jg.algorithms.make("gossip", topo.with_weights(weights))
        return consensus_scan(alg, x0, 7, key).error[-1]

    real = (topo.weights != 0).astype(np.float64)
    grad = check_against_fd(final_error, topo.weights, mask=real)
    np.testing.assert_array_equal(np.asarray(grad)[real == 0], 0.0)  # padding edges do not act
    # the traced-weights graph runs the host graph's run
    host = consensus_scan(jg.algorithms.make("gossip", topo), x0, 7, key).error
    np.testing.assert_allclose(
        consensus_scan(jg.algorithms.make("gossip", topo.with_weights(topo.weights)), x0, 7, key).error,
        host,
        rtol=1e-12,
    )


def test_consensus_error_gradient_equals_the_dense_closed_form():
    """E(W) = (1/N) ||(W^S - J) x0||^2 for a static symmetric doubly stochastic W: its gradient
    w.r.t. W_ij is (2/N) sum_k [(W^k)^T R (W^(S-1-k) x0)^T]_ij with R = (W^S - J) x0."""
    topo, steps = jg.topology.ring(6), 4
    x0, key = x0_for(6), jax.random.key(0)
    w = topo.matrix()
    n = 6
    resid = (np.linalg.matrix_power(w, steps) - 1.0 / n) @ x0
    dense_grad = sum(
        np.linalg.matrix_power(w, k).T @ resid @ (np.linalg.matrix_power(w, steps - 1 - k) @ x0).T for k in range(steps)
    ) * (2.0 / n)

    def final_error(weights):
        return consensus_scan(jg.algorithms.make("gossip", topo.with_weights(weights)), x0, steps, key).error[-1]

    grad = np.asarray(jax.grad(final_error)(jnp.asarray(topo.weights)))
    np.testing.assert_allclose(grad[0], dense_grad[topo.receivers[0], topo.senders[0]], rtol=1e-10, atol=1e-14)


def test_consensus_error_gradient_wrt_symmetric_edge_weights():
    topo = jg.topology.erdos_renyi(10, 0.4, seed=2)
    edges = undirected_edges(topo)
    w0 = np.full(len(edges), 0.1)
    base = weighted_topology(edges, w0, 10, "parametrized")
    x0, key = x0_for(10), jax.random.key(0)
    np.testing.assert_allclose(np.asarray(symmetric_weights(edges, w0, 10)), base.weights)

    def final_error(w):
        graph = base.with_weights(symmetric_weights(edges, w, 10))
        return consensus_scan(jg.algorithms.make("gossip", graph), x0, 6, key).error[-1]

    check_against_fd(final_error, w0)


def test_consensus_error_gradient_wrt_x0_through_run_consensus():
    alg = jg.algorithms.make("gossip", jg.topology.one_peer_exponential(6))
    key = jax.random.key(0)
    check_against_fd(lambda x: jg.run_consensus(alg, x, 5, key).error[-1], x0_for(6), jit=False)


@pytest.mark.parametrize("algorithm", ["gossip", "choco"])
def test_consensus_error_gradient_wrt_gamma(algorithm):
    topo = jg.topology.ring(8)
    x0, key = x0_for(8), jax.random.key(0)

    def final_error(gamma):
        return consensus_scan(jg.algorithms.make(algorithm, topo, gamma=gamma), x0, 6, key).error[-1]

    check_against_fd(final_error, 0.8)


def quadratic_problem(n=6, dim=3, seed=3):
    """f_i(x) = 1/2 ||A_i x - b_i||^2, float64 constants."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=(n, 4, dim)), rng.normal(size=(n, 4))

    def loss_fn(x, node, key):
        del key
        r = jnp.asarray(a)[node] @ x - jnp.asarray(b)[node]
        return 0.5 * jnp.sum(r * r)

    return loss_fn


def test_optimization_objective_gradient_wrt_gamma_step_size_weights_and_x0():
    topo = jg.topology.ring(6)
    loss_fn, key = quadratic_problem(), jax.random.key(0)
    x0 = x0_for(6)

    def final_objective(gamma=1.0, lr=0.05, weights=topo.weights, x=x0, local_steps=2):
        alg = jg.algorithms.make("gossip", topo.with_weights(weights), gamma=gamma)
        optimizer = optax.inject_hyperparams(optax.sgd)(learning_rate=lr)
        return optimization_scan(alg, x, loss_fn, optimizer, 6, key, local_steps=local_steps).objective[-1]

    check_against_fd(lambda g: final_objective(gamma=g), 0.9)
    check_against_fd(lambda lr: final_objective(lr=lr), 0.05)
    check_against_fd(lambda w: final_objective(weights=w), topo.weights)
    check_against_fd(lambda x: final_objective(x=x), x0)


def test_optimization_objective_gradient_wrt_x0_through_run_optimization():
    alg = jg.algorithms.make("gossip", jg.topology.ring(6))
    loss_fn, key = quadratic_problem(), jax.random.key(0)
    check_against_fd(
        lambda x: jg.run_optimization(alg, x, loss_fn, optax.sgd(0.05), 5, key, ordering="same_iterate").objective[-1],
        x0_for(6),
        jit=False,
    )


def test_rematerialised_rounds_give_the_same_values_and_gradients():
    topo = jg.topology.ring(6)
    x0, key = jnp.asarray(x0_for(6)), jax.random.key(0)
    loss_fn = quadratic_problem()

    def consensus(weights, remat):
        return consensus_scan(jg.algorithms.make("gossip", topo.with_weights(weights)), x0, 12, key, remat=remat).error

    def optimization(lr, remat):
        optimizer = optax.inject_hyperparams(optax.sgd)(learning_rate=lr)
        alg = jg.algorithms.make("gossip", topo)
        return optimization_scan(alg, x0, loss_fn, optimizer, 12, key, local_steps=2, remat=remat).objective

    for f, x in ((consensus, jnp.asarray(topo.weights)), (optimization, jnp.asarray(0.05))):
        plain, remat = (jax.jit(lambda v, r=r, f=f: f(v, r)) for r in (False, True))
        np.testing.assert_array_equal(plain(x), remat(x))
        grads = [jax.jit(jax.grad(lambda v, r=r, f=f: f(v, r)[-1]))(x) for r in (False, True)]
        np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12, atol=1e-15)
    with pytest.raises(TypeError, match="remat"):
        consensus_scan(jg.algorithms.make("gossip", topo), x0, 3, key, remat="yes")
