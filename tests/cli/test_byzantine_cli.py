"""--byzantine.* options: checked before any training (exit 2 naming the option), the algorithm wrapped
by the runner, and the trainer's metrics over the honest nodes only."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgossip import algorithms
from jaxgossip.run.config import TrainConfig
from jaxgossip.run.groups import byzantine_args
from jaxgossip.run.resolve import check_train_config
from jaxgossip.run.runner import build

BASE = dict(dataset="digits", model="mlp", topology="torus", num_nodes=16, num_rounds=20, eval_every=10, lr=0.1)


@pytest.mark.parametrize(
    "byz,message",
    [
        ({"nodes": 2, "attack": "nope"}, "unknown attack 'nope'"),
        ({"nodes": 16}, "need 0 <= K < N = 16"),
        ({"nodes": 2, "ids": "0,5"}, "give one of them"),
        ({"node": 2}, "byzantine.node: unknown option \\(did you mean 'nodes'\\?\\)"),
        ({"ids": "0,x"}, "must be node ids"),
        ({"nodes": 2, "attack_options": {"sgma": 1.0}}, "has no option \\['sgma'\\]; its options: sigma"),
        ({"ids": "0,4"}, None),  # fine on the torus
    ],
)
def test_bad_byzantine_options_fail_the_config_check(byz, message):
    config = TrainConfig(**BASE, byzantine=byz)
    if message is None:
        check_train_config(config)
        return
    with pytest.raises(ValueError, match=message):
        check_train_config(config)


def test_disconnecting_attackers_and_non_model_algorithms_are_refused():
    with pytest.raises(ValueError, match="disconnect the honest nodes of ring"):
        check_train_config(TrainConfig(**{**BASE, "topology": "ring", "num_nodes": 8}, byzantine={"ids": "0,4"}))
    with pytest.raises(ValueError, match="choco cannot be attacked"):
        check_train_config(TrainConfig(**BASE, algorithm="choco", byzantine={"nodes": 1}))


def test_nodes_are_drawn_by_the_seed():
    a = byzantine_args(TrainConfig(**BASE, byzantine={"nodes": 2}))
    assert a == {"num": 2, "key": 0, "attack": "gaussian"}
    assert byzantine_args(TrainConfig(**BASE)) is None
    assert byzantine_args(
        TrainConfig(**BASE, byzantine={"ids": "3,1", "attack": "alie", "attack_options": {"z": 1.0}})
    ) == {
        "ids": [3, 1],
        "attack": "alie",
        "z": 1.0,
    }


def test_the_command_line_exits_2_naming_the_option(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxgossip.cli",
            "train",
            "--dataset=digits",
            "--model=mlp",
            "--num_nodes=16",
            "--topology=torus",
            "--byzantine.nodes=2",
            "--byzantine.attack=bitflip",
            f"--out={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    assert "--byzantine: unknown attack 'bitflip'" in out.stderr and "Traceback" not in out.stderr


def test_metrics_are_over_the_honest_nodes_only():
    config = TrainConfig(**BASE, algorithm="clipped_gossip", byzantine={"ids": "0,10", "attack": "signflip"})
    built = build(config)
    state = built.trainer.init(jax.random.key(0))
    state, _ = built.trainer.run_chunk(state, 1)
    metrics = built.trainer.evaluate(state, jnp.zeros(()))
    honest = algorithms.honest_mask(16, [0, 10])
    np.testing.assert_array_equal(np.asarray(state.comm_state.honest), honest)
    z = state.params
    want = float(algorithms.honest_consensus_distance(z, honest))
    np.testing.assert_allclose(float(metrics.consensus), want, rtol=1e-5)
    # the attackers' models (sign-flipping never reaches their own state, but they do not train
    # towards the honest models either) are not in the honest consensus distance
    everyone = float(algorithms.honest_consensus_distance(z, np.ones(16, bool)))
    assert everyone != pytest.approx(want, rel=1e-3)


def test_the_train_table_says_its_metrics_are_over_honest_nodes(tmp_path, capsys):
    from tiny import TINY_FLAGS

    from jaxgossip.cli import main

    argv = ["train", *TINY_FLAGS, "--no-progress", "--out", str(tmp_path / "run"), "--algorithm=clipped_gossip"]
    assert main([*argv, "--byzantine.ids=0", "--byzantine.attack=signflip"]) == 0
    assert "over the honest nodes only" in capsys.readouterr().out
    assert main([*argv[:-3], "--out", str(tmp_path / "plain"), "--algorithm=clipped_gossip"]) == 0
    assert "honest" not in capsys.readouterr().out


def test_attackers_are_drawn_on_the_host_inside_jit_and_a_traced_key_is_refused():
    want = algorithms.attackers(8, num=3, key=5)
    seen = []

    @jax.jit
    def traced(x):
        seen.append(algorithms.attackers(8, num=3, key=5))  # built while tracing, as a sweep's trainer is
        return x

    traced(jnp.zeros(()))
    np.testing.assert_array_equal(seen[0], want)
    assert isinstance(seen[0], np.ndarray)
    with pytest.raises(ValueError, match="traced key"):
        jax.jit(lambda key: algorithms.attackers(8, num=3, key=key).sum())(jax.random.key(5))


def test_nodes_are_drawn_by_the_data_seed_shared_by_every_seed_of_a_sweep():
    assert byzantine_args(TrainConfig(**BASE, seed=3, byzantine={"nodes": 2}))["key"] == 3
    assert byzantine_args(TrainConfig(**BASE, seed=3, data_seed=7, byzantine={"nodes": 2}))["key"] == 7


def test_a_sweep_with_drawn_attackers_equals_the_single_runs():
    from tiny import tiny_config

    from jaxgossip.run import training_sweeps
    from jaxgossip.run.runner import run_training

    config = tiny_config(num_rounds=10, evals_per_chunk=2, byzantine={"nodes": 1, "attack": "signflip"})
    _, metrics = training_sweeps.sweep_training(config, {"lr": [0.05]}, seeds=[0, 1])
    single = config.replace(seed=1, data_seed=config.seed)  # seed 1 of the sweep
    rows = run_training(single, None, progress=False, log=lambda s: None).rows
    np.testing.assert_allclose(
        np.asarray(metrics.test_loss)[0, 1], [r["test_loss"] for r in rows], rtol=1e-4, atol=1e-5
    )


TINY_BYZANTINE = ["--num_rounds=10", "--byzantine.nodes=1"]


# The end-to-end matrix runs this command with drawn attackers in the default suite
# (tests/project/test_e2e_matrix.py::test_every_command_runs_plain_and_with_byzantine_nodes).
@pytest.mark.slow
def test_sweep_trains_with_drawn_attackers(tmp_path, capsys):
    from tiny import TINY_FLAGS

    from jaxgossip.cli import main

    out = tmp_path / "sweep"
    argv = ["sweep", *TINY_FLAGS, *TINY_BYZANTINE, "--seeds=2", "--sweep.lr=0.05,0.1", "--no-progress"]
    assert main([*argv, "--out", str(out)]) == 0, capsys.readouterr().err
    assert (out / "sweep.json").exists()


# The end-to-end matrix runs this command with drawn attackers in the default suite
# (tests/project/test_e2e_matrix.py::test_every_command_runs_plain_and_with_byzantine_nodes).
@pytest.mark.slow
def test_topology_sweep_trains_with_drawn_attackers(tmp_path, capsys):
    from tiny import TINY_FLAGS

    from jaxgossip.cli import main

    out = tmp_path / "topologies"
    argv = ["topology-sweep", "--train", *TINY_FLAGS, *TINY_BYZANTINE, "--seeds=2", "--topologies=ring,complete"]
    assert main([*argv, "--out", str(out)]) == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert "one per graph: the Byzantine wrapper builds host tables per graph" in text
    assert (out / "results.json").exists()


# The end-to-end matrix runs this command with drawn attackers in the default suite
# (tests/project/test_e2e_matrix.py::test_every_command_runs_plain_and_with_byzantine_nodes).
@pytest.mark.slow
def test_plan_compiles_with_drawn_attackers(capsys):
    from tiny import TINY_FLAGS

    from jaxgossip.cli import main

    assert main(["plan", *TINY_FLAGS, *TINY_BYZANTINE, "--max_nodes=8"]) == 0, capsys.readouterr().err
    assert "largest N that fits" in capsys.readouterr().out
