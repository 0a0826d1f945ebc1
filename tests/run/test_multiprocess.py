"""Several JAX processes, one run: ``python -m jaxgossip.run.launch`` starts 2 processes x 4 CPU devices
(gloo collectives, coordinator on localhost), which train through ``jaxgossip train`` (stopping
half-way and resuming from the orbax checkpoint) and run a consensus, with the node axis over all 8
devices (tests/multiprocess_worker.py). The results equal the uninterrupted single-process run on
8 devices (this pytest process, tests/conftest.py), and the files are written once."""

import concurrent.futures
import io
import json
import os
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxgossip.cli import main as cli_main
from jaxgossip.ops import sharding
from jaxgossip.run import distributed, launch

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: the worker and tiny.py
sys.path.insert(0, HERE)
import multiprocess_worker as worker  # noqa: E402

# Fields of a metrics row that are not results of the computation.
NOT_COMPARED = {"wall_time"}
# Sums and means over the node axis (and test samples), whose cross-device reduction order differs
# between one process and two (1 ulp seen, more often with XLA:CPU's classic emitters,
# tests/conftest.py); every other field is bitwise equal, and so is the saved state.
ROUND_OFF = {"test_loss", "node_loss_mean", "train_loss", "consensus", "model_sq_norm"}


def _restore_state(ckpt_dir: str, step: int):
    manager = ocp.CheckpointManager(os.path.abspath(ckpt_dir))
    try:
        return manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore())).state
    finally:
        manager.close()


@pytest.mark.skipif(len(jax.devices()) < 8, reason="the reference run needs 8 CPU devices (tests/conftest.py)")
def test_two_processes_equal_one_process(tmp_path, fully_optimized):
    out = io.StringIO()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, os.path.join(HERE, "multiprocess_worker.py"), str(tmp_path / "mp")]
    # The launcher mostly waits on its children, so the single-process reference (the same command
    # on this process's 8 devices) runs meanwhile, in this thread.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(launch.launch, command, 2, cpu_devices=4, timeout=240, stdout=out, env=env)
        ref_status = cli_main(
            [
                "train",
                *worker.TRAIN_ARGS,
                "--num_rounds=10",
                "--devices=8",
                "--no-progress",
                "--out",
                str(tmp_path / "one"),
            ]
        )
        result = running.result()
    log = out.getvalue()
    assert result.returncode == 0, f"launch failed: {result}\n--- output of both processes ---\n{log[-8000:]}"
    assert "process 0 of 2, 8 devices: consensus done" in log
    assert "[process 1] process 1 of 2, 8 devices: consensus done" in log
    assert ref_status == 0
    assert "resumed from" in log and "at round 5" in log  # the second run restored the checkpoint

    # Metrics: written once by process 0, equal to the reference.
    mp_rows = json.loads((tmp_path / "mp/train/metrics.json").read_text())["rows"]
    ref_rows = json.loads((tmp_path / "one/metrics.json").read_text())["rows"]
    assert [r["round"] for r in mp_rows] == [r["round"] for r in ref_rows] == [5, 10]
    for got, want in zip(mp_rows, ref_rows):
        assert got.keys() == want.keys()
        for key in want.keys() - NOT_COMPARED:
            if key in ROUND_OFF:
                np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=key)
            else:
                assert got[key] == want[key], (key, got[key], want[key])

    # Checkpoints: both kept steps complete, the state (after a save and a restore on every process)
    # bitwise equal to the uninterrupted reference's.
    ckpt = tmp_path / "mp/train/checkpoint"
    assert sorted(os.listdir(ckpt)) == ["10", "5"]
    written = [os.path.join(root, name) for root, dirs, files in os.walk(ckpt) for name in dirs + files]
    assert not [p for p in written if "process_1" in p], "process 1 wrote checkpoint files of its own"
    got, want = _restore_state(str(ckpt), 10), _restore_state(str(tmp_path / "one/checkpoint"), 10)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))

    # Consensus: the iterates bitwise, the error (a cross-device sum) to float32 round-off.
    saved = np.load(tmp_path / "mp/consensus.npz")
    x0 = worker.consensus_x0()
    ref = worker.consensus(sharding.shard_nodes(x0, sharding.node_mesh(8), 8))
    np.testing.assert_array_equal(saved["w"], ref.x["w"])
    np.testing.assert_array_equal(saved["b"], ref.x["b"])
    np.testing.assert_array_equal(saved["bits"], ref.bits)
    np.testing.assert_allclose(saved["error"], ref.error, rtol=1e-5)
    one_device = worker.consensus(x0)
    np.testing.assert_allclose(saved["w"], one_device.x["w"], rtol=1e-5, atol=1e-6)


def _python(code: str) -> list:
    return [sys.executable, "-c", code]


