"""Crash-safe run directories: a run interrupted anywhere in the checkpoint save path (an exception
half-way, a real SIGKILL of a subprocess) resumes from the last complete checkpoint and ends
bit-identical to an uninterrupted run; a refused resume changes no file in ``--out``.

Checkpoint folders under --no-resume and damage: --no-resume deletes only what jaxgossip wrote
(or refuses with exit 2 naming the other files, deleting nothing); a damaged newest checkpoint
(a data file truncated or with a byte flipped, or unreadable metadata) is reported in one line, set
aside as <R>.damaged and the run resumes from the newest intact one, bit-identical to an
uninterrupted run; with no intact one the resume is refused and no file changes."""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
from _reference import fast_compile_env, file_hashes
from tiny import TINY_FLAGS, tiny_config

from jaxgossip.cli import main
from jaxgossip.run import checkpoint
from jaxgossip.run.checkpoint import CheckpointError
from jaxgossip.run.runner import run_training

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where tiny.py lives
CONFIG = tiny_config()  # 20 rounds, a chunk (and a checkpoint) every 5


def _quiet(config, out, **kwargs):
    return run_training(config, out, progress=False, log=lambda s: None, **kwargs)


def _timeless(rows):
    return [{k: v for k, v in r.items() if k != "wall_time"} for r in rows]


