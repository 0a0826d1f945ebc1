"""The course every command shares (jaxgossip.cli.skeleton.run_command): --help ends before the body,
an empty --out= is refused before it, and the lock the body takes on --out is held until the body
returns or raises."""

import os

import pytest
import yaml

from jaxgossip.cli.skeleton import run_command
from jaxgossip.run.lock import OutLockError, hold_out, holder
from jaxgossip.run.parsing import Command, UsageError

SPEC = Command(
    name="probe",
    description="a command for the skeleton's tests",
    classes=[],
    flags={"print-config": "print and exit"},
    extra={"output": [("out", str | None, None, "output folder")]},
)


def test_help_returns_0_without_running_the_body(capsys):
    assert run_command(SPEC, ["--help"], lambda ctx: pytest.fail("the body ran")) == 0
    assert "--out" in capsys.readouterr().out


def test_an_empty_out_is_refused_before_the_body():
    with pytest.raises(UsageError, match="names no folder"):
        run_command(SPEC, ["--out="], lambda ctx: pytest.fail("the body ran"))


def test_the_lock_is_held_until_the_body_returns(tmp_path):
    out = str(tmp_path / "out")

    def body(ctx):
        assert ctx.take_out("unused") == out
        assert holder(out).command == "jaxgossip probe"
        with pytest.raises(OutLockError, match="in use by jaxgossip probe"):
            with hold_out(out, "jaxgossip other"):
                pass
        return 7

    assert run_command(SPEC, [f"--out={out}"], body) == 7
    assert not os.path.exists(out)  # released: the lock file and the folder it created are gone


def test_the_lock_is_released_when_the_body_raises(tmp_path):
    out = str(tmp_path / "out")

    def body(ctx):
        ctx.take_out("unused")
        raise FloatingPointError("diverged")

    with pytest.raises(FloatingPointError):
        run_command(SPEC, [f"--out={out}"], body)
    with hold_out(out, "jaxgossip other"):  # free again
        pass


def test_the_default_folder_and_print_config(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def body(ctx):
        if ctx.print_config({"seed": 1}):
            return 0
        return 5 if ctx.take_out("runs/probe") == "runs/probe" else 6

    assert run_command(SPEC, ["--print-config"], body) == 0
    assert yaml.safe_load(capsys.readouterr().out) == {"seed": 1}
    assert run_command(SPEC, [], body) == 5
