"""Downlinks (--time.downlink, jaxgossip.sim.network): comm_seconds against a NumPy loop over nodes,
edges and in-neighbours, an unlimited or huge downlink equal to no downlink bit for bit, a slow one
that slows the clock and leaves the iterates alone, cost.simulate equal to the compiled clock, and
the refusals."""

import jax
import numpy as np
import pytest
from _reference import assert_only_the_clock_differs, clock_equals_simulate, timed_tiny_run

import jaxgossip as jg
from jaxgossip.sim.link_specs import PerRound
from jaxgossip.sim.network import Network, comm_seconds, make_links


def _reference(topo, bits, t, latency, bandwidth, downlink, mode, exchanges):
    """c_i by a loop: node i's messages to its out-neighbours j take l_i + B / min(b_i, d_j); in
    serial mode they share i's uplink, and i's downlink carries the messages of its in-neighbours
    (D_i = sum_j bits_j / deg_j / d_i), c_i = max(U_i, D_i)."""
    w = topo.matrix(t % topo.period)
    n = topo.num_nodes
    outs = [[j for j in range(n) if j != i and w[j, i] != 0] for i in range(n)]
    up, down = np.zeros(n), np.zeros(n)
    for i in range(n):
        if not outs[i] or bits[i] == 0:
            continue
        message = bits[i] / len(outs[i]) / exchanges
        per = [latency[i] + message / min(bandwidth[i], downlink[j]) for j in outs[i]]
        up[i] = exchanges * (sum(per) if mode == "serial" else max(per))
        for j in outs[i]:
            down[j] += exchanges * message / downlink[j]
    return np.maximum(up, down) if mode == "serial" else up


def _irregular():
    """A directed graph whose node 0 has four in-neighbours and one out-neighbour."""
    a = np.zeros((6, 6))
    for i, j in [(1, 0), (2, 0), (3, 0), (4, 0), (0, 5), (5, 1), (1, 2), (2, 3), (3, 4), (4, 5)]:
        a[i, j] = 1  # i sends to j
    return jg.topology.from_adjacency(a.T, weights="column")


@pytest.mark.parametrize("mode", ["serial", "parallel"])
@pytest.mark.parametrize("graph", ["exponential", "irregular"])
def test_comm_seconds_with_downlinks_match_the_node_loop(mode, graph):
    topo = jg.topology.exponential(8) if graph == "exponential" else _irregular()
    n = topo.num_nodes
    rng = np.random.default_rng(1)
    latency, bandwidth = rng.uniform(1e-4, 1e-3, n), rng.uniform(1e6, 1e7, n)
    downlink = rng.uniform(2e5, 2e7, n)
    bits = rng.uniform(1e4, 1e6, n)
    bits[3] = 0.0  # sends nothing, still receives in serial mode
    with jax.enable_x64(True):
        for exchanges in (1, 2):
            links = make_links(topo, latency, bandwidth, mode=mode, exchanges=exchanges, downlink=downlink)
            got = np.asarray(comm_seconds(links, bits, 0))
            want = _reference(topo, bits, 0, latency, bandwidth, downlink, mode, exchanges)
            np.testing.assert_allclose(got, want, rtol=1e-12)
            assert (got[3] > 0) == (mode == "serial")
        # a downlink per round: row r mod R
        table = rng.uniform(2e5, 2e7, (3, n))
        links = make_links(topo, latency, bandwidth, mode=mode, downlink=PerRound(table))
        for t in range(4):
            want = _reference(topo, bits, t, latency, bandwidth, table[t % 3], mode, 1)
            np.testing.assert_allclose(np.asarray(comm_seconds(links, bits, t)), want, rtol=1e-12)


def test_all_reduce_steps_go_at_the_slower_side():
    n, bits = 6, np.linspace(1e5, 6e5, 6)
    down = np.array([1e7, 1e5, 1e7, 1e7, 3e5, 1e7])
    with jax.enable_x64(True):
        for model, steps, chunk in (("ring", 2 * (n - 1), n), ("message", 1, 1)):
            links = make_links(None, 1e-3, 1e6, allreduce=model, num_nodes=n, downlink=down)
            want = steps * (1e-3 + bits / chunk / np.minimum(1e6, down))
            np.testing.assert_allclose(np.asarray(comm_seconds(links, bits, 0)), want, rtol=1e-12)


