"""The algorithm registry: names -> metadata (factory included), plug-ins by import path.

An algorithm is a factory ``factory(topology, **hyperparameters) -> GossipAlgorithm`` plus an
:class:`~jaxgossip.types.AlgorithmInfo` (the facts other modules need, one group per reader: the
graphs it runs on, what a round costs, what sweeps may trace, the trainer's hooks, its orderings
and asynchronous forms). A user's algorithm is either registered (:func:`register`) or named by an
import path ``"package.module:factory"``; its metadata is the factory's ``info`` attribute, else the
module's ``INFO`` (an :class:`AlgorithmInfo` or a dict of its groups), else the defaults.

:data:`INFOS` (name -> AlgorithmInfo) is the one table; :data:`REGISTRY` (name -> factory) is a
read-only view of it. The graph requirements of the metadata are checked in one place,
:func:`check_graph`: every built-in factory calls it with its own ``INFO`` (so a factory called
directly refuses a graph with the message :func:`make` gives), and :func:`make` calls it for
every other algorithm (plug-ins, and built-in factories registered with other metadata).

The registry is the one source of what the runners read on a built algorithm, its ``name`` and
``orderings`` (:func:`sign`: the name it is registered under, the orderings of its metadata), and
of the asynchronous forms (:data:`ASYNC_FORMS`, from the metadata of every registered algorithm).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from jaxgossip.algorithms._shared.pair_tables import require_symmetric
from jaxgossip.algorithms._shared.tree_tables import require_tree
from jaxgossip.topology import Topology
from jaxgossip.types import EXECUTIONS, INFO_GROUPS, AlgorithmInfo, AsyncForm, GossipAlgorithm

__all__ = [
    "REGISTRY",
    "INFOS",
    "ASYNC_FORMS",
    "register",
    "unregister",
    "info",
    "resolve",
    "make",
    "check_graph",
    "check_execution",
    "sign",
    "require_doubly_stochastic",
    "require_column_stochastic",
    "require_host_topology",
]

#: name -> metadata of every registered algorithm: the one table (:func:`register` adds to it).
INFOS: dict[str, AlgorithmInfo] = {}
# name -> the metadata a built-in was registered with; its factory checks the graph against
# exactly that metadata itself, so make does not check again.
_BUILTIN: dict[str, AlgorithmInfo] = {}


class FactoryView(Mapping):
    """Read-only mapping name -> factory over a table name -> :class:`AlgorithmInfo` (a view: it
    follows every change of the table)."""

    def __init__(self, infos: Mapping[str, AlgorithmInfo]):
        self._infos = infos

    def __getitem__(self, name: str) -> Callable[..., GossipAlgorithm]:
        return self._infos[name].factory

    def __iter__(self) -> Iterator[str]:
        return iter(self._infos)

    def __len__(self) -> int:
        return len(self._infos)

    def __repr__(self) -> str:
        return f"FactoryView({', '.join(self._infos)})"


#: name -> factory: a read-only view of :data:`INFOS`.
REGISTRY: Mapping[str, Callable[..., GossipAlgorithm]] = FactoryView(INFOS)


class AsyncFormView(Mapping):
    """Read-only mapping form name -> :class:`~jaxgossip.types.AsyncForm` of every asynchronous
    form in a table name -> :class:`AlgorithmInfo` (``execution.asynchronous``), in registration
    order (a view: it follows every change of the table)."""

    def __init__(self, infos: Mapping[str, AlgorithmInfo]):
        self._infos = infos

    def _forms(self) -> dict[str, AsyncForm]:
        forms: dict[str, AsyncForm] = {}
        for entry in self._infos.values():
            for form in entry.execution.asynchronous:
                forms.setdefault(form.name, form)
        return forms

    def __getitem__(self, name: str) -> AsyncForm:
        return self._forms()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._forms())

    def __len__(self) -> int:
        return len(self._forms())

    def __repr__(self) -> str:
        return f"AsyncFormView({', '.join(self._forms())})"

    def owners(self, name: str) -> list[str]:
        """The registered algorithms that have the form ``name``."""
        return [n for n, entry in self._infos.items() if name in entry.execution.form_names]


#: form name -> AsyncForm of every registered asynchronous form (``--async_form``): a read-only
#: view of the forms the metadata in :data:`INFOS` declares (``AlgorithmInfo.execution``).
ASYNC_FORMS = AsyncFormView(INFOS)


def _names_where(field: str, value: Any) -> str:
    """Registered algorithms whose graph needs ``field`` equals ``value`` (for error messages)."""
    return ", ".join(name for name, entry in INFOS.items() if getattr(entry.graph, field) == value)


def require_doubly_stochastic(topology: Topology, algorithm: str) -> None:
    """Raises ValueError unless every W(t) has rows and columns summing to 1 (mean-preserving)."""
    if not isinstance(topology, Topology):
        raise TypeError(f"{algorithm} needs a jaxgossip Topology, got {type(topology).__name__}")
    if not topology.is_doubly_stochastic:
        note = ""
        if topology.stochastic and topology.is_column_stochastic:
            note = (
                " (a stochastic graph that is only column stochastic: random_out, or with_failures of a "
                "directed graph, which leaves undelivered mass with the sender)"
            )
        raise ValueError(
            f"{algorithm} needs doubly stochastic mixing weights (rows and columns summing to 1) so "
            f"that the node mean is preserved; {topology.name} is not{note}. Use metropolis weights, or a "
            f"push-sum algorithm ({_names_where('mixing', 'column_stochastic')}) for column-stochastic graphs"
        )


def require_column_stochastic(topology: Topology, algorithm: str) -> None:
    """Raises ValueError unless every W(t) has columns summing to 1 (mass-preserving push-sum)."""
    if not isinstance(topology, Topology):
        raise TypeError(f"{algorithm} needs a jaxgossip Topology, got {type(topology).__name__}")
    if not topology.is_column_stochastic:
        raise ValueError(
            f"{algorithm} is a push-sum method and needs column-stochastic weights (each sender's "
            f"outgoing weights, self included, summing to 1); {topology.name} is not. Build the graph "
            "with weights='column'"
        )


def require_host_topology(topology: Any, algorithm: str) -> None:
    """Raises TypeError unless ``topology`` is a :class:`Topology` with host (NumPy) tables, not a
    stack or a stack member with traced tables.

    For algorithms that build per-edge or per-graph tables with NumPy at construction time.
    """
    if not isinstance(topology, Topology):
        raise TypeError(f"{algorithm} needs a jaxgossip Topology, got {type(topology).__name__}")
    if topology.stochastic:  # its sampler holds host tables; fixed supports are checked apart
        return
    if not topology.host_tables:
        raise TypeError(
            f"{algorithm} builds per-edge host tables from the graph and cannot run on a stacked Topology "
            f"(traced graph tables); give it a graph built on the host (sweep_topologies then runs one "
            f"compile per graph). Stackable algorithms: {_names_where('stackable', True)}"
        )


def _as_info(factory: Callable, metadata: Any, where: str) -> AlgorithmInfo:
    if isinstance(metadata, AlgorithmInfo):
        return metadata if metadata.factory is factory else dataclasses.replace(metadata, factory=factory)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"{where}: metadata must be an AlgorithmInfo or a mapping, got {type(metadata).__name__}")
    unknown = sorted(set(metadata) - set(INFO_GROUPS))
    if unknown:
        hint = "; ".join(
            f"{f} belongs to " + " or ".join(f"{group}={cls.__name__}(...)" for group, cls in groups)
            for f in unknown
            if (groups := [(g, c) for g, c in INFO_GROUPS.items() if f in c.__dataclass_fields__])
        )
        raise TypeError(
            f"{where}: unknown metadata {unknown}; known: {', '.join(INFO_GROUPS)}" + (f" ({hint})" if hint else "")
        )
    try:
        return AlgorithmInfo(factory, **metadata)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{where}: {err}") from None


def _check_factory(factory: Any, where: str) -> None:
    if isinstance(factory, type) or not callable(factory):
        raise TypeError(
            f"{where} is not an algorithm factory: expected a function factory(topology, **hyperparameters) "
            f"-> GossipAlgorithm, got {type(factory).__name__}"
        )
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        raise TypeError(f"{where} is not an algorithm factory: its first argument must be the topology")


def register(name: str, factory: Callable[..., GossipAlgorithm], *, replace: bool = False, **metadata) -> AlgorithmInfo:
    """Registers ``factory`` as algorithm ``name`` with its metadata: the groups of
    :class:`AlgorithmInfo` (``graph=GraphNeeds(...)``, ``cost=``, ``sweep=``, ``hooks=``,
    ``execution=``; the others keep their defaults), or ``info=`` a whole :class:`AlgorithmInfo`.

    Registered algorithms work everywhere a built-in does: :func:`make`, configs and the CLI,
    sweeps, the cost model and the shared test suite; their asynchronous forms join
    :data:`ASYNC_FORMS`.

    Raises:
      ValueError: an empty name, a name with ``:`` (reserved for import paths), a name already
        registered (unless ``replace=True``), a metadata value out of range, or an asynchronous
        form whose name another algorithm registered with another rule.
      TypeError: ``factory`` is not a factory, or an unknown metadata key.
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"name={name!r} must be a non-empty string without ':' (reserved for import paths)")
    if name in INFOS and not replace:
        kind = "a built-in algorithm" if name in _BUILTIN else "already registered"
        raise ValueError(f"algorithm {name!r} is {kind}; pass replace=True to replace it")
    _check_factory(factory, f"register({name!r})")
    if "info" in metadata and len(metadata) == 1:
        metadata = metadata["info"]
    entry = _as_info(factory, metadata, f"register({name!r})")
    for form in entry.execution.asynchronous:
        taken = ASYNC_FORMS.get(form.name)
        owners = [n for n in ASYNC_FORMS.owners(form.name) if n != name]
        if taken is not None and taken != form and owners:
            raise ValueError(
                f"register({name!r}): the asynchronous form {form.name!r} is registered by {', '.join(owners)} "
                f"with rule={taken.rule!r}; give this one ({form.rule!r}) another name"
            )
    INFOS[name] = entry
    return entry


