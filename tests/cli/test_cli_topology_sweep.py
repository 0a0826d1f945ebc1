"""``jaxgossip topology-sweep``: its rows equal the library's (sweeps.topology_rows of
sweeps.sweep_topologies, and run_training for the training mode), the cost columns equal hand
computations, graphs that cannot be built at a size are skipped with a note, and bad input is refused
before anything runs."""

import json
import math
import os

import numpy as np
import pytest
from _reference import one_line_error, read_json
from tiny import tiny_config

from jaxgossip import topology
from jaxgossip.cli import main
from jaxgossip.engine import sweeps
from jaxgossip.run.runner import TrainConfig, run_training

BW, LAT = 1e8, 1e-3  # bit/s, s
DIM, STEPS, TOL = 4, 12, 1e-2


def _same(a, b):
    """Equal values, NaN equal to NaN (null in strict JSON), floats to float32 round-off."""
    if a is None:
        return isinstance(b, float) and math.isnan(b)
    if isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6, abs=1e-12)
    return a == b


def test_consensus_rows_equal_the_library_and_cost_is_hand_computed(tmp_path, capsys):
    out = str(tmp_path / "cons")
    argv = ["topology-sweep", "--topologies=ring,torus,star", "--sizes=8,16", f"--num_steps={STEPS}"]
    argv += [
        f"--dim={DIM}",
        "--seeds=2",
        f"--tol={TOL}",
        "--out",
        out,
        f"--time.bandwidth={BW}",
        f"--time.latency={LAT}",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    saved = read_json(os.path.join(out, "results.json"))
    for name in ("table.md", "results.json", "topology_sweep.png"):
        assert os.path.getsize(os.path.join(out, name)) > 0

    graphs = [topology.make(spec, n, seed=0) for n in (8, 16) for spec in ("ring", "torus", "star")]
    result = sweeps.sweep_topologies("gossip", graphs, dim=DIM, num_steps=STEPS, seeds=[0, 1])
    expected = sweeps.topology_rows(result, tol=TOL)
    rows = saved["rows"]
    assert [r["name"] for r in rows] == [t.name for t in graphs]
    assert [r["spec"] for r in rows] == ["ring", "torus", "star"] * 2
    for row, ref in zip(rows, expected):
        for key, value in ref.items():
            assert _same(row[key], value), (row["name"], key, row[key], value)
    assert saved["groups"] == result.groups and len(result.groups) < len(graphs)

    # serial links: the slowest node sends out_degree messages of D fp32 values per round
    message = LAT + 32 * DIM / BW
    for row, topo in zip(rows, graphs):
        per_round = topo.out_degree.max() * message  # ring 2, torus 3 or 4, star N - 1 (the hub)
        assert row["comm_s_per_round"] == pytest.approx(per_round, rel=1e-12)
        assert row["comm_s"] == pytest.approx(STEPS * per_round, rel=1e-12)
        if row["rounds_to_tol"] is None:  # never reached: NaN, written as null
            assert row["comm_s_to_tol"] is None
        else:  # every round costs the same here, so the seed mean carries over
            assert row["comm_s_to_tol"] == pytest.approx(row["rounds_to_tol"] * per_round, rel=1e-12)
    assert rows[2]["comm_s_per_round"] == pytest.approx(7 * message)  # star(8)
    for header in ("comm s/round", "comm s to tol", "MB/node to tol", "compile group", "eff. neighbours"):
        assert header in printed
    ring8 = topology.effective_neighbors(graphs[0], gamma=0.99)
    assert rows[0]["effective_neighbors"] == pytest.approx(ring8) and format(ring8, ".1f") in printed
    assert f"6 graphs x 2 seeds in {len(result.groups)} compiled programs" in printed
    assert "skipped" not in printed


def test_sweep_node_bits_keeps_every_nodes_bits():
    topos = [topology.ring(8), topology.one_peer_exponential(8), topology.star(8)]
    plain = sweeps.sweep_topologies("gossip", topos, dim=3, num_steps=6, seeds=[0, 2])
    assert plain.node_bits is None
    result = sweeps.sweep_topologies("gossip", topos, dim=3, num_steps=6, seeds=[0, 2], node_bits=True)
    for g, topo in enumerate(topos):
        expected = topo.out_degree[np.arange(6) % topo.period] * 32 * 3  # [R, N]: one message per out-neighbour
        assert result.node_bits[g].shape == (2, 6, 8)
        for s in range(2):
            np.testing.assert_array_equal(result.node_bits[g][s], expected)
        np.testing.assert_allclose(result.node_bits[g].sum(axis=2), result.bits[g], rtol=1e-6)
        np.testing.assert_allclose(result.error[g], plain.error[g], rtol=1e-6, atol=1e-7)


def test_a_graph_that_cannot_be_built_at_a_size_is_skipped_with_a_note(tmp_path, capsys):
    out = str(tmp_path / "skip")
    argv = ["topology-sweep", "--topologies=hypercube,ring", "--sizes=8,12", "--num_steps=3", "--dim=2"]
    assert main(argv + ["--seeds=1", "--out", out]) == 0
    printed = capsys.readouterr().out
    assert "note: skipped hypercube at N=12: hypercube needs n to be a power of two, got n=12" in printed
    saved = read_json(os.path.join(out, "results.json"))
    assert [r["name"] for r in saved["rows"]] == ["hypercube(8)", "ring(8)", "ring(12)"]
    assert len(saved["skipped"]) == 1 and "hypercube at N=12" in saved["skipped"][0]
    with open(os.path.join(out, "table.md")) as f:
        assert "skipped hypercube at N=12" in f.read()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--topologies=ring,ringg,torus"], "unknown topology spec 'ringg'; known families: ring, directed_ring"),
        (["--topologies=ring", "--dataset=digits"], "--dataset is not an option of the consensus mode"),
        (["--topologies=ring", "--train", "--sizes=8"], "--sizes is an option of the consensus mode"),
        (["--topologies=ring", "--seeds=0"], "--seeds=0 must be a count >= 1"),
        (["--topologies=ring", "--tol=0"], "--tol=0.0 must be a finite number > 0"),
        (["--topologies=ring", "--topology=torus"], "a topology sweep takes --topologies"),
        (["--topologies=ring", "--algorithm=gosip"], "unknown algorithm 'gosip' (did you mean 'gossip'?)"),
        (["--topologies=hypercube", "--sizes=6"], "no graph of --topologies=hypercube could be built"),
    ],
)
def test_bad_input_is_refused_before_anything_runs(flags, message, tmp_path, capsys):
    out = tmp_path / "bad"
    assert main(["topology-sweep", "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert "jaxgossip topology-sweep: error:" in err and message in err, err
    assert not out.exists()


def _flags(config: TrainConfig) -> list[str]:
    """``config`` as ``--key=value`` overrides of the fields that differ from TrainConfig()."""
    default = TrainConfig()
    flags = []
    for key, value in config.to_dict().items():
        if value != getattr(default, key):
            flags.append(f"--{key}={json.dumps(value) if isinstance(value, (dict, list, tuple)) else value}")
    return flags


def test_training_sweep_equals_run_training(tmp_path, capsys):
    config = tiny_config(num_rounds=10, evals_per_chunk=2)
    out = str(tmp_path / "train")
    argv = ["topology-sweep", "--train", "--topologies=ring,torus", "--seeds=[0,1]", "--out", out]
    assert main(argv + _flags(config) + [f"--time.bandwidth={BW}", f"--time.latency={LAT}"]) == 0
    printed = capsys.readouterr().out
    saved = read_json(os.path.join(out, "results.json"))
    for name in ("table.md", "results.json", "accuracy_vs_gap.png"):
        assert os.path.getsize(os.path.join(out, name)) > 0
    assert saved["config"]["num_nodes"] == 4 and saved["groups"] == [[0, 1]]
    ring, torus = saved["rows"]
    assert (ring["name"], torus["name"]) == ("ring(4)", "torus(2x2)")
    assert torus["spectral_gap"] == pytest.approx(topology.spectral_gap(topology.torus(2, 2)))

    reference = run_training(
        config.replace(topology="torus", seed=1, data_seed=config.seed), None, progress=False, log=lambda s: None
    ).rows[-1]
    assert torus["test_acc_per_seed"][1] == pytest.approx(reference["test_acc"], abs=1e-6)
    assert torus["MB_per_node"] == pytest.approx(reference["MB_per_node"], rel=1e-6)
    acc = np.asarray(torus["test_acc_per_seed"])
    assert torus["test_acc"] == pytest.approx(acc.mean()) and torus["test_acc_std"] == pytest.approx(acc.std())
    # ring(4), serial links: 2 messages of the fp32 MLP (64 -> 8 -> 10 with biases) per round
    params = 64 * 8 + 8 + 8 * 10 + 10
    # the communication time the run recorded (float32, a compensated sum)
    assert ring["comm_s"] == pytest.approx(10 * 2 * (LAT + 32 * params / BW), rel=1e-6)
    for header in ("acc(avg)", "comm s/round", "mem MB/node", "compile group"):
        assert header in printed
    assert "2 graphs x 2 seeds in 1 compiled program, one per group of same-shape graphs" in printed


@pytest.mark.parametrize(
    ("spec", "rule"),
    [
        ("erdos_renyi:1.7", "erdos_renyi spec 'erdos_renyi:1.7': P must be a probability in (0, 1], got '1.7'"),
        ("base:0", "base spec 'base:0': K (the maximum degree) must be an int >= 1, got '0'"),
    ],
)
def test_topology_sweep_refuses_a_bad_spec_at_every_size(tmp_path, capsys, spec, rule):
    out = tmp_path / "ts"
    assert main(["topology-sweep", f"--topologies=ring,{spec}", "--sizes=8,16", "--out", str(out)]) == 2
    assert one_line_error(capsys) == f"jaxgossip topology-sweep: error: --topologies: {rule}"
    assert not out.exists()


def test_topology_sweep_refuses_a_spec_no_size_can_build(tmp_path, capsys):
    out = tmp_path / "ts"
    assert main(["topology-sweep", "--topologies=ring,erdos_renyi:1.7", "--sizes=8", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "jaxgossip topology-sweep: error: --topologies: erdos_renyi spec 'erdos_renyi:1.7': "
        "P must be a probability in (0, 1], got '1.7'"
    )
    assert not out.exists()
