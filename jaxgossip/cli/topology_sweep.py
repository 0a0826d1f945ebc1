"""``jaxgossip topology-sweep``: one algorithm on many graphs x sizes x seeds, one compiled program per
group of same-shape graphs (consensus mode by default, training with ``--train``)."""

from __future__ import annotations

import dataclasses
import math
import os
import time
import typing

import numpy as np

from jaxgossip.cli import common
from jaxgossip.cli.skeleton import Invocation, run_command
from jaxgossip.cli.sweep import seed_list
from jaxgossip.run.config import TrainConfig, train_field_help
from jaxgossip.run.parsing import Command, UsageError
from jaxgossip.run.validate import check_sync_only
from jaxgossip.run.watchdog import check_divergence, consensus_diverged_at

__all__ = ["TopologySweepOptions", "command", "run"]

_TOPOLOGY_SWEEP_HELP = """\
Compare graphs: run one algorithm on every topology x size x seed. Graphs with the same node count,
kernel and stochasticity share one compiled program (jaxgossip.topology.stack), vmapped over graphs
and seeds, so a sweep over many graphs costs a few compiles.

Consensus mode (the default): graph g with seed s starts from x0 ~ N(0, 1)^[N, D] and runs
--num_steps rounds of --algorithm. Per graph the table reports the spectral gap, the mean degree,
the final relative error ||X_R - X_bar||^2 / ||X_0 - X_bar||^2 (mean +- std over seeds), the rounds
and MB sent per node until the relative error first drops below --tol (NaN if a seed never gets
there), the total MB per node, the simulated communication time (per round, in all, and until
--tol; cost model of --time.*) and the compile group. A spec that cannot be built at a size
(hypercube for N not a power of 2, torus for prime N, ...) is skipped with a note; an unknown spec is
an error before anything runs.

Training mode (--train): trains the config of --config and --key=value overrides (the fields
`jaxgossip train` takes, e.g. --dataset=digits --num_rounds=200) on every graph with
N = --num_nodes nodes; seed s replaces the config's seed, the data partition and random graphs use
its data_seed (or seed) for all. Per graph: spectral gap, final test accuracy of the averaged
model (mean +- std over seeds), consensus distance, MB sent per node and the cost-model columns.

Both print the table and the number of compiled programs, and write table.md, results.json and a
figure (consensus: topology_sweep.png, the error, rounds and MB to --tol against the spectral gap;
training: accuracy_vs_gap.png) into --out.

examples:
  jaxgossip topology-sweep --topologies=ring,torus,exponential,erdos_renyi:0.3 --sizes=8,16,64 \\
      --out runs/topologies
  jaxgossip topology-sweep --topologies=ring,torus,hypercube --sizes=16,64 --algorithm=choco \\
      --algorithm_options.compressor=sign --algorithm_options.gamma=0.2 --tol=1e-2
  jaxgossip topology-sweep --train --topologies=ring,exponential,complete --dataset=digits \\
      --num_nodes=16 --model=mlp --num_rounds=200 --seeds=2
"""



@dataclasses.dataclass(frozen=True)
class TopologySweepOptions:
    """The graphs and the consensus mode's options."""

    topologies: list[str] = dataclasses.field(default_factory=list)
    sizes: list[int] = dataclasses.field(default_factory=lambda: [8, 16, 64])
    num_steps: int = 200
    dim: int = 64
    tol: float = 1e-4
    graph_seed: int = 0
    seeds: int | list[int] = 3


CONSENSUS_ONLY = ("sizes", "num_steps", "dim", "tol", "graph_seed")
BOTH_MODES = ("algorithm", "algorithm_options", "time")

FIELD_HELP = {
    "topologies": "graph specs (required), e.g. ring,torus,exponential,erdos_renyi:0.3: ring, directed_ring, torus, "
    "torus:ROWSxCOLS, hypercube, exponential, one_peer_exponential, complete, star, erdos_renyi:P, random_directed:P, "
    "random_matching, random_out:S; failures drawn every round: SPEC+drop:P, SPEC+nodedrop:Q",
    "sizes": "node counts of the consensus mode, e.g. 8,16,64",
    "num_steps": "rounds of the consensus mode (>= 1)",
    "dim": "values per node in the consensus mode (>= 1)",
    "tol": "target relative error of the consensus mode (> 0)",
    "graph_seed": "seed of random graphs (erdos_renyi, random_directed) in the consensus mode (>= 0)",
    "seeds": "a count S (seeds 0 .. S-1) or a list such as 0,5",
}


