"""Divergence beyond NaN (jaxgossip.run.watchdog.check_divergence): a training loss, an averaged
model's norm or a consensus distance that blows up without becoming NaN stops `train` with exit 3
(like NaN) and marks a demo / sweep / consensus / topology-sweep row "diverged at round r" with its
ratio columns empty; healthy runs stay unflagged."""

import json
import math

import numpy as np
import pytest

from jaxgossip.cli import main
from jaxgossip.run import watchdog
from jaxgossip.run.watchdog import (
    CONSENSUS_BLOWUP,
    LOSS_BLOWUP,
    NORM_BLOWUP,
    DivergenceError,
    check_divergence,
    consensus_diverged_at,
)

ROUNDS = np.array([10, 20, 30, 40])


def test_each_rule_fires_at_its_first_point_and_healthy_values_pass():
    loss = np.array([2.3, 1.0, 0.5, 0.4])
    norm = np.array([300.0, 420.0, 460.0, 470.0])
    cons = np.array([1.0, 0.5, 0.2, 0.1])
    assert check_divergence(ROUNDS, train_loss=loss, model_sq_norm=norm, consensus=cons, initial_sq_norm=270.0) is None
    # loss: just above LOSS_BLOWUP x the first value fires, just below does not
    hit = check_divergence(ROUNDS, train_loss=[2.0, 1.0, 2.0 * LOSS_BLOWUP * 1.01, 1.0])
    assert (hit.round, hit.rule, hit.reference) == (30, "loss", 2.0) and "1.01e+03x its first value 2" in hit.message
    assert check_divergence(ROUNDS, train_loss=[2.0, 1.0, 2.0 * LOSS_BLOWUP * 0.99, 1.0]) is None
    # model norm: against the initial value when given, else the first recorded one
    blown = [300.0, 300.0 * NORM_BLOWUP * 2, 1.0, 1.0]
    hit = check_divergence(ROUNDS, model_sq_norm=blown, initial_sq_norm=300.0)
    assert (hit.round, hit.rule, hit.value) == (20, "model_norm", blown[1])
    hit = check_divergence(ROUNDS, model_sq_norm=[5e9, 6e9, 7e9, 8e9], initial_sq_norm=270.0)
    assert hit.round == 10 and hit.rule == "model_norm"  # blown at the first point already
    assert check_divergence(ROUNDS, model_sq_norm=[5e9, 6e9, 7e9, 8e9]) is None  # no initial value: first = reference
    # consensus against ||z_bar||^2 at the same point
    hit = check_divergence(ROUNDS, model_sq_norm=norm, consensus=[1.0, 1.0, 460.0 * CONSENSUS_BLOWUP * 1.5, 1.0])
    assert (hit.round, hit.rule, hit.reference) == (30, "consensus", 460.0)
    # non-finite anywhere (an infinite norm with a finite loss included)
    hit = check_divergence(ROUNDS, train_loss=loss, model_sq_norm=[1.0, math.inf, 1.0, 1.0])
    assert (hit.round, hit.rule) == (20, "nonfinite") and "became inf" in hit.message
    with pytest.raises(ValueError, match="norm_blowup=1 must be a number > 1"):
        check_divergence(ROUNDS, norm_blowup=1)
    with pytest.raises(ValueError, match="got 3 points, expected 4"):
        check_divergence(ROUNDS, train_loss=[1.0, 2.0, 3.0])


def test_consensus_diverged_at_per_series():
    healthy = np.geomspace(1.0, 1e-6, 50)
    assert consensus_diverged_at(healthy) is None
    wild = np.geomspace(1.0, 1e30, 50)  # never NaN within the run, but 1e3x the first value at round 5
    assert consensus_diverged_at(wild) == int(np.argmax(wild > CONSENSUS_BLOWUP))
    both = np.stack([healthy, wild, np.where(np.arange(50) >= 3, np.nan, 1.0)])  # seeds: the earliest counts
    assert consensus_diverged_at(both) == 3


def test_divergence_error_is_a_floating_point_error_carrying_the_point():
    hit = check_divergence(ROUNDS, train_loss=[1.0, math.nan, 1.0, 1.0])
    err = DivergenceError(hit)
    assert isinstance(err, FloatingPointError) and err.divergence.round == 20 and str(err) == hit.message
    assert set(watchdog.__all__) >= {"check_divergence", "DivergenceError", "consensus_diverged_at"}


