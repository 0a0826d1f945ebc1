"""``jaxgossip compare DIR...``: finished runs side by side, one table and overlay plots.

A run is a folder written by ``jaxgossip train --out DIR`` (``config.json`` and ``metrics.json``);
a ``jaxgossip demo`` folder stands for its runs, in the demo's order. Runs are compared only when
the comparison means something: each must be finished, and all must train the same model on the
same data split over the same number of nodes and be evaluated on the same test samples. Methods,
graphs, step sizes, seeds and lengths may differ: those are what one compares.
"""

from __future__ import annotations

import json
import math
import os
import typing

from jaxgossip.cli import common
from jaxgossip.cli.skeleton import Invocation, run_command
from jaxgossip.run.parsing import Command, UsageError

__all__ = ["command", "run", "load_run", "load_runs", "check_compatible", "COMPARED_FIELDS", "CompareRun"]

# The config fields that must agree (field -> what it fixes), in the order they are checked.
COMPARED_FIELDS = {
    "dataset": "data set",
    "num_nodes": "number of nodes",
    "model": "model",
    "model_options": "model",
    "partition": "data split",
    "eval_size": "eval set",
}

EXAMPLES = """
examples:
  jaxgossip train --dataset=digits --model=mlp --out runs/gossip
  jaxgossip train --dataset=digits --model=mlp --algorithm=choco --algorithm_options.compressor=top_k \\
      --algorithm_options.compressor_options.fraction=0.1 --algorithm_options.gamma=0.3 --out runs/choco
  jaxgossip compare runs/gossip runs/choco --out runs/compare
  jaxgossip compare runs/demo runs/my_method      # a demo folder stands for its runs
"""


class CompareRun(typing.NamedTuple):
    """One finished run read from its folder.

    Attributes:
      path: the run's folder.
      name: its label in the table and the plots (``config.name``, else ``config.algorithm``).
      config: ``config.json`` (the run's TrainConfig as a mapping).
      summary: the run-level fields of ``metrics.json`` (``topology``, ``wall_time``, ``watchdog``, ...).
      rows: the metric rows of ``metrics.json`` (a final merge's row last).
    """

    path: str
    name: str
    config: dict
    summary: dict
    rows: list


def command() -> Command:
    return Command(
        name="compare",
        description="jaxgossip compare DIR [DIR ...]: compare finished training runs, the folders written by "
        "jaxgossip train --out DIR (or a jaxgossip demo folder, for its runs). Prints one table (the last "
        "evaluation of each run, its MB per node against the first run's) and writes it as comparison.md and "
        "comparison.json with overlay plots (accuracy and training loss against rounds, MB sent per node and "
        "simulated time) under --out. Refuses (exit 2) a folder without metrics.json or config.json, an unfinished "
        "or diverged run, and runs of another data set, number of nodes, model, data split or eval set (naming the "
        "field and both values).",
        classes=[],
        extra={
            "runs": [
                (
                    "runs",
                    list[str] | None,
                    None,
                    "the run folders in order (also given as DIR... before or after the options); the first is "
                    "the baseline of the 'vs first' column",
                )
            ],
            "output": [("out", str | None, None, "output folder (default runs/compare)"), common.TARGET_OPTION],
        },
        epilog=EXAMPLES,
    )


def _split_positionals(argv: list[str], spec: Command) -> tuple[list[str], list[str]]:
    """(run folders, options) of ``argv``: every token that is neither an option nor the value of
    the option before it (``--out DIR``) is a run folder."""
    dirs, options = [], []
    i = 0
    while i < len(argv):
        item = argv[i]
        if item.startswith("-"):
            options.append(item)
            key = item.lstrip("-")
            if "=" not in item and key not in spec.flags and key not in ("h", "help") and i + 1 < len(argv):
                options.append(argv[i + 1])
                i += 1
        else:
            dirs.append(item)
        i += 1
    return dirs, options