def command() -> Command:
    help_text = {**{k: f"--train: {v}" for k, v in train_field_help().items()}, **FIELD_HELP}
    help_text["algorithm"] = "both modes: " + train_field_help()["algorithm"]
    help_text["algorithm_options"] = "both modes: " + train_field_help()["algorithm_options"]
    return Command(
        name="topology-sweep",
        description=_TOPOLOGY_SWEEP_HELP.split("\n\n")[0].replace("\n", " "),
        classes=[
            (TopologySweepOptions, "graphs, seeds and the consensus mode"),
            (TrainConfig, "training mode (--train); --algorithm and --algorithm_options in both modes"),
        ],
        flags={
            "print-config": common.PROGRESS_FLAG["print-config"],
            "train": "training mode (see above); default: consensus mode",
            "no-stack": "one compiled program per graph (for comparison)",
        },
        extra={
            "output": [("out", typing.Optional[str], None, "output folder (default runs/topology_sweep[_train])")],
            "cost model (jaxgossip.sim.cost; reported next to the bits)": common.cost_options(training=True),
        },
        field_help=help_text,
        epilog=_TOPOLOGY_SWEEP_HELP.split("\n\n", 1)[1] + "\n" + common.algorithm_epilog(),
    )


def run(argv: list[str]) -> int:
    return run_command(command(), argv, _topology_sweep)


def _topology_sweep(ctx: Invocation) -> int:
    parsed = ctx.parsed
    options = parsed.build(TopologySweepOptions)
    if not options.topologies:
        raise UsageError("--topologies is required, e.g. --topologies=ring,torus,erdos_renyi:0.3")
    if "topology" in parsed.given:
        raise UsageError("--topology is one graph; a topology sweep takes --topologies=SPEC,SPEC,...")
    specs = _topology_specs(",".join(options.topologies))
    seeds = seed_list(options.seeds)
    # Both modes take the links from --time.* (TrainConfig.time); the consensus mode computes nothing.
    cost = common.cost_model(parsed.values, parsed.build(TrainConfig))
    config_keys = {f.name for f in dataclasses.fields(TrainConfig)} - set(BOTH_MODES)
    if parsed.flags["train"]:
        wrong = sorted(set(CONSENSUS_ONLY) & parsed.given)
        if wrong:
            raise UsageError(
                f"--{wrong[0]} is an option of the consensus mode; with --train the graphs have --num_nodes nodes, "
                "run --num_rounds rounds and random graphs use the config's data_seed"
            )
        return _training(ctx, options, specs, seeds, cost)
    wrong = sorted(config_keys & parsed.given)
    if wrong:
        raise UsageError(
            f"--{wrong[0]} is not an option of the consensus mode (it takes --algorithm, --algorithm_options.*, "
            f"{', '.join('--' + o for o in CONSENSUS_ONLY)}); training config keys need --train"
        )
    return _consensus(ctx, options, specs, seeds, cost)


