"""Refusal messages name the offending option and the rule: a misspelled compressor option is named
alone with a suggestion; a misspelled sweep axis is called unknown, an option that cannot share one
compile gets its real reason; inf / nan are refused as not finite; a topology spec with a bad argument
is refused before any graph is built; a random-bytes .npz is named as not an .npz archive. All
in-process through ``main`` (exit 2, no compile)."""

import numpy as np
import pytest

from jaxgossip.cli import main

CHOCO_TOP_K = ["--algorithm=choco", "--algorithm_options.compressor=top_k"]


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    return err.strip()


def test_only_the_misspelled_compressor_option_is_named(capsys):
    argv = ["train", *CHOCO_TOP_K, "--algorithm_options.compressor_options.fraction=0.1"]
    assert main([*argv, "--algorithm_options.compressor_options.fractoin=0.2", "--print-config"]) == 2
    assert _error(capsys) == (
        "jaxgossip train: error: algorithm_options.compressor_options.fractoin: compressor 'top_k' has no "
        "option 'fractoin' (did you mean 'fraction'?); it takes: fraction, k, index_bits"
    )
    assert main([*argv, "--print-config"]) == 0  # the correct key alone is accepted


def test_an_option_of_no_compressor_is_named_with_the_default_compressor(capsys):
    argv = ["train", "--algorithm=choco", "--algorithm_options.compressor_options.fraction=0.1", "--print-config"]
    assert main(argv) == 2
    assert _error(capsys) == (
        "jaxgossip train: error: algorithm_options.compressor_options.fraction: compressor 'identity' has no "
        "option 'fraction'; it takes: no options"
    )


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
    err = _error(capsys)
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
    err = _error(capsys)
    assert err.startswith(
        f"jaxgossip sweep: error: --sweep.{axis}: sweep axis {axis!r} would change array shapes or program "
        "structure (compressor options fix the kept entries, a static shape); sweep it with separate runs."
    )
    assert "did you mean" not in err
    assert main(["sweep", "--sweep.batch_size=8,16", "--out", str(out)]) == 2
    assert "(B fixes the batch shape)" in _error(capsys)
    assert not out.exists()


def test_a_plugin_algorithms_option_is_not_called_unknown(tmp_path, capsys):
    out = tmp_path / "sw"
    argv = ["sweep", "--algorithm=my_plugin_module:make", "--sweep.algorithm_options.rate=0.1,0.2"]
    assert main([*argv, "--out", str(out)]) == 2
    err = _error(capsys)
    assert "sweep axis 'algorithm_options.rate' would change array shapes" in err and "unknown" not in err
    assert not out.exists()


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "Infinity"])
@pytest.mark.parametrize("field", ["lr", "weight_decay", "momentum", "grad_clip", "final_lr"])
def test_non_finite_floats_are_refused_as_not_finite(capsys, field, value):
    assert main(["train", f"--{field}={value}", "--print-config"]) == 2
    assert _error(capsys) == (
        f"jaxgossip train: error: --{field}={value!r} is not valid: it must be finite (a number, not inf or nan)"
    )


def test_a_non_finite_float_from_a_config_file_is_refused_as_not_finite(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("lr: .inf\n")
    assert main(["train", "--config", str(path), "--print-config"]) == 2
    assert "lr=inf must be finite, a number > 0" in _error(capsys)


def test_not_a_number_still_says_expected_float(capsys):
    assert main(["train", "--lr=abc", "--print-config"]) == 2
    assert _error(capsys) == "jaxgossip train: error: --lr='abc' is not valid: expected float"


@pytest.mark.parametrize(
    ("spec", "rule"),
    [
        ("erdos_renyi:1.7", "erdos_renyi spec 'erdos_renyi:1.7': P must be a probability in (0, 1], got '1.7'"),
        ("base:0", "base spec 'base:0': K (the maximum degree) must be an int >= 1, got '0'"),
    ],
)
def test_topology_sweep_refuses_a_bad_spec_at_every_size(tmp_path, capsys, spec, rule):
    out = tmp_path / "ts"
    assert main(["topology-sweep", f"--topologies=ring,{spec}", "--sizes=8,16", "--out", str(out)]) == 2
    assert _error(capsys) == f"jaxgossip topology-sweep: error: --topologies: {rule}"
    assert not out.exists()



def test_a_random_bytes_npz_is_named_as_not_an_npz_without_pickle_advice(tmp_path, capsys):
    path = tmp_path / "garbage.npz"
    path.write_bytes(np.random.default_rng(0).bytes(3000))
    out = tmp_path / "run"
    argv = ["train", f"--dataset=npz:{path}", "--num_rounds=1", "--eval_every=1", "--out", str(out)]
    assert main(argv) == 2
    err = _error(capsys)
    assert err.startswith(f"jaxgossip train: error: dataset file {str(path)!r} is not a .npz archive")
    assert "pickle" not in err


def test_labels_all_minus_one_name_the_labels_rule(tmp_path, capsys):
    path = tmp_path / "neg.npz"
    x = np.zeros((8, 3), np.float32)
    np.savez(path, x_train=x, y_train=np.full(8, -1), x_test=x[:4], y_test=np.full(4, -1))
    out = tmp_path / "run"
    argv = ["train", f"--dataset=npz:{path}", "--model=mlp", "--num_nodes=4", "--num_rounds=1", "--eval_every=1"]
    assert main([*argv, "--out", str(out)]) == 2
    err = _error(capsys)
    assert "labels must be class indices 0..C-1; found -1 (negative)" in err and "num_classes" not in err
    assert not out.exists()