def _read_json(path: str, what: str) -> dict:
    try:
        with open(path) as f:
            value = json.load(f)
    except json.JSONDecodeError as err:
        raise UsageError(f"{path} is not valid JSON ({err}); is the {what} complete?") from None
    except OSError as err:
        raise UsageError(f"{path} cannot be read: {err.strerror or err}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{path} must hold a mapping, got {type(value).__name__}")
    return value


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_run(path: str) -> CompareRun:
    """Reads the finished run in folder ``path``.

    A run is finished when its metrics hold every evaluation (``num_rounds / eval_every`` training
    rows, the last at ``num_rounds``) and were written by the run's end, which marks every row with
    its ``phase``; a run stopped by a divergence, a kill or an interruption lacks one or the other.

    Raises:
      UsageError: the folder is missing, lacks ``metrics.json`` or ``config.json``, or holds an
        unfinished or diverged run (the message names the folder and the reason).
    """
    if not os.path.isdir(path):
        raise UsageError(f"{path}: " + ("is a file, not a run folder" if os.path.exists(path) else "does not exist"))
    metrics_path, config_path = os.path.join(path, "metrics.json"), os.path.join(path, "config.json")
    if not os.path.exists(metrics_path):
        raise UsageError(
            f"{path}: no metrics.json, so no run to compare (give folders written by jaxgossip train --out DIR, "
            "or a jaxgossip demo folder)"
        )
    if not os.path.exists(config_path):
        raise UsageError(f"{path}: no config.json next to metrics.json; the run's settings are unknown")
    metrics, config = _read_json(metrics_path, "run"), _read_json(config_path, "run")
    rows = metrics.get("rows")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise UsageError(f"{metrics_path}: 'rows' must be a list of metric rows")
    for field in ("num_rounds", "eval_every"):
        if not isinstance(config.get(field), int) or config[field] < 1:
            raise UsageError(f"{config_path}: {field}={config.get(field)!r} must be an int >= 1")
    train = [r for r in rows if r.get("phase") != "merged"]
    bad = next((r for r in train if not (_finite(r.get("train_loss")) and _finite(r.get("test_acc")))), None)
    if bad is not None:
        raise UsageError(f"{path}: the run diverged at round {bad.get('round')} (NaN or inf in its metrics)")
    expected, last = config["num_rounds"] // config["eval_every"], (train[-1].get("round") if train else 0)
    if len(train) < expected or last != config["num_rounds"] or "phase" not in rows[-1]:
        stop = f"its metrics end at round {last} of num_rounds={config['num_rounds']}"
        if len(train) >= expected and last == config["num_rounds"]:
            stop = "it stopped before its final write (diverged, killed or interrupted)"
        raise UsageError(
            f"{path}: unfinished run: {stop}; finish it first (run the same jaxgossip train command again to resume)"
        )
    summary = {k: v for k, v in metrics.items() if k != "rows"}
    name = str(config.get("name") or config.get("algorithm") or os.path.basename(path))
    return CompareRun(path, name, config, summary, rows)


def _demo_members(path: str) -> list[str] | None:
    """The run folders of a demo folder in the demo's order (a demo's ``comparison.json`` names
    each row's folder), skipping runs the demo marked diverged; else the subfolders that hold a
    ``metrics.json``, sorted. None when ``path`` holds neither."""
    listing = os.path.join(path, "comparison.json")
    if os.path.exists(listing):
        rows = _read_json(listing, "demo").get("rows") or []
        named = [r for r in rows if isinstance(r, dict) and r.get("dir")]
        if named:
            for r in named:
                if r.get("status", "ok") != "ok":
                    where = os.path.join(path, r["dir"])
                    common.warn("compare", f"{where}: left out, the demo marked it {r['status']}")
            return [os.path.join(path, r["dir"]) for r in named if r.get("status", "ok") == "ok"]
    if not os.path.isdir(path):
        return None
    subfolders = sorted(
        os.path.join(path, d) for d in os.listdir(path) if os.path.exists(os.path.join(path, d, "metrics.json"))
    )
    return subfolders or None


def load_runs(paths: list[str]) -> list[CompareRun]:
    """The finished runs of ``paths`` (run folders, or demo folders for their runs), in order, with
    unique names (a repeated name gets its folder), checked by :func:`check_compatible`.

    Raises:
      UsageError: no folder, a folder listed twice, a folder that is not a finished run, or
        incompatible runs.
    """
    if not paths:
        raise UsageError("no runs to compare; give their folders: jaxgossip compare DIR DIR ... (see --help)")
    folders = []
    for path in paths:
        members = None if os.path.exists(os.path.join(path, "metrics.json")) else _demo_members(path)
        folders += members if members is not None else [path]
    if not folders:
        raise UsageError(f"no finished runs to compare in {', '.join(paths)}")
    seen = {}
    for folder in folders:
        real = os.path.realpath(folder)
        if real in seen:
            also = "" if seen[real] == folder else f" (also as {seen[real]})"
            raise UsageError(f"{folder}: listed twice{also}; give each run once")
        seen[real] = folder
    runs = [load_run(folder) for folder in folders]
    check_compatible(runs)
    names = [r.name for r in runs]
    return [r._replace(name=f"{r.name} [{r.path}]") if names.count(r.name) > 1 else r for r in runs]


