"""``jaxgossip sweep``: one training config vmapped over seeds x a grid of traced hyperparameters
(learning rate, weight decay, gamma, ...) in one compile; diverged grid points are reported as such."""

from __future__ import annotations

import dataclasses
import math
import os
import time
import typing
from typing import Any

import numpy as np

from jaxgossip.checks import did_you_mean
from jaxgossip.cli import common
from jaxgossip.cli.skeleton import Invocation, run_command
from jaxgossip.run.config import TrainConfig, train_field_help, typed_options
from jaxgossip.run.parsing import Command, UsageError
from jaxgossip.run.resolve import check_train_config
from jaxgossip.run.validate import check_sync_only
from jaxgossip.run.watchdog import check_divergence
from jaxgossip.sim.link_specs import join_link_tokens

__all__ = ["SweepOptions", "command", "run", "sweep_axes", "seed_list"]

AXIS_VALUES = "must be a list of finite numbers, e.g. 0.01,0.1"


def axis_hints(values: dict) -> dict[str, Any]:
    """Every given ``--sweep.*`` axis is a list of numbers (one value: a one-point axis); which
    axes exist and share one compile is checked by :func:`sweep_axes`."""
    sweep = values.get("sweep")
    if not isinstance(sweep, dict):
        return {}
    # a compute spec gets through to sweep_axes too, which says why it cannot be swept
    spec_axes = (*_LINK_AXES, "time.compute")
    return {name: list[float | str] if name in spec_axes else list[float] for name in _flatten(sweep)}


# A link axis takes numbers and per-node or per-edge specs (jaxgossip.sim.link_tables).
_LINK_AXES = ("time.latency", "time.bandwidth", "time.downlink")


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    """The sweep's own options (next to the training config)."""

    seeds: int | list[int] = 3
    sweep: dict[str, Any] = typed_options(axis_hints, invalid=AXIS_VALUES)


def _help() -> dict[str, str]:
    from jaxgossip.engine import sweeps

    return {
        **train_field_help(),
        "seeds": "a count S (seeds 0 .. S-1) or a list such as 0,5 or [0,5]",
        "sweep": "the grid axes, one per option: --sweep.lr=0.01,0.1 --sweep.algorithm_options.gamma=[0.1,0.3]; "
        f"axes that share one compile: {', '.join(sweeps.SWEEPABLE)}{_own_axes()}",
    }


def _own_axes() -> str:
    """The algorithms' own one-compile axes (their ``SweepFacts.traced_options``), for the help."""
    from jaxgossip import algorithms

    own = [
        f"algorithm_options.{option} ({name})"
        for name, info in algorithms.INFOS.items()
        for option in info.sweep.traced_options
    ]
    return f"; and of one algorithm: {', '.join(own)}" if own else ""


def command() -> Command:
    return Command(
        name="sweep",
        description="Train one config for every point of a grid of traced hyperparameters x every seed in "
        "one compiled program (vmap). Shape-changing axes (top-k fraction, rank, node count, ...) are refused "
        "with the reason. A grid point whose loss turns NaN/inf is reported as diverged (with the round) "
        "and the others are kept. Writes sweep.json, sweep.md and sweep.png under --out.",
        classes=[(SweepOptions, "sweep"), (TrainConfig, "training config (config file keys or --field=value)")],
        flags=dict(common.PROGRESS_FLAG),
        extra={
            "output": [("out", typing.Optional[str], None, "output folder (default runs/sweep)"), common.TARGET_OPTION],
            "cost model (jaxgossip.sim.cost; reported next to the bits)": common.cost_options(training=True),
        },
        field_help=_help(),
        epilog=common.algorithm_epilog()
        + "\n\nexample:\n  jaxgossip sweep --dataset=digits --model=mlp --algorithm=choco "
        "--algorithm_options.compressor=sign \\\n      --sweep.lr=0.01,0.05,0.1 "
        "--sweep.algorithm_options.gamma=0.1,0.3,1.0 "
        "--seeds=4 --out runs/sweep",
    )


