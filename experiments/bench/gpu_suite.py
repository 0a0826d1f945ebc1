"""GPU suite: everything a lent accelerator should measure, in one run of under 8 minutes, one report.

Sections (each timed with the compile reported apart: ``jax.jit(...).lower(...).compile()`` is
timed on its own, then one warm-up call is excluded and the median of ``reps`` calls is kept):

* ``training``: N = 32 CIFAR ResNet-20 nodes (``make_model("resnet20")``, batch norm, 272 474
  parameters each), SGD + Nesterov, plain gossip on ``exponential(32)``, batch 32 per node, on
  32x32x3 synthetic blob images (``data.make_synthetic``; no data set needed). The trainer's
  ``run_chunk`` of R rounds with a 32-sample evaluation, minus the separately timed evaluation
  (unless that is not small against the chunk: ``eval_subtracted``), gives ms/round and
  rounds/s. FLOPs per round are XLA's ``cost_analysis`` of the jitted, vmapped forward + backward
  pass of all N nodes on one batch (what the round computes, less the optimizer and the gossip,
  < 1 %; so achieved TFLOP/s is a slight underestimate); next to it the cost
  model's count, ``jaxgossip.run.cost_report.step_flops_and_memory`` (one node's step, x N), which
  ``jaxgossip train --energy.flop`` prices. Peak memory from XLA's ``memory_analysis``.
* ``mix_bandwidth``: one ``jaxgossip.mix`` round on [N, D] float32 (N = 32, D = 4e6: 512 MB) on
  ``ring``, ``exponential`` and ``one_peer_exponential`` (traced round counter), against ``x * s``
  (a plain copy of the same bytes XLA cannot elide), both R rounds inside one jitted
  ``lax.fori_loop`` as in a training scan. Bytes as in ``experiments/bench_mixing.py``: mix
  (K + 1) N D 4 (K slot reads incl. self, one write), copy 2 N D 4; ratio = GB/s(mix) / GB/s(copy).
* ``compressed``: one round of gossip, Choco-SGD top-1 % (gamma 0.0375) and PowerGossip rank 1
  (flax kernel view) on ResNet-20-shaped params (65 leaves) of N = 32 nodes on ``ring(32)``, and
  their ratio to a plain mix round of the same params (as ``experiments/bench_communication.py``).
* ``consensus``: ``jaxgossip.consensus_scan`` (the core of ``run_consensus``) of gossip on
  ``ring(1024)`` and ``one_peer_exponential(1024)``, D = 10 000 floats per node, S = 100 rounds,
  whole scan timed; the one-peer schedule must reach exact averaging (error ~ 0) after 10 rounds.
* ``transformer``: the byte-level decoder-only LM (depth 4, width 256, 4 heads, context 128) on
  ``python_docs`` split by source, AdamW, gossip on ``exponential(N)``, N = 8 and 32, batch 16
  sequences per node: ms/round, tokens/s, peak memory.
* ``many_nodes``: 1,024 nodes of the default MLP on the embedded digits (batch 1 per node), gossip on
  ``one_peer_exponential(1024)``: a run whose node axis, not its model, is large.
* ``million_nodes``: the rounds of ``experiments/bench/million_nodes.py`` (``jaxgossip.mix`` of a
  stochastic graph's fresh draw or W(t mod T), D = 4, 20 rounds in one ``fori_loop``) at N = 2^20,
  2^22, 2^24, 2^26 for ring, exponential, hypercube, one_peer_exponential and random_matching, with
  the host build time, a copy-like loop and the floor (E D 4 bytes read, N D 4 written, at the
  copy's bandwidth). Sizes that would not fit half the free device memory or half the host memory,
  or would pass the budget, are listed as skipped. Alone: ``--sections million_nodes --budget 300``.

A time budget guards the lent machine (``--budget``, default 420 s of the script's own time): before
each section its estimated cost is compared with the time left, and a section that would overrun is
skipped with a note; a section that fails is recorded with its error and the rest still run. The
report (``gpu_suite.json`` + ``gpu_suite.md`` under ``--out``) is rewritten after every section, so
even a run killed from outside (``timeout 480 ...``) leaves the sections done.

``--smoke`` runs every section at tiny sizes on whatever backend is there (the default MLP instead
of ResNet-20 in ``training``, a few small leaves instead of ResNet-20 in ``compressed``): seconds on
CPU, for the test (tests/project/test_gpu_suite.py) and to try the script before spending GPU time. Without
a GPU and without ``--smoke`` it prints one SKIPPED line and exits 0.

It runs from a checkout, without installing jaxgossip, on an offline image with JAX (CUDA), flax,
optax, orbax, NumPy, SciPy, networkx, scikit-learn and PyYAML: tensorflow-datasets, jsonargparse and
tensorboardX are not needed (the data are synthetic, the embedded digits and python_docs). On a GPU
machine, from the repository root (the budget ends the sections by 7 minutes; ``timeout`` is the
backstop, and the report keeps what finished):

  PYTHONPATH=. timeout 480 python3 experiments/bench/gpu_suite.py --out runs/gpu_suite

Anywhere, in under a minute on CPU: ``PYTHONPATH=. python3 experiments/bench/gpu_suite.py --smoke
--out /tmp/gpu_suite``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _benchlib import compiled_bytes, compiled_flops, header_line, machine_info  # noqa: E402
from _common import resnet20_shapes  # noqa: E402  (experiments/ is on sys.path through _benchlib)

import jaxgossip as jg  # noqa: E402
from jaxgossip import data  # noqa: E402
from jaxgossip import topology as T  # noqa: E402
from jaxgossip.engine.consensus import consensus_scan  # noqa: E402
from jaxgossip.models.adapters import linen_model_fns  # noqa: E402
from jaxgossip.run.cost_report import step_flops_and_memory  # noqa: E402
from jaxgossip.run.resolve import resolve  # noqa: E402
from jaxgossip.run.runner import TrainConfig, make_trainer  # noqa: E402

SECTIONS = ("training", "mix_bandwidth", "compressed", "consensus", "transformer", "many_nodes", "million_nodes")
MILLION_FAMILIES = ("ring", "exponential", "hypercube", "one_peer_exponential", "random_matching")
BYTES = 4  # float32


class Sizes(NamedTuple):
    """Problem sizes of one mode (full on a GPU, smoke anywhere)."""

    train_model: str
    train_shape: tuple  # one input image
    train_nodes: int
    train_batch: int
    train_rounds: int  # per timed chunk
    mix_nodes: int
    mix_dim: int
    mix_rounds: int  # per timed call
    comm_nodes: int
    comm_rounds: int
    consensus_nodes: int
    consensus_dim: int
    consensus_steps: int
    lm_nodes: tuple  # node counts of the transformer section
    lm_options: dict  # the transformer's model options
    lm_batch: int
    lm_rounds: int
    many_nodes: int  # the small-model run with many nodes
    many_rounds: int
    million_log2: tuple  # log2 N of the million_nodes section
    million_dim: int
    million_rounds: int
    reps: int
    estimate_s: dict  # section -> seconds it is expected to take (compile included), for the budget


FULL = Sizes(
    train_model="resnet20",
    train_shape=(32, 32, 3),
    train_nodes=32,
    train_batch=32,
    train_rounds=20,
    mix_nodes=32,
    mix_dim=4_000_000,
    mix_rounds=20,
    comm_nodes=32,
    comm_rounds=10,
    consensus_nodes=1024,
    consensus_dim=10_000,
    consensus_steps=100,
    lm_nodes=(8, 32),
    lm_options={"depth": 4, "width": 256, "heads": 4, "context": 128},
    lm_batch=16,
    lm_rounds=20,
    many_nodes=1024,
    many_rounds=50,
    million_log2=(20, 22, 24, 26),
    million_dim=4,
    million_rounds=20,
    reps=5,
    # Design estimates for one H200 (compile dominates); not measured yet.
    estimate_s={
        "training": 150.0,
        "mix_bandwidth": 40.0,
        "compressed": 90.0,
        "consensus": 40.0,
        "transformer": 60.0,
        "many_nodes": 40.0,
        "million_nodes": 120.0,
    },
)

SMOKE = Sizes(
    train_model="mlp",
    train_shape=(8, 8, 1),
    train_nodes=2,
    train_batch=4,
    train_rounds=2,
    mix_nodes=4,
    mix_dim=1000,
    mix_rounds=2,
    comm_nodes=4,
    comm_rounds=2,
    consensus_nodes=16,
    consensus_dim=8,
    consensus_steps=5,
    lm_nodes=(2,),
    lm_options={"depth": 1, "width": 16, "heads": 2, "context": 8},
    lm_batch=2,
    lm_rounds=2,
    many_nodes=16,
    many_rounds=2,
    million_log2=(6, 8),
    million_dim=4,
    million_rounds=2,
    reps=2,
    estimate_s={
        "training": 5.0,
        "mix_bandwidth": 2.0,
        "compressed": 3.0,
        "consensus": 1.0,
        "transformer": 5.0,
        "many_nodes": 3.0,
        "million_nodes": 5.0,
    },
)


class Timed(NamedTuple):
    """A compiled function's compile time and the median time of its calls."""

    compile_s: float
    median_s: float
    times_s: list  # every timed call
    compiled: Any  # the compiled executable (for cost and memory analyses)
    output: Any  # the output of the last call