def unregister(name: str) -> AlgorithmInfo:
    """Removes algorithm ``name`` from the registry (both :data:`INFOS` and :data:`REGISTRY`) and
    returns its metadata.

    Raises:
      ValueError: ``name`` is not registered.
    """
    if name not in INFOS:
        raise ValueError(f"algorithm {name!r} is not registered; registered: {', '.join(INFOS)}")
    _BUILTIN.pop(name, None)
    return INFOS.pop(name)


def register_builtin(name: str, entry: AlgorithmInfo) -> None:
    """Registers a built-in algorithm (``jaxgossip/algorithms/__init__.py``), whose factory checks
    the graph against ``entry`` itself (:func:`check_graph`); :func:`register` then refuses to
    replace it unless asked."""
    INFOS[name] = entry
    _BUILTIN[name] = entry


def _where(err: BaseException) -> str:
    """``"Kind: message at file:line"`` for an exception raised by a plug-in: the innermost frame
    outside jaxgossip (the user's code; the import machinery and jaxgossip's frames are skipped)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frames = [
        f
        for f in traceback.extract_tb(err.__traceback__)
        if not os.path.abspath(f.filename).startswith(package + os.sep) and not f.filename.startswith("<frozen")
    ]
    at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(err).__name__}: {err}{at}"


def _import(path: str) -> AlgorithmInfo:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"algorithm={path!r}: an import path is 'package.module:factory'")
    try:
        module = importlib.import_module(module_name)
    except SyntaxError as err:  # the user's file and line, not the import machinery's frames
        raise ValueError(
            f"algorithm={path!r}: module {module_name!r} has a syntax error at {err.filename}:{err.lineno}: "
            f"{err.msg}; fix that line"
        ) from None
    except ImportError as err:
        raise ValueError(f"algorithm={path!r}: cannot import module {module_name!r} ({err})") from None
    except Exception as err:  # noqa: BLE001 - the plug-in's own code raised while it was imported
        raise ValueError(
            f"algorithm={path!r}: importing module {module_name!r} raised {_where(err)}; fix the plug-in"
        ) from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"algorithm={path!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, AlgorithmInfo):
        return obj
    _check_factory(obj, f"algorithm={path!r}")
    metadata = getattr(obj, "info", None)
    if metadata is None:
        module_info = getattr(module, "INFO", None)
        if isinstance(module_info, AlgorithmInfo):
            metadata = module_info if module_info.factory is obj else None
        else:
            metadata = module_info
    return _as_info(obj, metadata, f"algorithm={path!r}")


def resolve(name: str) -> AlgorithmInfo:
    """The metadata (factory included) of a registered name or an import path ``"module:factory"``.

    Raises:
      ValueError: an unknown name (the message lists the known ones), or an import path whose
        module or attribute does not exist.
      TypeError: the import path names something that is not a factory, or bad metadata.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"algorithm={name!r} must be a registered name ({', '.join(INFOS)}) or 'module:factory'")
    if name in INFOS:
        return INFOS[name]
    if ":" in name:
        return _import(name)
    raise ValueError(
        f"unknown algorithm {name!r}; known algorithms: {sorted(INFOS)} (or an import path 'module:factory')"
    )


