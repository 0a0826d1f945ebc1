"""``jaxgossip compare DIR...``: two tiny finished runs (gossip, and Choco with top-k) in one table
with a "vs first" MB ratio and overlay plots; and each refusal (exit 2, one line naming the folder
and the reason, nothing written): no metrics.json, a missing folder, an unfinished run, a diverged
run, incompatible runs (the field and both values), a folder listed twice, --out on a run."""

import json
import shutil

import pytest
from _reference import run_main
from tiny import TINY_FLAGS, tiny_config

from jaxgossip.cli import main

CHOCO = [
    "--algorithm=choco",
    "--algorithm_options.gamma=0.3",
    "--algorithm_options.compressor=top_k",
    "--algorithm_options.compressor_options.fraction=0.25",
]
PANELS = [
    "accuracy_vs_rounds",
    "accuracy_vs_bits",
    "accuracy_vs_time",
    "loss_vs_rounds",
    "loss_vs_bits",
    "loss_vs_time",
    "consensus",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two finished tiny runs, and one interrupted after its first chunk (1 of 4 evaluations)."""
    from jaxgossip.run.runner import run_training

    root = tmp_path_factory.mktemp("runs")
    for name, extra in (("gossip", []), ("choco", CHOCO)):
        assert main(["train", *TINY_FLAGS, *extra, "--no-progress", "--out", str(root / name)]) == 0
    run_training(tiny_config(), str(root / "stopped"), progress=False, stop_after_chunks=1, log=lambda s: None)
    return root


def test_table_and_plots(runs, capsys, tmp_path):
    out = tmp_path / "compare"
    code, stdout, err = run_main(capsys, "compare", str(runs / "gossip"), str(runs / "choco"), "--out", str(out))
    assert code == 0, err
    lines = stdout.splitlines()
    header = lines[0].split()
    for column in ("run", "acc(avg)", "acc(nodes)", "consensus", "MB/node", "first", "sim", "watchdog"):
        assert column in header, column
    assert lines[2].startswith("gossip (ring(4))") and lines[3].startswith("choco (ring(4))")
    rows = json.loads((out / "comparison.json").read_text())["rows"]
    assert [r["name"] for r in rows] == ["gossip (ring(4))", "choco (ring(4))"]
    assert rows[0]["reduction"] == 1.0 and rows[1]["reduction"] > 2  # top-25% values and their indices
    assert rows[0]["test_acc"] == json.loads((runs / "gossip" / "metrics.json").read_text())["rows"][-1]["test_acc"]
    for panel in PANELS:
        assert (out / f"{panel}.png").stat().st_size > 0, panel
    assert "| gossip (ring(4))" in (out / "comparison.md").read_text()


def test_options_anywhere_and_runs_option(runs, capsys, tmp_path):
    out = tmp_path / "compare"
    code, stdout, err = run_main(capsys, "compare", "--out", str(out), str(runs / "choco"), f"--runs={runs / 'gossip'}")
    assert code == 0, err
    # --runs come first, then the folders given as arguments
    assert [r["name"] for r in json.loads((out / "comparison.json").read_text())["rows"]] == [
        "gossip (ring(4))",
        "choco (ring(4))",
    ]


def _copy(runs, tmp_path, name="copy", change=None, rows=None, data_source=None):
    """A copy of the gossip run with ``change`` applied to its config.json, its metric rows replaced
    by ``rows(rows)`` or its data source replaced."""
    folder = tmp_path / name
    shutil.copytree(runs / "gossip", folder, ignore=shutil.ignore_patterns("checkpoint", "*.png"))
    if change:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **change}))
    metrics = json.loads((folder / "metrics.json").read_text())
    if rows:
        metrics["rows"] = rows(metrics["rows"])
    if data_source:
        metrics["data_source"] = data_source
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return folder


def _refused(capsys, tmp_path, *folders):
    out = tmp_path / "never"
    code, _, err = run_main(capsys, "compare", *map(str, folders), "--out", str(out))
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("jaxgossip compare: error: ") and not out.exists(), err
    return err


def test_refuses_a_folder_without_metrics_and_a_missing_one(runs, capsys, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert f"{empty}: no metrics.json" in _refused(capsys, tmp_path, runs / "gossip", empty)
    assert f"{tmp_path / 'nope'}: does not exist" in _refused(capsys, tmp_path, runs / "gossip", tmp_path / "nope")
    assert "no runs to compare" in _refused(capsys, tmp_path)


def test_refuses_unfinished_and_diverged_runs(runs, capsys, tmp_path):
    err = _refused(capsys, tmp_path, runs / "gossip", runs / "stopped")
    assert f"{runs / 'stopped'}: unfinished run: its metrics end at round 5 of num_rounds=20" in err
    # a run killed (or diverged) in its last chunk has every row but not the end-of-run write
    unmarked = lambda rows: [{k: v for k, v in r.items() if k != "phase"} for r in rows]  # noqa: E731
    killed = _copy(runs, tmp_path, "killed", rows=unmarked)
    assert "unfinished run: it stopped before its final write" in _refused(capsys, tmp_path, runs / "gossip", killed)
    nan = _copy(runs, tmp_path, "nan", rows=lambda rows: rows[:2] + [dict(rows[2], train_loss=None)] + rows[3:])
    assert f"{nan}: the run diverged at round 15" in _refused(capsys, tmp_path, runs / "gossip", nan)


@pytest.mark.parametrize(
    "field, value",
    [
        ("dataset", "digits"),
        ("num_nodes", 8),
        ("model", "cnn"),
        ("model_options", {"hidden": [16]}),
        ("partition", "dirichlet:0.5"),
        ("eval_size", 64),
    ],
)
def test_refuses_incompatible_runs_naming_the_field_and_values(field, value, runs, capsys, tmp_path):
    other = _copy(runs, tmp_path, change={field: value})
    first = json.loads((runs / "gossip" / "config.json").read_text())[field]
    err = _refused(capsys, tmp_path, runs / "gossip", other)
    assert f"runs not comparable: {field} " in err
    assert f"{field}={first!r} in {runs / 'gossip'} but {field}={value!r} in {other}" in err


def test_refuses_other_data_a_repeated_folder_and_out_on_a_run(runs, capsys, tmp_path):
    other = _copy(runs, tmp_path, data_source="npz:/somewhere/else.npz")
    assert "runs not comparable: the data differs" in _refused(capsys, tmp_path, runs / "gossip", other)
    assert "listed twice" in _refused(capsys, tmp_path, runs / "gossip", runs / "choco", runs / "gossip")
    code, _, err = run_main(capsys, "compare", str(runs / "gossip"), str(runs / "choco"), "--out", str(runs / "choco"))
    assert code == 2 and f"is the compared folder {str(runs / 'choco')!r}" in err