def timed(fn: Callable, args: tuple, reps: int, static_argnums=(), next_args=None) -> Timed:
    """Compiles ``jax.jit(fn)`` for ``args`` (timed apart), runs it once (excluded), then ``reps``
    timed calls; ``next_args(output)`` feeds each call's output back (donated loops), else the
    same ``args`` are reused."""
    jitted = jax.jit(fn, static_argnums=static_argnums)
    start = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    compile_s = time.perf_counter() - start
    dynamic = tuple(a for i, a in enumerate(args) if i not in static_argnums)
    out = jax.block_until_ready(compiled(*dynamic))
    times = []
    for _ in range(reps):
        if next_args is not None:
            dynamic = next_args(out)
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(*dynamic))
        times.append(time.perf_counter() - start)
    return Timed(compile_s, float(np.median(times)), times, compiled, out)


# ---- sections -------------------------------------------------------------------------------------


def section_training(s: Sizes) -> dict:
    n, batch, rounds, eval_size = s.train_nodes, s.train_batch, s.train_rounds, max(8, s.train_batch)
    dataset = data.make_synthetic(num_train=n * batch, num_test=eval_size, shape=s.train_shape, seed=0)
    config = TrainConfig(
        dataset="synthetic",
        num_nodes=n,
        topology="exponential",
        algorithm="gossip",
        model=s.train_model,
        batch_size=batch,
        num_rounds=rounds,
        eval_every=rounds,
        eval_size=eval_size,
        eval_chunk=eval_size,
        lr=0.1,
        seed=0,
    )
    prep = resolve(config, dataset)
    trainer, _ = make_trainer(prep.config, prep)
    state = jax.block_until_ready(jax.jit(trainer.init)(jax.random.key(0)))
    params_per_node = sum(int(leaf[0].size) for leaf in jax.tree_util.tree_leaves(state.params))
    chunk = timed(lambda st: trainer.run_chunk(st, 1), (state,), s.reps)
    evaluate = timed(trainer.evaluate, (state, jnp.float32(0.0)), s.reps)
    # The evaluation is ~1/60 of a chunk at the GPU sizes; where it is not small against the chunk
    # (tiny smoke sizes, timing noise) the difference means nothing and the whole chunk is used.
    eval_subtracted = chunk.median_s - evaluate.median_s > 0.1 * chunk.median_s
    per_round = (chunk.median_s - evaluate.median_s if eval_subtracted else chunk.median_s) / rounds

    # FLOPs of one round's local work: forward + backward of every node on one batch.
    fns = linen_model_fns(prep.model)

    def loss(params, stats, x, y):
        logits, new_stats = fns.apply(params, stats, x, True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), new_stats

    grads = jax.jit(jax.vmap(jax.value_and_grad(loss, has_aux=True)))
    xs = jnp.zeros((n, batch, *s.train_shape), jnp.float32)
    ys = jnp.zeros((n, batch), jnp.int32)
    flops_xla = compiled_flops(grads.lower(state.params, state.batch_stats, xs, ys).compile())
    node_flops, memory_per_node = step_flops_and_memory(prep, True)
    peak = compiled_bytes(chunk.compiled)
    return {
        "model": s.train_model,
        "topology": prep.topology.name,
        "nodes": n,
        "batch_per_node": batch,
        "rounds_per_chunk": rounds,
        "params_per_node": params_per_node,
        "compile_s": chunk.compile_s + evaluate.compile_s,
        "chunk_s": chunk.median_s,
        "eval_s": evaluate.median_s,
        "eval_subtracted": eval_subtracted,
        "ms_per_round": per_round * 1e3,
        "rounds_per_s": 1.0 / per_round,
        "flops_per_round_xla": flops_xla,
        "flops_per_round_cost_model": node_flops * n,
        "achieved_TFLOPs": flops_xla / per_round / 1e12 if flops_xla else None,
        "achieved_TFLOPs_cost_model": node_flops * n / per_round / 1e12 if node_flops else None,
        "peak_MB": peak / 1e6 if peak is not None else None,
        "state_MB_per_node": memory_per_node / 1e6,
    }


