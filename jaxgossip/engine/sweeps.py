"""Sweeps in one compile: ``vmap`` a whole training or consensus run over seeds x hyperparameters.

Only hyperparameters that are *values* (traced arrays) can share one compiled program: the learning
rate, weight decay, and consensus step sizes such as ``gamma``. Anything that fixes an array shape
(node count, batch size, rounds, model, graph, top-k fraction or k, PowerGossip rank or
iterations, ...) needs separate runs; asking to sweep it raises a ``ValueError`` naming the axis.

Grid points are the Cartesian product of the axes; seeds are an inner axis, so results have shape
``[G, S]`` (G grid points, S seeds) and equal the corresponding individual runs. Training sweeps of
a config (``sweep_training``) build on the runner, so they live above it in
:mod:`jaxgossip.run.training_sweeps`.

Graphs fix shapes too, but graphs of one node count can be padded to common tables
(:func:`jaxgossip.topology.stack`): :func:`map_topologies` runs any per-graph program over a list
of topologies with one compile per group of same-shape graphs; :func:`sweep_topologies` is its
consensus sweep (training: :func:`jaxgossip.run.training_sweeps.sweep_topologies_training`).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip import algorithms, topology
from jaxgossip.engine.consensus import consensus_scan
from jaxgossip.topology import Topology, effective_neighbors, spectral_gap
from jaxgossip.types import GossipAlgorithm, Params

__all__ = [
    "SWEEPABLE",
    "LINK_AXES",
    "sweepable",
    "grid",
    "check_axes",
    "sweep_consensus",
    "summarize",
    "TopologySweep",
    "sweep_topologies",
    "map_topologies",
    "topology_rows",
]

# Config fields that are traced values inside a run and may therefore be vmapped.
SWEEPABLE = (
    "lr",
    "weight_decay",
    "warmup_from",
    "algorithm_options.gamma",
    "algorithm_options.vector_gamma",
    "algorithm_options.target_residual",
    # the time model (jaxgossip.sim.timing): links, and the numbers of the --time.compute spec (seconds
    # C, median or mean; a straggler fraction F and slowdown S)
    "time.latency",
    "time.bandwidth",
    "time.downlink",
    "time.compute",
    "time.fraction",
    "time.slowdown",
)

# Why a common request cannot be swept in one compile (algorithm options: the algorithms' metadata,
# SweepFacts.shape_options).
_SHAPE_REASONS = {
    "num_nodes": "N is the leading axis of every array",
    "batch_size": "B fixes the batch shape",
    "num_rounds": "the scan length is static",
    "topology": "graphs have their own index tables; use sweep_topologies / sweep_topologies_training, which "
    "share one compile per group of same-shape graphs",
    "model": "the model fixes the parameter shapes",
    "momentum": "momentum None vs a value selects the optimizer's structure",
}


# Link axes take per-node or per-edge specs as values (drawn per seed into one table,
# jaxgossip.sim.link_tables); the compute spec's kind selects the program's structure.
LINK_AXES = ("time.latency", "time.bandwidth", "time.downlink")
_SPEC_REASONS = {
    "time.compute": "a spec's kind selects the program's structure; sweep its numbers (time.compute, time.fraction, "
    "time.slowdown)",
}


def _option_reason(name: str) -> str | None:
    """Why ``algorithm_options.<option>`` changes shapes, from the registered algorithms' metadata."""
    prefix = "algorithm_options."
    if not name.startswith(prefix):
        return None
    # a nested option (compressor_options.fraction) takes the reason of the option that holds it
    parts = name[len(prefix) :].split(".")
    for option in (".".join(parts[:i]) for i in range(len(parts), 0, -1)):
        for entry in algorithms.INFOS.values():
            if option in entry.sweep.shape_options:
                return entry.sweep.shape_options[option]
    return None


def sweepable(algorithm: str | None = None) -> tuple[str, ...]:
    """The one-compile sweep axes of a run of ``algorithm``: :data:`SWEEPABLE` and the algorithm's
    own traced options (its registry metadata, ``SweepFacts.traced_options``)."""
    if not isinstance(algorithm, str) or algorithm not in algorithms.INFOS:
        return SWEEPABLE
    own = algorithms.INFOS[algorithm].sweep.traced_options
    return SWEEPABLE + tuple(f"algorithm_options.{o}" for o in own if f"algorithm_options.{o}" not in SWEEPABLE)


