"""The training configuration (jaxgossip.run.config): the checks of check_train_config and of the
option groups, each refusal naming the field and the rule, with "did you mean" for a misspelled
option; the resolved form runs are compared in."""

import pytest
from _reference import one_line_error
from tiny import CHOCO_TOP_K, tiny_config

from jaxgossip.checks import did_you_mean
from jaxgossip.cli import main
from jaxgossip.run.config import resolved_config
from jaxgossip.run.resolve import check_train_config
from jaxgossip.run.validate import check_partition


def test_only_the_misspelled_compressor_option_is_named(capsys):
    argv = ["train", *CHOCO_TOP_K, "--algorithm_options.compressor_options.fraction=0.1"]
    assert main([*argv, "--algorithm_options.compressor_options.fractoin=0.2", "--print-config"]) == 2
    assert one_line_error(capsys) == (
        "jaxgossip train: error: algorithm_options.compressor_options.fractoin: compressor 'top_k' has no "
        "option 'fractoin' (did you mean 'fraction'?); it takes: fraction, k, index_bits"
    )
    assert main([*argv, "--print-config"]) == 0  # the correct key alone is accepted


def test_an_option_of_no_compressor_is_named_with_the_default_compressor(capsys):
    argv = ["train", "--algorithm=choco", "--algorithm_options.compressor_options.fraction=0.1", "--print-config"]
    assert main(argv) == 2
    assert one_line_error(capsys) == (
        "jaxgossip train: error: algorithm_options.compressor_options.fraction: compressor 'identity' has no "
        "option 'fraction'; it takes: no options"
    )


def test_a_non_finite_float_from_a_config_file_is_refused_as_not_finite(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("lr: .inf\n")
    assert main(["train", "--config", str(path), "--print-config"]) == 2
    assert "lr=inf must be finite, a number > 0" in one_line_error(capsys)


def test_did_you_mean_names_the_closest_choice_or_nothing():
    assert did_you_mean("fractoin", ["fraction", "k", "index_bits"]) == " (did you mean 'fraction'?)"
    assert did_you_mean("zzz", ["fraction", "k", "index_bits"]) == ""


@pytest.mark.parametrize("spec", ["iid", "by_source", "dirichlet:0.1", "shards:2", "skew:0", "skew:1"])
def test_check_partition_accepts_every_scheme(spec):
    assert check_partition(spec) is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("dirichlet:0", "partition='dirichlet:0': dirichlet needs ALPHA > 0"),
        ("dirichlet:inf", "partition='dirichlet:inf': dirichlet needs ALPHA > 0"),
        ("dirichlet", "partition='dirichlet': dirichlet needs ALPHA > 0, e.g. dirichlet:0.1"),
        ("shards:0", "partition='shards:0': shards needs an int K >= 1"),
        ("shards:1.5", "partition='shards:1.5': shards needs an int K >= 1, e.g. shards:2"),
        ("skew:1.5", "partition='skew:1.5': skew needs S in [0, 1]"),
        ("iid:3", "partition='iid:3': iid takes no parameter"),
        ("diriclet:0.1", "unknown partition 'diriclet' (did you mean 'dirichlet:ALPHA'?); known: iid,"),
        (3, "partition=3 must be a string such as iid, dirichlet:0.1, shards:2 or skew:0.8"),
    ],
)
def test_check_partition_refuses_naming_the_spec_and_the_rule(spec, message):
    with pytest.raises(ValueError) as err:
        check_partition(spec)
    assert str(err.value).startswith(message), err.value


def test_check_train_config_normalises_values():
    config = check_train_config(tiny_config(final_merge="3", decay_rounds=[5]))
    assert config.final_merge == 3 and config.decay_rounds == (5,)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"lr": 0.0}, "lr=0.0 must be a number > 0"),
        ({"num_nodes": 0}, "num_nodes=0 must be an int >= 1"),
        ({"dataset": "mnsit"}, "unknown dataset 'mnsit' (did you mean 'mnist'?); known: auto,"),
        ({"topology": "rng"}, "unknown topology 'rng' (did you mean 'ring'?); known: ring,"),
        ({"topology": "torus:3x3", "num_nodes": 8}, "topology='torus:3x3' with num_nodes=8: torus rows*cols = 3*3 = 9"),
        ({"final_merge": 0.5}, "final_merge=0.5 must be null (no merge), a number of merge rounds >= 1, or 'exact'"),
        ({"node_batch": -1}, "node_batch=-1 must be 'auto', 0 (one vmap over all nodes) or a positive int"),
    ],
)
def test_check_train_config_refuses_naming_the_field_and_the_rule(changes, message):
    with pytest.raises(ValueError) as err:
        check_train_config(tiny_config(**changes))
    assert str(err.value).startswith(message), err.value


def test_resolved_config_equates_spellings_of_one_run_and_keeps_real_changes():
    base = tiny_config()
    resolved = resolved_config(base.to_dict())
    assert resolved["data_seed"] == base.seed  # null data_seed is the run seed
    assert resolved_config(base.replace(data_seed=base.seed).to_dict()) == resolved
    missing = base.to_dict()
    del missing["momentum"]  # a field an older config did not save takes its default
    assert resolved_config(missing) == resolved
    assert resolved_config(base.replace(final_merge="3").to_dict())["final_merge"] == 3
    assert resolved_config(base.replace(lr=0.5).to_dict()) != resolved
