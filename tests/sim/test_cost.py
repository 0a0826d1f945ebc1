"""Tests of jaxgossip.sim.cost: hand-computed examples, a plain loop reference, and input errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxgossip as jg
from jaxgossip.algorithms import pair_tables
from jaxgossip.sim import cost
from jaxgossip.sim.cost import EnergyModel, memory_per_node, per_round_bits, simulate
from jaxgossip.sim.network import LINK_MODES, Network

B, BW, LAT = 8e6, 1e8, 0.01  # bits, bit/s, s: one message takes LAT + B / BW = 0.09 s


def test_one_message():
    topo = jg.topology.directed_ring(4)  # i -> i + 1, out-degree 1
    bits = np.array([[B, 0.0, 0.0, 0.0]])
    report = simulate(bits, topo, Network(bandwidth=BW, latency=LAT))
    np.testing.assert_allclose(report.comm_time, [LAT + B / BW])
    np.testing.assert_allclose(report.round_time, [LAT + B / BW])
    assert report.total_time == pytest.approx(LAT + B / BW)
    np.testing.assert_array_equal(report.bits, bits)
    np.testing.assert_array_equal(report.energy, 0.0)
    assert report.memory is None


def test_two_messages_serial_vs_parallel():
    topo = jg.topology.ring(4)  # out-degree 2: each node sends its 2B bits as two messages of B
    bits = np.full((3, 4), 2 * B)
    serial = simulate(bits, topo, Network(bandwidth=BW, latency=LAT, mode="serial"))
    parallel = simulate(bits, topo, Network(bandwidth=BW, latency=LAT, mode="parallel"))
    np.testing.assert_allclose(serial.round_time, 2 * (LAT + B / BW))
    np.testing.assert_allclose(parallel.round_time, LAT + B / BW)
    assert serial.total_time == pytest.approx(3 * 2 * (LAT + B / BW))


def test_slowest_node_dominates_with_per_node_links():
    topo = jg.topology.ring(4)
    bandwidth = np.array([1e8, 1e8, 1e7, 1e8])  # node 2 has a slow uplink
    latency = np.array([0.01, 0.05, 0.0, 0.01])
    bits = np.full((1, 4), 2 * B)
    report = simulate(bits, topo, Network(bandwidth=bandwidth, latency=latency))
    per_node = 2 * (latency + B / bandwidth)
    np.testing.assert_allclose(report.comm_time, [per_node.max()])
    assert per_node.argmax() == 2


def test_per_edge_links():
    topo = jg.topology.directed_ring(3)  # edges: self-loops and i -> i + 1
    bandwidth = np.full(topo.senders.shape, 1e8)
    latency = np.zeros(topo.senders.shape)
    slow = np.flatnonzero((topo.senders[0] == 1) & (topo.receivers[0] == 2))
    bandwidth[0, slow], latency[0, slow] = 1e6, 0.5
    report = simulate(np.full((2, 3), B), topo, Network(bandwidth=bandwidth, latency=latency))
    np.testing.assert_allclose(report.comm_time, 0.5 + B / 1e6)


def test_zero_bits_pay_no_latency():
    report = simulate(np.zeros((2, 4)), jg.topology.ring(4), Network(bandwidth=BW, latency=LAT))
    np.testing.assert_array_equal(report.round_time, 0.0)


def test_compute_and_overlap_per_node():
    topo = jg.topology.directed_ring(2)
    flops = 1e9
    device_flops = np.array([1e9, 1e10])  # compute 1 s on node 0, 0.1 s on node 1
    bandwidth = np.array([1e9, 1e7])  # comm 0.1 s on node 0, 1 s on node 1 (B = 1e7)
    bits = np.full((1, 2), 1e7)
    link = Network(bandwidth=bandwidth, latency=0.0)
    plain = simulate(bits, topo, link, flops_per_step=flops, device_flops=device_flops)
    over = simulate(bits, topo, link, flops_per_step=flops, device_flops=device_flops, overlap=True)
    np.testing.assert_allclose(plain.compute_time, [1.0, 0.1])
    np.testing.assert_allclose(plain.comm_time, [1.0])
    # max_i (p_i + c_i) = 1.1, not max p + max c = 2.0; with overlap max_i max(p_i, c_i) = 1.0
    np.testing.assert_allclose(plain.round_time, [1.1])
    np.testing.assert_allclose(over.round_time, [1.0])


def test_energy():
    topo = jg.topology.ring(4)
    rng = np.random.default_rng(0)
    bits = rng.uniform(1e3, 1e6, size=(3, 4))
    j_flop, j_bit, flops = 1e-11, np.array([1e-9, 2e-9, 3e-9, 4e-9]), 5e8
    report = simulate(
        bits, topo, Network(bandwidth=BW, latency=LAT), flops_per_step=flops, device_flops=1e12, energy=EnergyModel(j_flop, j_bit)
    )
    np.testing.assert_allclose(report.energy, flops * j_flop + bits * j_bit, rtol=1e-12)
    np.testing.assert_allclose(report.total_energy, (flops * j_flop + bits * j_bit).sum(0), rtol=1e-12)


def test_exchanges():
    topo = jg.topology.ring(4)
    report = simulate(np.full((1, 4), 2 * B), topo, Network(bandwidth=BW, latency=LAT, mode="parallel"), exchanges=2)
    np.testing.assert_allclose(report.round_time, 2 * (LAT + B / 2 / BW))


def test_allreduce_ring_and_message():
    n = 4
    bits = np.full((2, n), B)
    ring = simulate(bits, None, Network(bandwidth=BW, latency=LAT, allreduce_model="ring"), allreduce=True)
    one = simulate(bits, None, Network(bandwidth=BW, latency=LAT, allreduce_model="message"), allreduce=True)
    np.testing.assert_allclose(ring.round_time, 2 * (n - 1) * (LAT + B / n / BW))
    np.testing.assert_allclose(ring.bits, 2 * (n - 1) / n * B)
    np.testing.assert_allclose(one.round_time, LAT + B / BW)
    np.testing.assert_allclose(one.bits, B)


def _loop_reference(bits, topo, bandwidth, latency, mode, flops, device_flops):
    """Plain per-round, per-node, per-edge loop of the module docstring's model."""
    rounds, n = bits.shape
    times = []
    for r in range(rounds):
        t = r % topo.period
        node_times = []
        for i in range(n):
            edges = [
                e
                for e in range(topo.num_edges)
                if topo.senders[t, e] == i and topo.receivers[t, e] != i and topo.weights[t, e] != 0
            ]
            msgs = [latency[t, e] + bits[r, i] / len(edges) / bandwidth[t, e] for e in edges if bits[r, i] > 0]
            comm = (sum(msgs) if mode == "serial" else max(msgs)) if msgs else 0.0
            node_times.append(flops / device_flops[i] + comm)
        times.append(max(node_times))
    return np.array(times)