def check_axes(axes: Mapping[str, Sequence[Any]], algorithm: str | None = None) -> None:
    """Raises ValueError for an axis that cannot be swept in one compile (the message names it);
    ``algorithm`` (the run's registered name) adds its own traced options (:func:`sweepable`)."""
    if not axes:
        raise ValueError("a sweep needs at least one axis, e.g. {'lr': [0.01, 0.1]}")
    allowed = sweepable(algorithm)
    for name, values in axes.items():
        if name not in allowed:
            why = _SHAPE_REASONS.get(name) or _option_reason(name) or "it is not a traced value of the run"
            raise ValueError(
                f"sweep axis {name!r} would change array shapes or program structure ({why}); sweep it "
                f"with separate runs. Axes that share one compile: {list(allowed)}"
            )
        specs = [v for v in values if isinstance(v, str)] if isinstance(values, (list, tuple)) else []
        if specs and name in LINK_AXES:
            _check_link_values(name, values)
            continue
        if specs:
            why = _SPEC_REASONS.get(name, "a string is not a number")
            raise ValueError(f"sweep axis {name!r} takes numbers, not {specs[0]!r}: {why}")
        values = np.asarray(values, dtype=np.float64)
        if values.ndim != 1 or values.size == 0:
            raise ValueError(f"sweep axis {name!r} needs a non-empty list of numbers, got {values!r}")
        if not np.all(np.isfinite(values)):
            raise ValueError(f"sweep axis {name!r} has NaN or inf values")


def _check_link_values(name: str, values: Sequence[Any]) -> None:
    """Each value of link axis ``name`` is a finite number or a valid spec (ValueError naming it)."""
    from jaxgossip.sim.network import Network

    field = name.split(".", 1)[1]
    for value in values:
        if isinstance(value, str):
            Network(**{field: value})  # parses the spec (reads a trace file once): errors name --time.FIELD
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
            raise ValueError(f"sweep axis {name!r} takes finite numbers or link specs; got {value!r}")


def grid(axes: Mapping[str, Sequence[Any]]) -> dict[str, np.ndarray]:
    """Cartesian product of the axes: name -> [G] float32 values (last axis fastest)."""
    names = list(axes)
    points = list(itertools.product(*(list(axes[n]) for n in names)))
    return {n: np.asarray([p[i] for p in points], dtype=np.float32) for i, n in enumerate(names)}


def sweep_consensus(
    make_alg: Callable[..., GossipAlgorithm],
    x0: Params,
    num_steps: int,
    keys: Any,
    **axes: Sequence[float],
):
    """Consensus runs for every grid point x key in one compile.

    Args:
      make_alg: ``make_alg(**point) -> GossipAlgorithm`` with traced keyword values, e.g.
        ``lambda gamma: jg.algorithms.make("choco", topo, gamma=gamma, compressor="sign")``.
      x0: initial values, leaves [N, ...].
      num_steps: S rounds.
      keys: [K] PRNG keys.
      **axes: name -> values of the keyword arguments of ``make_alg``.

    Returns:
      ``(points, error [G, K, S + 1], bits_per_round [G, K, S])``.
    """
    if not axes:
        raise ValueError("sweep_consensus needs at least one axis, e.g. gamma=[...]")
    points = grid(axes)

    def one(key, point):
        trace = consensus_scan(make_alg(**point), x0, num_steps, key)
        return trace.error, trace.round_bits

    run = jax.jit(jax.vmap(jax.vmap(one, in_axes=(0, None)), in_axes=(None, 0)))
    errors, bits = run(keys, {k: jnp.asarray(v) for k, v in points.items()})
    return points, errors, bits