def _assert_same_run(result, reference):
    assert result.finished
    for a, b in zip(jax.tree_util.tree_leaves(result.state), jax.tree_util.tree_leaves(reference.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert _timeless(result.rows) == _timeless(reference.rows)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """The uninterrupted run and its folder."""
    out = str(tmp_path_factory.mktemp("reference"))
    return _quiet(CONFIG, out), out


@pytest.fixture(scope="module")
def reference(reference_run):
    return reference_run[0]


def test_exception_half_way_through_a_save_resumes_from_last_complete(tmp_path, monkeypatch, reference):
    """orbax writes each item into a temporary folder and renames it; failing at the first item
    rename of round 10 leaves an unfinished step that resume must ignore (and clean up)."""
    out = str(tmp_path / "run")
    rename = os.rename

    def failing_rename(src, dst, *args, **kwargs):
        if f"{os.sep}10.orbax-checkpoint-tmp{os.sep}" in str(dst):
            raise OSError("disk full (simulated)")
        return rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", failing_rename)
    with pytest.raises(Exception, match="disk full"):
        _quiet(CONFIG, out)
    monkeypatch.setattr(os, "rename", rename)
    ckpt = os.path.join(out, "checkpoint")
    assert any(name.startswith("10.") for name in os.listdir(ckpt)), "the unfinished step should be on disk"
    assert checkpoint.latest(ckpt).round == 5
    result = _quiet(CONFIG, out)
    assert result.start_round == 5
    _assert_same_run(result, reference)
    assert sorted(os.listdir(ckpt)) == ["15", "20"]  # unfinished step cleaned, max_to_keep = 2


# A subprocess that trains CONFIG and SIGKILLs itself at a point of the save path of round STEP:
# finalize: before orbax renames the complete temporary step folder to its final name;
# after_finalize: right after that rename (before older steps are deleted);
# metrics_json: before metrics.json of that round's chunk replaces the old one (it is written
# before the checkpoint, so that round's checkpoint does not exist yet).
_KILLER = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from tiny import tiny_config
from jaxgossip.run.runner import run_training

out, point, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
rename, replace = os.rename, os.replace
seen = {{"metrics": 0}}

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def killing_rename(src, dst, *args, **kwargs):
    src, dst = str(src), str(dst)
    tmp = os.path.join(out, "checkpoint", f"{{step}}.orbax-checkpoint-tmp")
    if point == "finalize" and src == tmp:
        die()
    result = rename(src, dst, *args, **kwargs)
    if point == "after_finalize" and src == tmp:
        die()
    return result

def killing_replace(src, dst, *args, **kwargs):
    if point == "metrics_json" and str(dst).endswith("metrics.json"):
        seen["metrics"] += 1
        if seen["metrics"] == step // 5:
            die()
    return replace(src, dst, *args, **kwargs)

os.rename, os.replace = killing_rename, killing_replace
run_training(tiny_config(), out, progress=False, log=lambda s: None)
sys.exit("not killed")
"""


@pytest.mark.parametrize(
    "point, step, resumed_at",
    [("finalize", 10, 5), ("after_finalize", 10, 10), ("metrics_json", 15, 10)],
)
def test_sigkill_in_the_save_path_resumes_bit_identical(tmp_path, reference, point, step, resumed_at):
    out = str(tmp_path / "run")
    script = tmp_path / "killer.py"
    script.write_text(_KILLER.format(tests=TESTS))
    proc = subprocess.run(
        [sys.executable, str(script), out, point, str(step)],
        env=fast_compile_env(),  # compiled as this process's reference and resume (tests/conftest.py)
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    result = _quiet(CONFIG, out)
    assert result.start_round == resumed_at
    _assert_same_run(result, reference)
    with open(os.path.join(out, "metrics.json")) as f:
        saved = json.load(f)
    assert _timeless(saved["rows"]) == _timeless(reference.rows)
    assert all(isinstance(r["wall_time"], float) for r in saved["rows"])  # restored rows keep their times


def test_finished_run_resumes_without_training_to_the_same_files(reference_run):
    reference, out = reference_run
    before = file_hashes(out)
    again = _quiet(CONFIG, out)
    assert again.start_round == 20
    _assert_same_run(again, reference)
    assert file_hashes(out) == before


def test_refused_resume_leaves_every_file_unchanged(tmp_path):
    out = str(tmp_path / "run")
    config = tiny_config(num_rounds=10)
    _quiet(config, out)
    before = file_hashes(out)
    assert "config.json" in before and "metrics.json" in before
    for changes, match in (
        ({"lr": 0.5}, r"another configuration \(lr: saved 0.05 vs now 0.5\).*--no-resume"),
        ({"num_nodes": 8}, r"another configuration \(num_nodes: saved 4 vs now 8\).*--no-resume"),
        ({"num_rounds": 5}, r"10 rounds done, more than num_rounds=5; give --num_rounds >= 10.*--no-resume"),
    ):
        with pytest.raises(CheckpointError, match=match):
            _quiet(config.replace(**changes), out)
        assert file_hashes(out) == before, changes


def test_refused_resume_through_the_cli_exits_2_and_names_no_resume(tmp_path, capsys):
    from jaxgossip.cli import main

    out = str(tmp_path / "cli")
    flags = ["--dataset=synthetic", "--num_nodes=4", "--model=mlp", '--model_options={"hidden": [8]}']
    flags += ["--batch_size=8", "--eval_every=5", "--eval_size=128", "--eval_chunk=64"]
    assert main(["train", "--out", out, "--no-progress", "--num_rounds=10", *flags]) == 0
    before = file_hashes(out)
    capsys.readouterr()
    assert main(["train", "--out", out, "--no-progress", "--num_rounds=5", *flags]) == 2
    err = capsys.readouterr().err
    assert "10 rounds done" in err and "--no-resume" in err
    assert file_hashes(out) == before
    # --no-resume starts over: the 5-round run replaces the 10-round one.
    assert main(["train", "--out", out, "--no-progress", "--no-resume", "--num_rounds=5", *flags]) == 0
    with open(os.path.join(out, "metrics.json")) as f:
        assert [r["round"] for r in json.load(f)["rows"]] == [5]
    assert checkpoint.latest(os.path.join(out, "checkpoint")).round == 5


def test_larger_num_rounds_continues_a_finished_run(tmp_path, reference):
    out = str(tmp_path / "run")
    _quiet(CONFIG.replace(num_rounds=10), out)
    longer = _quiet(CONFIG, out)
    assert longer.start_round == 10
    _assert_same_run(longer, reference)
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["num_rounds"] == 20


def test_typed_prng_keys_and_extended_dtypes_round_trip_bitwise(tmp_path):
    """A state holding typed PRNG keys (PowerGossip's shared per-edge key, any impl) saves, passes
    the fingerprint check and restores as typed keys of the same impl and bits."""
    from jaxgossip.engine.training import Metrics

    state = {
        "threefry": jax.random.split(jax.random.key(3), 5),
        "rbg": jax.random.key(4, impl="rbg"),
        "round": np.int32(5),
        "x": np.arange(6, dtype=np.float32).reshape(2, 3),
    }
    like = jax.tree_util.tree_map(lambda x: x, state)
    fields = {name: np.zeros((1,), np.float32) for name in Metrics._fields}
    fields["round"] = np.array([5], np.int32)
    fields["bits"] = np.zeros((1, 2), np.float32)
    config = {"num_rounds": 10}

    checkpoint.save(str(tmp_path), _RoundTree(state), Metrics(**fields), [1.0], config)
    restored = checkpoint.restore(str(tmp_path), _RoundTree(like), config)
    for name in ("threefry", "rbg"):
        got, want = restored.state.tree[name], state[name]
        assert jax.dtypes.issubdtype(got.dtype, jax.dtypes.prng_key)
        assert jax.random.key_impl(got) == jax.random.key_impl(want)
        np.testing.assert_array_equal(jax.random.key_data(got), jax.random.key_data(want))
    np.testing.assert_array_equal(restored.state.tree["x"], state["x"])


@jax.tree_util.register_pytree_node_class
class _RoundTree:
    """A pytree with a ``round`` attribute, as :func:`checkpoint.save` reads from a TrainState."""

    def __init__(self, tree):
        self.tree = tree
        self.round = tree["round"]

    def tree_flatten(self):
        return (self.tree,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0])


def test_no_resume_refuses_to_delete_a_users_file_and_deletes_only_checkpoints(tmp_path, capsys):
    out = tmp_path / "run"
    flags = [*TINY_FLAGS, "--num_rounds=10", "--no-progress", "--out", str(out)]
    assert main(["train", *flags]) == 0
    ckpt = out / "checkpoint"
    (ckpt / "notes.txt").write_text("my notes")
    (ckpt / "10.backup").mkdir()  # a step-like name jaxgossip never writes
    assert checkpoint.foreign_files(str(ckpt)) == ["10.backup", "notes.txt"]
    before = file_hashes(out)
    capsys.readouterr()
    assert main(["train", *flags, "--no-resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "files jaxgossip did not write: 10.backup, notes.txt" in err, err
    assert "nothing was deleted" in err
    assert file_hashes(out) == before and (ckpt / "10.backup").is_dir()
    # Without the user's files, --no-resume deletes the steps (an unfinished one included) and the folder.
    (ckpt / "notes.txt").unlink()
    (ckpt / "10.backup").rmdir()
    (ckpt / "15.orbax-checkpoint-tmp-3").mkdir()
    checkpoint.clear(str(ckpt))
    assert not ckpt.exists() and (out / "metrics.json").exists()


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A run stopped after 3 chunks: checkpoints of rounds 10 and 15."""
    out = str(tmp_path_factory.mktemp("interrupted") / "run")
    run_training(CONFIG, out, progress=False, log=lambda s: None, stop_after_chunks=3)
    assert sorted(os.listdir(os.path.join(out, "checkpoint"))) == ["10", "15"]
    return out


def _copy(interrupted, tmp_path):
    out = str(tmp_path / "run")
    shutil.copytree(interrupted, out)
    return out


def _damage(step_dir, how):
    if how == "metadata":
        with open(os.path.join(step_dir, "meta", "metadata"), "w") as f:
            f.write("{not json")
        return
    largest = max(glob.glob(os.path.join(step_dir, "state", "ocdbt.process_0", "d", "*")), key=os.path.getsize)
    data = bytearray(open(largest, "rb").read())
    if how == "truncate":
        data = data[: len(data) // 2]
    else:  # one byte flipped: the storage layer reads it without complaint, the SHA-256 in meta does not match
        data[len(data) // 2] ^= 0xFF
    with open(largest, "wb") as f:
        f.write(bytes(data))


@pytest.mark.parametrize("how", ["truncate", "flip", "metadata"])
def test_damaged_newest_checkpoint_is_set_aside_and_the_run_resumes_bit_identical(
    interrupted, tmp_path, reference, how
):
    out = _copy(interrupted, tmp_path)
    ckpt = os.path.join(out, "checkpoint")
    _damage(os.path.join(ckpt, "15"), how)
    lines = []
    result = run_training(CONFIG, out, progress=False, log=lines.append)
    assert result.start_round == 10 and result.finished
    for a, b in zip(jax.tree_util.tree_leaves(result.state), jax.tree_util.tree_leaves(reference.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    timeless = [[{k: v for k, v in r.items() if k != "wall_time"} for r in x.rows] for x in (result, reference)]
    assert timeless[0] == timeless[1]
    notes = [line for line in lines if "is damaged" in line]
    assert len(notes) == 1 and "round 15 is damaged" in notes[0] and "set aside as 15.damaged" in notes[0]
    assert "resuming from round 10" in notes[0] and len(notes[0]) < 400 and "\n" not in notes[0]
    assert os.listdir(os.path.join(ckpt, "15.damaged"))  # renamed with its files, never deleted
    assert sorted(os.listdir(ckpt)) == ["15", "15.damaged", "20"]


def test_no_intact_checkpoint_refuses_and_leaves_every_file_unchanged(interrupted, tmp_path, capsys):
    out = _copy(interrupted, tmp_path)
    for step in ("10", "15"):
        _damage(os.path.join(out, "checkpoint", step), "truncate")
    before = file_hashes(out)
    flags = [*TINY_FLAGS, "--lr=0.05", "--evals_per_chunk=1", "--no-progress", "--out", out]
    assert main(["train", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"no checkpoint in {out}/checkpoint could be restored (round 15: " in err and "round 10: " in err
    assert "--no-resume" in err
    assert file_hashes(out) == before  # config.json not rewritten, nothing renamed


def _truncate_every_state_file(step_dir):
    for path in glob.glob(os.path.join(step_dir, "state", "ocdbt.process_0", "d", "*")):
        data = open(path, "rb").read()
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])


def test_a_failed_restore_leaves_no_noise_of_its_abandoned_reads(interrupted, tmp_path, monkeypatch, caplog):
    """The reads still in flight when one array of a step fails report to orbax's closed event loop
    (unraisable 'Event loop is closed', coroutines collected unawaited, asyncio's unretrieved
    errors) in about half of the attempts; none of it reaches the hook or the log."""
    import sys

    from jaxgossip.run.runner import build

    out = _copy(interrupted, tmp_path)
    ckpt = os.path.join(out, "checkpoint")
    _truncate_every_state_file(os.path.join(ckpt, "15"))
    heard = []
    monkeypatch.setattr(sys, "unraisablehook", heard.append)
    like = build(CONFIG).trainer.init(jax.random.key(CONFIG.seed))
    caplog.set_level("DEBUG")
    for _ in range(6):
        restored = checkpoint.restore(ckpt, like, CONFIG.to_dict(), set_aside=False)
        assert restored.round == 10 and restored.set_aside == ("15",)
    assert heard == []
    assert not [r for r in caplog.records if r.name == "asyncio"]


def test_the_command_line_falls_back_without_exception_noise(interrupted, tmp_path):
    import subprocess
    import sys

    out = _copy(interrupted, tmp_path)
    _truncate_every_state_file(os.path.join(out, "checkpoint", "15"))
    flags = [*TINY_FLAGS, "--lr=0.05", "--evals_per_chunk=1", "--no-progress", "--out", out]
    done = subprocess.run(
        [sys.executable, "-m", "jaxgossip.cli", "train", *flags], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "round 15 is damaged" in done.stdout
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr
