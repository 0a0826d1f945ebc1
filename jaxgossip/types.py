"""Type aliases and the core NamedTuples shared by every jaxgossip module.

Axis letters used in every docstring: N (nodes), E (edges, self-loops included), T (period of a
time-varying graph), D (flat parameter dimension of one node), K (top-k kept coordinates or
neighbour slots), R (rank), B (batch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
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
Grads = Any  # pytree like Params: one gradient per node, leaves [N, ...]
GradientFn = Callable[[Grads, Params, State], tuple[Grads, State]]


# The runners' orderings of local step and communication: "atc" (local step, then communication)
# and "same_iterate" (gradient and communication at the same iterate). The one definition; the
# runners (jaxgossip.engine.training, jaxgossip.engine.optimization) and the run configs import it.
ORDERINGS = ("atc", "same_iterate")


class GossipAlgorithm(NamedTuple):
    """A communication algorithm as a triple of pure functions (optax style).

    Attributes:
      init: ``state = init(params)`` with params a pytree of leaves ``[N, ...]``.
      step: ``params, state, info = step(params, state, key)``: one communication round. The state
        carries the round counter, so ``step`` needs no ``t`` argument.
      debias: ``z = debias(params, state)``: the model each node evaluates and differentiates at
        (``x / w`` for push-sum methods, ``params`` otherwise).
      name: registry name of the algorithm (static metadata).
      gradient: optional gradient hook, ``grads, state = gradient(grads, params, state)``, for
        gradient-aware methods (gradient tracking, quasi-global momentum). The runners call it
        once per local step, on the stacked gradients (leaves ``[N, ...]``) and the debiased
        params they were taken at, and feed the grads it returns to the local optimizer
        (:func:`jaxgossip.engine.local_step.local_update`). It is node-local: it may read and write the
        state and replace the gradient, but sends nothing; every message is sent (and its bits
        counted) in ``step``. ``None`` (the default) leaves the gradient untouched.
      orderings: the runner orderings under which it is the method it claims to be (default
        all of :data:`ORDERINGS`): a factory sets its :attr:`AlgorithmInfo.orderings`, and
        :func:`jaxgossip.algorithms.make` narrows them to a plug-in's metadata;
        :func:`jaxgossip.engine.local_step.check_ordering` refuses the others.
    """

    init: InitFn
    step: StepFn
    debias: DebiasFn
    name: str = ""
    gradient: GradientFn | None = None
    orderings: tuple[str, ...] = ORDERINGS


MIXINGS = ("doubly_stochastic", "column_stochastic", "symmetric", "any")
# The metadata fields that state a graph requirement (checked by jaxgossip.algorithms.check_graph);
# AlgorithmInfo.reasons says why, keyed by these.
GRAPH_REQUIREMENTS = ("mixing", "time_varying", "stackable", "stochastic_graphs", "tree")
# Which stochastic graphs (jaxgossip.topology.stochastic) an algorithm runs on: none; only failures
# of a fixed graph (state tied to fixed neighbours: public copies, per-edge state); any.
STOCHASTIC_GRAPHS = ("none", "failures", "any")
# Execution modes: "sync" (lock-step rounds, every registered algorithm) and "async" (each node on
# its own simulated clock, jaxgossip.engine.asynchronous; only algorithms with AlgorithmInfo.asynchronous).
EXECUTIONS = ("sync", "async")


def one_exchange(options: Mapping[str, Any]) -> int:
    """The default of :attr:`AlgorithmInfo.exchanges`: one exchange per round, whatever the options."""
    del options
    return 1


@dataclasses.dataclass(frozen=True)
class AlgorithmInfo:
    """Registry metadata of an algorithm: every fact other modules need about it (none of them tests
    an algorithm's name). Each algorithm file declares one next to its factory.

    The graph requirements (:data:`GRAPH_REQUIREMENTS`) are checked in one place,
    :func:`jaxgossip.algorithms.check_graph`: by each built-in factory with its own metadata, and
    by :func:`jaxgossip.algorithms.make` for every other algorithm, before the factory runs.

    Attributes:
      factory: ``factory(topology, **hyperparameters) -> GossipAlgorithm``.
      mixing: the mixing matrix it needs: ``"doubly_stochastic"`` (mean-preserving W),
        ``"column_stochastic"`` (push-sum: columns sum to 1; ``debias`` is ``x / w``),
        ``"symmetric"`` (doubly stochastic and W(t) = W(t)^T), or ``"any"``.
      time_varying: whether it runs on graphs with period T > 1.
      stackable: whether it accepts a stacked :class:`~jaxgossip.topology.Topology` (traced
        tables), so same-shape graphs share one compile in topology sweeps; False means it builds
        host tables from the graph (a stack is refused).
      exchanges: ``options -> I``, sequential exchanges per round, for the cost model.
      shape_options: option -> why it changes array shapes (the sweeps' refusal message).
      allreduce_cost: the cost model prices a round as an all-reduce rather than gossip on the graph.
      trainer_options: option defaults the trainer sets (a user's option wins).
      relaxation_gamma: its ``gamma`` is the relaxed step ``x + gamma (W - I) x``, whose stable
        range on a symmetric W is checked (``jaxgossip.run.config.gamma_warning``).
      orderings: the runner orderings under which it is the method it claims to be (default
        both); the factory copies them into :attr:`GossipAlgorithm.orderings`, where
        :func:`jaxgossip.engine.local_step.check_ordering` reads them and refuses the others. D^2 corrects the
        model that was communicated, so it needs the local step before communication ("atc").
      stochastic_graphs: which graphs drawn anew every round it runs on (its step reads the round's
        graph with ``topology.draw(key, t)``): ``"none"`` (the default, e.g. a plug-in written for
        fixed tables), ``"failures"`` (only ``with_failures`` of a fixed graph: its state is tied to
        fixed neighbours) or ``"any"`` (also ``random_matching``, ``random_out``).
      step_size: the name of its consensus step-size option (e.g. ``"gamma"``), a traced value that
        ``jaxgossip tune-gamma`` sweeps; None if it has none.
      public_init: it keeps public copies of the models (Choco-style) and takes the option
        ``public_init="zero" | "model"`` (start them at 0 or at the initial models).
      reasons: why the algorithm has a graph requirement, keyed by the requirement's field
        (:data:`GRAPH_REQUIREMENTS`: ``"mixing"``, ``"time_varying"``, ``"stackable"``,
        ``"stochastic_graphs"``, ``"tree"``); :func:`jaxgossip.algorithms.check_graph` puts the reason in its
        refusal (a generic one when none is given). E.g. Choco's ``time_varying=False`` because
        ``s_i = sum_j W_ij x_hat_j`` assumes a fixed W. The key ``"receive"`` says why an algorithm
        without :attr:`receive` cannot be attacked, the key ``"execution"`` why it has no
        asynchronous form.
      receive: for an algorithm whose messages are its models (each node sends its current model
        to every out-neighbour): ``receive(topology, **options) -> round_fn`` with
        ``params, state, info = round_fn(params, state, received, key)``, the round as a function
        of the models each receiver reads per in-neighbour slot
        (:class:`jaxgossip.algorithms.Received`). The Byzantine wrapper
        (:func:`jaxgossip.algorithms.byzantine`) replaces what attackers send through it. None:
        the messages are not plain models (compressed differences, push-sum pairs, factors), and
        the algorithm cannot be attacked.
      tree: it needs an undirected tree (connected, N - 1 links) and relays messages along it
        (RelaySum); :func:`jaxgossip.algorithms.check_graph` refuses any other graph, naming its
        cycle, its disconnection or a link without its reverse. The mixing weights are not read.
      asynchronous: the asynchronous algorithms of :mod:`jaxgossip.engine.asynchronous` that run it
        without rounds (each node on its own simulated clock), the first one the default, e.g.
        ``("async_gossip", "ad_psgd")`` for gossip; empty (the default): it runs in synchronous
        rounds only. :attr:`execution` is derived from it, and
        :func:`jaxgossip.algorithms.check_execution` refuses the modes it lacks with
        ``reasons["execution"]`` (a generic reason when none is given).
      example_options: for an algorithm whose defaults alone are refused because a choice is the
        user's (a compression budget, a step size that depends on the graph, the optimizer's
        learning rate), the options its refusal asks for, at values that run the small end-to-end
        task of ``tests/project/test_e2e_matrix.py``; empty when the defaults run.
    """

    factory: Callable[..., GossipAlgorithm]
    mixing: str = "any"
    time_varying: bool = True
    stackable: bool = False
    exchanges: Callable[[Mapping[str, Any]], int] = one_exchange
    shape_options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    allreduce_cost: bool = False
    trainer_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    relaxation_gamma: bool = False
    orderings: tuple[str, ...] = ORDERINGS
    stochastic_graphs: str = "none"
    step_size: str | None = None
    public_init: bool = False
    reasons: Mapping[str, str] = dataclasses.field(default_factory=dict)
    receive: Callable[..., Callable] | None = None
    tree: bool = False
    asynchronous: tuple[str, ...] = ()
    example_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def execution(self) -> tuple[str, ...]:
        """The execution modes it supports (:data:`EXECUTIONS`): ``("sync",)``, plus ``"async"``
        when it has an :attr:`asynchronous` form."""
        return ("sync", "async") if self.asynchronous else ("sync",)

    def __post_init__(self):
        if not callable(self.factory):
            raise TypeError(f"factory={self.factory!r} is not callable: expected factory(topology, **options)")
        if self.mixing not in MIXINGS:
            raise ValueError(f"mixing={self.mixing!r} is unknown; known: {', '.join(MIXINGS)}")
        if self.stochastic_graphs not in STOCHASTIC_GRAPHS:
            raise ValueError(
                f"stochastic_graphs={self.stochastic_graphs!r} is unknown; known: {', '.join(STOCHASTIC_GRAPHS)}"
            )
        for field in ("time_varying", "stackable", "allreduce_cost", "relaxation_gamma", "public_init", "tree"):
            if not isinstance(getattr(self, field), bool):
                raise TypeError(f"{field}={getattr(self, field)!r} must be True or False")
        if self.step_size is not None and (not isinstance(self.step_size, str) or not self.step_size):
            raise TypeError(f"step_size={self.step_size!r} must be None or the name of an option, e.g. 'gamma'")
        if not callable(self.exchanges):
            raise TypeError(f"exchanges={self.exchanges!r} must be a function options -> int")
        if self.receive is not None and not callable(self.receive):
            raise TypeError(f"receive={self.receive!r} must be None or a function receive(topology, **options)")
        if (
            not isinstance(self.orderings, tuple)
            or not self.orderings
            or any(o not in ORDERINGS for o in self.orderings)
        ):
            raise ValueError(f"orderings={self.orderings!r} must be a non-empty tuple of {ORDERINGS}")
        for field in ("shape_options", "trainer_options", "reasons", "example_options"):
            if not isinstance(getattr(self, field), Mapping):
                raise TypeError(f"{field}={getattr(self, field)!r} must be a mapping")
        if not isinstance(self.asynchronous, tuple) or not all(isinstance(a, str) and a for a in self.asynchronous):
            raise TypeError(
                f"asynchronous={self.asynchronous!r} must be a tuple of asynchronous algorithm names "
                "(jaxgossip.engine.asynchronous.ALGORITHMS), e.g. ('async_gossip',)"
            )
        unknown = sorted(set(self.reasons) - set(GRAPH_REQUIREMENTS) - {"receive", "execution"})
        if unknown or not all(isinstance(why, str) and why for why in self.reasons.values()):
            raise ValueError(
                f"reasons={dict(self.reasons)!r} must map graph requirements ({', '.join(GRAPH_REQUIREMENTS)}), "
                "'receive' or 'execution' to non-empty strings" + (f"; unknown: {unknown}" if unknown else "")
            )

    def exchanges_per_round(self, options: Mapping[str, Any]) -> int:
        """Sequential exchanges per round with ``options`` (an int >= 1)."""
        value = self.exchanges(dict(options))
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"exchanges(options) returned {value!r}; it must be an int >= 1")
        return value
