"""Decentralized DiLoCo: an outer optimizer over the pseudo-gradients of H local steps.

Each round r every node i starts from its anchor ``x_r,i``, takes H inner (local) optimizer steps
to ``x_r,i^{(H)}``, and forms the pseudo-gradient ``Delta_r,i = x_r,i - x_r,i^{(H)}``. The
communication algorithm mixes the pseudo-gradients instead of the models (gossip, compressed
gossip, PowerGossip, push-sum; ``allreduce`` gives the exact average, the original DiLoCo), and
every node applies its own outer optimizer step to the mixed pseudo-gradient:

    x_{r+1} = x_r - outer_opt(mix(x_r - x_r^{(H)}))

``outer_opt`` is an optax transformation applied per node: ``sgd`` (``u = lr * g``) or
``nesterov`` (``m <- mu m + g``, ``u = lr (g + mu m)``; DiLoCo uses lr 0.7, mu 0.9). With
``sgd``, lr 1 and the exact average this is local SGD with model averaging. With H = 1 the
pseudo-gradient is the (mixed) single inner update, so the outer optimizer acts as a second,
communicated momentum on top of the inner optimizer.

Shapes: every leaf of the node-stacked pytree is [N, ...]; the outer optimizer state (momentum)
is node-local, [N, ...], and never communicated.

Reference: Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language
Models", 2023, arXiv:2311.08105.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import optax

from jaxgossip.types import Params

__all__ = ["OUTER_OPTIMIZERS", "OuterState", "make_outer_optimizer", "outer_init", "pseudo_gradient", "outer_step"]

#: outer optimizer names; ``none`` means no outer loop (the models themselves are communicated).
OUTER_OPTIMIZERS = ("none", "sgd", "nesterov")


class OuterState(NamedTuple):
    """What the outer loop carries between rounds. The anchor ``x_r`` is the run's model itself
    (the round starts from it), so only the optimizer state is kept here.

    Attributes:
      opt_state: the node-local state of the outer optax transformation, leaves [N, ...].
    """

    opt_state: Any


def make_outer_optimizer(name: str, lr: float, momentum: float = 0.9) -> optax.GradientTransformation | None:
    """The outer optax transformation of ``name`` (None for ``"none"``).

    Raises:
      ValueError: an unknown name, ``lr <= 0`` or ``momentum`` outside [0, 1).
    """
    if name not in OUTER_OPTIMIZERS:
        raise ValueError(f"outer_optimizer={name!r} is unknown; known: {', '.join(OUTER_OPTIMIZERS)}")
    if name == "none":
        return None
    if not lr > 0:
        raise ValueError(f"outer_lr={lr!r} must be > 0")
    if name == "sgd":
        return optax.sgd(lr)
    if not 0 <= momentum < 1:
        raise ValueError(f"outer_momentum={momentum!r} must be in [0, 1)")
    return optax.sgd(lr, momentum=momentum, nesterov=True)


def outer_init(tx: optax.GradientTransformation, params: Params) -> OuterState:
    """The outer state at round 0 for models ``params`` [N, ...] (per-node optimizer state)."""
    return OuterState(opt_state=jax.vmap(tx.init)(params))


def pseudo_gradient(anchor: Params, inner: Params) -> Params:
    """``Delta = x_r - x_r^{(H)}`` [N, ...]: what the algorithm communicates."""
    return jax.tree_util.tree_map(lambda a, b: a - b, anchor, inner)


def outer_step(
    tx: optax.GradientTransformation, state: OuterState, anchor: Params, mixed: Params
) -> tuple[Params, OuterState]:
    """``x_{r+1} = x_r - outer_opt(mixed)`` per node, with ``anchor`` = ``x_r`` and ``mixed`` the
    mixed pseudo-gradient (leaves [N, ...]); returns the new models and the new state."""
    updates, opt_state = jax.vmap(tx.update)(mixed, state.opt_state, anchor)
    # optax descends along -grad: the pseudo-gradient plays the gradient.
    return optax.apply_updates(anchor, updates), OuterState(opt_state=opt_state)
