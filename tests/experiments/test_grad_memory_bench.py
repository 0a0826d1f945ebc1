"""experiments/bench/grad_memory.py at tiny sizes: every mode runs and reports forward and gradient
memory; the chunked gradient needs fewer temporaries than the plain one (timings not checked)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow  # 12 compiles in a subprocess: ~45 s on the 2-core box
def test_smoke_run_reports_every_mode(tmp_path):
    out = tmp_path / "grad_memory.json"
    argv = [sys.executable, "experiments/bench/grad_memory.py", "--rounds", "16", "64"]
    argv += ["--nodes", "4", "--dim", "64", "--reps", "1", "--json", str(out)]
    run = subprocess.run(argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-4000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["rounds"], r["mode"]) for r in rows] == [(s, m) for s in (16, 64) for m in ("plain", "remat", "chunked")]
    by = {(r["rounds"], r["mode"]): r for r in rows}
    assert by[(64, "chunked")]["chunk"] == 8
    assert by[(64, "chunked")]["gradient_temp_bytes"] < by[(64, "plain")]["gradient_temp_bytes"]
    assert all(r["forward_seconds"] > 0 and r["gradient_seconds"] > 0 for r in rows)