def summarize(points: Mapping[str, np.ndarray], metrics) -> list[dict]:
    """One row per grid point: the axes' values and mean / std over seeds of the final metrics."""
    rows = []
    final = {
        name: np.asarray(value)[:, :, -1]
        for name, value in metrics._asdict().items()
        if name != "bits" and value is not None
    }
    bits = np.asarray(metrics.bits)[:, :, -1]  # [G, S, N]
    for g in range(next(iter(points.values())).shape[0]):
        # a link spec's text stays as given (a sweep over links, jaxgossip.sim.link_tables)
        row = {name: values[g] if isinstance(values[g], str) else float(values[g]) for name, values in points.items()}
        for name in ("test_acc", "test_loss", "node_acc_mean", "consensus", "train_loss"):
            row[name] = float(final[name][g].mean())
            row[name + "_std"] = float(final[name][g].std())
        row["MB_per_node"] = float(bits[g].mean() / 8e6)
        rows.append(row)
    return rows


@dataclasses.dataclass
class TopologySweep:
    """Outcome of :func:`sweep_topologies` for G graphs and S seeds.

    Attributes:
      topologies: the G graphs, in the order given.
      seeds: the S seeds.
      error: per graph, [S, R + 1] consensus error ``(1/N) sum_i ||x_i - mean(x0)||^2`` (before round
        1 and after each of the R rounds), NumPy.
      bits: per graph, [S, R] bits sent by all nodes together in each round, NumPy float64.
      groups: the compile groups, lists of graph indices (one compiled program each).
      group_seconds: wall time of each group (compile + run + transfer), seconds.
      node_bits: with ``sweep_topologies(..., node_bits=True)``, per graph [S, R, N] bits each node
        sent in each round (``StepInfo.bits``; summed over N it is ``bits``), NumPy float64; else
        None.
    """

    topologies: list
    seeds: list
    error: list
    bits: list
    groups: list
    group_seconds: list
    node_bits: list | None = None


def _check_topologies(topologies: Sequence[Topology]) -> list[Topology]:
    topologies = list(topologies)
    if not topologies:
        raise ValueError("a topology sweep needs at least one topology")
    for i, topo in enumerate(topologies):
        if not isinstance(topo, Topology):
            raise TypeError(f"topologies[{i}] is a {type(topo).__name__}, not a jaxgossip Topology")
    return topologies


def _group_plan(algorithm: str, topologies: list[Topology], stack: bool) -> list[list[int]]:
    stackable = algorithms.resolve(algorithm).graph.stackable  # also refuses an unknown algorithm
    if not stack:
        return [[i] for i in range(len(topologies))]
    plan = []
    for members in topology.group(topologies):
        # Failures of one graph at several probabilities stack for every algorithm: the graph's
        # tables stay host constants in the shared sampler, only p and q are traced. Fixed graphs
        # stack only for algorithms that run on traced tables (metadata ``stackable``).
        if stackable or all(topologies[i].stochastic for i in members):
            plan.append(members)
        else:
            plan.extend([i] for i in members)
    return plan


def _graph_values(per_graph, members: list[Topology]) -> dict[str, np.ndarray]:
    """per_graph(topology) -> {name: float} for each member, as name -> [G] float32."""
    if per_graph is None:
        return {}
    values = [dict(per_graph(t)) for t in members]
    names = sorted(values[0])
    for t, v in zip(members, values):
        if sorted(v) != names:
            raise ValueError(f"per_graph returned keys {sorted(v)} for {t.name} but {names} for {members[0].name}")
    return {n: np.asarray([v[n] for v in values], dtype=np.float32) for n in names}


def _run_group(one: Callable, graphs: list[Topology], per_graph, keys, stacked: bool):
    """``one(topology, point, key)`` for every graph x key of a compile group, in one program.

    Stacked: the graphs are split by slot count K (:func:`jaxgossip.topology.buckets`), each bucket
    becomes one stacked :class:`Topology`, and the program vmaps over each bucket's graphs (tables
    and per-graph values) and the keys, so no graph pays for a larger K. Otherwise the group holds
    one host topology, closed over as constants, and the program is vmapped over keys only.
    Outputs have leading axes [G, S], graphs in the order given.
    """
    values = {k: jnp.asarray(v) for k, v in _graph_values(per_graph, graphs).items()}
    if stacked:
        parts = topology.buckets(graphs)
        stacks = [topology.stack([graphs[i] for i in part]) for part in parts]
        order = np.argsort(np.concatenate(parts))  # bucket-major -> the order given
        per_graph_and_key = jax.vmap(jax.vmap(one, in_axes=(None, None, 0)), in_axes=(0, 0, None))

        def run(stacks, values, keys):
            outs = [
                per_graph_and_key(s, {k: v[np.asarray(part)] for k, v in values.items()}, keys)
                for part, s in zip(parts, stacks)
            ]
            return jax.tree_util.tree_map(lambda *a: jnp.concatenate(a)[order], *outs)

        return jax.jit(run)(stacks, values, keys)
    point = {k: v[0] for k, v in values.items()}
    run = jax.jit(jax.vmap(lambda key: one(graphs[0], point, key)))
    return jax.tree_util.tree_map(lambda a: a[None], run(keys))


