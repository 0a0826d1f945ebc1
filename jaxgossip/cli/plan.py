"""``jaxgossip plan``: the memory of a training run's compiled chunk (XLA's memory analysis of the CPU
compile), per node and in total, and the largest node count that fits a memory size."""

from __future__ import annotations

import dataclasses
import math

from jaxgossip.cli import common
from jaxgossip.cli.skeleton import Invocation, run_command
from jaxgossip.run.config import TrainConfig, train_field_help
from jaxgossip.run.parsing import Command, UsageError
from jaxgossip.run.validate import check_sync_only

__all__ = ["PlanOptions", "command", "run", "format_plan"]

_HELP = """\
Plan the memory of a training run before running it. The run of the training config (the fields
`jaxgossip train` takes: --model, --model_options.*, --algorithm, --dataset, --batch_size,
--optimizer, ...) is built as the trainer builds it, and its compiled chunk (--evals_per_chunk
intervals of --eval_every rounds, evaluation included) is lowered on abstract shapes
(jax.eval_shape: nothing is allocated, also at N = 16384) and compiled. The breakdown counts the
chunk's arguments from the state's leaf shapes (parameters, optimizer state, algorithm state such as
public copies or per-edge buffers, ...; per node and in total, naming the leaves that are not
per-node); XLA's memory analysis gives the outputs and the temporaries (activations, gradients);
total = arguments + outputs + temp - aliased, as XLA reports it.

The largest N that fits a memory size: a line through the compiles at --num_nodes and a second
count predicts it; the plan then compiles there and at the neighbouring valid counts until the
compile at N fits and the one at the next valid N does not. Valid counts are those the graph and
the algorithm exist at (hypercube: powers of two, torus: grids) whose partition leaves every node
at least --batch_size samples. The table covers 16, 24, 40, 80 and 141 GiB (1 GiB = 2^30 bytes)
and --memory if given (16GB = 16e9 bytes, 16GiB = 16 * 2^30 bytes, also MB, MiB, TB, TiB).

The numbers come from the CPU compile of the program built with --platform's choices (node
batching, convolution formulation). A GPU compile can differ (other fusions, cuDNN workspaces,
allocator fragmentation), and JAX takes 75% of a GPU's memory by default
(XLA_PYTHON_CLIENT_MEM_FRACTION): keep a margin.

examples:
  jaxgossip plan --dataset=cifar10 --model=resnet20 --algorithm=choco --num_nodes=16 --memory=80GB
  jaxgossip plan --dataset=digits --model=mlp --algorithm=gossip --topology=hypercube --num_nodes=8
"""


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """What to plan for."""

    memory: str | None = None
    platform: str = "cuda"
    max_nodes: int = 2**20
    fit_nodes: int | None = None


FIELD_HELP = {
    "memory": "a memory size to plan for next to the GPU table, e.g. 16GB (1e9 bytes), 16GiB (2^30 bytes), 800MB",
    "platform": "build the program as for this platform (cuda, rocm, tpu or cpu: node batching and "
    "convolution formulation); it is compiled for the CPU",
    "max_nodes": "the largest node count to consider (>= --num_nodes)",
    "fit_nodes": "the second node count of the line (default: the first valid count >= 2 --num_nodes)",
}

PART_COLUMNS = [
    ("part", "part", ""),
    ("bytes", "bytes", "d"),
    ("size", "", ""),
    ("per_node", "bytes per node", ".1f"),
    ("shared", "not per node (leaves)", ""),
]

FIT_COLUMNS = [
    ("memory", "memory", ""),
    ("num_nodes", "largest N", "d"),
    ("size", "memory at N", ""),
    ("next_nodes", "next valid N", "d"),
    ("next_size", "memory there", ""),
    ("predicted", "line predicts", ".0f"),
    ("limited_by", "limited by", ""),
]


def command() -> Command:
    return Command(
        name="plan",
        description=_HELP.split("\n\n")[0].replace("\n", " "),
        classes=[(PlanOptions, "what to plan for"), (TrainConfig, "training config (as jaxgossip train)")],
        flags={"print-config": common.PROGRESS_FLAG["print-config"]},
        field_help={**train_field_help(), **FIELD_HELP},
        epilog=_HELP.split("\n\n", 1)[1],
    )


def run(argv: list[str]) -> int:
    return run_command(command(), argv, _plan)


