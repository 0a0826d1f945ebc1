"""``jaxgossip design``: mixing weights designed for a graph, compared with the Metropolis,
max-degree and best constant weights of the same graph (or with its own weights); writes the
weights as ``topology.npz`` (read back by ``--topology=file:PATH``), a table, JSON and a plot.

Objectives:

* ``slem`` / ``fdla``: the symmetric weights of least SLEM, exactly
  (:func:`jaxgossip.design.fastest_mixing`; ``fdla`` allows signed weights);
* ``consensus:T``: one weighting per round of the graph's period P (P = 1 for a static graph, a
  T-periodic schedule for a time-varying one), non-negative and doubly stochastic on the graph's
  supports, minimizing the squared consensus error ``||W(T-1) ... W(0) - J||_F^2`` after T rounds
  (:func:`jaxgossip.design.consensus_weights`); with T = P on a schedule it looks for exact
  averaging after one period;
* ``heterogeneity:D``: a graph of in-degree at most D learned from the label proportions of the
  run's data set and partition (:func:`jaxgossip.design.learn_topology`, Le Bars et al. 2023); the
  ``--topology`` graph is the baseline it is compared with.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from jaxgossip.cli import common
from jaxgossip.cli.skeleton import Invocation, run_command
from jaxgossip.run.config import TrainConfig, train_field_help
from jaxgossip.run.parsing import Command, UsageError

__all__ = [
    "CONSENSUS_NOTE",
    "DesignConfig",
    "DesignData",
    "OBJECTIVES",
    "command",
    "run",
    "check_design_config",
    "design_rows",
    "parse_objective",
]

# objective -> (the constraint it designs under, fastest_mixing's nonnegative)
OBJECTIVES = {
    "slem": ("fastest-mixing Markov chain: w >= 0, diag L(w) <= 1", True),
    "fdla": ("fastest distributed linear averaging: signed weights", False),
}
# objectives with an integer argument: name -> (what the argument is, its meaning in the design)
PARAMETRIZED = {
    "consensus": ("T", "non-negative doubly stochastic weights of least consensus error after T rounds"),
    "heterogeneity": ("D", "a graph of in-degree at most D of least neighbourhood heterogeneity"),
}
# The data options of heterogeneity:D, those of `jaxgossip train` (same fields, defaults, help).
_DATA_FIELDS = ("dataset", "data_dir", "raw_dir", "download", "partition", "data_seed")
_TRAIN_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
DesignData = dataclasses.make_dataclass(
    "DesignData",
    [(name, _TRAIN_FIELDS[name].type, dataclasses.field(default=_TRAIN_FIELDS[name].default)) for name in _DATA_FIELDS],
    frozen=True,
)
DesignData.__doc__ = "The data set and partition whose label proportions heterogeneity:D learns from."


@dataclasses.dataclass(frozen=True)
class DesignConfig:
    """A weight design (config file keys or ``--field=value``)."""

    topology: str = "ring"
    num_nodes: int = 8
    objective: str = "slem"
    seed: int = 0
    tol: float = 1e-8
    lam: float = 0.1
    probes: int = 0
    max_steps: int = 500


FIELD_HELP = {
    "topology": "graph spec whose edges get the weights: ring, torus, erdos_renyi:0.3, file:PATH.npz, ... "
    "(static and undirected; its own weights are ignored)",
    "num_nodes": "N, the number of nodes (>= 2)",
    "objective": "slem: the fastest-mixing Markov chain (non-negative weights); fdla: the fastest linear "
    "averaging iteration (signed weights, never slower); consensus:T: one weighting per round of the graph's "
    "period, of least consensus error after T rounds; heterogeneity:D: a graph of in-degree <= D learned from "
    "the label proportions of --dataset and --partition (the --topology graph is the baseline)",
    "seed": "seed of random graph specs and of the partition (>= 0)",
    "tol": "slem/fdla: stop when the SLEM is certified within tol of the optimum; consensus:T: stop when the "
    "relative error falls below tol (> 0)",
    "lam": "heterogeneity:D: the weight of the mixing term next to the heterogeneity (>= 0)",
    "probes": "consensus:T: 0 for the exact error, else that many Gaussian probe columns (matrix-free, large N)",
    "max_steps": "consensus:T: L-BFGS steps at most (>= 1)",
    **{name: train_field_help()[name] for name in _DATA_FIELDS},
}

COLUMNS = [
    ("weights", "weights", ""),
    ("slem", "SLEM", ".6f"),
    ("spectral_gap", "gap", ".6f"),
    ("rounds_1e-6", "rounds to 1e-6", ""),
]


def command() -> Command:
    return Command(
        name="design",
        description="Design the symmetric mixing weights of a graph that minimize the SLEM of W = I - L(w) (the "
        "second-largest eigenvalue magnitude; spectral gap 1 - SLEM), exactly, by a structured barrier method "
        "(jaxgossip.design.fastest_mixing), and compare them with the Metropolis, max-degree and best constant "
        "weights; or (consensus:T) weights of least consensus error after T rounds, static or one per round of a "
        "time-varying graph; or (heterogeneity:D) a sparse graph learned from the nodes' label proportions. "
        "Writes topology.npz (train, sweep, consensus and tune-gamma read it with "
        "--topology=file:DIR/topology.npz), design.json, design.md and design.png under --out.",
        classes=[
            (DesignConfig, "design config (config file keys or --field=value)"),
            (DesignData, "data of heterogeneity:D (as in jaxgossip train)"),
        ],
        flags=dict(common.PROGRESS_FLAG),
        extra={"output": [("out", str | None, None, "output folder (default runs/design)")]},
        field_help=FIELD_HELP,
        epilog="examples:\n  jaxgossip design --topology=erdos_renyi:0.2 --num_nodes=32 --out runs/er32\n"
        "  jaxgossip consensus --topology=file:runs/er32/topology.npz --num_nodes=32 --algorithm=gossip\n"
        "  jaxgossip design --topology=base:1 --num_nodes=6 --objective=consensus:4 --out runs/base6\n"
        "  jaxgossip design --topology=ring --num_nodes=16 --objective=heterogeneity:2 --dataset=digits "
        "--partition=dirichlet:0.1 --out runs/learned16",
    )


def parse_objective(spec: object) -> tuple[str, int | None]:
    """``"slem"`` -> ("slem", None), ``"consensus:8"`` -> ("consensus", 8).

    Raises:
      UsageError: an unknown name, a missing or extra argument, an argument that is not an int >= 1.
    """
    known = ", ".join([*OBJECTIVES, *(f"{name}:{arg}" for name, (arg, _) in PARAMETRIZED.items())])
    if not isinstance(spec, str):
        raise UsageError(f"objective={spec!r} must be a string; known objectives: {known}")
    name, sep, arg = spec.partition(":")
    if name in OBJECTIVES and not sep:
        return name, None
    if name not in PARAMETRIZED:
        raise UsageError(f"objective={spec!r} is unknown; known objectives: {known}")
    letter, meaning = PARAMETRIZED[name]
    try:
        value = int(arg)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"objective={spec!r}: {name} needs {letter}, an int >= 1 ({meaning}), e.g. {name}:4")
    return name, value


def check_design_config(config: DesignConfig, data_options=None):
    """Validates ``config`` (and, for heterogeneity:D, the :class:`DesignData` options) and builds
    its graph (no design yet); returns the topology.

    Raises:
      UsageError: naming the field and the problem.
    """
    from jaxgossip.design import schedule_supports, undirected_edges
    from jaxgossip.run.validate import check_fields, check_topology

    for field, low in (("num_nodes", 2), ("seed", 0), ("probes", 0), ("max_steps", 1)):
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UsageError(f"{field}={value!r} must be an int >= {low}")
    name, arg = parse_objective(config.objective)
    for field, strict in (("tol", True), ("lam", False)):
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise UsageError(f"{field}={value!r} must be a finite number {'>' if strict else '>='} 0")
        if value < 0 or (strict and value == 0):
            raise UsageError(f"{field}={value!r} must be a finite number {'>' if strict else '>='} 0")
    try:
        topo = check_topology(config.topology, config.num_nodes, config.seed)
        if name in OBJECTIVES:
            undirected_edges(topo, "jaxgossip design")
        elif name == "consensus":
            schedule_supports(topo, f"objective={config.objective}")
        elif topo.stochastic:
            raise ValueError("the baseline graph of heterogeneity:D must be fixed, not drawn every round")
    except (ValueError, TypeError) as err:
        raise UsageError(f"topology={config.topology!r}: {err}") from None
    if name == "heterogeneity":
        if arg >= config.num_nodes:
            raise UsageError(
                f"objective={config.objective!r}: the degree bound D={arg} must be below num_nodes={config.num_nodes}"
            )
        try:
            check_fields(_train_config(config, data_options))
        except ValueError as err:
            raise UsageError(str(err)) from None
    return topo


def _train_config(config: DesignConfig, data_options) -> TrainConfig:
    """The training config whose data set and partition a heterogeneity design reads."""
    values = {} if data_options is None else dataclasses.asdict(data_options)
    return TrainConfig(num_nodes=config.num_nodes, seed=config.seed, **values)


def _rounds_to(slem: float, factor: float = 1e-6) -> int | None:
    """Rounds after which the worst start's squared consensus error is below ``factor`` of its
    start: ``ceil(ln(factor) / (2 ln SLEM))`` (None when SLEM >= 1: no contraction)."""
    if slem >= 1.0:
        return None
    if slem <= 0.0:
        return 1
    return math.ceil(math.log(factor) / (2.0 * math.log(slem)))


def design_rows(design) -> list[dict]:
    """One table row per weighting of a :class:`jaxgossip.design.Design`: SLEM, gap, rounds."""
    rows = []
    for label, slem in (
        ("designed", design.slem),
        ("metropolis", design.metropolis_slem),
        ("max-degree", design.max_degree_slem),
        ("best constant", design.best_constant_slem),
    ):
        rounds = _rounds_to(slem)
        rows.append(
            {
                "weights": label,
                "slem": float(slem),
                "spectral_gap": float(1.0 - slem),
                "rounds_1e-6": "never" if rounds is None else rounds,
            }
        )
    return rows


def run(argv: list[str]) -> int:
    return run_command(command(), argv, _design)


def _design(ctx: Invocation) -> int:
    config = ctx.parsed.build(DesignConfig)
    data_options = ctx.parsed.build(DesignData)
    topo = check_design_config(config, data_options)
    name, arg = parse_objective(config.objective)
    resolved = dataclasses.asdict(config)
    if name == "heterogeneity":
        resolved.update(dataclasses.asdict(data_options))
    if ctx.print_config(resolved):
        return 0
    out = ctx.take_out(os.path.join("runs", "design"))
    if name in OBJECTIVES:
        return _design_slem(ctx, config, topo, out)
    hide = ctx.parsed.flags.get("no_progress", False)
    if name == "consensus":
        return _design_consensus(ctx, config, topo, arg, out, hide)
    return _design_heterogeneity(ctx, config, data_options, topo, arg, out)


def _design_slem(ctx: Invocation, config: DesignConfig, topo, out: str) -> int:
    from jaxgossip.design import fastest_mixing
    from jaxgossip.run import plots
    from jaxgossip.run.topology_files import save_topology

    what, nonnegative = OBJECTIVES[config.objective]
    design = fastest_mixing(topo, nonnegative=nonnegative, tol=float(config.tol))
    if not math.isfinite(design.gap_bound):
        ctx.warn("the barrier method stopped before its last centering converged: the SLEM is not certified")
    rows = design_rows(design)
    title = f"{what} on {topo.name}, {len(design.edges)} edges"
    print(title)
    print(plots.format_table(rows, COLUMNS))
    os.makedirs(out, exist_ok=True)
    save_topology(design.topology, os.path.join(out, "topology.npz"))
    common.write_json(
        os.path.join(out, "design.json"),
        {
            "command": "jaxgossip design " + " ".join(ctx.argv),
            "config": dataclasses.asdict(config),
            "topology": topo.name,
            "objective": config.objective,
            "gap_bound": design.gap_bound,
            "rows": rows,
            "edges": design.edges.tolist(),
            "weights": design.weights.tolist(),
            "history": design.history.tolist(),
        },
    )
    common.write_markdown(
        os.path.join(out, "design.md"),
        [
            f"Command: `jaxgossip design {' '.join(ctx.argv)}`",
            f"Design: {title}; SLEM certified within {design.gap_bound:.1e} of the optimum.",
            plots.format_table(rows, COLUMNS, markdown=True),
            "- `SLEM`: the second-largest eigenvalue magnitude of W; `gap`: 1 - SLEM; `rounds to 1e-6`: after "
            "ceil(ln 1e-6 / (2 ln SLEM)) rounds the worst start's squared consensus error is below 1e-6 of "
            "its start.",
        ],
    )
    plots.plot_design(design, os.path.join(out, "design.png"), title=title)
    print(f"wrote {out}/topology.npz, design.json, design.md and design.png")
    return 0


def _design_consensus(ctx: Invocation, config: DesignConfig, topo, rounds: int, out: str, hide: bool) -> int:
    from tqdm.auto import tqdm

    from jaxgossip.design import consensus_weights
    from jaxgossip.run import design_report

    bar = tqdm(total=config.max_steps, desc="design", unit="step", disable=hide, leave=False)

    def progress(step: int, value: float) -> None:
        bar.update(1)
        bar.set_postfix(error=f"{value:.2e}", refresh=False)

    try:
        design = consensus_weights(
            topo,
            rounds=rounds,
            probes=config.probes or None,
            max_steps=config.max_steps,
            tol=float(config.tol),
            seed=None,
            name=f"consensus_weights({topo.name}, R={rounds})",
            progress=progress,
        )
    finally:
        bar.close()
    what = (
        f"{'one static weighting' if topo.period == 1 else f'a {topo.period}-periodic schedule'} of least "
        f"consensus error after {rounds} rounds on {topo.name}"
    )
    weightings = {"designed": design.topology, "given": topo, **design_report.classical_weightings(topo)}
    notes = [CONSENSUS_NOTE.format(t=rounds)] if topo.period == 1 else []
    return _report(
        ctx,
        config,
        out,
        design.topology,
        weightings,
        lambda graph: _schedule_error(graph, rounds),
        design.history,
        f"||W(T-1)...W(0) - J||_F^2 / (N - 1), T = {rounds}",
        what,
        {"error": design.error, "start_error": design.start_error, "rounds": rounds, "probes": design.probes},
        notes,
    )


# What consensus:T on a static graph does not promise (jaxgossip.design.schedule, module docstring).
CONSENSUS_NOTE = (
    "note: consensus:{t} minimizes the consensus error after {t} rounds, not the SLEM: while {t} is short of "
    "the mixing time 1 / (1 - SLEM), or with few probes, the designed SLEM can stay at (or above) the "
    "classical weights' SLEM even where the error after {t} rounds falls; --objective=slem gives the least SLEM."
)


def _schedule_error(graph, rounds: int) -> float:
    from jaxgossip.design import schedule_error

    return schedule_error(graph, rounds) / (graph.num_nodes - 1)


def _design_heterogeneity(ctx: Invocation, config: DesignConfig, data_options, topo, degree: int, out: str) -> int:
    from jaxgossip import data
    from jaxgossip.design import label_proportions, learn_topology, neighbourhood_heterogeneity
    from jaxgossip.run import design_report
    from jaxgossip.run.resolve import load_data

    train = _train_config(config, data_options)
    try:
        dataset = load_data(train)
        labels, classes = data.partition_labels(dataset)
        parts = data.partition(labels, config.num_nodes, train.partition, seed=train.resolved_data_seed)
        node_of = np.zeros(labels.shape[0], dtype=np.int64)
        node_of[np.concatenate(parts)] = np.repeat(np.arange(len(parts)), [len(idx) for idx in parts])
        proportions = label_proportions(labels, node_of, config.num_nodes, classes)
        learned = learn_topology(proportions, degree, lam=float(config.lam), name=f"learned(d={degree})")
    except ValueError as err:
        raise UsageError(f"objective={config.objective!r}: {err}") from None
    what = (
        f"a graph of in-degree <= {degree} learned from the label proportions of {dataset.name}, "
        f"partition {train.partition}"
    )
    weightings = {"designed": learned.topology, "given": topo, **design_report.classical_weightings(topo)}
    return _report(
        ctx,
        config,
        out,
        learned.topology,
        weightings,
        lambda graph: neighbourhood_heterogeneity(graph.matrix(), proportions),
        learned.objective,
        "g(W): heterogeneity + lam x mixing",
        what,
        {"heterogeneity": learned.heterogeneity, "max_in_degree": learned.max_in_degree, "lam": config.lam},
    )


def _report(ctx, config, out, designed, weightings, objective_of, history, history_label, what, extra, notes=()) -> int:
    """Writes topology.npz, design.json, design.md and design.png of a consensus or heterogeneity
    design: one row and one consensus curve per weighting, and ``notes`` under the table."""
    from jaxgossip.run import design_report, plots
    from jaxgossip.run.topology_files import save_topology

    max_rounds = 400
    rows, curves = [], {}
    for label, graph in weightings.items():
        if label == "given" and not graph.is_doubly_stochastic:
            continue  # a push-sum weighting: its error is not a consensus error of these rounds
        curve = design_report.consensus_curve(graph, max_rounds, seed=config.seed)
        curves[label] = curve
        rows.append(design_report.weighting_row(label, graph, objective_of(graph), curve))
    print(what)
    print(plots.format_table(rows, design_report.COLUMNS))
    for note in notes:
        print(note)
    os.makedirs(out, exist_ok=True)
    save_topology(designed, os.path.join(out, "topology.npz"))
    common.write_json(
        os.path.join(out, "design.json"),
        {
            "command": "jaxgossip design " + " ".join(ctx.argv),
            "config": dataclasses.asdict(config),
            "topology": designed.name,
            "objective": config.objective,
            **extra,
            "notes": list(notes),
            "rows": rows,
            "history": np.asarray(history).tolist(),
            "curves": {k: v.tolist() for k, v in curves.items()},
        },
    )
    common.write_markdown(
        os.path.join(out, "design.md"),
        [
            f"Command: `jaxgossip design {' '.join(ctx.argv)}`",
            f"Design: {what}.",
            plots.format_table(rows, design_report.COLUMNS, markdown=True),
            "- `objective`: the design's objective for each weighting; `SLEM / rate`: "
            "||W(P-1)...W(0) - J||_2^(1/P) over the period P (the SLEM of a static symmetric W); `gap`: 1 - rate; "
            "`eff. neighbours`: the effective number of neighbours at decay 0.99 (Vogels et al. 2022); "
            f"`rounds to 1e-6`: the first round at which the squared consensus error, averaged over random starts, "
            f"is below 1e-6 of its start (simulated up to {max_rounds} rounds).",
            *(f"- {note}" for note in notes),
        ],
    )
    title = f"{config.objective} on {config.topology}, N = {config.num_nodes}"
    plots.plot_design_curves(history, history_label, curves, os.path.join(out, "design.png"), title=title)
    print(f"wrote {out}/topology.npz, design.json, design.md and design.png")
    return 0
