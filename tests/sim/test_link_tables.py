"""Link specs as sweep values (jaxgossip.sim.link_tables): every grid point and seed of a sweep
over --time.latency / --time.bandwidth / --time.downlink specs equals the single run of that value
and seed bit for bit (per-node, per-round, per-edge layouts), a seed-drawn spec that is not swept
is drawn per seed, the command line joins a spec's own commas, and values with no common layout or
that do not fit the graph exit 2 naming them."""

import functools

import numpy as np
import pytest
from tiny import TINY_FLAGS, tiny_config

from jaxgossip.run.runner import run_training
from jaxgossip.run.training_sweeps import sweep_training
from jaxgossip.sim.link_specs import join_link_tokens, link_values, parse_link
from jaxgossip.sim.link_tables import link_table

BASE = {"compute": 0.01, "latency": 1e-3, "bandwidth": 1e6}


def _alone(config, seed, **time):
    run = config.replace(seed=seed, data_seed=config.resolved_data_seed, time={**config.time, **time})
    return run_training(run, progress=False, log=lambda _: None).metrics


def _assert_points_equal_runs(config, name, values, seeds):
    points, metrics = sweep_training(config, {f"time.{name}": values}, seeds)
    assert list(points[f"time.{name}"]) == [v if isinstance(v, str) else float(v) for v in values]
    times = []
    for g, value in enumerate(values):
        for s, seed in enumerate(seeds):
            alone = _alone(config, seed, **{name: value})
            np.testing.assert_array_equal(np.asarray(metrics.sim_time)[g, s], np.asarray(alone.sim_time))
            np.testing.assert_array_equal(np.asarray(metrics.comm_time)[g, s], np.asarray(alone.comm_time))
            np.testing.assert_array_equal(np.asarray(metrics.test_acc)[g, s], np.asarray(alone.test_acc))
            times.append(float(np.asarray(alone.sim_time)[-1]))
    return times


def test_per_node_specs_and_numbers_in_one_sweep_equal_their_runs(tmp_path):
    rounds = np.array([[1e6, 2e6, 4e6, 8e6], [8e6, 4e6, 2e6, 1e6], [1e5, 1e5, 1e5, 1e5]])
    np.save(tmp_path / "rounds.npy", rounds)
    values = [1e6, "stragglers:0.5,10000", "lognormal:1e6,1", f"trace:{tmp_path / 'rounds.npy'}"]
    times = _assert_points_equal_runs(tiny_config(time=BASE), "bandwidth", values, seeds=[0, 3])
    # the lognormal draws of seeds 0 and 3 differ, so their clocks do
    assert times[4] != times[5]
    assert len(set(times)) >= 5


def test_per_edge_trace_next_to_numbers_and_node_specs(tmp_path):
    import jaxgossip as jg

    topo = jg.topology.ring(4)
    pairs = sorted(
        {
            (int(a), int(b))
            for a, b, w in zip(*(np.asarray(x)[0] for x in (topo.senders, topo.receivers, topo.weights)))
            if a != b and w != 0
        }
    )
    np.save(tmp_path / "edges.npy", np.linspace(1e-4, 1e-2, len(pairs)))
    values = [1e-3, "stragglers:0.25,100", f"edge_trace:{tmp_path / 'edges.npy'}"]
    times = _assert_points_equal_runs(tiny_config(time=BASE), "latency", values, seeds=[1])
    assert len(set(times)) == 3


def test_downlink_specs_sweep_equals_runs():
    _assert_points_equal_runs(tiny_config(time=BASE), "downlink", [1e9, "stragglers:0.5,1000"], seeds=[2])


def test_a_seed_drawn_spec_that_is_not_swept_is_drawn_per_seed():
    config = tiny_config(time={**BASE, "bandwidth": "lognormal:1e6,1"})
    _, metrics = sweep_training(config, {"lr": [0.05]}, [0, 3])
    for s, seed in enumerate([0, 3]):
        alone = _alone(config, seed)
        np.testing.assert_array_equal(np.asarray(metrics.sim_time)[0, s], np.asarray(alone.sim_time))
    assert np.asarray(metrics.sim_time)[0, 0, -1] != np.asarray(metrics.sim_time)[0, 1, -1]


