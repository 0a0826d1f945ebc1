"""The ``jaxgossip`` console script: ``train``, ``consensus``, ``sweep``, ``topology-sweep``, ``demo`` (edge module).

Every command takes an optional config file (``--config`` JSON/YAML/Python) plus ``--key=value``
overrides of its fields, shows a progress bar, writes its results under ``--out`` and prints a
summary table.

Next to the bits, every table reports what a real deployment would experience under the cost model
of :mod:`jaxgossip.cost`, set with ``--link.*``, ``--node.flops`` and ``--energy.*`` (see
:data:`COST_OPTIONS`): simulated communication time per round and in total, and for training runs
the memory per node, and, when set, compute time, the simulated wall-clock and energy per node.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

import numpy as np

__all__ = ["main", "COST_OPTIONS", "CostModel", "cost_model_from_args", "training_cost"]


def _split_overrides(extra: list[str]) -> dict:
    overrides = {}
    for item in extra:
        if not item.startswith("--") or "=" not in item:
            raise SystemExit(f"jaxgossip: unrecognised argument {item!r}; overrides look like --key=value")
        key, value = item[2:].split("=", 1)
        overrides[key] = value
    return overrides


# ---- cost model -------------------------------------------------------------------------------

# --option: (metavar, help); the defaults live in CostModel. 1 Gbit/s is commodity Ethernet. 100 us
# per message is an assumption, not a measurement: the order of a small TCP message's one-way
# latency inside a LAN or data centre (a switch hop plus two kernel network stacks, tens to a few
# hundred microseconds); wide-area or wireless edge links have 10-100x more.
COST_OPTIONS = {
    "link.bandwidth": ("BIT/S", "bandwidth of every link (default 1e9: 1 Gbit/s Ethernet)"),
    "link.latency": (
        "S",
        "latency paid by every message (default 1e-4: 100 us, an assumed LAN / data-centre TCP message)",
    ),
    "link.mode": (
        "serial|parallel",
        "serial: a node's messages of a round share its uplink one after another (default); "
        "parallel: they go out at once on independent links",
    ),
    "link.allreduce": (
        "ring|message",
        "cost of an all-reduce round: the bandwidth-optimal ring all-reduce (default) or one model-sized "
        "message per node",
    ),
    "node.flops": (
        "FLOP/S",
        "compute speed of a node (e.g. 1e12); adds compute time per round and the simulated wall-clock "
        "of training runs (default: compute not modelled)",
    ),
    "energy.flop": ("J", "joules per FLOP computed; with --energy.bit adds energy per node (default 0)"),
    "energy.bit": ("J", "joules per bit sent (default 0)"),
}


def _dest(option: str) -> str:
    return option.replace(".", "_")


@dataclasses.dataclass(frozen=True)
class CostModel:
    """The CLI's cost-model options, validated (units: bit/s, s, FLOP/s, J)."""

    bandwidth: float = 1e9
    latency: float = 1e-4
    mode: str = "serial"
    allreduce: str = "ring"
    node_flops: float | None = None
    joules_per_flop: float | None = None
    joules_per_bit: float | None = None

    @property
    def energy(self) -> bool:
        """Whether energy is reported (either energy option was given)."""
        return self.joules_per_flop is not None or self.joules_per_bit is not None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def cost_model_from_args(args: argparse.Namespace) -> CostModel:
    """Validates the ``--link.*``, ``--node.flops`` and ``--energy.*`` options.

    Raises:
      ValueError: naming the option: not a number, not finite, out of range, unknown mode.
    """

    units = {"link.bandwidth": "bit/s", "link.latency": "s", "node.flops": "FLOP/s"}

    def number(option: str, strict: bool, default: float | None) -> float | None:
        text = getattr(args, _dest(option), None)
        if text is None:
            return default
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"--{option}={text!r} is not a number") from None
        if not math.isfinite(value) or (value <= 0 if strict else value < 0):
            bound = "> 0" if strict else ">= 0"
            raise ValueError(f"--{option}={text} must be a finite number {bound} ({units.get(option, 'J')})")
        return value

    from jaxgossip import cost

    mode = getattr(args, "link_mode", None) or CostModel.mode
    if mode not in cost.MODES:
        raise ValueError(f"--link.mode={mode!r} is unknown; known modes: {', '.join(cost.MODES)}")
    allreduce = getattr(args, "link_allreduce", None) or CostModel.allreduce
    if allreduce not in cost.ALLREDUCE_MODELS:
        raise ValueError(f"--link.allreduce={allreduce!r} is unknown; known models: {', '.join(cost.ALLREDUCE_MODELS)}")
    return CostModel(
        bandwidth=number("link.bandwidth", True, CostModel.bandwidth),
        latency=number("link.latency", False, CostModel.latency),
        mode=mode,
        allreduce=allreduce,
        node_flops=number("node.flops", True, None),
        joules_per_flop=number("energy.flop", False, None),
        joules_per_bit=number("energy.bit", False, None),
    )