def _chunk_timing(config: TrainConfig, dataset, reps: int) -> dict:
    """ms per round of the trainer's chunk of ``config.num_rounds`` rounds (one evaluation at its
    end, timed apart and subtracted as in :func:`section_training`), compile time and peak memory."""
    prep = resolve(config, dataset)
    trainer, _ = make_trainer(prep.config, prep)
    state = jax.block_until_ready(jax.jit(trainer.init)(jax.random.key(0)))
    chunk = timed(lambda st: trainer.run_chunk(st, 1), (state,), reps)
    evaluate = timed(trainer.evaluate, (state, jnp.float32(0.0)), reps)
    eval_subtracted = chunk.median_s - evaluate.median_s > 0.1 * chunk.median_s
    per_round = (chunk.median_s - evaluate.median_s if eval_subtracted else chunk.median_s) / config.num_rounds
    peak = compiled_bytes(chunk.compiled)
    return {
        "topology": prep.topology.name,
        "nodes": config.num_nodes,
        "params_per_node": sum(int(leaf[0].size) for leaf in jax.tree_util.tree_leaves(state.params)),
        "compile_s": chunk.compile_s + evaluate.compile_s,
        "ms_per_round": per_round * 1e3,
        "rounds_per_s": 1.0 / per_round,
        "eval_subtracted": eval_subtracted,
        "peak_MB": peak / 1e6 if peak is not None else None,
    }


