"""The one network model (jaxgossip.sim.network.Network): its option group and its errors, the same
round times from the clock inside a compiled run and from cost.simulate on the host, and training
reports that price only what the run did not (a final merge)."""

import json
import os

import numpy as np
import pytest
from _reference import clock_equals_simulate

import jaxgossip as jg
from jaxgossip.sim.cost import simulate
from jaxgossip.sim.network import DEFAULT_BANDWIDTH, DEFAULT_LATENCY, Network


def test_defaults_and_the_option_group():
    net = Network.from_options({})
    assert net.options() == {
        "compute": 0.0,
        "latency": DEFAULT_LATENCY,
        "bandwidth": DEFAULT_BANDWIDTH,
        "downlink": None,
        "mode": "serial",
        "exchange": "priced",
        "allreduce_model": "ring",
        "availability": "always",
    }
    # a None keeps the default; a config file's "1e-4" is the number
    net = Network.from_options({"latency": "1e-3", "bandwidth": None, "compute": "stragglers:0.01,0.25,4"})
    assert net.latency == 1e-3 and net.bandwidth == DEFAULT_BANDWIDTH and net.compute == "stragglers:0.01,0.25,4"
    assert Network.from_options(net) is net


@pytest.mark.parametrize(
    "options, message",
    [
        ({"bandwith": 1e8}, r"time.bandwith: unknown time option \(did you mean 'bandwidth'\?\); known: compute, "),
        ({"latency": "fast"}, r"--time.latency='fast' must be a number \(s\)"),
        ({"bandwidth": 0}, r"--time.bandwidth=0 must be > 0"),
        ({"bandwidth": True}, r"--time.bandwidth=True must be a number \(bit/s\)"),
        ({"latency": np.zeros((1, 2, 3))}, r"--time.latency must be a scalar, \[N\] or \[T, E\]"),
        ({"latency": np.array([1e-3, -1.0])}, r"--time.latency must be finite and >= 0.0: 1 of 2 entries"),
        ({"mode": "fast"}, r"--time.mode='fast' is unknown; known: serial, parallel"),
        ({"allreduce_model": "tree"}, r"--time.allreduce_model='tree' is unknown; known: ring, message"),
        ({"compute": "stragglers:1,2,10"}, r"--time.compute='stragglers:1,2,10': straggler fraction F=2.0"),
    ],
)
def test_bad_options_name_the_option_and_the_rule(options, message):
    with pytest.raises(ValueError, match=message):
        Network.from_options(options)


def test_not_a_mapping():
    with pytest.raises(ValueError, match="time=3 must be a mapping"):
        Network.from_options(3)


def test_the_command_line_and_config_files_give_the_group_its_typed_values(tmp_path):
    """``--time.*`` is typed by the fields of Network: a spec with commas stays one string, numbers
    are numbers, and only the options given are kept (the defaults stay with Network)."""
    from jaxgossip.cli.train import command
    from jaxgossip.run.config import TrainConfig
    from jaxgossip.run.parsing import UsageError, parse
    from jaxgossip.run.runner import config_from_dict

    argv = ["--time.compute=stragglers:0.01,0.25,4", "--time.latency=1e-3", "--time.availability=markov:0.2,0.5"]
    config = parse(command(), argv).build(TrainConfig)
    assert config.time == {"compute": "stragglers:0.01,0.25,4", "latency": 1e-3, "availability": "markov:0.2,0.5"}
    assert parse(command(), ["--time.compute=0.5"]).build(TrainConfig).time == {"compute": 0.5}
    path = tmp_path / "c.yaml"
    path.write_text("time:\n  compute: lognormal:1,0.5\n  bandwidth: 1e8\nbyzantine:\n  ids: [0, 5]\n")
    config = parse(command(), ["--config", str(path), "--time.mode=parallel", "--byzantine.attack_options.sigma=3"])
    config = config.build(TrainConfig)
    assert config.time == {"compute": "lognormal:1,0.5", "bandwidth": 1e8, "mode": "parallel"}
    assert config.byzantine == {"ids": [0, 5], "attack_options": {"sigma": 3}}
    assert config_from_dict({"time.compute": "stragglers:0.01,0.25,4"}).time == {"compute": "stragglers:0.01,0.25,4"}
    with pytest.raises(UsageError, match=r"time.computee: unknown time option \(did you mean 'compute'\?\)"):
        parse(command(), ["--time.computee=1"])
    path.write_text("time:\n  bandwith: 1e8\n")
    with pytest.raises(UsageError, match=r"time.bandwith: unknown time option \(did you mean 'bandwidth'\?\)"):
        parse(command(), ["--config", str(path)])
    with pytest.raises(UsageError, match=r"--byzantine.nodes='abc' is not valid: expected int"):
        parse(command(), ["--byzantine.nodes=abc"])


@pytest.mark.parametrize("algorithm, mode", [("gossip", "serial"), ("gossip", "parallel"), ("allreduce", "serial")])
def test_the_clock_of_a_run_equals_simulate_of_its_bits(algorithm, mode):
    """One network, two users: the float32 clock a compiled consensus run advances every round and
    cost.simulate of the bits the run recorded (float64, on the host)."""
    topo = jg.topology.erdos_renyi(8, 0.5, seed=1)
    rng = np.random.default_rng(0)
    net = Network(latency=rng.uniform(1e-4, 1e-3, 8), bandwidth=rng.uniform(1e6, 1e7, 8), mode=mode)
    clock_equals_simulate(topo, net, algorithm)


def test_simulate_counts_the_network_compute_of_each_local_step():
    topo = jg.topology.ring(4)
    net = Network(compute=0.5, latency=1e-3, bandwidth=1e6)
    bits = np.full((3, 4), 2e3)  # two messages of 1e3 bits per node and round
    comm = 2 * (1e-3 + 1e3 / 1e6)
    for steps in (0, 1, 2):
        report = simulate(bits, topo, net, local_steps=steps)
        np.testing.assert_allclose(report.comm_time, comm)
        np.testing.assert_allclose(report.round_time, comm + 0.5 * steps)


@pytest.mark.parametrize("merge, priced", [(None, 0), ("2", 1)])
def test_a_training_report_prices_only_the_final_merge(merge, priced, tmp_path, monkeypatch):
    """``jaxgossip train`` reads the times its clock recorded; only a final merge (run after the
    compiled training) is priced afterwards, by cost.simulate."""
    from tiny import TINY_FLAGS

    from jaxgossip.cli import main
    from jaxgossip.run import cost_report

    calls = []
    real = cost_report.simulate
    monkeypatch.setattr(cost_report, "simulate", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = str(tmp_path / "run")
    flags = [*TINY_FLAGS, "--out", out, "--no-progress", "--time.compute=1e-3", "--energy.bit=1e-9"]
    assert main(["train", *flags, *([f"--final_merge={merge}"] if merge else [])]) == 0
    assert len(calls) == priced
    with open(os.path.join(out, "metrics.json")) as f:
        saved = json.load(f)
    rows = saved["rows"] if isinstance(saved, dict) and "rows" in saved else saved
    assert rows[-1]["energy_J_per_node"] > 0