def test_train_digits_adam_lr100_exits_3_on_the_model_norm(tmp_path, capsys):
    """The case the loss alone misses: 3.2e9 -> 7.5e5 (falling, finite) at accuracy 0.1."""
    out = tmp_path / "adam"
    argv = ["train", "--dataset=digits", "--model=mlp", "--num_rounds=40", "--eval_every=10", "--lr=100"]
    argv += ["--optimizer=adam", "--no-progress", "--out", str(out)]
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "jaxgossip train: stopped: training diverged at round 10: the squared norm of the averaged model" in err
    assert f"(limit {NORM_BLOWUP:g}x)" in err and "smaller learning rate" in err
    assert not (out / "checkpoint").exists() or not any((out / "checkpoint").iterdir())  # no good chunk to keep
    rows = json.loads((out / "metrics.json").read_text())["rows"]
    assert [r["round"] for r in rows] == [10]  # stopped after the chunk that shows it


def test_train_keeps_the_last_good_checkpoint_when_a_later_chunk_blows_up(tmp_path, monkeypatch, capsys):
    """A blow-up in the third chunk: exit 3, the checkpoint of round 10 stays the newest."""
    from tiny import TINY_FLAGS

    from jaxgossip.run import checkpoint, runner

    real = runner.check_divergence

    def blows_up_at_15(rounds, **kwargs):  # the recorded norm of round 15 replaced by a blown one
        norm = np.array(kwargs["model_sq_norm"], np.float64)
        norm[np.asarray(rounds) == 15] = 1e30
        return real(rounds, **dict(kwargs, model_sq_norm=norm))

    monkeypatch.setattr(runner, "check_divergence", blows_up_at_15)
    out = tmp_path / "run"
    assert main(["train", *TINY_FLAGS, "--evals_per_chunk=1", "--no-progress", "--out", str(out)]) == 3
    assert "training diverged at round 15" in capsys.readouterr().err
    assert checkpoint.latest(str(out / "checkpoint")).round == 10


def test_demo_lr100_marks_every_run_diverged_without_a_reduction(tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["demo", "--lr=100", "--num_rounds=20", "--eval_every=10", "--algorithms=gossip,push_sum"]
    assert main([*argv, "--no-progress", "--out", str(out)]) == 3  # the table is written, the command fails
    printed, err = capsys.readouterr()
    assert "2 of 2 runs diverged: gossip, push_sum (exit status 3)" in err
    rows = {r["name"]: r for r in json.loads((out / "comparison.json").read_text())["rows"]}
    assert rows["push_sum"]["status"] == "diverged at round 10" and rows["push_sum"]["diverged_at_round"] == 10
    assert rows["gossip"]["status"] == "diverged at round 10"
    assert all("reduction" not in r and "consensus" not in r for r in rows.values())
    assert "push_sum: training diverged at round 10" in err
    assert "diverged at round 10" in printed


def test_consensus_command_marks_a_blow_up_before_it_is_nan(tmp_path, capsys):
    """gamma=3 gossip on a ring grows geometrically: flagged at 1e3x its first error, long before inf."""
    out = tmp_path / "cons"
    runs = [
        {"name": "stable", "algorithm": "gossip"},
        {"name": "wild", "algorithm": "gossip", "options": {"gamma": 3.0}},
    ]
    argv = [
        "consensus",
        f"--runs={json.dumps(runs)}",
        "--shape=4",
        "--num_steps=30",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    err = capsys.readouterr().err
    saved = json.loads((out / "consensus.json").read_text())
    rows = {r["name"]: r for r in saved["rows"]}
    assert rows["stable"]["status"] == "ok"
    wild_error = np.array(saved["error"]["wild"], dtype=np.float64)
    where = rows["wild"]["diverged_at_round"]
    assert rows["wild"]["status"] == f"diverged at round {where}" and rows["wild"]["final_error"] is None
    assert np.isfinite(wild_error).all()  # the error shown up to the blow-up is finite: NaN alone misses it
    assert "wild diverged at round" in err and "blow-up" in err
