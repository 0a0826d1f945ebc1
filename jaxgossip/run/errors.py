"""What a failed command tells its user (edge module): bad input, a full disk, or a bug.

The command line keeps three kinds of failure apart, so that a bug never looks like a user's mistake:

* **bad input** (exit 2, one ``error:`` line): a :class:`UsageError`; a ``ValueError`` or
  ``TypeError`` that one of jaxgossip's own checks raised (a ``raise`` statement in the jaxgossip
  package: the checks of configs, graphs, algorithms, data and checkpoints, whose messages name the
  option and the fix); a missing, unreadable or misplaced file on a path the user gave; an
  unparsable config or data file.
* **a full disk** (exit 1, one line naming the folder and the space needed): :class:`DiskFullError`,
  or any ``OSError`` of errno ``ENOSPC`` (the storage layer reports it as text inside other errors,
  see :func:`is_disk_full`).
* **anything else is a bug** (exit 1): one line saying so and where the full traceback was written
  (``traceback.txt`` in the command's output folder, else a temporary file), or the traceback on
  stderr with ``JAXGOSSIP_TRACEBACK=1``. Errors raised inside JAX, NumPy, orbax or Python itself
  (an array conversion, a wrong call) are bugs of jaxgossip, whatever their type.
"""

from __future__ import annotations

import errno
import os
import tarfile
import tempfile
import traceback
import zlib

__all__ = [
    "UsageError",
    "DiskFullError",
    "TRACEBACK_ENV",
    "is_user_error",
    "is_disk_full",
    "set_output_folder",
    "write_traceback",
]

#: Set to any non-empty value to get the full traceback of every failure on stderr.
TRACEBACK_ENV = "JAXGOSSIP_TRACEBACK"

# Errors of files on a user's path (config files, data folders, --out): bad input, not bugs.
_PATH_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
_DISK_FULL_TEXT = ("No space left on device", "os_error_code='28'", "Disk quota exceeded")

_output_folder: list[str] = []


class UsageError(ValueError):
    """Bad command-line or config-file input (the CLI exits with 2)."""


class DiskFullError(OSError):
    """A write failed for lack of space; the message names the folder and the space needed."""

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return str(self.args[1])


def set_output_folder(path: str | None) -> None:
    """Records the running command's output folder: a bug's traceback is written there."""
    _output_folder[:] = [path] if path else []


def is_disk_full(err: BaseException) -> bool:
    """Whether ``err`` (or an error it was raised from) is a write that found no space left."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(text in str(err) for text in _DISK_FULL_TEXT):
            return True
        err = err.__cause__ or err.__context__
    return False


def _raised_by_a_check(err: BaseException) -> bool:
    """Whether ``err`` comes from a ``raise`` statement in the jaxgossip package (one of its own
    checks), not from inside a library it called or from Python failing an operation."""
    tb = err.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    frame = tb.tb_frame
    # By module name: a file path may be relative to a folder the process has since left.
    if frame.f_globals.get("__name__", "").partition(".")[0] != "jaxgossip":
        return False
    import linecache

    line = linecache.getline(frame.f_code.co_filename, tb.tb_lineno, frame.f_globals)
    return line.lstrip().startswith("raise")


def is_user_error(err: BaseException) -> bool:
    """Whether ``err`` means bad input (exit 2) rather than a bug or a full disk (see the module
    docstring)."""
    if isinstance(err, UsageError):
        return True
    if is_disk_full(err):
        return False
    if isinstance(err, _PATH_ERRORS):
        return True
    import yaml

    if isinstance(err, (yaml.YAMLError, tarfile.TarError, zlib.error, EOFError)):  # a user's file that does not parse
        return True
    if isinstance(err, (ValueError, TypeError, OSError)):
        return _raised_by_a_check(err)
    return False


def write_traceback(command: str, err: BaseException) -> str:
    """Writes the full traceback of ``err`` to ``traceback.txt`` in the output folder (see
    :func:`set_output_folder`), else to a new temporary file; returns the path."""
    text = f"jaxgossip {command}\n" + "".join(traceback.format_exception(err))
    if _output_folder:
        try:
            os.makedirs(_output_folder[0], exist_ok=True)
            path = os.path.join(_output_folder[0], "traceback.txt")
            with open(path, "w") as f:
                f.write(text)
            return path
        except OSError:
            pass  # a folder that cannot be written: the temporary file below
    fd, path = tempfile.mkstemp(prefix=f"jaxgossip-{command}-", suffix="-traceback.txt")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path