def _simulate(model: CostModel, bits, topo, *, allreduce: bool, exchanges: int = 1, flops: float = 0.0, **kwargs):
    """:func:`jaxgossip.cost.simulate` of ``bits`` [R, N] under ``model``.

    Compute is timed only with ``--node.flops``; the energy of the FLOPs needs no FLOP/s, so the
    callers add it (``F * joules_per_flop`` per round) and only the bits are priced here.
    """
    from jaxgossip import cost

    timed = flops if model.node_flops is not None else 0.0
    return cost.simulate(
        bits,
        None if allreduce else topo,
        cost.LinkModel(model.bandwidth, model.latency),
        mode=model.mode,
        exchanges=1 if allreduce else exchanges,
        allreduce=model.allreduce if allreduce else None,
        flops_per_step=timed,
        device_flops=model.node_flops if timed else None,
        energy=cost.EnergyModel(0.0, model.joules_per_bit or 0.0),
        **kwargs,
    )


def _exchanges(algorithm: str, options: dict) -> int:
    """Sequential exchanges per round: PowerGossip's ``num_iterations``, 1 for everything else."""
    return int(options.get("num_iterations", 1)) if algorithm == "power_gossip" else 1


def _cost_columns(model: CostModel, training: bool) -> list[tuple[str, str, str]]:
    """Table columns of the cost fields that ``model`` produces."""
    columns = [("comm_s_per_round", "comm s/round", ".3g"), ("comm_s", "comm s", ".4g")]
    if training and model.node_flops is not None:
        columns += [("compute_s_per_round", "compute s/round", ".3g"), ("sim_s", "sim s", ".4g")]
    if training:
        columns.append(("mem_MB_per_node", "mem MB/node", ".3g"))
    if model.energy:
        columns.append(("energy_J_per_node", "J/node", ".4g"))
    return columns


def _with_cost(columns: list, model: CostModel, training: bool) -> list:
    """``columns`` with the cost columns inserted after the MB column (and its "vs gossip" ratio)."""
    keys = [c[0] for c in columns]
    at = keys.index("reduction") + 1 if "reduction" in keys else keys.index(next(k for k in keys if "MB" in k)) + 1
    return columns[:at] + _cost_columns(model, training) + columns[at:]


