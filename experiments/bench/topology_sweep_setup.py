"""Where a topology sweep spends its time: set-up (building the graphs, the spectral gap and the
effective number of neighbours of every graph, the host work around the programs) against its
compiled programs, and the spectral tools at sparse-family sizes up to 16,384 nodes.

The sweep is the one of ``jaxgossip topology-sweep --topologies=ring,torus,hypercube,exponential,
one_peer_exponential,erdos_renyi:0.1,random_matching --sizes=16,64,256,1024`` (gossip, D = 64,
200 rounds, 3 seeds: the CLI's defaults), run through the same library calls as the command:
``topology.make`` for every graph, ``sweeps.sweep_topologies`` (whose ``group_seconds`` are the
compiled programs: compile + run + transfer of each compile group) and ``sweeps.topology_rows``
(the spectral columns). The target: set-up at most as long as the compiled programs.

    python experiments/bench/topology_sweep_setup.py [--out experiments/bench/topology_sweep_setup.json]
"""

from __future__ import annotations

import argparse
import json
import time

from jaxgossip import topology
from jaxgossip.engine import sweeps

FAMILIES = ("ring", "torus", "hypercube", "exponential", "one_peer_exponential", "erdos_renyi:0.1", "random_matching")
SIZES = (16, 64, 256, 1024)
LARGE_FAMILIES = ("ring", "torus", "hypercube", "exponential", "one_peer_exponential", "random_matching")
LARGE = 16384


def sweep_split(dim: int, steps: int, seeds: list) -> dict:
    start = time.perf_counter()
    graphs = [topology.make(spec, n, seed=0) for spec in FAMILIES for n in SIZES]
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    result = sweeps.sweep_topologies("gossip", graphs, dim=dim, num_steps=steps, seeds=seeds, node_bits=True)
    sweep_s = time.perf_counter() - start
    programs_s = float(sum(result.group_seconds))
    start = time.perf_counter()
    rows = sweeps.topology_rows(result)
    rows_s = time.perf_counter() - start
    setup_s = build_s + (sweep_s - programs_s) + rows_s
    return {
        "graphs": len(graphs),
        "compile_groups": len(result.groups),
        "build_s": build_s,
        "programs_s": programs_s,
        "sweep_host_s": sweep_s - programs_s,
        "spectral_rows_s": rows_s,
        "setup_s": setup_s,
        "setup_over_programs": setup_s / programs_s,
        "gaps": {row["name"]: row["spectral_gap"] for row in rows},
    }


def large_sizes() -> list:
    out = []
    for spec in LARGE_FAMILIES:
        start = time.perf_counter()
        topo = topology.make(spec, LARGE, seed=0)
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        gap = topology.gap_estimate(topo)
        gap_s = time.perf_counter() - start
        row = {"spec": spec, "n": LARGE, "build_s": build_s, "gap": gap.value, "exact": gap.exact, "gap_s": gap_s}
        if not topo.stochastic:
            start = time.perf_counter()
            row["effective_neighbors"] = topology.effective_neighbors(topo, 0.99)
            row["neighbors_s"] = time.perf_counter() - start
        out.append(row)
        print(row, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="experiments/bench/topology_sweep_setup.json")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--skip-large", action="store_true")
    args = parser.parse_args()
    report = {"sweep": sweep_split(args.dim, args.steps, [0, 1, 2])}
    print({k: v for k, v in report["sweep"].items() if k != "gaps"}, flush=True)
    if not args.skip_large:
        report["large"] = large_sizes()
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