@pytest.mark.parametrize("mode", LINK_MODES)
@pytest.mark.parametrize("topo_name", ["erdos_renyi", "one_peer_exponential"])
def test_against_loop_reference(mode, topo_name):
    rng = np.random.default_rng(1)
    if topo_name == "erdos_renyi":
        topo = jg.topology.erdos_renyi(6, 0.5, seed=3)
    else:
        topo = jg.topology.one_peer_exponential(8)
    n = topo.num_nodes
    bandwidth = rng.uniform(1e6, 1e8, size=topo.senders.shape)
    latency = rng.uniform(0.0, 0.05, size=topo.senders.shape)
    bits = rng.uniform(1e4, 1e6, size=(7, n)) * (rng.random((7, n)) > 0.2)
    device_flops = rng.uniform(1e9, 1e10, size=n)
    report = simulate(
        bits, topo, Network(bandwidth=bandwidth, latency=latency, mode=mode), flops_per_step=1e8, device_flops=device_flops
    )
    expected = _loop_reference(bits, topo, bandwidth, latency, mode, 1e8, device_flops)
    np.testing.assert_allclose(report.round_time, expected, rtol=1e-12)


def test_simulate_matches_stepinfo_bits_of_gossip():
    topo = jg.topology.ring(4)
    alg = jg.algorithms.make("gossip", topo)
    params = {"w": jnp.zeros((4, 10))}
    _, _, info = alg.step(params, alg.init(params), jax.random.key(0))
    report = simulate(np.asarray(info.bits)[None], topo, Network(bandwidth=BW, latency=LAT, mode="serial"))
    np.testing.assert_allclose(report.round_time, [2 * (LAT + 320 / BW)])  # 10 fp32 values per message


def test_per_round_bits():
    cumulative = np.array([[4.0, 2.0], [10.0, 2.0], [10.0, 5.0]])
    out = per_round_bits(cumulative, [2, 4, 5])
    np.testing.assert_allclose(out, [[2, 1], [2, 1], [3, 0], [3, 0], [0, 3]])
    np.testing.assert_allclose(out.cumsum(0)[[1, 3, 4]], cumulative)


def _alternating(n=4):
    """Round t even: undirected ring (out-degree 2); t odd: directed ring (out-degree 1)."""
    return jg.topology.schedule([jg.topology.ring(n), jg.topology.directed_ring(n)])


