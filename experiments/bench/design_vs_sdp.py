"""Fastest-mixing weights: jaxgossip.design.fastest_mixing against a semidefinite solver (cvxpy).

For each N, one random graph of mean degree about 4 (Erdos-Renyi, resampled until connected):
the barrier method's SLEM and wall time, the SDP solver's (cvxpy with Clarabel, the problem of
Boyd, Diaconis, Xiao 2004 as ``norm(I - L(w) - J, 2)``), their relative difference, and the
Metropolis SLEM for scale. Both solve the same convex problem, so the SLEMs should agree to the SDP
solver's tolerance.

Timings need a quiet machine; ``--smoke`` runs tiny sizes to check the script end to end.

    PYTHONPATH=. python experiments/bench/design_vs_sdp.py --sizes 16,32,64,128,256 --out OUT
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
    import cvxpy as cp

    m = len(edges)
    incidence = np.zeros((n, m))
    incidence[edges[:, 0], np.arange(m)] = 1.0
    incidence[edges[:, 1], np.arange(m)] = -1.0
    w = cp.Variable(m)
    lap = incidence @ cp.diag(w) @ incidence.T
    constraints = [w >= 0, cp.diag(lap) <= 1] if nonnegative else []
    problem = cp.Problem(cp.Minimize(cp.norm(np.eye(n) - lap - np.ones((n, n)) / n, 2)), constraints)
    problem.solve(solver=cp.CLARABEL)
    return float(problem.value)


def row(n: int, seed: int, nonnegative: bool, with_sdp: bool) -> dict:
    topo = jg.topology.erdos_renyi(n, min(1.0, 4.0 / (n - 1)), seed=seed)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,32,64,128")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-sdp", action="store_true", help="time fastest_mixing alone (no cvxpy)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sizes = [8, 12] if args.smoke else [int(s) for s in args.sizes.split(",")]
    info = machine_info()
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