def section_transformer(s: Sizes) -> dict:
    """The byte-level transformer LM on python_docs split by source, gossip on ``exponential(N)``,
    AdamW, at each N of ``lm_nodes``."""
    dataset = data.load_dataset("python_docs", context=s.lm_options["context"])
    rows = []
    for n in s.lm_nodes:
        config = TrainConfig(
            dataset="python_docs",
            num_nodes=n,
            partition="by_source",
            topology="exponential",
            algorithm="gossip",
            model="transformer",
            model_options=dict(s.lm_options),
            optimizer="adamw",
            lr=1e-3,
            batch_size=s.lm_batch,
            num_rounds=s.lm_rounds,
            eval_every=s.lm_rounds,
            eval_size=64,
            eval_chunk=64,
            seed=0,
        )
        row = _chunk_timing(config, dataset, s.reps)
        row["tokens_per_s"] = n * s.lm_batch * s.lm_options["context"] * row["rounds_per_s"]
        rows.append(row)
    return {"options": dict(s.lm_options), "batch_per_node": s.lm_batch, "rows": rows}


def section_many_nodes(s: Sizes) -> dict:
    """A small-model run with many nodes: the default MLP on the embedded digits, gossip on
    ``one_peer_exponential(N)``, batch 1 per node (1,437 digits over 1,024 nodes: the node axis,
    not the model, is large)."""
    config = TrainConfig(
        dataset="digits",
        num_nodes=s.many_nodes,
        topology="one_peer_exponential",
        algorithm="gossip",
        model="mlp",
        batch_size=1,
        num_rounds=s.many_rounds,
        eval_every=s.many_rounds,
        eval_size=256,
        eval_chunk=256,
        lr=0.05,
        seed=0,
    )
    return _chunk_timing(config, None, s.reps)