def test_an_unlimited_downlink_changes_nothing_and_a_slow_one_only_the_clock():
    plain, unlimited, huge = timed_tiny_run(), timed_tiny_run(downlink="unlimited"), timed_tiny_run(downlink=1e30)
    slow = timed_tiny_run(downlink="stragglers:0.25,100")
    for other in (unlimited, huge):
        np.testing.assert_array_equal(np.asarray(plain.metrics.sim_time), np.asarray(other.metrics.sim_time))
    assert_only_the_clock_differs(plain, slow)


@pytest.mark.parametrize("algorithm, mode", [("gossip", "serial"), ("gossip", "parallel"), ("allreduce", "serial")])
def test_simulate_equals_the_compiled_clock_with_downlinks(algorithm, mode):
    topo = jg.topology.erdos_renyi(8, 0.5, seed=1)
    rng = np.random.default_rng(0)
    net = Network(
        latency=rng.uniform(1e-4, 1e-3, 8),
        bandwidth=rng.uniform(1e6, 1e7, 8),
        downlink=rng.uniform(5e5, 5e6, 8),
        mode=mode,
    )
    priced = clock_equals_simulate(topo, net, algorithm)
    without = clock_equals_simulate(topo, Network(latency=net.latency, bandwidth=net.bandwidth, mode=mode), algorithm)
    assert priced.total_time > without.total_time


def test_a_device_trace_prices_its_downlink(tmp_path):
    from jaxgossip.sim.traces import DeviceTrace, save_device_trace

    rng = np.random.default_rng(3)
    up, down = rng.uniform(1e6, 1e7, (1, 4)), rng.uniform(1e5, 1e6, (2, 4))
    save_device_trace(str(tmp_path / "dev.npz"), DeviceTrace(uplink_bps=up, downlink_bps=down))
    path = f"trace:{tmp_path / 'dev.npz'}"
    net = Network(bandwidth=path, downlink=path)
    assert net.round_varying_fields == ("downlink",)
    values = net.downlink_values(4)
    assert isinstance(values, PerRound)
    np.testing.assert_allclose(values.values, down.astype(np.float32), rtol=0)


def test_downlink_refusals():
    cases = [
        ({"downlink": 0}, r"--time.downlink=0 must be > 0"),
        ({"downlink": "stragglers:2,10"}, r"--time.downlink='stragglers:2,10': expected stragglers:F,S"),
        ({"downlink": "fast"}, r"--time.downlink='fast' must be a number \(bit/s\)"),
        ({"downlink": "edge_trace:x.csv"}, r"--time.downlink='edge_trace:x.csv': a downlink is a node's"),
        ({"downlink": np.ones((2, 3))}, r"--time.downlink is a node's: a scalar or \[N\]"),
    ]
    for fields, message in cases:
        with pytest.raises(ValueError, match=message):
            Network(**fields)
    with pytest.raises(ValueError, match=r"--time.downlink needs a fixed graph: random_matching.* is drawn every round"):
        Network(downlink=1e6).links(jg.topology.random_matching(8))


def test_the_commands_take_a_downlink_and_refuse_bad_ones(tmp_path, capsys):
    from tiny import TINY_FLAGS

    from jaxgossip.cli import main

    out = str(tmp_path / "run")
    base = ["train", *TINY_FLAGS, "--no-progress", "--out", out, "--time.compute=0.01"]
    assert main([*base, "--time.downlink=lognormal:0,1"]) == 2
    assert "--time.downlink='lognormal:0,1': expected lognormal:MEDIAN,SIGMA" in capsys.readouterr().err
    assert main([*base, "--time.downlink=1e6", "--topology=random_matching"]) == 2
    assert "--time.downlink needs a fixed graph" in capsys.readouterr().err
    consensus = ["consensus", "--num_nodes=4", "--num_steps=3", "--out", out]
    assert main([*consensus, "--time.downlink=-1"]) == 2
    assert "--time.downlink=-1" in capsys.readouterr().err
    assert main([*consensus, "--time.downlink=stragglers:0.25,10"]) == 0
    sweep = ["sweep", *TINY_FLAGS, "--no-progress", "--out", str(tmp_path / "sweep"), "--time.compute=0.01"]
    assert main([*sweep, "--sweep.time.downlink=stragglers:0.25,0.5"]) == 2
    assert "--time.downlink='stragglers:0.25,0.5': expected stragglers:F,S" in capsys.readouterr().err
    assert main([*sweep, "--sweep.time.downlink=1e5,1e9"]) == 0
