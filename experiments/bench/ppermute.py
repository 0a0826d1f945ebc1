"""Circulant mixing with the node axis sharded: shard_map + ppermute vs XLA's automatic partitioning.

Runs on 8 CPU devices (``jax_num_cpu_devices`` is set before JAX starts). For ring, exponential and one-peer exponential graphs
(all circulant) at N nodes with D float32 values per node (one leaf ``[N, D]``), three ways of doing
the same ``x <- W(t) x``:

* ``auto``: ``jax.jit(mixing.mix)`` on inputs sharded over a mesh of 8 devices whose axis is *not*
  named ``"nodes"`` (``mix`` takes the ppermute path by itself on a ``"nodes"`` mesh):
  XLA's SPMD partitioner turns the rolls / gathers into collectives by itself;
* ``ppermute``: ``sharding.mix_ppermute``, the explicit ``shard_map``: at most two
  ``lax.ppermute`` of contiguous row slices per shift;
* ``single``: ``jax.jit(mixing.mix)`` on one device.

Timed (each compiled ahead of time, compile time reported apart; median of ``--reps`` calls after a
warm-up call): ``round``, one mixing round with a traced round counter t = 1 (the one-peer graph
then takes ``mix``'s traced-round gather path, and ``lax.switch`` for ppermute, as inside a scan);
``scan``, 20 rounds of gossip ``x <- x + gamma (W(t) x - x)`` (gamma = 0.9) in one ``lax.scan``
with the round counter as t. Ratios are ``time(auto) / time(ppermute)`` and
``time(single) / time(ppermute)`` (above 1: ppermute is faster). ``coll`` counts the collective
ops in each compiled round (cp collective-permute, ag all-gather, a2a all-to-all, ar all-reduce;
ppermute's one-peer count is over all T switch branches, one of which runs). Every configuration
also checks that the three agree with each other and with NumPy (max abs difference, float32).

On a machine with fewer than 8 devices of the default backend (e.g. one GPU) it prints one
"SKIPPED" line and exits 0. With 8 virtual CPU devices on few cores the "devices" share the cores,
so the sharded timings measure partitioning overhead and collective count, not a real network.

  python experiments/bench/ppermute.py --quick      # N in {64, 256}, D in {1e3, 1e5}, N*D <= 2^23
  python experiments/bench/ppermute.py --json out.json
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time

import jax

NUM_DEVICES = 8
# Before any JAX operation, so that a CPU-only machine exposes 8 devices.
jax.config.update("jax_num_cpu_devices", NUM_DEVICES)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _benchlib import header_line, machine_info, median_seconds, write_result  # noqa: E402

from jaxgossip import topology as T  # noqa: E402
from jaxgossip.ops.mixing import mix  # noqa: E402
from jaxgossip.ops.sharding import mix_ppermute, node_mesh, shard_nodes  # noqa: E402

TOPOLOGIES = {"ring": T.ring, "exponential": T.exponential, "one_peer": T.one_peer_exponential}
SCAN_ROUNDS = 20
GAMMA = 0.9
_COLLECTIVE = re.compile(r"\b(collective-permute|all-gather|all-to-all|all-reduce)(-start)?\(")


def _collectives(compiled) -> dict:
    """Collective ops in a compiled program by kind, e.g. ``{"collective-permute": 6}``."""
    try:
        text = compiled.as_text()
    except Exception:  # noqa: BLE001 - as_text is not available on every backend
        return {}
    counts: dict = {}
    for kind, _ in _COLLECTIVE.findall(text):
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def _short(counts: dict) -> str:
    abbrev = {"collective-permute": "cp", "all-gather": "ag", "all-to-all": "a2a", "all-reduce": "ar"}
    return "+".join(f"{v}{abbrev[k]}" for k, v in sorted(counts.items())) or "0"


def _scan(mixer):
    def run(x):
        def body(x, t):
            return x + jnp.float32(GAMMA) * (mixer(x, t) - x), None

        return jax.lax.scan(body, x, jnp.arange(SCAN_ROUNDS, dtype=jnp.int32))[0]

    return run


def measure(name: str, n: int, d: int, reps: int, mesh) -> dict:
    topo = TOPOLOGIES[name](n)
    rng = np.random.default_rng(0)
    x_host = rng.normal(size=(n, d)).astype(np.float32)
    x_sharded = shard_nodes(jnp.asarray(x_host), mesh, n)
    # Another axis name keeps mix off its ppermute path: XLA partitions the gathers itself.
    partitioner_mesh = Mesh(mesh.devices, ("devices",))
    x_partitioned = jax.device_put(jnp.asarray(x_host), NamedSharding(partitioner_mesh, PartitionSpec("devices")))
    x_single = jax.device_put(jnp.asarray(x_host), jax.devices()[0])
    t = jnp.int32(1)
    mixers = {
        "auto": (lambda x, t: mix(topo, x, t), x_partitioned),
        "ppermute": (lambda x, t: mix_ppermute(topo, x, t, mesh), x_sharded),
        "single": (lambda x, t: mix(topo, x, t), x_single),
    }
    row = {"topology": topo.name, "N": n, "D": d, "T": topo.period}
    outputs = {}
    for mode, (mixer, x) in mixers.items():
        start = time.perf_counter()
        round_fn = jax.jit(mixer).lower(x, t).compile()
        scan_fn = jax.jit(_scan(mixer)).lower(x).compile()
        row[f"{mode}_compile_s"] = time.perf_counter() - start
        row[f"{mode}_collectives"] = _collectives(round_fn)
        outputs[mode] = (jax.block_until_ready(round_fn(x, t)), jax.block_until_ready(scan_fn(x)))
        row[f"{mode}_round_ms"] = median_seconds(lambda: round_fn(x, t), reps) * 1e3
        row[f"{mode}_scan_ms"] = median_seconds(lambda: scan_fn(x), reps) * 1e3
    want_round = topo.matrix(1) @ x_host.astype(np.float64)
    for mode in mixers:
        got_round, got_scan = (np.asarray(a, np.float64) for a in outputs[mode])
        row[f"{mode}_vs_numpy"] = float(np.max(np.abs(got_round - want_round)))
        if mode != "auto":
            ref_round, ref_scan = (np.asarray(a, np.float64) for a in outputs["auto"])
            row[f"{mode}_vs_auto_round"] = float(np.max(np.abs(got_round - ref_round)))
            row[f"{mode}_vs_auto_scan"] = float(np.max(np.abs(got_scan - ref_scan)))
    # float32 sums of at most 12 terms of N(0, 1) values, 20 contracting rounds: far below 1e-4.
    row["match"] = all(row[k] < 1e-4 for k in row if k.endswith(("_vs_numpy", "_vs_auto_round", "_vs_auto_scan")))
    for ref in ("auto", "single"):
        for what in ("round", "scan"):
            row[f"{ref}_over_ppermute_{what}"] = row[f"{ref}_{what}_ms"] / row[f"ppermute_{what}_ms"]
    return row


def _geomean(values) -> float:
    return float(math.exp(np.mean(np.log(values))))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N in {64, 256}, N*D <= 2^23, 3 reps")
    parser.add_argument("--sizes", default=None, help="comma list of N (default 64,256,1024; quick 64,256)")
    parser.add_argument("--dims", default="1000,100000", help="comma list of D, floats per node")
    parser.add_argument("--max-elements", type=int, default=None, help="skip N*D above this (default 2^25; quick 2^23)")
    parser.add_argument("--reps", type=int, default=None, help="timed calls per measurement (default 5; quick 3)")
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES), help=f"comma list from {list(TOPOLOGIES)}")
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in (args.sizes or ("64,256" if args.quick else "64,256,1024")).split(",")]
    dims = [int(s) for s in args.dims.split(",")]
    max_elements = args.max_elements or (2**23 if args.quick else 2**25)
    reps = args.reps or (3 if args.quick else 5)
    names = [s.strip() for s in args.topologies.split(",") if s.strip()]
    unknown = [s for s in names if s not in TOPOLOGIES]
    if unknown:
        raise ValueError(f"--topologies: unknown {unknown}; known: {list(TOPOLOGIES)}")
    info = machine_info()
    print(header_line(info), flush=True)
    if jax.device_count() < NUM_DEVICES:
        msg = f"SKIPPED: needs {NUM_DEVICES} devices, found {jax.device_count()}"
        print(msg, flush=True)
        return write_result(args.json, {"machine": info, "skipped": msg})
    mesh = node_mesh(max(sizes), NUM_DEVICES)  # every N here is a multiple of 8
    print(
        f"{NUM_DEVICES} devices, one float32 leaf [N, D]; round = 1 mixing round (traced t), scan = {SCAN_ROUNDS} "
        f"gossip rounds in one lax.scan; median of {reps}; ratio > 1: ppermute faster",
        flush=True,
    )
    print(
        "| graph | N | D | round ms auto / ppermute / single | auto/pp | single/pp | "
        "scan ms auto / ppermute / single | auto/pp | single/pp | coll auto/pp | compile s auto/pp | match |",
        flush=True,
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for name in names:
        for n in sizes:
            if n % NUM_DEVICES:
                raise ValueError(f"N={n} is not a multiple of {NUM_DEVICES} devices")
            for d in dims:
                if n * d > max_elements:
                    continue
                r = measure(name, n, d, reps, mesh)
                rows.append(r)
                print(
                    f"| {r['topology']} | {n} | {d:.0e} | {r['auto_round_ms']:.3f} / {r['ppermute_round_ms']:.3f} / "
                    f"{r['single_round_ms']:.3f} | {r['auto_over_ppermute_round']:.2f} | "
                    f"{r['single_over_ppermute_round']:.2f} | {r['auto_scan_ms']:.2f} / {r['ppermute_scan_ms']:.2f} / "
                    f"{r['single_scan_ms']:.2f} | {r['auto_over_ppermute_scan']:.2f} | "
                    f"{r['single_over_ppermute_scan']:.2f} | {_short(r['auto_collectives'])} / {_short(r['ppermute_collectives'])} | "
                    f"{r['auto_compile_s']:.1f}/{r['ppermute_compile_s']:.1f} | {'ok' if r['match'] else 'MISMATCH'} |",
                    flush=True,
                )
    summary = {
        "round_auto_over_ppermute_geomean": _geomean([r["auto_over_ppermute_round"] for r in rows]),
        "scan_auto_over_ppermute_geomean": _geomean([r["auto_over_ppermute_scan"] for r in rows]),
        "round_auto_over_ppermute_range": [
            min(r["auto_over_ppermute_round"] for r in rows),
            max(r["auto_over_ppermute_round"] for r in rows),
        ],
        "scan_auto_over_ppermute_range": [
            min(r["auto_over_ppermute_scan"] for r in rows),
            max(r["auto_over_ppermute_scan"] for r in rows),
        ],
        "round_single_over_ppermute_geomean": _geomean([r["single_over_ppermute_round"] for r in rows]),
        "all_match": all(r["match"] for r in rows),
    }
    print(
        f"ppermute vs auto: round x{summary['round_auto_over_ppermute_geomean']:.2f} geo-mean "
        f"(range {summary['round_auto_over_ppermute_range'][0]:.2f}-{summary['round_auto_over_ppermute_range'][1]:.2f}), "
        f"scan x{summary['scan_auto_over_ppermute_geomean']:.2f} geo-mean "
        f"(range {summary['scan_auto_over_ppermute_range'][0]:.2f}-{summary['scan_auto_over_ppermute_range'][1]:.2f}); "
        f"all three agree: {summary['all_match']}",
        flush=True,
    )
    result = {"machine": info, "rows": rows, "summary": summary, "args": vars(args)}
    return write_result(args.json, result)


if __name__ == "__main__":
    main()
