"""experiments/heterogeneity_study.py in its quick mode: the outputs (JSON, Markdown table, plots)
have the promised structure with finite numbers. No accuracy is asserted beyond sanity: 20 rounds
say nothing about the methods."""

import json

import pytest
from _reference import assert_finite, load_script


@pytest.fixture(scope="module")
def study():
    return load_script("experiments/heterogeneity_study.py")


def _check(report_path, methods, partitions, seeds):
    report = json.loads(report_path.read_text())
    settings = report["settings"]
    assert settings["mode"] == "quick" and settings["partitions"] == partitions
    assert list(report["results"]) == partitions
    for partition in partitions:
        assert list(report["results"][partition]) == methods
        for key, r in report["results"][partition].items():
            evals = settings["rounds"] // settings["eval_every"]
            assert r["rounds"] == [settings["eval_every"] * (i + 1) for i in range(evals)]
            for field, values in r["final"].items():
                assert len(values) == len(r["lrs"]) and all(len(v) == len(seeds) for v in values), (key, field)
                for v in values:
                    for x in v:
                        if field == "rounds_to_level" and x is None:
                            continue  # 0.95 not reached in the quick run's 20 rounds
                        assert_finite(x, (partition, key, field))
            for name, curves in r["curves"].items():
                assert len(curves) == len(r["lrs"]), (key, name)
                assert all(len(c) == len(seeds) and all(len(s) == evals for s in c) for c in curves)
    summary = report["summary"]
    assert len(summary) == sum(len(r["lrs"]) for p in partitions for r in report["results"][p].values())
    for row in summary:
        assert row["test_acc"]["diverged"] == 0 and 0.1 < row["test_acc"]["mean"] <= 1.0, row
        assert_finite(row["consensus"]["mean"], row["method"])
        assert row["mb_per_node"]["mean"] > 0
    return report


def test_quick_mode_writes_finite_results(study, tmp_path):
    """One method, one compile (the slow test below covers the reference gap, both partitions and
    qgm's one-compile-per-lr path)."""
    study.main(["--quick", "--methods", "gossip", "--partitions", "dirichlet:0.1", "--out", str(tmp_path)])
    _check(tmp_path / "heterogeneity.json", ["gossip"], ["dirichlet:0.1"], study.QUICK["seeds"])
    assert (tmp_path / "accuracy_dirichlet0.1.png").stat().st_size > 0
    md = (tmp_path / "heterogeneity.md").read_text()
    assert "| gossip (D-SGD) | 0.2 |" in md


@pytest.mark.slow
def test_quick_mode_reference_gap_and_both_partitions(study, tmp_path):
    methods = ["allreduce", "gradient_tracking", "allreduce_m", "qgm"]
    study.main(["--quick", "--methods", ",".join(methods), "--out", str(tmp_path)])
    report = _check(tmp_path / "heterogeneity.json", methods, list(study.PARTITIONS), study.QUICK["seeds"])
    for row in report["summary"]:
        # every method has its group's all-reduce here; all-reduce's own gap is 0
        assert row["gap_to_allreduce"] is not None
        if row["method"].startswith("allreduce"):
            assert row["gap_to_allreduce"] == 0 and row["consensus"]["mean"] < 1e-6
    for partition in study.PARTITIONS:
        assert (tmp_path / f"accuracy_{partition.replace(':', '')}.png").stat().st_size > 0
