"""experiments/bench/wan_rounds.py in its quick mode: every method is built, compiled and timed, and
the rows carry the ratios to gossip (the DiLoCo rows: of the training chunk only). The times themselves are not asserted (a smoke test)."""

import math

import pytest
from _reference import load_script


@pytest.mark.slow
def test_quick_mode_times_every_method_against_gossip(tmp_path):
    bench = load_script("experiments/bench/wan_rounds.py")
    result = bench.main(["--quick", "--json", str(tmp_path / "wan.json")])
    assert set(result["rows"]) == set(bench.METHODS)
    assert result["rows"]["gossip"]["comm_over_gossip"] == 1.0
    for method, row in result["rows"].items():
        fields = ("train", "train_over_gossip")
        if not bench.METHODS[method][2]:  # the DiLoCo rows time their outer rounds only
            fields += ("comm", "comm_over_gossip")
        for field in fields:
            assert math.isfinite(row[field]) and row[field] > 0, (row, field)
    assert result["num_params"] > 0 and (tmp_path / "wan.json").exists()
