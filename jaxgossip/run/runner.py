"""The edge between configs and the pure library: build a run from a config, execute it in chunks
with progress, checkpoints and outputs. File I/O and printing live here and in ``jaxgossip.cli`` only.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip import data, models, topology
from jaxgossip.engine import outer
from jaxgossip.engine.streaming import Streaming
from jaxgossip.engine.training import Metrics, Trainer, TrainState, check_finite, make_train
from jaxgossip.ops import precision, sharding
from jaxgossip.run.config import TrainConfig
from jaxgossip.run.groups import async_form_of, network_of, time_model_of
from jaxgossip.run.resolve import Resolved, make_algorithm, make_optimizer, resolve
from jaxgossip.run.watchdog import DivergenceError, WatchdogAlarm, check_consensus, check_divergence

__all__ = [
    "TrainConfig",
    "Built",
    "build",
    "make_trainer",
    "run_training",
    "TrainingResult",
    "run_summary",
    "write_metrics",
    "json_safe",
    "metrics_to_rows",
    "load_config",
    "config_from_dict",
    "consensus_watchdog",
]


def config_from_dict(values: dict, base: TrainConfig | None = None) -> TrainConfig:
    """Applies a mapping of field values (from a file, Python or ``{"key": "value"}`` overrides) to
    ``base``, type-checked as the command line is (``jaxgossip.run.parsing``); dotted keys such as
    ``algorithm_options.gamma`` are merged into the mapping fields.

    Raises:
      ValueError: an unknown key (with a suggestion) or a value of the wrong type.
    """
    from jaxgossip.run.parsing import from_dict

    return from_dict(TrainConfig, values, base or TrainConfig())


def load_config(path: str | None, overrides: dict | None = None) -> TrainConfig:
    """Reads a YAML, JSON or Python config (a ``get_config()`` returning a mapping or TrainConfig;
    ``file.py:ARG`` for ``get_config(ARG)``) and applies ``overrides``; the result is not yet checked
    (see :func:`jaxgossip.run.resolve.check_train_config`)."""
    from jaxgossip.run.config_files import read_config_file
    from jaxgossip.run.parsing import from_dict

    config = TrainConfig()
    if path:
        config = from_dict(TrainConfig, read_config_file(path), config, source=f"config file {path!r}")
    if overrides:
        config = config_from_dict(overrides, config)
    return config


class Built(NamedTuple):
    """A configured run: the resolved objects, the trainer and what reports need.

    Attributes:
      resolved: the :class:`jaxgossip.run.resolve.Resolved` run (config, graph, algorithm, clock,
        data, model, ...).
      trainer: the run's :class:`jaxgossip.engine.training.Trainer`.
      histograms: float [N, C], each node's label (or text source) counts.
      num_params: parameters of one node's model.
    """

    resolved: Resolved
    trainer: Trainer
    histograms: np.ndarray
    num_params: int

    @property
    def config(self) -> TrainConfig:
        return self.resolved.config

    @property
    def dataset(self) -> data.Dataset:
        return self.resolved.dataset

    @property
    def topology(self) -> topology.Topology:
        return self.resolved.topology

    @property
    def algorithm(self) -> Any:
        return self.resolved.algorithm

    @property
    def mesh(self) -> Any:
        return self.resolved.mesh


def make_trainer(config: TrainConfig, resolved: Resolved) -> tuple[Trainer, Any]:
    """The trainer of ``config`` on a resolved run. With ``config`` the resolved config itself the
    trainer takes the resolved algorithm, clock and optimizer; another config (a sweep point, whose
    learning rate, weight decay or gamma-like algorithm options may be traced values inside
    ``vmap``) builds those three from its own values on the resolved graph, data and model. With
    ``execution="async"`` it is :func:`jaxgossip.engine.asynchronous.training.make_async_train` (the
    schedule planned from ``seed``) and there is no synchronous algorithm (None)."""
    if config is not resolved.config:
        resolved = _for_point(config, resolved)
    eval_size = min(config.eval_size, resolved.dataset.y_test.shape[0])
    eval_data = (resolved.dataset.x_test[:eval_size], resolved.dataset.y_test[:eval_size])
    model_fns = precision.mixed_precision(models.as_model_fns(resolved.model), config.precision)
    augment = data.augment_cifar if config.augment else None
    if config.execution == "async":
        from jaxgossip.engine.asynchronous import training as async_training

        trainer = async_training.make_async_train(
            model_fns,
            resolved.topology,
            resolved.shards,
            eval_data,
            resolved.optimizer,
            algorithm=resolved.async_form,
            time=resolved.time,
            key=jax.random.key(config.seed),
            num_rounds=config.num_rounds,
            batch_size=config.batch_size,
            eval_every=config.eval_every,
            identical_init=config.identical_init,
            augment=augment,
            eval_chunk=min(config.eval_chunk, eval_size),
            rate_compensation=config.async_rate_compensation,
        )
        return trainer, None
    trainer = make_train(
        model_fns,
        resolved.algorithm,
        resolved.shards,
        eval_data,
        resolved.optimizer,
        num_rounds=config.num_rounds,
        batch_size=config.batch_size,
        eval_every=config.eval_every,
        ordering=config.ordering,
        identical_init=config.identical_init,
        augment=augment,
        eval_chunk=min(config.eval_chunk, eval_size),
        node_batch=resolved.choices.node_batch,
        local_steps=config.local_steps,
        time=resolved.time,
        outer=outer.make_outer_optimizer(config.outer_optimizer, config.outer_lr, config.outer_momentum),
        outer_message=config.outer_message,
        streaming=streaming_of(config),
        outer_message_bits=config.outer_message_bits,
    )
    return trainer, resolved.algorithm


def streaming_of(config: TrainConfig) -> Streaming | None:
    """The Streaming DiLoCo options of ``config``; None for one fragment without overlap (DiLoCo)."""
    if config.outer_fragments == 1 and config.outer_overlap == 0:
        return None
    return Streaming(config.outer_fragments, config.outer_overlap, config.outer_mix)


def _for_point(config: TrainConfig, resolved: Resolved) -> Resolved:
    """``resolved`` with the clock, optimizer and algorithm (or asynchronous form) of a sweep point
    ``config``, built from its own, possibly traced, values on the resolved graph."""
    asynchronous = config.execution == "async"
    return resolved._replace(
        config=config,
        time=time_model_of(config, resolved.topology, network_of(config), resolved.time.available),
        optimizer=make_optimizer(config),
        async_form=async_form_of(config) if asynchronous else None,
        algorithm=None
        if asynchronous
        else precision.with_message_dtype(make_algorithm(config, resolved.topology), config.message_dtype),
    )


def build(config: TrainConfig | Resolved, dataset: data.Dataset | None = None, platform: str | None = None) -> Built:
    """The run of ``config`` (resolved here, :func:`jaxgossip.run.resolve.resolve`, unless already a
    :class:`Resolved`) with its trainer for ``platform`` (None: the backend JAX runs on; another
    platform's build lowers and exports, e.g. ``jax.export`` for ``"cuda"``, but runs only there)."""
    resolved = config if isinstance(config, Resolved) else resolve(config, dataset, platform)
    trainer, _ = make_trainer(resolved.config, resolved)
    one = jax.eval_shape(lambda: trainer.init(jax.random.key(0)).params)
    num_params = sum(int(np.prod(leaf.shape[1:])) for leaf in jax.tree_util.tree_leaves(one))
    labels, num_labels = data.partition_labels(resolved.dataset)  # sources of a text data set
    hist = data.label_histograms(labels, resolved.parts, num_labels)
    return Built(resolved, trainer, hist, num_params)


def metrics_to_rows(metrics: Metrics, local_steps: int = 1, perplexity: bool = False) -> list[dict]:
    """Metrics (stacked over evaluation points) as a list of flat dict rows for CSV/JSON; each row
    also says ``local_step = round * local_steps``, the local optimizer steps each node has done.
    With ``perplexity`` (next-token models) each row has ``perplexity = exp(test_loss)`` of the
    averaged model and ``node_perplexity = exp(node_loss_mean)`` (exp of the nodes' mean loss, the
    geometric mean of their perplexities)."""
    arrays = {name: np.asarray(value) for name, value in metrics._asdict().items()}
    rows = []
    for i in range(arrays["round"].shape[0]):
        row = {}
        for name, value in arrays.items():
            if name == "bits":
                row["bits_mean"] = float(value[i].mean())
                row["bits_max"] = float(value[i].max())
                row["MB_per_node"] = float(value[i].mean() / 8e6)
            elif name == "round":
                row[name] = int(value[i])
                row["local_step"] = int(value[i]) * int(local_steps)
            elif value.dtype == object:  # a field the run does not record (None): no sim_time untimed
                continue
            else:
                row[name] = float(value[i])
        if perplexity:
            row["perplexity"] = math.exp(min(row["test_loss"], 700.0))
            row["node_perplexity"] = math.exp(min(row["node_loss_mean"], 700.0))
        rows.append(row)
    return rows


def _with_wall(rows: list[dict], walls: list[float]) -> list[dict]:
    """Adds the cumulative wall time (seconds at the end of each row's chunk, compile included in
    the first chunk; for rows restored from a checkpoint, the time saved with them) to the rows."""
    for row, wall in zip(rows, walls, strict=True):
        row["wall_time"] = wall
    return rows


def _concat(parts: list[Metrics]) -> Metrics:
    return jax.tree_util.tree_map(lambda *xs: np.concatenate([np.asarray(x) for x in xs]), *parts)


def json_safe(value: Any) -> Any:
    """``value`` with NaN and infinities (a diverged loss) as JSON null, so that the files stay strict
    JSON, and NumPy scalars as Python numbers."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _replace_file(path: str, write: Callable[[Any], None], newline: str | None = None) -> None:
    """Writes ``path`` through a temporary sibling and an atomic rename: a reader (or a killed
    process) sees the old file or the new one, never half of one."""
    tmp = path + ".tmp"
    with open(tmp, "w", newline=newline) as f:
        write(f)
    os.replace(tmp, path)


def write_metrics(out_dir: str, rows: list[dict], extra: dict) -> None:
    """Writes ``metrics.json`` (``{"rows": rows, **extra}``, non-finite numbers as null) and
    ``metrics.csv`` (one line per row) under ``out_dir``, each replaced atomically."""
    payload = json_safe({"rows": rows, **extra})
    _replace_file(os.path.join(out_dir, "metrics.json"), lambda f: json.dump(payload, f, indent=1, allow_nan=False))
    if rows:
        fields = list(dict.fromkeys(k for row in rows for k in row))

        def write_csv(f):
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)

        _replace_file(os.path.join(out_dir, "metrics.csv"), write_csv, newline="")


class TrainingResult(NamedTuple):
    """What :func:`run_training` returns.

    Attributes:
      built: the :class:`Built` run (config, trainer, dataset, topology, ...).
      metrics: ``Metrics`` of every evaluation point (leaves [M, ...]), None if none ran.
      rows: :func:`metrics_to_rows` of ``metrics`` with ``wall_time`` and ``phase`` ("train"), plus
        one "merged" row after a final merge: the rows of ``metrics.json``.
      state: the final ``TrainState`` (after the final merge, if any).
      wall_time: s, compute time of the whole run (all sessions of a resumed run).
      finished: whether all ``num_rounds`` rounds are done.
      start_round: the round this call started from (0, or the round of the restored checkpoint).
      watchdog: the consensus watchdog's alarm (:func:`consensus_watchdog`), or None if it stayed
        quiet.
    """

    built: Built
    metrics: Metrics | None
    rows: list
    state: TrainState
    wall_time: float
    finished: bool
    start_round: int
    watchdog: WatchdogAlarm | None = None


def consensus_watchdog(config: TrainConfig, metrics: Metrics | None) -> WatchdogAlarm | None:
    """The consensus watchdog (:func:`jaxgossip.run.watchdog.check_consensus`) over a run's recorded
    metrics: consensus distance against its running minimum after the learning-rate warm-up, and
    against the averaged model's squared norm. Host-side, on metrics already fetched."""
    if metrics is None:
        return None
    return check_consensus(
        metrics.consensus, metrics.round, model_sq_norm=metrics.model_sq_norm, start_round=config.warmup_rounds
    )


def run_summary(result: TrainingResult) -> dict:
    """The run-level fields written next to the rows of ``metrics.json``."""
    built = result.built
    return {
        "data_source": built.dataset.source,
        "topology": built.topology.name,
        "num_params": built.num_params,
        "local_steps": built.trainer.local_steps,
        "wall_time": result.wall_time,
        "watchdog": None if result.watchdog is None else result.watchdog.to_dict(),
    }


def _final_merge(built: Built, state: TrainState, train_loss: float) -> tuple[TrainState, dict]:
    """Runs the final merge phase (R communication rounds or exact averaging, bits counted) and
    evaluates the merged models. Not checkpointed: it is applied to the finished run."""
    merge_fn = jax.jit(built.resolved.merge)
    params, comm_state, info = merge_fn(state.params, state.comm_state)
    state = state._replace(params=params, comm_state=comm_state, bits=state.bits + info.bits)
    from jaxgossip.ops.sharding import to_host

    point = to_host(jax.jit(built.trainer.evaluate)(state, jnp.float32(train_loss)))
    lm = models.is_sequence_model(built.config.model)
    point = jax.tree_util.tree_map(lambda x: np.asarray(x)[None], point)
    row = metrics_to_rows(point, built.trainer.local_steps, lm)[0]
    return state, row


def _sq_norm_of_mean(params) -> float:
    """``||mean_i x_i||^2`` summed over leaves [N, ...] (the initial averaged model's squared norm)."""
    means = (jnp.mean(leaf.astype(jnp.float32), axis=0) for leaf in jax.tree_util.tree_leaves(params))
    return float(sum(jnp.sum(jnp.square(mean)) for mean in means))


def run_training(
    config: TrainConfig | Resolved,
    out_dir: str | None = None,
    *,
    resume: bool = True,
    progress: bool = True,
    stop_after_chunks: int | None = None,
    dataset: data.Dataset | None = None,
    log: Callable[[str], None] = print,
) -> TrainingResult:
    """Runs a configured training in chunks of ``evals_per_chunk`` evaluation intervals; ``config``
    is a :class:`TrainConfig` (resolved here) or a :class:`jaxgossip.run.resolve.Resolved` run.

    With ``out_dir``, after every chunk ``metrics.json``/``metrics.csv`` are rewritten and a
    checkpoint of the full state is saved under ``out_dir/checkpoint`` (:mod:`jaxgossip.run.checkpoint`:
    one atomic orbax step per chunk, so a process killed at any instant resumes from the last
    complete one). With ``resume=True`` a later call continues from the newest checkpoint and ends
    bit-identical to an uninterrupted run; the checkpoint is checked against ``config`` before
    anything under ``out_dir`` is written, so a refused resume (:class:`CheckpointError`: another
    config, or ``num_rounds`` below the rounds done) changes no file. A finished run called again
    with the same config resumes to the same result without training. ``resume=False`` deletes the
    checkpoint and starts over. ``stop_after_chunks`` interrupts deliberately (tests, preemptible
    jobs). With ``config.tensorboard`` the rows are also written as TensorBoard scalars under
    ``out_dir/tensorboard`` (:func:`jaxgossip.run.metric_writers.write_tensorboard`).
    """
    from jaxgossip.run import checkpoint, distributed

    # In a multi-process run every process trains (one SPMD program) and takes part in the orbax
    # checkpoints, but only process 0 logs and writes the other files.
    primary = distributed.is_primary()
    if not primary:
        log, progress, write_dir = (lambda message: None), False, None
    else:
        write_dir = out_dir
    built = build(config, dataset)
    config = built.config
    trainer = built.trainer
    lm = models.is_sequence_model(config.model)  # rows get perplexities
    config_dict = config.to_dict()
    ckpt_dir = os.path.join(out_dir, "checkpoint") if out_dir else None
    saved = checkpoint.latest(ckpt_dir) if ckpt_dir and resume else None
    if saved is not None:
        checkpoint.check_resume(saved, config_dict, ckpt_dir)  # before anything is written
    log(f"data: {built.dataset.source}")
    form = built.resolved.async_form
    what = config.algorithm if form is None else f"{config.algorithm} ({form}, async)"
    log(
        f"run: {what} on {built.topology.name}, {config.num_nodes} nodes, model {config.model} "
        f"({built.num_params:,} params/node), partition {config.partition}, {config.num_rounds} rounds"
    )
    state = trainer.init(jax.random.key(config.seed))
    if built.mesh is not None:
        state = sharding.shard_nodes(state, built.mesh, config.num_nodes)
    initial_sq_norm = _sq_norm_of_mean(state.params)  # the reference of the divergence check, also on resume
    done_evals, parts, wall, walls = 0, [], 0.0, []
    if saved is not None:  # before any write: a failed restore leaves the folder as it was
        restored = checkpoint.restore(ckpt_dir, state, config_dict, set_aside=primary, log=log)
        state, parts, wall, walls = restored.state, [restored.metrics], restored.wall_time, list(restored.walls)
        done_evals = restored.round // config.eval_every
        log(f"resumed from {ckpt_dir} at round {restored.round}")
    if out_dir:
        if write_dir:
            os.makedirs(out_dir, exist_ok=True)
            if not resume:
                checkpoint.clear(ckpt_dir)
            _replace_file(os.path.join(out_dir, "config.json"), lambda f: json.dump(config_dict, f, indent=1))
        distributed.barrier("jaxgossip_run_training_out_dir")
    start_round = done_evals * config.eval_every

    per_chunk = max(1, config.evals_per_chunk)
    total = trainer.num_evals
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=config.num_rounds,
            initial=start_round,
            desc=config.name or config.algorithm,
            unit="round",
            leave=False,
        )
    chunks_run = 0
    alarm = None
    extra = {
        "data_source": built.dataset.source,
        "topology": built.topology.name,
        "num_params": built.num_params,
        "local_steps": trainer.local_steps,
    }
    try:
        while done_evals < total:
            if stop_after_chunks is not None and chunks_run >= stop_after_chunks:
                break
            n = min(per_chunk, total - done_evals)
            start = time.perf_counter()
            state, chunk_metrics = trainer.run_chunk(state, n)
            if built.mesh is not None:
                # Every chunk starts from the layout a restored state has, so a resumed run runs the
                # same executable as an uninterrupted one (the compiler may lay a chunk's output out
                # otherwise, e.g. replicated after a kernel without a partitioning rule).
                state = sharding.shard_nodes(state, built.mesh, config.num_nodes)
            jax.block_until_ready(state)
            wall += time.perf_counter() - start
            chunk_metrics = sharding.to_host(chunk_metrics)
            parts.append(chunk_metrics)
            walls.extend([wall] * n)
            done_evals += n
            chunks_run += 1
            if alarm is None:
                alarm = consensus_watchdog(config, _concat(parts))
                if alarm is not None:  # once per run, as soon as the chunk that shows it is done
                    log(f"warning: {alarm.message}")
                    extra["watchdog"] = alarm.to_dict()
            if write_dir:
                rows = _with_wall(metrics_to_rows(_concat(parts), trainer.local_steps, lm), walls)
                write_metrics(out_dir, rows, {**extra, "wall_time": wall})
            so_far = _concat(parts)
            divergence = check_divergence(
                so_far.round,
                train_loss=so_far.train_loss,
                model_sq_norm=so_far.model_sq_norm,
                consensus=so_far.consensus,
                initial_sq_norm=initial_sq_norm,
            )
            if divergence is not None:  # before the save: the last good checkpoint stays the newest
                raise DivergenceError(divergence)
            check_finite(chunk_metrics)
            if ckpt_dir:
                checkpoint.save(ckpt_dir, state, _concat(parts), walls, config_dict)
            if bar is not None:
                last = metrics_to_rows(chunk_metrics, trainer.local_steps, lm)[-1]
                bar.set_postfix(loss=f"{last['train_loss']:.3f}", acc=f"{last['test_acc']:.3f}")
                bar.update(n * config.eval_every)
    finally:
        if bar is not None:
            bar.close()
    metrics = _concat(parts) if parts else None
    rows = _with_wall(metrics_to_rows(metrics, trainer.local_steps, lm), walls) if metrics is not None else []
    for row in rows:
        row["phase"] = "train"
    if done_evals >= total and built.config.final_merge is not None and rows:  # None, R rounds or "exact"
        state, merged = _final_merge(built, state, float(rows[-1]["train_loss"]))
        rows.append(dict(merged, phase="merged"))
        log(f"final merge ({built.config.final_merge}): acc {merged['test_acc']:.4f}")
    if alarm is None:  # a resumed run that was already finished ran no chunk here
        alarm = consensus_watchdog(config, metrics)
    result = TrainingResult(built, metrics, rows, state, wall, done_evals >= total, start_round, alarm)
    if write_dir:
        write_metrics(out_dir, rows, run_summary(result))
        if getattr(config, "tensorboard", False):
            from jaxgossip.run.metric_writers import write_tensorboard

            write_tensorboard(os.path.join(out_dir, "tensorboard"), rows)
    return result
