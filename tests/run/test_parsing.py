"""Command lines onto typed fields (jaxgossip.run.parsing): a value the field's type refuses ends in
one line naming the option and the value; inf and nan are refused as not finite. In-process through
``main`` with ``--print-config`` (no compile). The typed configuration of every command as a whole:
tests/cli/test_cli_config.py."""

import pytest
from _reference import one_line_error

from jaxgossip.cli import main


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "Infinity"])
@pytest.mark.parametrize("field", ["lr", "weight_decay", "momentum", "grad_clip", "final_lr"])
def test_non_finite_floats_are_refused_as_not_finite(capsys, field, value):
    assert main(["train", f"--{field}={value}", "--print-config"]) == 2
    assert one_line_error(capsys) == (
        f"jaxgossip train: error: --{field}={value!r} is not valid: it must be finite (a number, not inf or nan)"
    )


def test_not_a_number_still_says_expected_float(capsys):
    assert main(["train", "--lr=abc", "--print-config"]) == 2
    assert one_line_error(capsys) == "jaxgossip train: error: --lr='abc' is not valid: expected float"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--algorithm=power_gossip", "--algorithm_options.rank=abc"], "--algorithm_options.rank='abc' is not valid: expected int"),
        (
            ["--algorithm=choco", "--algorithm_options.compressor=top_k", "--algorithm_options.compressor_options.fraction=x"],
            "--algorithm_options.compressor_options.fraction='x' is not valid: expected float or null",
        ),
        (["--algorithm=sparse_push", "--algorithm_options.fraction=nan"], "--algorithm_options.fraction='nan' is not valid: it must be finite"),
    ],
)
def test_the_chosen_algorithms_options_are_typed_by_its_factory(capsys, flags, message):
    """The options of the chosen algorithm and of its compressor are checked against the types of
    their factories' parameters, one line naming the option; what they take is typed, not text."""
    assert main(["train", *flags, "--print-config"]) == 2
    assert one_line_error(capsys).startswith(f"jaxgossip train: error: {message}")


def test_typed_algorithm_options_from_the_command_line_and_files(tmp_path):
    from jaxgossip.cli.train import command
    from jaxgossip.run.config import TrainConfig
    from jaxgossip.run.parsing import UsageError, parse
    from jaxgossip.run.runner import config_from_dict

    def options(*argv):
        return parse(command(), list(argv)).build(TrainConfig).algorithm_options

    assert options("--algorithm=power_gossip", "--algorithm_options.rank=2", "--algorithm_options.warm_start=false") == {
        "rank": 2,
        "warm_start": False,
    }
    assert options("--algorithm=choco", "--algorithm_options.compressor_options.k=none") == {"compressor_options": {"k": None}}
    # a key the factory does not take is left to the config check, which names it with a suggestion
    assert options("--algorithm=gossip", "--algorithm_options.gama=0.5") == {"gama": 0.5}
    path = tmp_path / "c.yaml"
    path.write_text("algorithm: power_gossip\nalgorithm_options:\n  rank: two\n")
    with pytest.raises(UsageError, match=r"--algorithm_options.rank='two' is not valid: expected int"):
        parse(command(), ["--config", str(path)])
    with pytest.raises(UsageError, match=r"config: --algorithm_options.rank='x' is not valid: expected int"):
        config_from_dict({"algorithm": "power_gossip", "algorithm_options": {"rank": "x"}})
    assert config_from_dict({"algorithm": "power_gossip", "algorithm_options.rank": 3}).algorithm_options == {"rank": 3}


def test_sweep_axes_are_typed_as_lists_of_numbers(tmp_path):
    from jaxgossip.cli.sweep import SweepOptions, command
    from jaxgossip.run.parsing import UsageError, parse

    def axes(*argv):
        return parse(command(), list(argv)).build(SweepOptions).sweep

    # one value is a one-point axis; ints become floats; nested axes keep their nesting
    assert axes("--sweep.lr=1") == {"lr": [1.0]}
    assert axes("--sweep.lr=0.1,1", "--sweep.algorithm_options.gamma=[0.5]") == {
        "lr": [0.1, 1.0],
        "algorithm_options": {"gamma": [0.5]},
    }
    assert all(type(v) is float for v in axes("--sweep.weight_decay=0,1")["weight_decay"])
    path = tmp_path / "s.yaml"
    path.write_text("sweep:\n  lr: 0.1\n  algorithm_options:\n    gamma: [1, 0.5]\n")
    assert axes("--config", str(path)) == {"lr": [0.1], "algorithm_options": {"gamma": [1.0, 0.5]}}
    # a value that is no number is refused by the parser, naming the axis (and the file)
    with pytest.raises(UsageError, match=r"^--sweep\.lr=\['abc'\] must be a list of finite numbers"):
        axes("--sweep.lr=abc")
    with pytest.raises(UsageError, match=r"--sweep\.algorithm_options\.gamma=\[0\.1, 'x'\] must be a list"):
        axes("--sweep.algorithm_options.gamma=0.1,x")
    path.write_text("sweep:\n  lr: [0.1, fast]\n")
    with pytest.raises(UsageError, match=r"^config file '.*s\.yaml': --sweep\.lr=\[0\.1, 'fast'\] must be a list"):
        axes("--config", str(path))