def _step_flops_and_memory(config, dataset, topo, need_flops: bool) -> tuple[float, float]:
    """FLOPs of one node's local step (0 unless ``need_flops``) and bytes per node of a run.

    The step is the gradient of the mean cross-entropy of one node's batch [B, ...], as in
    ``jaxgossip.train.make_train`` (optimizer update, augmentation and evaluation not counted).
    Memory is params, normalization statistics, optimizer and algorithm state, from shapes only.
    """
    import jax
    import optax

    from jaxgossip import cost, models, train
    from jaxgossip.runner import make_algorithm, make_optimizer

    fns = train.linen_model_fns(
        models.make_model(config.model, num_classes=dataset.num_classes, **config.model_options)
    )
    x, y = dataset.x_train[: config.batch_size], dataset.y_train[: config.batch_size]
    params, stats = jax.eval_shape(fns.init, jax.random.key(0), x[:1])
    n = config.num_nodes
    stacked = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct((n, *a.shape), a.dtype), (params, stats))
    opt_state = jax.eval_shape(jax.vmap(make_optimizer(config).init), stacked[0])
    comm_state = jax.eval_shape(make_algorithm(config, topo).init, stacked[0])
    memory = cost.memory_per_node(stacked, opt_state, comm_state, num_nodes=n)
    if not need_flops:
        return 0.0, memory

    def loss(p, batch):
        s, xb, yb = batch
        logits, _ = fns.apply(p, s, xb, True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

    return cost.flops_per_step(loss, params, (stats, x, y)), memory


def training_cost(
    model: CostModel,
    config,
    topo,
    rounds,
    cumulative_bits,
    *,
    flops: float,
    memory: float,
    merge_bits=None,
) -> list[dict]:
    """Cost fields of every evaluation point of a training run (and of its final merge).

    Args:
      model: the cost model.
      config: the run's ``TrainConfig`` (algorithm, options, ordering, final_merge).
      topo: the run's topology.
      rounds: [M] ``Metrics.round``; cumulative_bits: [M, N] ``Metrics.bits``.
      flops: FLOPs of one local step (0: not measured); memory: bytes per node.
      merge_bits: [N] bits each node sent in the final merge, or None.

    Returns:
      M dicts (M + 1 with ``merge_bits``), cumulative up to each point: ``comm_s`` and
      ``comm_s_per_round`` (its mean over the training rounds so far), ``mem_MB_per_node``, with
      ``--node.flops`` ``compute_s_per_round`` and ``sim_s`` (simulated wall-clock), with energy
      options ``energy_J_per_node`` (mean over nodes), and ``gflop_per_step`` when measured. The
      merge adds its rounds (communication only) to ``comm_s``, ``sim_s`` and the energy.
    """
    from jaxgossip import cost

    rounds = np.asarray(rounds).astype(np.int64)
    allreduce = config.algorithm == "allreduce"
    bits = cost.per_round_bits(cumulative_bits, rounds, None if allreduce else topo)
    report = _simulate(
        model,
        bits,
        topo,
        allreduce=allreduce,
        exchanges=_exchanges(config.algorithm, config.algorithm_options),
        flops=flops,
        overlap=config.ordering == "same_iterate",
    )
    flop_joules = flops * (model.joules_per_flop or 0.0)  # per node and round
    comm = np.cumsum(report.comm_time)
    wall = np.cumsum(report.round_time)
    joules = np.cumsum(report.energy.mean(axis=1)) + flop_joules * np.arange(1, bits.shape[0] + 1)
    out = []
    for r in rounds:
        row = {"comm_s_per_round": float(comm[r - 1] / r), "comm_s": float(comm[r - 1])}
        if model.node_flops is not None:
            row["compute_s_per_round"] = float(report.compute_time.max())
            row["sim_s"] = float(wall[r - 1])
        row["mem_MB_per_node"] = memory / 1e6
        if flops:
            row["gflop_per_step"] = flops / 1e9
        if model.energy:
            row["energy_J_per_node"] = float(joules[r - 1])
        out.append(row)
    if merge_bits is not None:
        merge = config.final_merge
        merge = int(merge) if isinstance(merge, str) and merge.isdigit() else merge
        merge_bits = np.asarray(merge_bits, dtype=np.float64)
        start = int(rounds[-1])
        if merge == "exact":
            extra = _simulate(model, merge_bits[None], topo, allreduce=True)
        else:
            # The merge's rounds continue the graph sequence of training (rounds R .. R + merge - 1).
            spread = cost.per_round_bits(
                np.stack([np.zeros_like(merge_bits), merge_bits]), [start, start + merge], topo
            )
            extra = _simulate(model, spread[start:], topo, allreduce=False, start_round=start)
        row = dict(out[-1])
        row["comm_s"] += float(extra.comm_time.sum())
        if "sim_s" in row:
            row["sim_s"] += extra.total_time
        if model.energy:
            row["energy_J_per_node"] += float(extra.energy.sum(axis=0).mean())
        out.append(row)
    return out


def _run_cost(model: CostModel, result: dict, *, out_dir: str | None) -> list[dict]:
    """The rows of a ``run_training`` result with its cost fields; rewrites ``metrics.json`` and
    ``metrics.csv`` under ``out_dir`` with them and the cost model."""
    import jax

    built, metrics, rows = result["built"], result["metrics"], result["rows"]
    config = built.config
    need_flops = model.node_flops is not None or bool(model.joules_per_flop)
    try:
        flops, memory = _step_flops_and_memory(config, built.dataset, built.topology, need_flops)
    except RuntimeError as err:  # the backend counts no FLOPs: report communication only
        print(f"jaxgossip: compute time and FLOP energy not reported: {err}", file=sys.stderr)
        _, memory = _step_flops_and_memory(config, built.dataset, built.topology, False)
        flops, model = 0.0, dataclasses.replace(model, node_flops=None)
    cumulative = np.asarray(metrics.bits, dtype=np.float64)
    merged = len(rows) > cumulative.shape[0]
    merge_bits = None
    if merged:
        merge_bits = np.asarray(jax.device_get(result["state"].bits), np.float64) - cumulative[-1]
    fields = training_cost(
        model, config, built.topology, metrics.round, cumulative, flops=flops, memory=memory, merge_bits=merge_bits
    )
    rows = [dict(row, **extra) for row, extra in zip(rows, fields)]
    if out_dir and os.path.exists(os.path.join(out_dir, "metrics.json")):
        from jaxgossip.runner import _write_metrics

        with open(os.path.join(out_dir, "metrics.json")) as f:
            saved = json.load(f)
        saved.pop("rows", None)
        _write_metrics(out_dir, rows, {**saved, "cost_model": model.to_dict()})
    return rows


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
    rows = _run_cost(args.cost, result, out_dir=out)
    plots.plot_training({config.name or config.algorithm: rows}, out, title=result["built"].topology.name)
    last = dict(rows[-1], name=config.name or config.algorithm, wall_time=result["wall_time"], reduction=float("nan"))
    columns = _with_cost([c for c in _TRAIN_COLUMNS if c[0] != "reduction"], args.cost, training=True)
    print(plots.format_table([last], columns))
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
    from jaxgossip import plots, sweeps

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
        steps = int(config["num_steps"])
        result = jg.run_consensus(sweeps.record_bits(alg, n, steps), x0, steps, jax.random.key(1))
        error = np.asarray(result.error)
        wall = time.perf_counter() - start
        curves[run["name"]] = (error, result.bits)
        report = _simulate(
            args.cost,
            np.asarray(result.state[1], dtype=np.float64),
            topo,
            allreduce=run["algorithm"] == "allreduce",
            exchanges=_exchanges(run["algorithm"], run.get("options", {})),
        )
        row = {
            "name": run["name"],
            "topology": topo.name,
            "final_error": float(error[-1]),
            "MB_total": float(result.bits[-1] / 8e6),
            "comm_s_per_round": float(report.comm_time.mean()),
            "comm_s": float(report.comm_time.sum()),
        }
        if args.cost.energy:
            row["energy_J_per_node"] = float(report.total_energy.mean())
        rows.append(dict(row, time=wall))
    plots.plot_consensus(curves, os.path.join(out, "consensus.png"), title=f"{n} nodes, x of shape {config['shape']}")
    with open(os.path.join(out, "consensus.json"), "w") as f:
        json.dump(
            {
                "config": config,
                "cost_model": args.cost.to_dict(),
                "rows": rows,
                "error": {k: v[0].tolist() for k, v in curves.items()},
            },
            f,
        )
    columns = [
        ("name", "run", ""),
        ("topology", "topology", ""),
        ("final_error", "final error", ".3e"),
        ("MB_total", "MB (all nodes)", ".2f"),
        ("time", "time(s)", ".2f"),
    ]
    print(plots.format_table(rows, _with_cost(columns, args.cost, training=False)))
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
        run_dir = os.path.join(out, run["name"].replace(" ", "_").replace("%", "pct"))
        result = run_training(
            config, run_dir, resume=False, progress=not args.no_progress, dataset=dataset, log=lambda s: None
        )
        rows = _run_cost(args.cost, result, out_dir=run_dir)
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
    text = plots.format_table(table, _with_cost(_TRAIN_COLUMNS, args.cost, training=True))
    print()
    print(text)
    plots.plot_training(results, out, title=f"{base.dataset}, {base.num_nodes} nodes, {base.partition}")
    with open(os.path.join(out, "comparison.md"), "w") as f:
        f.write(f"data: {dataset.source}\n\n```\n{text}\n```\n")
    with open(os.path.join(out, "comparison.json"), "w") as f:
        json.dump({"config": base.to_dict(), "cost_model": args.cost.to_dict(), "rows": table}, f, indent=1)
    print(
        f"wrote {out}/comparison.md, comparison.json and plots "
        "(accuracy_vs_rounds.png, accuracy_vs_bits.png, consensus.png)"
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
    from jaxgossip import data, topology

    dataset = data.load_dataset(config.dataset, data_dir=config.data_dir)
    start = time.perf_counter()
    points, metrics = sweeps.sweep_training(config, axes, seeds, dataset=dataset)
    jax.block_until_ready(metrics)
    wall = time.perf_counter() - start
    rows = sweeps.summarize(points, metrics)
    # The graph is shared by all grid points and seeds (built from the data seed, as prepare does).
    data_seed = config.seed if config.data_seed is None else config.data_seed
    topo = topology.make(config.topology, config.num_nodes, seed=data_seed)
    need_flops = args.cost.node_flops is not None or bool(args.cost.joules_per_flop)
    flops, memory = _step_flops_and_memory(config, dataset, topo, need_flops)
    rounds, bits = np.asarray(metrics.round), np.asarray(metrics.bits, dtype=np.float64)  # [G, S, M], [..., N]
    for g, row in enumerate(rows):
        per_seed = [
            training_cost(args.cost, config, topo, rounds[g, s], bits[g, s], flops=flops, memory=memory)[-1]
            for s in range(bits.shape[1])
        ]
        row.update({key: float(np.mean([c[key] for c in per_seed])) for key in per_seed[0]})
    from jaxgossip import plots

    columns = [(name, name.split(".")[-1], ".4g") for name in points]
    columns += [
        ("test_acc", "acc(avg)", ".4f"),
        ("test_acc_std", "+-", ".4f"),
        ("consensus", "consensus", ".3g"),
        ("MB_per_node", "MB/node", ".2f"),
    ]
    columns = _with_cost(columns, args.cost, training=True)
    text = plots.format_table(rows, columns)
    print(text)
    print(f"{len(rows)} grid points x {len(seeds)} seeds in one compile: {wall:.1f}s")
    with open(os.path.join(out, "sweep.json"), "w") as f:
        json.dump(
            {
                "config": config.to_dict(),
                "cost_model": args.cost.to_dict(),
                "axes": axes,
                "seeds": seeds,
                "rows": rows,
                "wall_time": wall,
            },
            f,
            indent=1,
        )
    with open(os.path.join(out, "sweep.md"), "w") as f:
        f.write(f"```\n{text}\n```\n")
    plots.plot_sweep(rows, list(points), os.path.join(out, "sweep.png"))
    print(f"wrote {out}/sweep.json, sweep.md and sweep.png")
    return 0


# ---- topology-sweep ---------------------------------------------------------------------------

_TOPOLOGY_SWEEP_HELP = """\
Compare graphs: run one algorithm on every topology x size x seed. Graphs with the same node count,
kernel and stochasticity share one compiled program (jaxgossip.topology.stack), vmapped over graphs
and seeds, so a sweep over many graphs costs a few compiles.

Consensus mode (the default): graph g with seed s starts from x0 ~ N(0, 1)^[N, D] and runs
--num_steps rounds of --algorithm. Per graph the table reports the spectral gap, the mean degree,
the final relative error ||X_R - X_bar||^2 / ||X_0 - X_bar||^2 (mean +- std over seeds), the rounds
and MB sent per node until the relative error first drops below --tol (NaN if a seed never gets
there), the total MB per node, the simulated communication time (per round, in all, and until
--tol; cost model of --link.*) and the compile group. A spec that cannot be built at a size
(hypercube for N not a power of 2, torus for prime N, ...) is skipped with a note; an unknown spec is
an error before anything runs.

Training mode (--train): trains the config of --config and --key=value overrides (the fields
`jaxgossip train` takes, e.g. --dataset=digits --num_rounds=200) on every graph with
N = --num_nodes nodes; seed s replaces the config's seed, the data partition and random graphs use
its data_seed (or seed) for all. Per graph: spectral gap, final test accuracy of the averaged
model (mean +- std over seeds), consensus distance, MB sent per node and the cost-model columns.

Both print the table and the number of compiled programs, and write table.md, results.json and a
figure (consensus: topology_sweep.png, the error, rounds and MB to --tol against the spectral gap;
training: accuracy_vs_gap.png) into --out.

examples:
  jaxgossip topology-sweep --topologies=ring,torus,exponential,erdos_renyi:0.3 --sizes=8,16,64 \\
      --out runs/topologies
  jaxgossip topology-sweep --topologies=ring,torus,hypercube --sizes=16,64 --algorithm=choco \\
      --algorithm_options.compressor=sign --algorithm_options.gamma=0.2 --tol=1e-2
  jaxgossip topology-sweep --train --topologies=ring,exponential,complete --dataset=digits \\
      --num_nodes=16 --model=mlp --num_rounds=200 --seeds=2
"""

_TOPOLOGY_SWEEP_OPTIONS = {
    # option: (metavar, default used when not given, help)
    "sizes": ("N,N,...", "8,16,64", "node counts of the consensus mode (default 8,16,64)"),
    "num_steps": ("R", 200, "rounds of the consensus mode (default 200)"),
    "dim": ("D", 64, "values per node in the consensus mode (default 64)"),
    "tol": ("TOL", 1e-4, "target relative error of the consensus mode (default 1e-4)"),
    "graph_seed": ("SEED", 0, "seed of random graphs (erdos_renyi, random_directed) in the consensus mode (default 0)"),
}

_TOPOLOGY_COLUMNS = [
    ("name", "graph", ""),
    ("N", "N", "d"),
    ("spectral_gap", "gap", ".4f"),
    ("mean_degree", "mean deg", ".1f"),
    ("final_error", "final rel. error", ".2e"),
    ("final_error_std", "+-", ".1e"),
    ("rounds_to_tol", "rounds to tol", ".1f"),
    ("MB_to_tol", "MB/node to tol", ".4g"),
    ("MB_per_node", "MB/node", ".4g"),
    ("group", "compile group", "d"),
    ("group_size", "graphs in group", "d"),
]

_TOPOLOGY_TRAIN_COLUMNS = [
    ("name", "graph", ""),
    ("N", "N", "d"),
    ("spectral_gap", "gap", ".4f"),
    ("mean_degree", "mean deg", ".1f"),
    ("test_acc", "acc(avg)", ".4f"),
    ("test_acc_std", "+-", ".4f"),
    ("consensus", "consensus", ".3g"),
    ("MB_per_node", "MB/node", ".2f"),
    ("group", "compile group", "d"),
    ("group_size", "graphs in group", "d"),
]


def _topology_specs(text: str) -> list[str]:
    """``--topologies`` as a list of specs; an unknown family name is a ValueError naming it."""
    from jaxgossip import topology

    specs = [s.strip() for s in text.split(",") if s.strip()]
    if not specs:
        raise ValueError("--topologies is empty; give specs such as ring,torus,erdos_renyi:0.3")
    known = list(topology.FAMILIES)  # the families topology.make understands
    for spec in specs:
        if spec.partition(":")[0] not in known:
            raise ValueError(
                f"--topologies: unknown topology spec {spec!r}; known families: {', '.join(known)} "
                "(with an argument: erdos_renyi:P, random_directed:P, torus:ROWSxCOLS)"
            )
    return specs


def _seed_list(text: str) -> list[int]:
    """``--seeds``: a count S (seeds 0 .. S-1) or a JSON list of ints."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return list(range(value))
    if isinstance(value, list) and value and all(isinstance(s, int) and not isinstance(s, bool) for s in value):
        return value
    raise ValueError(f"--seeds={text!r} must be a count >= 1 (e.g. 3) or a JSON list of ints (e.g. [0,5])")


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--sizes={text!r} must be comma-separated node counts, e.g. 8,16,64") from None
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--sizes={text!r} must hold node counts >= 1")
    return sizes


def _build_graphs(specs: list[str], sizes: list[int], seed: int) -> tuple[list, list[str], list[str]]:
    """Graphs of every size x spec (size-major), their specs, and a note per skipped combination."""
    from jaxgossip import topology

    graphs, graph_specs, notes = [], [], []
    for n in sizes:
        for spec in specs:
            try:
                graphs.append(topology.make(spec, n, seed=seed))
                graph_specs.append(spec)
            except (ValueError, TypeError) as err:
                notes.append(f"note: skipped {spec} at N={n}: {err}")
    for note in notes:
        print(note)
    if not graphs:
        raise ValueError(f"no graph of --topologies={','.join(specs)} could be built at N in {sizes}")
    return graphs, graph_specs, notes


def _gap(topo) -> float:
    from jaxgossip.topology import spectral_gap

    try:
        return float(spectral_gap(topo))
    except ValueError:  # column-stochastic only: no doubly stochastic gap
        return float("nan")


def _markdown_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = [format(r[k], f) if isinstance(r[k], (int, float)) else str(r[k]) for k, _, f in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _consensus_graph_cost(model: CostModel, algorithm: str, options: dict, topo, node_bits, error, tol) -> dict:
    """Cost fields of one graph of a consensus sweep: means over seeds of the simulated
    communication time per round, in all, and until the relative error first drops below ``tol``.

    Args:
      node_bits: [S, R, N] bits each node sent in each round; error: [S, R + 1] consensus error.
    """
    reports = [
        _simulate(model, bits, topo, allreduce=algorithm == "allreduce", exchanges=_exchanges(algorithm, options))
        for bits in node_bits
    ]
    comm = np.cumsum([r.comm_time for r in reports], axis=1)  # [S, R]
    reached = error[:, 1:] / error[:, :1] <= tol  # the rounds_to_tol rule of topology_rows
    to_tol = [comm[s, reached[s].argmax()] if reached[s].any() else np.nan for s in range(comm.shape[0])]
    row = {
        "comm_s_per_round": float(comm[:, -1].mean() / comm.shape[1]),
        "comm_s": float(comm[:, -1].mean()),
        "comm_s_to_tol": float(np.mean(to_tol)),
    }
    if model.energy:
        row["energy_J_per_node"] = float(np.mean([r.total_energy.mean() for r in reports]))
    return row


def _consensus_algorithm(overrides: dict) -> tuple[str, dict]:
    """``--algorithm`` and ``--algorithm_options.*`` (parsed as ``jaxgossip train`` parses them)."""
    from jaxgossip.runner import TrainConfig, config_from_dict

    for key in overrides:
        if key not in ("algorithm", "algorithm_options") and not key.startswith("algorithm_options."):
            raise ValueError(
                f"--{key} is not an option of the consensus mode (it takes --algorithm, --algorithm_options.*, "
                f"{', '.join('--' + o for o in _TOPOLOGY_SWEEP_OPTIONS)}); training config keys need --train"
            )
    config = config_from_dict(overrides, TrainConfig(algorithm="gossip", algorithm_options={}))
    return config.algorithm, dict(config.algorithm_options)


def _write_topology_sweep(out: str, args, title: str, summary: str, notes: list, text: str, payload: dict) -> None:
    command = "jaxgossip " + " ".join(args.argv)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(f"Command: `{command}`\n\n{title}. {summary}\n\n")
        if notes:
            f.write("".join(f"- {n}\n" for n in notes) + "\n")
        f.write(text + "\n")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"command": command, "cost_model": args.cost.to_dict(), "skipped": notes, **payload}, f, indent=1)


def _topology_sweep(args, overrides) -> int:
    from jaxgossip import algorithms, plots, sweeps

    specs = _topology_specs(args.topologies)
    seeds = _seed_list(args.seeds)
    if args.train:
        return _topology_sweep_training(args, overrides, specs, seeds)
    if args.config:
        raise ValueError("--config is a training config; use it with --train")
    algorithm, options = _consensus_algorithm(overrides)
    given = {k: getattr(args, k) for k in _TOPOLOGY_SWEEP_OPTIONS}
    values = {k: d if given[k] is None else given[k] for k, (_, d, _) in _TOPOLOGY_SWEEP_OPTIONS.items()}
    sizes = _sizes(str(values["sizes"]))
    tol = float(values["tol"])
    if not math.isfinite(tol) or tol <= 0:
        raise ValueError(f"--tol={tol} must be a finite number > 0")
    graphs, graph_specs, notes = _build_graphs(specs, sizes, int(values["graph_seed"]))
    algorithms.make(algorithm, graphs[0], **options)  # unknown algorithm or options: fail before compiling
    out = args.out or os.path.join("runs", "topology_sweep")
    start = time.perf_counter()
    result = sweeps.sweep_topologies(
        algorithm,
        graphs,
        dim=values["dim"],
        num_steps=values["num_steps"],
        seeds=seeds,
        options=options,
        stack=not args.no_stack,
        node_bits=True,
    )
    wall = time.perf_counter() - start
    rows = sweeps.topology_rows(result, tol=tol)
    for g, row in enumerate(rows):
        row["spec"] = graph_specs[g]
        row.update(
            _consensus_graph_cost(args.cost, algorithm, options, graphs[g], result.node_bits[g], result.error[g], tol)
        )
    cost_columns = _cost_columns(args.cost, training=False)
    at = [c[0] for c in cost_columns].index("comm_s") + 1
    cost_columns.insert(at, ("comm_s_to_tol", "comm s to tol", ".4g"))
    at = [c[0] for c in _TOPOLOGY_COLUMNS].index("MB_per_node") + 1
    columns = _TOPOLOGY_COLUMNS[:at] + cost_columns + _TOPOLOGY_COLUMNS[at:]
    text = plots.format_table(rows, columns)
    title = (
        f"{algorithm} {options or ''} consensus".replace("  ", " ")
        + f", D={values['dim']}, {values['num_steps']} rounds, {len(seeds)} seeds"
    )
    summary = _compile_summary(len(graphs), len(seeds), len(result.groups), wall, not args.no_stack, algorithm)
    print(text)
    print(summary)
    os.makedirs(out, exist_ok=True)
    plot = plots.plot_topology_sweep(rows, os.path.join(out, "topology_sweep.png"), title=title, tol=tol)
    payload = {
        "mode": "consensus",
        "algorithm": algorithm,
        "options": options,
        "topologies": specs,
        "sizes": sizes,
        "seeds": seeds,
        "num_steps": values["num_steps"],
        "dim": values["dim"],
        "tol": tol,
        "graph_seed": values["graph_seed"],
        "stack": not args.no_stack,
        "groups": result.groups,
        "group_seconds": result.group_seconds,
        "wall_s": wall,
        "rows": rows,
    }
    _write_topology_sweep(out, args, title, summary, notes, _markdown_table(rows, columns), payload)
    print(f"wrote {out}/table.md, results.json and {os.path.basename(plot)}")
    return 0


def _compile_summary(graphs: int, seeds: int, programs: int, wall: float, stack: bool, algorithm: str) -> str:
    from jaxgossip import topology

    if not stack:
        how = "one per graph (--no-stack)"
    elif algorithm not in topology.STACKABLE:
        how = f"one per graph: {algorithm} builds host tables per graph"
    else:
        how = "one per group of same-shape graphs"
    programs_text = "1 compiled program" if programs == 1 else f"{programs} compiled programs"
    return f"{graphs} graphs x {seeds} seeds in {programs_text}, {how}: {wall:.1f} s"


def _topology_sweep_training(args, overrides: dict, specs: list[str], seeds: list[int]) -> int:
    from jaxgossip import algorithms, data, plots, sweeps
    from jaxgossip.runner import load_config

    for option in _TOPOLOGY_SWEEP_OPTIONS:
        if getattr(args, option) is not None:
            raise ValueError(
                f"--{option} is an option of the consensus mode; with --train the graphs have --num_nodes nodes, "
                "run --num_rounds rounds and random graphs use the config's data_seed"
            )
    config = load_config(args.config, overrides)
    if config.final_merge not in (None, 0, "none"):
        raise ValueError(f"--final_merge={config.final_merge!r}: a topology sweep reports training without a merge")
    data_seed = config.seed if config.data_seed is None else config.data_seed
    graphs, graph_specs, notes = _build_graphs(specs, [config.num_nodes], data_seed)
    if config.algorithm not in algorithms.REGISTRY:
        raise ValueError(f"unknown algorithm {config.algorithm!r}; known algorithms: {sorted(algorithms.REGISTRY)}")
    out = args.out or os.path.join("runs", "topology_sweep_train")
    dataset = data.load_dataset(config.dataset, data_dir=config.data_dir)
    start = time.perf_counter()
    metrics, groups = sweeps.sweep_topologies_training(config, graphs, seeds, dataset=dataset, stack=not args.no_stack)
    wall = time.perf_counter() - start
    group_of = {i: g for g, members in enumerate(groups) for i in members}
    need_flops = args.cost.node_flops is not None or bool(args.cost.joules_per_flop)
    flops, rows = None, []
    for g, topo in enumerate(graphs):
        # FLOPs of a local step do not depend on the graph; memory does (the algorithm's state).
        step_flops, memory = _step_flops_and_memory(config, dataset, topo, need_flops and flops is None)
        flops = step_flops if flops is None else flops
        m = metrics[g]
        rounds, bits = np.asarray(m.round), np.asarray(m.bits, dtype=np.float64)  # [S, M], [S, M, N]
        acc = np.asarray(m.test_acc, dtype=np.float64)[:, -1]
        row = {
            "name": topo.name,
            "spec": graph_specs[g],
            "N": topo.num_nodes,
            "spectral_gap": _gap(topo),
            "mean_degree": float(topo.out_degree.mean()),
            "test_acc": float(acc.mean()),
            "test_acc_std": float(acc.std()),
            "test_acc_per_seed": acc.tolist(),
            "test_loss": float(np.asarray(m.test_loss)[:, -1].mean()),
            "consensus": float(np.asarray(m.consensus)[:, -1].mean()),
            "MB_per_node": float(bits[:, -1].mean() / 8e6),
            "group": group_of[g],
            "group_size": len(groups[group_of[g]]),
        }
        per_seed = [
            training_cost(args.cost, config, topo, rounds[s], bits[s], flops=flops, memory=memory)[-1]
            for s in range(len(seeds))
        ]
        row.update({key: float(np.mean([c[key] for c in per_seed])) for key in per_seed[0]})
        rows.append(row)
    columns = _with_cost(_TOPOLOGY_TRAIN_COLUMNS, args.cost, training=True)
    text = plots.format_table(rows, columns)
    title = (
        f"{config.algorithm} training, {config.dataset}, {config.model}, N={config.num_nodes}, "
        f"{config.num_rounds} rounds, {len(seeds)} seeds"
    )
    summary = _compile_summary(len(graphs), len(seeds), len(groups), wall, not args.no_stack, config.algorithm)
    print(text)
    print(summary)
    os.makedirs(out, exist_ok=True)
    plots.plot_topology_training(rows, os.path.join(out, "accuracy_vs_gap.png"), title=title)
    payload = {
        "mode": "train",
        "config": config.to_dict(),
        "data": dataset.source,
        "topologies": specs,
        "seeds": seeds,
        "stack": not args.no_stack,
        "groups": groups,
        "wall_s": wall,
        "rows": rows,
    }
    _write_topology_sweep(out, args, title, summary, notes, _markdown_table(rows, columns), payload)
    print(f"wrote {out}/table.md, results.json and accuracy_vs_gap.png")
    return 0


def _add_topology_sweep_parser(sub) -> None:
    p = sub.add_parser(
        "topology-sweep",
        help="one algorithm on many graphs x sizes x seeds, one compile per group of same-shape graphs",
        description=_TOPOLOGY_SWEEP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # --seed (a config key with --train) must not be read as --seeds
    )
    p.add_argument(
        "--topologies",
        required=True,
        metavar="SPEC,SPEC,...",
        help="graph specs of jaxgossip.topology.make: ring, directed_ring, torus, torus:ROWSxCOLS, hypercube, "
        "exponential, one_peer_exponential, complete, star, erdos_renyi:P, random_directed:P",
    )
    p.add_argument("--seeds", default="3", help="a count S (seeds 0 .. S-1, default 3) or a JSON list such as [0,5]")
    p.add_argument("--train", action="store_true", help="training mode (see above); default: consensus mode")
    p.add_argument("--config", default=None, help="with --train: JSON, YAML or Python training config file")
    p.add_argument("--out", default=None, help="output folder (default runs/topology_sweep[_train])")
    p.add_argument("--no-stack", action="store_true", help="one compiled program per graph (for comparison)")
    for option, (metavar, _, help_option) in _TOPOLOGY_SWEEP_OPTIONS.items():
        kind = {"num_steps": int, "dim": int, "graph_seed": int, "tol": float}.get(option, str)
        p.add_argument(f"--{option}", default=None, type=kind, metavar=metavar, help=help_option)
    p.add_argument_group(
        "algorithm and training options (--key=value)",
        "--algorithm=NAME (default gossip) and --algorithm_options.KEY=VALUE in both modes; with --train\n"
        "every field that `jaxgossip train` takes (--dataset, --num_nodes, --model, --num_rounds, ...)",
    )
    group = p.add_argument_group("cost model (jaxgossip.cost; reported next to the bits)")
    for option, (metavar, help_option) in COST_OPTIONS.items():
        group.add_argument(f"--{option}", dest=_dest(option), default=None, metavar=metavar, help=help_option)


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
        group = p.add_argument_group("cost model (jaxgossip.cost; reported next to the bits)")
        for option, (metavar, help_option) in COST_OPTIONS.items():
            group.add_argument(f"--{option}", dest=_dest(option), default=None, metavar=metavar, help=help_option)
    _add_topology_sweep_parser(sub)
    args, extra = parser.parse_known_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    overrides = _split_overrides(extra)
    try:
        args.cost = cost_model_from_args(args)
        commands = {
            "train": _train,
            "consensus": _consensus,
            "demo": _demo,
            "sweep": _sweep,
            "topology-sweep": _topology_sweep,
        }
        return commands[args.command](args, overrides)
    except (ValueError, TypeError) as err:
        print(f"jaxgossip {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
