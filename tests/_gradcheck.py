"""``jax.grad`` against central finite differences in float64 (shared by the gradient tests)."""

import jax
import jax.numpy as jnp
import numpy as np

EPS = 1e-5
RTOL = 1e-6


def check_against_fd(f, x, num_directions=3, seed=0, mask=None, jit=True, eps=EPS, rtol=RTOL):
    """``grad f(x) . d`` against ``(f(x + eps d) - f(x - eps d)) / (2 eps)`` along random d; raises
    unless the gradient is finite and not identically 0 (the check would then be vacuous).
    ``jit=False`` for host entry points that jit inside. Returns the gradient."""
    x = jnp.asarray(x, jnp.float64)
    if jit:  # one compile for the finite differences
        f = jax.jit(f)
    grad = (jax.jit(jax.grad(f)) if jit else jax.grad(f))(x)
    assert grad.shape == x.shape and grad.dtype == jnp.float64
    assert np.all(np.isfinite(grad))
    assert float(jnp.max(jnp.abs(grad))) > 1e-6, "a stationary point: the check would be vacuous"
    rng = np.random.default_rng(seed)
    for _ in range(num_directions):
        d = rng.normal(size=x.shape) * (1.0 if mask is None else mask)
        fd = (f(x + eps * d) - f(x - eps * d)) / (2 * eps)
        np.testing.assert_allclose(float(jnp.vdot(grad, d)), float(fd), rtol=rtol, atol=1e-12)
    return grad
