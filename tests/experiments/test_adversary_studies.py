"""The quick modes of experiments/byzantine_study.py, relaysgd_study.py and
topology_families_study.py on the smallest subsets: the outputs (JSON, Markdown tables, plot) have
the promised structure with finite numbers. Nothing is asserted about the methods beyond sanity:
a 10-round run says nothing about them. Each compiles a few trainers, hence slow."""

import json
import math

import pytest
from _reference import assert_finite, load_script

pytestmark = pytest.mark.slow


def test_byzantine_quick(tmp_path):
    study = load_script("experiments/byzantine_study.py")
    argv = ["--quick", "--graphs", "dumbbell", "--attacks", "none,gaussian", "--aggregators", "gossip,clipped_gossip"]
    study.main([*argv, "--out", str(tmp_path)])
    report = json.loads((tmp_path / "byzantine.json").read_text())
    assert report["settings"]["graphs"] == {"dumbbell": list(study.GRAPHS["dumbbell"])}
    cells = report["results"]["dumbbell"]
    assert list(cells) == ["none", "gaussian"] and all(list(c) == ["gossip", "clipped_gossip"] for c in cells.values())
    for attack, by_agg in cells.items():
        for agg, r in by_agg.items():
            for field in ("test_acc", "node_acc_mean", "node_acc_min"):
                for x in r["final"][field]:
                    assert_finite(x, (attack, agg, field))
                    assert 0.0 <= x <= 1.0
    # sigma-100 noise through plain gossip wrecks the honest models' agreement; the clipped one keeps it
    gaussian = cells["gaussian"]
    assert gaussian["gossip"]["final"]["consensus"][0] > 100 * gaussian["clipped_gossip"]["final"]["consensus"][0]
    md = (tmp_path / "byzantine.md").read_text()
    assert "| attack | gossip | clipped_gossip |" in md and "| gaussian |" in md
    assert (tmp_path / "byzantine.png").stat().st_size > 0


def test_relaysgd_quick(tmp_path):
    study = load_script("experiments/relaysgd_study.py")
    study.main(["--quick", "--graphs", "chain", "--methods", "gossip,relaysgd", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "relaysgd.json").read_text())
    results = report["results"]["chain"]
    assert list(results) == ["gossip", "relaysgd"]
    for method, r in results.items():
        assert r["lrs"] == list(study.QUICK["lrs"]) and r["best"] == 0
        for field, values in r["final"].items():
            assert len(values) == 1 and len(values[0]) == len(study.QUICK["seeds"]), (method, field)
            for x in values[0]:
                assert_finite(x, (method, field))
    md = (tmp_path / "relaysgd.md").read_text()
    assert "**chain(16), dirichlet:0.1, best lr per method**" in md and "| relaysgd | 0.2 |" in md
    assert (tmp_path / "relaysgd.png").stat().st_size > 0


def test_topology_families_quick(tmp_path):
    study = load_script("experiments/topology_families_study.py")
    families = ["ring", "random_matching", "base:1"]
    study.main(["--quick", "--families", ",".join(families), "--out", str(tmp_path)])
    report = json.loads((tmp_path / "topology_families.json").read_text())
    rows = {r["family"]: r for r in report["rows"]}
    assert sorted(rows) == sorted(families) and all(r["N"] == 16 for r in rows.values())
    # Base-2 on 16 nodes averages exactly in one period of 4 rounds; the ring's gap is 1 - (1 + 2 cos(2 pi / 16)) / 3
    assert rows["base:1"]["period"] == 4 and rows["base:1"]["rounds_to_tol"] == 4
    assert rows["base:1"]["spectral_gap"] == pytest.approx(1.0)
    assert rows["ring"]["spectral_gap"] == pytest.approx(1 - (1 + 2 * math.cos(2 * math.pi / 16)) / 3, rel=1e-6)
    assert rows["random_matching"]["stochastic"] and rows["random_matching"]["effective_neighbors"] is None
    for r in rows.values():
        for field in ("test_acc", "node_acc_mean", "node_acc_min"):
            assert_finite(r[field], (r["family"], field))
    md = (tmp_path / "topology_families.md").read_text()
    assert "**N = 16**" in md and "| base_graph(16, k=1) | 4 | 1 |" in md
    assert (tmp_path / "topology_families.png").stat().st_size > 0
