"""``jaxgossip sweep`` refusals (jaxgossip.cli.sweep): a misspelled sweep axis is called unknown with a
suggestion, an axis that cannot share one compile gets its real reason, and an algorithm option is
checked by the same rule as in ``train``; nothing is written. In-process through ``main``."""

import pytest
from _reference import one_line_error
from tiny import CHOCO_TOP_K

from jaxgossip.cli import main


@pytest.mark.parametrize(
    ("axis", "suggestion"),
    [
        ("lrr", "lr"),
        ("algorithm_options.gama", "algorithm_options.gamma"),
        ("algorithm_options.compressor_options.fractoin", "algorithm_options.compressor_options.fraction"),
        ("time.latencyy", "time.latency"),
    ],
)
def test_a_misspelled_sweep_axis_is_unknown(tmp_path, capsys, axis, suggestion):
    out = tmp_path / "sw"
    assert main(["sweep", f"--sweep.{axis}=0.1,0.2", "--out", str(out)]) == 2
    err = one_line_error(capsys)
    assert err.startswith(
        f"jaxgossip sweep: error: --sweep.{axis}: unknown sweep axis {axis!r} (did you mean {suggestion!r}?); "
        "axes that share one compile: lr, weight_decay,"
    )
    assert "shapes" not in err
    assert not out.exists()


def test_a_shape_changing_sweep_axis_gets_its_reason_not_a_suggestion(tmp_path, capsys):
    out = tmp_path / "sw"
    axis = "algorithm_options.compressor_options.fraction"
    assert main(["sweep", *CHOCO_TOP_K, f"--sweep.{axis}=0.1,0.2", "--out", str(out)]) == 2
    err = one_line_error(capsys)
    assert err.startswith(
        f"jaxgossip sweep: error: --sweep.{axis}: sweep axis {axis!r} would change array shapes or program "
        "structure (compressor options fix the kept entries, a static shape); sweep it with separate runs."
    )
    assert "did you mean" not in err
    assert main(["sweep", "--sweep.batch_size=8,16", "--out", str(out)]) == 2
    assert "(B fixes the batch shape)" in one_line_error(capsys)
    assert not out.exists()


def test_a_plugin_algorithms_option_is_not_called_unknown(tmp_path, capsys):
    out = tmp_path / "sw"
    argv = ["sweep", "--algorithm=my_plugin_module:make", "--sweep.algorithm_options.rate=0.1,0.2"]
    assert main([*argv, "--out", str(out)]) == 2
    err = one_line_error(capsys)
    assert "sweep axis 'algorithm_options.rate' would change array shapes" in err and "unknown" not in err
    assert not out.exists()


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


def test_an_algorithms_own_traced_option_sweeps_for_it_and_is_refused_for_others(tmp_path, capsys):
    """``algorithm_options.fraction`` is a one-compile axis of SPARTA (its metadata), checked by
    train's rule; for Sparse-Push it fixes K and is refused with that reason."""
    from tiny import TINY_FLAGS

    out = tmp_path / "sw"
    sparta = [*TINY_FLAGS, "--algorithm=sparta", "--no-progress"]
    assert main(["sweep", *sparta, "--sweep.algorithm_options.fraction=0.5,1.5", "--out", str(out)]) == 2
    err = one_line_error(capsys)
    assert err.startswith("jaxgossip sweep: error: --sweep.algorithm_options.fraction=1.5: ") and "fraction" in err
    push = ["--algorithm=sparse_push", "--topology=one_peer_exponential"]
    assert main(["sweep", *push, "--sweep.algorithm_options.fraction=0.1,0.2", "--out", str(out)]) == 2
    assert "sweep axis 'algorithm_options.fraction' would change array shapes" in one_line_error(capsys)
    assert not out.exists()
    assert main(["sweep", *sparta, "--sweep.algorithm_options.fraction=0.25,1", "--out", str(out)]) == 0
    assert "2 grid points" in capsys.readouterr().out and (out / "sweep.json").exists()
