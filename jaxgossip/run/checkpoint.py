"""Crash-safe checkpoints of a training run with an orbax ``CheckpointManager`` (edge module: file I/O).

Layout: ``ckpt_dir/<R>/`` for every kept checkpoint, ``R`` the rounds done, each holding three
orbax items:

* ``state/``: the full :class:`~jaxgossip.engine.training.TrainState` (params, normalization statistics,
  optimizer and communication state, RNG key data, round counter, bits);
* ``history/``: the :class:`~jaxgossip.engine.training.Metrics` of every evaluation point so far (orbax
  reserves the item name ``metrics``);
* ``meta/``: JSON with the config, the rounds done, the cumulative wall time and the wall time at
  every evaluation point.

orbax writes a step into ``<R>.orbax-checkpoint-tmp`` and renames it to ``<R>`` only once every
item is complete, and only complete steps are ever listed, so a process killed at any instant
leaves the previous complete checkpoint as the latest one. The two newest steps are kept
(:data:`MAX_TO_KEEP`); older ones are deleted after a newer one is complete.

Resume rules (:func:`check_resume`): the saved config must equal the new one except for
:data:`RESUMABLE_CHANGES`, and the new ``num_rounds`` must not be below the rounds already done. The
check only reads, so a refused resume leaves the folder as it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxgossip.run.errors import DiskFullError, UsageError, is_disk_full

__all__ = [
    "CheckpointError",
    "Saved",
    "Restored",
    "MAX_TO_KEEP",
    "RESUMABLE_CHANGES",
    "exists",
    "latest",
    "check_resume",
    "save",
    "restore",
    "clear",
    "foreign_files",
]

# Fields that may change between the interrupted and the resumed run: they change neither the
# trajectory nor the arrays' shapes (num_rounds only where it is not below the rounds done).
RESUMABLE_CHANGES = frozenset({"num_rounds", "evals_per_chunk", "name", "tensorboard", "download"})
MAX_TO_KEEP = 2
# Bytes a step takes beyond its arrays (orbax's metadata, manifests and JSON; about 60 kB measured).
_STEP_OVERHEAD = 128 * 1024
# What a refused or failed resume offers: a new folder first, since --no-resume deletes the run's
# checkpoint and its metrics.json/metrics.csv are rewritten from round 0 (clear() and run_training).
_HINT = (
    "give a new --out to keep this run; --no-resume starts over in this --out and deletes the run's "
    "checkpoint and its metrics"
)


class CheckpointError(UsageError):
    """A checkpoint is unreadable, or the run it holds cannot be continued with this config."""


class Saved(NamedTuple):
    """What the newest complete checkpoint says about its run (read without restoring arrays)."""

    round: int  # rounds done
    config: dict  # the run's config (TrainConfig.to_dict())
    wall_time: float  # s, cumulative compute time of the run so far
    walls: list  # [M] s, cumulative wall time at each evaluation point
    digest: str | None = None  # SHA-256 of the saved arrays (:func:`_digest`); None in older checkpoints


class Restored(NamedTuple):
    """A restored run: its state, its metrics so far and the wall times of :class:`Saved`."""

    state: Any  # TrainState, shaped and sharded like the ``like_state`` given to restore
    metrics: Any  # Metrics, numpy leaves [M] (bits [M, N])
    wall_time: float
    walls: list
    round: int = 0  # rounds done in the restored checkpoint (older than the newest if that was damaged)
    set_aside: tuple = ()  # names the damaged newer steps were renamed to (``<R>.damaged``)


@contextlib.contextmanager
def _manager(ckpt_dir: str, *, read_only: bool):
    import orbax.checkpoint as ocp

    if read_only:
        options = ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0)
    else:
        # cleanup_tmp_directories: a step a killed process left unfinished is deleted on open.
        options = ocp.CheckpointManagerOptions(
            max_to_keep=MAX_TO_KEEP, create=True, cleanup_tmp_directories=True, enable_async_checkpointing=False
        )
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)  # orbax warns about read-only mode on every open
    try:
        manager = ocp.CheckpointManager(os.path.abspath(ckpt_dir), options=options)
    finally:
        absl.setLevel(level)
    try:
        yield manager
    finally:
        manager.close()


@contextlib.contextmanager
def _quiet_storage_threads():
    """orbax's writer threads log every failure with its traceback before the same error reaches
    :func:`save` as an exception; the exception is what the user is told (in one line)."""
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        absl.setLevel(level)


def _check_legacy(ckpt_dir: str) -> None:
    if os.path.exists(os.path.join(ckpt_dir, "meta.json")):
        raise CheckpointError(
            f"{ckpt_dir} holds a checkpoint of an older jaxgossip (meta.json, no step folders) that cannot be "
            f"resumed; {_HINT}"
        )


def exists(ckpt_dir: str) -> bool:
    """Whether ``ckpt_dir`` holds at least one complete checkpoint."""
    return latest(ckpt_dir) is not None


def _short(err: BaseException) -> str:
    """The first line of an error, cut to 160 characters (storage-layer errors run to many lines)."""
    text = (str(err).strip().splitlines() or [""])[0].split(" See full TensorStore details")[0]
    return f"{type(err).__name__}: {text[:160]}{'...' if len(text) > 160 else ''}"


def _read_saved(manager, step: int) -> Saved:
    import orbax.checkpoint as ocp

    meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
    return Saved(
        int(meta["round"]), dict(meta["config"]), float(meta["wall_time"]), list(meta["walls"]), meta.get("digest")
    )


def _is_key(leaf) -> bool:
    """Whether ``leaf`` is a typed PRNG key array (an extended dtype NumPy cannot hold)."""
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _storable(tree):
    """``tree`` with every typed PRNG key replaced by its raw key data (uint32, key shape + impl
    words): what NumPy, the digest and orbax can hold. :func:`_unstorable` undoes it."""
    return jax.tree_util.tree_map(lambda leaf: jax.random.key_data(leaf) if _is_key(leaf) else leaf, tree)


def _storable_target(like):
    """The restore target of ``like`` with typed keys as their key data's shape and dtype."""

    def one(leaf):
        sharding = getattr(leaf, "sharding", None)
        if _is_key(leaf):
            data = jax.eval_shape(jax.random.key_data, leaf)
            return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=sharding)
        return jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype, sharding=sharding)

    return jax.tree_util.tree_map(one, like)


