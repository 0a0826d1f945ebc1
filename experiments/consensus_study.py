"""Consensus study of the PowerGossip paper: 8-ring, one 100 x 100 N(0, 1) matrix per worker.

The setting of docs/training.md, section consensus study settings (Vogels, Karimireddy, Jaggi, NeurIPS 2020,
arXiv:2008.01425, "random" consensus experiment): 8 workers on a ring with uniform weights 1/3,
each holding one 100 x 100 matrix with i.i.d. N(0, 1) entries, communication only (no gradients),
error ``(1/N) sum_i ||X_i - mean(X)||_F^2`` after every round, plotted against rounds and bits.

Methods, as in the paper:

* exact gossip and PowerGossip (rank 1; I = 1 and 2 iterations per round; warm start and random
  restart ``warm_start=False``) at the fixed relaxation ``gamma = optimal_gamma(ring(8)) = 1.3084``;
* Choco-Gossip with top-k matched to rank-1 bits (keep ratio per tensor
  ``(m + n) / (2 m n) * r / 2`` = 0.005 for 100 x 100, r = 1, i.e. 50 of 10 000 entries) and with
  scaled sign, each at its best ``gamma`` out of 20 log-spaced values in ``[1e-4, 1.3084]``
  ("best" = lowest final error; among runs that converged to float32 round-off, final error
  below 1e-9 of the initial one, the fastest, see :func:`best_index`). The sweep is ONE compile per compressor: ``consensus_scan`` is
  vmapped over the traced ``gamma``.

Bits follow the library's counters: fp32 value = 32 bits, top-k index = ceil(log2 10000) = 14 bits
(so a top-k message costs 50 * 46 = 2 300 bits against PowerGossip's 100 * 32 = 3 200 bits: the
paper's 1/2 for the index assumed 32-bit indices; ``--index-bits 32`` reproduces that exact match,
``--index-bits 64`` the reference code's int64 counter), sign = 1 bit per entry + 32 per tensor.
Every (sender, receiver) message is counted, self excluded.

Outputs (``experiments/results/``): ``consensus_ring8.png`` (error vs rounds and vs MB),
``consensus_ring8.json`` (final errors, bits, chosen gammas, rounds / MB to reach error
thresholds, the full sweep) and ``consensus_ring8.md`` (the table of experiments/studies/consensus_powergossip.md).

Usage::

    python experiments/consensus_study.py            # 5000 rounds, as the paper
    python experiments/consensus_study.py --quick    # 500 rounds
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from _common import cpu_model  # noqa: E402

import jaxgossip as jg
from jaxgossip import topology as T
from jaxgossip.algorithms import choco, gossip, power_gossip
from jaxgossip.run.plots import plot_consensus

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
THRESHOLDS = (1e2, 1.0, 1e-2)  # absolute consensus errors (initial error ~ 8 750)


def machine_info() -> dict:
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
    }


def initial_values(num_nodes: int, shape: tuple[int, ...], seed: int) -> jax.Array:
    """[N, *shape] N(0, 1); node i draws from ``fold_in(key(seed), i)`` (the paper: seed 42 + rank)."""
    base = jax.random.key(seed)
    return jnp.stack([jax.random.normal(jax.random.fold_in(base, i), shape, jnp.float32) for i in range(num_nodes)])


def topk_keep_ratio(m: int, n: int, rank: int) -> float:
    """Top-k keep ratio matched to rank-r PowerGossip bits (reference ``TopK.num_entries_for_param``)."""
    return (m + n) / (2 * m * n) * rank / 2


def crossing(error: np.ndarray, bits: np.ndarray, level: float, num_nodes: int):
    """(first round with error <= level, MB sent per node by then) or (None, None)."""
    hit = np.nonzero(error <= level)[0]
    if hit.size == 0:
        return None, None
    r = int(hit[0])
    return r, float(bits[r] / num_nodes / 8e6)


def run_fixed(alg, x0, num_steps: int, key):
    t0 = time.perf_counter()
    res = jg.run_consensus(alg, x0, num_steps, key)
    err = np.asarray(res.error, dtype=np.float64)
    return err, np.asarray(res.bits, dtype=np.float64), time.perf_counter() - t0


def sweep_gamma(make_alg, gammas: np.ndarray, x0, num_steps: int, key):
    """All gammas in one compile: ``vmap`` of ``consensus_scan`` over the traced gamma.

    Returns (errors [G, S + 1], cumulative bits [G, S + 1], seconds).
    """

    def one(gamma):
        trace = jg.consensus_scan(make_alg(gamma), x0, num_steps, key)
        return trace.error, trace.round_bits

    t0 = time.perf_counter()
    errors, bits = jax.jit(jax.vmap(one))(jnp.asarray(gammas, jnp.float32))
    errors = np.asarray(errors, dtype=np.float64)
    bits = np.asarray(bits, dtype=np.float64)
    cumulative = np.concatenate([np.zeros((bits.shape[0], 1)), np.cumsum(bits, axis=1)], axis=1)
    return errors, cumulative, time.perf_counter() - t0


CONVERGED = 1e-9  # final / initial error below this counts as converged to float32 resolution


def best_index(errors: np.ndarray) -> int:
    """The swept run to keep: lowest final error, diverged (non-finite) runs last.

    Final errors below ``CONVERGED * initial error`` are float32 round-off, not a ranking, so when
    several runs get there the one that got there fastest (lowest mean of log10 error over the
    rounds) is kept instead.
    """
    final = np.where(np.isfinite(errors[:, -1]), errors[:, -1], np.inf)
    converged = np.flatnonzero(final <= CONVERGED * errors[:, 0])
    if converged.size > 1:
        area = np.mean(np.log10(np.maximum(errors[converged], 1e-30)), axis=1)
        return int(converged[np.argmin(area)])
    return int(np.argmin(final))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 rounds instead of 5000")
    parser.add_argument("--steps", type=int, default=None, help="override the number of rounds")
    parser.add_argument("--num-gammas", type=int, default=20)
    parser.add_argument("--index-bits", default="log2", help="top-k index cost: 'log2' (default), 32 or 64")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    num_steps = args.steps or (500 if args.quick else 5000)
    index_bits = args.index_bits if args.index_bits == "log2" else int(args.index_bits)

    topo = T.ring(8)
    n = topo.num_nodes
    m = d = 100
    gamma_star = T.optimal_gamma(topo)
    keep = topk_keep_ratio(m, d, 1)
    gammas = np.geomspace(1e-4, gamma_star, args.num_gammas)
    x0 = initial_values(n, (m, d), args.seed)
    key = jax.random.key(0)
    info = machine_info()
    print(
        f"{info}\n8-ring, {m}x{d} N(0,1) per node, {num_steps} rounds, gamma* = {gamma_star:.4f}, "
        f"top-k keep ratio (m+n)/(2mn)*r/2 = {keep:g} ({int(np.floor(keep * m * d))} of {m * d} entries)"
    )

    curves, rows, sweeps = {}, [], {}

    fixed = {
        "gossip": gossip(topo, gamma=gamma_star),
        "power_gossip r1 I1 warm": power_gossip(topo, rank=1, num_iterations=1, gamma=gamma_star),
        "power_gossip r1 I2 warm": power_gossip(topo, rank=1, num_iterations=2, gamma=gamma_star),
        "power_gossip r1 I1 random": power_gossip(topo, rank=1, num_iterations=1, gamma=gamma_star, warm_start=False),
        "power_gossip r1 I2 random": power_gossip(topo, rank=1, num_iterations=2, gamma=gamma_star, warm_start=False),
    }
    for name, alg in fixed.items():
        err, bits, secs = run_fixed(alg, x0, num_steps, key)
        curves[name] = (err, bits)
        rows.append({"method": name, "gamma": gamma_star, "gamma_swept": False, "seconds": secs})
        print(f"{name:28s} final error {err[-1]:.3e}  MB/node {bits[-1] / n / 8e6:8.3f}  ({secs:.1f} s)")

    swept = {
        f"choco top-k {keep:g}": lambda g: choco(
            topo, gamma=g, compressor="top_k", compressor_options={"fraction": keep, "index_bits": index_bits}
        ),
        "choco sign": lambda g: choco(topo, gamma=g, compressor="sign"),
    }
    for name, make_alg in swept.items():
        errors, bits, secs = sweep_gamma(make_alg, gammas, x0, num_steps, key)
        i = best_index(errors)
        curves[name] = (errors[i], bits[i])
        rows.append({"method": name, "gamma": float(gammas[i]), "gamma_swept": True, "seconds": secs})
        sweeps[name] = {
            "gammas": gammas.tolist(),
            "final_error": [float(e) for e in errors[:, -1]],
            "chosen_index": i,
        }
        print(
            f"{name:28s} final error {errors[i, -1]:.3e}  MB/node {bits[i, -1] / n / 8e6:8.3f}  "
            f"best gamma {gammas[i]:.4g} of {len(gammas)} ({secs:.1f} s for the whole sweep, one compile)"
        )
        print("   sweep final errors: " + ", ".join(f"{g:.3g}:{e:.2e}" for g, e in zip(gammas, errors[:, -1])))

    for row in rows:
        err, bits = curves[row["method"]]
        row["final_error"] = float(err[-1])
        row["initial_error"] = float(err[0])
        row["bits_total"] = float(bits[-1])
        row["MB_per_node"] = float(bits[-1] / n / 8e6)
        row["bits_per_node_per_round"] = float(bits[-1] / n / num_steps)
        row["thresholds"] = {}
        for level in THRESHOLDS:
            r, mb = crossing(err, bits, level, n)
            row["thresholds"][f"{level:g}"] = {"round": r, "MB_per_node": mb}

    os.makedirs(args.out, exist_ok=True)
    suffix = "" if args.index_bits == "log2" else f"_idx{args.index_bits}"
    png = os.path.join(args.out, f"consensus_ring8{suffix}.png")
    labels = {
        row["method"]
        + (f" (best gamma {row['gamma']:.3g})" if row["gamma_swept"] else f" (gamma {row['gamma']:.3f})"): curves[
            row["method"]
        ]
        for row in rows
    }
    plot_consensus(
        labels,
        png,
        title=f"8-ring, 100x100 N(0,1) per node, {num_steps} rounds; top-k index bits: {index_bits}",
    )
    result = {
        "machine": info,
        "setting": {
            "topology": "ring(8), uniform 1/3",
            "values": f"[8, {m}, {d}] N(0,1), node i from fold_in(key({args.seed}), i)",
            "num_steps": num_steps,
            "gamma_star": gamma_star,
            "topk_keep_ratio": keep,
            "topk_kept_entries": int(np.floor(keep * m * d)),
            "topk_index_bits": index_bits,
            "gamma_grid": gammas.tolist(),
            "error": "(1/N) sum_i ||X_i - mean(X0)||_F^2",
        },
        "results": rows,
        "sweeps": sweeps,
    }
    json_path = os.path.join(args.out, f"consensus_ring8{suffix}.json")
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1)

    head = (
        "| method | gamma | final error | MB sent / node | "
        + " | ".join(f"rounds / MB per node to error {lvl:g}" for lvl in THRESHOLDS)
        + " |"
    )
    lines = [head, "|" + "---|" * (4 + len(THRESHOLDS))]
    for row in rows:
        cells = []
        for lvl in THRESHOLDS:
            th = row["thresholds"][f"{lvl:g}"]
            cells.append("not reached" if th["round"] is None else f"{th['round']} / {th['MB_per_node']:.3f}")
        g = f"{row['gamma']:.4g}" + (" (swept)" if row["gamma_swept"] else "")
        lines.append(
            f"| {row['method']} | {g} | {row['final_error']:.3g} | {row['MB_per_node']:.3f} | "
            + " | ".join(cells)
            + " |"
        )
    table = "\n".join(lines)
    with open(os.path.join(args.out, f"consensus_ring8{suffix}.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    print(f"wrote {png}, {json_path}")


if __name__ == "__main__":
    main()
