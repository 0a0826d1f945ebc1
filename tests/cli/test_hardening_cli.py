"""Command-line refusals and edge cases: a topology spec that no size can build is refused (exit 2)
instead of skipped; tune-gamma with no contracting step size writes its table and JSON, says so and
exits 0 even when every error overflowed (no log-scale plot then)."""

import json

from jaxgossip.cli import main


def test_topology_sweep_refuses_a_spec_no_size_can_build(tmp_path, capsys):
    out = tmp_path / "ts"
    assert main(["topology-sweep", "--topologies=ring,erdos_renyi:1.7", "--sizes=8", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "jaxgossip topology-sweep: error: --topologies: erdos_renyi spec 'erdos_renyi:1.7': "
        "P must be a probability in (0, 1], got '1.7'"
    )
    assert not out.exists()


def test_tune_gamma_with_no_contracting_gamma_writes_its_results_and_exits_0(tmp_path, capsys):
    out = tmp_path / "tg"
    argv = ["tune-gamma", "--algorithm=choco", "--algorithm_options.compressor=top_k"]
    argv += ["--algorithm_options.compressor_options.fraction=0.01", "--shape=1000", "--gammas=50,100"]
    assert main([*argv, "--num_steps=200", "--out", str(out)]) == 0
    printed, err = capsys.readouterr()
    assert "no gamma contracts" in err and "tune_gamma.png not drawn" in err
    saved = json.loads((out / "tune_gamma.json").read_text())
    assert saved["largest_contracting"] is None and saved["recommended"] is None
    assert [r["contracts"] for r in saved["rows"]] == [False, False]
    assert (out / "tune_gamma.md").exists() and not (out / "tune_gamma.png").exists()
    assert f"wrote {out}/tune_gamma.json and tune_gamma.md" in printed


def test_sweep_refuses_an_algorithm_option_train_refuses(tmp_path, capsys):
    out = tmp_path / "sw"
    flags = ["--dataset=synthetic", "--num_nodes=4", "--model=mlp", "--algorithm=choco"]
    flags += ["--algorithm_options.compressor=top_k", "--algorithm_options.compressor_options.fraction=0.1"]
    assert main(["train", *flags, "--algorithm_options.gamma=-1", "--out", str(out)]) == 2
    train_err = capsys.readouterr().err
    assert main(["sweep", *flags, "--sweep.algorithm_options.gamma=0.5,-1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxgossip sweep: error: --sweep.algorithm_options.gamma=-1: ") and err.count("\n") == 1
    assert "gamma=-1.0 must be > 0" in err and "gamma=-1 must be > 0" in train_err  # the same rule as train
    assert not out.exists()
