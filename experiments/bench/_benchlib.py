"""Helpers shared by the benchmark-suite scripts: machine description, timing, XLA analyses."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _common import cpu_model  # noqa: E402


def machine_info() -> dict:
    """Machine, JAX version and date (the header every suite result carries)."""
    cpu = cpu_model()
    devices = jax.devices()
    return {
        "platform": platform.platform(),
        "cpu_model": cpu,
        "nproc": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d.device_kind) for d in devices],
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def header_line(info: dict) -> str:
    return (
        f"machine: {info['cpu_model']}, nproc={info['nproc']}, backend={info['backend']} "
        f"({', '.join(sorted(set(info['devices'])))}), JAX {info['jax_version']}, {info['date']}, "
        f"load average {info['load_average']}"
    )


def median_seconds(fn: Callable[[], object], reps: int) -> float:
    """Median wall time of ``reps`` calls of ``fn`` (results blocked on)."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compiled_bytes(compiled) -> float | None:
    """Peak-memory estimate of a compiled executable: arguments + outputs + temporaries - aliased
    (XLA's ``memory_analysis``); None where the backend does not report it."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not implemented on every backend
        return None
    if m is None:
        return None
    return float(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)


def compiled_flops(compiled) -> float | None:
    """FLOPs of one call of a compiled executable from XLA's ``cost_analysis`` (None if absent)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001
        return None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    if not cost:
        return None
    flops = float(cost.get("flops", 0.0))
    return flops or None


def tree_bytes(tree) -> int:
    return int(sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(tree) if hasattr(leaf, "nbytes")))


def write_result(path: str | None, result: dict) -> dict:
    """Writes ``result`` as JSON to ``path`` (the scripts' ``--json`` option) when given; returns it."""
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
    return result


def linen_sgd_step(fns, opt):
    """One model's local step for the benchmarks: softmax cross-entropy of a linen model with
    batch statistics (``fns`` from ``jaxgossip.models.adapters.linen_model_fns``), its gradient and an optax
    update. ``step(params, batch_stats, opt_state, x, y) -> (params, batch_stats, opt_state, loss)``."""
    import optax

    def step(p, bs, o, x, y):
        def loss_fn(p):
            logits, new_bs = fns.apply(p, bs, x, True)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), new_bs

        (loss, new_bs), g = jax.value_and_grad(loss_fn, has_aux=True)(p)
        upd, o = opt.update(g, o, p)
        return optax.apply_updates(p, upd), new_bs, o, loss

    return step


def per_round(fn, x, rounds: int, reps: int) -> tuple[float, float]:
    """(wall, cpu) seconds per round of the jitted loop ``fn`` of ``rounds`` rounds on x: medians
    of ``reps`` calls after one warm-up; cpu is ``time.process_time`` (all threads)."""
    jax.block_until_ready(fn(x))
    walls, cpus = [], []
    for _ in range(reps):
        wall, cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn(x))
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls) / rounds, statistics.median(cpus) / rounds


def round_loop(body, rounds: int):
    """``x -> lax.fori_loop(0, rounds, body, x)``, jitted."""
    return jax.jit(lambda x: jax.lax.fori_loop(0, rounds, body, x))