def test_per_round_bits_follows_out_degree_of_each_round():
    topo = _alternating()
    message = np.array([100.0, 200.0, 300.0, 400.0])  # each node's (constant) message size
    exact = topo.out_degree[np.arange(6) % 2] * message  # [R, N] bits actually sent
    cumulative = exact.cumsum(0)[[2, 5]]  # evaluation points after rounds 3 and 6
    spread = per_round_bits(cumulative, [3, 6], topo)
    np.testing.assert_allclose(spread, exact, rtol=1e-12)
    even = per_round_bits(cumulative, [3, 6])
    assert not np.allclose(even, exact)  # even spreading charges odd rounds too much
    # a round in which a node has no out-neighbour gets none of its bits (even spreading would
    # charge it half of them, which simulate rejects)
    no_edges = jg.topology.schedule([jg.topology.ring(4), _self_loops_only(4)])
    bits = no_edges.out_degree[np.arange(4) % 2] * 50.0
    np.testing.assert_allclose(per_round_bits(bits.cumsum(0)[[1, 3]], [2, 4], no_edges), bits)


def test_simulate_start_round_picks_the_graph_of_each_round():
    topo = _alternating()
    bits = np.full((2, 4), B)  # B bits per node: 2 messages of B / 2 on the ring, 1 of B on the cycle
    ring_round, cycle_round = 2 * (LAT + B / 2 / BW), LAT + B / BW
    np.testing.assert_allclose(simulate(bits, topo, Network(bandwidth=BW, latency=LAT)).round_time, [ring_round, cycle_round])
    np.testing.assert_allclose(
        simulate(bits, topo, Network(bandwidth=BW, latency=LAT), start_round=3).round_time, [cycle_round, ring_round]
    )
    with pytest.raises(ValueError, match="start_round must be an int >= 0"):
        simulate(bits, topo, Network(bandwidth=BW, latency=LAT), start_round=-1)
    with pytest.raises(ValueError, match="has no out-neighbours in round 5"):
        simulate(
            np.ones((2, 4)),
            jg.topology.schedule([jg.topology.ring(4), _self_loops_only(4)]),
            Network(bandwidth=BW, latency=LAT),
            start_round=4,
        )


def test_flops_per_step_dense_layer():
    batch, fan_in, fan_out = 32, 16, 8
    loss = lambda w, x: jnp.sum((x @ w) ** 2)  # noqa: E731
    flops = cost.flops_per_step(loss, jnp.ones((fan_in, fan_out)), jnp.ones((batch, fan_in)))
    # forward 2 B in out, backward 1x-2x that again (+ small elementwise terms): 2x-3x, documented
    ratio = flops / (2 * batch * fan_in * fan_out)
    assert 1.9 <= ratio <= 3.5, ratio
    forward = cost.flops_per_step(loss, jnp.ones((fan_in, fan_out)), jnp.ones((batch, fan_in)), grad=False)
    assert 0.9 <= forward / (2 * batch * fan_in * fan_out) <= 1.5


def test_flops_from_analysis_variants():
    assert cost._flops_from_analysis({"flops": 12.0}) == 12.0
    assert cost._flops_from_analysis([{"flops": 7.0}]) == 7.0
    for bad in (None, [], {"bytes accessed": 1.0}, {"flops": -1.0}):
        with pytest.raises(RuntimeError, match="no FLOP count"):
            cost._flops_from_analysis(bad)


def test_memory_per_node():
    n, m = 4, 16
    topo = jg.topology.ring(n)
    params = {"w": jnp.zeros((n, m, m)), "b": jnp.zeros((n, m))}
    model = (m * m + m) * 4
    states = {name: jg.algorithms.make(name, topo).init(params) for name in ("gossip", "choco", "power_gossip")}
    assert memory_per_node(params, None, states["gossip"]) == pytest.approx(model + 4 / n)  # + count
    assert memory_per_node(params, None, states["choco"], n) == pytest.approx(3 * model + 4 / n)
    # power_gossip: P = 4 pairs of the 4-ring, u and v [P, 16, 1] fp32, a count and a PRNG key
    pairs = pair_tables(topo).a.size
    assert memory_per_node(params, None, states["power_gossip"]) == pytest.approx(
        model + (2 * pairs * m * 1 * 4 + 4 + 8) / n
    )
    opt_state = jax.vmap(optax.adam(1e-3).init)(params)
    shapes = jax.eval_shape(lambda: opt_state)
    assert memory_per_node(params, shapes) == pytest.approx(3 * model + 4)  # mu, nu and [N] counts


