"""Consensus on directed and time-varying graphs: push-sum, Sparse-Push and SCSP.

Communication only (no gradients). 16 nodes, each holding one 50 x 50 N(0, 1) matrix (the
PowerGossip consensus data (docs/training.md, section consensus study settings) shrunk from 100 x 100
so that the top-k sweeps fit
the shared 2-core CPU; ``--dim 100`` restores it). The error is that of the *debiased*
models, ``(1/N) sum_i ||x_i / w_i - mean(x0)||_F^2`` (``jaxgossip.consensus_scan``), against
rounds and bits.

Graphs (all column stochastic; push-sum needs no more):

* ``one_peer_exponential(16)``: time-varying (period 4), directed, regular: W(t) is also doubly
  stochastic, so the push-sum weights stay 1, and 4 exact rounds average exactly;
* ``random_directed(16, p=0.2, seed=0)``: a static, irregular, strongly connected digraph whose
  senders split their mass uniformly (column stochastic only: the weights matter);
* ``schedule(random_directed(16, 0.2, seed=s), s < 4)``: time-varying and irregular (period 4);
  only with ``--graphs all`` (it costs as much again).

Methods: ``push_sum`` (exact); ``sparse_push`` at densities 1 %, 10 %, 30 % (top-k per leaf) with
its consensus step ``gamma`` swept over log-spaced values in ``[1e-3, 1]`` in ONE compile per
density (``consensus_scan`` vmapped over the traced gamma), the lowest final error kept (among
runs converged to float32 round-off, the fastest; ``consensus_study.best_index``); ``scsp``
at 1 % with the residual-adaptive budget (``compensation=True``, our interpretation, default
``target_residual=0.05``, ``max_boost=4``), gamma swept the same way, and with
``compensation=False`` at the gamma chosen for Sparse-Push 1 % (it must equal Sparse-Push; the
script checks it). The final merge of SCSP (part (a), ``jaxgossip.algorithms.make_merge``) is
applied to the best 1 % runs: R = 4 uncompressed push-sum rounds, error before and after and its
cost in MB per node.

Bits: top-k values 32 bits, indices ceil(log2 D) bits (12 for D = 2 500), push-sum weight 32 bits per
message, every (sender, receiver) message counted, self excluded.

Outputs (``experiments/results/``): ``consensus_directed_<graph>.png`` per graph,
``consensus_directed.json`` and ``consensus_directed.md`` (the table of experiments/studies/consensus_directed.md).

Usage::

    python experiments/consensus_directed.py            # 2000 rounds
    python experiments/consensus_directed.py --quick    # 400 rounds
    python experiments/consensus_directed.py --graphs all --dim 100
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxgossip as jg
from jaxgossip import topology as T
from jaxgossip.algorithms import make_merge, push_sum, scsp, sparse_push
from jaxgossip.run.plots import plot_consensus

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from consensus_study import RESULTS, THRESHOLDS, best_index, crossing, initial_values, machine_info  # noqa: E402

DENSITIES = (0.01, 0.1, 0.3)
MERGE_ROUNDS = 4


def graphs(num_nodes: int, p: float, which: str) -> dict[str, T.Topology]:
    out = {
        "one_peer_exp16": T.one_peer_exponential(num_nodes),
        "random_directed16": T.random_directed(num_nodes, p, seed=0),
        "random_schedule16": T.schedule(
            [T.random_directed(num_nodes, p, seed=s) for s in range(4)],
            name=f"schedule(random_directed({num_nodes}, {p}, seed=s), s<4)",
        ),
    }
    if which == "all":
        return out
    return {k: out[k] for k in ("one_peer_exp16", "random_directed16")}


def sweep(make_alg, gammas, x0, num_steps, key):
    """One compile: vmap of consensus_scan over the traced gamma; also returns final x and state."""

    def one(gamma):
        trace = jg.consensus_scan(make_alg(gamma), x0, num_steps, key)
        return trace.error, trace.round_bits, trace.x, trace.state

    t0 = time.perf_counter()
    errors, bits, x, state = jax.jit(jax.vmap(one))(jnp.asarray(gammas, jnp.float32))
    errors = np.asarray(errors, np.float64)
    bits = np.asarray(bits, np.float64)
    cumulative = np.concatenate([np.zeros((bits.shape[0], 1)), np.cumsum(bits, axis=1)], axis=1)
    return errors, cumulative, x, state, time.perf_counter() - t0


def pick(tree, i):
    return jax.tree_util.tree_map(lambda a: a[i], tree)


def merged_error(topo, x, state, target):
    """Error after MERGE_ROUNDS uncompressed push-sum rounds, and their MB per node."""
    merge_fn = jax.jit(make_merge(topo, MERGE_ROUNDS))
    x, state, info = merge_fn(x, state)
    err = float(jg.consensus_distance(jg.algorithms.push_sum(topo).debias(x, state), target))
    return err, float(np.mean(np.asarray(info.bits, np.float64)) / 8e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="400 rounds instead of 2000")
    parser.add_argument("--dim", type=int, default=50, help="each node holds a dim x dim matrix")
    parser.add_argument(
        "--graphs",
        choices=("two", "all"),
        default="two",
        help="'two': one-peer exponential and random_directed; 'all' adds the random schedule",
    )
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--num-gammas", type=int, default=12)
    parser.add_argument("--p", type=float, default=0.2, help="arc probability of the random digraphs")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    num_steps = args.steps or (400 if args.quick else 2000)
    n, shape = 16, (args.dim, args.dim)
    gammas = np.geomspace(1e-3, 1.0, args.num_gammas)
    x0 = initial_values(n, shape, args.seed)
    target = jg.node_mean(x0)
    key = jax.random.key(0)
    info = machine_info()
    print(
        f"{info}\n{n} nodes, {shape} N(0,1) per node, {num_steps} rounds, gamma grid {gammas.min():g}..{gammas.max():g} "
        f"({len(gammas)} values)"
    )
    os.makedirs(args.out, exist_ok=True)

    out = {
        "machine": info,
        "setting": {
            "num_nodes": n,
            "values": f"[{n}, {args.dim}, {args.dim}] N(0,1), node i from fold_in(key({args.seed}), i)",
            "num_steps": num_steps,
            "gamma_grid": gammas.tolist(),
            "densities": list(DENSITIES),
            "scsp": {"target_residual": 0.05, "max_boost": 4},
            "merge_rounds": MERGE_ROUNDS,
            "error": "(1/N) sum_i ||x_i / w_i - mean(x0)||_F^2",
        },
        "graphs": {},
    }
    md = []
    for gname, topo in graphs(n, args.p, args.graphs).items():
        print(
            f"\n== {topo.name}: period {topo.period}, doubly stochastic {topo.is_doubly_stochastic}, "
            f"out-degree range {int(topo.out_degree.min())}..{int(topo.out_degree.max())}"
        )
        curves, rows, finals = {}, [], {}

        t0 = time.perf_counter()
        res = jg.run_consensus(push_sum(topo), x0, num_steps, key)
        err, bits = np.asarray(res.error, np.float64), np.asarray(res.bits, np.float64)
        curves["push_sum"] = (err, bits)
        rows.append({"method": "push_sum", "gamma": None, "seconds": time.perf_counter() - t0})

        # Compressed methods: each swept over gamma; the best gamma's curve is kept.
        compressed = [
            (f"sparse_push {d:.0%}", lambda g, d=d: sparse_push(topo, fraction=d, gamma=g)) for d in DENSITIES
        ] + [("scsp 1% +comp", lambda g: scsp(topo, fraction=0.01, gamma=g, compensation=True))]
        for name, factory in compressed:
            errors, cbits, x, state, secs = sweep(factory, gammas, x0, num_steps, key)
            i = best_index(errors)
            curves[name] = (errors[i], cbits[i])
            finals[name] = (pick(x, i), pick(state, i))
            rows.append(
                {
                    "method": name,
                    "gamma": float(gammas[i]),
                    "seconds": secs,
                    "sweep_final_error": [float(e) for e in errors[:, -1]],
                }
            )
            print(
                f"{name:24s} best gamma {gammas[i]:.3g}: final {errors[i, -1]:.3e} ({secs:.1f} s sweep); "
                + ", ".join(f"{g:.2g}:{e:.1e}" for g, e in zip(gammas, errors[:, -1]))
            )

        g1 = next(r["gamma"] for r in rows if r["method"] == "sparse_push 1%")
        t0 = time.perf_counter()
        res = jg.run_consensus(scsp(topo, fraction=0.01, gamma=g1, compensation=False), x0, num_steps, key)
        err, bits = np.asarray(res.error, np.float64), np.asarray(res.bits, np.float64)
        same = bool(
            np.allclose(err, curves["sparse_push 1%"][0], rtol=1e-4, atol=1e-6)
            and np.allclose(bits, curves["sparse_push 1%"][1])
        )
        rows.append(
            {"method": "scsp 1% no comp", "gamma": g1, "seconds": time.perf_counter() - t0, "equals_sparse_push": same}
        )
        curves["scsp 1% no comp"] = (err, bits)
        print(f"scsp 1% no comp at gamma {g1:.3g}: final {err[-1]:.3e}; identical to sparse_push 1%: {same}")

        for row in rows:
            err, bits = curves[row["method"]]
            row.update(
                final_error=float(err[-1]),
                initial_error=float(err[0]),
                bits_total=float(bits[-1]),
                MB_per_node=float(bits[-1] / n / 8e6),
            )
            row["thresholds"] = {}
            for level in THRESHOLDS:
                r, mb = crossing(err, bits, level, n)
                row["thresholds"][f"{level:g}"] = {"round": r, "MB_per_node": mb}
            if row["method"] in finals:
                e, mb = merged_error(topo, *finals[row["method"]], target)
                row["after_merge"] = {"rounds": MERGE_ROUNDS, "error": e, "merge_MB_per_node": mb}

        png = os.path.join(args.out, f"consensus_directed_{gname}.png")
        labels = {
            r["method"] + ("" if r["gamma"] is None else f" (gamma {r['gamma']:.3g})"): curves[r["method"]]
            for r in rows
        }
        plot_consensus(
            labels, png, title=f"{topo.name}: 16 x {args.dim}x{args.dim} N(0,1), debiased error, {num_steps} rounds"
        )
        out["graphs"][gname] = {
            "topology": topo.name,
            "period": topo.period,
            "doubly_stochastic": bool(topo.is_doubly_stochastic),
            "results": rows,
        }

        md.append(f"\n**{topo.name}** (period {topo.period}, doubly stochastic: {topo.is_doubly_stochastic})\n")
        md.append(
            "| method | gamma | final error | MB sent / node | "
            + " | ".join(f"rounds / MB per node to error {lvl:g}" for lvl in THRESHOLDS)
            + f" | error after {MERGE_ROUNDS} merge rounds (+MB/node) |"
        )
        md.append("|" + "---|" * (5 + len(THRESHOLDS)))
        for row in rows:
            cells = []
            for lvl in THRESHOLDS:
                th = row["thresholds"][f"{lvl:g}"]
                cells.append("not reached" if th["round"] is None else f"{th['round']} / {th['MB_per_node']:.3f}")
            g = "-" if row["gamma"] is None else f"{row['gamma']:.3g}"
            merge = row.get("after_merge")
            merge_cell = "-" if merge is None else f"{merge['error']:.3g} (+{merge['merge_MB_per_node']:.3f})"
            md.append(
                f"| {row['method']} | {g} | {row['final_error']:.3g} | {row['MB_per_node']:.3f} | "
                + " | ".join(cells)
                + f" | {merge_cell} |"
            )

    with open(os.path.join(args.out, "consensus_directed.json"), "w") as f:
        json.dump(out, f, indent=1)
    table = "\n".join(md)
    with open(os.path.join(args.out, "consensus_directed.md"), "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
