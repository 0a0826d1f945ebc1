"""``jaxgossip tune-gamma`` (jaxgossip.cli.tune_gamma) with no contracting step size writes its table
and JSON, says so and exits 0 even when every error overflowed (no log-scale plot then). The
guard rails it belongs to, and tune_gamma itself: test_guard_rails.py."""

import json

from jaxgossip.cli import main


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
