"""The cost-model columns of the CLI (``--time.*``, ``--energy.*``) against hand computations, the
training-cost helper on hand-made bits and recorded times, and bad options."""

import csv
import json
import os
import re

import numpy as np
import pytest
from _reference import read_json
from tiny import tiny_config

import jaxgossip as jg
from jaxgossip.cli import main
from jaxgossip.run.cost_report import CostModel, training_cost
from jaxgossip.sim.network import Network

BW, LAT = 1e8, 1e-3  # bit/s, s
# tiny_config: 4 nodes, 20 rounds evaluated every 5, batch 8, an MLP 64 -> 8 -> 10 (with biases) on
# the synthetic data (64 inputs, 10 classes)
D = 64 * 8 + 8 + 8 * 10 + 10


def _train(tmp_path, out, *flags, **changes) -> int:
    """``jaxgossip train`` of tiny_config(**changes) (as a JSON config file) with ``flags``, in one
    chunk (one compile of the 4 evaluation intervals, one checkpoint)."""
    path = str(tmp_path / "tiny.json")
    with open(path, "w") as f:
        json.dump(tiny_config(**{"evals_per_chunk": 4, **changes}).to_dict(), f)
    return main(["train", "--config", path, "--out", out, "--no-progress", *flags])


def test_consensus_cost_columns(tmp_path, capsys):
    out = str(tmp_path / "cons")
    runs = [
        {"name": "gossip", "algorithm": "gossip", "options": {"gamma": 1.0}},
        {"name": "allreduce", "algorithm": "allreduce", "options": {}},
        {"name": "push_sum", "algorithm": "push_sum", "topology": "one_peer_exponential"},
    ]
    argv = ["consensus", "--out", out, "--no-progress", "--shape=[10]", "--num_steps=5", f"--runs={json.dumps(runs)}"]
    cost_flags = [f"--time.bandwidth={BW}", f"--time.latency={LAT}", "--energy.bit=1e-9"]
    assert main(argv + cost_flags) == 0
    table = capsys.readouterr().out
    saved = read_json(os.path.join(out, "consensus.json"))
    rows = {r["name"]: r for r in saved["rows"]}
    n, bits = 8, 32 * 10  # a message is the 10 fp32 values of x
    # ring, serial: each node sends 2 messages of 320 bits per round
    gossip_round = 2 * (LAT + bits / BW)
    assert rows["gossip"]["MB_total"] == pytest.approx(5 * n * 2 * bits / 8e6)
    assert rows["gossip"]["comm_s_per_round"] == pytest.approx(gossip_round, rel=1e-12)
    assert rows["gossip"]["comm_s"] == pytest.approx(5 * gossip_round, rel=1e-12)
    assert rows["gossip"]["energy_J_per_node"] == pytest.approx(5 * 2 * bits * 1e-9, rel=1e-12)
    # ring all-reduce: 2 (N - 1) steps of B / N bits
    ring_round = 2 * (n - 1) * (LAT + bits / n / BW)
    assert rows["allreduce"]["comm_s"] == pytest.approx(5 * ring_round, rel=1e-12)
    assert rows["allreduce"]["energy_J_per_node"] == pytest.approx(5 * 2 * (n - 1) / n * bits * 1e-9, rel=1e-12)
    # one-peer exponential (time-varying): one message of x and the push-sum weight per round
    push_round = LAT + (bits + 32) / BW
    assert rows["push_sum"]["comm_s"] == pytest.approx(5 * push_round, rel=1e-12)
    assert saved["cost_model"] == CostModel(Network(bandwidth=BW, latency=LAT), joules_per_bit=1e-9).to_dict()
    for header in ("comm s/round", "comm s", "J/node"):
        assert header in table
    assert format(5 * ring_round, ".4g") in table and format(gossip_round, ".3g") in table

    out2 = str(tmp_path / "parallel")
    assert main(argv[:2] + [out2] + argv[3:] + cost_flags + ["--time.mode=parallel"]) == 0
    rows = {r["name"]: r for r in read_json(os.path.join(out2, "consensus.json"))["rows"]}
    assert rows["gossip"]["comm_s"] == pytest.approx(5 * (LAT + bits / BW), rel=1e-12)
    assert "J/node" in capsys.readouterr().out


# Times a training run records (float32 with a compensated sum): relative precision of ~1e-7.
RECORDED = 1e-6


