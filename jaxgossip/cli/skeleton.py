"""The course every command takes (edge module): parse the command line (``--help`` prints and
exits 0), refuse an empty ``--out=``, then run the command's own body, which checks its input,
answers ``--print-config`` and takes the lock on ``--out`` before its first write; the lock is held
until the command returns, whatever way it returns."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from jaxgossip.cli import common
from jaxgossip.run.lock import hold_out
from jaxgossip.run.parsing import Command, Parsed, parse_argv

__all__ = ["Invocation", "run_command"]


class Invocation:
    """One run of a command, as its body sees it.

    Attributes:
      name: the command's name (``"train"``), for its messages.
      argv: the command line it was given (without the command's name).
      parsed: the parsed command line.
    """

    def __init__(self, name: str, argv: list[str], parsed: Parsed, held: contextlib.ExitStack, lock: Callable):
        self.name, self.argv, self.parsed = name, argv, parsed
        self._held, self._lock = held, lock

    def warn(self, message: str) -> None:
        common.warn(self.name, message)

    def print_config(self, resolved: dict) -> bool:
        """With ``--print-config``: prints ``resolved`` as YAML (:func:`common.print_config`) and
        returns True, and the body then returns 0 without running."""
        return common.print_config(self.parsed, resolved)

    def out_folder(self, default: str) -> str:
        """``--out``, or ``default`` when it is not given."""
        return self.parsed.values["out"] or default

    def take_out(self, default: str) -> str:
        """Checks that the output folder (``--out``, else ``default``) can be written and locks it
        until the command returns; returns the folder. Raises UsageError for a folder that cannot
        be written, and OutLockError (exit 2) when another command holds it."""
        out = common.prepare_out(self.out_folder(default))
        self._held.enter_context(self._lock(out, f"jaxgossip {self.name}", log=self.warn))
        return out


def run_command(
    spec: Command, argv: list[str], body: Callable[[Invocation], int], *, lock: Callable[..., Any] = hold_out
) -> int:
    """Runs command ``spec`` on ``argv``: returns 0 after ``--help``, else ``body``'s exit status.

    A command with an ``--out`` option has an empty ``--out=`` refused (UsageError) before the body
    runs. ``lock(out, holder, log=...)`` is the context manager :meth:`Invocation.take_out` enters
    (:func:`jaxgossip.run.lock.hold_out`; a command that runs over several processes passes
    :func:`jaxgossip.run.lock.hold_out_of_run`); it is left when ``body`` returns or raises.
    """
    parsed = parse_argv(spec, argv)
    if parsed is None:
        return 0
    if "out" in parsed.values:
        common.check_out(parsed.values["out"])
    with contextlib.ExitStack() as held:
        return body(Invocation(spec.name, argv, parsed, held, lock))
