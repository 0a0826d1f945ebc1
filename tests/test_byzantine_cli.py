"""--byzantine.* options: checked before any training (exit 2 naming the option), the algorithm wrapped
by the runner, and the trainer's metrics over the honest nodes only."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgossip import algorithms
from jaxgossip.run.config import TrainConfig, byzantine_args, check_train_config
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
