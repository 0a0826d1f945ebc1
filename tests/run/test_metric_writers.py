"""TensorBoard event files hold the same scalars as metrics.json; the progress bar counts rounds."""

import glob
import json
import os
import struct
import sys

import numpy as np
import pytest
from tiny import tiny_config

from jaxgossip.run.metric_writers import SCALAR_TAGS, scalar_tag, write_tensorboard
from jaxgossip.run.runner import run_training


def _read_scalars(log_dir):
    """tag -> {step: value} from the TFRecord framing of the event files (length, CRC, Event proto, CRC)."""
    event_pb2 = pytest.importorskip("tensorboardX.proto.event_pb2")
    scalars = {}
    paths = glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))
    assert len(paths) == 1, paths
    with open(paths[0], "rb") as f:
        data = f.read()
    at = 0
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
        at += 12 + length + 4
        for value in event.summary.value:
            scalars.setdefault(value.tag, {})[event.step] = value.simple_value
    return scalars


class _Bar:
    """Records what run_training tells its progress bar."""

    calls = []

    def __init__(self, total, initial, unit, **kwargs):
        self.calls.append(("init", total, initial, unit))

    def update(self, n):
        self.calls.append(("update", n))

    def set_postfix(self, **kwargs):
        pass

    def close(self):
        pass


def test_run_writes_tensorboard_scalars_equal_to_metrics_json(tmp_path, monkeypatch):
    pytest.importorskip("tensorboardX")
    import tqdm.auto

    monkeypatch.setattr(tqdm.auto, "tqdm", _Bar)
    config = tiny_config(num_rounds=10).replace(tensorboard=True)
    out = str(tmp_path / "run")
    run_training(config, out, progress=True, log=lambda s: None)
    assert _Bar.calls == [("init", 10, 0, "round"), ("update", 5), ("update", 5)]
    with open(os.path.join(out, "metrics.json")) as f:
        rows = json.load(f)["rows"]
    scalars = _read_scalars(os.path.join(out, "tensorboard"))
    for column in ("test_acc", "node_acc_mean", "node_acc_min", "node_acc_max", "consensus", "MB_per_node"):
        assert SCALAR_TAGS[column] in scalars, column
    for row in rows:
        for column, value in row.items():
            if column in ("round", "phase"):
                continue
            assert scalars[scalar_tag(column)][row["round"]] == np.float32(value), column
    # Writing again (a resumed run) replaces the file: still one value per tag and step.
    write_tensorboard(os.path.join(out, "tensorboard"), rows)
    assert _read_scalars(os.path.join(out, "tensorboard")) == scalars


def test_merged_rows_get_their_own_tags(tmp_path):
    pytest.importorskip("tensorboardX")
    rows = [
        {"round": 5, "test_acc": 0.5, "phase": "train", "note": "x"},
        {"round": 5, "test_acc": 0.75, "phase": "merged", "comm_s": 1.5},
    ]
    tags = write_tensorboard(str(tmp_path), rows)
    assert tags == ["accuracy/test_acc", "merged/accuracy/test_acc", "merged/other/comm_s"]
    scalars = _read_scalars(str(tmp_path))
    assert scalars["accuracy/test_acc"] == {5: 0.5} and scalars["merged/accuracy/test_acc"] == {5: 0.75}


def test_missing_tensorboardx_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(ImportError, match=r"pip install 'jaxgossip\[tensorboard\]'"):
        write_tensorboard(str(tmp_path), [{"round": 1, "test_acc": 0.5}])


def test_sweep_writes_one_tensorboard_run_per_point(tmp_path, capsys):
    pytest.importorskip("tensorboardX")
    from jaxgossip.cli import main

    out = tmp_path / "sweep"
    argv = ["sweep", "--dataset=synthetic", "--num_nodes=4", "--model=mlp", "--model_options.hidden=8",
            "--batch_size=8", "--num_rounds=10", "--eval_every=5", "--eval_size=64", "--sweep.lr=0.05,0.1",
            "--seeds=2", "--tensorboard", "--out", str(out), "--no-progress"]
    assert main(argv) == 0, capsys.readouterr().err
    saved = json.loads((out / "sweep.json").read_text())
    runs = sorted(os.listdir(out / "tensorboard"))
    assert runs == ["lr=0.05", "lr=0.1"]
    for run, row in zip(runs, saved["rows"]):
        scalars = _read_scalars(out / "tensorboard" / run)
        assert sorted(scalars[SCALAR_TAGS["test_acc"]]) == [5, 10]
        # the last point of each run is the seed mean the sweep table reports
        assert scalars[SCALAR_TAGS["test_acc"]][10] == pytest.approx(row["test_acc"], abs=1e-6)
        assert scalars[SCALAR_TAGS["MB_per_node"]][10] == pytest.approx(row["MB_per_node"], rel=1e-6)
