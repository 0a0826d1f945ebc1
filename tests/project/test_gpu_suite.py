"""experiments/bench/gpu_suite.py in its smoke mode: every section runs at tiny sizes on CPU and the
report (JSON + Markdown) has the promised structure with finite, positive numbers. No speed is
asserted.

The smoke run is the script's documented command line, run from the checkout in a subprocess in
which tensorflow-datasets, jsonargparse and tensorboardX cannot be imported: a lent GPU machine's
image has JAX, flax, optax, orbax and the scientific stack but none of those three, and the suite
must measure there."""

import json
import math
import pathlib
import subprocess
import sys

import pytest
from _reference import fast_compile_env, load_script

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: Installed here, absent from a GPU machine's image.
OPTIONAL = ("tensorflow_datasets", "jsonargparse", "tensorboardX")
# ``sys.modules[name] = None`` makes ``import name`` raise ModuleNotFoundError and
# ``importlib.util.find_spec(name)`` return None, as for a package that is not installed.
WITHOUT_OPTIONAL = f"import sys\nfor name in {OPTIONAL!r}:\n    sys.modules[name] = None\n"


def _run_without_optional(code: str, args=(), timeout=300) -> subprocess.CompletedProcess:
    """``python -c code args...`` from the checkout (``PYTHONPATH=.``), the optional packages blocked."""
    env = fast_compile_env()
    env["PYTHONPATH"] = "."
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_OPTIONAL + code, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def suite():
    return load_script("experiments/bench/gpu_suite.py")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """``PYTHONPATH=. python experiments/bench/gpu_suite.py --smoke --reps 1 --out OUT`` without the
    optional packages: (completed process, output folder)."""
    out = tmp_path_factory.mktemp("gpu_suite")
    run = _run_without_optional(
        "import runpy\nsys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n",
        ["experiments/bench/gpu_suite.py", "--smoke", "--reps", "1", "--out", str(out)],
    )
    return run, out


def _positive(value, what):
    assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (what, value)


def test_smoke_runs_without_tfds_jsonargparse_tensorboardx(smoke_run):
    run, out = smoke_run
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads((out / "gpu_suite.json").read_text())
    assert report["mode"] == "smoke" and {s["status"] for s in report["sections"].values()} == {"ok"}
    _positive(report["sections"]["training"]["result"]["ms_per_round"], "training ms_per_round")
    assert "## training: ok" in run.stdout


def test_importing_the_library_loads_no_optional_package():
    # Run with the packages installed: importing must not load them (they are imported where a
    # feature needs them), and with them blocked the same imports must succeed.
    modules = (
        "jaxgossip",
        "jaxgossip.data",
        "jaxgossip.run.runner",
        "jaxgossip.run.checkpoint",
        "jaxgossip.run.config",
        "jaxgossip.run.parsing",
        "jaxgossip.run.metric_writers",
    )
    code = f"import {', '.join(modules)}\nprint(sorted({{n.split('.')[0] for n in sys.modules}} & {{*{OPTIONAL!r}, 'tensorflow'}}))"
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys\n" + code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert loaded.returncode == 0, loaded.stderr[-4000:]
    assert loaded.stdout.strip() == "[]"
    blocked = _run_without_optional(code)
    assert blocked.returncode == 0, blocked.stderr[-4000:]


