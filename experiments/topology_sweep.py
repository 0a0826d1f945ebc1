"""Topology sweep: one algorithm's consensus on eight graph families from N = 8 to 1024.

Families: ring, torus (most square), hypercube, exponential, one-peer exponential (time-varying),
Erdos-Renyi with p = c ln(N) / N for c in {2, 4, 8} (capped at 0.9; c = 1 is the connectivity
threshold), star, complete. Every graph starts from the same ``x0 ~ N(0, 1)^[N, D]`` per seed and
runs R rounds of the algorithm (default: exact gossip, D-PSGD's mixing step, gamma = 1) through
:func:`jaxgossip.engine.sweeps.sweep_topologies`: graphs of one node count, kernel and stochasticity share
one compiled program (vmapped over graphs and seeds).

Reported per graph (:func:`jaxgossip.engine.sweeps.topology_rows`): spectral gap, mean degree, final
relative error ``||X_R - X_bar||^2 / ||X_0 - X_bar||^2`` (mean +- std over seeds), rounds and MB sent
per node until the relative error first drops below ``--tol``, total MB per node. For gossip,
theory predicts error <= (1 - gap)^(2R), so rounds-to-target ~ log(1/tol) / (2 gap).

With ``--compare-separate`` the graphs of the smaller sizes also run one compile per graph
(``stack=False``), side by side in the same process, and the wall-time ratio is reported.

    python experiments/topology_sweep.py                      # ~5 min on a 2-core CPU
    python experiments/topology_sweep.py --quick              # N = 8, 16, 32; seconds
    python experiments/topology_sweep.py --algorithm choco --options '{"compressor": "sign"}' --gamma 0.2

Writes ``table.md``, ``results.json`` and ``topology_sweep.png`` under ``--out``
(default ``experiments/results/topology_sweep``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import jax

from jaxgossip import topology
from jaxgossip.engine import sweeps
from jaxgossip.run.plots import format_table, plot_topology_sweep

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cpu_model  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def family_graphs(n: int, seed: int = 0) -> list:
    """The graphs of one size N (hypercube and one-peer exponential only for powers of 2)."""
    graphs = [topology.ring(n)]
    if n >= 9:  # a torus needs two sides >= 3 to differ from a ring with extra edges
        graphs.append(topology.make("torus", n))
    if n & (n - 1) == 0:
        graphs.append(topology.hypercube(n))
    graphs.append(topology.exponential(n))
    if n & (n - 1) == 0:
        graphs.append(topology.one_peer_exponential(n))
    seen = set()
    for c in (2, 4, 8):
        p = round(min(0.9, c * math.log(n) / n), 4)
        if p not in seen:
            seen.add(p)
            graphs.append(topology.erdos_renyi(n, p, seed=seed))
    graphs += [topology.star(n), topology.complete(n)]
    return graphs


COLUMNS = [
    ("name", "graph", ""),
    ("N", "N", "d"),
    ("spectral_gap", "gap", ".3g"),
    ("mean_degree", "mean deg", ".1f"),
    ("final_error", "final rel. error", ".2e"),
    ("final_error_std", "+- std", ".1e"),
    ("rounds_to_tol", "rounds to tol", ".1f"),
    ("MB_to_tol", "MB/node to tol", ".4f"),
    ("MB_per_node", "MB/node total", ".3f"),
    ("group", "compile group", "d"),
    ("group_size", "graphs in group", "d"),
]


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(h for _, h, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(format(r[k], f) if f else str(r[k]) for k, _, f in COLUMNS) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", default="gossip")
    parser.add_argument("--options", default="{}", help="JSON dict of static algorithm options")
    parser.add_argument("--gamma", type=float, default=None, help="gamma for every graph (traced)")
    parser.add_argument("--sizes", default="8,16,32,64,128,256,512,1024")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument(
        "--compare-separate", type=int, default=128, help="also run one compile per graph up to this N (0: skip)"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "topology_sweep"))
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.steps, args.seeds, args.compare_separate = "8,16,32", 60, 2, 32
    sizes = [int(s) for s in args.sizes.split(",")]
    options = json.loads(args.options)
    per_graph = (lambda t: {"gamma": args.gamma}) if args.gamma is not None else None

    graphs = [g for n in sizes for g in family_graphs(n)]
    seeds = list(range(args.seeds))
    common = dict(dim=args.dim, num_steps=args.steps, seeds=seeds, options=options, per_graph=per_graph)
    start = time.perf_counter()
    result = sweeps.sweep_topologies(args.algorithm, graphs, **common)
    stacked_s = time.perf_counter() - start
    rows = sweeps.topology_rows(result, tol=args.tol)

    comparison = None
    small = [g for g in graphs if g.num_nodes <= args.compare_separate]
    if small:
        t0 = time.perf_counter()
        stacked_small = sweeps.sweep_topologies(args.algorithm, small, **common)
        t1 = time.perf_counter()
        separate = sweeps.sweep_topologies(args.algorithm, small, stack=False, **common)
        t2 = time.perf_counter()
        same = all(
            float(abs(a - b).max()) <= 1e-4 * float(abs(b).max()) for a, b in zip(stacked_small.error, separate.error)
        )
        comparison = {
            "graphs": len(small),
            "compiles_stacked": len(stacked_small.groups),
            "compiles_separate": len(separate.groups),
            "stacked_s": t1 - t0,
            "separate_s": t2 - t1,
            "speedup": (t2 - t1) / (t1 - t0),
            "results_equal": same,
        }

    os.makedirs(args.out, exist_ok=True)
    machine = f"{cpu_model()}, {os.cpu_count()} cores, JAX {jax.__version__} ({jax.default_backend()})"
    described = f"{args.algorithm} {json.dumps(options)}" if options else args.algorithm
    if args.gamma is not None:
        described += f" gamma={args.gamma:g}"
    title = f"{described} consensus, D={args.dim}, {args.steps} rounds, {args.seeds} seeds"
    plot_topology_sweep(rows, os.path.join(args.out, "topology_sweep.png"), title=title, tol=args.tol)
    header = (
        f"{title}; target relative error {args.tol:g}. {len(graphs)} graphs in {len(result.groups)} compiled "
        f"programs, {stacked_s:.1f} s in all. Machine: {machine}, {time.strftime('%Y-%m-%d')}.\n"
    )
    if comparison:
        header += (
            f"\nSame-shape grouping vs one compile per graph ({comparison['graphs']} graphs with N <= "
            f"{args.compare_separate}, measured side by side): {comparison['compiles_stacked']} vs "
            f"{comparison['compiles_separate']} compiles, {comparison['stacked_s']:.1f} s vs "
            f"{comparison['separate_s']:.1f} s = {comparison['speedup']:.1f}x; results equal: "
            f"{comparison['results_equal']}.\n"
        )
    command = "python experiments/topology_sweep.py " + " ".join(sys.argv[1:])
    text = f"Command: `{command.strip()}`\n\n{header}\n{markdown(rows)}\n"
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(
            {
                "args": vars(args),
                "machine": machine,
                "wall_s": stacked_s,
                "groups": result.groups,
                "group_seconds": result.group_seconds,
                "comparison": comparison,
                "rows": rows,
            },
            f,
            indent=1,
        )
    print(header)
    print(format_table(rows, COLUMNS))


if __name__ == "__main__":
    main()
