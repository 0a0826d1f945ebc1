"""experiments/design_study.py: the tables re-rendered from a tiny saved JSON (--table), and the
quick path end to end (slow). Nothing is asserted about the designs beyond the structure and a few
facts the library certifies (the chain's SLEM is at most Metropolis's and best constant's)."""

import json

import pytest
from _reference import assert_finite, load_script


@pytest.fixture(scope="module")
def study():
    return load_script("experiments/design_study.py")


def _spectral_row(weights, slem, **extra):
    return {
        "family": "ring",
        "graph": "ring(8)",
        "N": 8,
        "M": 8,
        "weights": weights,
        "slem": slem,
        "spectral_gap": 1 - slem,
        "rounds_1e-6": "never" if slem >= 1 else 50,
        "effective_neighbors": None if weights == "fdla" else 6.5,
        **extra,
    }


TINY = {
    "spectral": {
        "settings": {"tol": 1e-8, "fdla_max_nodes": 256, "gamma": 0.99},
        "rows": [
            _spectral_row("designed", 0.8, cpu_s=0.01, newton_steps=30, gap_bound=None),
            _spectral_row("metropolis", 0.9),
            _spectral_row("max-degree", 1.0),
            _spectral_row("best constant", 0.8),
            _spectral_row("fdla", 0.75, cpu_s=0.02, newton_steps=31, gap_bound=1e-9),
        ],
        "skipped": [{"family": "complete", "N": 256, "why": "above N = 64"}],
    },
    "training": {
        "settings": {
            "8": {
                "early_round": 4,
                "seconds": 3.2,
                "compiles": 1,
                "partition": "dirichlet:0.1",
                "data_seed": 0,
                "batch_size": 16,
                "lr": 0.05,
                "momentum": 0.9,
                "rounds": 10,
                "seeds": [0, 1],
            }
        },
        "rows": [
            {
                "N": 8,
                "graph": "ring",
                "max_in_degree": 2,
                "rate": 0.9,
                "effective_neighbors": 5.0,
                "heterogeneity": 0.1,
                "test_acc_seeds": [0.5, 0.7],
                "node_acc_mean_seeds": [0.4, 0.6],
                "node_acc_min_seeds": [0.3, 0.3],
                "node_acc_mean_early_seeds": [0.2, 0.2],
            }
        ],
    },
}


def test_table_renders_from_saved_json(study, tmp_path, capsys):
    (tmp_path / "design.json").write_text(json.dumps(TINY))
    study.main(["--table", "--out", str(tmp_path)])
    md = (tmp_path / "design.md").read_text()
    assert md.strip() in capsys.readouterr().out
    # SLEMs chain / FDLA / Metropolis / max-degree / best constant, gap ratio (0.2 / 0.1), n_W, rounds
    assert "| ring(8) | 8 | 0.800000 | 0.750000 | 0.900000 | 1.000000 | 0.800000 | 2.000 | 6.50 | 6.50 |" in md
    assert "| 50 | 50 | 50 | 0.01 |" in md
    assert "N = 256: complete" in md
    row = "| ring | 2 | 0.9000 | 5.00 | 0.1000 | 0.600 +- 0.141 | 0.500 +- 0.141 | 0.300 +- 0.000 | 0.200 +- 0.000 |"
    assert row in md and "acc (nodes) at round 4" in md


@pytest.mark.slow
def test_quick_run_writes_both_parts(study, tmp_path):
    study.main(["--quick", "--families", "ring,torus,erdos_renyi", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "design.json").read_text())
    rows = report["spectral"]["rows"]
    assert {r["family"] for r in rows} == {"ring", "torus", "erdos_renyi"} and {r["N"] for r in rows} == {16}
    for family in ("ring", "torus", "erdos_renyi"):
        by = {r["weights"]: r for r in rows if r["family"] == family}
        assert set(by) == {"designed", "fdla", "metropolis", "max-degree", "best constant"}
        for r in by.values():
            assert_finite(r["slem"], (family, r["weights"]))
        assert by["designed"]["slem"] <= min(by["metropolis"]["slem"], by["best constant"]["slem"]) + 1e-7
        assert by["fdla"]["slem"] <= by["designed"]["slem"] + 1e-7
    training = report["training"]
    assert list(training["settings"]) == ["16"]
    assert training["settings"]["16"]["rounds"] == 20 and training["settings"]["16"]["seeds"] == [0]
    labels = [r["graph"] for r in training["rows"]]
    assert "learned (d=2)" in labels and "ring" in labels and "random 4-regular, fastest mixing" in labels
    for r in training["rows"]:
        assert r["max_in_degree"] <= max(r["degree"], 2)
        for x in r["test_acc_seeds"]:
            assert 0.0 <= x <= 1.0
    assert "## Part 2" in (tmp_path / "design.md").read_text()
