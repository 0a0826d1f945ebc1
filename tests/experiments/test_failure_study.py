"""experiments/failure_study.py in its quick mode: the failure sweep of one method trains every p in
one compile group and writes its table, JSON and plots; the full quick run (both studies, every
method) is a slow test. No accuracy is asserted beyond being a finite fraction."""

import json

import pytest
from _reference import load_script


@pytest.fixture(scope="module")
def study():
    return load_script("experiments/failure_study.py")  # it imports experiments/_common.py


def _check_a(result, methods):
    assert list(result) == methods
    for r in result.values():
        assert r["groups"] == [[0, 1, 2, 3]]  # every p in one compiled program
        for curve in r["curves"]:
            assert 0 <= curve["test_acc"][-1] <= 1 and curve["finite"]


@pytest.mark.slow  # one training compile: ~8 s alone, more on a shared box
def test_quick_failure_sweep_of_one_method(study, tmp_path):
    result = study.main(["--quick", "--study", "a", "--methods", "gossip", "--out", str(tmp_path)])
    _check_a(result["a"], ["gossip"])
    mb = [c["MB_per_node"][-1] for c in result["a"]["gossip"]["curves"]]
    assert mb[0] > mb[1] > mb[2] > mb[3]  # failed links send nothing
    saved = json.loads((tmp_path / "failure_study.json").read_text())
    assert saved["meta"]["link_drop"] == [0.0, 0.1, 0.3, 0.5] and "load_avg_before" in saved["meta"]["machine"]
    assert "| gossip (ring(16)) |" in (tmp_path / "failure_study.md").read_text()
    assert (tmp_path / "failure_vs_p.png").stat().st_size > 0 and (tmp_path / "failure_vs_bits.png").exists()


@pytest.mark.slow
def test_quick_mode_of_both_studies(study, tmp_path):
    result = study.main(["--quick", "--out", str(tmp_path)])
    _check_a(result["a"], list(study.METHODS))
    assert set(result["b"]) == set(study.RANDOM)
    assert (tmp_path / "random_graphs.png").exists()
    assert "## (b) random vs static graphs" in (tmp_path / "failure_study.md").read_text()