def seed_list(value: Any, option: str = "--seeds") -> list[int]:
    """A count S (seeds 0 .. S-1) or a list of distinct ints >= 0."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise UsageError(f"{option}={value} must be a count >= 1 (e.g. 3) or a list of seeds (e.g. 0,5)")
        return list(range(value))
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in value)
        and len(set(value)) == len(value)
    ):
        return list(value)
    raise UsageError(f"{option}={value!r} must be a count >= 1 (e.g. 3) or a list of distinct seeds >= 0 (e.g. 0,5)")


def _flatten(mapping: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _axis_names() -> list[str]:
    """Every option name a training run knows (config fields, options of the registered algorithms
    and compressors, time options): what a sweep axis is checked and matched against."""
    import inspect

    from jaxgossip import algorithms, compress
    from jaxgossip.sim.network import Network

    options = {"compressor_options"}
    for factory in algorithms.REGISTRY.values():
        options.update(list(inspect.signature(factory).parameters)[1:])
    for info in algorithms.INFOS.values():
        options.update(info.sweep.shape_options)
    compressor = {p for f in compress.REGISTRY.values() for p in inspect.signature(f).parameters}
    return [
        *(f.name for f in dataclasses.fields(TrainConfig)),
        *(f"algorithm_options.{o}" for o in sorted(options)),
        *(f"algorithm_options.compressor_options.{o}" for o in sorted(compressor)),
        *(f"time.{o}" for o in Network().options()),
    ]


def _known_axis(name: str, names: list[str], plugin: bool = False) -> bool:
    """Whether ``name`` is an option of a training run at all, so a misspelling is told apart from
    an option that cannot share one compile. A plug-in algorithm's options are not known here."""
    head = name.split(".")[0]
    if plugin and head == "algorithm_options" and not name.startswith("algorithm_options.compressor_options."):
        return True
    if head in ("algorithm_options", "time") and "." in name:
        return name in names
    return head in names  # other nested options (model_options.*, ...) are checked by the run itself


def sweep_axes(sweep: dict, algorithm: str | None = None) -> dict[str, list[float]]:
    """``--sweep.*`` as axis name -> list of finite numbers (a single value is a one-point axis);
    ``algorithm`` (the run's) tells a plug-in's options apart from misspelled ones."""
    from jaxgossip import algorithms
    from jaxgossip.engine import sweeps

    axes = {}
    allowed = sweeps.sweepable(algorithm)
    for name, values in _flatten(sweep or {}).items():
        values = list(values) if isinstance(values, (list, tuple)) else [values]
        if name not in allowed:
            names = _axis_names()
            plugin = isinstance(algorithm, str) and algorithm not in algorithms.REGISTRY
            if not _known_axis(name, names, plugin):
                raise UsageError(
                    f"--sweep.{name}: unknown sweep axis {name!r}{did_you_mean(name, [*allowed, *names])}; "
                    f"axes that share one compile: {', '.join(allowed)}"
                )
            try:
                sweeps.check_axes({name: [0.0]}, algorithm)
            except ValueError as err:  # names the reason (a static shape, ...) and the axes that work
                raise UsageError(f"--sweep.{name}: {err}") from None
        if any(isinstance(v, str) for v in values):  # a spec (--time.bandwidth=stragglers:...)
            if name in sweeps.LINK_AXES:  # the command line split the spec's own commas
                values = join_link_tokens(values)
            try:
                sweeps.check_axes({name: values}, algorithm)
            except ValueError as err:
                raise UsageError(f"--sweep.{name}: {err}") from None
            axes[name] = [v if isinstance(v, str) else float(v) for v in values]
            continue
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
        if not values or not ok:
            raise UsageError(f"--sweep.{name}={values!r} {AXIS_VALUES}")
        axes[name] = [float(v) for v in values]
    if not axes:
        raise UsageError("a sweep needs at least one axis, e.g. --sweep.lr=0.01,0.05,0.1")
    return axes


def _with_option(options: dict, path: list[str], value: float) -> dict:
    """``options`` with the nested key ``path`` (``["compressor_options", "fraction"]``) set."""
    out = dict(options)
    if len(path) == 1:
        out[path[0]] = value
    else:
        out[path[0]] = _with_option(dict(out.get(path[0]) or {}), path[1:], value)
    return out