def _consensus(ctx: Invocation, options, specs, seeds, cost) -> int:
    from jaxgossip.engine import sweeps
    from jaxgossip.run import plots
    from jaxgossip.run.validate import check_algorithm, gamma_warning

    parsed = ctx.parsed
    algorithm, alg_options = parsed.values["algorithm"], dict(parsed.values["algorithm_options"])
    for field in ("num_steps", "dim"):
        if getattr(options, field) < 1:
            raise UsageError(f"--{field}={getattr(options, field)} must be an int >= 1")
    if options.graph_seed < 0:
        raise UsageError(f"--graph_seed={options.graph_seed} must be an int >= 0")
    sizes = _sizes(",".join(str(s) for s in options.sizes))
    tol = float(options.tol)
    if not math.isfinite(tol) or tol <= 0:
        raise UsageError(f"--tol={options.tol} must be a finite number > 0")
    graphs, graph_specs, notes = _build_graphs(specs, sizes, options.graph_seed)
    for topo in graphs:  # unknown algorithm or options, or a graph it cannot run on: fail before compiling
        check_algorithm(algorithm, alg_options, topo)
        message = gamma_warning(algorithm, alg_options, topo)
        if message:
            common.warn("topology-sweep", message)
    resolved = {**dataclasses.asdict(options), "seeds": seeds, "algorithm": algorithm, "algorithm_options": alg_options}
    if ctx.print_config(resolved):
        return 0
    out = ctx.take_out(os.path.join("runs", "topology_sweep"))
    no_stack = parsed.flags["no_stack"]
    start = time.perf_counter()
    result = sweeps.sweep_topologies(
        algorithm, graphs, dim=options.dim, num_steps=options.num_steps, seeds=seeds, options=alg_options,
        stack=not no_stack, node_bits=True,
    )
    wall = time.perf_counter() - start
    rows = sweeps.topology_rows(result, tol=tol)
    for g, row in enumerate(rows):
        row["spec"] = graph_specs[g]
        row.update(
            common.consensus_graph_cost(
                cost, algorithm, alg_options, graphs[g], result.node_bits[g], result.error[g], tol
            )
        )
        error = np.asarray(result.error[g], np.float64)
        where = consensus_diverged_at(error)  # NaN/inf, or 1e3x its first value, in any seed
        row["diverged_at_round"] = where
        row["status"] = "ok" if where is None else f"diverged at round {where}"
        if where is not None:
            for key in ("final_error", "final_error_std", "rounds_to_tol", "MB_to_tol", "comm_s_to_tol"):
                row[key] = None
            message = f"{row['name']} diverged at round {where} (error NaN/inf or blow-up); the others are kept"
            common.warn("topology-sweep", message)
    cost_columns = common.cost_columns(cost, training=False)
    at = [c[0] for c in cost_columns].index("comm_s") + 1
    cost_columns.insert(at, ("comm_s_to_tol", "comm s to tol", ".4g"))
    at = [c[0] for c in _TOPOLOGY_COLUMNS].index("MB_per_node") + 1
    columns = _TOPOLOGY_COLUMNS[:at] + cost_columns + _TOPOLOGY_COLUMNS[at:] + [("status", "status", "")]
    title = (
        f"{algorithm} {alg_options or ''} consensus".replace("  ", " ")
        + f", D={options.dim}, {options.num_steps} rounds, {len(seeds)} seeds"
    )
    summary = _compile_summary(len(graphs), len(seeds), len(result.groups), wall, not no_stack, algorithm)
    print(plots.format_table(rows, columns))
    print(summary)
    os.makedirs(out, exist_ok=True)
    plot = plots.plot_topology_sweep(rows, os.path.join(out, "topology_sweep.png"), title=title, tol=tol)
    payload = {
        "mode": "consensus",
        "algorithm": algorithm,
        "options": alg_options,
        "topologies": specs,
        "sizes": sizes,
        "seeds": seeds,
        "num_steps": options.num_steps,
        "dim": options.dim,
        "tol": tol,
        "graph_seed": options.graph_seed,
        "stack": not no_stack,
        "groups": result.groups,
        "group_seconds": result.group_seconds,
        "wall_s": wall,
        "rows": rows,
    }
    _write(out, ctx.argv, cost, title, summary, notes, rows, columns, payload)
    print(f"wrote {out}/table.md, results.json and {os.path.basename(plot)}")
    return 0


