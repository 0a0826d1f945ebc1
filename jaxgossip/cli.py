"""The ``jaxgossip`` console script: ``train``, ``consensus``, ``sweep``, ``demo`` (edge module).

Every command takes an optional config file (``--config`` JSON/YAML/Python) plus ``--key=value``
overrides of its fields, shows a progress bar, writes its results under ``--out`` and prints a
summary table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

__all__ = ["main"]


def _split_overrides(extra: list[str]) -> dict:
    overrides = {}
    for item in extra:
        if not item.startswith("--") or "=" not in item:
            raise SystemExit(f"jaxgossip: unrecognised argument {item!r}; overrides look like --key=value")
        key, value = item[2:].split("=", 1)
        overrides[key] = value
    return overrides


# ---- train ------------------------------------------------------------------------------------

_TRAIN_COLUMNS = [
    ("name", "run", ""),
    ("test_acc", "acc(avg)", ".4f"),
    ("node_acc_mean", "acc(nodes)", ".4f"),
    ("node_acc_min", "min", ".4f"),
    ("consensus", "consensus", ".3g"),
    ("MB_per_node", "MB/node", ".2f"),
    ("reduction", "vs gossip", ".1f"),
    ("wall_time", "time(s)", ".1f"),
]


def _train(args, overrides) -> int:
    from jaxgossip import plots
    from jaxgossip.runner import load_config, run_training

    config = load_config(args.config, overrides)
    out = args.out or os.path.join("runs", config.name or config.algorithm)
    try:
        result = run_training(config, out, resume=not args.no_resume, progress=not args.no_progress)
    except FloatingPointError as err:
        print(f"jaxgossip train: stopped: {err}\n(metrics so far are in {out}/metrics.json)", file=sys.stderr)
        return 3
    rows = result["rows"]
    plots.plot_training({config.name or config.algorithm: rows}, out, title=result["built"].topology.name)
    last = dict(rows[-1], name=config.name or config.algorithm, wall_time=result["wall_time"], reduction=float("nan"))
    print(plots.format_table([last], [c for c in _TRAIN_COLUMNS if c[0] != "reduction"]))
    print(f"wrote {out}/metrics.json, metrics.csv, config.json and plots")
    return 0


# ---- consensus --------------------------------------------------------------------------------

_CONSENSUS_DEFAULT = {
    "num_nodes": 8,
    "topology": "ring",
    "shape": [100, 100],
    "num_steps": 500,
    "seed": 0,
    "runs": [
        {"name": "gossip", "algorithm": "gossip", "options": {"gamma": 1.0}},
        {"name": "allreduce", "algorithm": "allreduce", "options": {}},
    ],
}


def _consensus(args, overrides) -> int:
    import jax

    import jaxgossip as jg
    from jaxgossip import plots

    config = dict(_CONSENSUS_DEFAULT)
    if args.config:
        with open(args.config) as f:
            if args.config.endswith((".yaml", ".yml")):
                import yaml

                config.update(yaml.safe_load(f))
            else:
                config.update(json.load(f))
    for key, value in overrides.items():
        if key not in config:
            raise SystemExit(f"jaxgossip consensus: unknown key {key!r}; known: {sorted(config)}")
        config[key] = json.loads(value) if value[:1] in "[{0123456789-" or value in ("true", "false") else value
    out = args.out or os.path.join("runs", "consensus")
    os.makedirs(out, exist_ok=True)
    n = int(config["num_nodes"])
    key = jax.random.key(int(config["seed"]))
    x0 = {"x": jax.random.normal(key, (n, *config["shape"]))}
    curves, rows = {}, []
    from tqdm.auto import tqdm

    for run in tqdm(config["runs"], desc="consensus", disable=args.no_progress, leave=False):
        topo = jg.topology.make(run.get("topology", config["topology"]), n, seed=int(config["seed"]))
        alg = jg.algorithms.make(run["algorithm"], topo, **run.get("options", {}))
        start = time.perf_counter()
        result = jg.run_consensus(alg, x0, int(config["num_steps"]), jax.random.key(1))
        error = np.asarray(result.error)
        wall = time.perf_counter() - start
        curves[run["name"]] = (error, result.bits)
        rows.append(
            {
                "name": run["name"],
                "topology": topo.name,
                "final_error": float(error[-1]),
                "MB_total": float(result.bits[-1] / 8e6),
                "time": wall,
            }
        )
    plots.plot_consensus(curves, os.path.join(out, "consensus.png"), title=f"{n} nodes, x of shape {config['shape']}")
    with open(os.path.join(out, "consensus.json"), "w") as f:
        json.dump({"config": config, "rows": rows, "error": {k: v[0].tolist() for k, v in curves.items()}}, f)
    print(
        plots.format_table(
            rows,
            [
                ("name", "run", ""),
                ("topology", "topology", ""),
                ("final_error", "final error", ".3e"),
                ("MB_total", "MB (all nodes)", ".2f"),
                ("time", "time(s)", ".2f"),
            ],
        )
    )
    print(f"wrote {out}/consensus.json and consensus.png")
    return 0


# ---- demo -------------------------------------------------------------------------------------


def demo_runs(quick: bool = False) -> list[dict]:
    """The demo's comparison: name -> config overrides (symmetric methods on the ring, push-sum
    methods on the time-varying one-peer exponential graph, as each needs)."""
    runs = [
        {"name": "gossip", "algorithm": "gossip", "topology": "ring"},
        {
            "name": "choco top-10%",
            "algorithm": "choco",
            "topology": "ring",
            "algorithm_options": {"compressor": "top_k", "compressor_options": {"fraction": 0.1}, "gamma": 0.3},
        },
        {
            "name": "power_gossip r1",
            "algorithm": "power_gossip",
            "topology": "ring",
            "algorithm_options": {"rank": 1, "num_iterations": 1},
        },
        {"name": "push_sum", "algorithm": "push_sum", "topology": "one_peer_exponential"},
        {
            "name": "sparse_push 10%",
            "algorithm": "sparse_push",
            "topology": "one_peer_exponential",
            "algorithm_options": {"fraction": 0.1, "gamma": 0.3},
        },
        {
            "name": "scsp 10%",
            "algorithm": "scsp",
            "topology": "one_peer_exponential",
            "algorithm_options": {"fraction": 0.1, "gamma": 0.3},
            "final_merge": 4,
        },
    ]
    return runs


def _demo(args, overrides) -> int:
    from jaxgossip import algorithms, plots
    from jaxgossip.runner import TrainConfig, config_from_dict, run_training

    base = TrainConfig(
        dataset="digits",
        num_nodes=16,
        partition="dirichlet:0.1",
        model="mlp",
        model_options={"hidden": [64]},
        batch_size=16,
        num_rounds=60 if args.quick else 400,
        eval_every=20 if args.quick else 40,
        evals_per_chunk=1 if args.quick else 2,
        lr=0.05,
        weight_decay=1e-4,
        eval_size=360,
    )
    base = config_from_dict(overrides, base)
    out = args.out or os.path.join("runs", "demo")
    os.makedirs(out, exist_ok=True)
    from jaxgossip import data

    dataset = data.load_dataset(base.dataset, data_dir=base.data_dir)
    print(f"data: {dataset.source}")
    print(f"demo: {base.num_nodes} nodes, {base.partition} partition, model {base.model}, {base.num_rounds} rounds")
    results, table = {}, []
    for run in demo_runs(args.quick):
        if run["algorithm"] not in algorithms.REGISTRY:
            print(f"  skipping {run['name']}: algorithm {run['algorithm']!r} is not available")
            continue
        config = base.replace(
            name=run["name"],
            algorithm=run["algorithm"],
            topology=run["topology"],
            algorithm_options=run.get("algorithm_options", {}),
            final_merge=run.get("final_merge"),
        )
        result = run_training(
            config,
            os.path.join(out, run["name"].replace(" ", "_").replace("%", "pct")),
            resume=False,
            progress=not args.no_progress,
            dataset=dataset,
            log=lambda s: None,
        )
        rows = result["rows"]
        results[run["name"]] = rows
        table.append(
            dict(rows[-1], name=f"{run['name']} ({result['built'].topology.name})", wall_time=result["wall_time"])
        )
        print(
            f"  {run['name']:<18} acc {rows[-1]['test_acc']:.4f}  MB/node {rows[-1]['MB_per_node']:.2f}  "
            f"({result['wall_time']:.1f}s)",
            flush=True,
        )
    gossip_mb = next((r["MB_per_node"] for r in table if r["name"].startswith("gossip")), float("nan"))
    for row in table:
        row["reduction"] = gossip_mb / row["MB_per_node"] if row["MB_per_node"] else float("nan")
    text = plots.format_table(table, _TRAIN_COLUMNS)
    print()
    print(text)
    plots.plot_training(results, out, title=f"{base.dataset}, {base.num_nodes} nodes, {base.partition}")
    with open(os.path.join(out, "comparison.md"), "w") as f:
        f.write(f"data: {dataset.source}\n\n```\n{text}\n```\n")
    with open(os.path.join(out, "comparison.json"), "w") as f:
        json.dump({"config": base.to_dict(), "rows": table}, f, indent=1)
    print(
        f"wrote {out}/comparison.md, comparison.json and plots (accuracy_vs_rounds.png, accuracy_vs_bits.png, consensus.png)"
    )
    return 0


def _sweep(args, overrides) -> int:
    import jax

    from jaxgossip import sweeps
    from jaxgossip.runner import load_config

    axes = {}
    for key in [k for k in overrides if k.startswith("sweep.")]:
        value = json.loads(overrides.pop(key))
        axes[key[len("sweep.") :]] = value if isinstance(value, list) else [value]
    seeds = json.loads(overrides.pop("seeds", "3"))
    seeds = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    config = load_config(args.config, overrides)
    out = args.out or os.path.join("runs", "sweep")
    os.makedirs(out, exist_ok=True)
    start = time.perf_counter()
    points, metrics = sweeps.sweep_training(config, axes, seeds)
    jax.block_until_ready(metrics)
    wall = time.perf_counter() - start
    rows = sweeps.summarize(points, metrics)
    from jaxgossip import plots

    columns = [(name, name.split(".")[-1], ".4g") for name in points]
    columns += [
        ("test_acc", "acc(avg)", ".4f"),
        ("test_acc_std", "+-", ".4f"),
        ("consensus", "consensus", ".3g"),
        ("MB_per_node", "MB/node", ".2f"),
    ]
    text = plots.format_table(rows, columns)
    print(text)
    print(f"{len(rows)} grid points x {len(seeds)} seeds in one compile: {wall:.1f}s")
    with open(os.path.join(out, "sweep.json"), "w") as f:
        json.dump(
            {"config": config.to_dict(), "axes": axes, "seeds": seeds, "rows": rows, "wall_time": wall}, f, indent=1
        )
    with open(os.path.join(out, "sweep.md"), "w") as f:
        f.write(f"```\n{text}\n```\n")
    plots.plot_sweep(rows, list(points), os.path.join(out, "sweep.png"))
    print(f"wrote {out}/sweep.json, sweep.md and sweep.png")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``jaxgossip`` console script; returns the exit status (2 on bad input)."""
    parser = argparse.ArgumentParser(prog="jaxgossip", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("train", "train N workers with one algorithm and topology"),
        ("consensus", "communication-only consensus comparison"),
        ("demo", "compare gossip, Choco, PowerGossip, push-sum, Sparse-Push and SCSP on non-IID data"),
        ("sweep", "vmap a training run over seeds x --sweep.AXIS=[values] in one compile"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--config", default=None, help="JSON, YAML or Python config file")
        p.add_argument("--out", default=None, help="output folder")
        p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
        if name == "train":
            p.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint in --out")
        if name == "demo":
            p.add_argument("--quick", action="store_true", help="a 1-minute version")
    args, extra = parser.parse_known_args(argv)
    overrides = _split_overrides(extra)
    try:
        commands = {"train": _train, "consensus": _consensus, "demo": _demo, "sweep": _sweep}
        return commands[args.command](args, overrides)
    except (ValueError, TypeError) as err:
        print(f"jaxgossip {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
