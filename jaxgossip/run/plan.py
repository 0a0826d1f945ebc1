"""Memory plan of a configured training run (``jaxgossip plan``): the compiled chunk's memory from
XLA's memory analysis, per node and in total, and the largest node count that fits a memory size.

The program planned is the one the trainer runs: :func:`jaxgossip.run.resolve.resolve` and
:func:`jaxgossip.run.runner.make_trainer` build the run of the config (same model, optimizer,
algorithm, topology, partition), and its ``run_chunk`` (``evals_per_chunk`` evaluation intervals
of ``eval_every`` rounds, evaluation included) is lowered on abstract values and compiled:

* the state is ``jax.eval_shape`` of ``trainer.init``, so no state is allocated even at N = 16,384;
* the data shards ``x [N, M_max, ...]``, ``y [N, M_max, ...]`` and the evaluation set are arguments
  of the compiled program (``jax.ShapeDtypeStruct``), as in the trainer's multi-process form; in one
  process the trainer closes over them as constants, which XLA's analysis leaves out. Only the
  per-node sample counts ``[N]`` and the graph's index tables stay constants (not counted).

Total = XLA's ``arguments + outputs + temp - alias`` (:class:`jaxgossip.sim.memory.MemoryStats`); the
breakdown of the arguments (parameters, optimizer state, algorithm state, ...) is counted from the
state's leaf shapes, and temp (activations, gradients, intermediate buffers) is XLA's. The state is
not donated, so a chunk holds its input and output state at once.

The numbers are from the CPU compile of the program built for ``platform`` (its build-time
choices: node batching, convolution formulation; :mod:`jaxgossip.ops.platforms`). A GPU compile can
differ (other fusions, cuDNN workspaces, allocator fragmentation; compile-time branches such as the
fused CPU top-k round are the CPU's here), so keep a margin.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxgossip import data, topology
from jaxgossip.ops import platforms
from jaxgossip.run import runner
from jaxgossip.run.config import TrainConfig
from jaxgossip.run.resolve import check_train_config, load_data, resolve
from jaxgossip.sim.memory import (
    GPU_MEMORY,
    Fit,
    MemoryStats,
    fit_affine,
    largest_fitting,
    memory_stats,
    tree_bytes,
)

__all__ = [
    "Part",
    "Measurement",
    "AbstractRun",
    "abstract_run",
    "breakdown",
    "measure",
    "NodeRule",
    "node_rule",
    "MemoryPlan",
    "plan_memory",
    "MAX_NODES",
]

#: the largest node count the search considers.
MAX_NODES = 2**20


class Part(NamedTuple):
    """One row of the breakdown of a compiled chunk's arguments.

    Attributes:
      name: what it is ("parameters", "optimizer state", "algorithm state", ...).
      total: bytes over all nodes.
      per_node: the bytes of the leaves with a node axis, / N (:func:`jaxgossip.sim.memory.tree_bytes`).
      shared: bytes of the leaves that are not per-node.
      shared_leaves: ``"path shape dtype"`` of those leaves.
    """

    name: str
    total: int
    per_node: float
    shared: int
    shared_leaves: tuple[str, ...]


class Measurement(NamedTuple):
    """The compiled chunk at one node count.

    Attributes:
      num_nodes: N.
      stats: XLA's memory analysis (:class:`jaxgossip.sim.memory.MemoryStats`).
      parts: the arguments by part, from the leaf shapes (their totals add up to
        ``stats.arguments``).
      rounds: rounds in the compiled chunk (``evals_per_chunk * eval_every``, at most the run).
      samples_per_node: M_max, the padded shard length of the partition at N.
    """

    num_nodes: int
    stats: MemoryStats
    parts: tuple[Part, ...]
    rounds: int
    samples_per_node: int

    @property
    def total(self) -> int:
        """XLA's bytes of one chunk: arguments + outputs + temp - alias."""
        return self.stats.total

    @property
    def per_node(self) -> float:
        """``total / N``."""
        return self.stats.total / self.num_nodes