def _plan(ctx: Invocation) -> int:
    from jaxgossip.ops import platforms
    from jaxgossip.run.resolve import check_train_config
    from jaxgossip.sim import memory as plan_lib

    parsed = ctx.parsed
    options = parsed.build(PlanOptions)
    config = check_train_config(parsed.build(TrainConfig))
    check_sync_only(config, "plan")
    memories = list(plan_lib.GPU_MEMORY)
    if options.memory is not None:
        try:
            memories.insert(0, (f"--memory={options.memory}", plan_lib.parse_memory(options.memory)))
        except ValueError as err:
            raise UsageError(f"--{err}") from None
    try:
        platform = platforms.check_platform(options.platform)
    except ValueError as err:
        raise UsageError(f"--{err}") from None
    if isinstance(options.max_nodes, bool) or options.max_nodes < config.num_nodes:
        raise UsageError(f"--max_nodes={options.max_nodes} must be an int >= --num_nodes={config.num_nodes}")
    if config.devices != 1:
        raise UsageError(f"--devices={config.devices}: the plan is of one device holding all N nodes (--devices=1)")
    if ctx.print_config({**dataclasses.asdict(options), **config.to_dict()}):
        return 0
    from jaxgossip.run.plan import plan_memory

    result = plan_memory(
        config, tuple(memories), platform=platform, fit_nodes=options.fit_nodes, max_nodes=options.max_nodes
    )
    print(format_plan(result))
    return 0


def format_plan(result) -> str:
    """The plan as text: the breakdown at N, the line, the table of largest N, the caveats."""
    from jaxgossip.run import plots
    from jaxgossip.sim.memory import format_bytes

    m, config, choices = result.measurement, result.config, result.choices
    n = m.num_nodes
    rows = [
        {
            "part": p.name,
            "bytes": p.total,
            "size": format_bytes(p.total),
            "per_node": p.per_node,
            "shared": "; ".join(p.shared_leaves) if len(p.shared_leaves) <= 3 else
            f"{len(p.shared_leaves)} leaves, {p.shared} B (e.g. {p.shared_leaves[0]})",
        }
        for p in m.parts
    ]  # fmt: skip
    stats = m.stats
    for name, value in (
        ("arguments (XLA)", stats.arguments),
        ("outputs (XLA: next state, metrics)", stats.outputs),
        ("temporaries (XLA: activations, gradients)", stats.temp),
        ("aliased (XLA)", -stats.alias),
        ("total (XLA: arguments + outputs + temp - aliased)", stats.total),
        ("generated code (XLA; not in the total)", stats.generated_code),
    ):
        rows.append({"part": name, "bytes": value, "size": format_bytes(value), "per_node": value / n})
    lines = [
        f"memory plan: {config.algorithm} on {config.topology}, model {config.model}, {config.dataset} "
        f"(batch_size={config.batch_size}, {m.samples_per_node} samples per node padded), chunk of {m.rounds} rounds; "
        f"built as for {result.platform} (node_batch={choices.node_batch}, conv_impl={choices.conv_impl}), "
        "compiled for the CPU",
        "",
        f"at N = {n}: {format_bytes(stats.total)} in all ({stats.total} bytes), {format_bytes(m.per_node)} per node "
        "(bytes / N)",
        plots.format_table(rows, PART_COLUMNS),
    ]
    if result.line is not None:
        a, b = result.line
        lines += ["", f"bytes ~ {a:.6g} + {b:.6g} N (line through N = {', '.join(map(str, result.fit_nodes))})"]
    fit_rows = []
    for label, fit in zip(result.labels, result.fits):
        fit_rows.append(
            {
                "memory": label,
                "num_nodes": fit.num_nodes,
                "size": None if fit.bytes is None else format_bytes(fit.bytes),
                "next_nodes": fit.next_nodes,
                "next_size": None if fit.next_bytes is None else format_bytes(fit.next_bytes),
                "predicted": fit.predicted if math.isfinite(fit.predicted) else None,
                "limited_by": fit.limited_by,
            }
        )
    lines += [
        "",
        "largest N that fits (1 GiB = 2^30 bytes; GB = 1e9 bytes); confirmed by compiling at N and at the next "
        "valid N:",
        plots.format_table(fit_rows, FIT_COLUMNS),
        f"valid N: {result.rule}",
        f"compiles: {', '.join(f'N={k}' for k in result.measured)}",
        "",
        "note: these are XLA's numbers for the CPU compile. A GPU compile can differ (other fusions, cuDNN "
        "workspaces, allocator fragmentation), and JAX takes 75% of a GPU's memory by default "
        "(XLA_PYTHON_CLIENT_MEM_FRACTION): keep a margin. Constants of the program (the per-node sample counts, "
        "graph tables) are not counted.",
    ]
    return "\n".join(lines)