def _unstorable(tree, like):
    """The inverse of :func:`_storable`: key data back to typed keys of ``like``'s implementation."""
    return jax.tree_util.tree_map(
        lambda leaf, ref: jax.random.wrap_key_data(leaf, impl=jax.random.key_impl(ref)) if _is_key(ref) else leaf,
        tree,
        like,
    )


def _digest(state, history: dict) -> str:
    """SHA-256 over the dtype, shape and bytes of every host leaf of ``state`` (tree order) and of
    ``history`` (by name): a restored checkpoint must reproduce it bit for bit, which catches an
    altered data file that the storage layer reads without complaint."""
    h = hashlib.sha256()
    named = [np.asarray(history[name]) for name in sorted(history)]
    leaves = jax.tree_util.tree_leaves(state) + [a for a in named if a.dtype != object]  # no None fields
    for leaf in leaves:
        array = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{array.dtype.str}{array.shape}".encode())
        h.update(array.tobytes())
    return h.hexdigest()


def _steps(manager) -> list[int]:
    return sorted((int(s) for s in manager.all_steps()), reverse=True)


def latest(ckpt_dir: str) -> Saved | None:
    """The :class:`Saved` of the newest complete checkpoint whose metadata reads, or None if there is
    no checkpoint. Only reads (a damaged newer step is skipped here and set aside by :func:`restore`).

    Raises:
      CheckpointError: no step's metadata is readable, or an old-format checkpoint.
    """
    if not os.path.isdir(ckpt_dir):
        return None
    _check_legacy(ckpt_dir)
    errors = []
    with _manager(ckpt_dir, read_only=True) as manager:
        for step in _steps(manager):
            try:
                return _read_saved(manager, step)
            except Exception as err:  # orbax raises a variety of errors on damaged files
                errors.append(f"round {step}: {_short(err)}")
    if not errors:
        return None
    raise CheckpointError(f"checkpoint {ckpt_dir} is unreadable ({'; '.join(errors)}); {_HINT}")


