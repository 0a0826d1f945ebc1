"""Heterogeneous links from a spec (jaxgossip.sim.link_specs): per-node values against a NumPy loop
over nodes and edges, a constant spec equal to the number bit for bit, a slow uplink that slows the
clock and leaves the iterates alone, trace files cycled over rounds, and the errors."""

import jax
import numpy as np
import pytest
from _reference import assert_only_the_clock_differs, timed_tiny_run

import jaxgossip as jg
from jaxgossip.sim import timing
from jaxgossip.sim.cost import simulate
from jaxgossip.sim.link_specs import PerRound
from jaxgossip.sim.network import DEFAULT_BANDWIDTH, DEFAULT_LATENCY, Network, comm_seconds


def _reference_comm(topo, bits, t, latency, bandwidth, mode, exchanges):
    """c_i by a loop over nodes and their out-neighbours, node i's uplink values ``[N]``."""
    w = topo.matrix(t % topo.period)
    out = np.zeros(topo.num_nodes)
    for i in range(topo.num_nodes):
        receivers = [j for j in range(topo.num_nodes) if j != i and w[j, i] != 0]
        if not receivers or bits[i] == 0:
            continue
        message = bits[i] / len(receivers) / exchanges
        per = [latency[i] + message / bandwidth[i] for _ in receivers]
        out[i] = exchanges * (sum(per) if mode == "serial" else max(per))
    return out


@pytest.mark.parametrize("mode", ["serial", "parallel"])
def test_per_node_specs_match_the_node_loop(mode):
    topo = jg.topology.exponential(8)
    net = Network(latency="stragglers:0.25,20", bandwidth="lognormal:1e7,0.5", mode=mode)
    latency, bandwidth = net.link_values(8, seed=3)
    assert np.sum(latency == 20 * DEFAULT_LATENCY) == 2 and np.sum(latency == DEFAULT_LATENCY) == 6
    assert np.all(bandwidth > 0) and np.unique(bandwidth).size == 8
    bits = np.random.default_rng(0).uniform(1e4, 1e6, 8)
    bits[5] = 0.0  # a node that sent nothing pays nothing
    with jax.enable_x64(True):
        for exchanges in (1, 2):
            links = net.links(topo, exchanges=exchanges, seed=3)
            got = np.asarray(comm_seconds(links, bits, 0))
            want = _reference_comm(topo, bits, 0, latency, bandwidth, mode, exchanges)
            np.testing.assert_allclose(got, want, rtol=1e-12)
            assert got[5] == 0


def test_draws_follow_the_seed_and_need_one():
    net = Network(bandwidth="stragglers:0.25,10")
    first, again, other = (net.link_values(64, seed)[1] for seed in (0, 0, 1))
    np.testing.assert_array_equal(first, again)
    assert np.sum(first == DEFAULT_BANDWIDTH / 10) == 16 and not np.array_equal(first, other)
    with pytest.raises(ValueError, match=r"--time.bandwidth='stragglers:0.25,10' draws per-node values from the run's seed"):
        net.links(jg.topology.ring(64))
    # latency and bandwidth draw from their own streams
    both = Network(latency="lognormal:1e-3,1", bandwidth="lognormal:1e-3,1").link_values(16, 0)
    assert not np.array_equal(both[0], both[1])


def test_a_constant_spec_is_the_number_and_the_options_keep_the_spec():
    assert Network(bandwidth="constant:1e8").bandwidth == Network(bandwidth=1e8).bandwidth == 1e8
    assert Network(latency="constant:0").latency == 0.0
    assert Network(bandwidth="stragglers:0.5,4").options()["bandwidth"] == "stragglers:0.5,4"
    topo = jg.topology.ring(8)
    bits = np.full((4, 8), 3e5)
    a = simulate(bits, topo, Network(bandwidth="constant:1e8", latency="constant:1e-3"))
    b = simulate(bits, topo, Network(bandwidth=1e8, latency=1e-3))
    np.testing.assert_array_equal(a.round_time, b.round_time)
    # every node at the default link: stragglers with F = 0 or S = 1 are the default links, bit for bit
    for spec in ("stragglers:0,10", "stragglers:1,1"):
        c = simulate(bits, topo, Network(bandwidth=spec), seed=0)
        np.testing.assert_array_equal(c.round_time, simulate(bits, topo, Network()).round_time)