class NodeRule(NamedTuple):
    """Which node counts a config can be built at.

    Attributes:
      valid: ``valid(N)``: the topology exists at N, the algorithm accepts it, and the data set's
        partition gives every node at least ``batch_size`` samples.
      max_nodes: the largest N the data set allows (capped at :data:`MAX_NODES`).
      text: the data set's rule in words.
      refusals: filled by ``valid``: the first refusal of a node count by the topology, the
        algorithm or the partition (``"N=9: hypercube needs n to be a power of two ..."``).
    """

    valid: Any
    max_nodes: int
    text: str
    refusals: list


class MemoryPlan(NamedTuple):
    """The memory plan of a config.

    Attributes:
      config: the checked config (``num_nodes`` the planned N).
      platform: the platform whose build-time choices the program uses (compiled for the CPU).
      choices: those choices (:class:`jaxgossip.ops.platforms.BuildChoices`).
      measurement: the compiled chunk at ``config.num_nodes``.
      line: ``(a, b)`` of ``bytes ~ a + b N`` through the first two compiles (None if only one
        node count is valid).
      fit_nodes: the two node counts of the line.
      fits: one :class:`jaxgossip.sim.memory.Fit` per memory size, in the order given.
      labels: the label of each memory size.
      rule: the node-count rule in words (:class:`NodeRule`: the data set's limit and the first
        refusal of a count met in the search).
      measured: every compile made, ``N -> total bytes``.
    """

    config: TrainConfig
    platform: str
    choices: Any
    measurement: Measurement
    line: tuple[float, float] | None
    fit_nodes: tuple[int, ...]
    fits: tuple[Fit, ...]
    labels: tuple[str, ...]
    rule: str
    measured: dict


def _abstract(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), tree)


class AbstractRun(NamedTuple):
    """The training chunk of a config on abstract values (nothing allocated, nothing compiled).

    Attributes:
      num_nodes: N.
      state: ``jax.eval_shape`` of ``trainer.init`` (a :class:`jaxgossip.engine.training.TrainState` of
        ``jax.ShapeDtypeStruct``).
      data: ``(train_data, eval_data)``: ``(x [N, M_max, ...], y [N, M_max, ...])`` and
        ``(x [M_eval, ...], y [M_eval, ...])`` as ``jax.ShapeDtypeStruct``.
      chunk: ``chunk(state, train_data, eval_data) -> (state, metrics)``, the trainer's
        ``run_chunk`` with the data as arguments; ``jax.jit(chunk).lower(state, *data)`` is the
        program of the plan.
      rounds: rounds in one chunk.
      samples_per_node: M_max, the padded shard length.
    """

    num_nodes: int
    state: Any
    data: tuple
    chunk: Any
    rounds: int
    samples_per_node: int


def abstract_run(
    config: TrainConfig, dataset: data.Dataset | None = None, *, platform: str | None = "cuda"
) -> AbstractRun:
    """The run of ``config`` (``resolve.resolve`` + ``runner.make_trainer``) at ``config.num_nodes``
    on abstract state and data (see :class:`AbstractRun`).

    Args:
      config: a training config (resolved here).
      dataset: its data set (loaded from the config when None).
      platform: whose build-time choices to build with (:data:`jaxgossip.ops.platforms.PLATFORMS`;
        None: the backend JAX runs on). The program is compiled for the CPU either way.

    Raises:
      ValueError: a bad config, ``devices != 1``, or a node count the data set cannot be split
        into.
    """
    if config.devices != 1:
        raise ValueError(f"devices={config.devices}: the memory plan is of one device holding all N nodes (devices=1)")
    prep = resolve(config, dataset, platform)  # the run's partition, graph, model, algorithm and clock
    config, dataset = prep.config, prep.dataset
    eval_size = min(config.eval_size, dataset.y_test.shape[0])
    args = (
        _abstract((prep.shards.x, prep.shards.y)),
        _abstract((dataset.x_test[:eval_size], dataset.y_test[:eval_size])),
    )
    counts = np.asarray(prep.shards.counts)
    samples_per_node = int(prep.shards.x.shape[1])
    prep = prep._replace(shards=None)  # the program takes the shards' shapes, not the arrays

    def trainer_on(train_data, eval_data):
        """The run's trainer on traced data (inside the trace of eval_shape or jit)."""
        x, y = train_data
        part = prep._replace(
            dataset=dataset._replace(x_test=eval_data[0], y_test=eval_data[1]),
            shards=data.NodeShards(x, y, counts),
        )
        return runner.make_trainer(config, part)[0]

    num_evals = config.num_rounds // config.eval_every
    evals = min(max(1, config.evals_per_chunk), num_evals)

    def chunk(state, train_data, eval_data):
        return trainer_on(train_data, eval_data).run_chunk(state, evals)

    state = jax.eval_shape(lambda *d: trainer_on(*d).init(jax.random.key(config.seed)), *args)
    return AbstractRun(config.num_nodes, state, args, chunk, evals * config.eval_every, samples_per_node)