def test_launch_stops_the_others_when_one_fails():
    # Process 1 fails at once; process 0 would sleep for a minute (as a process waiting for a dead
    # peer in a collective would) unless the launcher stops it.
    code = "import os, sys, time\nif os.environ['JAXGOSSIP_PROCESS_ID'] == '1': sys.exit(3)\ntime.sleep(60)"
    out = io.StringIO()
    result = launch.launch(_python(code), 2, stdout=out, timeout=50)
    assert (result.returncode, result.failed, result.timed_out) == (3, 1, False)
    assert result.returncodes[1] == 3 and result.returncodes[0] != 0
    assert "process 1 exited with status 3" in out.getvalue()


def test_launch_environment():
    code = (
        "import os\nprint(os.environ['JAXGOSSIP_PROCESS_ID'], os.environ['JAXGOSSIP_NUM_PROCESSES'], "
        "os.environ['JAX_NUM_CPU_DEVICES'], os.environ['JAX_CPU_COLLECTIVES_IMPLEMENTATION'])"
    )
    out = io.StringIO()
    result = launch.launch(_python(code), 2, cpu_devices=3, stdout=out, timeout=60)
    assert (result.returncode, result.returncodes) == (0, [0, 0])
    lines = out.getvalue().splitlines()
    assert "0 2 3 gloo" in lines and "[process 1] 1 2 3 gloo" in lines


def test_launch_timeout_stops_everything():
    out = io.StringIO()
    result = launch.launch(_python("import time\ntime.sleep(60)"), 2, stdout=out, timeout=0.5)
    assert (result.returncode, result.timed_out, result.failed) == (launch.TIMEOUT_STATUS, True, None)
    assert all(code is not None and code != 0 for code in result.returncodes)  # stopped, not left running
    assert "timed out after 0.5 s" in out.getvalue()


@pytest.mark.parametrize(
    "args, match",
    [
        (([], 2), "no command"),
        ((["x"], 0), "processes=0"),
        ((["x"], 2, {"cpu_devices": 0}), "cpu_devices=0"),
        ((["x"], 2, {"port": 70000}), "port=70000"),
    ],
)
def test_launch_bad_input(args, match):
    positional = args[:2]
    keywords = args[2] if len(args) > 2 else {}
    with pytest.raises(ValueError, match=match):
        launch.launch(*positional, **keywords)


def test_launch_main_needs_a_command(capsys):
    with pytest.raises(SystemExit) as err:
        launch.main(["--processes=2"])
    assert err.value.code == 2
    assert "give the command after --" in capsys.readouterr().err


@pytest.mark.parametrize(
    "environ, match",
    [
        ({"JAXGOSSIP_COORDINATOR": "127.0.0.1:1234"}, "JAXGOSSIP_NUM_PROCESSES, JAXGOSSIP_PROCESS_ID missing"),
        (
            {"JAXGOSSIP_COORDINATOR": "localhost", "JAXGOSSIP_NUM_PROCESSES": "2", "JAXGOSSIP_PROCESS_ID": "0"},
            "must be HOST:PORT",
        ),
        (
            {"JAXGOSSIP_COORDINATOR": "h:1", "JAXGOSSIP_NUM_PROCESSES": "two", "JAXGOSSIP_PROCESS_ID": "0"},
            "JAXGOSSIP_NUM_PROCESSES='two' must be an integer",
        ),
        (
            {"JAXGOSSIP_COORDINATOR": "h:1", "JAXGOSSIP_NUM_PROCESSES": "2", "JAXGOSSIP_PROCESS_ID": "2"},
            r"JAXGOSSIP_PROCESS_ID=2 must be in \[0, 2\)",
        ),
        ({"JAXGOSSIP_DISTRIBUTED": "yes"}, "the only value is 'auto'"),
        ({"JAXGOSSIP_DISTRIBUTED": "auto", "JAXGOSSIP_PROCESS_ID": "0"}, "exclude each other"),
    ],
)
def test_initialize_from_env_refuses_bad_variables(environ, match):
    with pytest.raises(ValueError, match=match):
        distributed.initialize_from_env(environ)


def test_single_process_helpers():
    assert distributed.initialize_from_env({}) is False
    assert distributed.is_primary()
    distributed.barrier("noop")
    tree = {"a": jax.numpy.arange(8.0)}
    np.testing.assert_array_equal(sharding.to_host(tree)["a"], np.arange(8.0))


def test_only_train_runs_over_several_processes(monkeypatch, capsys):
    # As if the environment had joined a multi-process run: the other commands would each run whole
    # in every process and write the same files, so they are refused.
    monkeypatch.setattr(distributed, "initialize_from_env", lambda: True)
    assert cli_main(["consensus", "--num_steps=3"]) == 2
    assert "consensus runs in one process; of the commands, only train spreads" in capsys.readouterr().err
