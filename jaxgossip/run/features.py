"""The catalogue of what a run can carry: every feature of a training run and every command that
runs training, as command-line options (edge module, no I/O).

It is the one list that the end-to-end matrix (``tests/project/test_e2e_matrix.py``) crosses with the
algorithm registry: every registered algorithm, on a graph its metadata accepts (:func:`graph_for`),
with every :data:`FEATURES` entry, through every :data:`COMMANDS` entry. A feature added here, or an
algorithm registered, is enrolled in the matrix without editing the test; a :class:`TrainConfig` field
that is neither named by a feature nor listed in :data:`PLAIN_FIELDS` fails that test, so a new
option cannot join the configuration without joining the matrix (or saying why it needs no run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from jaxgossip.types import AlgorithmInfo

__all__ = ["Feature", "FEATURES", "COMMANDS", "PLAIN_FIELDS", "graph_for", "graphs_of", "variants"]


class Feature(NamedTuple):
    """A feature of a training run.

    Attributes:
      name: short name (test ids).
      flags: the options that turn it on, ``--field=value`` as on the command line.
      what: one line on what the run then does differently.
      static_graph: it needs a graph with period T = 1 (:func:`graph_for` picks one).
      forms: for a feature with one variant per name that the algorithm's metadata gives
        (``info -> names``: its asynchronous forms, the outer message widths it can be priced at):
        its flags are repeated once per name, ``{form}`` replaced by it; no name, no variant.
      graphs: for a feature of the graph, the graph specs it runs on, from the algorithm's graph
        spec (:func:`graph_for`): a run takes the first, ``topology-sweep`` all of them (so they
        share one program); None: the algorithm's graph.
    """

    name: str
    flags: tuple[str, ...]
    what: str
    static_graph: bool = False
    forms: Callable[[AlgorithmInfo], tuple[str, ...]] | None = None
    graphs: Callable[[str], tuple[str, ...]] | None = None


FEATURES: tuple[Feature, ...] = (
    Feature("plain", (), "the run with the catalogue's base options only"),
    Feature(
        "async",
        ("--execution=async", "--async_form={form}", "--time.compute=stragglers:0.01,0.25,4"),
        "asynchronous execution, each node on its own simulated clock, in every asynchronous form the algorithm has",
        static_graph=True,
        forms=lambda info: info.execution.form_names,
    ),
    Feature(
        "async_churn",
        (
            "--execution=async",
            "--async_form={form}",
            "--time.compute=stragglers:0.01,0.25,4",
            "--time.availability=markov:0.2,0.5",
        ),
        "asynchronous execution under churn: offline nodes lose their steps and are not chosen as partners",
        static_graph=True,
        forms=lambda info: info.execution.form_names,
    ),
    Feature(
        "async_rates",
        (
            "--execution=async",
            "--async_form={form}",
            "--time.compute=stragglers:0.01,0.25,4",
            "--async_rate_compensation=true",
        ),
        "asynchronous steps weighted by each node's expected step time (the forms that are biased to fast nodes)",
        static_graph=True,
        forms=lambda info: tuple(f.name for f in info.execution.asynchronous if _compensable(f)),
    ),
    Feature(
        "byzantine_nodes", ("--byzantine.nodes=1",), "one attacker drawn from the data seed, metrics over honest nodes"
    ),
    Feature("byzantine_ids", ("--byzantine.ids=0", "--byzantine.attack=signflip"), "an attacker by id"),
    Feature(
        "outer",
        ("--local_steps=2", "--outer_optimizer=nesterov", "--outer_lr=0.5"),
        "decentralized DiLoCo: H local steps, then an outer Nesterov step on the pseudo-gradient",
    ),
    Feature(
        "streaming",
        (
            "--local_steps=2",
            "--outer_optimizer=nesterov",
            "--outer_lr=0.5",
            "--outer_fragments=2",
            "--outer_overlap=1",
            "--outer_mix=0.5",
        ),
        "Streaming DiLoCo: two fragments synchronised at staggered steps, each result in flight for one step",
    ),
    Feature(
        "outer_bits",
        (
            "--local_steps=2",
            "--outer_optimizer=nesterov",
            "--outer_lr=0.5",
            "--outer_message=pseudo_gradient",
            "--outer_fragments=2",
            "--outer_message_bits={form}",
        ),
        "Streaming DiLoCo with 4-bit outer gradients (one variant for algorithms sending dense messages)",
        forms=lambda info: ("4",) if info.cost.dense_values else (),
    ),
    Feature("bf16", ("--precision=bf16", "--message_dtype=bf16"), "bfloat16 compute and 16-bit messages"),
    Feature(
        "clock",
        (
            "--time.compute=stragglers:0.01,0.25,4",
            "--time.bandwidth=lognormal:1e7,0.5",
            "--time.latency=0.001",
            "--time.downlink=5e6",
        ),
        "the simulated clock with a straggler, slow lognormal uplinks and slower downlinks",
    ),
    Feature("availability", ("--time.availability=markov:0.2,0.5",), "nodes going off and on line (Markov)"),
    Feature("local_steps", ("--local_steps=2",), "H = 2 local steps per round"),
    Feature("final_merge", ("--final_merge=2",), "two merge rounds after training, their bits counted"),
    Feature("devices", ("--devices=2",), "the node axis sharded over two devices"),
    Feature(
        "failures",
        (),
        "links failing at random every round (two drop probabilities in a topology sweep)",
        graphs=lambda graph: (f"{graph}+drop:0.2", f"{graph}+drop:0.4"),
    ),
    Feature("adamw", ("--optimizer=adamw", "--grad_clip=1.0", "--lr_schedule=cosine"), "AdamW, clipping, cosine"),
    Feature("non_iid", ("--partition=dirichlet:0.5",), "Dirichlet label skew"),
    Feature("same_iterate", ("--ordering=same_iterate",), "gradient and gossip at the same iterate"),
)

#: Commands that run training from a TrainConfig: name -> the extra options of a minimal run.
COMMANDS: dict[str, tuple[str, ...]] = {
    "train": (),
    "sweep": ("--seeds=2",),
    "plan": (),
    "topology-sweep": ("--train", "--seeds=1"),
}

#: TrainConfig fields that no feature needs to name, and why: values inside one program (a number
#: the same code reads), names and paths of the catalogue's base run, or report-only settings.
PLAIN_FIELDS: dict[str, str] = {
    "dataset": "the base run's data set (data loading has its own tests)",
    "data_dir": "a path",
    "raw_dir": "a path",
    "download": "network access, never in tests",
    "num_nodes": "a shape",
    "topology": "chosen per algorithm and feature by graphs_of",
    "algorithm": "the matrix's other axis",
    "algorithm_options": "per algorithm (its defaults)",
    "model": "the base run's model (models have their own tests)",
    "model_options": "a shape",
    "lr": "a value",
    "momentum": "a value",
    "nesterov": "a value",
    "weight_decay": "a value",
    "weight_decay_mask": "a mask over the same update",
    "warmup_rounds": "a value of the schedule",
    "warmup_from": "a value of the schedule",
    "decay_rounds": "a value of the schedule",
    "decay_factor": "a value of the schedule",
    "final_lr": "a value of the schedule",
    "optimizer_options": "values of the optimizer",
    "outer_momentum": "a value of the outer step",
    "outer_message": "a variant of the outer step's message",
    "batch_size": "a shape",
    "num_rounds": "the length of the run",
    "eval_every": "the length of a chunk",
    "evals_per_chunk": "the length of a chunk",
    "identical_init": "a value of the initial state",
    "augment": "image augmentation, for image models only",
    "eval_size": "a shape",
    "eval_chunk": "a shape",
    "seed": "a value",
    "data_seed": "a value",
    "name": "a label",
    "node_batch": "a platform choice of the same program",
    "tensorboard": "an extra writer of the same rows",
}


def _compensable(form) -> bool:
    from jaxgossip.engine.asynchronous import compensates_rates

    return compensates_rates(form) is None


def graph_for(info: AlgorithmInfo, static: bool = False) -> str:
    """A graph spec the algorithm's metadata accepts: a tree for tree methods; for push-sum
    (column-stochastic) methods the time-varying one-peer exponential graph, or the directed ring
    when the graph must not vary (``static``) or the method needs a fixed one; the ring otherwise."""
    needs = info.graph
    if needs.tree:
        return "binary_tree"
    if needs.mixing == "column_stochastic":
        return "one_peer_exponential" if needs.time_varying and not static else "directed_ring"
    return "ring"


def graphs_of(feature: Feature, info: AlgorithmInfo) -> tuple[str, ...]:
    """The graph specs a run of ``feature`` uses for an algorithm with metadata ``info`` (see
    :attr:`Feature.graphs`): a training run takes the first."""
    graph = graph_for(info, feature.static_graph)
    return (graph,) if feature.graphs is None else tuple(feature.graphs(graph))


def variants(feature: Feature, info: AlgorithmInfo) -> list[tuple[str, tuple[str, ...]]]:
    """The (label, flags) variants of ``feature`` for an algorithm with metadata ``info``: one for a
    plain feature, one per form for a feature with :attr:`Feature.forms` (none if it has none)."""
    if feature.forms is None:
        return [(feature.name, feature.flags)]
    return [
        (f"{feature.name}:{form}", tuple(flag.replace("{form}", form) for flag in feature.flags))
        for form in feature.forms(info)
    ]