def test_train_cost_columns(tmp_path, capsys):
    out = str(tmp_path / "train")
    compute = 2e-3  # seconds per local step
    flags = [f"--time.bandwidth={BW}", f"--time.latency={LAT}", f"--time.compute={compute}", "--energy.flop=1e-12"]
    assert _train(tmp_path, out, *flags, "--energy.bit=1e-9") == 0
    table = capsys.readouterr().out
    saved = read_json(os.path.join(out, "metrics.json"))
    assert saved["num_params"] == D
    rows = saved["rows"]
    comm = 2 * (LAT + 32 * D / BW)  # ring, serial: 2 messages of the fp32 model per round
    flops = rows[-1]["gflop_per_step"] * 1e9
    forward = 2 * 8 * (64 * 8 + 8 * 10)  # matmul FLOPs of one batch of 8
    assert 2.0 <= flops / forward <= 3.5  # forward plus backward (cost.flops_per_step)
    # momentum SGD: params and trace (2 x 4D bytes), the schedule's int32 count per node, and the
    # gossip round counter shared by the 4 nodes
    memory = (8 * D + 4 + 4 / 4) / 1e6
    with open(os.path.join(out, "metrics.csv")) as f:
        csv_rows = list(csv.DictReader(f))
    assert [int(r["round"]) for r in csv_rows] == [5, 10, 15, 20]
    for row, csv_row in zip(rows, csv_rows):
        r = row["round"]
        assert row["comm_s_per_round"] == pytest.approx(comm, rel=RECORDED)
        assert row["comm_s"] == pytest.approx(r * comm, rel=RECORDED)
        assert row["sim_s"] == pytest.approx(r * (comm + compute), rel=RECORDED)  # atc: compute, then send
        assert row["sim_time"] == row["sim_s"]  # the run's own record
        assert row["mem_MB_per_node"] == pytest.approx(memory, rel=1e-12)
        assert row["energy_J_per_node"] == pytest.approx(r * (flops * 1e-12 + 2 * 32 * D * 1e-9), rel=1e-9)
        for key in ("comm_s", "sim_s", "sim_time", "energy_J_per_node", "mem_MB_per_node"):
            assert float(csv_row[key]) == pytest.approx(row[key], rel=1e-12)
    assert saved["cost_model"]["bandwidth"] == BW and saved["cost_model"]["latency"] == LAT
    for header in ("comm s/round", "comm s", "sim s", "mem MB/node", "J/node"):
        assert header in table
    assert format(rows[-1]["sim_s"], ".4g") in table


def test_train_cost_counts_the_final_merge(tmp_path, capsys):
    out = str(tmp_path / "merge")
    changes = {"algorithm": "push_sum", "topology": "one_peer_exponential", "final_merge": 2}
    assert _train(tmp_path, out, f"--time.bandwidth={BW}", f"--time.latency={LAT}", **changes) == 0
    rows = read_json(os.path.join(out, "metrics.json"))["rows"]
    one = LAT + (32 * D + 32) / BW  # one message (model and weight) per round
    assert [r["phase"] for r in rows] == ["train"] * 4 + ["merged"]
    assert rows[-2]["comm_s"] == pytest.approx(20 * one, rel=RECORDED)
    assert rows[-1]["comm_s"] == pytest.approx(22 * one, rel=RECORDED)  # 2 merge rounds
    assert rows[-1]["sim_s"] == pytest.approx(22 * one, rel=RECORDED)  # no compute time given
    assert rows[-1]["comm_s_per_round"] == pytest.approx(one, rel=RECORDED)


def test_train_reports_the_time_to_a_target_accuracy(tmp_path, capsys):
    out = str(tmp_path / "target")
    assert _train(tmp_path, out, "--time.compute=1e-3", "--target_acc=0.15") == 0
    table = capsys.readouterr().out
    rows = read_json(os.path.join(out, "metrics.json"))["rows"]
    first = next(r for r in rows if r["test_acc"] >= 0.15)  # tiny_config's synthetic data: 10 classes
    assert "sim s to acc 0.15" in table and format(first["sim_s"], ".4g") in table.splitlines()[-2]
    assert os.path.exists(os.path.join(out, "accuracy_vs_time.png"))
    assert _train(tmp_path, str(tmp_path / "never"), "--target_acc=1.0", "--num_rounds=5", "--eval_every=5") == 0
    lines = capsys.readouterr().out.splitlines()
    header, row = lines[-4], lines[-2]  # header, rule, the one row, then the "wrote" line
    at = header.index("sim s to acc 1")
    assert row[at:].split()[0] == "-"  # never reached: no time
    assert _train(tmp_path, str(tmp_path / "bad"), "--target_acc=1.5") == 2
    assert "--target_acc=1.5 must be a test accuracy in (0, 1]" in capsys.readouterr().err