def check_resume(saved: Saved, config: dict, ckpt_dir: str) -> None:
    """Raises :class:`CheckpointError` unless the run of ``saved`` can be continued with ``config``.

    Both configs are compared resolved (:func:`jaxgossip.run.config.resolved_config`: every option
    group with its defaults filled in, ``auto`` values resolved), so spelling out a default never
    refuses a resume, and a checkpoint whose saved config predates a field or spelled it
    differently resolves the same way. Every resolved field must be equal except
    :data:`RESUMABLE_CHANGES` (JSON round trip, so tuples equal lists), and
    ``config["num_rounds"]`` must be at least the rounds already done (a finished run re-run with
    the same config resumes to the same result without training). A refusal names each differing
    field, inside an option group by its dotted name (``time.latency``).
    """
    from jaxgossip.run.config import resolved_config

    old, new = (_norm(resolved_config(c)) for c in (saved.config, config))
    differing = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if key in RESUMABLE_CHANGES or a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            differing += [(f"{key}.{k}", a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        else:
            differing.append((key, a, b))
    if differing:
        details = ", ".join(f"{k}: saved {a!r} vs now {b!r}" for k, a, b in differing)
        raise CheckpointError(f"checkpoint {ckpt_dir} belongs to another configuration ({details}); {_HINT}")
    if saved.round > int(config["num_rounds"]):
        raise CheckpointError(
            f"checkpoint {ckpt_dir} has {saved.round} rounds done, more than num_rounds={config['num_rounds']}; "
            f"give --num_rounds >= {saved.round} to continue it, or {_HINT}"
        )


def save(ckpt_dir: str, state, metrics, walls: list, config: dict) -> None:
    """Saves a complete checkpoint of round ``state.round`` (atomically; see the module docstring).

    Args:
      ckpt_dir: the checkpoint folder (created if missing).
      state: the TrainState after the last chunk.
      metrics: the Metrics of every evaluation point so far (leaves [M, ...]).
      walls: [M] cumulative wall time (s) at each evaluation point; the last is the run's wall time.
      config: the run's config dict.
    """
    import orbax.checkpoint as ocp

    from jaxgossip.ops import sharding

    step = int(np.asarray(state.round))
    arrays = {name: np.asarray(value) for name, value in metrics._asdict().items()}
    # Host copies (gathered from every process in a multi-process run): the files then do not
    # depend on the mesh, so any device count can restore them. orbax writes NumPy arrays from
    # process 0 only, while all processes take part.
    host = sharding.to_host(_storable(state))
    meta = {
        "config": config,
        "round": step,
        "wall_time": float(walls[-1]) if walls else 0.0,
        "walls": list(walls),
        "digest": _digest(host, arrays),
    }
    need = sum(np.asarray(leaf).nbytes for leaf in jax.tree_util.tree_leaves((host, arrays))) + _STEP_OVERHEAD
    _require_space(ckpt_dir, step, need)
    try:
        with _manager(ckpt_dir, read_only=False) as manager, _quiet_storage_threads():
            manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(host),
                    history=ocp.args.StandardSave(arrays),
                    meta=ocp.args.JsonSave(meta),
                ),
                force=True,
            )
            manager.wait_until_finished()
    except Exception as err:
        if not is_disk_full(err):
            raise
        # The unfinished step would hold the space that is missing; the previous step stays complete.
        _remove_unfinished(ckpt_dir)
        raise _disk_full(ckpt_dir, step, need) from err


