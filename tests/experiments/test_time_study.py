"""experiments/time_study.py: its time-to-target and budget readings (NumPy, no training), and its
quick mode on a synchronous and an asynchronous method under the stragglers' clocks. The quick
mode's 20 rounds say nothing about accuracy; what is asserted is the clock."""

import json

import numpy as np
import pytest
from _reference import load_script


@pytest.fixture(scope="module")
def study():
    return load_script("experiments/time_study.py")


def test_time_to_target_and_accuracy_at_a_budget(study):
    acc = np.array([[0.1, 0.5, 0.9, 0.95], [0.1, 0.2, 0.3, 0.4]])
    times = np.array([[1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 8.0]])
    got = study.time_to(acc, times, 0.9)
    assert got[0] == 3.0 and np.isnan(got[1])
    np.testing.assert_array_equal(study.acc_at(acc, times, 4.0), [0.95, 0.2])
    got = study.acc_at(acc, times, 0.5)
    assert np.isnan(got).all()  # no evaluation before the budget


def test_asynchronous_runs_share_the_synchronous_sweeps_partition(study, monkeypatch):
    seen = []

    class Fake:
        def __init__(self, config):
            seen.append(config)
            self.metrics = type("M", (), {k: np.zeros(3) for k in (*study.FIELDS, "bits")})()

    monkeypatch.setattr(study, "run_training", lambda config, **_: Fake(config))
    base = study.base_config("digits", 20, 10, "dirichlet:0.1")
    out = study.train_runs([base, base.replace(name="other")], (0, 1, 2), dataset=None)
    assert out["test_acc"].shape == (2, 3, 3)
    assert [c.seed for c in seen] == [0, 1, 2] * 2
    assert {c.resolved_data_seed for c in seen} == {base.resolved_data_seed}  # one partition, as the sweep's


@pytest.mark.slow  # a few training runs; the fast tests above check the script's logic
def test_quick_mode_clocks(study, tmp_path):
    study.main(["--quick", "--parts", "A", "--methods", "dpsgd,ad_psgd", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "stragglers.json").read_text())
    s = report["settings"]
    assert s["mode"] == "quick" and list(report["results"]["A"]) == ["dpsgd", "ad_psgd"]
    rows = {(r["case"], r["method"]): r for r in report["summary"]["A"]}
    c = s["compute_s"]
    rounds = s["rounds"]["A"]
    # Synchronous: a round waits for the slowest node, so its time is its compute (C, 10 C, 3 C)
    # plus the same communication; the iterates do not depend on the clock.
    per_round = {case: np.mean(rows[(case, "dpsgd")]["s_per_round"]) for case in s["clocks"]}
    comm = per_round["homogeneous"] - c
    assert comm > 0
    assert per_round["one 10x slower"] == pytest.approx(10 * c + comm, rel=1e-3)
    assert per_round["quarter 3x slower"] == pytest.approx(3 * c + comm, rel=1e-3)
    finals = {rows[(case, "dpsgd")]["final_acc"][0] for case in s["clocks"]}
    assert len(finals) == 1
    # Asynchronous: N events per round, the fast nodes do not wait for the straggler.
    for case in ("one 10x slower", "quarter 3x slower"):
        a, sync = rows[(case, "ad_psgd")], rows[(case, "dpsgd")]
        assert a["sim_time_end"][0] < sync["sim_time_end"][0] / 2
        assert a["sim_time_end"][0] >= rounds * c  # N events need at least N / N steps of C per node
    r = report["results"]["A"]["ad_psgd"]
    for g in range(len(s["clocks"])):
        assert np.all(np.diff(np.asarray(r["sim_time"][g][0])) > 0)
    assert "| one 10x slower | AD-PSGD (async, ring) |" in (tmp_path / "stragglers.md").read_text()
    assert (tmp_path / "stragglers.png").stat().st_size > 0


def test_unknown_method_is_refused(study, capsys):
    with pytest.raises(SystemExit) as err:
        study.main(["--quick", "--methods", "dpsgd,ad_psdg"])
    assert err.value.code == 2
    assert "ad_psdg" in capsys.readouterr().err
