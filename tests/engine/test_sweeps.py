"""Tests for jaxgossip.engine.sweeps: sweeps in one compile (training, consensus, and topology sweeps over
stacked graphs) equal the individual runs; shape-changing axes are refused by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import static_graphs_16
from tiny import tiny_config

import jaxgossip as jg
from jaxgossip import algorithms
from jaxgossip import topology as T
from jaxgossip.engine import sweeps
from jaxgossip.engine.consensus import consensus_scan
from jaxgossip.run import training_sweeps
from jaxgossip.run.runner import run_training


def _config(**changes):
    return tiny_config(**{"num_rounds": 10, "evals_per_chunk": 2, **changes})


def test_training_sweep_equals_individual_runs():
    config = _config(
        algorithm="choco", algorithm_options={"compressor": "top_k", "compressor_options": {"fraction": 0.5}}
    )
    axes = {"lr": [0.02, 0.1], "algorithm_options.gamma": [0.3, 0.8]}
    points, metrics = training_sweeps.sweep_training(config, axes, seeds=[0, 1])
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


def _individual(name, topo, seeds, dim, steps, options):
    """One run per seed of ``name`` on ``topo`` alone: [(error, round_bits)] (the seeds share one
    compile of the single-graph program, nothing else)."""
    alg = algorithms.make(name, topo, **options)
    run = jax.jit(lambda x0, key: consensus_scan(alg, x0, steps, key))
    out = []
    for seed in seeds:
        key_x, key_a = jax.random.split(jax.random.key(seed))
        trace = run(jax.random.normal(key_x, (topo.num_nodes, dim), jnp.float32), key_a)
        out.append((np.asarray(trace.error), np.asarray(trace.round_bits)))
    return out


@pytest.mark.parametrize(
    "name, topos, options, per_graph",
    [
        ("gossip", static_graphs_16() + [T.one_peer_exponential(16), T.ring(8), T.complete(8), T.star(40)], {}, None),
        (
            "choco",
            [T.ring(8), T.torus(2, 4)],
            {"compressor": "random_k", "compressor_options": {"fraction": 0.25}},
            lambda t: {"gamma": 0.1 * t.out_degree.mean()},
        ),
        (
            "push_sum",
            [T.make("random_directed:0.4", 8, seed=3), T.make("random_directed:0.25", 8, seed=4), T.directed_ring(8)],
            {},
            None,
        ),
        ("power_gossip", [T.ring(8), T.torus(2, 4)], {"rank": 1}, None),  # one compile per graph
    ],
)
def test_sweep_topologies_equals_individual_runs(name, topos, options, per_graph):
    seeds, dim, steps = [0, 3], 6, 25
    result = sweeps.sweep_topologies(
        name, topos, dim=dim, num_steps=steps, seeds=seeds, options=options, per_graph=per_graph
    )
    if jg.algorithms.info(name).graph.stackable:
        assert len(result.groups) < len(topos)  # some graphs shared a compile
    else:
        assert result.groups == [[i] for i in range(len(topos))]
    for g, topo in enumerate(topos):
        extra = dict(per_graph(topo)) if per_graph else {}
        for s, (errors, bits) in enumerate(_individual(name, topo, seeds, dim, steps, {**options, **extra})):
            scale = errors[0]
            np.testing.assert_allclose(result.error[g][s], errors, rtol=1e-4, atol=1e-5 * scale)
            np.testing.assert_allclose(result.bits[g][s], bits, rtol=1e-6)
    # stack=False gives the same numbers one graph at a time
    single = sweeps.sweep_topologies(
        name, topos[:2], dim=dim, num_steps=steps, seeds=seeds, options=options, per_graph=per_graph, stack=False
    )
    assert single.groups == [[0], [1]]
    for g in range(2):
        scale = float(result.error[g][:, 0].max())
        np.testing.assert_allclose(single.error[g], result.error[g], rtol=1e-4, atol=1e-5 * scale)


def test_topology_rows_hand_computed():
    dim, steps = 4, 6
    topos = [T.complete(8), T.ring(8)]
    result = sweeps.sweep_topologies("gossip", topos, dim=dim, num_steps=steps, seeds=[0, 1])
    rows = sweeps.topology_rows(result, tol=1e-6)
    complete, ring = rows
    # complete graph with uniform weights averages in one round: 7 messages of 32 D bits per node
    assert complete["rounds_to_tol"] == 1.0
    assert complete["MB_to_tol"] == pytest.approx(7 * 32 * dim / 8e6)
    assert complete["MB_per_node"] == pytest.approx(steps * 7 * 32 * dim / 8e6)
    assert complete["spectral_gap"] == pytest.approx(1.0) and ring["spectral_gap"] == pytest.approx(
        T.spectral_gap(topos[1])
    )
    # ring(8): relative error after R rounds is at most (1 - gap)^(2R)
    assert (
        np.isnan(ring["rounds_to_tol"]) and 0 < ring["final_error"] <= (1 - ring["spectral_gap"]) ** (2 * steps) + 1e-6
    )
    assert ring["MB_per_node"] == pytest.approx(steps * 2 * 32 * dim / 8e6)
    assert complete["group"] != ring["group"] and ring["group_size"] == 1


def test_sweep_topologies_bad_input():
    with pytest.raises(ValueError, match="unknown algorithm 'gosip'"):
        sweeps.sweep_topologies("gosip", [T.ring(8)], dim=2, num_steps=2, seeds=[0])
    with pytest.raises(ValueError, match="at least one topology"):
        sweeps.sweep_topologies("gossip", [], dim=2, num_steps=2, seeds=[0])
    with pytest.raises(TypeError, match="topologies\\[1\\] is a str"):
        sweeps.sweep_topologies("gossip", [T.ring(8), "ring"], dim=2, num_steps=2, seeds=[0])
    with pytest.raises(ValueError, match="dim=0"):
        sweeps.sweep_topologies("gossip", [T.ring(8)], dim=0, num_steps=2, seeds=[0])
    with pytest.raises(ValueError, match="seeds"):
        sweeps.sweep_topologies("gossip", [T.ring(8)], dim=2, num_steps=2, seeds=[])
    with pytest.raises(ValueError, match="per_graph returned keys"):
        sweeps.sweep_topologies(
            "gossip",
            [T.ring(8), T.torus(2, 4)],
            dim=2,
            num_steps=2,
            seeds=[0],
            per_graph=lambda t: {"gamma": 1.0} if t.name == "ring(8)" else {},
        )


def test_training_topology_sweep_equals_individual_runs():
    config = tiny_config(num_rounds=10, evals_per_chunk=2, num_nodes=8)
    topos = [T.ring(8), T.torus(2, 4), T.exponential(8)]
    metrics, groups = training_sweeps.sweep_topologies_training(config, topos, seeds=[0, 1])
    assert groups == [[0, 1, 2]]
    for g in (0, 2):
        spec = {0: "ring", 2: "exponential"}[g]
        rows = run_training(
            config.replace(topology=spec, seed=1, data_seed=config.seed), None, progress=False, log=lambda s: None
        ).rows
        np.testing.assert_allclose(metrics[g].test_loss[1], [r["test_loss"] for r in rows], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(metrics[g].bits[1, -1].mean() / 8e6, rows[-1]["MB_per_node"], rtol=1e-5)
    with pytest.raises(ValueError, match="N=16 nodes but config.num_nodes=8"):
        training_sweeps.sweep_topologies_training(config, [T.ring(16)], seeds=[0])


@pytest.mark.parametrize("algorithm", ["push_sum", "sparse_push"])
def test_sweeps_over_a_time_varying_graph_on_two_devices_equal_one_device(algorithm):
    # A traced round of the one-peer exponential graph on a "nodes" mesh mixes by shard_map; the sweep
    # programs hold the sharded data as constants, so their arguments go on the mesh (sharding.replicate).
    if len(jax.devices()) < 2:
        pytest.skip("needs 2 devices (tests/conftest.py requests 8 CPU devices)")
    options = {"fraction": 0.3, "gamma": 0.5} if algorithm == "sparse_push" else {}
    config = _config(num_nodes=8, algorithm=algorithm, topology="one_peer_exponential", algorithm_options=options)
    _, one = training_sweeps.sweep_training(config, {"lr": [0.05, 0.1]}, seeds=[0, 1])
    _, two = training_sweeps.sweep_training(config.replace(devices=2), {"lr": [0.05, 0.1]}, seeds=[0, 1])
    np.testing.assert_allclose(np.asarray(two.test_loss), np.asarray(one.test_loss), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(two.bits), np.asarray(one.bits))
    topos = [T.one_peer_exponential(8)]
    one, _ = training_sweeps.sweep_topologies_training(config, topos, seeds=[0, 1])
    two, _ = training_sweeps.sweep_topologies_training(config.replace(devices=2), topos, seeds=[0, 1])
    np.testing.assert_allclose(np.asarray(two[0].test_loss), np.asarray(one[0].test_loss), rtol=1e-5, atol=1e-6)


def test_an_algorithms_own_traced_option_is_a_training_sweep_axis_of_that_algorithm_only():
    """SPARTA declares ``fraction`` traced (SweepFacts.traced_options): one compile over p equals the
    single runs; Sparse-Push's ``fraction`` (its K) and gossip's absent one are refused by name."""
    config = _config(algorithm="sparta", algorithm_options={"fraction": 0.3})
    assert "algorithm_options.fraction" in sweeps.sweepable("sparta")
    assert "algorithm_options.fraction" not in sweeps.SWEEPABLE + sweeps.sweepable("sparse_push")
    points, metrics = training_sweeps.sweep_training(config, {"algorithm_options.fraction": [0.1, 1.0]}, seeds=[0])
    for g, fraction in enumerate(np.asarray(points["algorithm_options.fraction"])):
        single = config.replace(algorithm_options={"fraction": float(fraction)}, data_seed=config.seed)
        rows = run_training(single, None, progress=False, log=lambda s: None).rows
        np.testing.assert_allclose(
            np.asarray(metrics.test_loss)[g, 0], [r["test_loss"] for r in rows], rtol=1e-4, atol=1e-5
        )
        np.testing.assert_allclose(np.asarray(metrics.bits)[g, 0].mean(-1), [r["bits_mean"] for r in rows], rtol=1e-6)
    # more coordinates averaged: closer models
    assert np.asarray(metrics.consensus)[1, 0, -1] < np.asarray(metrics.consensus)[0, 0, -1]
    with pytest.raises(ValueError, match="'algorithm_options.fraction' would change array shapes"):
        sweeps.check_axes({"algorithm_options.fraction": [0.1, 0.2]}, "sparse_push")