@pytest.mark.parametrize("kind", ["npy", "csv"])
def test_a_trace_round_trips_and_cycles_over_rounds(tmp_path, kind):
    rng = np.random.default_rng(1)
    table = rng.uniform(1e6, 1e8, (3, 4)).astype(np.float32)
    path = tmp_path / f"bw.{kind}"
    np.save(path, table) if kind == "npy" else np.savetxt(path, table, delimiter=",")
    net = Network(bandwidth=f"trace:{path}", mode="parallel")
    assert net.round_varying
    values = net.link_values(4)[1]
    assert isinstance(values, PerRound)
    np.testing.assert_allclose(values.values, table, rtol=1e-6)
    topo = jg.topology.ring(4)
    bits = np.full((7, 4), 2e5)
    report = simulate(bits, topo, net, start_round=2)
    for r in range(7):  # row r prices round 2 + r with trace row (2 + r) mod 3
        want = _reference_comm(topo, bits[r], 0, np.full(4, DEFAULT_LATENCY), table[(2 + r) % 3], "parallel", 1)
        np.testing.assert_allclose(report.comm_time[r], want.max(), rtol=1e-6)
    # the compiled clock takes the same rows (the round counter it carries)
    alg = jg.algorithms.make("gossip", topo)
    model = timing.time_model(topo, net, algorithm="gossip")
    result = jg.run_consensus(alg, {"x": jax.random.normal(jax.random.key(0), (4, 50))}, 5, jax.random.key(1), time=model)
    priced = simulate(np.asarray(result.node_bits, np.float64), topo, net)
    np.testing.assert_allclose(np.asarray(result.comm_time)[1:], np.cumsum(priced.comm_time), rtol=1e-5)
    # one row, or a vector .npy, is a static per-node link
    np.save(tmp_path / "one.npy", table[0])
    static = Network(bandwidth=f"trace:{tmp_path / 'one.npy'}")
    assert not static.round_varying
    np.testing.assert_allclose(static.link_values(4)[1], table[0], rtol=1e-6)
    with pytest.raises(ValueError, match=r"--time.bandwidth='trace:.*': a trace of shape \(3, 4\) does not fit N = 5 nodes"):
        net.links(jg.topology.ring(5))


def test_bad_specs_name_the_option(tmp_path):
    np.save(tmp_path / "neg.npy", np.array([1.0, -1.0]))
    np.save(tmp_path / "cube.npy", np.ones((2, 2, 2)))
    cases = [
        ({"bandwidth": "stragglers:2,10"}, r"--time.bandwidth='stragglers:2,10': expected stragglers:F,S with F in \[0, 1\]"),
        ({"latency": "stragglers:0.5,0.5"}, r"--time.latency='stragglers:0.5,0.5': expected .* S >= 1"),
        ({"bandwidth": "stragglers:0.5"}, r"--time.bandwidth='stragglers:0.5': expected stragglers:F,S"),
        ({"bandwidth": "lognormal:1e8,-1"}, r"--time.bandwidth='lognormal:1e8,-1': expected .* SIGMA > 0"),
        ({"bandwidth": "lognormal:x,1"}, r"--time.bandwidth='lognormal:x,1': expected lognormal"),
        ({"bandwidth": "constant:0"}, r"--time.bandwidth='constant:0': V=0.0 must be > 0"),
        ({"latency": "pareto:1"}, r"--time.latency='pareto:1': unknown kind 'pareto'"),
        ({"latency": "fast"}, r"--time.latency='fast' must be a number \(s\) or a per-node spec"),
        ({"bandwidth": "trace:nope.npy"}, r"--time.bandwidth='trace:nope.npy': no trace file"),
        ({"bandwidth": f"trace:{tmp_path / 'neg.npy'}"}, r"--time.bandwidth='trace:.*': the trace must be finite and > 0"),
        ({"latency": f"trace:{tmp_path / 'cube.npy'}"}, r"--time.latency='trace:.*': a trace must be a numeric \[N\] or \[rounds, N\]"),
    ]
    for fields, message in cases:
        with pytest.raises(ValueError, match=message):
            Network(**fields)


def test_a_slow_uplink_slows_the_clock_and_leaves_the_iterates():
    uniform, constant, slow = timed_tiny_run(), timed_tiny_run(bandwidth="constant:1e9"), timed_tiny_run(bandwidth="stragglers:0.125,10")
    np.testing.assert_array_equal(np.asarray(uniform.metrics.sim_time), np.asarray(constant.metrics.sim_time))
    assert_only_the_clock_differs(uniform, slow)


def test_the_commands_take_specs_and_refuse_bad_ones(tmp_path, capsys):
    from tiny import TINY_FLAGS

    from jaxgossip.cli import main

    out = str(tmp_path / "run")
    base = ["train", *TINY_FLAGS, "--no-progress", "--out", out, "--time.compute=0.01"]
    assert main([*base, "--time.bandwidth=stragglers:2,10"]) == 2
    assert "--time.bandwidth='stragglers:2,10': expected stragglers:F,S" in capsys.readouterr().err
    assert main(["consensus", "--num_nodes=4", "--num_steps=3", "--out", out, "--time.latency=lognormal:0,1"]) == 2
    assert "--time.latency='lognormal:0,1': expected lognormal:MEDIAN,SIGMA" in capsys.readouterr().err
    np.save(tmp_path / "rounds.npy", np.full((3, 4), 1e8))
    argv = [*base, "--execution=async", f"--time.bandwidth=trace:{tmp_path / 'rounds.npy'}"]
    assert main(argv) == 2
    assert "changes with the round (a [rounds, N] trace), but an --execution=async run" in capsys.readouterr().err
    sweep = ["sweep", *TINY_FLAGS, "--no-progress", "--out", str(tmp_path / "sweep"), "--time.compute=0.01"]
    assert main([*sweep, "--sweep.time.bandwidth=lognormal:1e8,-1"]) == 2
    assert "--time.bandwidth='lognormal:1e8,-1': expected lognormal:MEDIAN,SIGMA" in capsys.readouterr().err
    # a spec in the base run, a number swept on top of it
    assert main([*sweep, "--time.bandwidth=stragglers:0.25,10", "--sweep.time.latency=1e-4,1e-2"]) == 0
    assert main(["consensus", "--num_nodes=4", "--num_steps=3", "--out", out, "--time.bandwidth=stragglers:0.25,10"]) == 0


