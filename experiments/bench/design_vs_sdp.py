"""Fastest-mixing weights: jaxgossip.design.fastest_mixing against a semidefinite solver (cvxpy).

For each N, one random graph of mean degree about max(4, 1.2 ln N) (Erdos-Renyi, resampled until
connected; a mean degree of 4 leaves graphs of a few hundred nodes disconnected):
the barrier method's SLEM, Newton steps, wall and CPU time, the SDP solver's (cvxpy with Clarabel,
or SCS with ``--sdp-solver scs``; the problem of Boyd, Diaconis, Xiao 2004 with two PSD
constraints), their relative difference, and the Metropolis SLEM for scale. Both solve the same
convex problem, so the SLEMs should agree to the SDP solver's tolerance.

``--growth`` measures how design time grows with N (``--graph er``: the random graphs above;
``--graph torus``: the 2-D torus of about sqrt(N) x sqrt(N)): the exact barrier method up to
``--exact-max`` nodes (wall and CPU time, Newton steps, SLEM, certified gap), the SDP solver side by
side up to ``--sdp-max`` nodes (Clarabel needs about 17 GB at N = 256), and the matrix-free
surrogate (``consensus_weights`` on the static graph, ``--rounds`` rounds, ``--probes`` Gaussian
probes; skipped with ``--no-surrogate``) at every size, each with its SLEM (Lanczos above 512
nodes) next to Metropolis's. Results go to ``OUT/design_growth_<graph>.json`` and ``.md``.

Timings need a quiet machine, or say that it was not; dense LAPACK on a machine shared with other
jobs runs far faster with one BLAS thread (``OPENBLAS_NUM_THREADS=1``, recorded in the JSON).
``--smoke`` runs tiny sizes to check the script end to end.

    PYTHONPATH=. python experiments/bench/design_vs_sdp.py --sizes 16,32,64,128,256 --out OUT
    PYTHONPATH=. python experiments/bench/design_vs_sdp.py --growth --graph torus \
        --sizes 64,256,1024,4096 --sdp-max 128 --out OUT
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


def sdp_slem(edges: np.ndarray, n: int, nonnegative: bool, solver: str = "clarabel") -> float:
    """The SLEM optimum by a semidefinite solver: minimize s subject to
    ``-s I <= I - L(w) - J <= s I`` (two PSD constraints), with ``vec L(w) = B w`` for a sparse
    constant ``B`` [N^2, M] (four entries per edge), plus ``w >= 0``, ``diag L(w) <= 1`` for the
    chain. ``solver``: ``"clarabel"`` (interior point, default tolerances) or ``"scs"`` (first
    order, run to ``eps = 1e-9``). Writing ``L(w) = A diag(w) A^T`` instead makes cvxpy canonicalize dense [N^2, M]
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
    if solver == "scs":
        problem.solve(solver=cp.SCS, eps_abs=1e-9, eps_rel=1e-9, max_iters=200_000)
    else:
        problem.solve(solver=cp.CLARABEL)
    return float(problem.value)


def random_graph(n: int, seed: int):
    return jg.topology.erdos_renyi(n, min(1.0, max(4.0, 1.2 * np.log(n)) / (n - 1)), seed=seed)


