"""Designed mixing weights and learned graphs against the classical weightings and graphs.

Part 1, spectral: on the static undirected families of the topology-families study at N = 16, 64,
256 and 1024, the weights of least SLEM (:func:`jaxgossip.design.fastest_mixing`: the
fastest-mixing Markov chain, non-negative weights, and where cheap the fastest distributed linear
averaging iteration, FDLA, signed weights) against the Metropolis-Hastings, max-degree and best
constant weights of the same graph (:func:`jaxgossip.run.design_report.classical_weightings`):

* SLEM ``||W - J||_2`` and the spectral gap ``1 - SLEM``;
* rounds to 1e-6: ``ceil(ln 1e-6 / (2 ln SLEM))``, after which the worst start's squared consensus
  error is below 1e-6 of its start (:func:`jaxgossip.cli.design.design_rows`);
* the effective number of neighbours ``n_W(0.99)`` (:func:`jaxgossip.topology.effective_neighbors`).

The families (supports; their weights are replaced): ring, torus, hypercube, exponential (the
undirected support ``i ~ i +- 2^j``: the library's exponential graph is directed and the SLEM
design needs an undirected support), random_regular:4 (networkx, the first connected draw from
seed 0), erdos_renyi (p = 2 ln(N) / N, seed 0), star, chain, binary_tree, spanning_tree:torus,
u_equistatic, dumbbell and complete. The barrier method costs ``O(N^3 + M^3)`` per Newton step, so
graphs with many edges or many steps stop at :data:`MAX_NODES` (listed in the tables) and FDLA
runs up to N = :data:`FDLA_MAX_NODES`.

Part 2, training: D-SGD (``gossip``) on the ``jaxgossip demo`` task (embedded digits, MLP(64),
batch 16, Nesterov momentum 0.9, lr 0.05, weight decay 1e-4) at N = 16 and 32 with a Dirichlet(0.1)
label partition (data seed 0, shared by every graph and seed), :data:`TRAIN_ROUNDS` rounds, seeds
:data:`SEEDS`, the same steps and lr for every graph (one compile per group of same-shape graphs,
:func:`jaxgossip.run.training_sweeps.sweep_topologies_training`). Graphs: the data-aware graph of
in-degree at most d learned from the partition's label proportions
(:func:`jaxgossip.design.learn_topology`, lambda 0.1, the ``--objective=heterogeneity:D`` design),
d = 2 and ceil(log2 N), against the graphs of equal degree: the ring (d = 2), the exponential
graph (d = ceil(log2 N)) and a random d-regular graph (d >= 3), with
Metropolis weights and with the fastest-mixing weights; the complete graph as the reference.
Reported: final test accuracy of the averaged model and the nodes' mean and worst accuracy, and
the nodes' mean accuracy at a third of the run (mean +- sample std over seeds), with each graph's rate ``||W - J||_2``, ``n_W(0.99)`` and
neighbourhood heterogeneity ``(1/N) ||W Pi - 1 pi_bar^T||_F^2``.

Outputs (``experiments/results/design/`` by default): ``design.json`` (settings, rows, timings,
machine) and ``design.md`` (the tables). ``--table`` re-renders the tables from the JSON.

Usage::

    python experiments/design_study.py                     # both parts
    python experiments/design_study.py --parts spectral    # one part (the other kept from the JSON)
    python experiments/design_study.py --quick             # N = 16, short training, runs/design_quick
    python experiments/design_study.py --table             # re-render design.md from design.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _common, also when loaded by a test

from _common import jsonable, machine  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "design")
QUICK_OUT = os.path.join("runs", "design_quick")
FAMILIES = (
    "ring", "torus", "hypercube", "exponential", "random_regular:4", "erdos_renyi", "star", "chain",
    "binary_tree", "spanning_tree:torus", "u_equistatic", "dumbbell", "complete",
)  # fmt: skip
SIZES = (16, 64, 256, 1024)
# The largest N each family is designed at: M ~ N^2 / 4 (dumbbell, complete) or N log N edges make
# the [M, M] Newton system too large, and the chain on irregular graphs takes hundreds of Newton
# steps (Erdos-Renyi at N = 1024: 4-5 min alone).
MAX_NODES = {
    "exponential": 256,
    "erdos_renyi": 256,
    "chain": 256,
    "binary_tree": 256,
    "spanning_tree:torus": 256,
    "u_equistatic": 256,
    "dumbbell": 64,
    "complete": 64,
}
FDLA_MAX_NODES = 256
TOL = 1e-8  # the certified gap of fastest_mixing
GAMMA = 0.99  # the decay of n_W
WEIGHTINGS = ("designed", "metropolis", "max-degree", "best constant")

TRAIN_SIZES = (16, 32)  # degrees 2 (the ring's) and ceil(log2 N) (the exponential graph's)
TRAIN_ROUNDS, EVAL_EVERY, SEEDS = 300, 50, (0, 1, 2)
PARTITION, LAM = "dirichlet:0.1", 0.1
QUICK = {"sizes": (16,), "train_sizes": (16,), "train_rounds": 20, "eval_every": 10, "seeds": (0,)}


def spec_for(family: str, n: int) -> str:
    """The ``topology.make`` spec of a family at N nodes (erdos_renyi: p = 2 ln(N) / N)."""
    if family == "erdos_renyi":
        return f"erdos_renyi:{round(min(0.9, 2 * math.log(n) / n), 4)}"
    return family


def random_regular(n: int, degree: int, seed: int = 0):
    """A connected random d-regular graph (networkx; the first connected draw from ``seed``),
    Metropolis weights (uniform ``1 / (d + 1)`` on a regular graph)."""
    import networkx as nx

    from jaxgossip import topology

    for attempt in range(100):
        graph = nx.random_regular_graph(degree, n, seed=seed + attempt)
        if nx.is_connected(graph):
            return topology.from_adjacency(graph, name=f"random_regular(d={degree})")
    raise ValueError(f"no connected {degree}-regular graph on {n} nodes in 100 draws")


def support(family: str, n: int):
    """The graph of a family at N nodes (module docstring)."""
    from jaxgossip import topology

    if family == "exponential":
        a = topology.exponential(n).matrix() != 0
        return topology.from_adjacency((a | a.T) & ~np.eye(n, dtype=bool), name="exponential (undirected)")
    if family.startswith("random_regular"):
        return random_regular(n, int(family.partition(":")[2]))
    return topology.make(spec_for(family, n), n, seed=0)


def _neighbours(graph) -> float | None:
    from jaxgossip.topology import effective_neighbors

    try:
        return float(effective_neighbors(graph, GAMMA))
    except ValueError:  # signed weights (best constant, FDLA) are not a covariance of a mixing walk
        return None


def spectral_rows(families, sizes, log=print) -> tuple[list[dict], list[dict]]:
    """One row per (family, N, weighting) designed, and the (family, N) skipped as too costly."""
    from jaxgossip.cli.design import design_rows
    from jaxgossip.design import fastest_mixing
    from jaxgossip.run.design_report import classical_weightings

    rows, skipped = [], []
    for n in sizes:
        for family in families:
            if n > MAX_NODES.get(family, max(SIZES)):
                skipped.append({"family": family, "N": n, "why": f"above N = {MAX_NODES[family]}"})
                continue
            topo = support(family, n)
            graphs = classical_weightings(topo)
            start = time.process_time()
            design = fastest_mixing(topo, nonnegative=True, tol=TOL)
            seconds = time.process_time() - start
            graphs["designed"] = design.topology
            fdla = None
            if n <= FDLA_MAX_NODES:
                start = time.process_time()
                fdla = fastest_mixing(topo, nonnegative=False, tol=TOL)
                fdla_seconds = time.process_time() - start
            for row in design_rows(design):
                label = row["weights"]
                rows.append(
                    {
                        "family": family,
                        "graph": topo.name,
                        "N": n,
                        "M": int(len(design.edges)),
                        **row,
                        "effective_neighbors": _neighbours(graphs[label]),
                        **(
                            {"cpu_s": seconds, "newton_steps": int(design.history.size), "gap_bound": design.gap_bound}
                            if label == "designed"
                            else {}
                        ),
                    }
                )
            if fdla is not None:
                row = design_rows(fdla)[0]
                rows.append(
                    {
                        "family": family,
                        "graph": topo.name,
                        "N": n,
                        "M": int(len(fdla.edges)),
                        **row,
                        "weights": "fdla",
                        "effective_neighbors": _neighbours(fdla.topology),
                        "cpu_s": fdla_seconds,
                        "newton_steps": int(fdla.history.size),
                        "gap_bound": fdla.gap_bound,
                    }
                )
            r = {x["weights"]: x for x in rows if x["family"] == family and x["N"] == n}
            log(
                f"N={n:5d} {topo.name:28s} M={r['designed']['M']:6d} chain {r['designed']['slem']:.6f} "
                f"metropolis {r['metropolis']['slem']:.6f} best constant {r['best constant']['slem']:.6f}"
                + (f" fdla {r['fdla']['slem']:.6f}" if "fdla" in r else "")
                + f"  ({seconds:.1f} s CPU)"
            )
    return rows, skipped


def training_graphs(n: int, degrees, proportions) -> list[tuple[str, int, object]]:
    """(label, degree, graph) of Part 2: learned, ring, exponential, random d-regular with
    Metropolis and with fastest-mixing weights, complete."""
    from jaxgossip import topology
    from jaxgossip.design import fastest_mixing, learn_topology

    out = [("complete (reference)", n - 1, topology.complete(n))]
    for d in degrees:
        out.append((f"learned (d={d})", d, learn_topology(proportions, d, lam=LAM, name=f"learned(d={d})").topology))
        if d == 2:
            out.append(("ring", 2, topology.ring(n)))
        if d == math.ceil(math.log2(n)):
            out.append(("exponential", d, topology.exponential(n)))
        if d >= 3:  # a 2-regular graph is a union of cycles: the ring is the connected one
            rr = random_regular(n, d)
            out.append((f"random {d}-regular, Metropolis", d, rr))
            out.append((f"random {d}-regular, fastest mixing", d, fastest_mixing(rr).topology))
    return out


def training_rows(n, degrees, train_rounds, eval_every, seeds, log=print) -> tuple[list[dict], dict]:
    from jaxgossip import data
    from jaxgossip.cli.demo import DEMO_DEFAULTS
    from jaxgossip.design import label_proportions, neighbourhood_heterogeneity
    from jaxgossip.run.design_report import rate
    from jaxgossip.run.runner import TrainConfig
    from jaxgossip.run.training_sweeps import sweep_topologies_training

    config = TrainConfig(**{**DEMO_DEFAULTS, "model_options": {"hidden": (64,)}}).replace(
        num_nodes=n,
        partition=PARTITION,
        data_seed=0,
        num_rounds=train_rounds,
        eval_every=eval_every,
        evals_per_chunk=1,
        algorithm="gossip",
    )
    dataset = data.load_dataset(config.dataset)
    # the partition the training draws (data seed 0), whose label proportions the graphs learn from
    labels, classes = data.partition_labels(dataset)
    parts = data.partition(labels, n, config.partition, seed=config.resolved_data_seed)
    node_of = np.zeros(labels.shape[0], dtype=np.int64)
    node_of[np.concatenate(parts)] = np.repeat(np.arange(len(parts)), [len(idx) for idx in parts])
    proportions = label_proportions(labels, node_of, n, classes)
    graphs = training_graphs(n, degrees, proportions)
    start = time.time()
    metrics, groups = sweep_topologies_training(config, [g for _, _, g in graphs], seeds, dataset)
    seconds = time.time() - start
    log(f"training N={n}: {len(graphs)} graphs x {len(seeds)} seeds, {seconds:.1f} s ({len(groups)} compiles)")
    rows = []
    # the evaluation at a third of the run: the transient, where the graphs still differ
    early = max(0, train_rounds // 3 // eval_every - 1)
    for (label, degree, graph), m in zip(graphs, metrics):
        final = {k: np.asarray(getattr(m, k))[:, -1] for k in ("test_acc", "node_acc_mean", "node_acc_min")}
        final["node_acc_mean_early"] = np.asarray(m.node_acc_mean)[:, early]
        w = graph.matrix()
        rows.append(
            {
                "N": n,
                "graph": label,
                "degree": degree,
                "max_in_degree": int(np.max(np.sum((w != 0) & ~np.eye(n, dtype=bool), axis=1))),
                "rate": rate(graph),
                "effective_neighbors": _neighbours(graph),
                "heterogeneity": neighbourhood_heterogeneity(w, proportions),
                **{f"{k}_seeds": v.tolist() for k, v in final.items()},
            }
        )
        r = rows[-1]
        log(
            f"  {label:36s} rate {r['rate']:.4f} n_W {r['effective_neighbors'] or float('nan'):6.2f} "
            f"het {r['heterogeneity']:.4f} acc {np.mean(r['test_acc_seeds']):.4f} "
            f"nodes {np.mean(r['node_acc_mean_seeds']):.4f}"
        )
    settings = {
        "degrees": list(degrees),
        "early_round": (early + 1) * eval_every,
        "dataset": config.dataset,
        "partition": config.partition,
        "data_seed": 0,
        "model": "mlp hidden [64]",
        "algorithm": "gossip",
        "batch_size": config.batch_size,
        "lr": config.lr,
        "momentum": config.momentum,
        "weight_decay": config.weight_decay,
        "rounds": train_rounds,
        "eval_every": eval_every,
        "seeds": list(seeds),
        "lam": LAM,
        "seconds": seconds,
        "compiles": len(groups),
    }
    return rows, settings


# ---------------------------------------------------------------- tables


def _num(value, fmt: str, none: str = "-") -> str:
    if value is None or isinstance(value, str):
        return none if value is None else value
    return none if not math.isfinite(value) else format(value, fmt)


def _mean_std(values) -> str:
    v = np.asarray(values, dtype=float)
    if v.size < 2:
        return f"{v.mean():.3f}"
    return f"{v.mean():.3f} +- {v.std(ddof=1):.3f}"


def spectral_tables(spectral: dict) -> list[str]:
    rows = spectral["rows"]
    lines = []
    for n in sorted({r["N"] for r in rows}):
        lines += [
            f"**N = {n}**",
            "",
            "| graph | M | SLEM: chain | FDLA | Metropolis | max-degree | best constant | gap chain / Metropolis "
            "| n_W: chain | Metropolis | rounds to 1e-6: chain | Metropolis | best constant | design CPU s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        graphs = [g for g in dict.fromkeys(r["family"] for r in rows if r["N"] == n)]
        for family in graphs:
            r = {x["weights"]: x for x in rows if x["N"] == n and x["family"] == family}
            d, m, b = r["designed"], r["metropolis"], r["best constant"]
            ratio = d["spectral_gap"] / m["spectral_gap"] if m["spectral_gap"] > 0 else math.inf
            lines.append(
                f"| {d['graph']} | {d['M']} | {d['slem']:.6f} | {_num(r.get('fdla', {}).get('slem'), '.6f')} "
                f"| {m['slem']:.6f} | {r['max-degree']['slem']:.6f} | {b['slem']:.6f} | {_num(ratio, '.3f')} "
                f"| {_num(d['effective_neighbors'], '.2f')} | {_num(m['effective_neighbors'], '.2f')} "
                f"| {d['rounds_1e-6']} | {m['rounds_1e-6']} | {b['rounds_1e-6']} | {d['cpu_s']:.2f} |"
            )
        lines.append("")
    if spectral.get("skipped"):
        by_n = {}
        for s in spectral["skipped"]:
            by_n.setdefault(s["N"], []).append(s["family"])
        lines.append(
            "Not designed (the barrier method's [M, M] Newton system or its step count grows too large): "
            + "; ".join(f"N = {n}: {', '.join(f)}" for n, f in sorted(by_n.items()))
            + "."
        )
        lines.append("")
    return lines


def training_table(training: dict) -> list[str]:
    lines = []
    for key, s in training["settings"].items():
        n = int(key)
        lines += [
            f"**N = {n}**: D-SGD on digits, {s['partition']} (data seed {s['data_seed']}), MLP(64), batch "
            f"{s['batch_size']}, lr {s['lr']}, momentum {s['momentum']}, {s['rounds']} rounds, seeds {s['seeds']} "
            f"({s['seconds']:.0f} s, {s['compiles']} compiles).",
            "",
            f"| graph | in-degree | rate | n_W(0.99) | heterogeneity | acc (avg model) | acc (nodes) | worst node "
            f"| acc (nodes) at round {s['early_round']} |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in (r for r in training["rows"] if r["N"] == n):
            lines.append(
                f"| {r['graph']} | {r['max_in_degree']} | {r['rate']:.4f} | {_num(r['effective_neighbors'], '.2f')} "
                f"| {r['heterogeneity']:.4f} | {_mean_std(r['test_acc_seeds'])} "
                f"| {_mean_std(r['node_acc_mean_seeds'])} | {_mean_std(r['node_acc_min_seeds'])} "
                f"| {_mean_std(r['node_acc_mean_early_seeds'])} |"
            )
        lines.append("")
    lines += [
        "Accuracies on the test set after the last round (and the nodes' mean at a third of the run), mean +- "
        "sample std over seeds; rate: ||W - J||_2; heterogeneity: (1/N) ||W Pi - 1 pi_bar^T||_F^2 of the "
        "partition's label proportions Pi (Le Bars et al. 2023).",
        "",
    ]
    return lines


def tables(report: dict) -> str:
    lines = []
    if "spectral" in report:
        sp = report["spectral"]
        lines += [
            "## Part 1: weights of least SLEM against the classical weightings",
            "",
            f"chain: fastest-mixing Markov chain (w >= 0), certified within {sp['settings']['tol']:g} of the optimum; "
            f"FDLA: signed weights (N <= {sp['settings']['fdla_max_nodes']}); rounds to 1e-6: "
            "ceil(ln 1e-6 / (2 ln SLEM)) (worst start; 'never' for SLEM 1); n_W at gamma "
            f"{sp['settings']['gamma']:g} ('-' for signed weights); CPU seconds of the chain design.",
            "",
            *spectral_tables(sp),
        ]
    if "training" in report:
        lines += ["## Part 2: D-SGD on learned and classical graphs", "", *training_table(report["training"])]
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def run(
    parts,
    families=FAMILIES,
    sizes=SIZES,
    train_sizes=TRAIN_SIZES,
    train_rounds=TRAIN_ROUNDS,
    eval_every=EVAL_EVERY,
    seeds=SEEDS,
):
    report = {}
    if "spectral" in parts:
        start = time.time()
        rows, skipped = spectral_rows(families, sizes)
        report["spectral"] = {
            "settings": {
                "families": list(families),
                "sizes": list(sizes),
                "max_nodes": MAX_NODES,
                "fdla_max_nodes": FDLA_MAX_NODES,
                "tol": TOL,
                "gamma": GAMMA,
                "seconds": time.time() - start,
            },
            "rows": rows,
            "skipped": skipped,
        }
    if "training" in parts:
        report["training"] = {"settings": {}, "rows": []}
        for n in train_sizes:
            degrees = (2, math.ceil(math.log2(n)))
            rows, settings = training_rows(n, degrees, train_rounds, eval_every, seeds)
            report["training"]["settings"][str(n)] = settings
            report["training"]["rows"] += rows
    return report


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: N = 16, 20 training rounds, 1 seed")
    parser.add_argument("--parts", default="spectral,training", help="comma-separated subset of spectral,training")
    parser.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated subset of {list(FAMILIES)}")
    parser.add_argument("--sizes", default=None, help="comma-separated node counts (default 16,64,256,1024)")
    parser.add_argument("--out", default=None, help=f"output folder (default {RESULTS}; --quick: {QUICK_OUT})")
    parser.add_argument("--table", action="store_true", help="re-render design.md from the folder's design.json")
    args = parser.parse_args(argv)
    out = args.out or (QUICK_OUT if args.quick else RESULTS)
    path = os.path.join(out, "design.json")
    if args.table:
        with open(path) as f:
            report = json.load(f)
    else:
        parts = [p for p in args.parts.split(",") if p]
        families = tuple(f for f in args.families.split(",") if f)
        unknown = [p for p in parts if p not in ("spectral", "training")] + [f for f in families if f not in FAMILIES]
        if unknown:
            parser.error(f"unknown parts or families {unknown}; families: {list(FAMILIES)}")
        options = dict(QUICK) if args.quick else {}
        if args.sizes:
            options["sizes"] = tuple(int(v) for v in args.sizes.split(","))
        report = {}
        if os.path.exists(path):  # a part not run now keeps its saved results
            with open(path) as f:
                report = {k: v for k, v in json.load(f).items() if k in ("spectral", "training")}
        report.update(run(parts, families=families, **options))
        report["machine"] = machine()
        os.makedirs(out, exist_ok=True)
        with open(path, "w") as f:
            json.dump(jsonable(report, 7), f, allow_nan=False, indent=1)
    text = tables(report)
    with open(os.path.join(out, "design.md"), "w") as f:
        f.write(text)
    print(text)
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
