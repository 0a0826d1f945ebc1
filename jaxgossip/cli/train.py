"""``jaxgossip train``: one training run with checkpoints, metrics, plots and a summary table."""

from __future__ import annotations

import os
import typing

from jaxgossip.cli import common
from jaxgossip.cli.skeleton import Invocation, run_command
from jaxgossip.run.config import TrainConfig, train_field_help
from jaxgossip.run.lock import hold_out_of_run
from jaxgossip.run.parsing import Command

__all__ = ["command", "run", "TRAIN_COLUMNS"]

TRAIN_COLUMNS = [
    ("name", "run", ""),
    ("test_acc", "acc(avg)", ".4f"),
    ("node_acc_mean", "acc(nodes)", ".4f"),
    ("node_acc_min", "min", ".4f"),
    ("consensus", "consensus", ".3g"),
    ("MB_per_node", "MB/node", ".2f"),
    ("reduction", "vs gossip", ".1f"),
    ("wall_time", "time(s)", ".1f"),
    ("watchdog", "watchdog", ""),
]

EXAMPLES = """
examples:
  jaxgossip train --dataset=digits --model=mlp --algorithm=choco --algorithm_options.gamma=0.3 \\
      --algorithm_options.compressor=top_k --algorithm_options.compressor_options.fraction=0.1 --out runs/choco
  jaxgossip train --config digits_choco.yaml --lr=0.1 --decay_rounds=100,150
"""


def out_option(default: str) -> tuple[str, typing.Any, typing.Any, str]:
    return ("out", typing.Optional[str], None, f"output folder (default {default})")


def command() -> Command:
    return Command(
        name="train",
        description="Train N simulated workers with one communication algorithm on one graph. Writes "
        "metrics.json, metrics.csv, config.json, plots and an orbax checkpoint under --out; running the "
        "same command again resumes from the checkpoint. Exit status 3 if the loss diverges (the last "
        "good checkpoint is kept).",
        classes=[(TrainConfig, "training config (config file keys or --field=value)")],
        flags={**common.PROGRESS_FLAG, "no-resume": "ignore an existing checkpoint in --out"},
        extra={
            "output": [out_option("runs/NAME, NAME = --name or --algorithm"), common.TARGET_OPTION],
            "cost model (jaxgossip.sim.cost; reported next to the bits)": common.cost_options(training=True),
        },
        field_help=train_field_help(),
        epilog=common.algorithm_epilog() + "\n" + EXAMPLES,
    )


def run(argv: list[str]) -> int:
    return run_command(command(), argv, _train, lock=hold_out_of_run)


def _train(ctx: Invocation) -> int:
    import sys

    from jaxgossip.run.resolve import check_run, resolve

    parsed = ctx.parsed
    checked = check_run(parsed.build(TrainConfig))  # the run's objects that need no data
    config = checked.config
    cost = common.cost_model(parsed.values, checked.network, config.seed)
    target = common.target_acc(parsed.values)
    common.warn_gamma("train", config, checked.topology)
    common.require_tensorboard(config)
    if ctx.print_config(config.to_dict()):
        return 0
    resolved = resolve(checked)  # the data and the model, before anything is written
    out = ctx.take_out(os.path.join("runs", config.name or config.algorithm))

    from jaxgossip.run import plots
    from jaxgossip.run.runner import run_training

    try:
        result = run_training(
            resolved, out, resume=not parsed.flags["no_resume"], progress=not parsed.flags["no_progress"]
        )
    except FloatingPointError as err:
        print(f"jaxgossip train: stopped: {err}\n(metrics so far are in {out}/metrics.json)", file=sys.stderr)
        return 3
    from jaxgossip.run.distributed import is_primary

    # Every process of a multi-process run takes part in run_cost (it may gather sharded bits);
    # only process 0 writes files and prints.
    rows = common.run_cost(cost, result, out_dir=out if is_primary() else None)
    if not is_primary():
        return 0
    name = config.name or config.algorithm
    plots.plot_training({name: rows}, out, title=result.built.topology.name)
    last = dict(rows[-1], name=name, wall_time=result.wall_time, watchdog=common.watchdog_cell(result.watchdog))
    if target is not None:
        last["sim_s_to_target"] = common.rows_time_to_target(rows, target)
    columns = common.with_cost([c for c in TRAIN_COLUMNS if c[0] != "reduction"], cost, training=True, target=target)
    if "perplexity" in last:  # a next-token model
        columns[1:1] = [("perplexity", "ppl(avg)", ".2f"), ("node_perplexity", "ppl(nodes)", ".2f")]
    print(plots.format_table([last], columns))
    if config.byzantine.get("nodes") or config.byzantine.get("ids") not in (None, [], ""):
        print("accuracies, losses and consensus are over the honest nodes only (--byzantine.*)")
    print(f"wrote {out}/metrics.json, metrics.csv, config.json and plots")
    return 0
