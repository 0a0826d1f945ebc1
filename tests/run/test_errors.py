"""What a failed command tells its user (jaxgossip.run.errors): bad input exits 2 with one line; a
bug exits 1 with one line naming the traceback file (or the traceback with JAXGOSSIP_TRACEBACK=1);
a full disk exits 1 with one line naming the folder and the space needed, and leaves no unfinished
checkpoint behind."""

import os
import shutil
import subprocess
import uuid

import jax
import numpy as np
import pytest
from tiny import TINY_FLAGS

from jaxgossip import cli
from jaxgossip.run import checkpoint, errors


def _train(tmp_path, *extra):
    return cli.main(["train", *TINY_FLAGS, "--num_rounds=10", "--no-progress", f"--out={tmp_path / 'run'}", *extra])


def _one_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("jaxgossip")]
    assert len(lines) == 1, lines
    return lines[0]


def _crash_in_save(*args, **kwargs):
    # The failure a bug in the save path produces: NumPy meeting a typed PRNG key (raised inside JAX).
    np.asarray(jax.random.key(0))


def test_a_bug_exits_1_with_one_line_and_the_traceback_in_out(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(checkpoint, "save", _crash_in_save)
    assert _train(tmp_path) == 1
    line = _one_line(capsys)
    assert "internal error" in line and "TypeError" in line and "JAXGOSSIP_TRACEBACK=1" in line
    path = tmp_path / "run" / "traceback.txt"
    assert str(path) in line
    text = path.read_text()
    assert "Traceback (most recent call last)" in text and "_crash_in_save" in text


def test_a_bug_with_traceback_env_raises(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "save", _crash_in_save)
    monkeypatch.setenv("JAXGOSSIP_TRACEBACK", "1")
    with pytest.raises(TypeError):
        _train(tmp_path)


def test_bad_input_still_exits_2_with_one_line(tmp_path, capsys):
    assert _train(tmp_path, "--lr=-1") == 2
    assert "lr" in _one_line(capsys)
    assert cli.main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in _one_line(capsys)


def test_classifier_separates_checks_from_library_failures():
    def check():
        raise ValueError("k=0 must be positive")

    with pytest.raises(ValueError) as ours:
        check()
    assert not errors.is_user_error(ours.value)  # a raise in the tests, not in the jaxgossip package
    from jaxgossip import topology

    with pytest.raises(ValueError) as bad_graph:
        topology.ring(1)
    assert errors.is_user_error(bad_graph.value)
    with pytest.raises(TypeError) as library:
        np.asarray(jax.random.key(0))
    assert not errors.is_user_error(library.value)
    assert errors.is_user_error(errors.UsageError("x"))
    assert errors.is_user_error(FileNotFoundError(2, "No such file", "a.yaml"))
    assert errors.is_disk_full(OSError(28, "No space left on device"))
    wrapped = RuntimeError("writer failed")
    wrapped.__cause__ = ValueError("RESOURCE_EXHAUSTED: ... No space left on device [os_error_code='28']")
    assert errors.is_disk_full(wrapped) and not errors.is_user_error(wrapped)


def test_disk_full_is_refused_before_the_save_with_the_space_needed(tmp_path, capsys, monkeypatch):
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=1000))
    assert _train(tmp_path) == 1
    line = _one_line(capsys)
    assert "no space left on device" in line and str(tmp_path / "run" / "checkpoint") in line
    assert "MB free" in line and "needs about" in line
    assert not os.path.exists(tmp_path / "run" / "traceback.txt")


def test_disk_full_half_way_through_a_save_leaves_no_unfinished_step(tmp_path, capsys, monkeypatch):
    import orbax.checkpoint as ocp

    real_save = ocp.CheckpointManager.save

    def failing_save(self, step, *args, **kwargs):
        if step > 5:  # the first checkpoint is written; the second one runs out of space half-way
            os.makedirs(os.path.join(str(self.directory), f"{step}.orbax-checkpoint-tmp", "state"))
            raise ValueError("RESOURCE_EXHAUSTED: Failed to write 186 bytes: No space left on device [os_error_code='28']")
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", failing_save)
    assert _train(tmp_path) == 1
    line = _one_line(capsys)
    assert "no space left on device for the checkpoint of round 10" in line and "the previous checkpoint" in line
    assert sorted(os.listdir(tmp_path / "run" / "checkpoint")) == ["5"]


def _mount_tmpfs(path, size):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    os.makedirs(path, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


def test_a_really_full_disk(tmp_path, capsys):
    """On a 450 kB tmpfs (where this machine lets root mount one): the first checkpoint fits, the
    second does not; one line, the first checkpoint kept, nothing unfinished. A step holds ~200 kB
    in a varying number of files (tmpfs counts whole pages) and a save asks for its arrays plus
    128 kB, so 450 kB leaves a margin on both sides."""
    disk = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    if not _mount_tmpfs(disk, "450k"):
        pytest.skip("cannot mount a tmpfs here")
    try:
        code = cli.main(
            ["train", *TINY_FLAGS, "--model_options.hidden=64", "--num_rounds=10", "--no-progress", f"--out={disk}/run"]
        )
        assert code == 1
        line = _one_line(capsys)
        assert "no space left on device" in line and f"{disk}/run/checkpoint" in line
        assert sorted(os.listdir(disk / "run" / "checkpoint")) == ["5"]
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def test_every_commands_help_names_the_exit_statuses_and_the_traceback_switch(capsys):
    for name in cli.COMMANDS:
        assert cli.main([name, "--help"]) == 0
        text = capsys.readouterr().out
        assert "exit status:" in text and "JAXGOSSIP_TRACEBACK=1" in text, name
    assert cli.main(["--help"]) == 0
    assert "JAXGOSSIP_TRACEBACK=1" in capsys.readouterr().out
