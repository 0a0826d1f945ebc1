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

from jaxgossip.engine.sweeps import check_axes, grid, map_topologies
from jaxgossip.ops import sharding
from jaxgossip.run.resolve import Resolved, resolve
from jaxgossip.run.runner import make_trainer
from jaxgossip.topology import Topology

__all__ = ["SweepProgram", "sweep_training", "sweep_program", "sweep_topologies_training", "apply_point"]


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
      points: name -> [G] grid values.
      run: the jitted ``run(keys [S], values {name: [G]}) -> Metrics`` (leaves [G, S, ...]).
      args: ``(keys, values)``: ``run(*args)`` is the sweep; ``jax.export.export(run, ...)(*args)``
        lowers it for another platform.
    """

    points: dict
    run: Callable
    args: tuple


def sweep_program(config, axes: Mapping[str, Sequence[Any]], seeds: Sequence[int], dataset=None, platform=None):
    """The program of :func:`sweep_training` (same arguments) built for ``platform`` (one of
    :data:`jaxgossip.ops.platforms.PLATFORMS`; None: the backend JAX runs on), not yet run: a
    :class:`SweepProgram`."""
    check_axes(axes, getattr(config, "config", config).algorithm)
    points = grid(axes)
    prep = config if isinstance(config, Resolved) else resolve(config, dataset, platform)
    config = prep.config

    def one(key, point):
        trainer, _ = make_trainer(apply_point(config, point), prep)
        return trainer.train(key)[1]

    args = (jnp.stack([jax.random.key(int(s)) for s in seeds]), {k: jnp.asarray(v) for k, v in points.items()})
    if prep.mesh is not None:  # the program runs on the mesh's devices (sharding.replicate says why)
        args = sharding.replicate(args, prep.mesh)
    run = jax.jit(jax.vmap(jax.vmap(one, in_axes=(0, None)), in_axes=(None, 0)))
    return SweepProgram(points, run, args)


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
