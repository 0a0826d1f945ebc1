"""One writer per output folder (jaxgossip.run.lock): every writing command holds an exclusive lock on
--out from before its first write; a second command on a folder in use exits 2 at once naming the
folder and the PID holding it; a lock left by a killed run is taken over with a note; the lock file
(and a folder the command created and left empty) is gone after the command."""

import os
import signal
import subprocess
import sys
import time

import pytest
from _reference import fast_compile_env, file_hashes, start_cli
from tiny import TINY_FLAGS

from jaxgossip.cli import main
from jaxgossip.run import lock
from jaxgossip.run.lock import LOCK_NAME, OutLockError, hold_out


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_lock_excludes_a_second_holder_and_cleans_up(tmp_path):
    out = str(tmp_path / "a" / "b")  # missing parents are created, then removed again when left empty
    with hold_out(out, "jaxgossip test") as held:
        assert held == out and os.path.isdir(out)
        assert lock.holder(out).pid == os.getpid() and lock.holder(out).command == "jaxgossip test"
        # A second open file description (as another process would have) does not get the lock.
        with pytest.raises(OutLockError, match=rf"--out='{out}' is in use by jaxgossip test \(PID {os.getpid()}\)"):
            with hold_out(out, "jaxgossip other"):
                pass
        assert lock.holder(out).pid == os.getpid()  # the refused taker changed nothing
    assert not os.path.exists(tmp_path / "a")
    # A folder that existed, or got results, stays; only the lock file goes.
    with hold_out(out, "jaxgossip test"):
        with open(os.path.join(out, "result.txt"), "w") as f:
            f.write("x")
    assert sorted(os.listdir(out)) == ["result.txt"]


def test_stale_lock_of_a_dead_process_is_taken_over_with_a_note(tmp_path):
    out = str(tmp_path)
    pid = _dead_pid()
    with open(os.path.join(out, LOCK_NAME), "w") as f:
        f.write(f"pid={pid}\nhost=\ncommand=jaxgossip train\n")
    notes = []
    with hold_out(out, "jaxgossip sweep", log=notes.append):
        assert lock.holder(out).pid == os.getpid()
    assert len(notes) == 1 and f"PID {pid}" in notes[0] and "no longer runs" in notes[0]
    assert not os.path.exists(os.path.join(out, LOCK_NAME))


COMMANDS = {
    "train": TINY_FLAGS,
    "sweep": [*TINY_FLAGS, "--sweep.lr=0.05,0.1"],
    "consensus": ["--num_nodes=8", "--num_steps=3"],
    "topology-sweep": ["--topologies=ring", "--sizes=8", "--num_steps=3"],
    "tune-gamma": [
        "--algorithm=choco",
        "--algorithm_options.compressor=top_k",
        "--algorithm_options.compressor_options.fraction=0.1",
        "--shape=100",
        "--num_steps=4",
    ],
    "demo": ["--quick"],
    "design": ["--num_nodes=8"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_writing_command_refuses_a_folder_in_use(tmp_path, command, capsys):
    out = str(tmp_path / "run")
    os.makedirs(out)
    with open(os.path.join(out, "metrics.json"), "w") as f:
        f.write("{}")  # the other run's file
    with hold_out(out, "jaxgossip train"):
        before = file_hashes(out)
        start = time.perf_counter()
        assert main([command, *COMMANDS[command], "--out", out]) == 2
        err = capsys.readouterr().err
        assert f"--out={out!r} is in use by jaxgossip train (PID {os.getpid()})" in err, err
        assert err.count("\n") == 1, err  # one line, no traceback
        assert file_hashes(out) == before
    assert time.perf_counter() - start < 60  # refused before any data load or compile (not a speed claim)


@pytest.mark.slow  # three interpreters with jax (~25 s on 2 cores)
def test_second_train_on_a_running_folder_exits_2_then_a_killed_runs_lock_is_taken_over(tmp_path):
    """Two real processes: a training run (paused with SIGSTOP while it holds the lock) and a second
    `jaxgossip train` on its folder, refused with exit 2 without touching a file; then the first is
    SIGKILLed and a third command (a short consensus run) takes its lock over, says so and finishes."""
    out = tmp_path / "run"
    env = fast_compile_env()
    flags = [*TINY_FLAGS, "--no-progress"]
    first = start_cli("train", flags, out, env)
    lock_file = out / LOCK_NAME
    try:
        deadline = time.monotonic() + 120
        while not (lock_file.exists() and f"pid={first.pid}" in lock_file.read_text()):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first run never took the lock"
            time.sleep(0.01)
        os.kill(first.pid, signal.SIGSTOP)
        before = file_hashes(out)
        second = start_cli("train", flags, out, env)
        stdout, stderr = second.communicate(timeout=120)
        assert second.returncode == 2, stderr
        assert stderr.strip() == (
            f"jaxgossip train: error: --out={str(out)!r} is in use by jaxgossip train (PID {first.pid}); "
            "wait for it to finish or give another --out"
        )
        assert file_hashes(out) == before
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.communicate()
    assert lock_file.exists()  # a killed holder cannot clean up; the kernel has dropped its flock
    third = start_cli("consensus", ["--num_nodes=8", "--num_steps=3"], out, env)
    stdout, stderr = third.communicate(timeout=300)
    assert third.returncode == 0, stderr
    assert f"took over the lock of {out} from jaxgossip train (PID {first.pid}), which no longer runs" in stderr
    assert not lock_file.exists()
    assert os.path.exists(out / "consensus.json")


def test_an_out_that_cannot_be_created_is_refused_before_any_data_is_loaded(capsys):
    assert main(["train", *TINY_FLAGS, "--out", "/proc/jaxgossip_no_such_dir/run"]) == 2
    printed, err = capsys.readouterr()
    assert err.startswith("jaxgossip train: error: --out='/proc/jaxgossip_no_such_dir/run' ") and err.count("\n") == 1
    assert "data:" not in printed  # refused before the data set is loaded
