"""``jaxgossip demo``: gossip, Choco, PowerGossip, push-sum, Sparse-Push and SCSP on non-IID data,
one table and plots; ``--algorithms`` picks the compared methods, a user's plug-in included, and
``--algorithm_options.METHOD.KEY=VALUE`` sets each method's options."""

from __future__ import annotations

import os
import re

from jaxgossip.checks import did_you_mean
from jaxgossip.cli import common
from jaxgossip.cli.skeleton import Invocation, run_command
from jaxgossip.run.config import TrainConfig, train_field_help
from jaxgossip.run.parsing import Command, UsageError
from jaxgossip.run.resolve import check_train_config
from jaxgossip.run.validate import check_sync_only

__all__ = ["command", "run", "demo_runs", "DEMO_DEFAULTS"]

# The demo's base config: the embedded digits data split non-IID over 16 workers, a small MLP.
DEMO_DEFAULTS = {
    "dataset": "digits",
    "num_nodes": 16,
    "partition": "dirichlet:0.1",
    "model": "mlp",
    "model_options": {"hidden": [64]},
    "batch_size": 16,
    "num_rounds": 400,
    "eval_every": 40,
    "evals_per_chunk": 2,
    "lr": 0.05,
    "weight_decay": 1e-4,
    "eval_size": 360,
}
QUICK = {"num_rounds": 60, "eval_every": 20, "evals_per_chunk": 1}
# Set per run by demo_runs: not options of the demo.
PER_RUN = ("algorithm", "topology", "final_merge", "name")
# In the demo this TrainConfig field is keyed by compared method: {METHOD: {option: value}}.
METHOD_OPTIONS = "algorithm_options"


def demo_runs(
    quick: bool = False, algorithms: list[str] | None = None, options: dict[str, dict] | None = None
) -> list[dict]:
    """The demo's comparison: one mapping of config overrides per run (``name``, ``algorithm``,
    ``topology``, optional ``algorithm_options`` and ``final_merge``; ``given_options`` in a run
    that ``options`` changed).

    By default the six runs below: symmetric methods on the ring, push-sum methods on the
    time-varying one-peer exponential graph, as each needs. ``algorithms`` picks the compared
    methods instead, in order: an entry naming one of the six (``gossip``, ``choco``, ...) keeps its
    settings; any other registered name or import path ``"package.module:factory"`` runs with its
    factory's defaults (plus the ``example_options`` of its metadata, where its defaults alone are
    refused) on the graph its metadata asks for (:func:`jaxgossip.run.features.graph_for`: a tree
    for tree methods, one-peer exponential for a time-varying column-stochastic method, the directed
    ring for a static one, the ring otherwise).

    ``options`` maps a compared method (its entry in ``algorithms``, or one of the six by its
    algorithm name) to hyperparameters merged over the run's own, at any depth; setting an option
    ``X`` to another value drops the preset's ``X_options`` (a new compressor does not inherit the
    old one's options) unless they are given too. Such a run is named by its method and the options
    given (``power_gossip rank=2``), so the table tells it from the preset. The command line's
    ``--algorithm_options.pkg.mod:make.gamma=0.5`` arrives split at every dot; the split is undone
    against the compared entries.

    Raises:
      UsageError: an empty list, a repeated entry, or an entry that names no algorithm (the
        message names the entry and why); options for a method that is not compared, or that are
        not a mapping.
    """
    runs = _default_runs()
    if algorithms is None:
        chosen = runs
    else:
        if isinstance(algorithms, str):
            algorithms = [algorithms]
        if not algorithms:
            raise UsageError("--algorithms is empty; give names or import paths, e.g. --algorithms=gossip,my_file:make")
        presets = {r["algorithm"]: r for r in runs}
        chosen = []
        for entry in algorithms:
            if entry in (r["algorithm"] for r in chosen):
                raise UsageError(f"--algorithms: {entry!r} is listed twice")
            chosen.append(presets[entry] if entry in presets else _plugin_run(entry))
    if not options:
        return chosen
    given = _method_options(options, [r["algorithm"] for r in chosen])
    return [_with_options(r, given[r["algorithm"]]) if r["algorithm"] in given else r for r in chosen]


def _method_options(options: dict, entries: list[str]) -> dict[str, dict]:
    """``options`` (``{METHOD: {option: value}}``) as a mapping from compared ``entries`` to their
    options, with import paths split at their dots by the command line joined again.

    Raises:
      UsageError: ``options`` is not a mapping, a key names no compared method (the message lists
        them), or a method's options are not a mapping.
    """
    from jaxgossip import algorithms

    if not isinstance(options, dict):
        raise UsageError(
            f"--{METHOD_OPTIONS}={options!r} must map each compared method to its options, "
            f"e.g. --{METHOD_OPTIONS}.power_gossip.rank=2"
        )
    found: dict[str, dict] = {}

    def visit(key: str, value) -> None:
        if key in entries:
            if not isinstance(value, dict):
                raise UsageError(
                    f"--{METHOD_OPTIONS}.{key}={value!r} must be a mapping of option -> value, "
                    f"e.g. --{METHOD_OPTIONS}.{key}.KEY=VALUE"
                )
            found[key] = _deep_merge(found.get(key, {}), value)
            return
        if isinstance(value, dict) and any(e.startswith(key + ".") for e in entries):
            for sub, sub_value in value.items():
                visit(f"{key}.{sub}", sub_value)
            return
        if key in algorithms.REGISTRY or ":" in key:  # a method, just not one of this comparison
            hint = f"; add it to --algorithms to compare it (the compared methods are {', '.join(entries)})"
        else:
            hint = (
                f"{did_you_mean(key, entries)}; the compared methods are {', '.join(entries)} (--algorithms), and "
                f"options are given per method: --{METHOD_OPTIONS}.METHOD.KEY=VALUE"
            )
        raise UsageError(f"--{METHOD_OPTIONS}.{key}: {key!r} is not a compared method{hint}")

    for key, value in options.items():
        visit(str(key), value)
    return found


def _deep_merge(base: dict, changes: dict) -> dict:
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _leaves(options: dict, prefix: str = "") -> list[str]:
    """``key=value`` for every leaf of ``options`` (nested keys dotted), for run names."""
    out = []
    for key, value in options.items():
        if isinstance(value, dict) and value:
            out += _leaves(value, f"{prefix}{key}.")
        else:
            value = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
            out.append(f"{prefix}{key}={value}")
    return out


def _with_options(run: dict, given: dict) -> dict:
    """``run`` with ``given`` merged over its options (see :func:`demo_runs`) and named after them."""
    own = dict(run.get("algorithm_options", {}))
    for key, value in given.items():
        companion = f"{key}_options"
        if companion in own and companion not in given and own.get(key) != value:
            del own[companion]  # the preset's options of the value it replaced
    merged = _deep_merge(own, given)
    name = " ".join([run["algorithm"], *([",".join(_leaves(given))] if given else [])])
    return {**run, "name": name, "algorithm_options": merged, "given_options": given}


def _plugin_run(entry: str) -> dict:
    from jaxgossip import algorithms

    try:
        meta = algorithms.resolve(entry)
    except (ValueError, TypeError) as err:
        raise UsageError(f"--algorithms: entry {entry!r}: {err}") from None
    from jaxgossip.run.features import graph_for

    run = {"name": entry, "algorithm": entry, "topology": graph_for(meta)}
    if meta.hooks.example_options:  # the options its defaults need (its refusal names them)
        run["algorithm_options"] = dict(meta.hooks.example_options)
    return run


def _default_runs() -> list[dict]:
    return [
        {"name": "gossip", "algorithm": "gossip", "topology": "ring"},
        {
            "name": "choco top-10%",
            "algorithm": "choco",
            "topology": "ring",
            "algorithm_options": {"compressor": "top_k", "compressor_options": {"fraction": 0.1}, "gamma": 0.3},
        },
        {
            "name": "power_gossip r1",
            "algorithm": "power_gossip",
            "topology": "ring",
            "algorithm_options": {"rank": 1, "num_iterations": 1},
        },
        {"name": "push_sum", "algorithm": "push_sum", "topology": "one_peer_exponential"},
        {
            "name": "sparse_push 10%",
            "algorithm": "sparse_push",
            "topology": "one_peer_exponential",
            "algorithm_options": {"fraction": 0.1, "gamma": 0.3},
        },
        {
            "name": "scsp 10%",
            "algorithm": "scsp",
            "topology": "one_peer_exponential",
            "algorithm_options": {"fraction": 0.1, "gamma": 0.3},
            "final_merge": 4,
        },
    ]


def command(quick: bool = False) -> Command:
    defaults = {**DEMO_DEFAULTS, **(QUICK if quick else {})}
    help_text = {k: v for k, v in train_field_help().items()}
    for key in PER_RUN:
        help_text[key] = "set per run by the demo (not an option here)"
    help_text[METHOD_OPTIONS] = (
        "options per compared method, merged over its preset's: --algorithm_options.METHOD.KEY=VALUE, "
        "e.g. --algorithm_options.power_gossip.rank=2 (METHOD as in --algorithms; in a config file "
        "algorithm_options: {power_gossip: {rank: 2}}); the run is named after them"
    )
    return Command(
        name="demo",
        description="Compare gossip, Choco (top-10%), PowerGossip, push-sum, Sparse-Push and SCSP on the "
        "same non-IID data (defaults below: digits, 16 workers, Dirichlet(0.1)), or the methods given by "
        "--algorithms, each with the options of --algorithm_options.METHOD.KEY=VALUE. Symmetric methods run on "
        "the ring, push-sum methods on the one-peer exponential graph. Writes comparison.md, comparison.json "
        "and plots under --out (each run in its own folder, which jaxgossip compare reads).",
        classes=[(TrainConfig, "base training config of every run (config file keys or --field=value)")],
        defaults=defaults,
        flags={**common.PROGRESS_FLAG, "quick": "a 1-minute version (60 rounds, evaluated every 20)"},
        extra={
            "compared methods": [
                (
                    "algorithms",
                    list[str] | None,
                    None,
                    "the compared methods in order (default: the six below), e.g. gossip,power_gossip,my_file:make: "
                    "one of the six keeps its settings; any other registered name or import path "
                    "package.module:factory runs with its factory's defaults (and the options its metadata's "
                    "example_options adds where those are refused) on the graph its metadata asks for; "
                    "the first is the baseline of the reduction column",
                ),
            ],
            "output": [("out", str | None, None, "output folder (default runs/demo)"), common.TARGET_OPTION],
            "cost model (jaxgossip.sim.cost; reported next to the bits)": common.cost_options(training=True),
        },
        field_help=help_text,
        epilog="the compared runs (name: algorithm on topology, options; --algorithm_options.METHOD.KEY=VALUE is "
        "merged over these):\n"
        + "\n".join(
            f"  {r['name']}: {r['algorithm']} on {r['topology']}"
            + (f", {r['algorithm_options']}" if r.get("algorithm_options") else "")
            + (f", final_merge={r['final_merge']}" if r.get("final_merge") else "")
            for r in demo_runs(quick)
        )
        + "\n\nexamples:\n  jaxgossip demo --quick --algorithms=gossip,power_gossip,my_file:damped_gossip"
        + "\n  jaxgossip demo --quick --algorithms=gossip,power_gossip,choco \\\n"
        "      --algorithm_options.power_gossip.rank=2 --algorithm_options.choco.compressor_options.fraction=0.2"
        + "\n  jaxgossip demo --algorithms=gossip,my_file:damped_gossip \\\n"
        "      --algorithm_options.my_file:damped_gossip.beta=0.5",
    )


def _run_error(spec_run: dict, err: Exception) -> UsageError:
    """A run's config error, named by the option the user gave where the run has options of theirs
    (``--algorithm_options.power_gossip.rnk: ...``), else by its ``--algorithms`` entry."""
    entry, message = spec_run["algorithm"], str(err)
    if "given_options" not in spec_run:
        return UsageError(f"--algorithms: entry {entry!r}: {message}")
    if message.startswith(METHOD_OPTIONS + "."):  # an option name the method does not take
        return UsageError(f"--{METHOD_OPTIONS}.{entry}.{message[len(METHOD_OPTIONS) + 1 :]}")
    return UsageError(f"--{METHOD_OPTIONS}.{entry}: {message}")


def _run_dir(out: str, name: str) -> str:
    # run names may be import paths ("pkg.mod:make") or carry "%"; keep folder names portable
    return os.path.join(out, re.sub(r"[^A-Za-z0-9_.-]+", "_", name.replace("%", "pct")))


def run(argv: list[str]) -> int:
    return run_command(command(quick="--quick" in argv), argv, _demo)