def test_the_streaming_clock_takes_each_rounds_links(tmp_path):
    """Streaming DiLoCo's clock with one fragment and no overlap is the synchronous round, bit for
    bit, with per-node links that change with the round."""
    from jaxgossip.engine.streaming import Streaming, launch_and_merge_steps
    from jaxgossip.sim import fragment_clock

    n = 6
    np.save(tmp_path / "bw.npy", np.random.default_rng(2).uniform(1e5, 1e7, (3, n)))
    net = Network(compute=0.01, latency="stragglers:0.34,5", bandwidth=f"trace:{tmp_path / 'bw.npy'}")
    model = timing.time_model(jg.topology.ring(n), net, exchanges=1, allreduce=False, seed=4)
    key = jax.random.key(3)
    launch, merge = launch_and_merge_steps(2, Streaming(1, 0, 0.0))
    arrivals = np.zeros([1, n], np.float32)
    taus = set()
    for t in range(4):
        bits = np.full(n, 1e5, np.float32)
        want = timing.round_seconds(model, key, bits, t, 2)
        tau, comm, _ = fragment_clock.stream_round_seconds(model, key, bits[None], t, 2, launch, merge, arrivals)
        np.testing.assert_array_equal(np.asarray(tau), np.asarray(want[0]))
        np.testing.assert_array_equal(np.asarray(comm), np.asarray(want[1]))
        taus.add(float(tau))
    assert len(taus) == 3  # rounds 0 and 3 share a trace row, the others differ


def test_an_asynchronous_run_prices_each_senders_uplink():
    """AD-PSGD's priced exchanges and the planner's per-link delays read a node's spec value."""
    from tiny import tiny_config

    from jaxgossip.run.runner import run_training

    def sim_time(**time):
        config = tiny_config(execution="async", async_form="ad_psgd", num_rounds=10, time={"compute": 0.01, **time})
        return np.asarray(run_training(config, progress=False, log=lambda _: None).metrics.sim_time)

    uniform, slow = sim_time(), sim_time(latency="stragglers:0.25,100")
    assert slow[-1] > uniform[-1] + 0.01


def test_a_list_on_the_command_line_is_still_per_node_links():
    from jaxgossip.cli.train import command
    from jaxgossip.run.config import TrainConfig
    from jaxgossip.run.parsing import parse

    config = parse(command(), ["--time.bandwidth=[1e8,1e9,1e9,1e9]", "--time.latency=lognormal:1e-3,1"])
    net = Network.from_options(config.build(TrainConfig).time)
    np.testing.assert_array_equal(net.bandwidth, [1e8, 1e9, 1e9, 1e9])
    assert net.latency == "lognormal:1e-3,1" and net.link_specs["latency"].kind == "lognormal"
    with pytest.raises(ValueError, match=r"--time.bandwidth='\[1e8,x\]': expected a list of numbers"):
        Network(bandwidth="[1e8,x]")


def test_resume_with_drawn_and_cycled_links_is_bit_identical(tmp_path):
    from tiny import tiny_config

    from jaxgossip.run.runner import run_training

    np.save(tmp_path / "lat.npy", np.random.default_rng(5).uniform(1e-4, 1e-2, (3, 4)))
    time = {"compute": 0.01, "bandwidth": "lognormal:1e6,1", "latency": f"trace:{tmp_path / 'lat.npy'}"}
    config = tiny_config(time=time, seed=2)
    quiet = {"progress": False, "log": lambda _: None}
    full = run_training(config, str(tmp_path / "a"), **quiet)
    assert not run_training(config, str(tmp_path / "b"), stop_after_chunks=2, **quiet).finished
    rest = run_training(config, str(tmp_path / "b"), **quiet)
    for a, b in zip(jax.tree_util.tree_leaves(full.state), jax.tree_util.tree_leaves(rest.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert [r["sim_time"] for r in full.rows] == [r["sim_time"] for r in rest.rows]
    other = run_training(config.replace(seed=3), **quiet)  # another seed draws other links
    assert other.rows[-1]["sim_time"] != full.rows[-1]["sim_time"]
