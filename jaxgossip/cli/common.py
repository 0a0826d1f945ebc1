"""What the commands share: the cost-model options and columns, the output folder check, the
training-config options, divergence marks and result files (edge module)."""

from __future__ import annotations

import json
import os
import sys
import typing
from typing import Any

import numpy as np

from jaxgossip.run import errors
from jaxgossip.run.cost_report import (
    COST_OPTIONS,
    ENERGY_OPTIONS,
    CostModel,
    consensus_graph_cost,
    cost_model_from_options,
    cost_model_of_training,
    exchanges_per_round,
    priced_as_allreduce,
    simulate_bits,
    step_flops_and_memory,
    training_cost,
)
from jaxgossip.run.parsing import UsageError
from jaxgossip.run.runner import json_safe

__all__ = [
    "COST_OPTIONS",
    "CostModel",
    "cost_options",
    "cost_model",
    "cost_columns",
    "with_cost",
    "TARGET_OPTION",
    "target_acc",
    "time_to_target",
    "rows_time_to_target",
    "check_out",
    "prepare_out",
    "warn",
    "diverged_at",
    "write_json",
    "write_markdown",
    "write_metrics",
    "run_cost",
    "algorithm_epilog",
    "warn_gamma",
    "print_config",
    "require_tensorboard",
    "watchdog_cell",
    "PROGRESS_FLAG",
    # the cost helpers, re-exported from their home (see the import above)
    "consensus_graph_cost",
    "cost_model_from_options",
    "cost_model_of_training",
    "exchanges_per_round",
    "priced_as_allreduce",
    "simulate_bits",
    "step_flops_and_memory",
    "training_cost",
]

PROGRESS_FLAG = {
    "no-progress": "hide the progress bar",
    "print-config": "check everything, print the resolved config as YAML (a valid --config file) and exit",
}

_NUMERIC_COST = ("energy.flop", "energy.bit")
# A link takes a number or a per-node spec (jaxgossip.sim.link_specs).
_LINK_COST = ("time.bandwidth", "time.latency", "time.downlink")


def cost_options(training: bool = False) -> list[tuple[str, Any, Any, str]]:
    """The ``--time.*`` link options and the ``--energy.*`` options (see :data:`COST_OPTIONS`); a
    training command takes only the energy options here (its ``--time.*`` are ``TrainConfig.time``)."""
    out = []
    for option, (metavar, help_text) in (ENERGY_OPTIONS if training else COST_OPTIONS).items():
        hint = typing.Optional[float] if option in _NUMERIC_COST else typing.Optional[str]
        if option in _LINK_COST:
            hint = typing.Optional[float | str]
        out.append((option, hint, None, f"{help_text} [{metavar}]"))
    return out


def cost_model(values: dict, run: Any = None, seed: int | None = None) -> CostModel:
    """The validated cost model of the parsed options (ValueError naming the option); for a
    training command ``run`` is the run's :class:`jaxgossip.sim.network.Network` (the one its
    clock uses; then ``seed`` is the run's seed) or its TrainConfig (whose ``--time.*`` and seed
    give it), and the options give the energy prices; a consensus command passes its ``seed``
    (per-node link specs are drawn from it)."""
    if run is not None:
        return cost_model_of_training(run, values, seed)
    return cost_model_from_options({option: values.get(option) for option in COST_OPTIONS}, seed)


#: The ``--target_acc`` option of the training commands (a report: the run does not depend on it).
TARGET_OPTION = (
    "target_acc",
    typing.Optional[float],
    None,
    "report the simulated time at which the averaged model's test accuracy first reaches this value "
    "(column 'sim s to acc'; in (0, 1])",
)


def target_acc(values: dict) -> float | None:
    """The checked ``--target_acc`` (UsageError naming the option), or None."""
    target = values.get("target_acc")
    if target is None:
        return None
    if not isinstance(target, (int, float)) or isinstance(target, bool) or not 0 < target <= 1:
        raise UsageError(f"--target_acc={target!r} must be a test accuracy in (0, 1]")
    return float(target)


