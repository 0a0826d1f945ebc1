"""Per-edge link traces (edge_trace:PATH, jaxgossip.sim.edge_traces): the same links as the [T, E]
array passed from Python, cycled over rounds, on static and time-varying graphs, cost.simulate equal
to the compiled clock, and the refusals (exit 2 on the command line)."""

import jax
import numpy as np
import pytest

import jaxgossip as jg
from jaxgossip.sim import timing
from jaxgossip.sim.cost import simulate
from jaxgossip.sim.network import Network, comm_seconds, make_links


def _pairs(topo, t=None):
    """The real directed edges (sender, receiver) of graph t (all graphs: None), ascending."""
    out = set()
    for g in range(topo.period) if t is None else [t]:
        s, r, w = (np.asarray(a)[g] for a in (topo.senders, topo.receivers, topo.weights))
        out |= {(int(a), int(b)) for a, b, c in zip(s, r, w) if a != b and c != 0}
    return sorted(out)


def _write_csv(path, rows):
    """``rows``: a list (one per row) of {(sender, receiver): value}."""
    lines = ["row,sender,receiver,value"]
    for k, values in enumerate(rows):
        lines += [f"{k},{a},{b},{v!r}" for (a, b), v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _as_array(topo, values, t):
    """A [E] array of graph t aligned with topo.senders: each real edge's value by its pair."""
    s, r, w = (np.asarray(a)[t] for a in (topo.senders, topo.receivers, topo.weights))
    return np.array([values[(int(a), int(b))] if a != b and c != 0 else 1.0 for a, b, c in zip(s, r, w)])


def _draw(pairs, rng, low, high):
    return {p: float(rng.uniform(low, high)) for p in pairs}


@pytest.mark.parametrize("mode", ["serial", "parallel"])
def test_a_csv_trace_equals_the_array_from_python(tmp_path, mode):
    rng = np.random.default_rng(0)
    bits = rng.uniform(1e4, 1e6, 8)
    for topo in (jg.topology.exponential(8), jg.topology.one_peer_exponential(8)):  # static, then T = 3
        pairs = _pairs(topo)
        lat, bw = _draw(pairs, rng, 1e-4, 1e-3), _draw(pairs, rng, 1e6, 1e7)
        net = Network(
            latency=f"edge_trace:{_write_csv(tmp_path / 'lat.csv', [lat])}",
            bandwidth=f"edge_trace:{_write_csv(tmp_path / 'bw.csv', [bw])}",
            mode=mode,
        )
        assert not net.round_varying
        t_e = [np.stack([_as_array(topo, v, t) for t in range(topo.period)]) for v in (lat, bw)]
        want = make_links(topo, *t_e, mode=mode, exchanges=2)
        got = net.links(topo, exchanges=2)
        for t in range(2 * topo.period):
            np.testing.assert_array_equal(np.asarray(comm_seconds(got, bits, t)), np.asarray(comm_seconds(want, bits, t)))


def test_rows_cycle_over_rounds_on_a_static_graph_and_align_with_a_period(tmp_path):
    rng = np.random.default_rng(1)
    bits = rng.uniform(1e4, 1e6, 6)
    ring = jg.topology.ring(6)
    pairs = _pairs(ring)
    table = rng.uniform(1e6, 1e7, (3, len(pairs)))
    np.save(tmp_path / "bw.npy", table)  # .npy: the real edges in ascending (sender, receiver) order
    net = Network(bandwidth=f"edge_trace:{tmp_path / 'bw.npy'}", downlink=4e6)
    assert net.round_varying and net.round_varying_fields == ("bandwidth",)
    with jax.enable_x64(True):
        links = net.links(ring)
        for t in range(5):
            row = dict(zip(pairs, table[t % 3]))
            want = make_links(ring, 1e-4, _as_array(ring, row, 0)[None], downlink=4e6)
            np.testing.assert_array_equal(np.asarray(comm_seconds(links, bits, t)), np.asarray(comm_seconds(want, bits, t)))
    # R = T on a time-varying graph: row t is graph t's
    peer = jg.topology.one_peer_exponential(8)
    rows = [_draw(_pairs(peer, t), rng, 1e6, 1e7) for t in range(peer.period)]
    net = Network(bandwidth=f"edge_trace:{_write_csv(tmp_path / 'peer.csv', rows)}")
    shifted = Network(bandwidth=f"edge_trace:{_write_csv(tmp_path / 'shifted.csv', rows[1:] + rows[:1])}")
    with pytest.raises(ValueError, match=r"edge .* is missing from row 0|edge .* is not an edge of graph"):
        shifted.links(peer)
    want = make_links(peer, 1e-4, np.stack([_as_array(peer, rows[t], t) for t in range(peer.period)]))
    got, bits = net.links(peer), rng.uniform(1e4, 1e6, 8)
    for t in range(6):
        np.testing.assert_array_equal(np.asarray(comm_seconds(got, bits, t)), np.asarray(comm_seconds(want, bits, t)))


def test_simulate_equals_the_compiled_clock_with_an_edge_trace(tmp_path):
    topo = jg.topology.erdos_renyi(8, 0.5, seed=1)
    rng = np.random.default_rng(2)
    rows = [_draw(_pairs(topo), rng, 1e6, 1e7) for _ in range(3)]
    net = Network(bandwidth=f"edge_trace:{_write_csv(tmp_path / 'bw.csv', rows)}", downlink=rng.uniform(2e7, 5e7, 8))
    alg = jg.algorithms.make("gossip", topo)
    result = jg.run_consensus(alg, {"x": jnp_normal()}, 6, jax.random.key(1), time=timing.time_model(topo, net, algorithm="gossip"))
    priced = simulate(np.asarray(result.node_bits, np.float64), topo, net)
    np.testing.assert_allclose(np.asarray(result.sim_time)[1:], np.cumsum(priced.round_time), rtol=1e-6)
    assert len(set(np.round(priced.round_time[:3], 12))) == 3  # each row its own links


def jnp_normal():
    return jax.random.normal(jax.random.key(0), (8, 100))


def test_bad_edge_traces_name_the_file_and_the_problem(tmp_path):
    ring = jg.topology.ring(4)
    full = {p: 1e7 for p in _pairs(ring)}
    missing = dict(list(full.items())[1:])
    extra = {**full, (0, 2): 1e7}
    negative = {**full, (0, 1): -1.0}
    loop = {**full, (2, 2): 1e7}
    np.save(tmp_path / "wide.npy", np.ones(9))
    (tmp_path / "head.csv").write_text("from,to,value\n0,1,1e7\n")
    (tmp_path / "twice.csv").write_text("row,sender,receiver,value\n0,0,1,1\n0,0,1,2\n")

    def path(name, values):
        return _write_csv(tmp_path / name, values)

    at_build = [
        ({"bandwidth": f"edge_trace:{path('neg.csv', [negative])}"}, r"--time.bandwidth='edge_trace:.*neg.csv': the trace must be finite and > 0"),
        ({"latency": f"edge_trace:{path('loop.csv', [loop])}"}, r"--time.latency='edge_trace:.*': edge 2 -> 2 is a self loop"),
        ({"latency": f"edge_trace:{tmp_path / 'head.csv'}"}, r"the header must be row,sender,receiver,value"),
        ({"latency": f"edge_trace:{tmp_path / 'twice.csv'}"}, r"edge 0 -> 1 appears 2 times in row 0"),
        ({"latency": "edge_trace:nope.csv"}, r"--time.latency='edge_trace:nope.csv': no edge trace file"),
    ]
    for fields, message in at_build:
        with pytest.raises(ValueError, match=message):
            Network(**fields)
    on_graph = [
        (f"edge_trace:{path('missing.csv', [missing])}", ring, {}, r"edge 0 -> 1 of ring.* is missing from the file"),
        (f"edge_trace:{path('extra.csv', [extra])}", ring, {}, r"edge 0 -> 2 is not an edge of ring"),
        (f"edge_trace:{path('gap.csv', [full, missing])}", ring, {}, r"edge 0 -> 1 of ring.* is missing from row 1"),
        (f"edge_trace:{tmp_path / 'wide.npy'}", ring, {}, r"9 values per row, but ring.* has 8 directed edges"),
        (f"edge_trace:{path('two.csv', [full, full])}", jg.topology.one_peer_exponential(8), {}, r"2 rows cannot be aligned with the 3 graphs"),
        (f"edge_trace:{tmp_path / 'wide.npy'}", jg.topology.one_peer_exponential(8), {}, r"a .npy edge trace needs a static graph"),
        (f"edge_trace:{path('ok.csv', [full])}", jg.topology.random_matching(4), {}, r"needs a fixed graph whose edges are known"),
        (f"edge_trace:{path('ok.csv', [full])}", ring, {"allreduce": True}, r"an all-reduce has none"),
    ]
    for spec, topo, kw, message in on_graph:
        with pytest.raises(ValueError, match=message):
            Network(bandwidth=spec).links(topo, **kw)


def test_the_commands_take_edge_traces_and_refuse_bad_ones(tmp_path, capsys):
    from tiny import TINY_FLAGS

    from jaxgossip.cli import main

    ring = jg.topology.ring(4)
    good = _write_csv(tmp_path / "bw.csv", [{p: 1e6 * (1 + p[0]) for p in _pairs(ring)}])
    rows = _write_csv(tmp_path / "rows.csv", [{p: 1e6 for p in _pairs(ring)}] * 2)
    bad = _write_csv(tmp_path / "bad.csv", [{(0, 1): 1e6}])
    out = str(tmp_path / "run")
    base = ["train", *TINY_FLAGS, "--no-progress", "--no-resume", "--out", out, "--time.compute=0.01"]
    assert main([*base, f"--time.bandwidth=edge_trace:{good}"]) == 0
    assert main([*base, f"--time.latency=edge_trace:{bad}"]) == 2
    assert "is missing from the file" in capsys.readouterr().err
    assert main([*base, "--execution=async", "--async_form=ad_psgd", f"--time.bandwidth=edge_trace:{good}"]) == 0
    assert main([*base, "--execution=async", f"--time.bandwidth=edge_trace:{rows}"]) == 2
    assert "changes with the round" in capsys.readouterr().err
    assert main([*base, "--algorithm=allreduce", f"--time.bandwidth=edge_trace:{good}"]) == 2
    assert "an all-reduce has none" in capsys.readouterr().err
    consensus = ["consensus", "--num_nodes=4", "--num_steps=3", "--out", out, "--topology=ring"]
    assert main([*consensus, f"--time.bandwidth=edge_trace:{good}"]) == 2  # the default runs: gossip, allreduce
    assert "an all-reduce has none" in capsys.readouterr().err
    assert main([*consensus, "--algorithm=gossip", f"--time.bandwidth=edge_trace:{good}"]) == 0
    assert main([*consensus, "--time.latency=edge_trace:nope.csv"]) == 2
    assert "no edge trace file" in capsys.readouterr().err