def _round_loop(round_fn: Callable, rounds: int) -> Callable:
    """``x, t0 -> x`` after ``rounds`` rounds ``x <- round_fn(x, t0 + i)`` in a ``fori_loop``."""
    return lambda x, t0: jax.lax.fori_loop(0, rounds, lambda i, x: round_fn(x, t0 + i), x)


def section_mix_bandwidth(s: Sizes) -> dict:
    n, d, rounds = s.mix_nodes, s.mix_dim, s.mix_rounds
    x = jax.jit(lambda key: jax.random.normal(key, (n, d), jnp.float32))(jax.random.key(0))
    size = n * d * BYTES
    # x * s with s = 1 + 1e-7 t traced: nothing to elide or fold across rounds.
    copy = timed(_round_loop(lambda x, t: x * (1.0 + 1e-7 * t.astype(jnp.float32)), rounds), (x, jnp.int32(0)), s.reps)
    copy_s = copy.median_s / rounds
    rows = []
    for topo in (T.ring(n), T.exponential(n), T.one_peer_exponential(n)):
        mix = timed(_round_loop(lambda x, t, topo=topo: jg.mix(topo, x, t), rounds), (x, jnp.int32(0)), s.reps)
        mix_s = mix.median_s / rounds
        k = int(topo.max_slots)
        gbs_mix, gbs_copy = (k + 1) * size / mix_s / 1e9, 2 * size / copy_s / 1e9
        rows.append(
            {
                "topology": topo.name,
                "kernel": str(topo.resolved_kernel),
                "K": k,
                "compile_s": mix.compile_s,
                "mix_ms": mix_s * 1e3,
                "mix_GBs": gbs_mix,
                "copy_ms": copy_s * 1e3,
                "copy_GBs": gbs_copy,
                "ratio": gbs_mix / gbs_copy,
            }
        )
    return {
        "nodes": n,
        "dim": d,
        "MB": size / 1e6,
        "rounds_per_call": rounds,
        "copy_compile_s": copy.compile_s,
        "rows": rows,
    }


def _params(s: Sizes, smoke: bool) -> dict:
    shapes = {"conv": {"kernel": (3, 3, 2, 4)}, "bias": (4,)} if smoke else resnet20_shapes()
    leaves, treedef = jax.tree_util.tree_flatten(shapes, is_leaf=lambda v: isinstance(v, tuple))
    keys = jax.random.split(jax.random.key(0), len(leaves))
    make = jax.jit(
        lambda keys: [jax.random.normal(k, (s.comm_nodes, *shape), jnp.float32) for k, shape in zip(keys, leaves)]
    )
    return jax.tree_util.tree_unflatten(treedef, make(keys))


class _MixOnly(NamedTuple):
    """The baseline as an algorithm: ``x <- W(t) x``, the state is the round counter."""

    init: Callable
    step: Callable


def _mix_only(topo) -> _MixOnly:
    return _MixOnly(lambda x: jnp.zeros([], jnp.int32), lambda x, t, key: (jg.mix(topo, x, t), t + 1, None))


def _alg_loop(alg, rounds: int) -> Callable:
    def run(x, state, key):
        def body(r, carry):
            x, state = carry
            x, state, _ = alg.step(x, state, jax.random.fold_in(key, r))
            return x, state

        return jax.lax.fori_loop(0, rounds, body, (x, state))

    return run


