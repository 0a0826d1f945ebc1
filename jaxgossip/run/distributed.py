"""Several JAX processes, one simulation: start-up from the environment, host copies of global
arrays, and "process 0 writes" (edge module: reads the environment).

JAX's multi-controller model runs the same program in P processes; after
``jax.distributed.initialize`` every process sees all P processes' devices in ``jax.devices()``, a
``("nodes",)`` mesh over them (``TrainConfig(devices=jax.device_count())``) splits the node axis
over every process, and each jitted call runs as one SPMD program whose mixing gathers and
``ppermute``\\ s become cross-process collectives. Three things differ from one process, and this
module holds them:

* start-up: :func:`initialize_from_env` reads ``JAXGOSSIP_COORDINATOR`` (``host:port`` of process
  0), ``JAXGOSSIP_NUM_PROCESSES`` (P) and ``JAXGOSSIP_PROCESS_ID`` (0..P-1), as set by
  ``python -m jaxgossip.run.launch`` or by hand on each host, or ``JAXGOSSIP_DISTRIBUTED=auto`` for
  JAX's own cluster detection (SLURM, Open MPI, Kubernetes, Cloud TPU). The ``jaxgossip`` command
  calls it first, so every command runs multi-process unchanged;
* reading results: a node-sharded array spans devices of other processes, so
  ``np.asarray`` refuses it; :func:`jaxgossip.ops.sharding.to_host` gathers it (a collective: every process must call it
  at the same point, which holds because all run the same program);
* writing results: only :func:`is_primary` (process 0) writes metrics, configs and plots; orbax
  checkpoints are written by all processes together (orbax coordinates them and writes each array
  once), so :mod:`jaxgossip.run.checkpoint` is called on every process.
"""

from __future__ import annotations

import os

import jax

__all__ = [
    "ENV_COORDINATOR",
    "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID",
    "ENV_AUTO",
    "initialize_from_env",
    "is_primary",
    "barrier",
]

ENV_COORDINATOR = "JAXGOSSIP_COORDINATOR"
ENV_NUM_PROCESSES = "JAXGOSSIP_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXGOSSIP_PROCESS_ID"
ENV_AUTO = "JAXGOSSIP_DISTRIBUTED"


def _env_int(name: str, environ: dict) -> int:
    value = environ[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} must be an integer") from None


def initialize_from_env(environ: dict | None = None) -> bool:
    """Calls ``jax.distributed.initialize`` when the environment asks for several processes.

    Must run before anything touches a JAX device (the ``jaxgossip`` command calls it first). A
    second call in a process that has joined already does nothing.

    Args:
      environ: the variables to read (default ``os.environ``).

    Returns:
      True if this process joined a multi-process run, False if none was asked for.

    Raises:
      ValueError: a partial or malformed set of variables (the message names the variable).
    """
    if jax.distributed.is_initialized():
        return True
    environ = dict(os.environ if environ is None else environ)
    names = (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)
    given = [name for name in names if environ.get(name)]
    if environ.get(ENV_AUTO):
        if environ[ENV_AUTO] != "auto":
            raise ValueError(f"{ENV_AUTO}={environ[ENV_AUTO]!r}: the only value is 'auto' (JAX's cluster detection)")
        if given:
            raise ValueError(f"{ENV_AUTO}=auto and {', '.join(given)} exclude each other; set one or the other")
        jax.distributed.initialize()
        return True
    if not given:
        return False
    missing = [name for name in names if name not in given]
    if missing:
        raise ValueError(
            f"a multi-process run needs {', '.join(names)}; {', '.join(missing)} missing (set by "
            "python -m jaxgossip.run.launch, or by hand on every host)"
        )
    coordinator = environ[ENV_COORDINATOR]
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{ENV_COORDINATOR}={coordinator!r} must be HOST:PORT of process 0, e.g. 127.0.0.1:12345")
    num_processes = _env_int(ENV_NUM_PROCESSES, environ)
    process_id = _env_int(ENV_PROCESS_ID, environ)
    if num_processes < 1:
        raise ValueError(f"{ENV_NUM_PROCESSES}={num_processes} must be >= 1")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"{ENV_PROCESS_ID}={process_id} must be in [0, {num_processes})")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    return True


def is_primary() -> bool:
    """Whether this process writes the run's files (process 0; always True in one process)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Waits until every process reaches the barrier ``name`` (no-op in one process), e.g. so that
    no process reads a folder that process 0 is still deleting."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