def check_compatible(runs: list[CompareRun]) -> None:
    """Raises a UsageError naming the first field of :data:`COMPARED_FIELDS` (or the data source,
    which tells ``dataset: auto`` and other data folders apart) on which a run differs from the
    first, with both values and both folders."""
    first = runs[0]
    for other in runs[1:]:
        for field, meaning in COMPARED_FIELDS.items():
            a, b = first.config.get(field), other.config.get(field)
            if a != b:
                raise UsageError(
                    f"runs not comparable: {field} (the {meaning}) differs: {field}={a!r} in {first.path} but "
                    f"{field}={b!r} in {other.path}; compare runs of the same {meaning}"
                )
        a, b = first.summary.get("data_source"), other.summary.get("data_source")
        if a is not None and b is not None and a != b:
            raise UsageError(f"runs not comparable: the data differs: {a!r} in {first.path} but {b!r} in {other.path}")


def _watchdog(alarm) -> str:
    if not isinstance(alarm, dict):
        return "ok"
    return f"round {alarm.get('round')} ({alarm.get('rule')})"


def _table(runs: list[CompareRun], target: float | None) -> tuple[list[dict], list[tuple[str, str, str]]]:
    """The last row of every run with its name, the MB ratio to the first run, wall time and
    watchdog cell; and the columns of ``jaxgossip train``'s table that the rows fill."""
    from jaxgossip.cli.train import TRAIN_COLUMNS

    table = []
    for r in runs:
        last = r.rows[-1]
        topology = r.summary.get("topology") or r.config.get("topology")
        row = dict(
            last,
            name=f"{r.name} ({topology})" if topology else r.name,
            wall_time=r.summary.get("wall_time", last.get("wall_time")),
            watchdog=_watchdog(r.summary.get("watchdog")),
            path=r.path,
        )
        if target is not None and all("sim_s" in x for x in r.rows):
            row["sim_s_to_target"] = common.rows_time_to_target(r.rows, target)
        table.append(row)
    first_mb = table[0].get("MB_per_node")
    for row in table:
        if _finite(first_mb) and first_mb > 0 and _finite(row.get("MB_per_node")) and row["MB_per_node"] > 0:
            row["reduction"] = first_mb / row["MB_per_node"]
    columns = [(k, "vs first" if k == "reduction" else h, f) for k, h, f in TRAIN_COLUMNS]
    every_cost = common.CostModel(joules_per_flop=1e-12)  # lists every cost column; the absent ones are dropped
    columns = common.with_cost(columns, every_cost, training=True, target=target)
    if all("perplexity" in row for row in table):  # next-token models, as jaxgossip train shows them
        columns[1:1] = [("perplexity", "ppl(avg)", ".2f"), ("node_perplexity", "ppl(nodes)", ".2f")]
    keep = {"name", "reduction", "sim_s_to_target"}
    columns = [c for c in columns if c[0] in keep or any(c[0] in row for row in table)]
    return table, columns


def run(argv: list[str]) -> int:
    spec = command()
    dirs, options = _split_positionals(argv, spec)  # the run folders are not options: parsed apart
    return run_command(spec, options, lambda ctx: _compare(ctx, dirs))


def _compare(ctx: Invocation, dirs: list[str]) -> int:
    parsed = ctx.parsed
    target = common.target_acc(parsed.values)
    paths = list(parsed.values.get("runs") or []) + dirs
    runs = load_runs(paths)
    default = os.path.join("runs", "compare")
    out = ctx.out_folder(default)
    for path in paths + [r.path for r in runs]:  # its plots and tables would overwrite the run's own
        if os.path.realpath(out) == os.path.realpath(path):
            raise UsageError(f"--out={out!r} is the compared folder {path!r}; give another folder for the comparison")
    out = ctx.take_out(default)

    from jaxgossip.run import plots

    table, columns = _table(runs, target)
    first = runs[0].config
    title = f"{first.get('dataset')}, {first.get('num_nodes')} nodes, {first.get('partition')}"
    print(plots.format_table(table, columns))
    print(f"vs first: MB per node of {runs[0].name} divided by each run's")
    written = plots.plot_comparison({r.name: r.rows for r in runs}, out, title=title)
    common.write_markdown(
        os.path.join(out, "comparison.md"),
        [
            f"# jaxgossip compare: {title}",
            "runs: " + ", ".join(f"`{r.path}`" for r in runs),
            plots.format_table(table, columns, markdown=True),
            plots.table_legend(columns),
        ],
    )
    common.write_json(
        os.path.join(out, "comparison.json"),
        {"runs": [{"name": r.name, "path": r.path, "config": r.config} for r in runs], "rows": table},
    )
    print(f"wrote {out}/comparison.md, comparison.json and plots ({', '.join(os.path.basename(p) for p in written)})")
    return 0
