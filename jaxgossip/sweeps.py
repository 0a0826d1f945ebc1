"""Sweeps in one compile: ``vmap`` a whole training or consensus run over seeds x hyperparameters.

Only hyperparameters that are *values* (traced arrays) can share one compiled program: the learning
rate, weight decay, and consensus step sizes such as ``gamma``. Anything that fixes an array shape
(node count, batch size, rounds, model, graph, top-k fraction or k, PowerGossip rank or
iterations, ...) needs separate runs; asking to sweep it raises a ``ValueError`` naming the axis.

Grid points are the Cartesian product of the axes; seeds are an inner axis, so results have shape
``[G, S]`` (G grid points, S seeds) and equal the corresponding individual runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.consensus import consensus_scan
from jaxgossip.types import GossipAlgorithm, Params

__all__ = [
    "SWEEPABLE",
    "grid",
    "check_axes",
    "sweep_training",
    "sweep_consensus",
    "summarize",
]

# Config fields that are traced values inside a run and may therefore be vmapped.
SWEEPABLE = (
    "lr",
    "weight_decay",
    "warmup_from",
    "algorithm_options.gamma",
    "algorithm_options.vector_gamma",
    "algorithm_options.target_residual",
)

# Why a common request cannot be swept in one compile.
_SHAPE_REASONS = {
    "algorithm_options.fraction": "top-k keeps K = floor(fraction * D) entries, a static shape",
    "algorithm_options.k": "top-k keeps K entries, a static shape",
    "algorithm_options.compressor_options": "compressor options fix the kept entries, a static shape",
    "algorithm_options.rank": "the PowerGossip rank R fixes the shapes of U [P, m, R] and V [P, n, R]",
    "algorithm_options.num_iterations": "PowerGossip iterations are unrolled per round",
    "num_nodes": "N is the leading axis of every array",
    "batch_size": "B fixes the batch shape",
    "num_rounds": "the scan length is static",
    "topology": "the graph's index tables are compile-time constants",
    "model": "the model fixes the parameter shapes",
    "momentum": "momentum None vs a value selects the optimizer's structure",
}


def check_axes(axes: Mapping[str, Sequence[Any]]) -> None:
    """Raises ValueError for an axis that cannot be swept in one compile (the message names it)."""
    if not axes:
        raise ValueError("a sweep needs at least one axis, e.g. {'lr': [0.01, 0.1]}")
    for name, values in axes.items():
        if name not in SWEEPABLE:
            why = _SHAPE_REASONS.get(name, "it is not a traced value of the run")
            raise ValueError(
                f"sweep axis {name!r} would change array shapes or program structure ({why}); sweep it "
                f"with separate runs. Axes that share one compile: {list(SWEEPABLE)}"
            )
        values = np.asarray(values, dtype=np.float64)
        if values.ndim != 1 or values.size == 0:
            raise ValueError(f"sweep axis {name!r} needs a non-empty list of numbers, got {values!r}")
        if not np.all(np.isfinite(values)):
            raise ValueError(f"sweep axis {name!r} has NaN or inf values")


def grid(axes: Mapping[str, Sequence[Any]]) -> dict[str, np.ndarray]:
    """Cartesian product of the axes: name -> [G] float32 values (last axis fastest)."""
    names = list(axes)
    points = list(itertools.product(*(list(axes[n]) for n in names)))
    return {n: np.asarray([p[i] for p in points], dtype=np.float32) for i, n in enumerate(names)}


def _apply(config, point: Mapping[str, Any]):
    changes, options = {}, dict(config.algorithm_options)
    for name, value in point.items():
        if name.startswith("algorithm_options."):
            options[name.split(".", 1)[1]] = value
        else:
            changes[name] = value
    return config.replace(algorithm_options=options, **changes)


def sweep_training(config, axes: Mapping[str, Sequence[Any]], seeds: Sequence[int], dataset=None):
    """Trains ``config`` for every grid point x seed in one jitted, doubly vmapped program.

    Args:
      config: a :class:`jaxgossip.runner.TrainConfig`.
      axes: name -> values, names from :data:`SWEEPABLE` (e.g. ``{"lr": [...],
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
    from jaxgossip.runner import make_trainer, prepare

    check_axes(axes)
    points = grid(axes)
    prep = prepare(config, dataset)

    def one(key, point):
        trainer, _ = make_trainer(_apply(config, point), prep)
        return trainer.train(key)[1]

    keys = jnp.stack([jax.random.key(int(s)) for s in seeds])
    run = jax.jit(jax.vmap(jax.vmap(one, in_axes=(0, None)), in_axes=(None, 0)))
    metrics = run(keys, {k: jnp.asarray(v) for k, v in points.items()})
    return points, metrics


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
        errors, bits, _, _ = consensus_scan(make_alg(**point), x0, num_steps, key)
        return errors, bits

    run = jax.jit(jax.vmap(jax.vmap(one, in_axes=(0, None)), in_axes=(None, 0)))
    errors, bits = run(keys, {k: jnp.asarray(v) for k, v in points.items()})
    return points, errors, bits


def summarize(points: Mapping[str, np.ndarray], metrics) -> list[dict]:
    """One row per grid point: the axes' values and mean / std over seeds of the final metrics."""
    rows = []
    final = {name: np.asarray(value)[:, :, -1] for name, value in metrics._asdict().items() if name != "bits"}
    bits = np.asarray(metrics.bits)[:, :, -1]  # [G, S, N]
    for g in range(next(iter(points.values())).shape[0]):
        row = {name: float(values[g]) for name, values in points.items()}
        for name in ("test_acc", "test_loss", "node_acc_mean", "consensus", "train_loss"):
            row[name] = float(final[name][g].mean())
            row[name + "_std"] = float(final[name][g].std())
        row["MB_per_node"] = float(bits[g].mean() / 8e6)
        rows.append(row)
    return rows
