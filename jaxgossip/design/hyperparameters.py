"""Hyperparameters by gradient: gamma, step-size schedules or mixing weights that minimise a scalar
of a run (the final objective of :func:`jaxgossip.engine.optimization.optimization_scan`, a final
consensus error, a simulated time to a target), by differentiating through the whole run.

:func:`tune_by_gradient` is a sign-robust normalised gradient descent with an adaptive step, made
for objectives that are cheap to differentiate but may blow up (a too large gamma makes a
compressed gossip run diverge): from the best point so far it takes the step

.. math::

   u' = u_{best} - \\eta\\, \\frac{\\nabla f(u_{best})}{\\max_j |\\nabla f(u_{best})_j|}

(in ``log`` space for positive hyperparameters, so that ``eta = 0.5`` moves the most sensitive
value by a factor ``e^{0.5}``), keeps ``u'`` and grows ``eta`` by 1.5 if it lowers f, and otherwise
(a larger or non-finite value) halves ``eta``. Every trial is one *evaluation*: the value and its
gradient from one ``jax.value_and_grad`` call (a forward pass and a backward pass), which is how
its cost is counted against a grid search, where an evaluation is one forward run
(:func:`jaxgossip.engine.tuning.tune_gamma` searches :data:`jaxgossip.engine.tuning.DEFAULT_GAMMAS`,
31 values).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["HyperparameterFit", "tune_by_gradient"]


class HyperparameterFit(NamedTuple):
    """Outcome of :func:`tune_by_gradient` (K evaluations).

    Attributes:
      params: the best hyperparameters found (the structure of ``init``).
      value: f at ``params``.
      values: [K] f at every evaluated point, in order (inf where it was not finite).
      best_values: [K] the best value after each evaluation.
      evaluations: K, value-and-gradient calls made.
      step: the final step size ``eta`` (in ``log`` space for positive hyperparameters).
    """

    params: Any
    value: float
    values: np.ndarray
    best_values: np.ndarray
    evaluations: int
    step: float


def tune_by_gradient(
    objective: Callable[[Any], Any],
    init: Any,
    *,
    positive: bool = True,
    max_evaluations: int = 20,
    step: float = 0.5,
    min_step: float = 1e-4,
    jit: bool = True,
) -> HyperparameterFit:
    """Minimises ``objective(params)`` over continuous hyperparameters by gradient (module docstring).

    Args:
      objective: ``params -> scalar``, differentiable; typically builds the algorithm and optimizer
        from ``params`` and returns a run's final objective, e.g.
        ``lambda p: optimization_scan(make("choco", topo, gamma=p["gamma"], ...), ...).objective[-1]``.
      init: the starting hyperparameters, a pytree of floating scalars or arrays (a per-round
        step-size vector, mixing weights).
      positive: optimise ``log(params)`` (every entry > 0 and stays so); False: the raw values.
      max_evaluations: K, value-and-gradient calls at most (>= 1).
      step: the initial ``eta`` (> 0).
      min_step: stop once ``eta`` falls below it.
      jit: compile ``value_and_grad(objective)`` once (False: call it as is).

    Returns:
      :class:`HyperparameterFit`.

    Raises:
      ValueError: a non-positive ``max_evaluations``, ``step`` or ``min_step``; ``init`` with a
        non-positive entry under ``positive=True``, a non-floating or non-finite entry; an
        objective that is not finite at ``init``.
    """
    if isinstance(max_evaluations, bool) or not isinstance(max_evaluations, (int, np.integer)) or max_evaluations < 1:
        raise ValueError(f"max_evaluations={max_evaluations!r} must be a positive int")
    for name, value in (("step", step), ("min_step", min_step)):
        if not np.isfinite(value) or value <= 0:
            raise ValueError(f"{name}={value!r} must be a finite number > 0")
    for leaf in jax.tree_util.tree_leaves(init):
        arr = np.asarray(leaf)
        if not np.issubdtype(arr.dtype, np.floating) or not np.all(np.isfinite(arr)):
            raise ValueError(f"init must hold finite floating values; got {arr!r}")
        if positive and np.any(arr <= 0):
            raise ValueError(f"init has an entry <= 0 ({arr.min()}); positive=True optimises log(params)")
    to_params = (lambda u: jax.tree_util.tree_map(jnp.exp, u)) if positive else (lambda u: u)
    u = jax.tree_util.tree_map(lambda a: jnp.log(jnp.asarray(a)) if positive else jnp.asarray(a), init)
    value_and_grad = jax.value_and_grad(lambda v: objective(to_params(v)))
    if jit:
        value_and_grad = jax.jit(value_and_grad)

    def evaluate(point):
        value, grad = value_and_grad(point)
        value = float(value)
        finite = np.isfinite(value) and all(np.all(np.isfinite(g)) for g in jax.tree_util.tree_leaves(grad))
        return (value if finite else np.inf), grad

    best_value, best_grad = evaluate(u)
    if not np.isfinite(best_value):
        raise ValueError("objective is not finite (or its gradient is not) at init")
    values, best_values = [best_value], [best_value]
    eta = float(step)
    while len(values) < max_evaluations and eta >= min_step:
        scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree_util.tree_leaves(best_grad))
        if scale == 0:  # a stationary point
            break
        trial = jax.tree_util.tree_map(lambda a, g, e=eta, s=scale: a - e * g / s, u, best_grad)
        value, grad = evaluate(trial)
        values.append(value)
        if value < best_value:
            u, best_value, best_grad = trial, value, grad
            eta *= 1.5
        else:
            eta *= 0.5
        best_values.append(best_value)
    return HyperparameterFit(
        params=to_params(u),
        value=best_value,
        values=np.asarray(values),
        best_values=np.asarray(best_values),
        evaluations=len(values),
        step=eta,
    )
