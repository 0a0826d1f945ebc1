"""Fastest-mixing weights: jaxgossip.design.fastest_mixing against a semidefinite solver (cvxpy).

For each N, one random graph of mean degree about max(4, 1.2 ln N) (Erdos-Renyi, resampled until
connected; a mean degree of 4 leaves graphs of a few hundred nodes disconnected):
the barrier method's SLEM and wall time, the SDP solver's (cvxpy with Clarabel, the problem of
Boyd, Diaconis, Xiao 2004 as ``norm(I - L(w) - J, 2)``), their relative difference, and the
Metropolis SLEM for scale. Both solve the same convex problem, so the SLEMs should agree to the SDP
solver's tolerance.

``--growth`` measures instead how design time grows with N on sparse random graphs (mean degree
as above): the exact barrier method up to
``--exact-max`` nodes, and the matrix-free surrogate (``consensus_weights`` on the static graph,
``--rounds`` rounds, ``--probes`` Gaussian probes) at every size, each with its SLEM (Lanczos above
512 nodes) next to Metropolis's.

Timings need a quiet machine; ``--smoke`` runs tiny sizes to check the script end to end.

    PYTHONPATH=. python experiments/bench/design_vs_sdp.py --sizes 16,32,64,128,256 --out OUT
    PYTHONPATH=. python experiments/bench/design_vs_sdp.py --growth --sizes 256,1024,4096 --out OUT
    PYTHONPATH=. python experiments/bench/design_vs_sdp.py --smoke --out OUT
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
from _benchlib import header_line, machine_info

import jaxgossip as jg


def sdp_slem(edges: np.ndarray, n: int, nonnegative: bool) -> float:
    """The SLEM optimum by a semidefinite solver: minimize s subject to
    ``-s I <= I - L(w) - J <= s I`` (two PSD constraints), with ``vec L(w) = B w`` for a sparse
    constant ``B`` [N^2, M] (four entries per edge), plus ``w >= 0``, ``diag L(w) <= 1`` for the
    chain. Writing ``L(w) = A diag(w) A^T`` instead makes cvxpy canonicalize dense [N^2, M]
    coefficient tensors per product: 3.7 GB at N = 64 and out of memory at N = 128."""
    import cvxpy as cp
    import scipy.sparse

    m = len(edges)
    u, v = edges[:, 0], edges[:, 1]
    cols = np.tile(np.arange(m), 4)
    # column-major vec: entry (i, j) of L sits at i + N j
    rows = np.concatenate([u + n * u, v + n * v, u + n * v, v + n * u])
    values = np.concatenate([np.ones(2 * m), -np.ones(2 * m)])
    vec_lap = scipy.sparse.csc_matrix((values, (rows, cols)), shape=(n * n, m))
    w, s = cp.Variable(m), cp.Variable()
    centred = np.eye(n) - np.ones((n, n)) / n - cp.reshape(vec_lap @ w, (n, n), order="F")
    constraints = [s * np.eye(n) - centred >> 0, s * np.eye(n) + centred >> 0]
    if nonnegative:
        incidence = scipy.sparse.csr_matrix(
            (np.ones(2 * m), (np.concatenate([u, v]), np.tile(np.arange(m), 2))), shape=(n, m)
        )
        constraints += [w >= 0, incidence @ w <= 1]
    problem = cp.Problem(cp.Minimize(s), constraints)
    problem.solve(solver=cp.CLARABEL)
    return float(problem.value)


def random_graph(n: int, seed: int):
    return jg.topology.erdos_renyi(n, min(1.0, max(4.0, 1.2 * np.log(n)) / (n - 1)), seed=seed)


def row(n: int, seed: int, nonnegative: bool, with_sdp: bool) -> dict:
    topo = random_graph(n, seed)
    start = time.perf_counter()
    design = jg.design.fastest_mixing(topo, nonnegative=nonnegative)
    ours = time.perf_counter() - start
    out = {
        "num_nodes": n,
        "num_edges": len(design.edges),
        "objective": "slem" if nonnegative else "fdla",
        "slem": design.slem,
        "gap_bound": design.gap_bound,
        "newton_steps": int(design.history.size),
        "seconds": ours,
        "metropolis_slem": design.metropolis_slem,
    }
    if with_sdp:
        start = time.perf_counter()
        optimum = sdp_slem(design.edges, n, nonnegative)
        out.update(sdp_slem=optimum, sdp_seconds=time.perf_counter() - start)
        out["relative_difference"] = (design.slem - optimum) / optimum
    return out


def growth_row(n: int, seed: int, exact_max: int, rounds: int, probes: int) -> dict:
    """Design time and SLEM of the exact method (N <= exact_max) and of the matrix-free surrogate."""
    topo = random_graph(n, seed)
    out = {"num_nodes": n, "num_edges": len(jg.design.undirected_edges(topo))}
    out["metropolis_slem"] = jg.design.topology_slem(topo)
    if n <= exact_max:
        start = time.perf_counter()
        design = jg.design.fastest_mixing(topo)
        out.update(exact_seconds=time.perf_counter() - start, exact_slem=design.slem, gap_bound=design.gap_bound)
    start = time.perf_counter()
    surrogate = jg.design.consensus_weights(topo, rounds=rounds, probes=probes, tol=0, max_steps=300)
    out.update(
        surrogate_seconds=time.perf_counter() - start,
        surrogate_slem=jg.design.topology_slem(surrogate.topology),
        surrogate_steps=int(surrogate.history.size - 1),
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,32,64,128")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-sdp", action="store_true", help="time fastest_mixing alone (no cvxpy)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script")
    parser.add_argument("--growth", action="store_true", help="design time against N, exact and matrix-free")
    parser.add_argument("--exact-max", type=int, default=1024, help="--growth: largest N for the exact method")
    parser.add_argument("--rounds", type=int, default=30, help="--growth: rounds R of the surrogate")
    parser.add_argument("--probes", type=int, default=32, help="--growth: Gaussian probes of the surrogate")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sizes = [8, 12] if args.smoke else [int(s) for s in args.sizes.split(",")]
    info = machine_info()
    if args.growth:
        sizes = [16, 24] if args.smoke else sizes
        rows = [growth_row(n, args.seed, args.exact_max, args.rounds, args.probes) for n in sizes]
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "design_growth.json"), "w") as f:
            json.dump({"machine": info, "smoke": args.smoke, "rows": rows}, f, indent=1)
        print(header_line(info))
        for r in rows:
            exact = f"exact {r['exact_slem']:.6f} in {r['exact_seconds']:.2f}s  " if "exact_slem" in r else ""
            print(
                f"N={r['num_nodes']:5d}: {exact}surrogate {r['surrogate_slem']:.6f} in {r['surrogate_seconds']:.2f}s "
                f"({r['surrogate_steps']} steps)  metropolis {r['metropolis_slem']:.6f}"
            )
        return
    rows = [row(n, args.seed, nonneg, not args.no_sdp) for n in sizes for nonneg in (True, False)]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "design_vs_sdp.json"), "w") as f:
        json.dump({"machine": info, "smoke": args.smoke, "rows": rows}, f, indent=1)
    print(header_line(info))
    for r in rows:
        sdp = (
            f"  sdp {r['sdp_slem']:.6f} in {r['sdp_seconds']:.2f}s  rel {r['relative_difference']:+.1e}"
            if "sdp_slem" in r
            else ""
        )
        print(
            f"N={r['num_nodes']:5d} M={r['num_edges']:5d} {r['objective']}: slem {r['slem']:.6f} in {r['seconds']:.2f}s "
            f"({r['newton_steps']} steps, metropolis {r['metropolis_slem']:.4f}){sdp}"
        )


if __name__ == "__main__":
    main()