def _groups(run: AbstractRun) -> tuple:
    state = run.state
    return (
        ("parameters", state.params),
        ("normalization statistics", state.batch_stats),
        ("optimizer state", state.opt_state),
        ("algorithm state", state.comm_state),
        ("outer optimizer state", state.outer),
        ("key, round, bits, clock", (state.key, state.round, state.bits, state.clock)),
        ("data shards", run.data[0]),
        ("evaluation set", run.data[1]),
    )


def breakdown(run: AbstractRun, like: AbstractRun | None = None) -> tuple[Part, ...]:
    """The parts of the chunk's arguments, counted from the leaf shapes: parameters, normalization
    statistics, optimizer state, algorithm state, outer optimizer state, the run's key / round /
    bits / clock, the data shards and the evaluation set.

    Args:
      run: the run at N.
      like: optional, the same config at another node count; a leaf is then per-node when one of
        its axes is N here and ``like.num_nodes`` there (:func:`jaxgossip.sim.memory.tree_bytes`), which
        also catches ``[T, N, ...]`` buffers. Without it, when its leading axis is N.
    """
    if like is None:
        return tuple(Part(name, *tree_bytes(tree, run.num_nodes)) for name, tree in _groups(run))
    return tuple(
        Part(name, *tree_bytes(tree, run.num_nodes, other, like.num_nodes))
        for (name, tree), (_, other) in zip(_groups(run), _groups(like))
    )


def measure(config: TrainConfig, dataset: data.Dataset | None = None, *, platform: str | None = "cuda") -> Measurement:
    """Compiles the training chunk of ``config`` at ``config.num_nodes`` (:func:`abstract_run`) and
    reads XLA's memory analysis.

    Returns:
      :class:`Measurement`.

    Raises:
      ValueError: as :func:`abstract_run`.
    """
    run = abstract_run(config, dataset, platform=platform)
    compiled = jax.jit(run.chunk).lower(run.state, *run.data).compile()
    return Measurement(run.num_nodes, memory_stats(compiled), breakdown(run), run.rounds, run.samples_per_node)


def node_rule(config: TrainConfig, dataset: data.Dataset, max_nodes: int = MAX_NODES) -> NodeRule:
    """The node counts ``config`` can be built at (see :class:`NodeRule`); host work only.

    The data limit assumes that a split into more nodes never gives the smallest node more samples
    (true of every partitioner up to its random draws); ``valid`` checks each count itself.
    """
    labels = data.partition_labels(dataset)[0]
    num_samples = int(dataset.y_train.shape[0])
    seed = config.resolved_data_seed
    cache: dict[int, bool] = {}
    reasons: list[str] = []

    def data_ok(n: int) -> bool:
        if n > num_samples:
            return False
        try:
            parts = data.partition(labels, n, config.partition, seed=seed)
        except ValueError:
            return False
        return min(len(p) for p in parts) >= config.batch_size

    def valid(n: int) -> bool:
        if n not in cache:
            try:
                topology.make(config.topology, n, seed=seed)  # cheap: most rules fail before any table
                check_train_config(config.replace(num_nodes=n))
                ok = data_ok(n)
            except ValueError as err:
                if len(reasons) < 1:
                    reasons.append(f"N={n}: {err}")
                ok = False
            cache[n] = ok
        return cache[n]

    n0 = config.num_nodes
    low, high = n0, min(num_samples, max_nodes)  # data_ok(low); search the last n with data_ok
    if not data_ok(low):
        raise ValueError(
            f"num_nodes={n0}: the {config.partition} split of {dataset.name} ({num_samples} samples) leaves a node "
            f"with fewer than batch_size={config.batch_size} samples"
        )
    if data_ok(high):
        low = high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if data_ok(mid) else (low, mid)
    text = (
        f"N <= {low}: above it the {config.partition} split of {dataset.name} ({num_samples} training samples) "
        f"leaves a node with fewer than batch_size={config.batch_size} samples"
    )
    if low == max_nodes:
        text = f"N <= {max_nodes} (the search's cap)"

    def valid_below_limit(n: int) -> bool:
        return n <= low and valid(n)

    return NodeRule(valid_below_limit, low, text, reasons)


