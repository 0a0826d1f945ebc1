"""Consensus step-size tuning: the largest gamma at which a compressed gossip method still contracts.

Compressed gossip (Choco, DeepSqueeze, Sparse-Push, ...) needs a consensus step size ``gamma`` small
enough for its compressor and graph; too large and the consensus distance grows geometrically while
the node mean stays put (experiments/studies/dirichlet.md, "Mode A"). Which gamma is too
large depends on the compressor, the graph *and* the leaf shapes (top-k keeps a fraction of each
leaf), so :func:`tune_gamma` measures it on the actual configuration with communication only: one
:func:`jaxgossip.engine.sweeps.sweep_consensus` program, vmapped over a grid of gammas.

The test (documented in :func:`tune_gamma`):

* start: every node's every leaf i.i.d. ``N(0, 1 / D_leaf)`` (so that each leaf starts with the
  same squared spread and a small leaf that diverges is not hidden behind a large one that
  contracts; the compressors are scale-equivariant, so the scale itself changes nothing);
* a gamma *contracts* if after R rounds the consensus error is finite, below its start and still
  falling over the second half (``e_R < e_{R/2}``), or has converged (``e_R <= 1e-6 e_0``: a run that
  reaches float32 round-off then only jitters, e.g. Choco-sign at gamma 1, measured 1.3e-9);
* the *largest contracting* gamma is the top of the run of contracting grid values that starts at
  the smallest one (a lucky contracting value above a diverging one does not count);
* the *recommendation* is the largest contracting gamma divided by ``safety`` (2.5 by default,
  within the "divide by 2-3" rule of thumb): training adds gradient noise and drift that consensus
  alone does not have, and the grid only brackets the edge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip import algorithms
from jaxgossip.engine import sweeps
from jaxgossip.topology import Topology

__all__ = ["GammaTuning", "tune_gamma", "model_shapes", "tuning_rows", "DEFAULT_GAMMAS", "CONVERGED"]

# 31 values from 1e-3 to 1, 1.26x apart.
DEFAULT_GAMMAS = tuple(float(g) for g in np.geomspace(1e-3, 1.0, 31))
# Relative error at which a run counts as converged: below it the error only jitters at float32
# round-off (Choco-sign on the 8-ring ends near 1e-9 with a second half that no longer falls).
CONVERGED = 1e-6


class GammaTuning(NamedTuple):
    """Outcome of :func:`tune_gamma` over G step sizes and R rounds.

    Attributes:
      algorithm: the algorithm's name (or import path).
      option: the swept option (the algorithm metadata's ``step_size``, e.g. ``"gamma"``).
      gammas: [G] the grid, ascending.
      error: [G, R + 1] consensus error ``(1/N) sum_i ||debias(x)_i - mean(x0)||^2`` per round.
      rate: [G] per-round factor of the error over the second half,
        ``(e_R / e_{R/2})^(1 / (R - R/2))`` (< 1 contracts; 0 once converged, see ``CONVERGED``; NaN if
        the run diverged to NaN/inf).
      contracts: [G] bool, the contraction test of the module docstring.
      largest_contracting: the largest gamma of the contracting run from the bottom of the grid, or
        None if the smallest gamma does not contract.
      recommended: ``largest_contracting / safety`` (2 significant digits), or None.
      safety: the divisor.
      num_steps: R.
      bits_per_round: [G] mean bits a node sends per round.
      note: "" or a warning about the grid (nothing contracts, or everything does).
    """

    algorithm: str
    option: str
    gammas: np.ndarray
    error: np.ndarray
    rate: np.ndarray
    contracts: np.ndarray
    largest_contracting: float | None
    recommended: float | None
    safety: float
    num_steps: int
    bits_per_round: np.ndarray
    note: str = ""


def model_shapes(model: str, input_shape: Sequence[int], num_classes: int = 10, **model_options) -> Any:
    """One node's parameter shapes of a registered model (a pytree of ``jax.ShapeDtypeStruct``;
    nothing is initialised), for :func:`tune_gamma`.

    Args:
      model: a name of :data:`jaxgossip.models.REGISTRY` (``"cnn"``, ``"resnet20"``, ...).
      input_shape: one sample's shape, e.g. ``(28, 28, 1)``.
      num_classes: output classes.
      **model_options: the model's options (``features=[16, 32]``, ...).
    """
    from jaxgossip import models

    fns = models.as_model_fns(models.make_model(model, num_classes=num_classes, **model_options))
    example = jax.ShapeDtypeStruct((1, *tuple(int(d) for d in input_shape)), jnp.float32)
    params, _ = jax.eval_shape(fns.init, jax.random.key(0), example)
    return params


def _leaf_shapes(shapes: Any) -> tuple[Any, list[tuple[int, ...]]]:
    """``(treedef, leaf shapes)`` of ``shapes`` (an int D, one shape, or a pytree of arrays / structs)."""
    if isinstance(shapes, bool):
        raise TypeError(f"shapes={shapes!r} must be an int D, a shape tuple or a pytree of arrays")
    if isinstance(shapes, (int, np.integer)):
        shapes = (int(shapes),)
    if isinstance(shapes, (tuple, list)) and shapes and all(isinstance(d, (int, np.integer)) for d in shapes):
        if any(isinstance(d, bool) or d < 1 for d in shapes):
            raise ValueError(f"shapes={list(shapes)} must hold sizes >= 1")
        return jax.tree_util.tree_structure({"x": 0}), [tuple(int(d) for d in shapes)]
    leaves, treedef = jax.tree_util.tree_flatten(shapes)
    if not leaves or not all(hasattr(leaf, "shape") for leaf in leaves):
        raise TypeError(
            "shapes must be an int D, a shape tuple such as (100, 100), or a pytree of arrays / "
            "jax.ShapeDtypeStruct (one node's params, e.g. jaxgossip.engine.tuning.model_shapes('cnn', (28, 28, 1)))"
        )
    return treedef, [tuple(int(d) for d in leaf.shape) for leaf in leaves]


def _spread_out(shapes: tuple[Any, list], num_nodes: int, key: jax.Array) -> Any:
    """x0: every leaf i.i.d. N(0, 1 / D_leaf) per node, leaves [N, *shape]."""
    treedef, leaves = shapes
    keys = jax.random.split(key, len(leaves))
    out = [
        jax.random.normal(k, (num_nodes, *shape), jnp.float32) / math.sqrt(max(1, math.prod(shape)))
        for k, shape in zip(keys, leaves)
    ]
    return jax.tree_util.tree_unflatten(treedef, out)


def _contraction(error: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rate [G], contracts [G])`` of errors [G, R + 1] (the rule of the module docstring)."""
    steps = error.shape[1] - 1
    mid = steps // 2
    e0, e_mid, e_end = error[:, 0], error[:, mid], error[:, -1]
    finite = np.isfinite(error).all(axis=1)
    converged = finite & (e_end <= CONVERGED * e0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rate = np.where(converged, 0.0, (e_end / e_mid) ** (1.0 / max(1, steps - mid)))
    rate = np.where(finite, rate, np.nan)
    contracts = converged | (finite & (e_end < e0) & (e_end < e_mid))
    return rate, contracts


def tune_gamma(
    algorithm: str,
    topology: Topology,
    shapes: Any,
    *,
    options: Mapping[str, Any] | None = None,
    gammas: Sequence[float] | None = None,
    num_steps: int = 1000,
    seed: int = 0,
    safety: float = 2.5,
) -> GammaTuning:
    """The largest consensus step size at which ``algorithm`` contracts on ``topology``, and a
    recommendation, from one vmapped consensus sweep over a grid of step sizes.

    Every grid value runs R = ``num_steps`` communication rounds of ``algorithm`` (no gradients)
    from the same spread-out start (each leaf of each node i.i.d. ``N(0, 1 / D_leaf)``; key
    ``key_x`` of ``key_x, key_alg = split(key(seed))``, the algorithm's randomness from
    ``key_alg``), all in one :func:`jaxgossip.engine.sweeps.sweep_consensus` program. A value contracts if
    the consensus error ends finite, below its start and still falling over the second half, or
    below ``CONVERGED`` (1e-6) times its start; the largest contracting value is the top of the
    contracting run from the smallest grid value; the recommendation is that divided by ``safety``.
    Use enough rounds for the compressor to act: with top-k at fraction f, several times 1/f (1000
    for 1 %: at gamma 0.1 Choco top-1 % on the 8-ring falls for 400 rounds before it grows).

    Args:
      algorithm: a registered name or import path whose metadata names its step size
        (:attr:`~jaxgossip.types.SweepFacts.step_size`).
      topology: the graph (N nodes).
      shapes: the per-node model: an int D, one shape such as ``(100, 100)``, or a pytree of arrays
        or ``jax.ShapeDtypeStruct`` (one node's params; :func:`model_shapes` builds it from a model
        name). Top-k and friends compress per leaf, so leaf shapes matter.
      options: the algorithm's other options (compressor, fraction, ...), without the step size.
      gammas: the grid (> 0; default :data:`DEFAULT_GAMMAS`, 1e-3 .. 1).
      num_steps: R rounds (>= 4).
      seed: seed of x0 and the algorithm's randomness.
      safety: the divisor of the recommendation (>= 1).

    Returns:
      :class:`GammaTuning`.

    Raises:
      ValueError: an algorithm without a step size, ``options`` that set it, bad grid, rounds,
        safety or shapes, or options / graph the algorithm refuses (its own message).
    """
    entry = algorithms.resolve(algorithm)
    option = entry.sweep.step_size
    if option is None:
        tunable = [name for name, i in algorithms.INFOS.items() if i.sweep.step_size is not None]
        raise ValueError(
            f"algorithm {algorithm!r} declares no consensus step size in its metadata (SweepFacts.step_size); "
            f"algorithms with one: {', '.join(tunable)}"
        )
    options = dict(options or {})
    if option in options:
        raise ValueError(f"options must not set {option!r}: it is the step size tune_gamma sweeps")
    grid = np.sort(np.asarray(DEFAULT_GAMMAS if gammas is None else list(gammas), dtype=np.float64))
    if grid.ndim != 1 or grid.size < 2 or not np.all(np.isfinite(grid)) or np.any(grid <= 0):
        raise ValueError(f"gammas={list(np.atleast_1d(grid))} must be at least 2 finite values > 0")
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 4:
        raise ValueError(f"num_steps={num_steps!r} must be an int >= 4")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed={seed!r} must be an int >= 0")
    if not isinstance(safety, (int, float)) or isinstance(safety, bool) or not (safety >= 1 and math.isfinite(safety)):
        raise ValueError(f"safety={safety!r} must be a number >= 1")
    leaf_shapes = _leaf_shapes(shapes)
    # Build once with a concrete value, so a bad option or graph fails here with its own message.
    algorithms.make(algorithm, topology, **options, **{option: float(grid[0])})

    key_x, key_alg = jax.random.split(jax.random.key(int(seed)))
    x0 = _spread_out(leaf_shapes, topology.num_nodes, key_x)

    def make_alg(**point):
        return algorithms.make(algorithm, topology, **options, **point)

    _, error, bits = sweeps.sweep_consensus(make_alg, x0, int(num_steps), key_alg[None], **{option: grid})
    error = np.asarray(error, dtype=np.float64)[:, 0]  # [G, R + 1]
    bits = np.asarray(bits, dtype=np.float64)[:, 0]  # [G, R]
    rate, contracts = _contraction(error)
    run = int(np.argmin(contracts)) if not contracts.all() else grid.size  # contracting run from the bottom
    largest = float(grid[run - 1]) if run > 0 else None
    recommended = float(f"{largest / safety:.2g}") if largest is not None else None
    note = ""
    if largest is None:
        note = (
            f"no gamma contracts, not even {grid[0]:.3g}: extend the grid downwards or run more rounds "
            f"(num_steps={num_steps})"
        )
    elif run == grid.size:
        note = f"every gamma up to {grid[-1]:.3g} contracts: the edge may lie above the grid; extend it upwards"
    return GammaTuning(
        algorithm=algorithm,
        option=option,
        gammas=grid,
        error=error,
        rate=rate,
        contracts=contracts,
        largest_contracting=largest,
        recommended=recommended,
        safety=float(safety),
        num_steps=int(num_steps),
        bits_per_round=bits.mean(axis=1) / topology.num_nodes,
        note=note,
    )


def tuning_rows(result: GammaTuning) -> list[dict]:
    """One row per grid value: gamma, final relative error ``e_R / e_0``, per-round rate over the
    second half, whether it contracts, and a mark for the largest contracting and recommended value."""
    rows = []
    for g, gamma in enumerate(result.gammas):
        e0, end = result.error[g, 0], result.error[g, -1]
        mark = []
        if result.largest_contracting is not None and math.isclose(gamma, result.largest_contracting):
            mark.append("largest contracting")
        rows.append(
            {
                result.option: float(gamma),
                "final_rel_error": float(end / e0) if np.isfinite(end) and e0 > 0 else None,
                "rate": float(result.rate[g]) if np.isfinite(result.rate[g]) else None,
                "contracts": bool(result.contracts[g]),
                "mark": ", ".join(mark),
            }
        )
    if result.recommended is not None:
        rows.append(
            {
                result.option: result.recommended,
                "final_rel_error": None,
                "rate": None,
                "contracts": None,
                "mark": f"recommended (largest / {result.safety:g})",
            }
        )
    return rows