def section_compressed(s: Sizes, smoke: bool) -> dict:
    x = _params(s, smoke)
    topo = T.ring(s.comm_nodes)
    algs = {
        "mix": _mix_only(topo),
        "gossip": jg.algorithms.make("gossip", topo, gamma=1.0),
        "choco top-1%": jg.algorithms.make(
            "choco", topo, gamma=0.0375, compressor="top_k", compressor_options={"fraction": 0.01}
        ),
        "power_gossip r1": jg.algorithms.make("power_gossip", topo, rank=1, gamma=1.308, matrix_view="flax_kernel"),
    }
    key = jax.random.key(1)
    rows = []
    for name, alg in algs.items():
        state = jax.jit(alg.init)(x)
        run = timed(_alg_loop(alg, s.comm_rounds), (x, state, key), s.reps)
        rows.append({"algorithm": name, "compile_s": run.compile_s, "ms_per_round": run.median_s / s.comm_rounds * 1e3})
    base = rows[0]["ms_per_round"]
    for row in rows:
        row["vs_mix"] = row["ms_per_round"] / base
    params = sum(int(np.prod(leaf.shape[1:])) for leaf in jax.tree_util.tree_leaves(x))
    return {
        "params": "a few small leaves (smoke)" if smoke else "ResNet-20 shapes (65 leaves)",
        "params_per_node": params,
        "nodes": s.comm_nodes,
        "topology": topo.name,
        "rounds_per_call": s.comm_rounds,
        "rows": rows,
    }


def section_consensus(s: Sizes) -> dict:
    n, d, steps = s.consensus_nodes, s.consensus_dim, s.consensus_steps
    x0 = {"x": jax.jit(lambda key: jax.random.normal(key, (n, d), jnp.float32))(jax.random.key(0))}
    rows = []
    for topo in (T.ring(n), T.one_peer_exponential(n)):
        alg = jg.algorithms.make("gossip", topo, gamma=1.0)
        run = timed(consensus_scan, (alg, x0, steps, jax.random.key(1)), s.reps, static_argnums=(0, 2))
        error = np.asarray(run.output.error)
        exact_after = int(math.ceil(math.log2(n)))
        rows.append(
            {
                "topology": topo.name,
                "compile_s": run.compile_s,
                "scan_s": run.median_s,
                "ms_per_round": run.median_s / steps * 1e3,
                "error_first": float(error[0]),
                "error_last": float(error[-1]),
                "relative_error_after_log2N": float(error[min(exact_after, steps)] / error[0]),
            }
        )
    return {"nodes": n, "dim": d, "steps": steps, "rows": rows}


# ---- report ----------------------------------------------------------------------------------------


def section_million_nodes(s: Sizes, deadline: float) -> dict:
    """The rounds of experiments/bench/million_nodes.py on the device, N = 2^20 .. 2^26 for
    :data:`MILLION_FAMILIES`; sizes beyond half the free device memory, half the host memory or
    the time left before ``deadline`` are listed as skipped (million_nodes.device_rows)."""
    import million_nodes

    device_bytes = None
    try:
        stats = jax.devices()[0].memory_stats()
        if stats and stats.get("bytes_limit"):
            device_bytes = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    except Exception:  # noqa: BLE001 - not every backend reports memory
        pass
    host_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    rows = million_nodes.device_rows(
        MILLION_FAMILIES,
        s.million_log2,
        s.million_dim,
        s.million_rounds,
        lambda fn, args: timed(fn, args, s.reps),
        deadline,
        device_bytes,
        host_bytes,
    )
    return {"dim": s.million_dim, "rounds_per_call": s.million_rounds, "device_free_bytes": device_bytes, "rows": rows}


def environment() -> dict:
    """Machine, devices and versions (the report's header)."""
    info = machine_info()
    versions = {}
    for package in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "flax", "optax", "numpy"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    devices = jax.devices()
    memory = None
    try:
        stats = devices[0].memory_stats()
        memory = stats.get("bytes_limit") if stats else None
    except Exception:  # noqa: BLE001 - not every backend reports memory
        pass
    return {
        **info,
        "python": platform.python_version(),
        "versions": versions,
        "device_count": len(devices),
        "device0": str(devices[0]),
        "device0_memory_bytes": memory,
        "platform_version": getattr(devices[0].client, "platform_version", None),
        "default_matmul_precision": str(jax.config.jax_default_matmul_precision),
    }


