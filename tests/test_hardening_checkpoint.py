"""Checkpoint folders under --no-resume and damage: --no-resume deletes only what jaxgossip wrote
(or refuses with exit 2 naming the other files, deleting nothing)."""

import hashlib
import os

from tiny import TINY_FLAGS

from jaxgossip.cli import main
from jaxgossip.run import checkpoint


def _hashes(folder):
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


def test_no_resume_refuses_to_delete_a_users_file_and_deletes_only_checkpoints(tmp_path, capsys):
    out = tmp_path / "run"
    flags = [*TINY_FLAGS, "--num_rounds=10", "--no-progress", "--out", str(out)]
    assert main(["train", *flags]) == 0
    ckpt = out / "checkpoint"
    (ckpt / "notes.txt").write_text("my notes")
    (ckpt / "10.backup").mkdir()  # a step-like name jaxgossip never writes
    assert checkpoint.foreign_files(str(ckpt)) == ["10.backup", "notes.txt"]
    before = _hashes(out)
    capsys.readouterr()
    assert main(["train", *flags, "--no-resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "files jaxgossip did not write: 10.backup, notes.txt" in err, err
    assert "nothing was deleted" in err
    assert _hashes(out) == before and (ckpt / "10.backup").is_dir()
    # Without the user's files, --no-resume deletes the steps (an unfinished one included) and the folder.
    (ckpt / "notes.txt").unlink()
    (ckpt / "10.backup").rmdir()
    (ckpt / "15.orbax-checkpoint-tmp-3").mkdir()
    checkpoint.clear(str(ckpt))
    assert not ckpt.exists() and (out / "metrics.json").exists()
