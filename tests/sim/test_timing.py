"""The time model (jaxgossip.sim.timing) against a plain per-node / per-edge NumPy loop, its exactness
cases inside the compiled runs, and its errors."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxgossip as jg
from jaxgossip import topology as T
from jaxgossip.sim import compute as compute_lib
from jaxgossip.sim import network, timing


def _reference_comm(topo, bits, t, latency, bandwidth, mode, exchanges):
    """c_i of round t by a loop over the edges (latency / bandwidth scalars, [N] or [T, E])."""
    n = topo.num_nodes
    g = t % topo.period
    senders, receivers, weights = topo.senders[g], topo.receivers[g], topo.weights[g]
    degree = np.zeros(n)
    for s, r, w in zip(senders, receivers, weights):
        if w != 0 and s != r:
            degree[s] += 1
    comm = np.zeros(n)
    for e, (s, r, w) in enumerate(zip(senders, receivers, weights)):
        if w == 0 or s == r or bits[s] == 0:
            continue

        def at(v):
            v = np.asarray(v, np.float64)
            return float(v) if v.ndim == 0 else float(v[s] if v.ndim == 1 else v[g, e])

        one = at(latency) + bits[s] / degree[s] / exchanges / at(bandwidth)
        comm[s] = comm[s] + one if mode == "serial" else max(comm[s], one)
    return exchanges * comm


@pytest.mark.parametrize("mode", ["serial", "parallel"])
@pytest.mark.parametrize("links", ["scalar", "per_node", "per_edge"])
def test_comm_seconds_match_the_edge_loop(mode, links):
    rng = np.random.default_rng(0)
    topo = T.one_peer_exponential(8)  # time-varying, period 3
    n, shape = topo.num_nodes, topo.senders.shape
    latency, bandwidth = {
        "scalar": (1e-3, 1e6),
        "per_node": (rng.uniform(0, 1e-2, n), rng.uniform(1e5, 1e7, n)),
        "per_edge": (rng.uniform(0, 1e-2, shape), rng.uniform(1e5, 1e7, shape)),
    }[links]
    with jax.enable_x64(True):
        lk = network.make_links(topo, latency, bandwidth, mode=mode, exchanges=2)
        for t in range(5):
            bits = rng.uniform(0, 1e6, n) * (rng.uniform(size=n) > 0.2)  # some nodes send nothing
            got = np.asarray(network.comm_seconds(lk, bits, t))
            np.testing.assert_allclose(got, _reference_comm(topo, bits, t, latency, bandwidth, mode, 2), rtol=1e-12)


def test_allreduce_and_stochastic_links():
    n = 6
    bits = np.array([0.0, 8e5, 8e5, 8e5, 8e5, 8e5])
    with jax.enable_x64(True):
        ring = network.make_links(None, 1e-3, 1e6, allreduce="ring", num_nodes=n)
        message = network.make_links(None, 1e-3, 1e6, allreduce="message", num_nodes=n)
        np.testing.assert_allclose(network.comm_seconds(ring, bits, 0), np.where(bits > 0, 10 * (1e-3 + bits / 6 / 1e6), 0))
        np.testing.assert_allclose(network.comm_seconds(message, bits, 0), np.where(bits > 0, 1e-3 + bits / 1e6, 0))
        topo = T.random_matching(n)
        d = T.mean_out_degree(topo)
        mean = network.make_links(topo, 1e-3, 1e6, mode="serial")
        np.testing.assert_allclose(network.comm_seconds(mean, bits, 3), np.where(bits > 0, d * (1e-3 + bits / d / 1e6), 0))


def _quadratic_run(alg, time, num_steps=6, local_steps=1, ordering="atc"):
    centers = jax.random.normal(jax.random.key(1), (8, 5))

    def loss_fn(p, node, key):
        del key
        return jnp.sum((p - centers[node]) ** 2)

    x0 = jnp.zeros((8, 5))
    return jg.run_optimization(
        alg, x0, loss_fn, optax.sgd(0.1), num_steps, jax.random.key(0), local_steps, ordering, time=time
    )


def test_synchronous_exactness_constant_compute_and_stragglers():
    topo = T.ring(8)
    alg = jg.algorithms.make("gossip", topo)
    one = _quadratic_run(alg, timing.time_model(topo, compute=1.0, latency=0.0, bandwidth=1e18))
    np.testing.assert_allclose(one.sim_time, np.arange(7), rtol=1e-6)
    slow = _quadratic_run(alg, timing.time_model(topo, compute="stragglers:1.0,0.125,10", latency=0.0, bandwidth=1e18))
    np.testing.assert_allclose(slow.sim_time, 10 * np.arange(7), rtol=1e-6)
    two = _quadratic_run(alg, timing.time_model(topo, compute=1.0, latency=0.0, bandwidth=1e18), local_steps=3)
    np.testing.assert_allclose(two.sim_time, 3 * np.arange(7), rtol=1e-6)
    # the timed run computes the iterates of the untimed one, bitwise
    untimed = _quadratic_run(alg, None)
    assert untimed.sim_time is None
    np.testing.assert_array_equal(np.asarray(one.x), np.asarray(untimed.x))


def test_bandwidth_only_time_is_the_busiest_nodes_bits():
    topo = T.one_peer_exponential(8)  # time-varying: each round its own graph
    alg = jg.algorithms.make("sparse_push", topo, fraction=0.3, gamma=0.5)
    result = jg.run_consensus(
        alg, jax.random.normal(jax.random.key(0), (8, 40)), 10, jax.random.key(2),
        time=timing.time_model(topo, compute=0.0, latency=0.0, bandwidth=1e6),
    )
    busiest = np.asarray(result.node_bits, np.float64).max(axis=1) / 1e6
    np.testing.assert_allclose(result.sim_time, np.concatenate([[0.0], np.cumsum(busiest)]), rtol=1e-6)
    np.testing.assert_allclose(result.comm_time, result.sim_time, rtol=1e-6)


def test_overlap_takes_the_max_of_compute_and_communication():
    topo = T.ring(8)
    alg = jg.algorithms.make("gossip", topo)
    model = timing.time_model(topo, compute=0.5, latency=0.2, bandwidth=1e18)  # c_i = 2 latencies
    atc = _quadratic_run(alg, model, ordering="atc")
    same = _quadratic_run(alg, model, ordering="same_iterate")
    np.testing.assert_allclose(atc.sim_time[1:] / np.arange(1, 7), 0.9, rtol=1e-6)
    np.testing.assert_allclose(same.sim_time[1:] / np.arange(1, 7), 0.5, rtol=1e-6)
    np.testing.assert_allclose(atc.comm_time[1:] / np.arange(1, 7), 0.4, rtol=1e-6)


def test_training_records_sim_time_and_keeps_the_iterates():
    from jaxgossip import data, models
    from jaxgossip.engine.training import make_train

    dataset = data.make_synthetic(num_train=256, num_test=64, num_classes=4, shape=(4, 4, 1), noise=0.5, seed=0)
    topo = T.ring(8)
    alg = jg.algorithms.make("gossip", topo)
    shards = data.shard_dataset(dataset, data.partition(dataset.y_train, 8, "iid", seed=0))
    model = models.make_model("mlp", num_classes=4, hidden=(8,))

    def run(time):
        trainer = make_train(
            model, alg, shards, (dataset.x_test, dataset.y_test), optax.sgd(0.1), num_rounds=12, batch_size=8,
            eval_every=4, eval_chunk=64, local_steps=2, time=time,
        )
        state = trainer.init(jax.random.key(0))
        state, first = trainer.run_chunk(state, 1)  # chunked as the runner does
        state, rest = trainer.run_chunk(state, 2)
        return state, jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]), first, rest)

    model_time = timing.time_model(topo, compute="stragglers:0.5,0.125,10", latency=1e-3, bandwidth=1e18)
    state, metrics = run(model_time)
    # every round: 2 local steps of the straggler (10 x 0.5 s), then 2 messages of 1 ms each
    np.testing.assert_allclose(metrics.sim_time, [4 * 10.002, 8 * 10.002, 12 * 10.002], rtol=1e-6)
    np.testing.assert_allclose(metrics.comm_time, [4 * 0.002, 8 * 0.002, 12 * 0.002], rtol=1e-5)
    untimed_state, untimed = run(None)
    assert untimed.sim_time is None and untimed_state.clock is None
    for a, b in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(untimed_state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(metrics.test_acc), np.asarray(untimed.test_acc))


def test_random_compute_is_seeded_and_has_the_stated_law():
    n, steps = 64, 400
    key = jax.random.key(5)
    for spec, center in (("lognormal:2.0,0.5", 2.0), ("exponential:3.0", 3.0)):
        compute = compute_lib.parse_compute(spec)
        draws = np.stack([np.asarray(compute_lib.compute_seconds(compute, key, k, n)) for k in range(steps)])
        again = np.asarray(compute_lib.compute_seconds(compute, key, 7, n))
        np.testing.assert_array_equal(draws[7], again)
        stat = np.median(draws) if spec.startswith("lognormal") else draws.mean()
        assert abs(stat - center) < 0.05 * center, (spec, stat)
    strag = compute_lib.parse_compute("stragglers:1.0,0.25,4")
    a = np.asarray(compute_lib.compute_seconds(strag, key, 0, 8))
    b = np.asarray(compute_lib.compute_seconds(strag, key, 99, 8))
    np.testing.assert_array_equal(a, b)  # fixed for the run
    assert sorted(a.tolist()) == [1.0] * 6 + [4.0] * 2


def test_trace_compute_cycles(tmp_path):
    trace = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.save(tmp_path / "t.npy", trace)
    np.savetxt(tmp_path / "t.csv", trace, delimiter=",")
    for path in ("t.npy", "t.csv"):
        compute = compute_lib.parse_compute(f"trace:{tmp_path / path}")
        for k in range(7):
            np.testing.assert_array_equal(compute_lib.compute_seconds(compute, jax.random.key(0), k, 4), trace[k % 3])


def test_kahan_clock_keeps_small_rounds():
    topo = T.ring(4)
    model = timing.time_model(topo, compute=1e-4, latency=0.0, bandwidth=1e18)

    def body(clock, _):
        return timing.advance(clock, model, jnp.zeros([4]), 1), None

    clock, _ = jax.jit(lambda c: jax.lax.scan(body, c, None, length=200_000))(timing.init_clock(jax.random.key(0)))
    assert abs(float(clock.time) - 20.0) < 1e-5  # a plain float32 sum ends about 0.3 % off


@pytest.mark.parametrize(
    "spec, message",
    [
        ("stragglers:1.0,2,10", "fraction F"),
        ("stragglers:1.0,0.5,0.5", "slowdown S"),
        ("stragglers:1.0,0.5", "stragglers:C,F,S"),
        ("lognormal:-1", "lognormal:MEDIAN,SIGMA"),
        ("lognormal:-1,0.5", "must be > 0"),
        ("lognormal:1,0", "sigma"),
        ("exponential:0", "must be > 0"),
        ("exponential:abc", "expected numbers"),
        ("-1", "must be >= 0"),
        ("fast", "not a number of seconds"),
        ("weibull:1", "unknown kind 'weibull'"),
        ("trace:/nonexistent.npy", "no trace file"),
    ],
)
def test_bad_compute_specs_name_the_value_and_rule(spec, message):
    with pytest.raises(ValueError, match="--time.compute") as err:
        compute_lib.parse_compute(spec)
    assert message in str(err.value)


def test_bad_links_and_traces_are_refused(tmp_path):
    topo = T.ring(8)
    for bandwidth in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="bandwidth"):
            timing.time_model(topo, bandwidth=bandwidth)
    with pytest.raises(ValueError, match="latency"):
        timing.time_model(topo, latency=-1e-3)
    with pytest.raises(ValueError, match="mode='fast' is unknown"):
        timing.time_model(topo, mode="fast")
    with pytest.raises(ValueError, match=r"per node must have shape \[N\]"):
        timing.time_model(topo, bandwidth=np.ones(5))
    np.save(tmp_path / "t.npy", np.ones((3, 5), np.float32))
    with pytest.raises(ValueError, match=r"\[steps, 8\]"):
        timing.time_model(topo, compute=f"trace:{tmp_path / 't.npy'}")
    np.save(tmp_path / "bad.npy", np.ones(5, np.float32))
    with pytest.raises(ValueError, match=r"\[steps, N\]"):
        compute_lib.parse_compute(f"trace:{tmp_path / 'bad.npy'}")


def test_sweep_over_time_values_is_one_compile_and_equals_separate_runs():
    from tiny import tiny_config

    from jaxgossip.run.runner import run_training
    from jaxgossip.run.training_sweeps import sweep_training

    config = tiny_config(time={"compute": "stragglers:0.01,0.25,2", "latency": 1e-3, "bandwidth": 1e6})
    axes = {"time.bandwidth": [1e6, 1e8], "time.slowdown": [2.0, 10.0]}
    points, metrics = sweep_training(config, axes, [0])
    assert np.asarray(metrics.sim_time).shape == (4, 1, 4)
    for g in range(4):
        bandwidth, slowdown = float(points["time.bandwidth"][g]), float(points["time.slowdown"][g])
        alone = run_training(
            config.replace(time={**config.time, "bandwidth": bandwidth, "compute": f"stragglers:0.01,0.25,{slowdown}"}),
            progress=False,
            log=lambda m: None,
        )
        np.testing.assert_allclose(np.asarray(metrics.sim_time)[g, 0], alone.metrics.sim_time, rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(metrics.test_acc)[g, 0], alone.metrics.test_acc)
    # the straggler (one of 4) sets the pace: 20 rounds of S x 10 ms plus 2 messages per round
    d = 64 * 8 + 8 + 8 * 10 + 10
    expected = 20 * (points["time.slowdown"] * 0.01 + 2 * (1e-3 + 32 * d / points["time.bandwidth"]))
    np.testing.assert_allclose(np.asarray(metrics.sim_time)[:, 0, -1], expected, rtol=1e-5)


def test_sweep_command_over_time_values_and_bad_ones(tmp_path, capsys):
    from tiny import TINY_FLAGS

    from jaxgossip.cli import main

    out = str(tmp_path / "sweep")
    argv = ["sweep", *TINY_FLAGS, "--no-progress", "--out", out, "--time.compute=0.01"]
    assert main([*argv, "--sweep.time.bandwidth=1e6,1e9"]) == 0
    table = capsys.readouterr().out
    assert "bandwidth" in table and "sim s" in table
    assert main([*argv, "--sweep.time.bandwidth=0,1e6"]) == 2
    assert "--sweep.time.bandwidth: --time.bandwidth=0.0 must be > 0" in capsys.readouterr().err
    assert main([*argv, "--sweep.time.fraction=0.5"]) == 2  # a constant compute has no straggler fraction
    assert "sweep axis 'time.fraction' sets a number of --time.compute=stragglers" in capsys.readouterr().err
    argv[-1] = "--time.compute=stragglers:0.01,0.25,4"
    assert main([*argv, "--sweep.time.fraction=0.5,2"]) == 2
    assert "straggler fraction F=2.0 must be <= 1" in capsys.readouterr().err


def test_availability_masks_are_seeded_and_checked(tmp_path):
    assert compute_lib.availability("always", 10, 4, 0) is None
    a = compute_lib.availability("markov:0.2,0.5", 2000, 16, 3)
    np.testing.assert_array_equal(a, compute_lib.availability("markov:0.2,0.5", 2000, 16, 3))
    assert not np.array_equal(a, compute_lib.availability("markov:0.2,0.5", 2000, 16, 4))
    # the chain's stationary online share is P_ON / (P_OFF + P_ON) = 5/7
    assert abs(a[100:].mean() - 5 / 7) < 0.02
    off_to_on = ((a[:-1] == 0) & (a[1:] == 1)).sum() / (a[:-1] == 0).sum()
    assert abs(off_to_on - 0.5) < 0.03
    trace = np.array([[1, 0, 1], [0, 1, 1]], np.float32)
    np.save(tmp_path / "a.npy", trace)
    np.testing.assert_array_equal(compute_lib.availability(f"trace:{tmp_path / 'a.npy'}", 2, 3, 0), trace)
    for spec, message in (
        ("markov:0.2", "expected markov:P_OFF,P_ON"),
        ("markov:0.2,0", r"P_ON in \(0, 1\]"),
        ("sometimes", "unknown kind 'sometimes'"),
        (f"trace:{tmp_path / 'a.npy'}", r"does not fit N = 4"),
    ):
        with pytest.raises(ValueError, match="--time.availability") as err:
            compute_lib.availability(spec, 5, 4, 0)
        assert re.search(message, str(err.value)), err.value
    np.save(tmp_path / "b.npy", np.full((2, 3), 0.5, np.float32))
    with pytest.raises(ValueError, match="0 \\(offline\\) or 1 \\(online\\)"):
        compute_lib.availability(f"trace:{tmp_path / 'b.npy'}", 2, 3, 0)


def test_offline_nodes_neither_compute_nor_send_and_the_round_waits_only_for_online_ones():
    from tiny import tiny_config

    from jaxgossip.run.runner import build, run_training

    # node 0 is offline in odd rounds
    available = np.ones((20, 4), np.float32)
    available[1::2, 0] = 0
    n = 4
    topo = T.with_availability(T.ring(n), available)
    w = T.sample_matrices(topo, jg.rounds.round_keys(jax.random.key(0), 4))
    np.testing.assert_allclose(w[1, 0], np.eye(n)[0])  # round 1: node 0 keeps its own model, takes nothing
    np.testing.assert_allclose(w[1, :, 0], np.eye(n)[0])  # and nobody takes from it
    np.testing.assert_allclose(w[1].sum(axis=1), 1.0)  # repaired: still doubly stochastic
    np.testing.assert_allclose(w[0], T.ring(n).matrix(0), rtol=1e-6)

    compute = compute_lib.parse_compute("stragglers:0.01,0.25,10")
    clock_key = jax.random.wrap_key_data(timing.init_clock(jax.random.key(0)).key)
    straggler = int(np.argmax(np.asarray(compute_lib.compute_seconds(compute, clock_key, 0, n))))
    available = np.ones((20, n), np.float32)
    available[1::2, straggler] = 0
    model = timing.time_model(T.ring(n), compute=compute, latency=0.0, bandwidth=1e18, available=available)
    taus = [float(timing.round_seconds(model, clock_key, jnp.ones(n), t, 1)[0]) for t in range(4)]
    np.testing.assert_allclose(taus, [0.1, 0.01, 0.1, 0.01], rtol=1e-6)  # odd rounds: the straggler is off

    # through the command-line config: an always-offline node keeps its initial model and sends nothing
    config = tiny_config(time={"availability": "markov:0.0,1.0"}, num_rounds=10, eval_every=5)
    result = run_training(config, progress=False, log=lambda m: None)
    assert np.all(np.asarray(result.metrics.bits) > 0)  # markov with P_OFF = 0: always online
    built = build(config)
    assert "availability" in built.topology.name
    trace_config = tiny_config(time={"availability": "markov:1.0,1e-9"}, num_rounds=10, eval_every=5, seed=1)
    result = run_training(trace_config, progress=False, log=lambda m: None)
    assert np.all(np.asarray(result.metrics.bits) == 0)  # everyone offline from round 0: nothing sent
    start = build(trace_config).trainer.init(jax.random.key(1)).params
    for a, b in zip(jax.tree_util.tree_leaves(result.state.params), jax.tree_util.tree_leaves(start)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # and nothing computed
    assert float(result.metrics.sim_time[-1]) == 0.0


def test_availability_refuses_algorithms_that_cannot_drop_nodes():
    from tiny import tiny_config

    from jaxgossip.run.resolve import check_train_config

    with pytest.raises(ValueError, match="gradient hook"):
        check_train_config(tiny_config(algorithm="gradient_tracking", time={"availability": "markov:0.1,0.5"}))
    with pytest.raises(ValueError, match="--time.availability='markov:2,0.5'"):
        check_train_config(tiny_config(time={"availability": "markov:2,0.5"}))
