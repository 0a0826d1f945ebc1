"""experiments/wan_training_study.py: local steps to rounds per method, the post-hoc price of a run
against the closed form of the time model, the table's target logic (no training), and a slow
smoke run of its quick mode. No accuracy is asserted beyond finiteness: 40 steps say nothing about
the methods."""

import json
import math

import numpy as np
import pytest
from _reference import load_script


@pytest.fixture(scope="module")
def study():
    return load_script("experiments/wan_training_study.py")


def test_every_method_does_the_same_local_steps(study):
    for workload in study.WORKLOADS.values():
        for key, method in study.METHODS.items():
            config = study.method_config(workload, 8, key, 1e-4)
            h = method.local_steps
            assert config.local_steps == h and config.num_rounds * h == workload.steps, key
            assert config.eval_every * h == workload.eval_steps, key
            assert config.topology == method.topology and config.algorithm == method.algorithm, key
            tier = study.TIERS[study.CLOCK_TIER]
            assert config.time == {"compute": 1e-4, "latency": tier.latency, "bandwidth": tier.bandwidth}
    lm = study.WORKLOADS["lm"]
    assert study.method_config(lm, 8, "demo_complete", 0.0).algorithm_options["lr"] == study.DEMO_LR["lm"]
    assert study.method_config(lm, 8, "allreduce_lr1e-2", 0.0).lr == 1e-2  # the control: only the lr differs
    assert study.method_config(lm, 8, "allreduce", 0.0).lr == lm.config["lr"] and "allreduce_lr1e-2" not in study.ALL
    streaming = study.method_config(lm, 8, "streaming_diloco", 0.0)
    assert (streaming.outer_fragments, streaming.outer_overlap, streaming.outer_message_bits) == (2, 1, 4)
    with pytest.raises(ValueError, match="multiple of local_steps=10"):
        study.method_config(lm._replace(eval_steps=25), 8, "diloco_allreduce", 0.0)


def test_price_is_the_closed_form_of_the_time_model(study):
    """Ring all-reduce: 2 (N - 1) (l + B / (N b)) per round; ring gossip (serial uplink): two
    messages of B / 2 each, 2 (l + B / (2 b)); plus H steps of compute."""
    from jaxgossip.topology import ring

    n, h, p, rounds, per_round = 8, 10, 1e-3, np.array([3, 6]), 4e6  # bits a node sends per round
    cum = per_round * rounds[:, None] * np.ones((1, n))
    lm = study.WORKLOADS["lm"]
    for key, comm in (
        ("diloco_allreduce", lambda t: 2 * (n - 1) * (t.latency + per_round / (n * t.bandwidth))),
        ("diloco_gossip_exp", None),
    ):
        if comm is None:  # gossip on the ring instead (same H)
            config = study.method_config(lm, n, key, p).replace(topology="ring")
            topo = ring(n)

            def comm(t):
                return 2 * (t.latency + per_round / 2 / t.bandwidth)
        else:
            config, topo = study.method_config(lm, n, key, p), None
        priced = study.price(cum, rounds, config, topo, p)
        for tier in study.TIERS:
            expected = rounds * (h * p + comm(tier))
            np.testing.assert_allclose(priced[tier.label], expected, rtol=1e-9)


def _report(study):
    def run(ppls, seed):
        rows = [
            {"local_step": 100 * (i + 1), "perplexity": v, "MB_per_node": i + 1.0, "sim_time": {"a": 10.0 * (i + 1)}}
            for i, v in enumerate(ppls)
        ]
        return {"seed": seed, "rows": rows}

    return {
        "workload": "lm",
        "num_nodes": 8,
        "seeds": [0, 1],
        "steps": 200,
        "methods": {
            "allreduce": {"runs": [run([10.0, 8.0], 0), run([12.0, 7.0], 1)]},
            "slow": {"runs": [run([20.0, 11.5], 0), run([20.0, 10.0], 1)]},
        },
    }


def test_target_and_time_to_target(study):
    group = _report(study)
    assert study.target_value(group, "lm") == pytest.approx(11.0)  # mean of all-reduce at step 100
    slow = group["methods"]["slow"]["runs"]
    assert [study.time_to(r, "perplexity", 11.0, True, "a") for r in slow] == [None, 20.0]
    assert study._seconds([None, 20.0]) == "not reached (1/2)"
    assert study._seconds([10.0, 20.0]).startswith("15 ± 7.1")


@pytest.mark.slow  # a few compiles and training runs; the tests above check the script's logic
def test_quick_mode_writes_priced_rows(study, tmp_path):
    study.main(["--quick", "--methods", "allreduce,streaming_diloco", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "wan_training.json").read_text())
    assert report["settings"]["mode"] == "quick"
    (group,) = report["groups"]
    labels = [t.label for t in study.TIERS]
    for key, m in group["methods"].items():
        for run in m["runs"]:
            for row in run["rows"]:
                assert math.isfinite(row["test_acc"]) and row["MB_per_node"] > 0, key
                times = [row["sim_time"][label] for label in labels]
                assert times[0] > times[1] > times[2] > 0, (key, times)  # slower links, more time
    (run,) = group["methods"]["allreduce"]["runs"]
    assert run["clock_check"] < 1e-5  # the run's own clock is the post-hoc price
    assert group["methods"]["streaming_diloco"]["runs"][0]["clock_check"] is None
    assert (tmp_path / "digits_n4_bits.png").stat().st_size > 0
    assert (tmp_path / "digits_n4_time.png").stat().st_size > 0
    assert "| all-reduce | 40 |" in (tmp_path / "wan_training.md").read_text()


def test_extend_runs_only_the_methods_a_group_lacks_and_refuses_other_settings(study, monkeypatch):
    trained = []

    def fake_run_method(workload, num_nodes, seeds, key):
        trained.append((workload.name, num_nodes, key))
        row = {"test_acc": 0.5, "node_acc_mean": 0.5, "MB_per_node": 1.0}
        return {"label": key, "runs": [{"rows": [row]} for _ in seeds], "seconds": 1.0}

    monkeypatch.setattr(study, "run_method", fake_run_method)
    monkeypatch.setattr(study, "write", lambda report, out: None)
    monkeypatch.setattr(study, "plot", lambda group, out: [])
    quiet = dict(out="unused", log=lambda *a: None)
    first = study.run((("digits", 4, (0, 1), ("allreduce", "gossip_ring")),), **quiet)
    first = json.loads(json.dumps(study.jsonable(first, digits=None)))  # as read back from the file
    trained.clear()
    plan = (("digits", 4, (0, 1), ("allreduce", "choco_ring")), ("digits", 8, (0,), ("allreduce",)))
    both = study.run(plan, extend=first, **quiet)
    assert trained == [("digits", 4, "choco_ring"), ("digits", 8, "allreduce")]
    assert [list(g["methods"]) for g in both["groups"]] == [["allreduce", "gossip_ring", "choco_ring"], ["allreduce"]]
    assert len(both["settings"]["plan"]) == 3
    first["settings"]["device_flops"] *= 2
    with pytest.raises(ValueError, match="other settings.*device_flops"):
        study.run(plan, extend=first, **quiet)
