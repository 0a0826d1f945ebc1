"""Derivatives of the compressors (``Compressor.gradient``, :data:`jaxgossip.compress.GRADIENT_RULES`):
each rule on one Choco round by hand, finite gradients of Choco runs with every compressor, top-k's
mask rule against finite differences, the fused native round against the XLA round, and the
identity compressor's exact (uncompressed) gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _gradcheck import check_against_fd

import jaxgossip as jg
from jaxgossip.compress import GRADIENT_RULES, REGISTRY, selection
from jaxgossip.engine.consensus import consensus_scan

N, DIM = 6, 8
KEY = jax.random.key(3)
SPECS = {
    "identity": {},
    "top_k": {"k": 3},
    "random_k": {"k": 3},
    "random_k_unbiased": {"k": 3, "unbiased": True},
    "sign": {},
    "qsgd": {"levels": 4},
    "qsgd_rescaled": {"levels": 4, "rescale": True},
}


def make(spec):
    return jg.compress.make(spec.removesuffix("_unbiased").removesuffix("_rescaled"), **SPECS[spec])


def x0_for(seed=1):
    return np.random.default_rng(seed).normal(size=(N, DIM))


def test_every_registered_compressor_states_a_rule():
    covered = {name.removesuffix("_unbiased").removesuffix("_rescaled") for name in SPECS}
    assert covered == set(REGISTRY)
    for spec in SPECS:
        assert make(spec).gradient in GRADIENT_RULES
    assert make("identity").gradient == "exact" and make("top_k").gradient == "mask"
    assert make("sign").gradient == "straight_through"


def rule_jacobian_diag(spec, x0, q):
    """The rule's diagonal Jacobian of the compressor at x0 (every rule here is diagonal): 1 for
    exact and straight-through, the kept mask for mask rules (times D / K unbiased), the
    contractive factor for rescaled QSGD."""
    rule = make(spec).gradient
    if rule == "mask":
        mask = (np.asarray(q) != 0).astype(np.float64)
        return mask * (DIM / 3 if spec == "random_k_unbiased" else 1.0)
    if spec == "qsgd_rescaled":
        return np.full(x0.shape, 1.0 / (min(DIM / 16, np.sqrt(DIM) / 4) + 1.0))
    return np.ones(x0.shape)


@pytest.mark.parametrize("spec", list(SPECS))
def test_one_choco_round_follows_the_rule(spec):
    """x1 = x0 + gamma (W - I) C(x0) from x_hat = s = 0, so for f = <c, x1>:
    grad f = c + J_C^T gamma (W - I)^T c with J_C the rule's Jacobian."""
    with jax.enable_x64(True):
        topo, gamma = jg.topology.ring(N), 0.6
        x0, c = x0_for(), np.random.default_rng(2).normal(size=(N, DIM))
        alg = jg.algorithms.make("choco", topo, compressor=make(spec), gamma=gamma)
        state = alg.init(jnp.asarray(x0))
        key = jax.random.key(4)

        def f(x):
            return jnp.vdot(c, alg.step(x, alg.init(x), key)[0])

        grad = np.asarray(jax.grad(f)(jnp.asarray(x0)))
        q = alg.step(jnp.asarray(x0), state, key)[1].x_hat  # the message C(x0)
        w = topo.matrix()
        want = c + rule_jacobian_diag(spec, x0, q) * (gamma * (w - np.eye(N)).T @ c)
        np.testing.assert_allclose(grad, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("spec", list(SPECS))
def test_choco_run_gradients_are_finite_in_float32(spec):
    """The default float32 run (native kernels on the CPU, the fused round for top-k)."""
    topo = jg.topology.ring(N)

    def final_error(x, gamma):
        alg = jg.algorithms.make("choco", topo, compressor=make(spec), gamma=gamma)
        return consensus_scan(alg, x, 10, KEY).error[-1]

    gx, gg = jax.jit(jax.grad(final_error, argnums=(0, 1)))(jnp.asarray(x0_for(), jnp.float32), 0.4)
    assert np.all(np.isfinite(gx)) and np.isfinite(gg) and float(jnp.abs(gx).max()) > 0


def test_top_k_mask_rule_is_the_derivative_where_the_selection_is_fixed():
    with jax.enable_x64(True):
        topo = jg.topology.ring(N)

        def final_error(x):
            alg = jg.algorithms.make("choco", topo, compressor=jg.compress.top_k(k=3), gamma=0.4)
            return consensus_scan(alg, x, 6, KEY).error[-1]

        check_against_fd(final_error, x0_for())


def test_identity_gives_the_uncompressed_gradient():
    """Choco with the identity and gamma = 1 is gossip x <- W x: the same gradients."""
    with jax.enable_x64(True):
        topo = jg.topology.erdos_renyi(N, 0.5, seed=1)
        x0 = jnp.asarray(x0_for())

        def final_error(name, x, weights):
            options = {"compressor": jg.compress.identity()} if name == "choco" else {}
            alg = jg.algorithms.make(name, topo.with_weights(weights), **options)
            return consensus_scan(alg, x, 7, KEY).error[-1]

        grads = [
            jax.grad(final_error, argnums=(1, 2))(name, x0, jnp.asarray(topo.weights)) for name in ("choco", "gossip")
        ]
        for a, b in zip(*grads):
            np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-14)


