"""Decentralized optimization study: gossip algorithms on heterogeneous least squares and logistic regression.

Setting: N = 16 nodes; undirected ring(16) for the symmetric methods and directed_ring(16) (i sends
to i + 1, weights 1/2) for the push-sum methods; each node holds M = 50 samples of its own
distribution (``jaxgossip.engine.problems``, heterogeneity h = 1), D = 100 parameters viewed as one
10 x 10 matrix per node (so PowerGossip compresses it; every other method treats it as 100
entries). Every node runs full-batch gradient descent (``optax.sgd``, step size ``lr = 0.5 / L_max``
with ``L_max`` the largest smoothness constant of the local objectives), one local step per round
(plus gossip with H = 4 local steps), "atc" ordering, from x0 = 0, for S rounds. Reported: the
gap ``f(mean_i z_i) - f*`` of the global objective at the average of the debiased models
(``run_optimization``'s ``objective`` minus the problem's float64 ``f_star``; the objective is
evaluated in float32, so gaps below 1e-6 |f*| are reported as round-off and the plots clip there,
dotted line), against rounds and against MB sent per node (kB per round in the table is the
average over the run: PowerGossip sends nothing in its first round).

Methods: allreduce (exact averaging, centralized GD), gossip (gamma = 1), gossip with H = 4 local
steps, Choco-SGD with top-10 % (its gamma picked from a grid by the lowest final gap; all gammas in
one compile, ``optimization_scan`` vmapped over the traced gamma), PowerGossip rank 1 (gamma = 1),
SGP (push_sum) and Sparse-Push top-10 % (gamma from the same grid) on the directed ring.

Outputs (``experiments/results/optimization/``): ``<problem>.png`` (gap vs rounds and vs MB per
node), ``optimization.json`` (curves every 5th round, chosen gammas, settings, machine) and ``optimization.md``
(the table of experiments/studies/optimization.md).

Usage::

    python experiments/optimization_study.py             # 500 rounds
    python experiments/optimization_study.py --rounds 100
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
import optax
from _common import cpu_model

import jaxgossip as jg
from jaxgossip import topology as T
from jaxgossip.algorithms import allreduce, choco, gossip, power_gossip, push_sum, sparse_push
from jaxgossip.engine import problems

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "optimization")
NUM_NODES, SIDE, SAMPLES, HETEROGENEITY = 16, 10, 50, 1.0
GAMMAS = (0.05, 0.1, 0.2, 0.4, 0.8)
FRACTION = 0.1
ROUND_OFF = 1e-6  # |gap| below ROUND_OFF * |f*| is float32 round-off of the objective
TOLERANCE = 5e-2  # "rounds to reach": gap <= TOLERANCE * initial gap


def smoothness(problem: problems.Problem) -> float:
    """Largest smoothness constant of the local objectives (upper bound for logistic regression)."""
    a = np.asarray(problem.features, np.float64)
    top = max(np.linalg.eigvalsh(a_i.T @ a_i / a_i.shape[0])[-1] for a_i in a)
    return top if problem.name == "least_squares" else top / 4 + 1e-2


def as_matrix_loss(problem: problems.Problem):
    """Node loss on a SIDE x SIDE matrix (the flat problem parameter reshaped)."""
    return lambda p, i, key: problem.loss_fn(p.reshape(-1), i, key)


def methods(ring, directed):
    """name -> (build(gamma) or None, fixed algorithm or None, local_steps)."""
    topk = {"fraction": FRACTION}
    return {
        "allreduce": (None, allreduce(ring), 1),
        "gossip": (None, gossip(ring), 1),
        "gossip H=4": (None, gossip(ring), 4),
        "choco top-10%": (lambda g: choco(ring, gamma=g, compressor="top_k", compressor_options=topk), None, 1),
        "power_gossip r=1": (None, power_gossip(ring, rank=1), 1),
        "push_sum (directed)": (None, push_sum(directed), 1),
        "sparse_push top-10% (directed)": (lambda g: sparse_push(directed, fraction=FRACTION, gamma=g), None, 1),
    }


def run_method(build, alg, local_steps, x0, loss_fn, optimizer, rounds, key, f_star):
    """Returns (gap [S + 1], consensus [S + 1], cumulative bits [S + 1], chosen gamma or None)."""
    if alg is not None:
        res = jg.run_optimization(alg, x0, loss_fn, optimizer, rounds, key, local_steps=local_steps)
        gap = np.asarray(res.objective, np.float64) - f_star
        return gap, np.asarray(res.consensus, np.float64), np.asarray(res.bits), None

    def one(gamma):
        trace = jg.optimization_scan(build(gamma), x0, loss_fn, optimizer, rounds, key, local_steps)
        return trace.objective, trace.consensus, jnp.sum(trace.node_bits, axis=1)

    objectives, consensus, bits = jax.jit(jax.vmap(one))(jnp.asarray(GAMMAS, jnp.float32))
    gaps = np.asarray(objectives, np.float64) - f_star
    final = np.where(np.isfinite(gaps[:, -1]), gaps[:, -1], np.inf)
    best = int(np.argmin(final))
    cumulative = np.concatenate([[0.0], np.cumsum(np.asarray(bits[best], np.float64))])
    return gaps[best], np.asarray(consensus[best], np.float64), cumulative, GAMMAS[best]


JSON_EVERY = 5  # the JSON keeps every 5th point of each curve (4 significant digits)


def _thin(report: dict) -> dict:
    """Curves every ``JSON_EVERY`` rounds, rounded, as one-line lists (keeps the JSON small)."""

    def thin(values):
        return [float(f"{v:.4g}") for v in values[::JSON_EVERY]]

    return {
        pname: {
            **{k: v for k, v in entry.items() if k != "curves"},
            "rounds": list(range(0, len(next(iter(entry["curves"].values()))["gap"]), JSON_EVERY)),
            "curves": {
                name: {k: thin(v) if isinstance(v, list) else v for k, v in c.items()}
                for name, c in entry["curves"].items()
            },
        }
        for pname, entry in report.items()
    }


def rounds_to(gap: np.ndarray, level: float):
    hit = np.flatnonzero(gap <= level)
    return int(hit[0]) if hit.size else None


def plot(problem_name: str, curves: dict, floor: float, path: str) -> None:
    """Gap vs rounds and vs MB per node; gaps are clipped at the float32 round-off ``floor``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, c in curves.items():
        gap = np.maximum(np.asarray(c["gap"]), floor)
        mb = np.asarray(c["bits"]) / NUM_NODES / 8e6
        axes[0].plot(np.arange(gap.size), gap, label=name)
        axes[1].plot(mb[1:], gap[1:], label=name)
    axes[0].set_xlabel("rounds")
    axes[1].set_xlabel("MB sent per node")
    axes[1].set_xscale("log")
    for ax in axes:
        ax.axhline(floor, color="gray", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        ax.set_ylabel("f(mean z) - f*")
        ax.grid(True, alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.suptitle(f"{problem_name}: N = {NUM_NODES}, D = {SIDE * SIDE}, heterogeneity {HETEROGENEITY}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dim = SIDE * SIDE
    built = {
        "least_squares": problems.least_squares(NUM_NODES, dim, SAMPLES, heterogeneity=HETEROGENEITY, seed=args.seed),
        "logistic_regression": problems.logistic_regression(
            NUM_NODES, dim, SAMPLES, heterogeneity=HETEROGENEITY, reg=1e-2, seed=args.seed
        ),
    }
    table = methods(T.ring(NUM_NODES), T.directed_ring(NUM_NODES))
    x0 = jnp.zeros((NUM_NODES, SIDE, SIDE), jnp.float32)
    key = jax.random.key(args.seed)
    report, rows, t_start = {}, [], time.perf_counter()
    for pname, problem in built.items():
        lr = 0.5 / smoothness(problem)
        optimizer, loss_fn = optax.sgd(lr), as_matrix_loss(problem)
        curves = {}
        for name, (build, alg, local_steps) in table.items():
            t0 = time.perf_counter()
            gap, consensus, bits, gamma = run_method(
                build, alg, local_steps, x0, loss_fn, optimizer, args.rounds, key, problem.f_star
            )
            seconds = time.perf_counter() - t0
            hit = rounds_to(gap, TOLERANCE * gap[0])
            curves[name] = {
                "gap": gap.tolist(),
                "consensus": consensus.tolist(),
                "bits": bits.tolist(),
                "gamma": gamma,
                "seconds": seconds,
            }
            floor = ROUND_OFF * abs(problem.f_star)
            rows.append(
                {
                    "problem": pname,
                    "method": name,
                    "gamma": "-" if gamma is None else f"{gamma:g}",
                    "kB_round": bits[-1] / args.rounds / NUM_NODES / 8e3,
                    "gap": f"{gap[-1]:.2e}" if gap[-1] > floor else f"< {floor:.0e} (round-off)",
                    "rel": f"{gap[-1] / gap[0]:.1e}" if gap[-1] > floor else "-",
                    "consensus": float(consensus[-1]),
                    "hit": "-" if hit is None else str(hit),
                    "hit_mb": "-" if hit is None else f"{bits[hit] / NUM_NODES / 8e6:.3f}",
                }
            )
            print(f"{pname:20s} {name:32s} gap {gap[-1]:.3e} rounds-to-tol {rows[-1]['hit']:>4s} ({seconds:.1f} s)")
        plot(pname, curves, ROUND_OFF * abs(problem.f_star), os.path.join(args.out, f"{pname}.png"))
        report[pname] = {"lr": lr, "f_star": problem.f_star, "curves": curves}
    header = (
        "| problem | method | gamma | kB / node / round | final gap | final / initial gap | final consensus | "
        f"rounds to {TOLERANCE:g} x initial gap | MB / node by then |\n|---|---|---|---:|---:|---:|---:|---:|---:|\n"
    )
    body = "".join(
        f"| {r['problem']} | {r['method']} | {r['gamma']} | {r['kB_round']:.3f} | {r['gap']} | {r['rel']} | "
        f"{r['consensus']:.1e} | {r['hit']} | {r['hit_mb']} |\n"
        for r in rows
    )
    with open(os.path.join(args.out, "optimization.md"), "w") as f:
        f.write(header + body)
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "jax": jax.__version__,
        "rounds": args.rounds,
        "num_nodes": NUM_NODES,
        "dim": dim,
        "samples_per_node": SAMPLES,
        "heterogeneity": HETEROGENEITY,
        "gammas": GAMMAS,
        "fraction": FRACTION,
        "seconds": time.perf_counter() - t_start,
    }
    with open(os.path.join(args.out, "optimization.json"), "w") as f:
        json.dump({"settings": meta, "problems": _thin(report), "table": rows}, f, indent=1)
    print(header + body)
    print(f"total {meta['seconds']:.0f} s")


if __name__ == "__main__":
    main()