def time_to_target(acc: Any, sim_s: Any, target: float) -> float | None:
    """The simulated seconds of the first evaluation point whose accuracy reaches ``target``, or
    None if none does (``acc``, ``sim_s``: [M] values at the points, in order)."""
    acc, sim_s = np.asarray(acc, dtype=np.float64), np.asarray(sim_s, dtype=np.float64)
    reached = np.flatnonzero(acc >= target)
    return float(sim_s[reached[0]]) if reached.size else None


def rows_time_to_target(rows: list[dict], target: float) -> float | None:
    """:func:`time_to_target` of a run's metric rows (the training rows; a final merge's row counts
    with its own accuracy and time)."""
    return time_to_target([r["test_acc"] for r in rows], [r["sim_s"] for r in rows], target)


def cost_columns(model: CostModel, training: bool, target: float | None = None) -> list[tuple[str, str, str]]:
    """Table columns of the cost fields that ``model`` produces (and the time to ``target``)."""
    columns = [("comm_s_per_round", "comm s/round", ".3g"), ("comm_s", "comm s", ".4g")]
    if training:
        columns.append(("sim_s", "sim s", ".4g"))
        if target is not None:
            columns.append(("sim_s_to_target", f"sim s to acc {target:g}", ".4g"))
        columns.append(("mem_MB_per_node", "mem MB/node", ".3g"))
    if model.energy:
        columns.append(("energy_J_per_node", "J/node", ".4g"))
    return columns


def with_cost(columns: list, model: CostModel, training: bool, target: float | None = None) -> list:
    """``columns`` with the cost columns inserted after the MB column (and its "vs gossip" ratio)."""
    keys = [c[0] for c in columns]
    at = keys.index("reduction") + 1 if "reduction" in keys else keys.index(next(k for k in keys if "MB" in k)) + 1
    return columns[:at] + cost_columns(model, training, target) + columns[at:]


def check_out(value: Any) -> None:
    """Refuses an empty ``--out=``: it names no folder, and falling back to the default one would
    write (or resume) a run where the user did not ask for it."""
    if value is not None and not str(value).strip():
        raise UsageError(f"--out={value!r} names no folder; give one, or leave --out out for the default")


