"""Decentralized DiLoCo: an outer optimizer over the pseudo-gradients of H local steps.

Each round r every node i starts from its model ``x_r,i``, takes H inner (local) optimizer steps
to ``y_r,i = x_r,i^{(H)}``, the communication algorithm runs one round (gossip, compressed gossip,
PowerGossip, push-sum, ...; ``allreduce`` is the exact average, the original DiLoCo), and every
node applies its own outer optimizer step to a pseudo-gradient ``Delta_r,i``. What the algorithm
communicates is ``message``:

* ``"model"`` (the default): the inner result, as in a run without an outer optimizer::

      z_r = comm(y_r),   Delta_r = x_r - z_r,   x_{r+1} = x_r - outer_opt(Delta_r)

  The pseudo-gradient contains the consensus step ``x_r - comm(x_r)``, so the outer step pulls the
  nodes together as the algorithm does on its own: with ``sgd`` at lr 1, ``x_{r+1} = comm(y_r)``,
  the run without an outer optimizer. The algorithm sees a sequence of models as in a normal run
  (each round's models differ from the last by a node-local update), which is what its state
  assumes: Choco's public copies and PowerGossip's warm-started factors track slowly moving
  models, push-sum's weights de-bias the models it carries. For push-sum methods (``debias`` is
  ``x / w``) the pseudo-gradient is taken between de-biased models,
  ``Delta = debias(x_r) - debias(z_r)``, so a consensus of de-biased models stays a fixed point
  whatever the weights; the step is applied to the numerators as a local update is (SGP adds the
  optimizer's update to the numerator), ``x_{r+1} = z_r + (Delta_r - outer_opt(Delta_r))``, which is
  ``x_r - outer_opt(Delta_r)`` whenever ``debias`` is the identity. Computed in that form, ``sgd``
  at lr 1 adds an exact zero: bitwise the run without an outer optimizer, for every algorithm.

* ``"pseudo_gradient"``: the pseudo-gradients themselves::

      x_{r+1} = x_r - outer_opt(comm(x_r - y_r))

  With the exact average this is the original DiLoCo bit for bit; from equal models the two forms
  give the same iterates (``x_r - mean(y_r)`` either way, to float rounding). Under inexact
  averaging nothing pulls the models together: with ``sgd`` on ``f_i = 0.5 ||x - b_i||^2`` the
  nodes' disagreement is multiplied by ``I - outer_lr * c W`` per round (``c = 1 - (1 - lr)^H``),
  so the eigenvalues of W below 0 (ring, torus) make those modes grow and the models drift apart.
  Push-sum methods de-bias with the weights of the sequence they carry, which are not those of
  the pseudo-gradients: sound only where the weights stay 1 (a doubly stochastic W).

**Quantised outer gradients** (``message_bits`` B in {4, 8, 16}, ``"pseudo_gradient"`` only): the
pseudo-gradients are sent as B-bit floats with a float32 scale per node and leaf
(:mod:`jaxgossip.ops.quantize`; Streaming DiLoCo all-reduces 4-bit outer gradients), the
algorithm's round runs on the dequantised ``q(Delta)`` and its change is added to ``Delta``::

      x_{r+1} = x_r - outer_opt(Delta_r + comm(q(Delta_r)) - q(Delta_r))

so under ``allreduce`` each node's own pseudo-gradient enters exactly and only the others' are
rounded. Allowed with algorithms whose messages are dense
(:attr:`jaxgossip.types.CostFacts.dense_values`: gossip, allreduce, push-sum), which are then
charged B bits per value and 32 per scale. A model is not quantised this way: ``"model"`` refuses.

``outer_opt`` is an optax transformation applied per node: ``sgd`` (``u = lr * g``) or
``nesterov`` (``m <- mu m + g``, ``u = lr (g + mu m)``; DiLoCo uses lr 0.7, mu 0.9). With H = 1
the pseudo-gradient is one inner update plus (``"model"``) the consensus step, so the outer
optimizer acts as a second momentum over what each round changes.

Shapes: every leaf of the node-stacked pytrees (models, pseudo-gradients) is [N, ...]; the outer
optimizer state (momentum) is node-local, [N, ...], and never communicated.

Reference: Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language
Models", 2023, arXiv:2311.08105.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import optax

from jaxgossip.ops.mixing import where_nodes
from jaxgossip.types import Array, GossipAlgorithm, Params, PRNGKey, State, StepInfo

__all__ = [
    "OUTER_OPTIMIZERS",
    "OUTER_MESSAGES",
    "OuterState",
    "OuterRound",
    "make_outer_optimizer",
    "check_outer_message",
    "quantized_sender",
    "outer_init",
    "pseudo_gradient",
    "outer_step",
    "model_outer_step",
    "outer_round",
]

#: outer optimizer names; ``none`` means no outer loop (the models themselves are communicated).
OUTER_OPTIMIZERS = ("none", "sgd", "nesterov")
#: what the algorithm communicates under an outer optimizer (module docstring).
OUTER_MESSAGES = ("model", "pseudo_gradient")


class OuterState(NamedTuple):
    """What the outer loop carries between rounds. The anchor ``x_r`` is the run's model itself
    (the round starts from it), so only the optimizer state is kept here.

    Attributes:
      opt_state: the node-local state of the outer optax transformation, leaves [N, ...].
    """

    opt_state: Any


class OuterRound(NamedTuple):
    """One communication round with the outer step (:func:`outer_round`).

    Attributes:
      params: ``x_{r+1}``, leaves [N, ...].
      comm_state: the algorithm's state after its round.
      outer: the new :class:`OuterState`.
      info: the algorithm's :class:`~jaxgossip.types.StepInfo` (bits [N]).
    """

    params: Params
    comm_state: State
    outer: OuterState
    info: StepInfo


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


def check_outer_message(message: str) -> str:
    """``message`` if it is one of :data:`OUTER_MESSAGES`; else ValueError naming it."""
    if message not in OUTER_MESSAGES:
        raise ValueError(f"outer_message={message!r} is unknown; known: {', '.join(OUTER_MESSAGES)}")
    return message


def quantized_sender(
    algorithm: GossipAlgorithm, bits: int, outer: optax.GradientTransformation | None, message: str
) -> GossipAlgorithm:
    """``algorithm`` sending its outer messages as B-bit floats (module docstring); itself for 32.

    Raises:
      ValueError: ``bits`` not in 4, 8, 16, 32; B < 32 without an outer optimizer, with
        ``message="model"``, or with an algorithm whose metadata does not declare dense messages.
    """
    from jaxgossip import algorithms
    from jaxgossip.ops import quantize

    if quantize.check_message_bits(bits) == 32:
        return algorithm
    if outer is None:
        raise ValueError(
            f"outer_message_bits={bits} quantises the outer gradients: it needs an outer optimizer "
            "(--outer_optimizer=sgd|nesterov)"
        )
    if message != "pseudo_gradient":
        raise ValueError(
            f"outer_message_bits={bits} with outer_message={message!r}: the message is then the model, and "
            "quantising models is a different method; use --outer_message=pseudo_gradient"
        )
    try:
        dense = algorithms.resolve(algorithm.name).cost.dense_values
    except (ValueError, TypeError):  # a wrapper (the Byzantine one) or an unregistered algorithm
        dense = False
    if not dense:
        raise ValueError(
            f"outer_message_bits={bits} with algorithm {algorithm.name or '(unnamed)'}: its registry metadata "
            "does not declare dense messages (CostFacts.dense_values), so its bits cannot be repriced at "
            f"{bits} bits per value; use a registered algorithm that sends every value (gossip, allreduce, "
            "push_sum) without a wrapper"
        )
    return quantize.with_quantized_messages(algorithm, bits)


def outer_init(tx: optax.GradientTransformation, params: Params) -> OuterState:
    """The outer state at round 0 for models ``params`` [N, ...] (per-node optimizer state)."""
    return OuterState(opt_state=jax.vmap(tx.init)(params))


def pseudo_gradient(anchor: Params, inner: Params) -> Params:
    """``Delta = x_r - y`` [N, ...] with ``y`` the inner result (``"pseudo_gradient"``: the message)
    or the communicated models (``"model"``)."""
    return jax.tree_util.tree_map(lambda a, b: a - b, anchor, inner)


def outer_step(
    tx: optax.GradientTransformation, state: OuterState, anchor: Params, mixed: Params
) -> tuple[Params, OuterState]:
    """``x_{r+1} = x_r - outer_opt(mixed)`` per node, with ``anchor`` = ``x_r`` and ``mixed`` the
    communicated pseudo-gradient (leaves [N, ...]); returns the new models and the new state."""
    updates, opt_state = jax.vmap(tx.update)(mixed, state.opt_state, anchor)
    # optax descends along -grad: the pseudo-gradient plays the gradient.
    return optax.apply_updates(anchor, updates), OuterState(opt_state=opt_state)


def model_outer_step(
    tx: optax.GradientTransformation, state: OuterState, communicated: Params, delta: Params
) -> tuple[Params, OuterState]:
    """``x_{r+1} = z + (Delta - outer_opt(Delta))`` per node (``"model"``), with ``communicated`` =
    ``z = comm(y)`` and ``delta`` = ``Delta`` (leaves [N, ...]); returns the new models and state.

    Equal to ``x_r - outer_opt(Delta)`` for ``Delta = x_r - z``; written as the outer step's
    departure from ``z`` so that ``outer_opt(Delta) = Delta`` (``sgd`` at lr 1) leaves ``z`` bitwise."""
    updates, opt_state = jax.vmap(tx.update)(delta, state.opt_state, communicated)
    # updates = -outer_opt(Delta): the correction Delta + updates is an exact 0 when they cancel.
    params = jax.tree_util.tree_map(lambda z, d, u: z + (d + u).astype(z.dtype), communicated, delta, updates)
    return params, OuterState(opt_state=opt_state)


def outer_round(
    algorithm: GossipAlgorithm,
    tx: optax.GradientTransformation,
    message: str,
    outer_state: OuterState,
    anchor: Params,
    anchor_comm_state: State,
    inner: Params,
    comm_state: State,
    key: PRNGKey,
    online: Array | None = None,
) -> OuterRound:
    """One round of the algorithm with the outer step (module docstring, both ``message`` forms).

    Args:
      algorithm: the communication algorithm.
      tx: the outer optax transformation (:func:`make_outer_optimizer`).
      message: ``"model"`` or ``"pseudo_gradient"`` (:data:`OUTER_MESSAGES`).
      outer_state: the :class:`OuterState` of round r.
      anchor: ``x_r``, leaves [N, ...], the models the round started from.
      anchor_comm_state: the algorithm state ``x_r`` is read with (``debias(x_r, .)``).
      inner: ``y_r = x_r^{(H)}``, leaves [N, ...], the inner result.
      comm_state: the algorithm state to communicate with (after the local steps' gradient hook).
      key: the round's communication key.
      online: optional [N] bool, the nodes online this round; an offline node keeps what the
        algorithm left it (its model) and its outer state, without an outer step.

    Returns:
      An :class:`OuterRound`.
    """
    if message == "model":
        z, comm_state, info = algorithm.step(inner, comm_state, key)
        delta = pseudo_gradient(algorithm.debias(anchor, anchor_comm_state), algorithm.debias(z, comm_state))
        params, new_outer = model_outer_step(tx, outer_state, z, delta)
        stay = z
    elif message == "pseudo_gradient":
        mixed, comm_state, info = algorithm.step(pseudo_gradient(anchor, inner), comm_state, key)
        params, new_outer = outer_step(tx, outer_state, anchor, mixed)
        stay = anchor
    else:
        raise ValueError(f"outer_message={message!r} is unknown; known: {', '.join(OUTER_MESSAGES)}")
    if online is not None:
        # Without this a node's momentum would keep moving it while it is offline.
        params, new_outer = where_nodes(online, params, stay), where_nodes(online, new_outer, outer_state)
    return OuterRound(params=params, comm_state=comm_state, outer=new_outer, info=info)
