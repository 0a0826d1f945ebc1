"""experiments/bench/design_vs_sdp.py in its smoke mode: the barrier method's SLEMs on tiny random
graphs (and, with cvxpy installed, the SDP solver's, which must agree)."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_smoke_run_writes_agreeing_slems(tmp_path):
    with_sdp = importlib.util.find_spec("cvxpy") is not None
    argv = [sys.executable, "experiments/bench/design_vs_sdp.py", "--smoke", "--out", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [*argv, *([] if with_sdp else ["--no-sdp"])], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-4000:]
    rows = json.loads((tmp_path / "design_vs_sdp.json").read_text())["rows"]
    assert [r["objective"] for r in rows] == ["slem", "fdla", "slem", "fdla"]
    for r in rows:
        assert r["slem"] <= r["metropolis_slem"] and r["gap_bound"] <= 1e-8
        if with_sdp:
            assert abs(r["relative_difference"]) < 1e-5
