"""The option groups of a training config: ``--time.*`` (the clock: links, compute, availability),
``--byzantine.*`` (attackers) and ``--execution`` (synchronous rounds or asynchronous events).

Each function reads its group from a :class:`~jaxgossip.run.config.TrainConfig` and raises a
``ValueError`` naming the ``--group.option`` and the rule.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxgossip.checks import check_group, did_you_mean
from jaxgossip.run.config import (
    EXECUTIONS,
    ByzantineOptions,
    TrainConfig,
    unknown_name,
)
from jaxgossip.run.validate import with_trainer_options
from jaxgossip.sim.network import Network

__all__ = [
    "network_of",
    "time_model_of",
    "byzantine_args",
    "check_byzantine",
    "async_form_of",
    "check_execution_options",
]


def network_of(config: TrainConfig) -> Network:
    """The :class:`jaxgossip.sim.network.Network` of a run, from ``config.time`` (the ``--time.*``
    options; ValueError naming the option and the rule)."""
    return Network.from_options(config.time)


def time_model_of(config: TrainConfig, topo, network: Network, available: np.ndarray | None):
    """The :class:`jaxgossip.sim.timing.TimeModel` of a run: its ``network`` (:func:`network_of`)
    on ``topo``, the algorithm's exchanges and all-reduce pricing from its metadata, the run's
    ordering and its online mask ``available`` (:meth:`Network.online`, None: always online).

    Raises:
      ValueError: naming the ``--time.*`` option and the rule (bad shape for the graph).
    """
    from jaxgossip.sim import timing

    # An asynchronous event sends one message per out-neighbour: no exchanges or all-reduce pricing.
    asynchronous = config.execution == "async"
    if asynchronous and network.round_varying:
        field = network.round_varying_fields[0]
        raise ValueError(
            f"--time.{field}={getattr(network, field)!r} changes with the round (a [rounds, N] trace), but an "
            "--execution=async run has events, not rounds: give a trace of one row"
        )
    try:
        return timing.time_model(
            topo,
            network,
            algorithm=None if asynchronous else config.algorithm,
            options=None if asynchronous else with_trainer_options(config.algorithm, dict(config.algorithm_options)),
            exchanges=1 if asynchronous else None,
            allreduce=False if asynchronous else None,
            ordering=config.ordering,
            available=available,
            seed=config.seed,
        )
    except ValueError as err:
        text = str(err)
        raise ValueError(text if text.startswith("--time.") else f"--time.compute: {text}") from None


def byzantine_args(config: TrainConfig) -> dict | None:
    """The keyword arguments of :func:`jaxgossip.algorithms.byzantine` for ``config.byzantine``
    (``ids`` or ``num`` with the run's data seed as key, ``attack`` and its options), None without
    attackers.

    Raises:
      ValueError: naming the ``--byzantine.*`` option and the rule.
    """
    known = [f.name for f in dataclasses.fields(ByzantineOptions)]
    example = "--byzantine.nodes=2 --byzantine.attack=alie"
    values = ByzantineOptions(**check_group("byzantine", config.byzantine, known, "option", example)).options()
    nodes, ids = values["nodes"], values["ids"]
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 0:
        raise ValueError(f"--byzantine.nodes={nodes!r} must be an int K >= 0 (attackers drawn by the data seed)")
    if isinstance(ids, str):
        try:
            ids = [int(part) for part in ids.split(",") if part.strip()]
        except ValueError:
            raise ValueError(f"--byzantine.ids={values['ids']!r} must be node ids, e.g. 0,5") from None
    elif isinstance(ids, int) and not isinstance(ids, bool):
        ids = [ids]
    if ids is not None and (not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) for i in ids)):
        raise ValueError(f"--byzantine.ids={values['ids']!r} must be node ids, e.g. 0,5")
    if ids is not None and nodes:
        raise ValueError(
            "--byzantine.nodes and --byzantine.ids: give one of them (K drawn by the data seed, or the ids)"
        )
    if not isinstance(values["attack_options"], dict):
        raise ValueError(
            f"--byzantine.attack_options={values['attack_options']!r} must be a mapping, e.g. "
            "--byzantine.attack_options.sigma=10"
        )
    for key, value in values["attack_options"].items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"--byzantine.attack_options.{key}={value!r} must be a number")
    if not nodes and not ids:
        return None
    # K attackers are drawn from the data seed, like the partition and random graphs: they fix the
    # shapes of the attack's edge tables, so every seed of a sweep (one vmapped program) shares them.
    who = {"ids": list(ids)} if ids else {"num": nodes, "key": config.resolved_data_seed}
    return {**who, "attack": values["attack"], **values["attack_options"]}


def check_byzantine(config: TrainConfig, topo, built: Any = None) -> Any:
    """The algorithm of ``config`` with the attackers of ``config.byzantine`` on the run's graph
    (:func:`jaxgossip.algorithms.byzantine`), None without attackers; building it checks the attack
    names and options, K < N, an honest graph that stays connected, an algorithm whose messages
    are models. ``built``: the run's algorithm already built with the trainer's options, which the
    wrapper then runs (None: the wrapper builds its own)."""
    from jaxgossip import algorithms

    args = byzantine_args(config)
    if args is None:
        return None
    try:
        options = with_trainer_options(config.algorithm, dict(config.algorithm_options))
        return algorithms.byzantine(config.algorithm, topo, options=options, built=built, **args)
    except (ValueError, TypeError) as err:
        raise ValueError(f"--byzantine: {err}") from None


def async_form_of(config: TrainConfig) -> str:
    """The asynchronous algorithm of an ``--execution=async`` run (:mod:`jaxgossip.engine.asynchronous`):
    ``async_form``, or with ``auto`` the first of the algorithm's asynchronous forms
    (:attr:`jaxgossip.types.Execution.form_names`).

    Raises:
      ValueError: an algorithm without an asynchronous form (its reason), or an ``async_form``
        that is not one of its forms.
    """
    from jaxgossip import algorithms

    entry = algorithms.resolve(config.algorithm)
    algorithms.check_execution(config.algorithm, entry, "async")
    form = config.async_form
    if form == "auto":
        return entry.execution.form_names[0]
    if form not in entry.execution.form_names:
        raise ValueError(
            f"async_form={form!r}{did_you_mean(form, entry.execution.form_names)}: the asynchronous forms of "
            f"{config.algorithm} are {', '.join(entry.execution.form_names)} (or auto, the first)"
        )
    return form


def _async_refusals(config: TrainConfig, network: Network) -> list[tuple[str, str]]:
    """(option=value, why) of every option set that an asynchronous run does not model."""
    checks = [
        (
            config.local_steps != 1,
            f"local_steps={config.local_steps}",
            "a round is N node events of one local step each (num_rounds counts them); use --local_steps=1",
        ),
        (
            bool(config.algorithm_options),
            f"algorithm_options={dict(config.algorithm_options)}",
            "the asynchronous forms mix or push with the graph's weights and take no options (no compression)",
        ),
        (
            config.outer_optimizer != "none",
            f"outer_optimizer={config.outer_optimizer!r}",
            "an outer step needs a common round; use --outer_optimizer=none",
        ),
        (
            byzantine_args(config) is not None,
            f"byzantine={dict(config.byzantine)}",
            "attackers are modelled in synchronous rounds only",
        ),
        (
            config.final_merge is not None,
            f"final_merge={config.final_merge!r}",
            "the merge runs synchronous rounds on the synchronous algorithm's state",
        ),
        (
            config.ordering != "atc",
            f"ordering={config.ordering!r}",
            "the asynchronous rules fix where each gradient is taken; use --ordering=atc",
        ),
        (
            config.message_dtype != "fp32",
            f"message_dtype={config.message_dtype!r}",
            "asynchronous messages are float32 models",
        ),
        (config.devices != 1, f"devices={config.devices}", "asynchronous runs are planned for one device"),
    ]
    return [(what, why) for bad, what, why in checks if bad]


def check_execution_options(config: TrainConfig, topo, network: Network) -> None:
    """Checks ``execution`` and, for ``async``, the algorithm's asynchronous form
    (:func:`async_form_of`), the options an asynchronous run does not model, the graph
    (:func:`jaxgossip.engine.asynchronous.check_async_graph`: fixed, static, the weights the form uses)
    and a positive compute time (the step times order the events).

    Raises:
      ValueError: naming the value and the rule.
    """
    if config.execution not in EXECUTIONS:
        raise unknown_name("execution", config.execution, EXECUTIONS)
    free = (
        f"--time.exchange={network.exchange} applies to --execution=async --async_form=ad_psgd only (a pairwise "
        "average without link time); messages always take their link time"
    )
    if config.execution == "sync":
        if config.async_form != "auto":
            raise ValueError(f"async_form={config.async_form!r} applies to --execution=async only")
        if config.async_rate_compensation:
            raise ValueError("async_rate_compensation=True applies to --execution=async only")
        if network.exchange != "priced":
            raise ValueError(free)
        return
    form = async_form_of(config)
    refused = _async_refusals(config, network)
    if refused:
        what, why = refused[0]
        raise ValueError(f"{what} with --execution=async: {why}")
    from jaxgossip.engine import asynchronous

    if network.exchange != "priced" and not asynchronous.prices_exchanges(asynchronous.resolve_algorithm(form)):
        raise ValueError(free)
    if config.async_rate_compensation:
        why = asynchronous.compensates_rates(asynchronous.resolve_algorithm(form))
        if why is not None:
            raise ValueError(f"async_rate_compensation=True with --async_form={form}: {why}")

    try:
        asynchronous.check_async_graph(form, topo)
    except (ValueError, TypeError) as err:
        raise ValueError(f"--execution=async with {config.algorithm} ({form}) on {topo.name}: {err}") from None
    compute = network.compute_model
    zero = compute.trace is not None and not np.any(np.asarray(compute.trace) > 0)
    if zero or (compute.kind in ("constant", "stragglers") and not compute.seconds > 0):
        raise ValueError(
            "--execution=async needs --time.compute > 0 (the step times order the events; with 0 every step "
            "ends at time 0), e.g. --time.compute=0.01 or --time.compute=stragglers:0.01,0.25,4"
        )