def test_top_k_selection_derivatives():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 10)), jnp.float32)
    dx = jnp.asarray(np.random.default_rng(1).normal(size=(3, 10)), jnp.float32)
    dense, d_dense = jax.jvp(lambda v: selection.top_k_dense(v, 4), (x,), (dx,))
    np.testing.assert_array_equal(d_dense, np.where(np.asarray(dense) != 0, dx, 0))
    (values, idx), (d_values, _) = jax.jvp(lambda v: selection.top_k(v, 4), (x,), (dx,))
    np.testing.assert_array_equal(d_values, np.take_along_axis(np.asarray(dx), np.asarray(idx), -1))
    # per-row K (SCSP's budgets): the first K_i entries of the |x| order
    mask = selection.kept_mask(x, jnp.array([1, 4, 10]))
    np.testing.assert_array_equal(mask.sum(-1), [1, 4, 10])
    np.testing.assert_array_equal(mask[1], selection.kept_mask(x[1:2], 4)[0])


@pytest.mark.parametrize("name", ["choco", "sparse_push", "scsp"])
def test_fused_round_gradient_equals_the_xla_round(name, monkeypatch):
    """float32 on the CPU: the fused native round (Choco: s includes the node's own message;
    Sparse-Push on a time-varying graph: one copy set per graph, built from host tables, so its
    weights are not an input; SCSP with its per-node budgets) differentiates as the XLA round."""
    topo = jg.topology.ring(N) if name == "choco" else jg.topology.one_peer_exponential(N)
    x0 = jnp.asarray(x0_for(), jnp.float32)
    if name == "scsp":  # wider leaves and a lower target: the budgets differ across nodes and rounds
        x0 = jnp.asarray(np.random.default_rng(1).normal(size=(N, 40)), jnp.float32)

    def final_error(x, weights, gamma):
        if name == "choco":
            alg = jg.algorithms.make(
                "choco", topo.with_weights(weights), compressor=jg.compress.top_k(k=3), gamma=gamma
            )
        else:  # SCSP: a budget k_i per node that grows with its residual (fixed under differentiation)
            options = {"target_residual": 0.5} if name == "scsp" else {}
            alg = jg.algorithms.make(name, topo, k=3, gamma=gamma, **options)
        return consensus_scan(alg, x, 8, KEY).error[-1]

    args = (x0, jnp.asarray(topo.weights, jnp.float32), jnp.float32(0.5))
    argnums = (0, 1, 2) if name == "choco" else (0, 2)
    fused = jax.jit(jax.grad(final_error, argnums=argnums))(*args)
    monkeypatch.setenv("JAXGOSSIP_FUSED", "0")
    xla = jax.jit(jax.grad(final_error, argnums=argnums))(*args)
    for a, b in zip(fused, xla):
        assert np.all(np.isfinite(a)) and float(jnp.abs(a).max()) > 0
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)
