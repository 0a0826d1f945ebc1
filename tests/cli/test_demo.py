"""The README's main job, ``jaxgossip demo``, with its default method list end to end at a tiny
size: every default method trains, checkpoints and reports; the table, the JSON and the plots are
written; a diverged method fails the command (exit status 3) after the table is written."""

import json

from jaxgossip.cli import demo_runs, main
from jaxgossip.run import checkpoint

TINY_DEMO = [
    "--quick",
    "--dataset=synthetic",
    "--num_nodes=4",
    "--model_options.hidden=4",
    "--batch_size=4",
    "--num_rounds=4",
    "--eval_every=2",
    "--eval_size=32",
    "--eval_chunk=32",
    "--no-progress",
]


def test_the_default_methods_run_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", *TINY_DEMO, f"--out={out}"]) == 0
    printed = capsys.readouterr().out
    defaults = demo_runs(quick=True)
    assert len(defaults) >= 6
    payload = json.loads((out / "comparison.json").read_text())
    rows = payload["rows"]
    assert [r["name"].split(" (")[0] for r in rows] == [r["name"] for r in defaults]
    for row, spec in zip(rows, defaults, strict=True):
        assert row["status"] == "ok", row
        assert 0.0 <= row["test_acc"] <= 1.0 and row["MB_per_node"] > 0
        assert row["round"] == 4 or row.get("phase") == "merged"
        saved = checkpoint.latest(str(out / row["dir"] / "checkpoint"))
        assert saved is not None and saved.round == 4, f"{spec['name']} left no final checkpoint"
        assert spec["name"] in printed
    for name in ("comparison.md", "accuracy_vs_rounds.png", "accuracy_vs_bits.png", "consensus.png"):
        assert (out / name).stat().st_size > 0, name