def test_smoke_runs_every_section(suite, smoke_run):
    run, out = smoke_run
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads((out / "gpu_suite.json").read_text())
    md = (out / "gpu_suite.md").read_text()
    assert report["mode"] == "smoke" and report["reps"] == 1
    env = report["environment"]
    assert env["versions"]["jax"] and env["versions"]["jaxlib"] and env["device_count"] >= 1
    assert set(report["sections"]) == set(suite.SECTIONS)
    for name, section in report["sections"].items():
        assert section["status"] == "ok", (name, section.get("note"), section.get("traceback"))
        assert f"## {name}: ok" in md

    train = report["sections"]["training"]["result"]
    for key in (
        "compile_s",
        "ms_per_round",
        "rounds_per_s",
        "flops_per_round_xla",
        "flops_per_round_cost_model",
        "achieved_TFLOPs",
        "achieved_TFLOPs_cost_model",
        "peak_MB",
    ):
        _positive(train[key], key)
    # Two FLOP counts of the same forward + backward (all nodes at once vs one node x N) agree.
    assert train["flops_per_round_cost_model"] == pytest.approx(train["flops_per_round_xla"], rel=0.5)

    mix = report["sections"]["mix_bandwidth"]["result"]
    assert [r["topology"].split("(")[0] for r in mix["rows"]] == ["ring", "exponential", "one_peer_exponential"]
    for row in mix["rows"]:
        for key in ("mix_ms", "mix_GBs", "copy_ms", "copy_GBs", "ratio", "compile_s"):
            _positive(row[key], key)

    comm = report["sections"]["compressed"]["result"]
    assert [r["algorithm"] for r in comm["rows"]] == ["mix", "gossip", "choco top-1%", "power_gossip r1"]
    for row in comm["rows"]:
        for key in ("ms_per_round", "vs_mix", "compile_s"):
            _positive(row[key], key)

    cons = report["sections"]["consensus"]["result"]
    for row in cons["rows"]:
        for key in ("ms_per_round", "scan_s", "error_first", "compile_s"):
            _positive(row[key], key)
        assert math.isfinite(row["error_last"]) and row["error_last"] < row["error_first"]
    # The one-peer exponential schedule averages exactly after log2 N rounds.
    assert cons["rows"][1]["relative_error_after_log2N"] < 1e-5

    lm = report["sections"]["transformer"]["result"]
    assert [r["nodes"] for r in lm["rows"]] == list(suite.SMOKE.lm_nodes)
    for row in lm["rows"]:
        for key in ("params_per_node", "ms_per_round", "tokens_per_s", "peak_MB", "compile_s"):
            _positive(row[key], key)
    many = report["sections"]["many_nodes"]["result"]
    assert many["nodes"] == suite.SMOKE.many_nodes and many["topology"].startswith("one_peer_exponential")
    for key in ("params_per_node", "ms_per_round", "peak_MB", "compile_s"):
        _positive(many[key], key)

    million = report["sections"]["million_nodes"]["result"]
    rows = million["rows"]
    assert [(r["family"], r["log2_nodes"]) for r in rows] == [
        (f, log2) for f in suite.MILLION_FAMILIES for log2 in suite.SMOKE.million_log2
    ]
    for row in rows:
        assert "skipped" not in row, row  # the smoke sizes fit anywhere
        assert row["edges"] >= row["num_nodes"]
        for key in ("build_s", "compile_s", "ms_per_round", "copy_ms", "floor_ms", "times_floor"):
            _positive(row[key], key)
    assert "## million_nodes: ok" in md


def test_budget_guard_skips_and_still_writes_the_report(suite, tmp_path):
    report = suite.run_suite(str(tmp_path), smoke=True, budget_s=1e-3, log=lambda message: None)
    assert {s["status"] for s in report["sections"].values()} == {"skipped"}
    assert "budget" in report["sections"]["training"]["note"]
    assert json.loads((tmp_path / "gpu_suite.json").read_text())["sections"]["consensus"]["status"] == "skipped"


def test_a_failing_section_is_recorded_and_the_rest_run(suite, tmp_path, monkeypatch):
    def broken(sizes):
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(suite, "section_mix_bandwidth", broken)
    report = suite.run_suite(
        str(tmp_path), smoke=True, budget_s=600, sections=("mix_bandwidth", "consensus"), reps=1, log=lambda m: None
    )
    assert report["sections"]["mix_bandwidth"]["status"] == "error"
    assert "out of memory (simulated)" in report["sections"]["mix_bandwidth"]["note"]
    assert report["sections"]["consensus"]["status"] == "ok"
    assert "## mix_bandwidth: error" in (tmp_path / "gpu_suite.md").read_text()


def test_without_gpu_and_smoke_it_skips(suite, tmp_path, capsys):
    import jax

    if jax.default_backend() == "gpu":
        pytest.skip("a GPU is present")
    report = suite.main(["--out", str(tmp_path / "none"), "--json", str(tmp_path / "r.json")])
    assert "SKIPPED" in report["skipped"] and "SKIPPED" in capsys.readouterr().out
    assert not (tmp_path / "none").exists()
    assert "skipped" in json.loads((tmp_path / "r.json").read_text())


@pytest.mark.parametrize("argv", [["--sections", "training,typo"], ["--budget", "0"], ["--reps", "0"]])
def test_bad_options_are_refused(suite, argv):
    with pytest.raises(SystemExit) as err:
        suite.main(["--smoke", *argv])
    assert err.value.code == 2
