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
HonestFn = Callable[[State], Array]


def carries_push_sum_weight(state: State) -> bool:
    """Whether ``state`` is a push-sum state: its NamedTuple type declares the class attribute
    ``push_sum_weight = True`` (a class attribute, not a field) next to its field ``w``, the ``[N]``
    weights by which ``debias`` divides the numerators (the params). push_sum's and sparse_push's
    states declare it (SCSP's state is sparse_push's). The final merge
    (:mod:`jaxgossip.algorithms.merge`) mixes a push-sum state's weights with the numerators and
    the params of any other state alone, so a field that happens to be named ``w`` is not read as
    a weight unless its state says so."""
    return getattr(type(state), "push_sum_weight", False) is True


def round_counter(state: State) -> Array | None:
    """The round counter of ``state``: its field ``count`` (``[]`` int32, the rounds done, from
    which ``step`` reads the round t; every built-in state has one), or None for a state without
    one (the Byzantine wrapper's, whose counter is its inner state's)."""
    return state.count if "count" in getattr(type(state), "_fields", ()) else None


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
      name: the name it is registered under (or its import path): set by the registry
        (:func:`jaxgossip.algorithms.sign`, which :func:`jaxgossip.algorithms.make` and every
        built-in factory call), not by the algorithm's own code; error messages name it.
      gradient: optional gradient hook, ``grads, state = gradient(grads, params, state)``, for
        gradient-aware methods (gradient tracking, quasi-global momentum). The runners call it
        once per local step, on the stacked gradients (leaves ``[N, ...]``) and the debiased
        params they were taken at, and feed the grads it returns to the local optimizer
        (:func:`jaxgossip.engine.local_step.local_update`). It is node-local: it may read and write the
        state and replace the gradient, but sends nothing; every message is sent (and its bits
        counted) in ``step``. ``None`` (the default) leaves the gradient untouched.
      orderings: the runner orderings under which it is the method it claims to be (default
        all of :data:`ORDERINGS`): a copy of its metadata's :attr:`Execution.orderings`, set by the
        registry with ``name`` (:func:`jaxgossip.algorithms.sign`);
        :func:`jaxgossip.engine.local_step.check_ordering` reads them here and refuses the others.
      honest: optional ``mask = honest(state)``, ``[N]`` bool: True for the nodes that follow the
        algorithm, False for attackers. The trainer's evaluation metrics (the averaged model's
        loss, accuracy and norm, the per-node accuracies and losses, the consensus distance) are
        over the nodes it marks True only (:func:`jaxgossip.engine.training.make_train`). The Byzantine wrapper
        (:func:`jaxgossip.algorithms.byzantine`) sets it to read the mask its state carries.
        ``None`` (the default): every node is honest.
    """

    init: InitFn
    step: StepFn
    debias: DebiasFn
    name: str = ""
    gradient: GradientFn | None = None
    orderings: tuple[str, ...] = ORDERINGS
    honest: HonestFn | None = None


MIXINGS = ("doubly_stochastic", "column_stochastic", "symmetric", "any")
# The fields of GraphNeeds that state a graph requirement (checked by jaxgossip.algorithms.check_graph);
# GraphNeeds.reasons says why, keyed by these.
GRAPH_REQUIREMENTS = ("mixing", "time_varying", "stackable", "stochastic_graphs", "tree")
# Which stochastic graphs (jaxgossip.topology.stochastic) an algorithm runs on: none; only failures
# of a fixed graph (state tied to fixed neighbours: public copies, per-edge state); any.
STOCHASTIC_GRAPHS = ("none", "failures", "any")
# Execution modes: "sync" (lock-step rounds, every registered algorithm) and "async" (each node on
# its own simulated clock, jaxgossip.engine.asynchronous; only algorithms with an asynchronous form).
EXECUTIONS = ("sync", "async")
# The event rules of jaxgossip.engine.asynchronous that an asynchronous form runs (AsyncForm.rule),
# each with the weights of the graph it reads (ASYNC_WEIGHTS, the same order):
# "pairwise_averaging" (AD-PSGD: the node and a random out-neighbour average atomically; no weight),
# "stale_mixing" (x_i <- W_ii x_i + sum_j W_ij c_ij with the newest copies c_ij that have arrived;
# each receiver's weights, self included, sum to 1), "delayed_push_sum" (push-sum shares of (x, w)
# added by the receiver when they arrive; column-stochastic weights).
ASYNC_RULES = ("pairwise_averaging", "stale_mixing", "delayed_push_sum")
ASYNC_WEIGHTS = ("none", "receiver_stochastic", "column_stochastic")


def one_exchange(options: Mapping[str, Any]) -> int:
    """The default of :attr:`CostFacts.exchanges`: one exchange per round, whatever the options."""
    del options
    return 1


def _check_bools(group: Any, fields: tuple[str, ...]) -> None:
    for field in fields:
        if not isinstance(getattr(group, field), bool):
            raise TypeError(f"{field}={getattr(group, field)!r} must be True or False")


def _check_mappings(group: Any, fields: tuple[str, ...]) -> None:
    for field in fields:
        if not isinstance(getattr(group, field), Mapping):
            raise TypeError(f"{field}={getattr(group, field)!r} must be a mapping")


def _check_reasons(reasons: Any, keys: tuple[str, ...]) -> None:
    if not isinstance(reasons, Mapping):
        raise TypeError(f"reasons={reasons!r} must be a mapping")
    unknown = sorted(set(reasons) - set(keys))
    if unknown or not all(isinstance(why, str) and why for why in reasons.values()):
        raise ValueError(
            f"reasons={dict(reasons)!r} must map {', '.join(keys)} to non-empty strings"
            + (f"; unknown: {unknown}" if unknown else "")
        )


@dataclasses.dataclass(frozen=True)
class GraphNeeds:
    """The graphs an algorithm runs on. Read by :func:`jaxgossip.algorithms.check_graph` (every
    built-in factory and :func:`jaxgossip.algorithms.make` call it); ``stackable`` also by the
    topology sweeps (same-shape graphs in one compile), and ``mixing``, ``time_varying`` and
    ``tree`` by the choice of a graph for a method from a user's file (the demo, the feature matrix
    of ``jaxgossip.run.features``).

    Attributes:
      mixing: the mixing matrix it needs: ``"doubly_stochastic"`` (mean-preserving W),
        ``"column_stochastic"`` (push-sum: columns sum to 1; ``debias`` is ``x / w``),
        ``"symmetric"`` (doubly stochastic and W(t) = W(t)^T), or ``"any"``.
      time_varying: whether it runs on graphs with period T > 1.
      stackable: whether it accepts a stacked :class:`~jaxgossip.topology.Topology` (traced
        tables), so same-shape graphs share one compile in topology sweeps; False means it builds
        host tables from the graph (a stack is refused).
      stochastic_graphs: which graphs drawn anew every round it runs on (its step reads the round's
        graph with ``topology.draw(key, t)``): ``"none"`` (the default, e.g. a plug-in written for
        fixed tables), ``"failures"`` (only ``with_failures`` of a fixed graph: its state is tied to
        fixed neighbours) or ``"any"`` (also ``random_matching``, ``random_out``).
      tree: it needs an undirected tree (connected, N - 1 links) and relays messages along it
        (RelaySum); :func:`jaxgossip.algorithms.check_graph` refuses any other graph, naming its
        cycle, its disconnection or a link without its reverse. The mixing weights are not read.
      reasons: why it has a requirement, keyed by the field (:data:`GRAPH_REQUIREMENTS`); the
        refusal of :func:`jaxgossip.algorithms.check_graph` gives it (a generic one when none is
        given). E.g. Choco's ``time_varying=False`` because ``s_i = sum_j W_ij x_hat_j`` assumes a
        fixed W.
    """

    mixing: str = "any"
    time_varying: bool = True
    stackable: bool = False
    stochastic_graphs: str = "none"
    tree: bool = False
    reasons: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.mixing not in MIXINGS:
            raise ValueError(f"mixing={self.mixing!r} is unknown; known: {', '.join(MIXINGS)}")
        if self.stochastic_graphs not in STOCHASTIC_GRAPHS:
            raise ValueError(
                f"stochastic_graphs={self.stochastic_graphs!r} is unknown; known: {', '.join(STOCHASTIC_GRAPHS)}"
            )
        _check_bools(self, ("time_varying", "stackable", "tree"))
        _check_reasons(self.reasons, GRAPH_REQUIREMENTS)


@dataclasses.dataclass(frozen=True)
class CostFacts:
    """What a round of the algorithm costs on the links. Read by the clock and the cost model
    (:func:`jaxgossip.sim.timing.time_model`, ``jaxgossip.run.cost_report``).

    Attributes:
      exchanges: ``options -> I``, sequential exchanges per round (:meth:`exchanges_per_round`).
      allreduce_cost: a round is priced as an all-reduce rather than as gossip on the graph.
      dense_values: every message of a round carries all D values of the sender's params, each
        priced at its dtype's width (``jaxgossip.compress.value_bits``), plus bits that do not
        depend on the values' dtype (a push-sum weight): a round's bits are then affine in the value
        width, which lets the quantised outer messages (:mod:`jaxgossip.ops.quantize`) reprice
        them. False for compressed, sparse or low-rank messages.
    """

    exchanges: Callable[[Mapping[str, Any]], int] = one_exchange
    allreduce_cost: bool = False
    dense_values: bool = False

    def __post_init__(self):
        if not callable(self.exchanges):
            raise TypeError(f"exchanges={self.exchanges!r} must be a function options -> int")
        _check_bools(self, ("allreduce_cost", "dense_values"))

    def exchanges_per_round(self, options: Mapping[str, Any]) -> int:
        """Sequential exchanges per round with ``options`` (an int >= 1)."""
        value = self.exchanges(dict(options))
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"exchanges(options) returned {value!r}; it must be an int >= 1")
        return value


@dataclasses.dataclass(frozen=True)
class SweepFacts:
    """What sweeps and step-size tools may do with its options. Read by the one-compile sweeps
    (``jaxgossip.engine.sweeps``, ``jaxgossip sweep``: ``shape_options``), ``jaxgossip tune-gamma``
    (``jaxgossip.engine.tuning``: ``step_size``) and the stability warning of the run configs
    (``jaxgossip.run.validate.gamma_warning``: ``relaxation_gamma``).

    Attributes:
      shape_options: option -> why it changes array shapes (the sweeps' refusal to trace it).
      step_size: the name of its consensus step-size option (e.g. ``"gamma"``), a traced value that
        ``jaxgossip tune-gamma`` sweeps; None if it has none.
      relaxation_gamma: its ``gamma`` is the relaxed step ``x + gamma (W - I) x``, whose stable
        range on a symmetric W is checked.
      traced_options: its options, besides the axes every algorithm shares
        (:data:`jaxgossip.engine.sweeps.SWEEPABLE`), that are traced values inside a run, so that
        ``algorithm_options.<option>`` is a one-compile sweep axis of this algorithm (e.g.
        SPARTA's ``fraction``).
    """

    shape_options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    step_size: str | None = None
    relaxation_gamma: bool = False
    traced_options: tuple[str, ...] = ()

    def __post_init__(self):
        _check_mappings(self, ("shape_options",))
        if not isinstance(self.traced_options, tuple) or not all(
            isinstance(o, str) and o for o in self.traced_options
        ):
            raise TypeError(f"traced_options={self.traced_options!r} must be a tuple of option names")
        clash = set(self.traced_options) & set(self.shape_options)
        if clash:
            raise ValueError(f"options {sorted(clash)} are both traced_options and shape_options")
        if self.step_size is not None and (not isinstance(self.step_size, str) or not self.step_size):
            raise TypeError(f"step_size={self.step_size!r} must be None or the name of an option, e.g. 'gamma'")
        _check_bools(self, ("relaxation_gamma",))


@dataclasses.dataclass(frozen=True)
class TrainerHooks:
    """How training runs build and wrap it. Read by the configured runs (``jaxgossip.run``:
    ``trainer_options``), the Byzantine wrapper (:func:`jaxgossip.algorithms.byzantine`:
    ``receive``), the demo and the end-to-end matrix (``example_options``) and the configs' checks
    of Choco-style options (``public_init``).

    Attributes:
      trainer_options: option defaults the trainer sets (a user's option wins).
      public_init: it keeps public copies of the models (Choco-style) and takes the option
        ``public_init="zero" | "model"`` (start them at 0 or at the initial models).
      receive: for an algorithm whose messages are its models (each node sends its current model
        to every out-neighbour): ``receive(topology, **options) -> round_fn`` with
        ``params, state, info = round_fn(params, state, received, key)``, the round as a function
        of the models each receiver reads per in-neighbour slot
        (:class:`jaxgossip.algorithms.Received`). The Byzantine wrapper replaces what attackers
        send through it. None: the messages are not plain models (compressed differences,
        push-sum pairs, factors), and the algorithm cannot be attacked.
      example_options: for an algorithm whose defaults alone are refused because a choice is the
        user's (a compression budget, a step size that depends on the graph, the optimizer's
        learning rate), the options its refusal asks for, at values that run the small end-to-end
        task of ``tests/project/test_e2e_matrix.py``; empty when the defaults run.
      reasons: ``{"receive": why}``, why an algorithm without ``receive`` cannot be attacked (the
        wrapper's refusal; a generic reason when none is given).
    """

    trainer_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    public_init: bool = False
    receive: Callable[..., Callable] | None = None
    example_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    reasons: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        _check_mappings(self, ("trainer_options", "example_options"))
        _check_bools(self, ("public_init",))
        if self.receive is not None and not callable(self.receive):
            raise TypeError(f"receive={self.receive!r} must be None or a function receive(topology, **options)")
        _check_reasons(self.reasons, ("receive",))


@dataclasses.dataclass(frozen=True)
class AsyncForm:
    """An asynchronous form of an algorithm: its nodes run without rounds, each on its own
    simulated clock (:mod:`jaxgossip.engine.asynchronous`, ``--execution=async``). Declared in
    the :attr:`Execution.asynchronous` of the algorithm it is a form of; every registered form is
    in :data:`jaxgossip.algorithms.ASYNC_FORMS`. :mod:`jaxgossip.engine.asynchronous` runs the
    event rule it names and checks the graph against the weights that rule reads.

    Attributes:
      name: the form's name (``--async_form``, ``run_async_optimization(algorithm=...)``), e.g.
        ``"async_gossip"``; one name, one form across the registry.
      rule: the event rule it runs, one of :data:`ASYNC_RULES`. Every rule needs a fixed, static
        graph with host tables (asynchronous nodes have no common round to switch graphs on).
    """

    name: str
    rule: str

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or ":" in self.name:
            raise ValueError(f"name={self.name!r} must be a non-empty string without ':'")
        if self.rule not in ASYNC_RULES:
            raise ValueError(f"rule={self.rule!r} is unknown; known: {', '.join(ASYNC_RULES)}")

    @property
    def weights(self) -> str:
        """The graph weights its rule reads (:data:`ASYNC_WEIGHTS`): ``"none"`` (pairwise
        averaging along the edges), ``"receiver_stochastic"`` (each receiver's weights, self
        included, sum to 1) or ``"column_stochastic"``."""
        return ASYNC_WEIGHTS[ASYNC_RULES.index(self.rule)]


@dataclasses.dataclass(frozen=True)
class Execution:
    """How the algorithm may be run. Read by the registry (:func:`jaxgossip.algorithms.sign` copies
    ``orderings`` onto every :class:`GossipAlgorithm` it signs, where the runners' ordering check
    reads them), :func:`jaxgossip.algorithms.check_execution` and the configs' checks
    (``jaxgossip.run.config``), and :mod:`jaxgossip.engine.asynchronous` (``asynchronous``).

    Attributes:
      orderings: the runner orderings under which it is the method it claims to be (default
        both, :data:`ORDERINGS`); :func:`jaxgossip.engine.local_step.check_ordering` refuses the
        others. D^2 corrects the model that was communicated, so it needs the local step before
        communication (``("atc",)``).
      asynchronous: its :class:`AsyncForm` s, the first one the default, e.g. gossip's
        ``async_gossip`` and ``ad_psgd``; empty (the default): it runs in synchronous rounds only.
        :attr:`modes` is derived from it.
      reasons: ``{"asynchronous": why}``, why it has no asynchronous form (the refusal of
        :func:`jaxgossip.algorithms.check_execution`; a generic reason when none is given).
    """

    orderings: tuple[str, ...] = ORDERINGS
    asynchronous: tuple[AsyncForm, ...] = ()
    reasons: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if (
            not isinstance(self.orderings, tuple)
            or not self.orderings
            or any(o not in ORDERINGS for o in self.orderings)
        ):
            raise ValueError(f"orderings={self.orderings!r} must be a non-empty tuple of {ORDERINGS}")
        if not isinstance(self.asynchronous, tuple) or not all(isinstance(a, AsyncForm) for a in self.asynchronous):
            raise TypeError(
                f"asynchronous={self.asynchronous!r} must be a tuple of AsyncForm (the registered ones: "
                "jaxgossip.algorithms.ASYNC_FORMS), e.g. (AsyncForm('async_gossip', 'stale_mixing'),)"
            )
        if len(set(self.form_names)) != len(self.form_names):
            raise ValueError(f"asynchronous={self.form_names}: a form's name appears twice")
        _check_reasons(self.reasons, ("asynchronous",))

    @property
    def modes(self) -> tuple[str, ...]:
        """The execution modes it supports (:data:`EXECUTIONS`): ``("sync",)``, plus ``"async"``
        when it has an asynchronous form."""
        return ("sync", "async") if self.asynchronous else ("sync",)

    @property
    def form_names(self) -> tuple[str, ...]:
        """The names of its asynchronous forms, the default first."""
        return tuple(form.name for form in self.asynchronous)


# AlgorithmInfo's groups: field -> type.
INFO_GROUPS = {
    "graph": GraphNeeds,
    "cost": CostFacts,
    "sweep": SweepFacts,
    "hooks": TrainerHooks,
    "execution": Execution,
}


@dataclasses.dataclass(frozen=True)
class AlgorithmInfo:
    """Registry metadata of an algorithm: its factory and the facts other modules need about it
    (none of them tests an algorithm's name), in one group per reader. Each algorithm file declares
    one next to its factory; a group left out keeps its defaults, so ``AlgorithmInfo(factory)`` is
    complete.

    Attributes:
      factory: ``factory(topology, **hyperparameters) -> GossipAlgorithm``.
      graph: :class:`GraphNeeds`, the graphs it runs on (:func:`jaxgossip.algorithms.check_graph`).
      cost: :class:`CostFacts`, what a round costs on the links (the clock and the cost model).
      sweep: :class:`SweepFacts`, what sweeps and tune-gamma may do with its options.
      hooks: :class:`TrainerHooks`, how training runs build and wrap it (trainer defaults,
        ``receive`` for attacks, the options an example run needs).
      execution: :class:`Execution`, its runner orderings and asynchronous forms.
    """

    factory: Callable[..., GossipAlgorithm]
    graph: GraphNeeds = GraphNeeds()
    cost: CostFacts = CostFacts()
    sweep: SweepFacts = SweepFacts()
    hooks: TrainerHooks = TrainerHooks()
    execution: Execution = Execution()

    def __post_init__(self):
        if not callable(self.factory):
            raise TypeError(f"factory={self.factory!r} is not callable: expected factory(topology, **options)")
        for field, group in INFO_GROUPS.items():
            value = getattr(self, field)
            if not isinstance(value, group):
                raise TypeError(f"{field}={value!r} must be a {group.__name__}, e.g. {field}={group.__name__}(...)")