def _cumulative(per_round, rounds):
    return np.cumsum(per_round, axis=0)[np.asarray(rounds) - 1]


LINK = CostModel(Network(bandwidth=BW, latency=LAT), joules_per_flop=1e-9)
FLOPS = 3e3


def test_training_cost_reads_the_recorded_times_and_prices_the_energy():
    n, model_bits, rounds = 4, 1000.0, [2, 4]
    ring4 = jg.topology.ring(n)
    config = tiny_config(algorithm="allreduce")
    bits = _cumulative(np.full((4, n), model_bits), rounds)
    sim, comm = np.array([0.5, 1.25]), np.array([0.125, 0.25])
    fields = training_cost(LINK, config, ring4, rounds, bits, sim, comm, flops=FLOPS, memory=8e6)
    assert [f["sim_s"] for f in fields] == [0.5, 1.25] and [f["comm_s"] for f in fields] == [0.125, 0.25]
    assert fields[-1]["comm_s_per_round"] == 0.25 / 4
    assert fields[-1]["energy_J_per_node"] == pytest.approx(4 * FLOPS * 1e-9, rel=1e-12)  # no --energy.bit
    assert fields[0]["mem_MB_per_node"] == 8.0
    with pytest.raises(ValueError, match="sim_time and comm_time must be"):
        training_cost(LINK, config, ring4, rounds, bits, sim[:1], comm, flops=FLOPS, memory=0.0)


def test_training_run_records_allreduce_and_power_gossip_exchanges(tmp_path):
    """The recorded times of all-reduce (ring model) and of PowerGossip with 2 exchanges per round
    (same_iterate: compute overlaps communication) against their formulas."""
    from jaxgossip.run.runner import run_training

    n, compute = 4, 3e-3
    time = {"bandwidth": BW, "latency": LAT, "compute": compute}
    result = run_training(tiny_config(algorithm="allreduce", time=time), progress=False, log=lambda m: None)
    ring_round = 2 * (n - 1) * (LAT + 32 * D / n / BW)
    np.testing.assert_allclose(result.metrics.comm_time, ring_round * np.array([5, 10, 15, 20]), rtol=RECORDED)
    np.testing.assert_allclose(result.metrics.sim_time, (ring_round + compute) * np.array([5, 10, 15, 20]), rtol=RECORDED)
    compute = 1e-2  # above a PowerGossip round's communication (~4 ms): the overlap hides the latter
    config = tiny_config(
        algorithm="power_gossip",
        algorithm_options={"num_iterations": 2},
        ordering="same_iterate",
        time={**time, "compute": compute},
    )
    result = run_training(config, progress=False, log=lambda m: None)
    bits = np.diff(np.asarray(result.metrics.bits, np.float64), axis=0, prepend=0.0)[:, 0] / 5  # per round, node 0
    power_round = 2 * 2 * (LAT + bits / 2 / 2 / BW)  # 2 exchanges x 2 messages, each of a quarter of the bits
    np.testing.assert_allclose(
        np.diff(np.asarray(result.metrics.comm_time), prepend=0.0), 5 * power_round, rtol=RECORDED
    )
    per_round = np.diff(np.asarray(result.metrics.sim_time), prepend=0.0) / 5
    assert np.all(power_round < compute)
    np.testing.assert_allclose(per_round, compute, rtol=RECORDED)  # atc would take compute + power_round


def test_a_cost_model_takes_a_network():
    with pytest.raises(TypeError, match="network must be a jaxgossip.sim.network.Network; got 1000000000.0"):
        CostModel(1e9)
    with pytest.raises(ValueError, match=r"--energy.bit=-1.0 must be a finite number >= 0 \(J\)"):
        CostModel(Network(), joules_per_bit=-1.0)


@pytest.mark.parametrize("merge", ["exact", 3])
def test_training_cost_final_merge(merge):
    """A final merge of 3 gossip rounds, or exact (one ring all-reduce), after 4 training rounds."""
    n, message, rounds = 4, 32.0 * 10, [2, 4]
    bits = _cumulative(np.full((4, n), 2 * message), rounds)
    merge_bits = np.full(n, 2 * message * 3 if merge == 3 else message)
    config = tiny_config(final_merge=merge)
    gossip_round = 2 * (LAT + message / BW)
    recorded_comm = gossip_round * np.array([2, 4])
    recorded_sim = (gossip_round + 3e-3) * np.array([2, 4])  # 3 ms of compute per round
    fields = training_cost(
        LINK, config, jg.topology.ring(n), rounds, bits, recorded_sim, recorded_comm, flops=FLOPS, memory=0.0,
        merge_bits=merge_bits,
    )
    merge_time = 3 * gossip_round if merge == 3 else 2 * (n - 1) * (LAT + message / n / BW)
    assert len(fields) == 3
    assert fields[-1]["comm_s"] == pytest.approx(4 * gossip_round + merge_time, rel=1e-12)
    assert fields[-1]["sim_s"] == pytest.approx(4 * (gossip_round + 3e-3) + merge_time, rel=1e-12)  # no compute
    assert fields[-1]["comm_s_per_round"] == fields[-2]["comm_s_per_round"]


