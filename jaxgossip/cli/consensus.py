"""``jaxgossip consensus``: communication-only comparison (no training): every node starts from
x0 ~ N(0, 1) and the algorithms average it; error and bits per round, table, JSON and plot."""

from __future__ import annotations

import dataclasses
import os
import time
import typing
from typing import Any

import numpy as np

from jaxgossip.checks import did_you_mean
from jaxgossip.cli import common
from jaxgossip.cli.skeleton import Invocation, run_command
from jaxgossip.run.parsing import Command, UsageError
from jaxgossip.run.watchdog import consensus_diverged_at

__all__ = ["ConsensusRun", "ConsensusConfig", "command", "run", "check_consensus_config"]


@dataclasses.dataclass(frozen=True)
class ConsensusRun:
    """One compared run: a name, an algorithm with its options, and optionally its own graph."""

    name: str
    algorithm: str
    topology: str | None = None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)


def _default_runs() -> list[dict[str, Any]]:
    return [
        {"name": "gossip", "algorithm": "gossip", "options": {"gamma": 1.0}},
        {"name": "allreduce", "algorithm": "allreduce"},
    ]


def _run(i: int, value: Any) -> ConsensusRun:
    """Entry ``i`` of ``runs`` as a :class:`ConsensusRun` (unknown or missing keys refused)."""
    if isinstance(value, ConsensusRun):
        return value
    fields = [f.name for f in dataclasses.fields(ConsensusRun)]
    if not isinstance(value, dict):
        raise UsageError(f"runs[{i}]={value!r} must be a mapping with keys {', '.join(fields)}")
    for key in value:
        if key not in fields:
            raise UsageError(f"runs[{i}]: unknown key {key!r}{did_you_mean(key, fields)}; known: {', '.join(fields)}")
    for key in ("name", "algorithm"):
        if not isinstance(value.get(key), str) or not value.get(key):
            raise UsageError(f"runs[{i}] needs a {key} (a string)")
    if not isinstance(value.get("options", {}), dict):
        raise UsageError(f"runs[{i}].options={value['options']!r} must be a mapping of option -> value")
    return ConsensusRun(**value)


@dataclasses.dataclass(frozen=True)
class ConsensusConfig:
    """A consensus comparison (config file keys or ``--field=value``)."""

    num_nodes: int = 8
    topology: str = "ring"
    shape: tuple[int, ...] = (100, 100)
    num_steps: int = 500
    seed: int = 0
    algorithm: str | None = None
    algorithm_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    runs: list[dict[str, Any]] = dataclasses.field(default_factory=_default_runs)


FIELD_HELP = {
    "num_nodes": "N, the number of nodes (>= 1)",
    "topology": "graph spec of every run without its own: ring, torus, torus:ROWSxCOLS, hypercube, exponential, "
    "one_peer_exponential, complete, star, erdos_renyi:P, random_directed:P, directed_ring, random_matching, "
    "random_out:S (drawn every round); failures drawn every round: SPEC+drop:P and/or SPEC+nodedrop:Q",
    "shape": "shape of each node's value x_i, e.g. 1000 or 100,100",
    "num_steps": "communication rounds R (>= 1)",
    "seed": "seed of x0, random graphs and compression randomness (>= 0)",
    "algorithm": "run this one algorithm (with --algorithm_options) instead of --runs",
    "algorithm_options": "hyperparameters of --algorithm, e.g. --algorithm_options.gamma=0.5",
    "runs": "the compared runs (default: gossip and allreduce), each {name, algorithm, topology, options}; "
    "in a config file a list of mappings, on the command line JSON",
}


def command() -> Command:
    return Command(
        name="consensus",
        description="Communication-only comparison: node i starts from x0_i ~ N(0, 1) of --shape and every run "
        "averages it for --num_steps rounds. Reports the final consensus error (1/N) sum_i ||x_i - mean(x0)||^2, "
        "MB sent and the cost model's communication time; a run whose error turns NaN/inf is reported as "
        "diverged. Writes consensus.json, consensus.md and consensus.png under --out.",
        classes=[(ConsensusConfig, "consensus config (config file keys or --field=value)")],
        flags=dict(common.PROGRESS_FLAG),
        extra={
            "output": [("out", typing.Optional[str], None, "output folder (default runs/consensus)")],
            "cost model (jaxgossip.sim.cost; reported next to the bits)": common.cost_options(),
        },
        field_help=FIELD_HELP,
        epilog=common.algorithm_epilog()
        + "\n\nexamples:\n  jaxgossip consensus --algorithm=choco --algorithm_options.compressor=sign "
        "--algorithm_options.gamma=0.2 --num_steps=1000\n"
        "  jaxgossip consensus --config consensus_ring.yaml",
    )


