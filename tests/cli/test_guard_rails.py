"""Guard rails for compressed gossip: the consensus watchdog (consensus runs,
training, metrics.json and the run table), ``tune_gamma`` / ``jaxgossip tune-gamma``, and the
``public_init="model"`` option of the methods with public copies.

The mode-A case of experiments/studies/dirichlet.md ("Mode A"): Choco top-1 % on the 8-ring
diverges at gamma 0.3 and contracts at 0.03; here with communication only, D = 1000, 1000 rounds."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import assert_tree_close, node_normal, row_stochastic_only, to_jax
from tiny import tiny_config

import jaxgossip as jg
from jaxgossip import algorithms
from jaxgossip.cli import main
from jaxgossip.engine import tuning
from jaxgossip.run import runner
from jaxgossip.run.watchdog import check_consensus
from jaxgossip.types import SweepFacts

TOP1 = {"compressor": "top_k", "compressor_options": {"fraction": 0.01}}
# 1000 rounds (tune_gamma's own advice for top-1 %): at gamma 0.1 the error falls for ~450 rounds and
# then grows; at 600 rounds the end of that run sits within 5 % of its round-300 value, so float32
# round-off alone (XLA vs the fused CPU round) decided whether it "contracts".
D, ROUNDS = 1000, 1000


def _mode_a(gamma):
    """Consensus error [R + 1] of Choco top-1 % on ring(8) from x0 ~ N(0, 1), D = 1000."""
    alg = algorithms.make("choco", jg.topology.ring(8), gamma=gamma, **TOP1)
    x0 = jax.random.normal(jax.random.key(0), (8, D))
    return np.asarray(jg.run_consensus(alg, x0, ROUNDS, jax.random.key(1)).error)


# ---------------------------------------------------------------- watchdog


def test_watchdog_fires_on_mode_a_and_stays_quiet_at_a_small_gamma():
    diverging = _mode_a(0.3)
    alarm = check_consensus(diverging)
    assert alarm is not None and alarm.rule == "growth"
    # It fires when the error first exceeds 10x its running minimum, well before NaN/inf.
    assert diverging[alarm.round] > 10 * diverging[: alarm.round].min()
    assert np.isfinite(diverging[alarm.round]) and f"round {alarm.round}" in alarm.message
    contracting = _mode_a(0.03)
    assert contracting[-1] < 1e-3 * contracting[0]
    assert check_consensus(contracting) is None


def test_watchdog_rules_norm_warmup_and_round_off():
    rounds = np.arange(0, 50, 10)
    # Growth after the warm-up only: a 100x rise during the warm-up is not an alarm.
    rising = np.array([0.01, 1.0, 1.2, 0.9, 1.1])
    assert check_consensus(rising, rounds).round == 10
    assert check_consensus(rising, rounds, start_round=10) is None
    # The norm rule: nodes farther from their average than the average from 0.
    alarm = check_consensus([1.0, 1.5, 3.0], [5, 10, 15], model_sq_norm=[10.0, 2.0, 2.5])
    assert (alarm.round, alarm.rule, alarm.reference) == (15, "norm", 2.5)
    # Converged to round-off: noise far below the peak is not growth.
    assert check_consensus([100.0, 1.0, 0.0, 1e-12, 0.0, 3e-12]) is None
    with pytest.raises(ValueError, match="growth"):
        check_consensus([1.0, 2.0], growth=1.0)
    with pytest.raises(ValueError, match="rounds has 1 points"):
        check_consensus([1.0, 2.0], [0])


def test_training_watchdog_in_log_metrics_json_and_table(tmp_path, capsys):
    """A tiny training run whose Choco gamma is too large for top-10 % (gamma 1): the watchdog warns
    once in the log, and metrics.json and the table name the round."""
    out = tmp_path / "run"
    argv = [
        "train", "--dataset=synthetic", "--num_nodes=4", "--model=mlp", "--model_options.hidden=8",
        "--batch_size=8", "--num_rounds=40", "--eval_every=5", "--eval_size=128", "--eval_chunk=64", "--lr=0.05",
        "--algorithm=choco", "--algorithm_options.gamma=1.0", "--algorithm_options.compressor=top_k",
        "--algorithm_options.compressor_options.fraction=0.1", "--no-progress", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    stdout, _ = capsys.readouterr()
    assert stdout.count("consensus watchdog: at round") == 1
    metrics = json.loads((out / "metrics.json").read_text())
    alarm = metrics["watchdog"]
    assert alarm["rule"] == "growth" and alarm["round"] % 5 == 0
    consensus = {row["round"]: row["consensus"] for row in metrics["rows"]}
    assert consensus[alarm["round"]] > 10 * min(v for r, v in consensus.items() if r < alarm["round"])
    assert all(row["model_sq_norm"] > 0 for row in metrics["rows"])
    header, _, row = [line for line in stdout.splitlines() if line.startswith(("run ", "---", "choco "))]
    assert header.split()[-1] == "watchdog" and row.endswith(f"round {alarm['round']} (growth)")


@pytest.mark.slow
def test_training_watchdog_quiet_on_a_healthy_run():
    result = runner.run_training(tiny_config(num_rounds=20), None, progress=False, log=lambda s: None)
    assert result.watchdog is None
    assert runner.run_summary(result)["watchdog"] is None


# ---------------------------------------------------------------- tune_gamma


def test_tune_gamma_recommends_a_contracting_gamma_for_mode_a():
    topo = jg.topology.ring(8)
    result = jg.tune_gamma("choco", topo, D, options=TOP1, gammas=[0.01, 0.03, 0.1, 0.3], num_steps=ROUNDS)
    assert result.option == "gamma"
    assert list(result.contracts) == [True, True, False, False]
    assert result.largest_contracting == pytest.approx(0.03)
    assert result.recommended == pytest.approx(0.012) and result.note == ""
    assert result.error.shape == (4, ROUNDS + 1) and result.bits_per_round.shape == (4,)
    # Verify independently: consensus at the recommended gamma contracts, and the watchdog is quiet.
    error = _mode_a(result.recommended)
    assert error[-1] < 0.05 * error[0] and error[-1] < error[ROUNDS // 2]
    assert check_consensus(error) is None


def test_tune_gamma_refuses_bad_input():
    ring = jg.topology.ring(8)
    with pytest.raises(ValueError, match="declares no consensus step size"):
        jg.tune_gamma("allreduce", ring, 10)
    with pytest.raises(ValueError, match="must not set 'gamma'"):
        jg.tune_gamma("choco", ring, 10, options={"gamma": 0.1})
    with pytest.raises(ValueError, match="at least 2 finite values > 0"):
        jg.tune_gamma("choco", ring, 10, gammas=[0.1, -1.0])
    with pytest.raises(ValueError, match="num_steps"):
        jg.tune_gamma("choco", ring, 10, num_steps=2)
    with pytest.raises(ValueError, match="safety"):
        jg.tune_gamma("choco", ring, 10, safety=0.5)
    with pytest.raises(TypeError, match="shapes must be"):
        jg.tune_gamma("choco", ring, "big")
    with pytest.raises(ValueError, match="column-stochastic"):  # the algorithm's own check, unchanged
        jg.tune_gamma("sparse_push", row_stochastic_only(), 10, options={"fraction": 0.5})
    with pytest.raises(TypeError, match="must be None or the name"):
        SweepFacts(step_size=3)
    with pytest.raises(TypeError, match="must be a tuple of option names"):
        SweepFacts(traced_options="fraction")
    with pytest.raises(ValueError, match=r"\['k'\] are both traced_options and shape_options"):
        SweepFacts(traced_options=("k",), shape_options={"k": "K is a shape"})


def test_tune_gamma_cli_outputs_and_bad_input(tmp_path, capsys):
    assert main(["tune-gamma", "--help"]) == 0
    help_text, _ = capsys.readouterr()
    for field in ("--algorithm", "--shape", "--model", "--input_shape", "--gammas", "--num_steps", "--safety"):
        assert field in help_text
    assert main(["--help"]) == 0 and "tune-gamma" in capsys.readouterr()[0]
    out = tmp_path / "tg"
    argv = [
        "tune-gamma", "--algorithm=choco", "--algorithm_options.compressor=top_k",
        "--algorithm_options.compressor_options.fraction=0.01", "--shape=1000", "--gammas=0.01,0.03,0.1,0.3",
        f"--num_steps={ROUNDS}", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    stdout, _ = capsys.readouterr()
    assert "recommended gamma: 0.012 (largest contracting 0.03 / 2.5)" in stdout
    assert "e_R/e_0" in stdout and "largest contracting" in stdout
    payload = json.loads((out / "tune_gamma.json").read_text())
    assert payload["recommended"] == pytest.approx(0.012) and payload["option"] == "gamma"
    assert [row["contracts"] for row in payload["rows"][:4]] == [True, True, False, False]
    assert (out / "tune_gamma.png").stat().st_size > 0 and (out / "tune_gamma.md").exists()
    for bad, message in (
        (["--shape=10"], "--algorithm is required"),
        (["--algorithm=allreduce", "--shape=10"], "has no consensus step size"),
        (["--algorithm=choco", "--algorithm_options.gamma=0.1", "--shape=10"], "is what tune-gamma sweeps"),
        (["--algorithm=choco"], "give exactly one of --shape"),
        (["--algorithm=choco", "--model=cnnn"], "unknown model 'cnnn' (did you mean 'cnn'?)"),
        (["--algorithm=choco", "--shape=10", "--gammas=0.1"], "at least 2 finite step sizes"),
        (["--algorithm=choco", "--shape=10", "--num_step=3"], "did you mean 'num_steps'"),
    ):
        code = main(["tune-gamma", *bad, "--out", str(tmp_path / "bad")])
        _, err = capsys.readouterr()
        assert code == 2 and err.startswith("jaxgossip tune-gamma: error: ") and message in err, err
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_tune_gamma_takes_model_shapes():
    shapes = tuning.model_shapes("mlp", (8, 8, 1), num_classes=3, hidden=(4,))
    leaves = jax.tree_util.tree_leaves(shapes)
    assert sorted(leaf.shape for leaf in leaves) == [(3,), (4,), (4, 3), (64, 4)]
    result = jg.tune_gamma("gossip", jg.topology.ring(4), shapes, gammas=[0.5, 1.0], num_steps=6)
    assert result.error.shape == (2, 7) and result.contracts.all() and "extend it upwards" in result.note


# ---------------------------------------------------------------- public_init


def test_public_init_metadata():
    with_copies = sorted(name for name, info in algorithms.INFOS.items() if info.hooks.public_init)
    assert {"choco", "sparse_push", "scsp"} <= set(with_copies)
    for name in with_copies:
        assert "public_init" in algorithms.info(name).factory.__code__.co_varnames
    with pytest.raises(ValueError, match="public_init='copy' is unknown"):
        algorithms.make("choco", jg.topology.ring(4), public_init="copy")


def test_public_init_default_is_bitwise_unchanged():
    """The default is the zero start of the papers (the code path before the option existed, which
    test_choco.py / test_sparse_push.py check against NumPy references), bit for bit."""
    x0 = to_jax(node_normal(8, {"w": (6, 20), "b": (7,)}, seed=3))
    for name, topo, options in (
        ("choco", jg.topology.ring(8), {"gamma": 0.3, **TOP1}),
        ("sparse_push", jg.topology.one_peer_exponential(8), {"fraction": 0.05, "gamma": 0.2}),
    ):
        runs = [
            jg.run_consensus(algorithms.make(name, topo, **options, **extra), x0, 12, jax.random.key(5))
            for extra in ({}, {"public_init": "zero"})
        ]
        for a, b in zip(jax.tree_util.tree_leaves(runs[0]), jax.tree_util.tree_leaves(runs[1])):
            assert np.array_equal(np.asarray(a), np.asarray(b))
        copies = algorithms.make(name, topo, **options).init(x0).x_hat
        assert not any(np.any(np.asarray(leaf)) for leaf in jax.tree_util.tree_leaves(copies))


@pytest.mark.parametrize(
    "name, topo, options",
    [
        ("choco", jg.topology.ring(8), {"gamma": 0.3, **TOP1}),
        ("sparse_push", jg.topology.one_peer_exponential(8), {"fraction": 0.05, "gamma": 0.2}),
        ("scsp", jg.topology.one_peer_exponential(8), {"fraction": 0.05, "gamma": 0.2}),
    ],
)
def test_public_init_model_starts_the_copies_at_the_initial_model(name, topo, options):
    x0 = to_jax(node_normal(8, {"w": (6, 20), "b": (7,)}, seed=3))
    alg = algorithms.make(name, topo, public_init="model", **options)
    state = alg.init(x0)
    w = [np.asarray(topo.matrix(t), np.float64) for t in range(topo.period)]
    for leaf in ("w", "b"):
        x = np.asarray(x0[leaf], np.float64).reshape(8, -1)
        hat = np.asarray(state.x_hat[leaf], np.float64)
        s = np.asarray(state.s[leaf], np.float64)
        if name == "choco":  # s = W x_hat
            np.testing.assert_array_equal(hat.reshape(8, -1), x)
            np.testing.assert_allclose(s.reshape(8, -1), w[0] @ x, rtol=1e-5, atol=1e-6)
        else:  # one set per distinct graph p: s^(p) = sum_{j != i} W_ij(p) x_hat_j
            assert hat.shape[0] == s.shape[0] == topo.period  # one_peer_exponential(8): 3 distinct graphs
            for p in range(hat.shape[0]):
                np.testing.assert_array_equal(hat[p].reshape(8, -1), x)
                off = w[p] - np.diag(np.diag(w[p]))
                np.testing.assert_allclose(s[p].reshape(8, -1), off @ x, rtol=1e-5, atol=1e-6)
    if name == "scsp":
        return  # its round is Sparse-Push's (compressed_push_sum); the fixed point is checked there
    # Identically initialised nodes: the first rounds' public copies stay the initial model and
    # nothing moves (with zero copies the first rounds would re-send it coordinate by coordinate).
    same = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a[:1], a.shape), x0)
    result = jg.run_consensus(alg, same, 3, jax.random.key(0))
    assert_tree_close(result.x, same, rtol=1e-6, atol=1e-6)
    copies = result.state.x_hat if name == "choco" else jax.tree_util.tree_map(lambda a: a[0], result.state.x_hat)
    assert_tree_close(copies, same, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "name, reference, topo, options",
    [
        ("choco", "gossip", jg.topology.ring(8), {"gamma": 1.0, "compressor": "identity"}),
        ("sparse_push", "push_sum", jg.topology.one_peer_exponential(8), {"fraction": 1.0, "gamma": 1.0}),
    ],
)
def test_public_init_model_lossless_equals_gossip(name, reference, topo, options):
    x0 = to_jax(node_normal(8, {"w": (5, 4), "b": (3,)}, seed=1))
    key = jax.random.key(2)
    want = jg.run_consensus(algorithms.make(reference, topo), x0, 10, key)
    got = jg.run_consensus(algorithms.make(name, topo, public_init="model", **options), x0, 10, key)
    np.testing.assert_allclose(np.asarray(got.error), np.asarray(want.error), rtol=1e-4, atol=1e-5)
    assert_tree_close(got.x, want.x, rtol=1e-5, atol=1e-5)