def prepare_out(out: str) -> str:
    """Checks that the output folder ``out`` can be written (it is created only when results are
    written, so a run refused later leaves nothing behind), or raises UsageError naming ``--out``."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out={out!r} is a file; give a folder for the results")
    parent = os.path.abspath(out)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UsageError(f"--out={out!r} cannot be created: {parent!r} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--out={out!r} is not writable ({parent!r}); give a folder you can write to")
    errors.set_output_folder(out)  # where a bug's traceback goes
    return out


def warn(command: str, message: str) -> None:
    print(f"jaxgossip {command}: warning: {message}", file=sys.stderr)


def diverged_at(values: Any, rounds: Any) -> int | None:
    """The first round whose value is NaN or inf, or None.

    Args:
      values: [..., M] values at M points (any leading axes: seeds, nodes); a point diverged when any
        of its values is not finite.
      rounds: [M] round of each point.
    """
    values = np.asarray(values, dtype=np.float64)
    bad = ~np.isfinite(values.reshape(-1, values.shape[-1])).all(axis=0)
    if not bad.any():
        return None
    return int(np.asarray(rounds).reshape(-1)[int(np.argmax(bad))])


def write_json(path: str, payload: dict) -> None:
    with open(path, "w") as f:
        json.dump(json_safe(payload), f, indent=1, allow_nan=False)


def write_markdown(path: str, parts: list[str]) -> None:
    with open(path, "w") as f:
        f.write("\n\n".join(p.strip("\n") for p in parts if p) + "\n")


def write_metrics(out_dir: str, rows: list[dict], extra: dict) -> None:
    from jaxgossip.run import runner

    runner.write_metrics(out_dir, rows, extra)


def run_cost(model: CostModel, result: Any, *, out_dir: str | None) -> list[dict]:
    """The rows of a ``run_training`` result with its cost fields; rewrites ``metrics.json`` and
    ``metrics.csv`` under ``out_dir`` with them and the cost model."""
    import dataclasses

    built, metrics, rows = result.built, result.metrics, result.rows
    config = built.config
    need_flops = bool(model.joules_per_flop)
    try:
        flops, memory = step_flops_and_memory(built.resolved, need_flops)
    except RuntimeError as err:  # the backend counts no FLOPs: report communication only
        print(f"jaxgossip: FLOP energy not reported: {err}", file=sys.stderr)
        _, memory = step_flops_and_memory(built.resolved, False)
        flops, model = 0.0, dataclasses.replace(model, joules_per_flop=None)
    cumulative = np.asarray(metrics.bits, dtype=np.float64)
    merge_bits = None
    if len(rows) > cumulative.shape[0]:
        from jaxgossip.ops.sharding import to_host

        merge_bits = np.asarray(to_host(result.state.bits), np.float64) - cumulative[-1]
    fields = training_cost(
        model,
        config,
        built.topology,
        metrics.round,
        cumulative,
        metrics.sim_time,
        metrics.comm_time,
        flops=flops,
        memory=memory,
        merge_bits=merge_bits,
    )
    rows = [dict(row, **extra) for row, extra in zip(rows, fields)]
    if out_dir:
        from jaxgossip.run import runner

        write_metrics(out_dir, rows, {**runner.run_summary(result), "cost_model": model.to_dict()})
    return rows


def algorithm_epilog() -> str:
    """The hyperparameters of every algorithm and compressor, with defaults (for ``--help``)."""
    import inspect

    from jaxgossip import algorithms, compress

    def signature(fn, skip=("topology",)) -> str:
        parts = []
        for p in inspect.signature(fn).parameters.values():
            if p.name in skip or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                continue
            parts.append(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}")
        return ", ".join(parts) or "(no options)"

    lines = ["algorithms and their --algorithm_options.KEY (defaults):"]
    lines += [f"  {name:<13} {signature(fn)}" for name, fn in algorithms.REGISTRY.items()]
    lines.append("  or --algorithm=package.module:factory, a plug-in (README, section Adding an algorithm)")
    lines.append(
        "compressors (--algorithm_options.compressor=NAME, options in --algorithm_options.compressor_options.KEY):"
    )
    lines += [f"  {name:<13} {signature(fn)}" for name, fn in compress.REGISTRY.items()]
    return "\n".join(lines)


def warn_gamma(command: str, config, topo) -> None:
    """Warns when the config's gossip-type gamma is outside the stable range of its graph ``topo``."""
    from jaxgossip.run.validate import gamma_warning

    message = gamma_warning(config.algorithm, dict(config.algorithm_options), topo)
    if message:
        warn(command, message)


def watchdog_cell(alarm: Any) -> str:
    """The table cell of a consensus watchdog alarm (:class:`jaxgossip.run.watchdog.WatchdogAlarm`):
    ``ok``, or the round and rule that fired (``round 120 (growth)``)."""
    return "ok" if alarm is None else f"round {alarm.round} ({alarm.rule})"


def print_config(parsed, resolved: dict) -> bool:
    """With ``--print-config``: prints ``resolved`` (plus ``--out`` and the cost options that were
    set) as YAML and returns True (the command then exits 0 without running)."""
    if not parsed.flags.get("print_config"):
        return False
    import yaml

    extra = {k: v for k, v in parsed.values.items() if k in COST_OPTIONS and v is not None}
    if parsed.values.get("out"):
        extra["out"] = parsed.values["out"]
    print(yaml.safe_dump(json_safe({**resolved, **extra}), sort_keys=False, default_flow_style=None), end="")
    return True


def require_tensorboard(config) -> None:
    """With ``tensorboard=true``: a UsageError now, before any work, if tensorboardX is missing."""
    if not config.tensorboard:
        return
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        raise UsageError("--tensorboard=true needs tensorboardX: pip install tensorboardX") from None
