"""The local update both runners share: gradient hook, then the local optimizer.

:func:`jaxgossip.engine.optimization.optimization_scan` and :func:`jaxgossip.engine.training.make_train` compute
every node's gradient at its debiased local iterate ``z`` and turn it into an update through
:func:`local_update`, the one place where an algorithm's optional gradient hook
(:attr:`jaxgossip.types.GossipAlgorithm.gradient`) runs:

.. math::

    (\\tilde g, s) = \\mathrm{gradient}(g, z, s), \\qquad
    (u, o) = \\mathrm{optimizer.update}(\\tilde g, o, z)

with ``g`` and ``z`` stacked over the N nodes (leaves ``[N, ...]``), ``s`` the algorithm state
and ``o`` the per-node optimizer state (vmapped). Without a hook ``g~ = g`` and ``s`` is untouched,
so an algorithm without one takes plain optimizer steps on its raw gradients.

The hook runs once per local step (H times per round with ``local_steps = H``), under either
ordering, before the communication round of ``step``; it sends nothing.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import optax

from jaxgossip.types import ORDERINGS, GossipAlgorithm, Params

__all__ = ["LocalUpdate", "local_update", "check_ordering"]


class LocalUpdate(NamedTuple):
    """What :func:`local_update` returns (leaves ``[N, ...]``)."""

    updates: Params  # the optimizer's update of every node, to be added to its params
    opt_state: Any  # the new per-node optimizer state
    comm_state: Any  # the algorithm state, as the gradient hook left it


def local_update(
    alg: GossipAlgorithm,
    optimizer: optax.GradientTransformation,
    grads: Params,
    params: Params,
    opt_state: Any,
    comm_state: Any,
) -> LocalUpdate:
    """Runs ``alg``'s gradient hook (if any) on ``grads`` taken at ``params``, then the optimizer.

    Args:
      alg: the communication algorithm; its ``gradient`` field may be None.
      optimizer: the local optax transformation, applied per node (``vmap``).
      grads: gradients of every node, leaves ``[N, ...]``.
      params: the (debiased) params the gradients were taken at, leaves ``[N, ...]``.
      opt_state: per-node optimizer state.
      comm_state: the algorithm state.

    Returns:
      :class:`LocalUpdate` ``(updates, opt_state, comm_state)``.
    """
    hook = getattr(alg, "gradient", None)
    if hook is not None:
        grads, comm_state = hook(grads, params, comm_state)
    updates, opt_state = jax.vmap(optimizer.update)(grads, opt_state, params)
    return LocalUpdate(updates, opt_state, comm_state)


def check_ordering(alg: GossipAlgorithm, ordering: str) -> None:
    """Raises ValueError when ``ordering`` is not one of the algorithm's own
    :attr:`~jaxgossip.types.GossipAlgorithm.orderings` (its metadata's, set by the registry:
    :func:`jaxgossip.algorithms.sign`); unknown orderings too.

    An object without an ``orderings`` attribute (duck-typed ``init``/``step``/``debias``) runs
    under every ordering.
    """
    if ordering not in ORDERINGS:
        raise ValueError(f"ordering={ordering!r} is unknown; known orderings: {ORDERINGS}")
    orderings = tuple(getattr(alg, "orderings", ORDERINGS))
    if ordering not in orderings:
        raise ValueError(
            f"{getattr(alg, 'name', '') or 'the algorithm'} is registered with orderings={orderings}: "
            f"ordering={ordering!r} would run a different method (its docstring says why); "
            f"use ordering={orderings[0]!r}"
        )