def _free_bytes(path: str) -> int | None:
    """Free bytes on the file system of ``path`` (its nearest existing parent), None if unknown."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _disk_full(ckpt_dir: str, step: int, need: int) -> DiskFullError:
    free = _free_bytes(ckpt_dir)
    return DiskFullError(
        f"no space left on device for the checkpoint of round {step} in {ckpt_dir}: it needs about "
        f"{need / 1e6:.3g} MB, {'an unknown amount' if free is None else f'{free / 1e6:.3g} MB'} free; free "
        "some space or give another --out (the previous checkpoint, if any, is kept)"
    )


def _require_space(ckpt_dir: str, step: int, need: int) -> None:
    """Refuses a save that cannot fit before it starts: a storage layer that runs out of space half-way
    leaves threads failing noisily and an unfinished step behind."""
    free = _free_bytes(ckpt_dir)
    if free is not None and free < need:
        raise _disk_full(ckpt_dir, step, need)


# A read abandoned by a failed restore reports within milliseconds of the failure; restore waits
# until none has reported for _SETTLE_S (at most _SETTLE_MAX_S) before it hands the hook back.
_SETTLE_S = 0.1
_SETTLE_MAX_S = 2.0


@contextlib.contextmanager
def _quiet_abandoned_reads():
    """Silences the reads a failed restore leaves behind, and only those; yields ``failed()``, to
    call after each restore attempt that raised.

    When one array of a step fails to read, orbax's event loop ends while the step's other reads
    are still in flight: each then reports to the closed loop (``RuntimeError: Event loop is
    closed`` through :func:`sys.unraisablehook`), coroutines are collected unawaited ("Exception
    ignored in: <coroutine ...>") and asyncio logs every unretrieved read error: dozens of
    tracebacks for one damaged step, which :func:`restore` already reports in one line. After a
    failed attempt the reads are given time to settle and their futures are collected here, so
    none reports once the previous hook is back.
    """
    import gc
    import inspect
    import sys
    import time

    previous = sys.unraisablehook
    heard = [None]  # monotonic time of the last failure or noise; None while nothing failed

    def hook(unraisable):
        error = unraisable.exc_value
        closed_loop = isinstance(error, RuntimeError) and "Event loop is closed" in str(error)
        if closed_loop or inspect.iscoroutine(unraisable.object):
            heard[0] = time.monotonic()
            return
        previous(unraisable)

    def failed():
        heard[0] = time.monotonic()

    asyncio_log = logging.getLogger("asyncio")
    level = asyncio_log.level
    sys.unraisablehook = hook
    asyncio_log.setLevel(logging.CRITICAL)
    try:
        yield failed
    finally:
        if heard[0] is not None:
            deadline = time.monotonic() + _SETTLE_MAX_S
            while time.monotonic() < min(deadline, heard[0] + _SETTLE_S):
                time.sleep(_SETTLE_S / 10)
            gc.collect()
        sys.unraisablehook = previous
        asyncio_log.setLevel(level)


def restore(
    ckpt_dir: str, like_state, config: dict, *, set_aside: bool = True, log: Callable[[str], None] | None = None
) -> Restored:
    """Restores the newest intact checkpoint after :func:`check_resume` of ``config``.

    A newer step that fails to restore (a truncated or altered file, unreadable metadata) is
    skipped for the next older one; once one restores, each damaged step is renamed to
    ``<R>.damaged`` (never deleted; orbax no longer lists it) and reported in one line to ``log``.
    If none restores, or the config check refuses the run, nothing is renamed.

    Args:
      ckpt_dir: the checkpoint folder.
      like_state: a state of the same structure (e.g. ``trainer.init(key)``): the restored leaves
        get its shapes, dtypes and shardings.
      config: the current run's config dict.
      set_aside: rename the damaged steps (process 0 of a multi-process run; the others only skip).
      log: receives one line per damaged step.

    Raises:
      CheckpointError: no checkpoint, no intact one, or a run that cannot be resumed.
    """
    import orbax.checkpoint as ocp

    from jaxgossip.engine.training import Metrics
    from jaxgossip.ops import sharding

    if not os.path.isdir(ckpt_dir):
        raise CheckpointError(f"{ckpt_dir} holds no complete checkpoint")
    _check_legacy(ckpt_dir)
    target = _storable_target(like_state)
    damaged, items, saved = [], None, None
    with _quiet_abandoned_reads() as failed, _manager(ckpt_dir, read_only=True) as manager:
        steps = _steps(manager)
        for step in steps:
            try:
                saved = _read_saved(manager, step)
            except Exception as err:  # orbax raises a variety of errors on damaged files
                damaged.append((step, _short(err)))
                continue
            check_resume(saved, config, ckpt_dir)  # a refusal renames nothing
            try:
                items = manager.restore(
                    step,
                    args=ocp.args.Composite(state=ocp.args.StandardRestore(target), history=ocp.args.StandardRestore()),
                )
            except Exception as err:  # damaged or mismatched arrays
                failed()
                damaged.append((step, _short(err)))
                continue
            if saved.digest is not None and _digest(sharding.to_host(items.state), items.history) != saved.digest:
                damaged.append((step, "its arrays differ from the ones saved (SHA-256 mismatch)"))
                items = None
                continue
            break
    if not steps:
        raise CheckpointError(f"{ckpt_dir} holds no complete checkpoint")
    if items is None:
        details = "; ".join(f"round {step}: {why}" for step, why in damaged)
        raise CheckpointError(f"no checkpoint in {ckpt_dir} could be restored ({details}); {_HINT}")
    names = []
    for step, why in damaged:
        name = _set_aside(ckpt_dir, step) if set_aside else str(step)
        names.append(name)
        if log is not None:
            kept = f"set aside as {name}" if set_aside else "skipped"
            log(f"checkpoint {ckpt_dir} round {step} is damaged ({why}); {kept}, resuming from round {saved.round}")
    # A metric added after the checkpoint was written (e.g. model_sq_norm) comes back as NaN, so an
    # older run still resumes; the rounds it trains from here on record it.
    missing = np.full(np.shape(items.history["round"]), np.nan, np.float32)
    history = {name: np.asarray(items.history.get(name, missing)) for name in Metrics._fields}
    metrics = Metrics(**history)
    state = _unstorable(items.state, like_state)
    return Restored(state, metrics, saved.wall_time, saved.walls, saved.round, tuple(names))


def _remove_unfinished(ckpt_dir: str) -> None:
    """Deletes the steps a failed save left unfinished (``<R>.orbax-checkpoint-tmp*``)."""
    if not os.path.isdir(ckpt_dir):
        return
    for name in os.listdir(ckpt_dir):
        if ".orbax-checkpoint-tmp" in name and _is_ours(name):
            shutil.rmtree(os.path.join(ckpt_dir, name), ignore_errors=True)


def _set_aside(ckpt_dir: str, step: int) -> str:
    """Renames the step folder ``<step>`` to the first free ``<step>.damaged[-K]``; returns the name."""
    name, k = f"{step}.damaged", 1
    while os.path.exists(os.path.join(ckpt_dir, name)):
        k += 1
        name = f"{step}.damaged-{k}"
    os.rename(os.path.join(ckpt_dir, str(step)), os.path.join(ckpt_dir, name))
    return name


def _is_ours(name: str) -> bool:
    """A name orbax gives a step of this module's manager: ``<R>``, ``<R>.orbax-checkpoint-tmp*``
    (unfinished), or ``<R>.damaged*`` (set aside by :func:`restore`)."""
    step = name.split(".", 1)[0]
    rest = name[len(step) :]
    return step.isdigit() and (rest == "" or rest.startswith((".orbax-checkpoint-tmp", ".damaged")))


def foreign_files(ckpt_dir: str) -> list[str]:
    """The entries of ``ckpt_dir`` that jaxgossip did not write (sorted names; [] if none or no folder)."""
    if not os.path.isdir(ckpt_dir):
        return []
    return sorted(name for name in os.listdir(ckpt_dir) if not _is_ours(name))


def clear(ckpt_dir: str) -> None:
    """Deletes every checkpoint in ``ckpt_dir`` (a run started over with ``--no-resume``; in a
    multi-process run process 0 calls it), and the folder if nothing else is left.

    Raises:
      CheckpointError: ``ckpt_dir`` holds entries jaxgossip did not write (named in the message);
        nothing is deleted then.
    """
    if not os.path.isdir(ckpt_dir):
        return
    foreign = foreign_files(ckpt_dir)
    if foreign:
        raise CheckpointError(
            f"--no-resume would delete the checkpoints in {ckpt_dir}, which also holds files jaxgossip did not "
            f"write: {', '.join(foreign)}; move them elsewhere or give another --out (nothing was deleted)"
        )
    for name in os.listdir(ckpt_dir):
        path = os.path.join(ckpt_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    os.rmdir(ckpt_dir)


def _norm(value):
    """JSON round-trip so tuples and lists compare equal."""
    return json.loads(json.dumps(value))
