"""Checkpoints of a training run with orbax (edge module: file I/O).

A checkpoint directory holds ``state/`` (the full :class:`~jaxgossip.train.TrainState`: params,
normalization statistics, optimizer and communication state, RNG key, round counter, bits),
``metrics.npz`` (the metrics recorded so far) and ``meta.json`` (the config and wall time).
Restoring checks the config matches, so a checkpoint is never silently continued with another run.
"""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np

__all__ = ["save", "restore", "exists", "CheckpointError"]

# Fields that may change between the interrupted and the resumed run.
_RESUMABLE_CHANGES = {"num_rounds", "evals_per_chunk", "name"}


class CheckpointError(ValueError):
    """A checkpoint is unreadable or belongs to another configuration."""


def exists(ckpt_dir: str) -> bool:
    """Whether ``ckpt_dir`` holds a complete checkpoint (its meta.json is written last)."""
    return os.path.exists(os.path.join(ckpt_dir, "meta.json"))


def save(ckpt_dir: str, state, metrics, wall_time: float, config: dict) -> None:
    """Writes state, metrics and meta; the previous checkpoint is replaced only once the new one is
    complete (written to a sibling directory first)."""
    import orbax.checkpoint as ocp

    ckpt_dir = os.path.abspath(ckpt_dir)
    tmp = ckpt_dir + ".tmp"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(os.path.join(tmp, "state"), jax.device_get(state))
    checkpointer.wait_until_finished()
    arrays = {name: np.asarray(value) for name, value in metrics._asdict().items()}
    np.savez(os.path.join(tmp, "metrics.npz"), **arrays)
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump({"config": config, "wall_time": wall_time, "round": int(np.asarray(state.round))}, f)
    if os.path.exists(ckpt_dir):
        shutil.rmtree(ckpt_dir)
    os.replace(tmp, ckpt_dir)


def restore(ckpt_dir: str, like_state, config: dict):
    """Restores ``(state, metrics, wall_time)`` saved by :func:`save`.

    Args:
      ckpt_dir: the checkpoint directory.
      like_state: a state of the same structure (e.g. ``trainer.init(key)``) used as the target.
      config: the current run's config; it must match the saved one except for
        ``num_rounds``/``evals_per_chunk``/``name``.

    Raises:
      CheckpointError: unreadable files, or a saved config that differs (the message names the keys).
    """
    import orbax.checkpoint as ocp

    from jaxgossip.train import Metrics

    ckpt_dir = os.path.abspath(ckpt_dir)
    try:
        with open(os.path.join(ckpt_dir, "meta.json")) as f:
            meta = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"checkpoint {ckpt_dir} is unreadable (meta.json): {err}") from None
    saved = meta.get("config", {})
    differing = sorted(
        k
        for k in set(saved) | set(config)
        if k not in _RESUMABLE_CHANGES and _norm(saved.get(k)) != _norm(config.get(k))
    )
    if differing:
        details = ", ".join(f"{k}: saved {saved.get(k)!r} vs now {config.get(k)!r}" for k in differing)
        raise CheckpointError(
            f"checkpoint {ckpt_dir} belongs to another configuration ({details}); use another --out or "
            "delete the checkpoint to start over"
        )
    try:
        target = jax.tree_util.tree_map(lambda x: np.asarray(x), jax.device_get(like_state))
        state = ocp.StandardCheckpointer().restore(os.path.join(ckpt_dir, "state"), target)
        with np.load(os.path.join(ckpt_dir, "metrics.npz")) as npz:
            metrics = Metrics(**{name: npz[name] for name in Metrics._fields})
    except Exception as err:  # orbax raises a variety of errors on corrupt or mismatched trees
        raise CheckpointError(f"checkpoint {ckpt_dir} could not be restored: {type(err).__name__}: {err}") from None
    state = jax.tree_util.tree_map(lambda like, x: jax.numpy.asarray(x, dtype=like.dtype), like_state, state)
    return state, metrics, float(meta.get("wall_time", 0.0))


def _norm(value):
    """JSON round-trip so tuples and lists compare equal."""
    return json.loads(json.dumps(value))
