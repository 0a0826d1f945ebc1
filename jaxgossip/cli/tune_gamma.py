"""``jaxgossip tune-gamma``: the largest consensus step size at which a compressed gossip method
contracts on a graph and model, from one vmapped consensus sweep; table, recommendation, JSON, plot."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from jaxgossip.cli import common
from jaxgossip.cli.skeleton import Invocation, run_command
from jaxgossip.run.parsing import Command, UsageError

__all__ = ["TuneGammaConfig", "command", "run", "check_tune_config"]


@dataclasses.dataclass(frozen=True)
class TuneGammaConfig:
    """A step-size tuning (config file keys or ``--field=value``)."""

    algorithm: str | None = None
    algorithm_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    topology: str = "ring"
    num_nodes: int = 8
    shape: tuple[int, ...] = ()
    model: str | None = None
    model_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    input_shape: tuple[int, ...] = (28, 28, 1)
    num_classes: int = 10
    gammas: tuple[float, ...] = ()
    num_steps: int = 1000
    seed: int = 0
    safety: float = 2.5


FIELD_HELP = {
    "algorithm": "the algorithm to tune (required); one whose metadata names a consensus step size",
    "algorithm_options": "its other options (compressor, fraction, ...), not the step size itself, e.g. "
    "--algorithm_options.compressor=top_k --algorithm_options.compressor_options.fraction=0.01",
    "topology": "graph spec: ring, torus, one_peer_exponential, exponential, ... (as jaxgossip train)",
    "num_nodes": "N, the number of nodes (>= 2)",
    "shape": "per-node value of this shape, e.g. 1000 or 100,100 (or give --model instead)",
    "model": "take the per-node parameter shapes (leaf by leaf) of this model, e.g. cnn or resnet20",
    "model_options": "the model's options, e.g. --model_options.features=[16,32]",
    "input_shape": "one input sample's shape for --model, e.g. 28,28,1 (Fashion-MNIST) or 32,32,3 (CIFAR-10)",
    "num_classes": "output classes of --model",
    "gammas": "the step-size grid, e.g. 0.01,0.03,0.1,0.3 (default, empty: 31 values 1e-3 .. 1, log-spaced)",
    "num_steps": "consensus rounds R per step size (>= 4; several times 1/fraction for top-k)",
    "seed": "seed of the spread-out start and the compressors' randomness (>= 0)",
    "safety": "recommended = largest contracting step size / safety (>= 1)",
}

COLUMNS = [
    ("gamma", "gamma", ".4g"),
    ("final_rel_error", "e_R/e_0", ".3g"),
    ("rate", "rate/round", ".4f"),
    ("contracts", "contracts", ""),
    ("mark", "", ""),
]


def command() -> Command:
    return Command(
        name="tune-gamma",
        description="Find the largest consensus step size at which a (compressed) gossip method contracts, by one "
        "vmapped consensus sweep over a grid of step sizes, and recommend one (largest contracting / --safety). "
        "Every node starts from a spread-out state (each parameter leaf i.i.d. N(0, 1/D_leaf)); a step size "
        "contracts if after --num_steps rounds the consensus error is finite, below its start and still falling "
        "over the second half (or below 1e-6 of its start). Writes tune_gamma.json, tune_gamma.md and "
        "tune_gamma.png under --out (jaxgossip.engine.tuning.tune_gamma is the Python API).",
        classes=[(TuneGammaConfig, "tuning config (config file keys or --field=value)")],
        flags={k: v for k, v in common.PROGRESS_FLAG.items() if k == "print-config"},
        extra={"output": [("out", str | None, None, "output folder (default runs/tune_gamma)")]},
        field_help=FIELD_HELP,
        epilog=common.algorithm_epilog()
        + "\n\nexamples:\n  jaxgossip tune-gamma --algorithm=choco --algorithm_options.compressor=top_k "
        "--algorithm_options.compressor_options.fraction=0.01 --shape=1000\n"
        "  jaxgossip tune-gamma --algorithm=sparse_push --algorithm_options.fraction=0.01 "
        "--topology=one_peer_exponential --model=cnn --model_options.features=[16,32] --input_shape=28,28,1",
    )


def check_tune_config(config: TuneGammaConfig):
    """Validates ``config`` (no compile); returns ``(topology, shapes)``.

    Raises:
      UsageError: naming the field and the fix.
    """
    import math

    from jaxgossip import algorithms
    from jaxgossip.run.validate import check_algorithm, check_model_options, check_topology

    if config.algorithm is None:
        tunable = [name for name, i in algorithms.INFOS.items() if i.sweep.step_size is not None]
        raise UsageError(f"--algorithm is required; algorithms with a consensus step size: {', '.join(tunable)}")
    for field, low in (("num_nodes", 2), ("num_steps", 4), ("seed", 0), ("num_classes", 1)):
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UsageError(f"{field}={value!r} must be an int >= {low}")
    if isinstance(config.safety, bool) or not (isinstance(config.safety, (int, float)) and config.safety >= 1):
        raise UsageError(f"safety={config.safety!r} must be a number >= 1")
    if config.gammas:
        gammas = list(config.gammas)
        if len(gammas) < 2 or not all(isinstance(g, (int, float)) and math.isfinite(g) and g > 0 for g in gammas):
            raise UsageError(f"gammas={gammas} must be at least 2 finite step sizes > 0")
    topo = check_topology(config.topology, config.num_nodes, config.seed)
    options = dict(config.algorithm_options)
    check_algorithm(config.algorithm, options, topo)
    option = algorithms.resolve(config.algorithm).sweep.step_size
    if option is None:
        tunable = [name for name, i in algorithms.INFOS.items() if i.sweep.step_size is not None]
        raise UsageError(
            f"algorithm={config.algorithm!r} has no consensus step size to tune (its metadata's step_size is None); "
            f"algorithms with one: {', '.join(tunable)}"
        )
    if option in options:
        raise UsageError(f"algorithm_options.{option} is what tune-gamma sweeps; give the grid with --gammas instead")
    if bool(config.shape) == (config.model is not None):
        raise UsageError("give exactly one of --shape (e.g. 1000 or 100,100) and --model (e.g. cnn)")
    if config.shape:
        shape = tuple(config.shape)
        if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape):
            raise UsageError(f"shape={list(shape)} must be one or more sizes >= 1, e.g. 1000 or 100,100")
        return topo, shape
    model_options = check_model_options(config.model, dict(config.model_options))
    input_shape = tuple(config.input_shape)
    if not input_shape or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in input_shape):
        raise UsageError(f"input_shape={list(input_shape)} must be one or more sizes >= 1, e.g. 28,28,1")
    from jaxgossip.engine.tuning import model_shapes

    try:
        shapes = model_shapes(config.model, input_shape, config.num_classes, **model_options)
    except (ValueError, TypeError) as err:
        raise UsageError(f"model={config.model!r} on input_shape={list(input_shape)}: {err}") from None
    return topo, shapes


def run(argv: list[str]) -> int:
    return run_command(command(), argv, _tune_gamma)


def _tune_gamma(ctx: Invocation) -> int:
    argv = ctx.argv
    config = ctx.parsed.build(TuneGammaConfig)
    topo, shapes = check_tune_config(config)
    if ctx.print_config(dataclasses.asdict(config)):
        return 0
    out = ctx.take_out(os.path.join("runs", "tune_gamma"))

    import numpy as np

    from jaxgossip.engine.tuning import tune_gamma, tuning_rows
    from jaxgossip.run import plots

    result = tune_gamma(
        config.algorithm,
        topo,
        shapes,
        options=dict(config.algorithm_options),
        gammas=list(config.gammas) or None,
        num_steps=config.num_steps,
        seed=config.seed,
        safety=float(config.safety),
    )
    rows = tuning_rows(result)
    columns = [(result.option if key == "gamma" else key, header, spec) for key, header, spec in COLUMNS]
    shape_text = f"shape {list(config.shape)}" if config.shape else f"model {config.model}"
    options = dict(config.algorithm_options)
    title = f"{config.algorithm} {options} on {topo.name}, {shape_text}, {result.num_steps} rounds"
    print(title)
    print(plots.format_table(rows, columns))
    if result.note:
        common.warn("tune-gamma", result.note)
    if result.recommended is not None:
        largest = result.largest_contracting
        rule = f"largest contracting {largest:.4g} / {result.safety:g}"
        print(f"recommended {result.option}: {result.recommended:g} ({rule})")
    os.makedirs(out, exist_ok=True)
    common.write_json(
        os.path.join(out, "tune_gamma.json"),
        {
            "command": "jaxgossip tune-gamma " + " ".join(argv),
            "config": dataclasses.asdict(config),
            "topology": topo.name,
            "option": result.option,
            "largest_contracting": result.largest_contracting,
            "recommended": result.recommended,
            "safety": result.safety,
            "note": result.note,
            "rows": rows,
            "bits_per_round_per_node": np.asarray(result.bits_per_round).tolist(),
            "error": {f"{g:.6g}": np.asarray(e).tolist() for g, e in zip(result.gammas, result.error)},
        },
    )
    common.write_markdown(
        os.path.join(out, "tune_gamma.md"),
        [
            f"Command: `jaxgossip tune-gamma {' '.join(argv)}`",
            f"Tuning: {title}.",
            plots.format_table(rows, columns, markdown=True),
            plots.table_legend(columns),
        ],
    )
    error = np.asarray(result.error, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        final = error[:, -1] / error[:, 0]
    if not np.any(np.isfinite(final) & (final > 0)):  # every step size overflowed: nothing for a log scale
        common.warn("tune-gamma", "every step size's error overflowed to inf/NaN; tune_gamma.png not drawn")
        print(f"wrote {out}/tune_gamma.json and tune_gamma.md")
        return 0
    plots.plot_gamma_tuning(result, os.path.join(out, "tune_gamma.png"), title=title)
    print(f"wrote {out}/tune_gamma.json, tune_gamma.md and tune_gamma.png")
    return 0