def test_link_table_layouts_and_refusals(tmp_path):
    import jaxgossip as jg

    topo = jg.topology.ring(4)
    table = link_table("bandwidth", [1e6, "lognormal:1e6,1"], topology=topo, num_nodes=4, seeds=[0, 5])
    assert table.layout == "node" and table.values.shape == (2, 2, 4)
    np.testing.assert_array_equal(table.values[0], np.full((2, 4), 1e6))
    for s, seed in enumerate([0, 5]):
        expected = link_values(parse_link("bandwidth", "lognormal:1e6,1", 1e9), 4, seed, 1e9)
        np.testing.assert_array_equal(table.values[1, s], expected)
    np.save(tmp_path / "r3.npy", np.full((3, 4), 1e6))
    np.save(tmp_path / "r5.npy", np.full((5, 4), 1e6))
    one_seed = functools.partial(link_table, topology=topo, num_nodes=4, seeds=[0])
    rounds = one_seed("bandwidth", [2e6, f"trace:{tmp_path / 'r3.npy'}"])
    assert rounds.layout == "node_rounds" and rounds.values.shape == (2, 1, 3, 4)
    np.testing.assert_array_equal(rounds.values[0, 0], np.full((3, 4), 2e6))
    with pytest.raises(ValueError, match=r"r3.npy.*\(3 rows\) and .*r5.npy.*\(5 rows\)"):
        one_seed("bandwidth", [f"trace:{tmp_path / 'r3.npy'}", f"trace:{tmp_path / 'r5.npy'}"])
    np.save(tmp_path / "edges.npy", np.full(8, 1e-3))
    edge = one_seed("latency", [1e-3, "stragglers:0.25,10", f"edge_trace:{tmp_path / 'edges.npy'}"])
    assert edge.layout == "edge" and edge.values.shape == (3, 1) + np.shape(topo.senders)
    # a node's value prices its sender's edges, as make_links lays it out
    node = link_values(parse_link("latency", "stragglers:0.25,10", 1e-4), 4, 0, 1e-4)
    np.testing.assert_array_equal(edge.values[1, 0], node[np.asarray(topo.senders)])
    with pytest.raises(ValueError, match="no common layout"):
        one_seed("latency", [f"trace:{tmp_path / 'r3.npy'}", f"edge_trace:{tmp_path / 'edges.npy'}"])
    with pytest.raises(ValueError, match="an all-reduce has none"):
        link_table("latency", [f"edge_trace:{tmp_path / 'edges.npy'}"], topology=None, num_nodes=4, seeds=[0])


def test_the_command_line_joins_a_specs_commas():
    assert join_link_tokens([1e9, "stragglers:0.25", 10.0, "lognormal:1e8", 1.5, 2e9]) == [
        1e9,
        "stragglers:0.25,10",
        "lognormal:1e8,1.5",
        2e9,
    ]
    assert join_link_tokens(["stragglers:0.25,10", "constant:5", 3.0]) == ["stragglers:0.25,10", "constant:5", 3.0]


def test_the_sweep_command_takes_link_specs_and_refuses_bad_ones(tmp_path, capsys):
    import json

    from jaxgossip.cli import main

    out = str(tmp_path / "sweep")
    sweep = ["sweep", *TINY_FLAGS, "--no-progress", "--seeds=2", "--out", out, "--time.compute=0.01"]
    assert main([*sweep, "--sweep.time.bandwidth=1e9,stragglers:0.25,10,lognormal:1e8,1"]) == 0
    table = capsys.readouterr().out
    assert "stragglers:0.25,10" in table and "lognormal:1e8,1" in table
    rows = json.load(open(f"{out}/sweep.json"))["rows"]
    assert [r["time.bandwidth"] for r in rows] == [1e9, "stragglers:0.25,10", "lognormal:1e8,1"]
    assert rows[0]["sim_s"] < rows[1]["sim_s"]  # a 10x slower uplink on one node of four paces the run
    assert main([*sweep, "--sweep.time.bandwidth=1e9,stragglers:2,10"]) == 2
    assert "--time.bandwidth='stragglers:2,10': expected stragglers:F,S" in capsys.readouterr().err
    np.save(tmp_path / "wide.npy", np.full(7, 1e8))
    assert main([*sweep, f"--sweep.time.bandwidth=1e9,trace:{tmp_path / 'wide.npy'}"]) == 2
    assert "does not fit N = 4 nodes" in capsys.readouterr().err
    assert main([*sweep, "--sweep.time.compute=stragglers:0.01,0.25,10"]) == 2
    assert "a spec's kind selects the program's structure" in capsys.readouterr().err