def info(name: str) -> AlgorithmInfo:
    """Alias of :func:`resolve`: the metadata of a registered name or an import path."""
    return resolve(name)


def check_graph(name: str, entry: AlgorithmInfo, topology: Any) -> None:
    """Raises when ``topology`` contradicts the graph requirements of the metadata ``entry``; the
    message names the algorithm ``name``, the graph, the metadata field and why
    (:attr:`~jaxgossip.types.GraphNeeds.reasons`, else a generic reason).

    The one home of the graph checks: every built-in factory calls it first with its own ``INFO``,
    and :func:`make` calls it for every other algorithm. It reads ``entry.graph``
    (:class:`~jaxgossip.types.GraphNeeds`), in this order: a :class:`Topology` unless
    the metadata asks nothing of the weights (``mixing="any"``: then a node count serves too);
    stochastic graphs (``stochastic_graphs``); host tables (``stackable=False``); the mixing
    matrix (``mixing``; ``"symmetric"`` also checks every W(t) = W(t)^T, on the fixed support of
    a stochastic graph); the period (``time_varying``); an undirected tree (``tree``).

    Raises:
      TypeError: not a Topology where one is needed, or a stacked Topology (traced tables) for an
        algorithm registered with ``stackable=False``.
      ValueError: a graph the metadata rules out.
    """
    needs = entry.graph
    reasons = needs.reasons
    if not isinstance(topology, Topology):
        if needs.mixing != "any" or needs.tree:
            raise TypeError(f"{name} needs a jaxgossip Topology, got {type(topology).__name__}")
        return
    if topology.stochastic:
        if needs.stochastic_graphs == "none":
            why = reasons.get(
                "stochastic_graphs",
                "its step reads fixed graph tables instead of drawing each round's graph with topology.draw(key, t)",
            )
            raise ValueError(
                f"{name} cannot run on the stochastic graph {topology.name}: it is registered with "
                f"stochastic_graphs='none' ({why}). Algorithms for stochastic graphs: "
                f"{', '.join(n for n, i in INFOS.items() if i.graph.stochastic_graphs != 'none')}"
            )
        if needs.stochastic_graphs == "failures" and topology.support is None:
            why = reasons.get(
                "stochastic_graphs", "its state is tied to fixed neighbours: public copies or per-edge state"
            )
            raise ValueError(
                f"{name} cannot run on {topology.name}: it is registered with stochastic_graphs='failures' "
                f"({why}), and this graph draws new neighbours every round. Use failures of a fixed graph "
                f"(with_failures, spec '+drop'), or one of {_names_where('stochastic_graphs', 'any')}"
            )
    if not needs.stackable:
        require_host_topology(topology, name)
    try:
        if needs.mixing in ("doubly_stochastic", "symmetric"):
            require_doubly_stochastic(topology, name)
        if needs.mixing == "symmetric":
            if topology.stochastic and not topology.is_symmetric:
                raise ValueError(
                    f"{name} needs a symmetric mixing matrix in every round; {topology.name} is not symmetric"
                )
            fixed = topology.support if topology.stochastic else topology
            if fixed is not None and fixed.host_tables:
                require_symmetric(fixed, name)
        if needs.mixing == "column_stochastic":
            require_column_stochastic(topology, name)
    except ValueError as err:  # say where the requirement comes from: the algorithm's metadata
        why = f": {reasons['mixing']}" if "mixing" in reasons else ""
        raise ValueError(f"{err} ({name} is registered with mixing={needs.mixing!r}{why})") from None
    if not needs.time_varying and topology.period != 1:
        why = f" ({reasons['time_varying']})" if "time_varying" in reasons else ""
        raise ValueError(
            f"{name} needs a static topology (period T = 1): it is registered with time_varying=False{why}; "
            f"{topology.name} is time-varying with T = {topology.period}. Algorithms for time-varying graphs: "
            f"{', '.join(n for n, i in INFOS.items() if i.graph.time_varying)}"
        )
    if needs.tree:
        try:
            require_tree(topology, name)
        except ValueError as err:
            why = f": {reasons['tree']}" if "tree" in reasons else ""
            raise ValueError(f"{err} ({name} is registered with tree=True{why})") from None


