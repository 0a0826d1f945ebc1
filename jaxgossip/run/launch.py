"""Starts one command as P cooperating JAX processes on this machine (edge module).

::

  python -m jaxgossip.run.launch --processes=2 --cpu-devices=4 -- jaxgossip train --devices=8 ... --out runs/mp

Each process gets the :mod:`jaxgossip.run.distributed` variables (a coordinator on a free localhost
port, P, its index), so the ``jaxgossip`` command joins the run by itself; a Python script calls
``jaxgossip.run.distributed.initialize_from_env()`` before touching a device. ``--cpu-devices=K`` runs
on the CPU with K devices per process and JAX's gloo collectives between processes (a multi-host
rehearsal on one machine, and the CI test); without it the processes use the default backend.

Process 0's output passes through unchanged; the others' lines are prefixed ``[process i]``. When
one process fails, the others are stopped (a surviving process would otherwise wait for its peers
in a collective until JAX's timeout), and the launcher exits with the first failure's status;
``--timeout`` stops all of them and exits with 124. A leading ``jaxgossip`` in the command runs as
``python -m jaxgossip.cli`` with this interpreter, so the processes use the same environment.

On several hosts no launcher is needed: run the command on every host with
``JAXGOSSIP_COORDINATOR=HOST0:PORT JAXGOSSIP_NUM_PROCESSES=P JAXGOSSIP_PROCESS_ID=i`` (or
``JAXGOSSIP_DISTRIBUTED=auto`` under SLURM / Open MPI), see the README.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import NamedTuple

from jaxgossip.run.distributed import ENV_AUTO, ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID

__all__ = ["LaunchResult", "free_port", "process_env", "launch", "main"]

TIMEOUT_STATUS = 124
_GRACE_S = 5.0  # SIGTERM, then SIGKILL after this long


class LaunchResult(NamedTuple):
    """What :func:`launch` returns."""

    returncode: int  # 0, the first failing process's status, or 124 on timeout
    returncodes: list  # [P] each process's exit status (None if it was still running when stopped)
    failed: int | None  # index of the first process that failed (None if all succeeded or timed out)
    timed_out: bool


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def process_env(process_id: int, num_processes: int, coordinator: str, cpu_devices: int | None, base=None) -> dict:
    """The environment of process ``process_id``: ``base`` (default ``os.environ``) plus the
    :mod:`jaxgossip.run.distributed` variables and, with ``cpu_devices``, the CPU backend with that
    many devices and gloo collectives."""
    env = dict(os.environ if base is None else base)
    env.pop(ENV_AUTO, None)
    env.update({ENV_COORDINATOR: coordinator, ENV_NUM_PROCESSES: str(num_processes), ENV_PROCESS_ID: str(process_id)})
    if cpu_devices is not None:
        # JAX reads its options from JAX_<NAME> variables; these replace XLA_FLAGS'
        # --xla_force_host_platform_device_count.
        env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(cpu_devices), JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
    return env


def _relay(stream, prefix: str, sink) -> None:
    for line in iter(stream.readline, ""):
        sink.write(prefix + line)
        sink.flush()
    stream.close()


def _stop(procs: list) -> None:
    """SIGTERM to every live child, then SIGKILL to those still alive after the grace period."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def launch(
    command: Sequence[str],
    num_processes: int,
    *,
    cpu_devices: int | None = None,
    port: int | None = None,
    timeout: float | None = None,
    env: dict | None = None,
    stdout=None,
    cwd: str | None = None,
) -> LaunchResult:
    """Runs ``command`` as ``num_processes`` processes of one JAX run and waits for them.

    Args:
      command: the program and its arguments (a leading ``"jaxgossip"`` runs this interpreter's
        ``-m jaxgossip.cli``).
      num_processes: P >= 1.
      cpu_devices: K, CPU devices per process (CPU backend, gloo collectives); None keeps the
        default backend.
      port: the coordinator's localhost port (default: a free one).
      timeout: seconds before every process is stopped (default: none).
      env: the base environment (default ``os.environ``).
      stdout: where output goes (default ``sys.stdout``; process 0's stderr goes to ``sys.stderr``
        when this is None).
      cwd: working folder of the processes.

    Raises:
      ValueError: an empty command, P < 1, K < 1, or a port out of range.
    """
    command = list(command)
    if not command:
        raise ValueError("no command given: python -m jaxgossip.run.launch --processes=P -- COMMAND ...")
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"processes={num_processes!r} must be an int >= 1")
    if cpu_devices is not None and (
        isinstance(cpu_devices, bool) or not isinstance(cpu_devices, int) or cpu_devices < 1
    ):
        raise ValueError(f"cpu_devices={cpu_devices!r} must be an int >= 1")
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"port={port} must be in 1..65535")
    if command[0] == "jaxgossip":
        command = [sys.executable, "-m", "jaxgossip.cli"] + command[1:]
    coordinator = f"127.0.0.1:{port or free_port()}"
    sink = stdout or sys.stdout
    procs, threads = [], []
    try:
        for i in range(num_processes):
            piped = i > 0 or stdout is not None
            proc = subprocess.Popen(
                command,
                env=process_env(i, num_processes, coordinator, cpu_devices, env),
                cwd=cwd,
                stdout=subprocess.PIPE if piped else None,
                stderr=subprocess.STDOUT if piped else None,
                text=True,
            )
            procs.append(proc)
            if piped:
                prefix = f"[process {i}] " if i > 0 else ""
                thread = threading.Thread(target=_relay, args=(proc.stdout, prefix, sink), daemon=True)
                thread.start()
                threads.append(thread)
        deadline = None if timeout is None else time.monotonic() + timeout
        failed, timed_out = None, False
        while [p.poll() for p in procs].count(None):  # polls every process (any() would stop early)
            bad = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
            if bad:
                failed = bad[0]
                break
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.05)
        if failed is None and not timed_out:
            bad = [i for i, p in enumerate(procs) if p.returncode != 0]
            failed = bad[0] if bad else None
    finally:
        _stop(procs)  # on failure, timeout or an exception here (Ctrl-C): no orphaned processes
        for thread in threads:
            thread.join(timeout=_GRACE_S)
    codes = [p.returncode for p in procs]
    if timed_out:
        sink.write(f"jaxgossip.run.launch: timed out after {timeout} s; stopped all {num_processes} processes\n")
        return LaunchResult(TIMEOUT_STATUS, codes, None, True)
    if failed is not None:
        sink.write(f"jaxgossip.run.launch: process {failed} exited with status {codes[failed]}; stopped the others\n")
        return LaunchResult(int(codes[failed]) or 1, codes, failed, False)
    return LaunchResult(0, codes, None, False)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        at = argv.index("--")
        own, command = argv[:at], argv[at + 1 :]
    else:
        own, command = argv, []
    parser = argparse.ArgumentParser(
        prog="python -m jaxgossip.run.launch",
        description="Run COMMAND as P processes of one JAX run on this machine (coordinator on localhost).",
        usage="python -m jaxgossip.run.launch --processes=P [--cpu-devices=K] [--port=N] [--timeout=S] -- COMMAND ...",
    )
    parser.add_argument("--processes", "-n", type=int, required=True, help="P, the number of processes")
    parser.add_argument("--cpu-devices", type=int, default=None, help="K CPU devices per process, gloo collectives")
    parser.add_argument("--port", type=int, default=None, help="coordinator port (default: a free one)")
    parser.add_argument("--timeout", type=float, default=None, help="stop every process after this many seconds")
    args = parser.parse_args(own)
    if not command:
        parser.error("give the command after --, e.g. -- jaxgossip train --devices=8 ...")
    try:
        result = launch(command, args.processes, cpu_devices=args.cpu_devices, port=args.port, timeout=args.timeout)
    except ValueError as err:
        parser.error(str(err))
    except KeyboardInterrupt:  # the processes were stopped on the way out of launch()
        print("jaxgossip.run.launch: interrupted; stopped every process", file=sys.stderr)
        return 130
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
