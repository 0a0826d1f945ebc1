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