def check_execution(name: str, entry: AlgorithmInfo, execution: str) -> None:
    """Raises ValueError unless the metadata ``entry`` of algorithm ``name`` supports the execution
    mode ``execution`` (:data:`~jaxgossip.types.EXECUTIONS`, :attr:`Execution.modes
    <jaxgossip.types.Execution.modes>`); the message names the algorithm, the mode, why
    (``execution.reasons["asynchronous"]``, else a generic reason) and the algorithms that have the
    mode."""
    if execution not in EXECUTIONS:
        raise ValueError(f"execution={execution!r} is unknown; known modes: {', '.join(EXECUTIONS)}")
    modes = entry.execution.modes
    if execution in modes:
        return
    why = entry.execution.reasons.get(
        "asynchronous",
        "no asynchronous form of its round is implemented: its state is updated in lock-step rounds",
    )
    have = ", ".join(n for n, i in INFOS.items() if execution in i.execution.modes)
    raise ValueError(
        f"{name} cannot run with execution={execution!r}: it is registered with execution={modes} "
        f"({why}). Algorithms with execution={execution!r}: {have}"
    )


def sign(alg: GossipAlgorithm, name: str, entry: AlgorithmInfo) -> GossipAlgorithm:
    """``alg`` carrying the registry's facts about it, the fields of a
    :class:`~jaxgossip.types.GossipAlgorithm` the runners read: ``name`` (the name it is registered
    under, or its import path) and the orderings of its metadata ``entry``
    (:attr:`Execution.orderings <jaxgossip.types.Execution.orderings>`). The one place they are set:
    :func:`make` signs every algorithm it builds, and every built-in factory signs its own with its
    ``INFO`` (so it carries them when called directly too)."""
    return alg._replace(name=name, orderings=entry.execution.orderings)