def _training(ctx: Invocation, options, specs, seeds, cost) -> int:
    from jaxgossip import topology
    from jaxgossip.run import plots, training_sweeps
    from jaxgossip.run.groups import byzantine_args, check_byzantine
    from jaxgossip.run.resolve import check_run, resolve
    from jaxgossip.run.validate import check_algorithm

    parsed = ctx.parsed
    checked = check_run(parsed.build(TrainConfig))
    config = checked.config
    check_sync_only(config, "topology-sweep")
    if config.final_merge is not None:
        raise UsageError(f"--final_merge={config.final_merge!r}: a topology sweep reports training without a merge")
    if config.tensorboard:
        raise UsageError("--tensorboard is written by train, demo and sweep; not by topology-sweep")
    data_seed = config.resolved_data_seed
    graphs, graph_specs, notes = _build_graphs(specs, [config.num_nodes], data_seed)
    per_graph = []  # each graph's algorithm (its state's memory is reported)
    for topo in graphs:
        alg = check_algorithm(config.algorithm, dict(config.algorithm_options), topo, trainer_defaults=True)
        attacked = check_byzantine(config, topo)  # the attackers must leave every graph's honest nodes connected
        per_graph.append(alg if attacked is None else attacked)
    resolved = {"topologies": specs, "seeds": seeds, **config.to_dict()}
    if ctx.print_config(resolved):
        return 0
    resolved_run = resolve(checked)  # the data, model and optimizer every graph shares
    out = ctx.take_out(os.path.join("runs", "topology_sweep_train"))
    no_stack = parsed.flags["no_stack"]
    start = time.perf_counter()
    metrics, groups = training_sweeps.sweep_topologies_training(resolved_run, graphs, seeds, stack=not no_stack)
    wall = time.perf_counter() - start
    group_of = {i: g for g, members in enumerate(groups) for i in members}
    need_flops = bool(cost.joules_per_flop)
    flops, rows = None, []
    for g, topo in enumerate(graphs):
        # FLOPs of a local step do not depend on the graph; memory does (the algorithm's state).
        step_flops, memory = common.step_flops_and_memory(
            resolved_run, need_flops and flops is None, algorithm=per_graph[g]
        )
        flops = step_flops if flops is None else flops
        m = metrics[g]
        rounds, bits = np.asarray(m.round), np.asarray(m.bits, dtype=np.float64)  # [S, M], [S, M, N]
        sim_time, comm_time = np.asarray(m.sim_time), np.asarray(m.comm_time)  # [S, M]
        acc = np.asarray(m.test_acc, dtype=np.float64)[:, -1]
        row = {
            "name": topo.name,
            "spec": graph_specs[g],
            "N": topo.num_nodes,
            "spectral_gap": _gap(topo),
            "mean_degree": topology.mean_out_degree(topo),
            "test_acc": float(acc.mean()),
            "test_acc_std": float(acc.std()),
            "test_acc_per_seed": acc.tolist(),
            "test_loss": float(np.asarray(m.test_loss)[:, -1].mean()),
            "consensus": float(np.asarray(m.consensus)[:, -1].mean()),
            "MB_per_node": float(bits[:, -1].mean() / 8e6),
            "group": group_of[g],
            "group_size": len(groups[group_of[g]]),
        }
        per_seed = [
            common.training_cost(
                cost, config, topo, rounds[s], bits[s], sim_time[s], comm_time[s], flops=flops, memory=memory
            )[-1]
            for s in range(len(seeds))
        ]
        row.update({key: float(np.mean([c[key] for c in per_seed])) for key in per_seed[0]})
        watched = np.stack([np.asarray(getattr(m, k), np.float64) for k in ("train_loss", "test_loss", "consensus")])
        where = common.diverged_at(watched, rounds[0])
        blowups = [
            check_divergence(
                rounds[s], train_loss=np.asarray(m.train_loss)[s], model_sq_norm=np.asarray(m.model_sq_norm)[s],
                consensus=np.asarray(m.consensus)[s],
            )
            for s in range(len(seeds))
        ]  # fmt: skip
        where = min([b.round for b in blowups if b is not None] + ([] if where is None else [where]), default=None)
        row["diverged_at_round"] = where
        row["status"] = "ok" if where is None else f"diverged at round {where}"
        if where is not None:
            for key in ("test_acc", "test_acc_std", "test_loss", "consensus"):
                row[key] = None
            message = f"{topo.name} diverged at round {where} (NaN/inf or blow-up); the others are kept"
            common.warn("topology-sweep", message)
        rows.append(row)
    columns = common.with_cost(_TOPOLOGY_TRAIN_COLUMNS, cost, training=True) + [("status", "status", "")]
    title = (
        f"{config.algorithm} training, {config.dataset}, {config.model}, N={config.num_nodes}, "
        f"{config.num_rounds} rounds, {len(seeds)} seeds"
    )
    unstacked = "the Byzantine wrapper builds host tables per graph" if byzantine_args(config) else None
    summary = _compile_summary(
        len(graphs), len(seeds), len(groups), wall, not no_stack, config.algorithm, unstacked=unstacked
    )
    print(plots.format_table(rows, columns))
    print(summary)
    os.makedirs(out, exist_ok=True)
    plots.plot_topology_training(rows, os.path.join(out, "accuracy_vs_gap.png"), title=title)
    payload = {
        "mode": "train",
        "config": config.to_dict(),
        "data": resolved_run.dataset.source,
        "topologies": specs,
        "seeds": seeds,
        "stack": not no_stack,
        "groups": groups,
        "wall_s": wall,
        "rows": rows,
    }
    _write(out, ctx.argv, cost, title, summary, notes, rows, columns, payload)
    print(f"wrote {out}/table.md, results.json and accuracy_vs_gap.png")
    return 0


def _write(out, argv, cost, title, summary, notes, rows, columns, payload) -> None:
    from jaxgossip.run import plots

    command_line = "jaxgossip topology-sweep " + " ".join(argv)
    # The Markdown table leaves out the compile bookkeeping (kept in results.json) to stay readable.
    shown = [c for c in columns if c[0] not in ("group_size", "spec")]
    common.write_markdown(
        os.path.join(out, "table.md"),
        [f"Command: `{command_line}`", f"{title}. {summary}", "\n".join(f"- {n}" for n in notes),
         plots.format_table(rows, shown, markdown=True), plots.table_legend(shown)],
    )
    common.write_json(
        os.path.join(out, "results.json"),
        {"command": command_line, "cost_model": cost.to_dict(), "skipped": notes, **payload},
    )