def _fmt(value, spec: str = ".3g") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def _table(rows: list, columns: list) -> list:
    lines = ["| " + " | ".join(c for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(row.get(c)) for c in columns) + " |" for row in rows]
    return lines


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        f"# GPU suite ({report['mode']})",
        "",
        f"Device: {env['device0']} x {env['device_count']} ({env['backend']}), "
        f"memory {_fmt(env['device0_memory_bytes'])} bytes; platform {env['platform_version']}; versions {env['versions']}; Python {env['python']}; "
        f"default matmul precision {env['default_matmul_precision']}; host {env['cpu_model']} ({env['nproc']} CPUs); "
        f"{env['date']}.",
        f"Budget {report['budget_s']:.0f} s, used {report['wall_s']:.1f} s. Times: median of {report['reps']} calls "
        "after one warm-up call; compile timed apart.",
    ]
    for name in SECTIONS:
        sec = report["sections"].get(name)
        if sec is None:
            continue
        lines += ["", f"## {name}: {sec['status']}"]
        if sec["status"] != "ok":
            lines.append(sec.get("note", ""))
            continue
        r = sec["result"]
        if name == "training":
            lines += _table(
                [r],
                [
                    "model",
                    "nodes",
                    "batch_per_node",
                    "ms_per_round",
                    "rounds_per_s",
                    "flops_per_round_xla",
                    "achieved_TFLOPs",
                    "achieved_TFLOPs_cost_model",
                    "peak_MB",
                    "compile_s",
                ],
            )
        elif name == "mix_bandwidth":
            lines.append(
                f"[{r['nodes']}, {r['dim']}] float32 ({r['MB']:.0f} MB), {r['rounds_per_call']} rounds per call."
            )
            lines += _table(
                r["rows"], ["topology", "kernel", "K", "mix_ms", "mix_GBs", "copy_ms", "copy_GBs", "ratio", "compile_s"]
            )
        elif name == "compressed":
            lines.append(
                f"{r['params']}, {r['params_per_node']:,} params per node, {r['nodes']} nodes, {r['topology']}."
            )
            lines += _table(r["rows"], ["algorithm", "ms_per_round", "vs_mix", "compile_s"])
        elif name == "consensus":
            lines.append(f"{r['nodes']} nodes x {r['dim']} floats, {r['steps']} rounds, gossip (gamma 1).")
            lines += _table(
                r["rows"],
                [
                    "topology",
                    "ms_per_round",
                    "scan_s",
                    "error_first",
                    "error_last",
                    "relative_error_after_log2N",
                    "compile_s",
                ],
            )
        elif name == "transformer":
            lines.append(f"transformer {r['options']}, batch {r['batch_per_node']} sequences per node, gossip.")
            lines += _table(
                r["rows"], ["nodes", "params_per_node", "ms_per_round", "tokens_per_s", "peak_MB", "compile_s"]
            )
        elif name == "many_nodes":
            lines += _table([r], ["nodes", "topology", "params_per_node", "ms_per_round", "peak_MB", "compile_s"])
        elif name == "million_nodes":
            lines.append(
                f"x [N, {r['dim']}] float32, {r['rounds_per_call']} rounds per call; floor = E D 4 + N D 4 bytes at the copy bandwidth."
            )
            lines += _table(
                r["rows"],
                [
                    "family",
                    "log2_nodes",
                    "edges",
                    "kernel",
                    "build_s",
                    "compile_s",
                    "ms_per_round",
                    "copy_ms",
                    "floor_ms",
                    "times_floor",
                    "skipped",
                ],
            )
    lines += ["", "Notes:"] + [f"- {note}" for note in report["notes"]]
    return "\n".join(lines) + "\n"