def _check_points(config: TrainConfig, topo, axes: dict[str, list[float]]) -> list[str]:
    """Checks every axis value as a config value; returns gamma warnings on the run's graph ``topo``."""
    from jaxgossip.run.validate import gamma_warning

    warnings = []
    for name, values in axes.items():
        for value in values:
            if name.startswith("algorithm_options."):
                options = _with_option(config.algorithm_options, name.split(".")[1:], value)
                try:  # the same rules and messages as train's --algorithm_options.*
                    check_train_config(config.replace(algorithm_options=options))
                except ValueError as err:
                    raise UsageError(f"--sweep.{name}={value:g}: {err}") from None
                if name.endswith(".gamma"):
                    message = gamma_warning(config.algorithm, options, topo)
                    if message:
                        warnings.append(message)
            else:
                from jaxgossip.run.training_sweeps import apply_point

                try:
                    check_train_config(apply_point(config, {name: value}))
                except ValueError as err:
                    raise UsageError(f"--sweep.{name}: {err}") from None
    return warnings


def run(argv: list[str]) -> int:
    return run_command(command(), argv, _sweep)


def _sweep(ctx: Invocation) -> int:
    parsed, argv = ctx.parsed, ctx.argv
    options = parsed.build(SweepOptions)
    seeds = seed_list(options.seeds)
    axes = sweep_axes(options.sweep, parsed.values.get("algorithm"))
    from jaxgossip.run.resolve import check_run, resolve

    checked = check_run(parsed.build(TrainConfig))  # the objects every grid point shares, built once
    config = checked.config
    check_sync_only(config, "sweep")
    cost = common.cost_model(parsed.values, config)
    target = common.target_acc(parsed.values)
    for message in _check_points(config, checked.topology, axes):
        common.warn("sweep", message)
    from jaxgossip.run import training_sweeps

    try:  # every link value drawn for every seed on this graph (a trace that does not fit, ...)
        training_sweeps.link_tables(config, axes, seeds, checked.topology)
    except ValueError as err:
        raise UsageError(str(err)) from None
    common.warn_gamma("sweep", config, checked.topology)
    common.require_tensorboard(config)
    if config.tensorboard:
        _tensorboard_writer()
    if ctx.print_config({"seeds": seeds, "sweep": axes, **config.to_dict()}):
        return 0
    resolved = resolve(checked)
    out = ctx.take_out(os.path.join("runs", "sweep"))

    import jax

    from jaxgossip.engine import sweeps
    from jaxgossip.run import plots
    from jaxgossip.run.runner import consensus_watchdog

    start = time.perf_counter()
    points, metrics = training_sweeps.sweep_training(resolved, axes, seeds)
    jax.block_until_ready(metrics)
    wall = time.perf_counter() - start
    rows = sweeps.summarize(points, metrics)
    topo = resolved.topology
    flops, memory = common.step_flops_and_memory(resolved, bool(cost.joules_per_flop))
    rounds, bits = np.asarray(metrics.round), np.asarray(metrics.bits, dtype=np.float64)  # [G, S, M], [..., N]
    sim_time, comm_time = np.asarray(metrics.sim_time), np.asarray(metrics.comm_time)  # [G, S, M]
    watched = np.stack([np.asarray(getattr(metrics, k), np.float64) for k in ("train_loss", "test_loss", "consensus")])
    for g, row in enumerate(rows):
        per_seed = [
            common.training_cost(
                cost, config, topo, rounds[g, s], bits[g, s], sim_time[g, s], comm_time[g, s],
                flops=flops, memory=memory,
            )[-1]
            for s in range(bits.shape[1])
        ]
        row.update({key: float(np.mean([c[key] for c in per_seed])) for key in per_seed[0]})
        if target is not None:  # the mean over the seeds, reported only when every seed reaches the target
            acc = np.asarray(metrics.test_acc)[g]
            hit = [common.time_to_target(acc[s], sim_time[g, s], target) for s in range(bits.shape[1])]
            row["sim_s_to_target"] = None if None in hit else float(np.mean(hit))
        where = _diverged_at(metrics, g, watched[:, g], rounds[g, 0])
        row["diverged_at_round"] = where
        row["status"] = "ok" if where is None else f"diverged at round {where}"
        # The watchdog's earliest alarm over the seeds of this grid point.
        alarms = [
            consensus_watchdog(config, jax.tree_util.tree_map(lambda a, g=g, s=s: np.asarray(a)[g, s], metrics))
            for s in range(bits.shape[1])
        ]
        alarms = sorted((a for a in alarms if a is not None), key=lambda a: a.round)
        row["watchdog"] = common.watchdog_cell(alarms[0] if alarms else None)
        if where is not None:
            for key in [k for k in row if k.startswith(("test_", "train_", "node_acc", "consensus"))]:
                row[key] = None
            point = ", ".join(f"{name}={_show(points[name][g])}" for name in points)
            message = f"grid point {point} diverged at round {where} (NaN/inf or blow-up); the others are kept"
            common.warn("sweep", message)
    columns = [(name, name.split(".")[-1], ".4g") for name in points]
    columns += [
        ("test_acc", "acc(avg)", ".4f"),
        ("test_acc_std", "+-", ".4f"),
        ("consensus", "consensus", ".3g"),
        ("MB_per_node", "MB/node", ".2f"),
    ]
    columns = common.with_cost(columns, cost, training=True, target=target) + [
        ("status", "status", ""),
        ("watchdog", "watchdog", ""),
    ]
    print(plots.format_table(rows, columns))
    summary = f"{len(rows)} grid points x {len(seeds)} seeds in one compile: {wall:.1f}s"
    print(summary)
    os.makedirs(out, exist_ok=True)
    common.write_json(
        os.path.join(out, "sweep.json"),
        {
            "command": "jaxgossip sweep " + " ".join(argv),
            "config": config.to_dict(),
            "cost_model": cost.to_dict(),
            "axes": axes,
            "seeds": seeds,
            "rows": rows,
            "wall_time": wall,
        },
    )
    common.write_markdown(
        os.path.join(out, "sweep.md"),
        [
            f"Command: `jaxgossip sweep {' '.join(argv)}`",
            f"{config.algorithm} on {config.topology}, {config.dataset}, {config.num_rounds} rounds; {summary}.",
            plots.format_table(rows, columns, markdown=True),
            plots.table_legend(columns),
        ],
    )
    plots.plot_sweep(rows, list(points), os.path.join(out, "sweep.png"))
    if config.tensorboard:
        _write_tensorboard(out, points, metrics)
    print(f"wrote {out}/sweep.json, sweep.md and sweep.png" + (" and tensorboard/" if config.tensorboard else ""))
    return 0


