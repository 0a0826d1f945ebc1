"""Classic heterogeneous test problems for :func:`jaxgossip.run_optimization`.

Each problem gives node i a finite-sum objective ``f_i(x) = (1/M) sum_m l(x; a_im, b_im)`` over its
own M samples, for one model ``x`` [D]; the global objective is ``f(x) = (1/N) sum_i f_i(x)``.

Heterogeneity (the parameter ``heterogeneity``, h >= 0) makes each node's data come from its own
distribution: node i has its own true parameter ``x_i^true = x_c + h * delta_i`` and its own feature
mean ``mu_i = h * nu_i``, with ``x_c, delta_i ~ N(0, I_D)`` and ``nu_i ~ N(0, I_D / D)``; features
are ``a_im ~ N(mu_i, I_D)``. With h = 0 the nodes hold i.i.d. samples of one distribution; larger h
moves the local minimisers ``argmin f_i`` apart, so local steps drift (client drift) and gossip
errors matter more. Data are drawn on the host with NumPy from ``seed`` and held as float32 arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.types import Array, PRNGKey

__all__ = ["Problem", "least_squares", "logistic_regression"]


class Problem(NamedTuple):
    """A decentralized problem with N nodes, D parameters per node and M samples per node.

    Attributes:
      name: ``"least_squares"`` or ``"logistic_regression"``.
      loss_fn: ``loss_fn(x_i [D], node_index, key) -> scalar``: ``f_i`` on a minibatch of
        ``batch_size`` samples drawn with replacement with ``key`` when ``batch_size`` is set,
        else the full-batch ``f_i`` (key ignored).
      full_loss_fn: the full-batch ``f_i`` (same signature, key ignored); pass it as
        ``run_optimization(..., objective_fn=problem.full_loss_fn)`` to report the exact objective.
      features: [N, M, D] float32 inputs ``a_im``.
      targets: [N, M] float32 targets (least squares) or labels in {-1, +1} (logistic regression).
      x_star: [D] float64 minimiser of the global objective (NumPy).
      f_star: its value ``f(x_star)`` (float, computed in float64 on the host).
      objective: ``objective(x [D]) -> float``, the global objective in float64 NumPy.
      init_params: ``init_params(key=None, scale=1.0) -> [N, D]`` float32: zeros without a key,
        else i.i.d. ``N(0, scale^2)`` entries (different per node).
    """

    name: str
    loss_fn: Callable[[Array, Array, PRNGKey], Array]
    full_loss_fn: Callable[[Array, Array, PRNGKey], Array]
    features: Array
    targets: Array
    x_star: np.ndarray
    f_star: float
    objective: Callable[[np.ndarray], float]
    init_params: Callable[..., Array]


def _check(num_nodes, dim, samples_per_node, heterogeneity, noise, batch_size) -> None:
    for name, value in (("num_nodes", num_nodes), ("dim", dim), ("samples_per_node", samples_per_node)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive int")
    for name, value in (("heterogeneity", heterogeneity), ("noise", noise)):
        if not np.isfinite(value) or value < 0:
            raise ValueError(f"{name}={value!r} must be a finite number >= 0")
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1
    ):
        raise ValueError(f"batch_size={batch_size!r} must be None or a positive int")


def _heterogeneous_data(rng, num_nodes, dim, samples_per_node, heterogeneity):
    """Features [N, M, D] and node-specific true parameters [N, D] (module docstring), float64."""
    x_common = rng.standard_normal(dim)
    x_true = x_common + heterogeneity * rng.standard_normal((num_nodes, dim))
    mu = heterogeneity * rng.standard_normal((num_nodes, 1, dim)) / np.sqrt(dim)
    features = mu + rng.standard_normal((num_nodes, samples_per_node, dim))
    return features, x_true


def _init_params(num_nodes: int, dim: int) -> Callable[..., Array]:
    def init_params(key: PRNGKey | None = None, scale: float = 1.0) -> Array:
        if key is None:
            return jnp.zeros((num_nodes, dim), jnp.float32)
        return scale * jax.random.normal(key, (num_nodes, dim), jnp.float32)

    return init_params


def _node_losses(sample_loss, features, targets, batch_size):
    """``(loss_fn, full_loss_fn)`` for ``sample_loss(x [D], a [B, D], b [B]) -> [B]``."""
    num_samples = features.shape[1]

    def full_loss_fn(x, node_index, key):
        del key
        return jnp.mean(sample_loss(x, features[node_index], targets[node_index]))

    if batch_size is None:
        return full_loss_fn, full_loss_fn

    def loss_fn(x, node_index, key):
        idx = jax.random.randint(key, (batch_size,), 0, num_samples)
        return jnp.mean(sample_loss(x, features[node_index][idx], targets[node_index][idx]))

    return loss_fn, full_loss_fn


def least_squares(
    num_nodes: int,
    dim: int,
    samples_per_node: int,
    *,
    heterogeneity: float = 1.0,
    noise: float = 0.1,
    seed: int = 0,
    batch_size: int | None = None,
) -> Problem:
    """Heterogeneous linear least squares, with the exact global minimiser in closed form.

    .. math::

        f_i(x) = \\frac{1}{2M} \\lVert A_i x - b_i \\rVert^2, \\qquad
        b_i = A_i x_i^{true} + \\sigma \\varepsilon_i, \\qquad
        x^\\star = \\Big(\\sum_i A_i^\\top A_i\\Big)^{-1} \\sum_i A_i^\\top b_i

    (equal M on every node, so the global normal equations are the sum of the local ones).
    ``x_star`` and ``f_star`` are solved in float64 from the float32 data the nodes actually use.

    Args:
      num_nodes: N. dim: D. samples_per_node: M (rows of ``A_i`` [M, D]).
      heterogeneity: h >= 0, spread of the node distributions (module docstring).
      noise: sigma >= 0, standard deviation of the label noise ``eps_i ~ N(0, I_M)``.
      seed: NumPy seed of the data.
      batch_size: B, if set ``loss_fn`` uses B rows drawn with replacement per call.

    Returns:
      A :class:`Problem`.
    """
    _check(num_nodes, dim, samples_per_node, heterogeneity, noise, batch_size)
    rng = np.random.default_rng(seed)
    features, x_true = _heterogeneous_data(rng, num_nodes, dim, samples_per_node, heterogeneity)
    targets = np.einsum("nmd,nd->nm", features, x_true) + noise * rng.standard_normal((num_nodes, samples_per_node))
    a32, b32 = features.astype(np.float32), targets.astype(np.float32)
    a64, b64 = a32.astype(np.float64), b32.astype(np.float64)
    x_star = np.linalg.solve(np.einsum("nmd,nme->de", a64, a64), np.einsum("nmd,nm->d", a64, b64))

    def objective(x):
        residual = np.einsum("nmd,d->nm", a64, np.asarray(x, np.float64)) - b64
        return float(0.5 * np.mean(residual**2))

    def sample_loss(x, a, b):
        return 0.5 * (a @ x - b) ** 2

    loss_fn, full_loss_fn = _node_losses(sample_loss, jnp.asarray(a32), jnp.asarray(b32), batch_size)
    return Problem(
        name="least_squares",
        loss_fn=loss_fn,
        full_loss_fn=full_loss_fn,
        features=jnp.asarray(a32),
        targets=jnp.asarray(b32),
        x_star=x_star,
        f_star=objective(x_star),
        objective=objective,
        init_params=_init_params(num_nodes, dim),
    )


def _newton_logistic(a: np.ndarray, y: np.ndarray, reg: float, tol: float = 1e-12, max_iter: int = 100):
    """Minimiser of ``mean log(1 + exp(-y a^T x)) + reg/2 ||x||^2`` (a [P, D], y [P]) by Newton's method.

    The objective is ``reg``-strongly convex and smooth, so damped-free Newton from 0 converges
    quadratically for the well-conditioned problems built here; a backtracking line search guards
    the first steps. Stops when the gradient norm is below ``tol``.
    """
    num, dim = a.shape
    x = np.zeros(dim)

    def value(x):
        return float(np.mean(np.logaddexp(0.0, -y * (a @ x))) + 0.5 * reg * x @ x)

    for _ in range(max_iter):
        margin = y * (a @ x)
        p = 0.5 * (1.0 - np.tanh(0.5 * margin))  # sigmoid(-margin), stable
        grad = -(a.T @ (y * p)) / num + reg * x
        if np.linalg.norm(grad) < tol:
            break
        hess = (a.T * (p * (1 - p))) @ a / num + reg * np.eye(dim)
        step = np.linalg.solve(hess, grad)
        t, f0 = 1.0, value(x)
        while value(x - t * step) > f0 - 0.25 * t * grad @ step and t > 1e-10:
            t *= 0.5
        x = x - t * step
    return x


def logistic_regression(
    num_nodes: int,
    dim: int,
    samples_per_node: int,
    *,
    heterogeneity: float = 1.0,
    reg: float = 1e-2,
    seed: int = 0,
    batch_size: int | None = None,
    noise: float = 0.0,
) -> Problem:
    """Heterogeneous L2-regularised logistic regression; ``x_star`` by Newton's method on the host.

    .. math::

        f_i(x) = \\frac{1}{M} \\sum_m \\log\\big(1 + e^{-y_{im} a_{im}^\\top x}\\big)
            + \\frac{\\lambda}{2} \\lVert x \\rVert^2, \\qquad
        P(y_{im} = 1) = \\mathrm{sigmoid}(a_{im}^\\top x_i^{true} + \\sigma \\varepsilon_{im})

    ``f`` is ``lambda``-strongly convex, so its minimiser is unique; ``x_star`` is found in float64
    by Newton's method with a backtracking line search on all N M samples (gradient norm < 1e-12),
    and ``f_star = f(x_star)``.

    Args:
      num_nodes: N. dim: D. samples_per_node: M.
      heterogeneity: h >= 0, spread of the node distributions (module docstring).
      reg: lambda > 0, the L2 coefficient (part of every ``f_i``).
      seed: NumPy seed of the data.
      batch_size: B, if set ``loss_fn`` uses B samples drawn with replacement per call.
      noise: sigma >= 0, logit noise before the labels are drawn.

    Returns:
      A :class:`Problem` (targets are labels in {-1, +1}).
    """
    _check(num_nodes, dim, samples_per_node, heterogeneity, noise, batch_size)
    if not np.isfinite(reg) or reg <= 0:
        raise ValueError(f"reg={reg!r} must be a finite number > 0 (it makes the minimiser unique)")
    rng = np.random.default_rng(seed)
    features, x_true = _heterogeneous_data(rng, num_nodes, dim, samples_per_node, heterogeneity)
    logits = np.einsum("nmd,nd->nm", features, x_true) + noise * rng.standard_normal((num_nodes, samples_per_node))
    labels = np.where(rng.random((num_nodes, samples_per_node)) < 1.0 / (1.0 + np.exp(-logits)), 1.0, -1.0)
    a32, y32 = features.astype(np.float32), labels.astype(np.float32)
    a64, y64 = a32.astype(np.float64), y32.astype(np.float64)
    x_star = _newton_logistic(a64.reshape(-1, dim), y64.reshape(-1), float(reg))

    def objective(x):
        x = np.asarray(x, np.float64)
        return float(np.mean(np.logaddexp(0.0, -y64 * np.einsum("nmd,d->nm", a64, x))) + 0.5 * reg * x @ x)

    def sample_loss(x, a, y):
        return jnp.logaddexp(0.0, -y * (a @ x)) + 0.5 * reg * jnp.sum(x * x)

    loss_fn, full_loss_fn = _node_losses(sample_loss, jnp.asarray(a32), jnp.asarray(y32), batch_size)
    return Problem(
        name="logistic_regression",
        loss_fn=loss_fn,
        full_loss_fn=full_loss_fn,
        features=jnp.asarray(a32),
        targets=jnp.asarray(y32),
        x_star=x_star,
        f_star=objective(x_star),
        objective=objective,
        init_params=_init_params(num_nodes, dim),
    )
