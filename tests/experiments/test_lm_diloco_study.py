"""experiments/lm_diloco_study.py: the conversion of local steps to rounds per method (no training),
and its quick mode on DiLoCo with all-reduce outer steps and on its gossip control (tiny
transformer, 100 local steps). No perplexity is asserted beyond being finite and below that of a
uniform guess over the 256 byte tokens: 100 steps say nothing about the methods."""

import json
import math

import pytest
from _reference import load_script


@pytest.fixture(scope="module")
def study():
    return load_script("experiments/lm_diloco_study.py")


def test_every_method_does_the_same_local_steps(study):
    base = study.base_config(study.FULL)
    for key, method in study.METHODS.items():
        config = study.method_config(base, key, study.FULL)
        h = method.local_steps
        assert config.local_steps == h and config.num_rounds * h == study.FULL.steps, key
        assert config.eval_every * h == study.FULL.eval_steps and config.warmup_rounds * h == study.FULL.warmup_steps
        assert (config.outer_optimizer == "nesterov") == key.startswith("diloco"), key
    with pytest.raises(ValueError, match="multiple of local_steps=50"):
        study.method_config(base, "diloco_gossip_h50", study.FULL._replace(eval_steps=20))


@pytest.mark.slow  # a few training runs; the fast tests above check the script's logic
def test_quick_mode_writes_finite_results(study, tmp_path):
    study.main(["--quick", "--methods", "diloco_allreduce_h50,localsgd_gossip_h50", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "lm_diloco.json").read_text())
    assert report["settings"]["mode"] == "quick"
    results = report["results"]
    for key, r in results.items():
        assert r["local_steps"] == 50 and r["num_rounds"] == 2, key
        assert [row["local_step"] for row in r["rows"]] == [50, 100] and [row["round"] for row in r["rows"]] == [1, 2]
        for row in r["rows"]:
            assert all(math.isfinite(row[k]) for k in ("perplexity", "node_perplexity", "MB_per_node")), row
            assert 1 < row["perplexity"] < 256, row
        first, second = (row["MB_per_node"] for row in r["rows"])
        assert first > 0 and second == pytest.approx(2 * first), key  # every round sends the same
    for row in results["diloco_allreduce_h50"]["rows"]:
        assert row["consensus"] < 1e-6  # all-reduce then one outer step on the common pseudo-gradient
    assert all(row["consensus"] > 1e-6 for row in results["localsgd_gossip_h50"]["rows"])
    # bits: the ring gossip round sends a full model to each of two neighbours, the all-reduce is
    # counted as one full model per node (the PowerGossip convention), so at equal rounds twice as many
    mb = {key: r["rows"][-1]["MB_per_node"] for key, r in results.items()}
    assert mb["localsgd_gossip_h50"] == pytest.approx(2 * mb["diloco_allreduce_h50"])
    text = (tmp_path / "lm_diloco.md").read_text()
    assert "| DiLoCo H=50, all-reduce outer | 50 | 2 |" in text
    assert "| local AdamW H=50, gossip (no outer step) | 50 | 2 |" in text
    assert (tmp_path / "perplexity.png").stat().st_size > 0