def _demo(ctx: Invocation) -> int:
    parsed = ctx.parsed
    fixed = sorted(set(PER_RUN) & parsed.given)
    if fixed:
        raise UsageError(
            f"--{fixed[0]} is set per run by the demo; choose the methods with --algorithms and their options "
            "with --algorithm_options.METHOD.KEY=VALUE, compare other settings with jaxgossip train or jaxgossip sweep"
        )
    per_method = parsed.values.get(METHOD_OPTIONS) or {}
    base = check_train_config(parsed.build(TrainConfig).replace(algorithm_options={}))
    check_sync_only(base, "demo")
    cost = common.cost_model(parsed.values, base)
    target = common.target_acc(parsed.values)
    common.require_tensorboard(base)
    chosen = parsed.values.get("algorithms")
    runs = demo_runs(parsed.flags["quick"], chosen, per_method)
    from jaxgossip.run.resolve import check_run, load_data, resolve

    configs = []  # checked runs, then resolved ones
    for spec_run in runs:
        config = base.replace(
            name=spec_run["name"],
            algorithm=spec_run["algorithm"],
            topology=spec_run["topology"],
            algorithm_options=spec_run.get("algorithm_options", {}),
            final_merge=spec_run.get("final_merge"),
        )
        try:
            configs.append(check_run(config))  # every run is checked before the first one starts
        except (ValueError, TypeError) as err:
            raise _run_error(spec_run, err) from None
    printed = {k: v for k, v in base.to_dict().items() if k not in PER_RUN and k != METHOD_OPTIONS}
    if chosen is not None:
        printed["algorithms"] = list(chosen)
    if per_method:
        printed[METHOD_OPTIONS] = per_method
    if ctx.print_config(printed):
        return 0
    out = ctx.take_out(os.path.join("runs", "demo"))

    from jaxgossip.cli.train import TRAIN_COLUMNS
    from jaxgossip.run import plots
    from jaxgossip.run.runner import run_training

    dataset = load_data(base)  # one data set for every run
    configs = [resolve(checked, dataset) for checked in configs]
    print(f"data: {dataset.source}")
    print(f"demo: {base.num_nodes} nodes, {base.partition} partition, model {base.model}, {base.num_rounds} rounds")
    results, table = {}, []
    for resolved_run in configs:
        config = resolved_run.config
        run_dir = _run_dir(out, config.name)
        try:
            result = run_training(
                resolved_run,
                run_dir,
                resume=False,
                progress=not parsed.flags["no_progress"],
                dataset=dataset,
                log=lambda s: None,
            )
        except FloatingPointError as err:  # a NaN or a blow-up (jaxgossip.run.watchdog.check_divergence)
            common.warn("demo", f"{config.name}: {err}")
            found = getattr(err, "divergence", None)
            status = "diverged" if found is None else f"diverged at round {found.round}"
            table.append(
                {
                    "name": config.name,
                    "status": status,
                    "diverged_at_round": getattr(found, "round", None),
                    "dir": os.path.basename(run_dir),
                }
            )
            continue
        rows = common.run_cost(cost, result, out_dir=run_dir)
        results[config.name] = rows
        table.append(
            dict(
                rows[-1],
                name=f"{config.name} ({result.built.topology.name})",
                wall_time=result.wall_time,
                status="ok",
                dir=os.path.basename(run_dir),  # the run's folder under --out (jaxgossip compare reads it)
                watchdog=common.watchdog_cell(result.watchdog),
                sim_s_to_target=None if target is None else common.rows_time_to_target(rows, target),
            )
        )
        print(
            f"  {config.name:<18} acc {rows[-1]['test_acc']:.4f}  MB/node {rows[-1]['MB_per_node']:.2f}  "
            f"({result.wall_time:.1f}s)",
            flush=True,
        )
    # Reductions are relative to the first run of the list (by default gossip, the uncompressed baseline).
    baseline = configs[0].config.name
    baseline_mb = next((r["MB_per_node"] for r in table if r["name"].startswith(baseline) and "MB_per_node" in r), None)
    for row in table:
        if baseline_mb and row.get("MB_per_node"):
            row["reduction"] = baseline_mb / row["MB_per_node"]
    columns = common.with_cost(TRAIN_COLUMNS, cost, training=True, target=target)
    if baseline != _default_runs()[0]["name"]:  # the header names the baseline when it is not the default
        columns = [(k, f"vs {baseline}" if k == "reduction" else h, f) for k, h, f in columns]
    if any(r["status"] != "ok" for r in table):
        columns = columns + [("status", "status", "")]
    print()
    print(plots.format_table(table, columns))
    os.makedirs(out, exist_ok=True)
    plots.plot_training(results, out, title=f"{base.dataset}, {base.num_nodes} nodes, {base.partition}")
    title = f"{base.dataset}, {base.num_nodes} nodes, {base.partition} partition, {base.num_rounds} rounds"
    common.write_markdown(
        os.path.join(out, "comparison.md"),
        [
            f"# jaxgossip demo: {title}",
            f"data: {dataset.source}",
            plots.format_table(table, columns, markdown=True),
            plots.table_legend(columns),
        ],
    )
    common.write_json(
        os.path.join(out, "comparison.json"), {"config": base.to_dict(), "cost_model": cost.to_dict(), "rows": table}
    )
    print(
        f"wrote {out}/comparison.md, comparison.json and plots "
        "(accuracy_vs_rounds.png, accuracy_vs_bits.png, accuracy_vs_time.png, consensus.png)"
    )
    diverged = [r["name"] for r in table if r["status"] != "ok"]
    if diverged:  # the comparison is written, but a method that did not train fails the command
        common.warn("demo", f"{len(diverged)} of {len(table)} runs diverged: {', '.join(diverged)} (exit status 3)")
        return 3
    return 0
