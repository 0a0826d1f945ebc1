"""``jaxgossip design``: mixing weights of least SLEM on a graph (the fastest-mixing chain, or the
fastest linear averaging iteration with signed weights), compared with the Metropolis, max-degree
and best constant weights of the same graph; writes the weights as ``topology.npz`` (read back by
``--topology=file:PATH``), a table, JSON and a plot."""

from __future__ import annotations

import dataclasses
import math
import os

from jaxgossip.cli import common
from jaxgossip.cli.skeleton import Invocation, run_command
from jaxgossip.run.parsing import Command, UsageError

__all__ = ["DesignConfig", "OBJECTIVES", "command", "run", "check_design_config", "design_rows"]

# objective -> (the constraint it designs under, fastest_mixing's nonnegative)
OBJECTIVES = {
    "slem": ("fastest-mixing Markov chain: w >= 0, diag L(w) <= 1", True),
    "fdla": ("fastest distributed linear averaging: signed weights", False),
}


@dataclasses.dataclass(frozen=True)
class DesignConfig:
    """A weight design (config file keys or ``--field=value``)."""

    topology: str = "ring"
    num_nodes: int = 8
    objective: str = "slem"
    seed: int = 0
    tol: float = 1e-8


FIELD_HELP = {
    "topology": "graph spec whose edges get the weights: ring, torus, erdos_renyi:0.3, file:PATH.npz, ... "
    "(static and undirected; its own weights are ignored)",
    "num_nodes": "N, the number of nodes (>= 2)",
    "objective": "slem: the fastest-mixing Markov chain (non-negative weights); fdla: the fastest linear "
    "averaging iteration (signed weights, never slower)",
    "seed": "seed of random graph specs (>= 0)",
    "tol": "stop when the designed SLEM is certified within tol of the optimum (> 0)",
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
        "weights. Writes topology.npz (train, sweep, consensus and tune-gamma read it with "
        "--topology=file:DIR/topology.npz), design.json, design.md and design.png under --out.",
        classes=[(DesignConfig, "design config (config file keys or --field=value)")],
        flags={k: v for k, v in common.PROGRESS_FLAG.items() if k == "print-config"},
        extra={"output": [("out", str | None, None, "output folder (default runs/design)")]},
        field_help=FIELD_HELP,
        epilog="examples:\n  jaxgossip design --topology=erdos_renyi:0.2 --num_nodes=32 --out runs/er32\n"
        "  jaxgossip consensus --topology=file:runs/er32/topology.npz --num_nodes=32 --algorithm=gossip",
    )


def check_design_config(config: DesignConfig):
    """Validates ``config`` and builds its graph (no design yet); returns the topology.

    Raises:
      UsageError: naming the field and the problem.
    """
    from jaxgossip.design import undirected_edges
    from jaxgossip.run.validate import check_topology

    for field, low in (("num_nodes", 2), ("seed", 0)):
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UsageError(f"{field}={value!r} must be an int >= {low}")
    if config.objective not in OBJECTIVES:
        raise UsageError(f"objective={config.objective!r} is unknown; known objectives: {', '.join(OBJECTIVES)}")
    tol = config.tol
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not (math.isfinite(tol) and tol > 0):
        raise UsageError(f"tol={tol!r} must be a finite number > 0")
    try:
        topo = check_topology(config.topology, config.num_nodes, config.seed)
        undirected_edges(topo, "jaxgossip design")
    except (ValueError, TypeError) as err:
        raise UsageError(f"topology={config.topology!r}: {err}") from None
    return topo


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
    topo = check_design_config(config)
    if ctx.print_config(dataclasses.asdict(config)):
        return 0
    out = ctx.take_out(os.path.join("runs", "design"))

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