_TOPOLOGY_COLUMNS = [
    ("name", "graph", ""),
    ("N", "N", "d"),
    ("spectral_gap", "gap", ".4f"),
    ("effective_neighbors", "eff. neighbours", ".1f"),
    ("mean_degree", "mean deg", ".1f"),
    ("final_error", "final rel. error", ".2e"),
    ("final_error_std", "+-", ".1e"),
    ("rounds_to_tol", "rounds to tol", ".1f"),
    ("MB_to_tol", "MB/node to tol", ".4g"),
    ("MB_per_node", "MB/node", ".4g"),
    ("group", "compile group", "d"),
    ("group_size", "graphs in group", "d"),
]

_TOPOLOGY_TRAIN_COLUMNS = [
    ("name", "graph", ""),
    ("N", "N", "d"),
    ("spectral_gap", "gap", ".4f"),
    ("mean_degree", "mean deg", ".1f"),
    ("test_acc", "acc(avg)", ".4f"),
    ("test_acc_std", "+-", ".4f"),
    ("consensus", "consensus", ".3g"),
    ("MB_per_node", "MB/node", ".2f"),
    ("group", "compile group", "d"),
    ("group_size", "graphs in group", "d"),
]


def _topology_specs(text: str) -> list[str]:
    """``--topologies`` as a list of specs; an unknown family name or a bad argument (checked by
    :func:`jaxgossip.topology.check_spec`, no graph built) is a ValueError naming the spec."""
    from jaxgossip import topology

    specs = [s.strip() for s in text.split(",") if s.strip()]
    if not specs:
        raise ValueError("--topologies is empty; give specs such as ring,torus,erdos_renyi:0.3")
    known = list(topology.FAMILIES)
    for spec in specs:
        if spec.partition("+")[0].partition(":")[0] not in known:
            raise ValueError(
                f"--topologies: unknown topology spec {spec!r}; known families: {', '.join(known)} "
                "(with an argument: erdos_renyi:P, random_directed:P, torus:ROWSxCOLS, random_out:S; failures: "
                "SPEC+drop:P, SPEC+nodedrop:Q)"
            )
        try:  # the grammar and ranges of the arguments, before any graph is built
            topology.check_spec(spec)
        except (ValueError, TypeError) as err:
            raise ValueError(f"--topologies: {err}") from None
    return specs


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--sizes={text!r} must be comma-separated node counts, e.g. 8,16,64") from None
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--sizes={text!r} must hold node counts >= 1")
    return sizes


def _build_graphs(specs: list[str], sizes: list[int], seed: int) -> tuple[list, list[str], list[str]]:
    """Graphs of every size x spec (size-major), their specs, and a note per skipped combination."""
    from jaxgossip import topology

    graphs, graph_specs, notes = [], [], []
    failures: dict[str, list[str]] = {spec: [] for spec in specs}
    for n in sizes:
        for spec in specs:
            try:
                graphs.append(topology.make(spec, n, seed=seed))
                graph_specs.append(spec)
            except (ValueError, TypeError) as err:
                notes.append(f"note: skipped {spec} at N={n}: {err}")
                failures[spec].append(str(err))
    if not graphs:
        raise ValueError(f"no graph of --topologies={','.join(specs)} could be built at N in {sizes}")
    for spec, errors in failures.items():  # a spec no size can build is a bad spec, not a skip
        if len(errors) == len(sizes):
            raise UsageError(f"--topologies: {spec!r} cannot be built at any of the sizes {sizes}: {errors[0]}")
    for note in notes:
        print(note)
    return graphs, graph_specs, notes


def _gap(topo) -> float:
    from jaxgossip.topology import spectral_gap

    try:
        return float(spectral_gap(topo))
    except ValueError:  # column-stochastic only: no doubly stochastic gap
        return float("nan")


def _compile_summary(graphs: int, seeds: int, programs: int, wall: float, stack: bool, algorithm: str,
                     unstacked: str | None = None) -> str:
    """The line on compiles; ``unstacked``: why every graph runs on its own whatever the algorithm."""
    from jaxgossip import algorithms

    if not stack:
        how = "one per graph (--no-stack)"
    elif unstacked is not None:
        how = f"one per graph: {unstacked}"
    elif not algorithms.resolve(algorithm).graph.stackable:
        how = f"one per graph: {algorithm} builds host tables per graph"
    else:
        how = "one per group of same-shape graphs"
    programs_text = "1 compiled program" if programs == 1 else f"{programs} compiled programs"
    return f"{graphs} graphs x {seeds} seeds in {programs_text}, {how}: {wall:.1f} s"
