"""Gradient-aware methods vs D-SGD on heterogeneous least squares: bias floor vs exact convergence.

Setting: ``jaxgossip.engine.problems.least_squares`` with N = 16 nodes, D = 20, M = 50 samples per node,
heterogeneity h = 1 (node-specific true parameters and feature means), on ``ring(16)`` (uniform
weights 1/3, lambda_min = -1/3). Every node runs full-batch gradient descent (``optax.sgd``, one
constant step size ``lr = 0.3 / L_max`` for every method, ``L_max`` the largest local smoothness
constant), one local step per round, "atc" ordering, from x0 = 0, for S rounds.

Methods: allreduce (centralized GD, the reference), gossip (D-SGD), gradient_tracking, d2 with
gamma = 0.5 (Exact Diffusion's (I + W) / 2: the uniform ring's lambda_min(W) = -1/3 is D^2's
limit), qgm (beta = 0.9, lr as the optimizer's).

Reported: the relative distance ``||mean_i x_i - x*|| / ||x*||`` of the node average to the
float64 minimiser at every round (``run_optimization``'s objective hook evaluates it, so there is
no float32 cancellation as in ``f - f*``), against rounds and MB sent per node; in the table the
float64 gap ``f(mean x) - f*`` and the largest per-node relative distance at the end, and the
rounds / MB to reach a distance of 1e-3.

Outputs (``experiments/results/gradient_methods/``): ``least_squares.png``,
``gradient_methods.json`` (curves every 5th round, settings, machine) and
``gradient_methods.md`` (the table of experiments/studies/gradient_methods.md).

Usage::

    python experiments/gradient_methods_study.py               # 1500 rounds, about 30 s on 2 cores
    python experiments/gradient_methods_study.py --rounds 300
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
from jaxgossip.engine import problems

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "gradient_methods")
NUM_NODES, DIM, SAMPLES, HETEROGENEITY = 16, 20, 50, 1.0
LR_FACTOR = 0.3
LEVEL = 1e-3  # "rounds to reach": relative distance to x* <= LEVEL
JSON_EVERY = 5


def smoothness(problem: problems.Problem) -> float:
    a = np.asarray(problem.features, np.float64)
    return max(np.linalg.eigvalsh(a_i.T @ a_i / a_i.shape[0])[-1] for a_i in a)


def methods(ring: T.Topology, lr: float) -> dict:
    make = jg.algorithms.make
    return {
        "allreduce": make("allreduce", ring),
        "gossip (D-SGD)": make("gossip", ring),
        "gradient_tracking": make("gradient_tracking", ring),
        "d2 (gamma 0.5)": make("d2", ring, gamma=0.5),
        "qgm (beta 0.9)": make("qgm", ring, lr=lr, beta=0.9),
    }


def run(rounds: int) -> dict:
    problem = problems.least_squares(
        num_nodes=NUM_NODES, dim=DIM, samples_per_node=SAMPLES, heterogeneity=HETEROGENEITY, seed=0
    )
    lr = LR_FACTOR / smoothness(problem)
    ring = T.ring(NUM_NODES)
    x_star = jnp.asarray(problem.x_star, jnp.float32)
    norm_star = float(np.linalg.norm(problem.x_star))

    def distance(x, node_index, key):
        """||x - x*|| / ||x*|| (the same on every node; evaluated at the node average)."""
        del node_index, key
        return jnp.sqrt(jnp.sum((x - x_star) ** 2)) / norm_star

    curves, rows = {}, []
    for name, alg in methods(ring, lr).items():
        start = time.time()
        res = jg.run_optimization(
            alg,
            problem.init_params(),
            problem.full_loss_fn,
            optax.sgd(lr),
            rounds,
            jax.random.key(0),
            objective_fn=distance,
        )
        dist = np.asarray(res.objective, np.float64)
        mb = np.asarray(res.bits) / NUM_NODES / 8e6
        x = np.asarray(res.x, np.float64)
        gap = problem.objective(x.mean(axis=0)) - problem.f_star
        node_dist = float(np.max(np.linalg.norm(x - problem.x_star, axis=1)) / norm_star)
        hit = np.flatnonzero(dist <= LEVEL)
        first = int(hit[0]) if hit.size else None
        curves[name] = {"distance": dist.tolist(), "mb": mb.tolist(), "consensus": np.asarray(res.consensus).tolist()}
        rows.append(
            {
                "method": name,
                "kB_per_round": float(mb[-1] / rounds * 1e3),
                "final_gap": float(gap),
                "final_distance_mean": float(dist[-1]),
                "final_distance_max_node": node_dist,
                "rounds_to_level": first,
                "mb_to_level": None if first is None else float(mb[first]),
                "seconds": round(time.time() - start, 2),
            }
        )
        print(f"{name:20s} gap {gap:9.3e}  distance {dist[-1]:9.3e}  ({rows[-1]['seconds']} s)")
    return {
        "settings": {
            "problem": "least_squares",
            "num_nodes": NUM_NODES,
            "dim": DIM,
            "samples_per_node": SAMPLES,
            "heterogeneity": HETEROGENEITY,
            "topology": ring.name,
            "lr": lr,
            "rounds": rounds,
            "level": LEVEL,
            "f_star": problem.f_star,
        },
        "rows": rows,
        "curves": curves,
        "machine": {"cpu": cpu_model(), "jax": jax.__version__, "date": datetime.date.today().isoformat()},
    }


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, c in report["curves"].items():
        dist = np.maximum(np.asarray(c["distance"]), 1e-8)
        axes[0].semilogy(dist, label=name)
        axes[1].semilogy(np.asarray(c["mb"]), dist, label=name)
    axes[0].set_xlabel("round")
    axes[1].set_xlabel("MB sent per node")
    for ax in axes:
        ax.set_ylabel("||mean x - x*|| / ||x*||")
        ax.axhline(LEVEL, color="grey", lw=0.5, ls=":")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    s = report["settings"]
    fig.suptitle(
        f"heterogeneous least squares, {s['topology']}, N={s['num_nodes']}, D={s['dim']}, constant lr={s['lr']:.3g}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(report: dict) -> str:
    lines = [
        "| method | kB / node / round | final gap f(mean x) - f* | final distance (mean) | final distance (worst node) "
        f"| rounds to {LEVEL:g} | MB / node by then |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        rounds = "-" if r["rounds_to_level"] is None else str(r["rounds_to_level"])
        mb = "-" if r["mb_to_level"] is None else f"{r['mb_to_level']:.3f}"
        lines.append(
            f"| {r['method']} | {r['kB_per_round']:.3f} | {r['final_gap']:.2e} | {r['final_distance_mean']:.1e} "
            f"| {r['final_distance_max_node']:.1e} | {rounds} | {mb} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1500)
    args = parser.parse_args()
    start = time.time()
    report = run(args.rounds)
    os.makedirs(RESULTS, exist_ok=True)
    plot(report, os.path.join(RESULTS, "least_squares.png"))
    thin = {
        **report,
        "curves": {
            name: {k: [float(f"{v:.4g}") for v in values[::JSON_EVERY]] for k, values in c.items()}
            for name, c in report["curves"].items()
        },
    }
    with open(os.path.join(RESULTS, "gradient_methods.json"), "w") as f:
        json.dump(thin, f, indent=1)
    with open(os.path.join(RESULTS, "gradient_methods.md"), "w") as f:
        f.write(table(report))
    print(table(report))
    print(f"total {time.time() - start:.1f} s; wrote {RESULTS}")


if __name__ == "__main__":
    main()