def _json_safe(value):
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_report(report: dict, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    for name, text in (
        ("gpu_suite.json", json.dumps(_json_safe(report), indent=1)),
        ("gpu_suite.md", markdown(report)),
    ):
        tmp = os.path.join(out, name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(out, name))


def run_suite(out: str, *, smoke: bool, budget_s: float, sections=SECTIONS, reps: int | None = None, log=print) -> dict:
    """Runs ``sections`` within ``budget_s`` seconds and writes the report under ``out``; returns it."""
    start = time.perf_counter()
    sizes = SMOKE if smoke else FULL
    if reps is not None:
        sizes = sizes._replace(reps=reps)
    report = {
        "suite": "gpu_suite",
        "mode": "smoke" if smoke else "full",
        "environment": environment(),
        "budget_s": budget_s,
        "reps": sizes.reps,
        "sizes": {k: v for k, v in sizes._asdict().items() if k != "estimate_s"},
        "sections": {},
        "wall_s": 0.0,
        "notes": [
            "FLOPs per round: XLA cost_analysis of the vmapped forward + backward of all nodes on one batch "
            "(optimizer and gossip not counted); cost model: jaxgossip.run.cost_report.step_flops_and_memory x N.",
            "mix bytes (K + 1) N D 4, copy 2 N D 4 (experiments/bench_mixing.py); ratio = GB/s(mix) / GB/s(copy).",
        ],
    }
    if smoke:
        report["notes"].append("SMOKE: tiny sizes (MLP instead of ResNet-20); the numbers are not a measurement.")
    log(header_line(report["environment"]))
    runners = {
        "training": lambda: section_training(sizes),
        "mix_bandwidth": lambda: section_mix_bandwidth(sizes),
        "compressed": lambda: section_compressed(sizes, smoke),
        "consensus": lambda: section_consensus(sizes),
        "transformer": lambda: section_transformer(sizes),
        "many_nodes": lambda: section_many_nodes(sizes),
        # Its own sizes stop at the suite's budget (minus a margin for the report).
        "million_nodes": lambda: section_million_nodes(sizes, start + budget_s - 10.0),
    }
    for name in sections:
        elapsed = time.perf_counter() - start
        estimate = sizes.estimate_s[name]
        if elapsed + estimate > budget_s:
            note = (
                f"skipped: {elapsed:.0f} s used, this section is estimated at {estimate:.0f} s, budget {budget_s:.0f} s"
            )
            report["sections"][name] = {"status": "skipped", "note": note}
            log(f"== {name}: {note}")
        else:
            log(f"== {name} (estimated {estimate:.0f} s, {budget_s - elapsed:.0f} s left)")
            t0, cpu0 = time.perf_counter(), time.process_time()
            try:
                result = runners[name]()
                report["sections"][name] = {
                    "status": "ok",
                    "wall_s": time.perf_counter() - t0,
                    "host_cpu_s": time.process_time() - cpu0,  # tells a busy host apart from slow work
                    "result": result,
                }
            except Exception as err:  # noqa: BLE001 - one failing section must not lose the others
                report["sections"][name] = {
                    "status": "error",
                    "wall_s": time.perf_counter() - t0,
                    "note": f"{type(err).__name__}: {err}",
                    "traceback": traceback.format_exc()[-4000:],
                }
            log(
                f"   {report['sections'][name]['status']} in {time.perf_counter() - t0:.1f} s "
                f"({time.process_time() - cpu0:.1f} s host CPU)"
            )
        report["wall_s"] = time.perf_counter() - start
        write_report(report, out)
    log(markdown(report))
    return report


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/gpu_suite", help="folder of gpu_suite.json and gpu_suite.md")
    parser.add_argument("--smoke", action="store_true", help="every section at tiny sizes, any backend (seconds)")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds; sections that would overrun are skipped")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list from {SECTIONS}")
    parser.add_argument("--reps", type=int, default=None, help="timed calls per measurement (default 5; smoke 2)")
    parser.add_argument("--quick", action="store_true", help="3 timed calls per measurement (run_all.py --quick)")
    parser.add_argument("--json", default=None, help="also write the JSON report to this file (run_all.py)")
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown or not sections:
        parser.error(f"--sections: unknown or empty {unknown}; choose from {list(SECTIONS)}")
    if args.budget <= 0 or (args.reps is not None and args.reps < 1):
        parser.error("--budget must be > 0 and --reps >= 1")
    if jax.default_backend() != "gpu" and not args.smoke:
        msg = (
            f"SKIPPED: this suite needs a GPU (JAX backend is {jax.default_backend()!r}); pass --smoke for a "
            "tiny run of every section"
        )
        print(msg, flush=True)
        report = {"suite": "gpu_suite", "machine": machine_info(), "skipped": msg}
    else:
        reps = args.reps if args.reps is not None else (3 if args.quick and not args.smoke else None)
        report = run_suite(
            args.out,
            smoke=args.smoke,
            budget_s=args.budget,
            sections=sections,
            reps=reps,
            log=lambda m: print(m, flush=True),
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(_json_safe(report), f, indent=1)
    return report


if __name__ == "__main__":
    main()