def _self_loops_only(n=2):
    eye = np.arange(n, dtype=np.int32)[None]
    return jg.topology.Topology("self-loops", n, eye, eye, np.ones((1, n)), directed=False)


def test_errors():
    topo = jg.topology.ring(4)
    ok = np.full((1, 4), B)
    with pytest.raises(ValueError, match="bandwidth=0.0 must be > 0"):
        Network(bandwidth=0.0, latency=LAT)
    with pytest.raises(ValueError, match="latency=-1.0 must be >= 0"):
        Network(bandwidth=BW, latency=-1.0)
    with pytest.raises(ValueError, match="bandwidth=nan must be finite"):
        Network(bandwidth=np.nan, latency=LAT)
    with pytest.raises(ValueError, match="latency must be a scalar"):
        Network(bandwidth=BW, latency=np.zeros((1, 2, 3)))
    with pytest.raises(ValueError, match=r"bandwidth per node must have shape \[N\]"):
        simulate(ok, topo, Network(bandwidth=np.ones(5), latency=LAT))
    with pytest.raises(ValueError, match=r"latency per edge must have shape \[T, E\]"):
        simulate(ok, topo, Network(bandwidth=BW, latency=np.zeros((1, 3))))
    with pytest.raises(ValueError, match="bits has N = 3 columns"):
        simulate(np.ones((1, 3)), topo, Network(bandwidth=BW, latency=LAT))
    with pytest.raises(ValueError, match=r"bits must have shape \[R, N\]"):
        simulate(np.ones(4), topo, Network(bandwidth=BW, latency=LAT))
    with pytest.raises(ValueError, match="bits must be finite and >= 0"):
        simulate(-ok, topo, Network(bandwidth=BW, latency=LAT))
    with pytest.raises(ValueError, match="mode='fast' is unknown"):
        Network(bandwidth=BW, latency=LAT, mode="fast")
    with pytest.raises(ValueError, match="local_steps must be an int >= 0"):
        simulate(ok, topo, Network(bandwidth=BW, latency=LAT), local_steps=-1)
    with pytest.raises(ValueError, match="exchanges must be an int >= 1"):
        simulate(ok, topo, Network(bandwidth=BW, latency=LAT), exchanges=0)
    with pytest.raises(ValueError, match="allreduce_model='tree' is unknown"):
        Network(bandwidth=BW, latency=LAT, allreduce_model="tree")
    with pytest.raises(ValueError, match="allreduce needs scalar or per-node"):
        simulate(ok, None, Network(bandwidth=np.ones(topo.senders.shape), latency=LAT), allreduce=True)
    with pytest.raises(ValueError, match="topology is None"):
        simulate(ok, None, Network(bandwidth=BW, latency=LAT))
    with pytest.raises(ValueError, match="has no out-neighbours"):
        simulate(np.ones((1, 2)), _self_loops_only(), Network(bandwidth=BW, latency=LAT))
    with pytest.raises(ValueError, match="needs device_flops"):
        simulate(ok, topo, Network(bandwidth=BW, latency=LAT), flops_per_step=1.0)
    with pytest.raises(ValueError, match="flops_per_step must be finite and >= 0"):
        simulate(ok, topo, Network(bandwidth=BW, latency=LAT), flops_per_step=-1.0)
    with pytest.raises(ValueError, match="device_flops must be > 0"):
        simulate(ok, topo, Network(bandwidth=BW, latency=LAT), flops_per_step=1.0, device_flops=0.0)
    with pytest.raises(ValueError, match="joules_per_bit must be >= 0"):
        EnergyModel(0.0, -1.0)
    with pytest.raises(ValueError, match=r"joules_per_flop per node must have shape \[N\]"):
        simulate(ok, topo, Network(bandwidth=BW, latency=LAT), energy=EnergyModel(np.ones(3), 0.0))
    with pytest.raises(ValueError, match="num_nodes must be an int >= 1"):
        memory_per_node({"w": jnp.zeros((4, 2))}, num_nodes=0)
    with pytest.raises(ValueError, match="no leaf with a leading node axis"):
        memory_per_node({})
    with pytest.raises(ValueError, match="rounds must be non-decreasing"):
        per_round_bits(np.ones((2, 3)), [2, 1])
    with pytest.raises(ValueError, match=r"cumulative_bits must be \[M, N\]"):
        per_round_bits(np.ones((2, 3)), [1, 2, 3])
    with pytest.raises(ValueError, match="cumulative_bits has N = 3 columns"):
        per_round_bits(np.ones((1, 3)), [2], topo)
    with pytest.raises(ValueError, match="node 0 sent bits up to round 1 but has no out-neighbour"):
        per_round_bits(np.ones((1, 4)), [1], _self_loops_only(4))