def plan_memory(
    config: TrainConfig,
    memories: tuple[tuple[str, int], ...] = GPU_MEMORY,
    *,
    dataset: data.Dataset | None = None,
    platform: str | None = "cuda",
    fit_nodes: int | None = None,
    max_nodes: int = MAX_NODES,
) -> MemoryPlan:
    """The memory plan of ``config``: the compiled chunk at ``config.num_nodes`` and, for every
    memory size, the largest node count whose compiled chunk fits it (confirmed by compiling there
    and at the next valid count; :func:`jaxgossip.sim.memory.largest_fitting`).

    Args:
      config: a training config; ``num_nodes`` is the N of the breakdown and the first point of
        the line.
      memories: ``(label, bytes)`` sizes; default :data:`jaxgossip.sim.memory.GPU_MEMORY`.
      dataset: the config's data set (loaded when None).
      platform: whose build-time choices the program is built with (see :func:`measure`).
      fit_nodes: the second node count of the line; default the first valid count >= 2 N (or the
        largest below N when there is none).
      max_nodes: the largest node count considered.

    Returns:
      :class:`MemoryPlan`.
    """
    config = check_train_config(config)
    platform = platforms.check_platform(platform)
    if dataset is None:
        dataset = load_data(config)
    measured: dict[int, Measurement] = {}

    def at(n: int) -> Measurement:
        if n not in measured:
            measured[n] = measure(config.replace(num_nodes=n), dataset, platform=platform)
        return measured[n]

    n0 = config.num_nodes
    base = at(n0)
    rule = node_rule(config, dataset, max_nodes)
    if fit_nodes is None:
        fit_nodes = next((m for m in range(2 * n0, rule.max_nodes + 1) if rule.valid(m)), None)
        if fit_nodes is None:
            fit_nodes = next((m for m in range(rule.max_nodes, n0, -1) if rule.valid(m)), None)
        if fit_nodes is None:
            fit_nodes = next((m for m in range(n0 - 1, 0, -1) if rule.valid(m)), None)
    elif fit_nodes == n0 or not rule.valid(fit_nodes):
        raise ValueError(f"fit_nodes={fit_nodes} must be a valid node count other than num_nodes={n0} ({rule.text})")
    fits, line = [], None
    if fit_nodes is None:  # one valid node count: nothing to fit
        for _, limit in memories:
            ok = base.total <= limit
            fits.append(Fit(limit, n0 if ok else None, base.total if ok else None, None, None, math.nan,
                            "no larger valid N" if ok else "none fits"))  # fmt: skip
    else:
        line = fit_affine([(n0, base.total), (fit_nodes, at(fit_nodes).total)])
        # a leaf's node axis is the one of length N here and fit_nodes there
        runs = [abstract_run(config.replace(num_nodes=m), dataset, platform=platform) for m in (n0, fit_nodes)]
        base = base._replace(parts=breakdown(*runs))
        for _, limit in memories:
            fits.append(
                largest_fitting(
                    lambda n: at(n).total, limit, rule.valid, start=(n0, fit_nodes), max_nodes=rule.max_nodes
                )
            )
    return MemoryPlan(
        config=config,
        platform=platform,
        choices=platforms.resolve(config.model, config.node_batch, platform),
        measurement=base,
        line=line,
        fit_nodes=(n0,) if fit_nodes is None else (n0, fit_nodes),
        fits=tuple(fits),
        labels=tuple(label for label, _ in memories),
        rule=rule.text + "".join(f"; {r}" for r in rule.refusals),
        measured={n: m.total for n, m in sorted(measured.items())},
    )