def map_topologies(
    one: Callable,
    topologies: Sequence[Topology],
    keys: Any,
    *,
    algorithm: str,
    per_graph: Callable[[Topology], Mapping[str, float]] | None = None,
    stack: bool = True,
) -> tuple[list, list[list[int]], list[float]]:
    """``one(topology, point, key)`` for every graph x key, one compiled program per group.

    The engine of the topology sweeps (consensus here, training in
    :mod:`jaxgossip.run.training_sweeps`): graphs are grouped by :func:`jaxgossip.topology.group`
    when ``algorithm`` can run on stacked tables (its metadata's ``stackable``) and ``stack`` is on, else
    each graph is its own group; ``point`` holds the graph's ``per_graph`` values (traced).
    Failure-wrapped graphs of one graph (``with_failures`` at several ``link_drop`` / ``node_drop``)
    form one group for every algorithm that accepts them: their probabilities are traced.

    Args:
      one: ``(topology, point, key) -> pytree``, traceable; it builds the algorithm from ``topology``.
      topologies: G graphs.
      keys: [S] PRNG keys.
      algorithm: registered name of the algorithm ``one`` builds (decides stacking).
      per_graph: optional ``topology -> {name: float}``.
      stack: False runs every graph on its own.

    Returns:
      ``(outs, groups, seconds)``: ``outs[g]`` the output pytree of graph g with leading axis S
      (NumPy); the compile groups (lists of graph indices); wall seconds of each group.
    """
    topologies = _check_topologies(topologies)
    plan = _group_plan(algorithm, topologies, stack)
    stacked = stack and algorithms.resolve(algorithm).graph.stackable
    outs, seconds = [None] * len(topologies), []
    for members in plan:
        start = time.perf_counter()
        # Stochastic graphs of one sampler (failures at several p) run as one stack of their draw
        # arguments; a lone stochastic graph runs closed over, as its own program.
        if any(topologies[i].stochastic for i in members):
            group_stacked = len(members) > 1
        else:
            group_stacked = stacked
        result = jax.device_get(_run_group(one, [topologies[i] for i in members], per_graph, keys, group_stacked))
        seconds.append(time.perf_counter() - start)
        for j, i in enumerate(members):
            outs[i] = jax.tree_util.tree_map(lambda a, j=j: np.asarray(a[j]), result)
    return outs, plan, seconds