def make(name: str, topology: Topology, **hyperparameters) -> GossipAlgorithm:
    """Builds algorithm ``name`` (a registered name or ``"module:factory"``) on ``topology``.

    The graph is first checked against the algorithm's metadata (:func:`check_graph`: by the
    factory itself for a built-in, here for the others), and the algorithm is signed with ``name``
    and its metadata's orderings (:func:`sign`).

    Raises:
      ValueError: unknown name (the message lists the known ones), a missing import path, or a
        graph the metadata rules out (wrong stochasticity, time-varying, ...).
      TypeError: a hyperparameter the algorithm does not take (the message lists the ones it does),
        or a factory that does not return a GossipAlgorithm.
    """
    entry = resolve(name)
    factory = entry.factory
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        accepted = list(params)[1:]
        unknown = sorted(set(hyperparameters) - set(accepted))
        if unknown:
            raise TypeError(f"algorithm {name!r} does not take {unknown}; it takes {accepted}")
    if _BUILTIN.get(name) is not entry:  # a built-in factory checks its own metadata itself
        check_graph(name, entry, topology)
    if _BUILTIN.get(name) is entry:
        alg = factory(topology, **hyperparameters)
    else:
        try:
            alg = factory(topology, **hyperparameters)
        except (ValueError, TypeError):
            raise  # the factory's own refusal of its hyperparameters or graph, already a message
        except Exception as err:  # noqa: BLE001 - a bug in the plug-in: name its file and line
            raise ValueError(f"algorithm {name!r}: its factory raised {_where(err)}; fix the plug-in") from None
    if not isinstance(alg, GossipAlgorithm):
        raise TypeError(f"algorithm {name!r}: the factory returned a {type(alg).__name__}, not a GossipAlgorithm")
    return sign(alg, name, entry)
