"""Training sweeps of a config in one compile (edge module: builds runs from a ``TrainConfig``).

:func:`sweep_training` ``vmap``s a whole configured training run over a grid of sweepable
hyperparameters x seeds. The grid and its rules (:data:`jaxgossip.engine.sweeps.SWEEPABLE`,
:func:`jaxgossip.engine.sweeps.check_axes`, :func:`jaxgossip.engine.sweeps.grid`) live in the library module
:mod:`jaxgossip.engine.sweeps`; this module adds the config layer (:mod:`jaxgossip.run.runner`) on top.
:func:`sweep_topologies_training` does the same over graphs, on the engine
:func:`jaxgossip.engine.sweeps.map_topologies`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.engine.sweeps import check_axes, grid, map_topologies
from jaxgossip.ops import sharding
from jaxgossip.run.resolve import Resolved, resolve
from jaxgossip.run.runner import make_trainer
from jaxgossip.topology import Topology

__all__ = [
    "SweepProgram",
    "sweep_training",
    "sweep_program",
    "sweep_topologies_training",
    "apply_point",
    "link_tables",
]


# Sweep axes that set a number of the --time.compute spec: axis -> field of jaxgossip.sim.compute.Compute.
_COMPUTE_FIELDS = {"time.compute": "seconds", "time.fraction": "fraction", "time.slowdown": "slowdown"}
# The compute kinds whose seconds (C, median or mean) time.compute sets (a trace has none).
_SCALED_KINDS = ("constant", "stragglers", "lognormal", "exponential")


def apply_point(config, point: Mapping[str, Any]):
    """``config`` with the values of one grid point (``"algorithm_options.gamma"`` style names
    set inside ``algorithm_options``, ``"time.bandwidth"`` inside ``time``, and the numbers of the
    compute spec, ``"time.slowdown"`` the S of ``stragglers:C,F,S``, inside its parsed
    :class:`jaxgossip.sim.compute.Compute`); values may be traced."""
    from jaxgossip.sim.compute import parse_compute
    from jaxgossip.sim.network import Network

    changes, options, time = {}, dict(config.algorithm_options), dict(config.time)
    for name, value in point.items():
        if name.startswith("algorithm_options."):
            options[name.split(".", 1)[1]] = value
        elif name in _COMPUTE_FIELDS:
            compute = parse_compute(time.get("compute", Network().compute))
            kinds = _SCALED_KINDS if name == "time.compute" else ("stragglers",)
            if compute.kind not in kinds:
                raise ValueError(
                    f"sweep axis {name!r} sets a number of --time.compute={'|'.join(kinds)}:...; this run's "
                    f"compute is {compute.kind}"
                )
            time["compute"] = dataclasses.replace(compute, **{_COMPUTE_FIELDS[name]: value})
        elif name.startswith("time."):
            time[name.split(".", 1)[1]] = value
        else:
            changes[name] = value
    return config.replace(algorithm_options=options, time=time, **changes)


def sweep_training(config, axes: Mapping[str, Sequence[Any]], seeds: Sequence[int], dataset=None):
    """Trains ``config`` for every grid point x seed in one jitted, doubly vmapped program.

    Args:
      config: a :class:`jaxgossip.run.runner.TrainConfig`.
      axes: name -> values, names from :data:`jaxgossip.engine.sweeps.SWEEPABLE` (e.g. ``{"lr": [...],
        "algorithm_options.gamma": [...]}``).
      seeds: S integer seeds; seed ``s`` runs exactly like
        ``run_training(config.replace(seed=s, data_seed=d))`` with ``d`` the config's data seed
        (``data_seed``, or ``seed`` when unset): the partition and graph fix shapes, so they are
        shared by all seeds.
      dataset: optional preloaded dataset.

    Returns:
      ``(points, metrics)``: points name -> [G] values; metrics a ``Metrics`` whose leaves are
      ``[G, S, num_evals, ...]``.
    """
    program = sweep_program(config, axes, seeds, dataset)
    return program.points, program.run(*program.args)


class SweepProgram(NamedTuple):
    """The compiled-to-be program of :func:`sweep_training` and its arguments.

    Attributes:
      points: name -> [G] grid values (a link axis with specs: the numbers and spec texts as given).
      run: the jitted ``run(keys [S], values {name: [G]}, tables {field: [V, S, ...]}) -> Metrics``
        (leaves [G, S, ...]); a link axis with specs gives in ``values`` the index v of its value
        and its links in ``tables`` (:mod:`jaxgossip.sim.link_tables`).
      args: ``(keys, values, tables)``: ``run(*args)`` is the sweep; ``jax.export.export(run, ...)(*args)``
        lowers it for another platform.
    """

    points: dict
    run: Callable
    args: tuple


def link_tables(config, axes: Mapping[str, Sequence[Any]], seeds: Sequence[int], topology) -> dict:
    """The :class:`jaxgossip.sim.link_tables.LinkTable` of every link field of a sweep that needs
    one (a spec among its axis's values, or a seed-drawn spec as its fixed value), by field.

    Raises:
      ValueError: naming ``--time.FIELD`` and the value (a trace that does not fit the graph, values
        with no common layout).
    """
    from jaxgossip.run.cost_report import priced_as_allreduce
    from jaxgossip.sim.link_tables import LINK_FIELDS, link_table, needs_table

    time = dict(config.time or {})
    graph = None if priced_as_allreduce(config.algorithm) else topology  # an all-reduce has no edges
    tables = {}
    for field in LINK_FIELDS:
        swept = axes.get(f"time.{field}")
        if needs_table(field, time.get(field), swept):
            values = list(swept) if swept is not None else [time[field]]
            tables[field] = link_table(field, values, topology=graph, num_nodes=config.num_nodes, seeds=seeds)
    return tables


def sweep_program(config, axes: Mapping[str, Sequence[Any]], seeds: Sequence[int], dataset=None, platform=None):
    """The program of :func:`sweep_training` (same arguments) built for ``platform`` (one of
    :data:`jaxgossip.ops.platforms.PLATFORMS`; None: the backend JAX runs on), not yet run: a
    :class:`SweepProgram`."""
    check_axes(axes, getattr(config, "config", config).algorithm)
    prep = config if isinstance(config, Resolved) else resolve(config, dataset, platform)
    config = prep.config
    tables = link_tables(config, axes, seeds, prep.topology)
    # a link axis with specs is swept by the index of its value; its links are rows of its table
    indexed = {name: (list(range(len(v))) if name.split(".")[-1] in tables else v) for name, v in axes.items()}
    points = grid(indexed)
    labels = {
        name: np.asarray([tables[name.split(".")[-1]].labels[int(i)] for i in v], object)
        if name.split(".")[-1] in tables
        else v
        for name, v in points.items()
    }

    def one(key, point, rows):
        point = dict(point)
        for field, table in tables.items():
            index = point.pop(f"time.{field}").astype(jnp.int32) if f"time.{field}" in point else 0
            point[f"time.{field}"] = table.links(rows[field][index])
        trainer, _ = make_trainer(apply_point(config, point), prep)
        return trainer.train(key)[1]

    args = (
        jnp.stack([jax.random.key(int(s)) for s in seeds]),
        {k: jnp.asarray(v) for k, v in points.items()},
        {field: jnp.asarray(table.values, jnp.result_type(float)) for field, table in tables.items()},
    )
    if prep.mesh is not None:  # the program runs on the mesh's devices (sharding.replicate says why)
        args = sharding.replicate(args, prep.mesh)
    # seeds inside (a table's axis 1 is the seed), grid points outside
    run = jax.jit(jax.vmap(jax.vmap(one, in_axes=(0, None, 1)), in_axes=(None, 0, None)))
    return SweepProgram(labels, run, args)


def sweep_topologies_training(
    config,
    topologies: Sequence[Topology],
    seeds: Sequence[int],
    dataset=None,
    per_graph: Callable[[Topology], Mapping[str, float]] | None = None,
    stack: bool = True,
):
    """Trains ``config`` on every graph x seed, one compile per group of same-shape graphs.

    Graph g with seed s runs exactly like ``run_training`` of ``config.replace(seed=s)`` with the
    topology replaced by ``topologies[g]`` (and ``per_graph(topologies[g])`` merged into the
    algorithm options); data partition from ``config.data_seed`` (or ``config.seed``) shared by
    all. Every graph needs ``config.num_nodes`` nodes.

    With Byzantine attackers (``config.byzantine``) every graph runs on its own: the attack's edge
    tables are built on the host from each graph's slots, which a stack of graphs holds traced.

    Returns:
      ``(metrics, groups)``: metrics a list over graphs of ``Metrics`` with leaves
      ``[S, num_evals, ...]``; groups the compile groups (lists of graph indices).
    """
    from jaxgossip.run.groups import byzantine_args

    prep = config if isinstance(config, Resolved) else resolve(config, dataset)
    config = prep.config
    for topo in topologies:
        if isinstance(topo, Topology) and topo.num_nodes != config.num_nodes:
            raise ValueError(f"{topo.name} has N={topo.num_nodes} nodes but config.num_nodes={config.num_nodes}")
    keys = jnp.stack([jax.random.key(int(s)) for s in seeds])
    if prep.mesh is not None:  # the program runs on the mesh's devices (sharding.replicate says why)
        keys = sharding.replicate(keys, prep.mesh)

    def one(topo, point, key):
        options = {**config.algorithm_options, **point}
        trainer, _ = make_trainer(config.replace(algorithm_options=options), prep._replace(topology=topo))
        return trainer.train(key)[1]

    stack = stack and byzantine_args(config) is None
    metrics, groups, _ = map_topologies(
        one, topologies, keys, algorithm=config.algorithm, per_graph=per_graph, stack=stack
    )
    return metrics, groups