def sweep_topologies(
    algorithm: str,
    topologies: Sequence[Topology],
    *,
    dim: int,
    num_steps: int,
    seeds: Sequence[int],
    options: Mapping[str, Any] | None = None,
    per_graph: Callable[[Topology], Mapping[str, float]] | None = None,
    stack: bool = True,
    node_bits: bool = False,
) -> TopologySweep:
    """Consensus runs of one algorithm on many graphs x seeds, one compile per group of same-shape graphs.

    Graph g with seed s starts from ``x0 = normal(key_x, [N_g, D])`` and runs
    ``algorithms.make(algorithm, topologies[g], **options, **per_graph(topologies[g]))`` for R rounds
    with key ``key_a``, where ``key_x, key_a = jax.random.split(jax.random.key(s))``; the result
    equals :func:`jaxgossip.engine.consensus.consensus_scan` of that run (tested). Graphs of one
    :func:`jaxgossip.topology.signature` share one program vmapped over graph stacks
    (:func:`jaxgossip.topology.stack`) and seeds when the algorithm is in
    registered with ``stackable=True``; other algorithms (PowerGossip, Sparse-Push, SCSP) and
    ``stack=False`` run one program per graph, vmapped over seeds. Failures of one graph at several
    probabilities (``with_failures``) share one program for every algorithm that accepts them.

    Args:
      algorithm: registered algorithm name.
      topologies: G graphs (any node counts).
      dim: D, values per node.
      num_steps: R rounds.
      seeds: S integer seeds (x0 and the algorithm's randomness).
      options: hyperparameters shared by all graphs (static, e.g. ``compressor="sign"``).
      per_graph: optional ``topology -> {name: float}``, per-graph traced hyperparameters such as
        ``lambda t: {"gamma": optimal_gamma(t)}``.
      stack: False runs every graph on its own (for comparison and timing).
      node_bits: also keep every node's bits of every round (``ConsensusTrace.node_bits``) in
        ``TopologySweep.node_bits``, for :mod:`jaxgossip.sim.cost` (S x R x N floats per graph).

    Returns:
      :class:`TopologySweep`.
    """
    topologies = _check_topologies(topologies)
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ValueError(f"dim={dim!r} must be a positive int")
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
        raise ValueError(f"num_steps={num_steps!r} must be a positive int")
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must hold at least one seed")
    options = dict(options or {})
    keys = jnp.stack([jax.random.key(s) for s in seeds])

    def one(topo, point, key):
        key_x, key_a = jax.random.split(key)
        x0 = jax.random.normal(key_x, (topo.num_nodes, int(dim)), jnp.float32)
        alg = algorithms.make(algorithm, topo, **options, **point)
        trace = consensus_scan(alg, x0, int(num_steps), key_a)
        return trace.error, trace.round_bits, (trace.node_bits if node_bits else None)

    outs, plan, seconds = map_topologies(one, topologies, keys, algorithm=algorithm, per_graph=per_graph, stack=stack)
    error = [out[0] for out in outs]
    bits = [out[1].astype(np.float64) for out in outs]
    per_node = [None if out[2] is None else out[2].astype(np.float64) for out in outs]
    return TopologySweep(topologies, seeds, error, bits, plan, seconds, per_node if node_bits else None)


def topology_rows(result: TopologySweep, tol: float = 1e-4, gamma: float = 0.99) -> list[dict]:
    """One row per graph: name, N, spectral gap, effective number of neighbours at decay ``gamma``
    (:func:`jaxgossip.topology.effective_neighbors`; NaN for stochastic or only column-stochastic
    graphs, and for non-circulant graphs beyond its dense size limit), mean degree, final relative
    error (mean and std over seeds), rounds and MB per node until the relative error
    ``error_r / error_0`` first drops below ``tol`` (seed mean; NaN if a seed never gets there),
    total MB per node, compile group."""
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0.0 <= gamma < 1.0:
        raise ValueError(f"gamma={gamma!r} must be a decay in [0, 1) (the effective number of neighbours)")
    rows = []
    group_of = {i: g for g, members in enumerate(result.groups) for i in members}
    for i, topo in enumerate(result.topologies):
        rel = result.error[i] / result.error[i][:, :1]  # [S, R + 1]
        cum_mb = np.cumsum(result.bits[i], axis=1) / topo.num_nodes / 8e6  # [S, R]
        reached = rel[:, 1:] <= tol
        rounds = np.where(reached.any(axis=1), reached.argmax(axis=1) + 1, np.nan)
        mb_at = np.array([cum_mb[s, int(r) - 1] if np.isfinite(r) else np.nan for s, r in enumerate(rounds)])
        try:
            gap = spectral_gap(topo)
        except ValueError:  # column-stochastic only: no doubly stochastic gap
            gap = float("nan")
        try:
            neighbors = effective_neighbors(topo, gamma)
        except ValueError:  # stochastic, column-stochastic only, or too large for the dense covariance
            neighbors = float("nan")
        rows.append(
            {
                "name": topo.name,
                "N": topo.num_nodes,
                "spectral_gap": gap,
                "effective_neighbors": neighbors,
                "mean_degree": topology.mean_out_degree(topo),
                "final_error": float(rel[:, -1].mean()),
                "final_error_std": float(rel[:, -1].std()),
                "rounds_to_tol": float(rounds.mean()),
                "MB_to_tol": float(mb_at.mean()),
                "MB_per_node": float(cum_mb[:, -1].mean()),
                "group": group_of[i],
                "group_size": len(result.groups[group_of[i]]),
            }
        )
    return rows
