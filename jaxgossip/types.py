"""Type aliases and the core NamedTuples shared by every jaxgossip module.

Axis letters used in every docstring: N (nodes), E (edges, self-loops included), T (period of a
time-varying graph), D (flat parameter dimension of one node), K (top-k kept coordinates or
neighbour slots), R (rank), B (batch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

Array = jax.Array
PRNGKey = jax.Array
Params = Any  # pytree whose leaves are [N, ...]
State = Any  # NamedTuple of arrays


class StepInfo(NamedTuple):
    """What one communication round reports.

    Attributes:
      bits: [N] float32, the bits each node *sent* during this round, summed over all of its
        messages (one message per (sender, receiver) pair, self-loops excluded).
    """

    bits: Array


InitFn = Callable[[Params], State]
StepFn = Callable[[Params, State, PRNGKey], tuple[Params, State, StepInfo]]
DebiasFn = Callable[[Params, State], Params]


class GossipAlgorithm(NamedTuple):
    """A communication algorithm as a triple of pure functions (optax style).

    Attributes:
      init: ``state = init(params)`` with params a pytree of leaves ``[N, ...]``.
      step: ``params, state, info = step(params, state, key)``: one communication round. The state
        carries the round counter, so ``step`` needs no ``t`` argument.
      debias: ``z = debias(params, state)``: the model each node evaluates and differentiates at
        (``x / w`` for push-sum methods, ``params`` otherwise).
      name: registry name of the algorithm (static metadata).
    """

    init: InitFn
    step: StepFn
    debias: DebiasFn
    name: str = ""
