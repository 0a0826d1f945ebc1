"""experiments/studies/million_nodes.py at tiny sizes: consensus rows of separate runs are merged
(a rerun replaces its own family and size, keeps the others), and the page shows every row with
the round cap it ran under."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _study(tmp_path, *args):
    argv = [sys.executable, "experiments/studies/million_nodes.py", "--parts", "consensus", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([*argv, "--out", str(tmp_path / "page.md")], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads((tmp_path / "page.json").read_text()), (tmp_path / "page.md").read_text()


def test_consensus_rows_of_separate_runs_are_merged(tmp_path):
    _study(tmp_path, "--families", "hypercube,ring", "--log2-sizes", "4", "--max-rounds", "50")
    saved, page = _study(tmp_path, "--families", "ring", "--log2-sizes", "4,5", "--max-rounds", "20")
    rows = {(r["family"], r["log2_nodes"]): r for r in saved["consensus"]}
    assert set(rows) == {("ring", 4), ("ring", 5), ("hypercube", 4)}
    assert rows["hypercube", 4]["max_rounds"] == 50 and rows["ring", 4]["max_rounds"] == 20
    # the hypercube of 16 nodes (gap 1/3 per round) reaches 1e-6 within its cap of 50 rounds
    assert rows["hypercube", 4]["rounds"] is not None and rows["hypercube", 4]["rounds"] <= 50
    # a ring of 16 nodes does not reach 1e-6 in 20 rounds: the page names the cap it ran under
    assert rows["ring", 4]["rounds"] is None and "| ring | 4 | > 20 (error" in page
    assert page.index("| ring | 4 |") < page.index("| ring | 5 |")
    assert saved["consensus_args"]["log2_sizes"] == "4,5"
