"""Sweeps in one compile equal the individual runs; shape-changing axes are refused by name."""

import jax
import numpy as np
import pytest
from tiny import tiny_config

import jaxgossip as jg
from jaxgossip import experiment_sweeps, sweeps
from jaxgossip.runner import run_training


def _config(**changes):
    return tiny_config(**{"num_rounds": 10, "evals_per_chunk": 2, **changes})


def test_training_sweep_equals_individual_runs():
    config = _config(
        algorithm="choco", algorithm_options={"compressor": "top_k", "compressor_options": {"fraction": 0.5}}
    )
    axes = {"lr": [0.02, 0.1], "algorithm_options.gamma": [0.3, 0.8]}
    points, metrics = experiment_sweeps.sweep_training(config, axes, seeds=[0, 1])
    assert np.asarray(metrics.test_acc).shape == (4, 2, 2)
    for g in (0, 3):
        for s_index, seed in enumerate((0, 1)):
            single = config.replace(
                lr=float(points["lr"][g]),
                algorithm_options={**config.algorithm_options, "gamma": float(points["algorithm_options.gamma"][g])},
                seed=seed,
                data_seed=config.seed,
            )
            rows = run_training(single, None, progress=False, log=lambda s: None).rows
            np.testing.assert_allclose(
                np.asarray(metrics.test_loss)[g, s_index], [r["test_loss"] for r in rows], rtol=1e-4, atol=1e-5
            )
    rows = sweeps.summarize(points, metrics)
    assert len(rows) == 4 and {"lr", "algorithm_options.gamma", "test_acc", "test_acc_std"} <= set(rows[0])


def test_consensus_sweep_equals_individual_runs():
    topo = jg.topology.ring(8)
    x0 = {"x": jax.random.normal(jax.random.key(0), (8, 5, 4))}
    keys = jax.random.split(jax.random.key(1), 2)
    make = lambda gamma: jg.algorithms.make("choco", topo, gamma=gamma, compressor="sign")  # noqa: E731
    points, errors, bits = sweeps.sweep_consensus(make, x0, 30, keys, gamma=[0.05, 0.2, 0.6])
    assert errors.shape == (3, 2, 31) and bits.shape == (3, 2, 30)
    for g, gamma in enumerate(points["gamma"]):
        single = jg.run_consensus(make(float(gamma)), x0, 30, keys[1])
        np.testing.assert_allclose(np.asarray(errors[g, 1]), np.asarray(single.error), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "axis, match",
    [
        ("algorithm_options.fraction", "fraction.*change array shapes.*top-k"),
        ("algorithm_options.rank", "rank.*PowerGossip rank"),
        ("num_nodes", "num_nodes.*leading axis"),
        ("batch_size", "batch_size"),
        ("momentum", "momentum"),
    ],
)
def test_shape_changing_axes_are_refused_by_name(axis, match):
    with pytest.raises(ValueError, match=match):
        sweeps.check_axes({axis: [1, 2]})


def test_bad_axis_values():
    with pytest.raises(ValueError, match="at least one axis"):
        sweeps.check_axes({})
    with pytest.raises(ValueError, match="non-empty list"):
        sweeps.check_axes({"lr": []})
    with pytest.raises(ValueError, match="NaN"):
        sweeps.check_axes({"lr": [0.1, float("nan")]})