def check_consensus_config(config: ConsensusConfig) -> tuple[list[ConsensusRun], list, list[str]]:
    """Validates ``config``; returns its runs, their topologies and gamma warnings.

    Raises:
      ValueError: naming the field and the fix.
    """
    from jaxgossip.run.validate import check_algorithm, check_topology, gamma_warning

    for field, low in (("num_nodes", 1), ("num_steps", 1), ("seed", 0)):
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UsageError(f"{field}={value!r} must be an int >= {low}")
    shape = tuple(config.shape)
    if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape):
        raise UsageError(f"shape={list(shape)} must be one or more sizes >= 1, e.g. 1000 or 100,100")
    if config.algorithm is not None:
        runs = [ConsensusRun(config.algorithm, config.algorithm, None, dict(config.algorithm_options))]
    else:
        if config.algorithm_options:
            raise UsageError("algorithm_options needs --algorithm (or give options per run in --runs)")
        runs = [_run(i, r) for i, r in enumerate(config.runs)]
    if not runs:
        raise UsageError("runs is empty; give --algorithm=NAME or at least one run")
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise UsageError(f"runs: names must be unique, got {names}")
    topologies, warnings = [], []
    for i, r in enumerate(runs):
        where = f"runs[{i}] ({r.name})" if config.algorithm is None else "algorithm"
        try:
            topo = check_topology(r.topology or config.topology, config.num_nodes, config.seed,
                                  field="topology" if r.topology is None else f"runs[{i}].topology")
            check_algorithm(r.algorithm, dict(r.options), topo)
        except ValueError as err:
            raise UsageError(f"{where}: {err}" if config.algorithm is None else str(err)) from None
        message = gamma_warning(r.algorithm, dict(r.options), topo)
        if message:
            warnings.append(f"{r.name}: {message}")
        topologies.append(topo)
    return runs, topologies, warnings


def run(argv: list[str]) -> int:
    return run_command(command(), argv, _consensus)


def _consensus(ctx: Invocation) -> int:
    parsed, argv = ctx.parsed, ctx.argv
    config = parsed.build(ConsensusConfig)
    runs, topologies, warnings = check_consensus_config(config)
    for message in warnings:
        common.warn("consensus", message)
    cost = common.cost_model(parsed.values, seed=config.seed)
    resolved = {**dataclasses.asdict(config), "runs": [dataclasses.asdict(r) for r in runs]}
    if config.algorithm is None:
        resolved.pop("algorithm_options")
    if ctx.print_config(resolved):
        return 0
    out = ctx.take_out(os.path.join("runs", "consensus"))

    import jax
    from tqdm.auto import tqdm

    import jaxgossip as jg
    from jaxgossip.run import plots
    from jaxgossip.run.watchdog import check_consensus

    n, steps = config.num_nodes, config.num_steps
    x0 = {"x": jax.random.normal(jax.random.key(config.seed), (n, *config.shape))}
    curves, rows = {}, []
    hide = parsed.flags["no_progress"]
    bar = tqdm(list(zip(runs, topologies)), desc="consensus", unit="run", disable=hide, leave=False)
    for r, topo in bar:
        alg = jg.algorithms.make(r.algorithm, topo, **r.options)
        start = time.perf_counter()
        result = jg.run_consensus(alg, x0, steps, jax.random.key(1))
        node_bits = np.asarray(result.node_bits, dtype=np.float64)
        error = np.asarray(result.error, dtype=np.float64)
        wall = time.perf_counter() - start
        where = consensus_diverged_at(error)  # NaN/inf, or 1e3x its first value
        # The node mean of x0 ~ N(0, 1) is close to 0, so only the growth rule means something here.
        alarm = check_consensus(error)
        shown = error if where is None else error[:where]
        label = r.name if where is None else f"{r.name} (diverged at round {where})"
        curves[label] = (shown, np.asarray(result.bits)[: shown.size])
        report = common.simulate_bits(
            cost, node_bits, topo, allreduce=common.priced_as_allreduce(r.algorithm),
            exchanges=common.exchanges_per_round(r.algorithm, r.options),
        )
        row = {
            "name": r.name,
            "topology": topo.name,
            "final_error": float(error[-1]) if where is None else None,
            "MB_total": float(np.asarray(result.bits)[-1] / 8e6),
            "comm_s_per_round": float(report.comm_time.mean()),
            "comm_s": float(report.comm_time.sum()),
            "diverged_at_round": where,
            "status": "ok" if where is None else f"diverged at round {where}",
            "watchdog": common.watchdog_cell(alarm),
        }
        if cost.energy:
            row["energy_J_per_node"] = float(report.total_energy.mean())
        rows.append(dict(row, time=wall))
        if where is not None:
            message = f"{r.name} diverged at round {where} (error NaN/inf or blow-up); the others are kept"
            common.warn("consensus", message)
        elif alarm is not None:
            common.warn("consensus", f"{r.name}: {alarm.message}")
    title = f"{n} nodes, x of shape {list(config.shape)}, {steps} rounds"
    os.makedirs(out, exist_ok=True)
    plots.plot_consensus(curves, os.path.join(out, "consensus.png"), title=title)
    common.write_json(
        os.path.join(out, "consensus.json"),
        {
            "command": "jaxgossip consensus " + " ".join(argv),
            "config": {**dataclasses.asdict(config), "runs": [dataclasses.asdict(r) for r in runs]},
            "cost_model": cost.to_dict(),
            "rows": rows,
            "error": {r["name"]: curves[c][0].tolist() for r, c in zip(rows, curves)},
        },
    )
    columns = [
        ("name", "run", ""),
        ("topology", "topology", ""),
        ("final_error", "final error", ".3e"),
        ("MB_total", "MB (all nodes)", ".2f"),
        ("time", "time(s)", ".2f"),
    ]
    columns = common.with_cost(columns, cost, training=False) + [("status", "status", ""), ("watchdog", "watchdog", "")]
    print(plots.format_table(rows, columns))
    common.write_markdown(
        os.path.join(out, "consensus.md"),
        [f"Command: `jaxgossip consensus {' '.join(argv)}`", f"Consensus: {title}.",
         plots.format_table(rows, columns, markdown=True), plots.table_legend(columns)],
    )
    print(f"wrote {out}/consensus.json, consensus.md and consensus.png")
    return 0
