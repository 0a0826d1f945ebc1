"""One writer per output folder: an exclusive lock on ``--out`` (edge module: file I/O).

Every command that writes under ``--out`` holds :func:`hold_out` on it from before its first write
to its exit, so a second command on the same folder is refused at once instead of resuming from,
training alongside or overwriting the first one's files.

The lock is ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``out/.jaxgossip.lock``, a file that holds the
holder's PID, host and command (read only to name the holder in the refusal). The kernel drops a
flock when its process dies, however it dies (SIGKILL included), so a lock file left behind by a
killed run is not locked: the next run takes it over and says whose it was. On a normal exit the
holder deletes the file, and removes the folder again if it created it and left nothing else there
(a run refused after taking the lock leaves no empty folder). Deleting a locked file is safe because
a taker checks, once it holds the lock, that the path still names the file it locked (else it
retries on the new file).

flock is advisory and local: it excludes jaxgossip commands on one host (and on network file
systems that implement flock); in a multi-process run, process 0 holds it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from collections.abc import Callable, Iterator
from typing import NamedTuple

__all__ = ["LOCK_NAME", "OutLockError", "Holder", "holder", "hold_out", "hold_out_of_run"]

LOCK_NAME = ".jaxgossip.lock"


class OutLockError(ValueError):
    """The output folder is in use by another running command (the CLI exits 2 on it)."""


class Holder(NamedTuple):
    """Who holds (or last held) an output folder's lock, as its lock file says."""

    pid: int | None
    host: str
    command: str

    def describe(self) -> str:
        pid = "an unknown process" if self.pid is None else f"PID {self.pid}"
        where = f" on {self.host}" if self.host and self.host != socket.gethostname() else ""
        return f"{self.command or 'jaxgossip'} ({pid}{where})"


def _read_holder(fd: int) -> Holder | None:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 4096).decode("utf-8", "replace").strip()
    if not text:
        return None
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    try:
        pid = int(fields.get("pid", ""))
    except ValueError:
        pid = None
    return Holder(pid, fields.get("host", ""), fields.get("command", ""))


def holder(out: str) -> Holder | None:
    """The holder a folder's lock file names, or None if there is none (does not lock)."""
    try:
        fd = os.open(os.path.join(out, LOCK_NAME), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return _read_holder(fd)
    finally:
        os.close(fd)


def _make_folder(out: str) -> list[str]:
    """Creates ``out`` and its missing parents; returns the folders created, outermost first."""
    created = []
    path = os.path.abspath(out)
    while not os.path.isdir(path):
        created.append(path)
        path = os.path.dirname(path)
    created.reverse()
    for path in created:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
    return created


def _take(path: str, out: str) -> tuple[int, Holder | None]:
    """Opens and flocks the lock file at ``path``; returns the fd and the previous holder's record."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            other = _read_holder(fd)
            os.close(fd)
            who = other.describe() if other else "another process"
            raise OutLockError(
                f"--out={out!r} is in use by {who}; wait for it to finish or give another --out"
            ) from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return fd, _read_holder(fd)
        os.close(fd)  # the holder deleted the file between our open and flock: lock the new one


@contextlib.contextmanager
def hold_out(out: str, command: str, *, log: Callable[[str], None] | None = None) -> Iterator[str]:
    """Holds the exclusive lock of the output folder ``out`` for the ``with`` block.

    Creates ``out`` (and missing parents) if needed; on exit deletes the lock file and removes the
    folders it created if they are empty.

    Args:
      out: the output folder.
      command: the holder's name in a refusal, e.g. ``"jaxgossip train"``.
      log: receives the one-line note when a stale lock (its holder no longer runs) is taken over.

    Yields:
      ``out``.

    Raises:
      OutLockError: another process holds the lock (the message names the folder and its PID), or
        the folder or its lock file cannot be created.
    """
    try:
        created = _make_folder(out)
    except OSError as err:  # e.g. under /proc, or a read-only file system
        raise OutLockError(
            f"--out={out!r} cannot be created: {err.strerror or err}; give a folder you can write to"
        ) from None
    path = os.path.join(out, LOCK_NAME)
    try:
        fd, previous = _take(path, out)
    except OutLockError:
        _remove_empty(created)
        raise
    except OSError as err:
        _remove_empty(created)
        raise OutLockError(f"--out={out!r}: cannot create its lock file: {err.strerror or err}") from None
    except BaseException:
        _remove_empty(created)
        raise
    try:
        if previous is not None and log is not None:
            log(
                f"note: took over the lock of {out} from {previous.describe()}, which no longer runs "
                "(it was killed or crashed; a checkpoint it left is resumed as usual)"
            )
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"pid={os.getpid()}\nhost={socket.gethostname()}\ncommand={command}\n".encode())
        os.fsync(fd)
        yield out
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # while still locked, so no other process holds a lock on it
        os.close(fd)
        _remove_empty(created)


def _remove_empty(created: list[str]) -> None:
    for path in reversed(created):
        try:
            os.rmdir(path)
        except OSError:
            return


@contextlib.contextmanager
def hold_out_of_run(out: str, command: str, *, log: Callable[[str], None] | None = None) -> Iterator[str]:
    """:func:`hold_out` for a command that may run over several processes: process 0 holds the
    lock and tells the others whether it got it, so that all of them stop at once when the folder is
    in use (one process: exactly :func:`hold_out`)."""
    import jax

    if jax.process_count() == 1:
        with hold_out(out, command, log=log) as held:
            yield held
        return
    import numpy as np
    from jax.experimental import multihost_utils

    with contextlib.ExitStack() as stack:
        refusal = None
        if jax.process_index() == 0:
            try:
                stack.enter_context(hold_out(out, command, log=log))
            except OutLockError as err:
                refusal = err
        taken = multihost_utils.broadcast_one_to_all(np.int32(refusal is None))
        if refusal is not None:
            raise refusal
        if not int(taken):
            raise OutLockError(f"--out={out!r} is in use by another run (process 0 could not lock it)")
        yield out
