"""What a new user types: spelling out a default never refuses a resume (both configurations are
compared resolved), a real change is refused naming the field and offering a new --out before
--no-resume, which is said to delete the checkpoint and the metrics; bad or contradictory input ends
in one line (exit 2) naming the option: a compute trace with a negative or NaN entry (described, not
printed), a non-numeric attack option, --outer_message without an outer optimizer, an availability
trace with no node ever online, an empty --out. All in-process through ``main``."""

import os

import numpy as np
import pytest
from _reference import one_line_error
from tiny import TINY_FLAGS

from jaxgossip import algorithms, topology
from jaxgossip.cli import main
from jaxgossip.run import checkpoint
from jaxgossip.run.config import TrainConfig, resolved_config

RUN = [*TINY_FLAGS, "--num_rounds=10", "--no-progress"]


# ---- resume: configurations compared resolved ------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished tiny run (10 rounds) and its --out."""
    out = str(tmp_path_factory.mktemp("finished") / "run")
    assert main(["train", *RUN, "--out", out]) == 0
    return out


@pytest.mark.parametrize("flag", ["--time.latency=1e-4", "--byzantine.nodes=0", "--time.availability=always"])
def test_a_spelled_out_default_resumes_without_training(finished, flag, capsys):
    capsys.readouterr()
    assert main(["train", *RUN, flag, "--out", finished]) == 0, capsys.readouterr().err
    assert f"resumed from {finished}/checkpoint at round 10" in capsys.readouterr().out  # 10 of 10: nothing trains


def test_the_resolved_async_form_resumes_an_auto_run(tmp_path, capsys):
    out = str(tmp_path / "async")
    flags = [*TINY_FLAGS, "--num_rounds=5", "--no-progress", "--execution=async", "--time.compute=0.01"]
    assert main(["train", *flags, "--out", out]) == 0
    form = algorithms.resolve(TrainConfig().algorithm).execution.form_names[0]  # what auto resolves to
    capsys.readouterr()
    assert main(["train", *flags, f"--async_form={form}", "--out", out]) == 0, capsys.readouterr().err
    assert f"resumed from {out}/checkpoint at round 5" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flag, field",
    [
        ("--time.latency=1e-3", "time.latency: saved 0.0001 vs now 0.001"),
        ("--byzantine.ids=1", "byzantine.ids: saved None vs now [1]"),
        ("--lr=0.5", "lr: saved 0.05 vs now 0.5"),
    ],
)
def test_a_real_change_is_refused_naming_the_field_and_what_no_resume_deletes(finished, flag, field, capsys):
    capsys.readouterr()
    assert main(["train", *RUN, flag, "--out", finished]) == 2
    err = one_line_error(capsys)
    assert "belongs to another configuration (" in err and field in err
    assert err.index("--out") < err.index("--no-resume")  # a new folder is offered first
    assert "deletes the run's checkpoint and its metrics" in err


def test_an_older_saved_config_without_the_newer_fields_resolves_the_same():
    current = TrainConfig(dataset="synthetic", model="mlp").to_dict()
    older = {k: v for k, v in current.items() if k not in ("time", "byzantine", "execution", "async_form", "async_rate_compensation")}
    assert resolved_config(older) == resolved_config(current)
    saved = checkpoint.Saved(round=0, config=older, wall_time=0.0, walls=[])
    checkpoint.check_resume(saved, current, "ckpt")  # does not raise


# ---- bad or contradictory input: one line naming the option -----------------------------------------


@pytest.mark.parametrize("bad, shown", [(-0.5, "-0.5"), (np.nan, "nan")])
def test_a_bad_compute_trace_entry_is_named_not_the_whole_trace(tmp_path, capsys, bad, shown):
    trace = np.full((500, 4), 0.01)
    trace[7, 2] = bad
    trace[9, 1] = -1.0
    path = tmp_path / "trace.npy"
    np.save(path, trace)
    assert main(["train", *RUN, f"--time.compute=trace:{path}", "--print-config"]) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"jaxgossip train: error: --time.compute='trace:{path}': ")
    assert f"2 of 2000 entries are not; the first is [7, 2] = {shown}" in err
    assert len(err) < 300  # no array in the message


def test_a_non_numeric_attack_option_is_named(capsys):
    flags = ["--byzantine.nodes=1", "--byzantine.attack=ipm", "--byzantine.attack_options.epsilon=abc"]
    assert main(["train", *RUN, *flags, "--print-config"]) == 2
    assert one_line_error(capsys) == "jaxgossip train: error: --byzantine.attack_options.epsilon='abc' must be a number"
    with pytest.raises(ValueError, match="epsilon='abc' must be a finite number"):
        algorithms.byzantine("gossip", topology.make("ring", 4), "ipm", num=1, key=0, epsilon="abc")


def test_outer_message_without_an_outer_optimizer_is_refused(capsys):
    assert main(["train", *RUN, "--outer_message=pseudo_gradient", "--print-config"]) == 2
    err = one_line_error(capsys)
    assert "outer_message='pseudo_gradient' with outer_optimizer='none'" in err and "--outer_optimizer=" in err
    assert main(["train", *RUN, "--outer_message=pseudo_gradient", "--outer_optimizer=nesterov", "--print-config"]) == 0


def test_an_availability_trace_with_no_node_ever_online_is_refused(tmp_path, capsys):
    path = tmp_path / "offline.npy"
    np.save(path, np.zeros((5, 4)))
    assert main(["train", *RUN, f"--time.availability=trace:{path}", "--print-config"]) == 2
    assert one_line_error(capsys) == (
        f"jaxgossip train: error: --time.availability='trace:{path}': no node is ever online (the trace holds "
        "only 0), so nothing would train"
    )


@pytest.mark.parametrize(
    "command",
    [
        ["train"],
        ["sweep", "--sweep.lr=0.05,0.1"],
        ["topology-sweep", "--train", "--topologies=ring"],
        ["demo", "--quick"],
        ["consensus"],
        ["tune-gamma"],
        ["compare", "runs/a", "runs/b"],
    ],
)
def test_an_empty_out_is_refused(tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)  # where the default folder would have been written
    if command[0] in ("consensus", "tune-gamma", "compare"):
        flags = []  # commands without the training config
    else:
        flags = [f for f in RUN if f != "--no-progress" or command[0] != "topology-sweep"]
    assert main([*command, *flags, "--out="]) == 2
    assert one_line_error(capsys) == (
        f"jaxgossip {command[0]}: error: --out='' names no folder; give one, or leave --out out for the default"
    )
    assert not os.path.exists(tmp_path / "runs")