def test_training_cost_merge_round_continues_the_graph_sequence():
    """Round t even: ring (2 messages), t odd: directed ring (1 message); a merge round after 3
    training rounds is round 3, on the directed ring: one message."""
    topo = jg.topology.schedule([jg.topology.ring(4), jg.topology.directed_ring(4)])
    message = 400.0
    per_round = topo.out_degree[np.arange(6) % 2] * message
    even, odd = 2 * (LAT + message / BW), LAT + message / BW
    recorded = np.array([2 * even + odd])
    fields = training_cost(
        CostModel(Network(bandwidth=BW, latency=LAT)),
        tiny_config(final_merge=1),
        topo,
        [3],
        _cumulative(per_round, [3]),
        recorded,
        recorded,
        flops=0.0,
        memory=0.0,
        merge_bits=np.full(4, message),
    )
    assert fields[-1]["comm_s"] == pytest.approx(2 * even + odd + odd, rel=1e-12)


@pytest.mark.parametrize(
    "flag, match",
    [
        ("--time.bandwidth=-1", r"--time.bandwidth=-1(\.0)? must be > 0"),
        ("--time.bandwidth=0", r"--time.bandwidth=0(\.0)? must be > 0"),
        ("--time.latency=-1e-3", r"--time.latency=-0.001 must be >= 0"),
        ("--time.latency=fast", r"--time.latency='fast' must be a number \(s\)"),
        ("--time.mode=fast", r"--time.mode='fast' is unknown; known: serial, parallel"),
        ("--time.allreduce_model=tree", r"--time.allreduce_model='tree' is unknown; known: ring, message"),
        ("--time.compute=stragglers:1.0,2,10", r"--time.compute='stragglers:1.0,2,10': straggler fraction F=2.0 "),
        ("--time.compute=lognormal:-1", r"expected lognormal:MEDIAN,SIGMA"),
        ("--time.computee=1", r"time.computee: unknown time option \(did you mean 'compute'\?\)"),
        ("--node.flops=1e9", r"node.flops"),
        ("--energy.bit=nan", r"--energy.bit='nan' is not valid: it must be finite \(a number, not inf or nan\)"),
    ],
)
def test_bad_cost_options(flag, match, tmp_path, capsys):
    out = tmp_path / "bad"
    assert _train(tmp_path, str(out), flag) == 2
    err = capsys.readouterr().err
    assert "jaxgossip train: error:" in err
    assert re.search(match, err), err
    assert not out.exists()  # rejected before anything ran


def test_bad_trace_shapes_and_markov_rates(tmp_path, capsys):
    n = tiny_config().num_nodes
    np.save(tmp_path / "narrow.npy", np.ones((5, n - 1), np.float32))
    np.save(tmp_path / "flat.npy", np.ones(n, np.float32))
    cases = [
        (f"--time.compute=trace:{tmp_path / 'narrow.npy'}", rf"a trace of shape \(5, {n - 1}\) does not fit N = {n}"),
        (f"--time.compute=trace:{tmp_path / 'flat.npy'}", r"a trace must be a numeric \[steps, N\] array"),
        (f"--time.availability=trace:{tmp_path / 'narrow.npy'}", rf"must be \[rounds, {n}\]"),
        ("--time.availability=markov:1.5,0.2", r"'markov:1.5,0.2': expected markov:P_OFF,P_ON with P_OFF in \[0, 1\]"),
    ]
    for flag, match in cases:
        out = tmp_path / "bad"
        assert _train(tmp_path, str(out), flag) == 2, flag
        err = capsys.readouterr().err
        assert re.search(match, err), (flag, err)
        assert not out.exists()


def test_markov_availability_from_the_command_line(tmp_path):
    # The command line splits the spec at its comma; the run must see the one spec string.
    out = tmp_path / "churn"
    assert _train(tmp_path, str(out), "--time.availability=markov:0.2,0.5") == 0
    with open(out / "config.json") as f:
        assert json.load(f)["time"]["availability"] == "markov:0.2,0.5"