def _show(value) -> str:
    """A grid value in a message or label: a number to 4 digits, a link spec as given."""
    return value if isinstance(value, str) else f"{value:.4g}"


def _diverged_at(metrics, g: int, watched, rounds) -> int | None:
    """The first round at which any seed of grid point ``g`` is NaN/inf (``watched`` [K, S, M]) or
    blows up (:func:`jaxgossip.run.watchdog.check_divergence`, the model's norm against its first
    recorded value), or None."""
    hits = [common.diverged_at(watched, rounds)]
    for s in range(np.shape(metrics.round)[1]):
        found = check_divergence(
            np.asarray(metrics.round)[g, s],
            train_loss=np.asarray(metrics.train_loss)[g, s],
            model_sq_norm=np.asarray(metrics.model_sq_norm)[g, s],
            consensus=np.asarray(metrics.consensus)[g, s],
        )
        hits.append(None if found is None else found.round)
    return min((h for h in hits if h is not None), default=None)


def _tensorboard_writer():
    """``jaxgossip.run.metric_writers.write_tensorboard``, or a UsageError naming what is missing."""
    try:
        from jaxgossip.run.metric_writers import write_tensorboard
    except ImportError as err:
        raise UsageError(f"--tensorboard=true: the TensorBoard writer is not available: {err}") from None
    return write_tensorboard


def _write_tensorboard(out: str, points: dict, metrics) -> None:
    """One TensorBoard run per grid point (metrics averaged over seeds) under ``out/tensorboard``."""
    write = _tensorboard_writer()
    arrays = {k: np.asarray(v, np.float64) for k, v in metrics._asdict().items() if k not in ("bits", "round")}
    rounds = np.asarray(metrics.round)[:, 0]  # [G, M]
    bits = np.asarray(metrics.bits, np.float64)  # [G, S, M, N]
    for g in range(rounds.shape[0]):
        label = ",".join(f"{name.split('.')[-1]}={_show(points[name][g])}" for name in points)
        label = "".join(c if c.isalnum() or c in "=,.:+-_" else "_" for c in label)  # a folder name
        rows = []
        for m, r in enumerate(rounds[g]):
            row = {"round": int(r), "MB_per_node": float(bits[g, :, m].mean() / 8e6)}
            row.update({k: float(v[g, :, m].mean()) for k, v in arrays.items()})
            rows.append(row)
        write(os.path.join(out, "tensorboard", label), rows)