def torus_graph(n: int):
    rows = 2 ** int(np.ceil(np.log2(n) / 2))
    return jg.topology.torus(rows, n // rows)


def timed(fn):
    """``(result, wall seconds, CPU seconds of this process)``."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def row(n: int, seed: int, nonnegative: bool, with_sdp: bool, solver: str) -> dict:
    topo = random_graph(n, seed)
    design, ours, ours_cpu = timed(lambda: jg.design.fastest_mixing(topo, nonnegative=nonnegative))
    out = {
        "num_nodes": n,
        "num_edges": len(design.edges),
        "objective": "slem" if nonnegative else "fdla",
        "slem": design.slem,
        "gap_bound": design.gap_bound,
        "newton_steps": int(design.history.size),
        "seconds": ours,
        "cpu_seconds": ours_cpu,
        "metropolis_slem": design.metropolis_slem,
    }
    if with_sdp:
        optimum, wall, cpu = timed(lambda: sdp_slem(design.edges, n, nonnegative, solver))
        out.update(sdp_solver=solver, sdp_slem=optimum, sdp_seconds=wall, sdp_cpu_seconds=cpu)
        out["relative_difference"] = (design.slem - optimum) / optimum
    return out


def growth_row(n: int, args) -> dict:
    """Design time and SLEM of the exact method (N <= exact_max), of the SDP solver (N <=
    sdp_max) and of the matrix-free surrogate."""
    topo = torus_graph(n) if args.graph == "torus" else random_graph(n, args.seed)
    edges = jg.design.undirected_edges(topo)
    out = {"num_nodes": topo.num_nodes, "num_edges": len(edges), "graph": args.graph}
    out["metropolis_slem"] = jg.design.topology_slem(topo)
    if n <= args.exact_max:
        design, wall, cpu = timed(lambda: jg.design.fastest_mixing(topo))
        out.update(
            exact_seconds=wall,
            exact_cpu_seconds=cpu,
            exact_slem=design.slem,
            gap_bound=design.gap_bound,
            newton_steps=int(design.history.size),
        )
        if n <= args.sdp_max:
            optimum, wall, cpu = timed(lambda: sdp_slem(design.edges, topo.num_nodes, True, args.sdp_solver))
            out.update(sdp_solver=args.sdp_solver, sdp_slem=optimum, sdp_seconds=wall, sdp_cpu_seconds=cpu)
            out["relative_difference"] = (design.slem - optimum) / optimum
    if not args.no_surrogate:
        surrogate, wall, cpu = timed(
            lambda: jg.design.consensus_weights(topo, rounds=args.rounds, probes=args.probes, tol=0, max_steps=300)
        )
        out.update(
            surrogate_seconds=wall,
            surrogate_cpu_seconds=cpu,
            surrogate_slem=jg.design.topology_slem(surrogate.topology),
            surrogate_steps=int(surrogate.history.size - 1),
        )
    return out


def growth_table(rows: list) -> str:
    """The growth series as a markdown table (blank cells where a method did not run)."""

    def cell(r, key, fmt):
        return format(r[key], fmt) if key in r else ""

    lines = [
        "| N | M | exact SLEM | gap bound | Newton steps | exact wall s | exact CPU s | SDP SLEM | SDP wall s "
        "| SDP CPU s | rel. diff | surrogate SLEM | surrogate wall s | Metropolis SLEM |",
        "|" + "---|" * 14,
    ]
    for r in rows:
        lines.append(
            f"| {r['num_nodes']} | {r['num_edges']} | {cell(r, 'exact_slem', '.8f')} | {cell(r, 'gap_bound', '.1e')} "
            f"| {cell(r, 'newton_steps', 'd')} | {cell(r, 'exact_seconds', '.2f')} | {cell(r, 'exact_cpu_seconds', '.2f')} "
            f"| {cell(r, 'sdp_slem', '.8f')} | {cell(r, 'sdp_seconds', '.2f')} | {cell(r, 'sdp_cpu_seconds', '.2f')} "
            f"| {cell(r, 'relative_difference', '+.1e')} | {cell(r, 'surrogate_slem', '.6f')} "
            f"| {cell(r, 'surrogate_seconds', '.2f')} | {r['metropolis_slem']:.6f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,32,64,128")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-sdp", action="store_true", help="time fastest_mixing alone (no cvxpy)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script")
    parser.add_argument("--growth", action="store_true", help="design time against N, exact and matrix-free")
    parser.add_argument("--graph", choices=("er", "torus"), default="er", help="--growth: the graph family")
    parser.add_argument("--exact-max", type=int, default=1024, help="--growth: largest N for the exact method")
    parser.add_argument("--sdp-max", type=int, default=0, help="--growth: largest N for the SDP solver")
    parser.add_argument("--sdp-solver", choices=("clarabel", "scs"), default="clarabel")
    parser.add_argument("--no-surrogate", action="store_true", help="--growth: skip the matrix-free surrogate")
    parser.add_argument("--rounds", type=int, default=30, help="--growth: rounds R of the surrogate")
    parser.add_argument("--probes", type=int, default=32, help="--growth: Gaussian probes of the surrogate")
    parser.add_argument(
        "--resume", action="store_true", help="--growth: keep the rows of an earlier run's JSON for the sizes it has"
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sizes = [8, 12] if args.smoke else [int(s) for s in args.sizes.split(",")]
    info = machine_info()
    info["openblas_num_threads"] = os.environ.get("OPENBLAS_NUM_THREADS")
    if args.growth:
        sizes = [16, 24] if args.smoke else sizes
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"design_growth_{args.graph}.json")
        done = {}
        if args.resume and os.path.exists(path):
            with open(path) as f:
                done = {r["num_nodes"]: r for r in json.load(f)["rows"]}
        rows = []
        print(header_line(info))
        for n in sizes:
            rows.append(done[n] if n in done else growth_row(n, args))
            r = rows[-1]
            # written after every size, so that a long series leaves its finished rows behind
            with open(path, "w") as f:
                json.dump({"machine": info, "smoke": args.smoke, "rows": rows}, f, indent=1)
            with open(os.path.join(args.out, f"design_growth_{args.graph}.md"), "w") as f:
                f.write(f"{header_line(info)}, OPENBLAS_NUM_THREADS={info['openblas_num_threads']}\n\n")
                kept = sorted(set(done) & set(sizes))
                if kept:
                    f.write(f"Rows kept from an earlier run (--resume): N = {kept}.\n\n")
                f.write(growth_table(rows))
            exact = (
                f"exact {r['exact_slem']:.8f} in {r['exact_seconds']:.2f}s wall {r['exact_cpu_seconds']:.2f}s CPU "
                f"({r['newton_steps']} steps)  "
                if "exact_slem" in r
                else ""
            )
            sdp = f"sdp {r['sdp_slem']:.8f} in {r['sdp_seconds']:.2f}s  " if "sdp_slem" in r else ""
            surrogate = (
                f"surrogate {r['surrogate_slem']:.6f} in {r['surrogate_seconds']:.2f}s  "
                if "surrogate_slem" in r
                else ""
            )
            print(f"N={r['num_nodes']:5d}: {exact}{sdp}{surrogate}metropolis {r['metropolis_slem']:.6f}", flush=True)
        return
    rows = [row(n, args.seed, nonneg, not args.no_sdp, args.sdp_solver) for n in sizes for nonneg in (True, False)]
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
