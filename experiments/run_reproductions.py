"""CPU-sized paper reproductions: every variant of the PowerGossip and Sparse-Push studies, K seeds.

Runs the CPU-sized configs ``experiments/configs/powergossip_cpu.py`` (10 variants of the
PowerGossip CIFAR-10 table; docs/training.md, section training recipes and models) and
``experiments/configs/sparsepush_cpu.py``
(push-sum, Sparse-Push 1 % / 0.1 %, SCSP on IID, skew 0.8 and Dirichlet(0.1) partitions;
docs/training.md, section training recipes and models) through :func:`jaxgossip.run.runner.run_training`,
and writes per study

* ``table.md``: accuracy of the averaged model (mean +- sample std over seeds), mean node accuracy,
  MB sent per epoch per worker, reduction factor vs the uncompressed baseline (D-SGD for
  PowerGossip, push-sum per partition for Sparse-Push), wall time per run, and the machine;
* ``results.json``: the same plus every seed's final row and seed 0's metric rows;
* plots of seed 0 (:func:`jaxgossip.run.plots.plot_training`): accuracy vs rounds / vs MB, consensus.

into ``experiments/results/repro_powergossip/`` and ``experiments/results/repro_sparsepush/``
(plots per partition in subfolders). The full-size CIFAR-10 configs need a GPU and are not run here.

    python experiments/run_reproductions.py [--study all|powergossip|sparsepush] [--seeds 2]
        [--variants NAME ...] [--partitions SPEC ...] [--set KEY=VALUE ...] [--rounds R]
        [--dataset NAME] [--out experiments/results]

``--set`` overrides a TrainConfig field of every run, e.g. the clipped Dirichlet(0.1) rerun of
experiments/studies/dirichlet.md ("Clipped run"):

    python experiments/run_reproductions.py --study sparsepush --partitions dirichlet:0.1 \
        --set grad_clip=2 --out experiments/results/dirichlet_clip

Seed s sets ``seed = s`` (model init, batches, compression randomness, and, since ``data_seed``
is unset, the partition too). An epoch is ``num_rounds * N * B / M`` with M the training samples
of the dataset loaded: the configs' Fashion-MNIST, or ``--dataset NAME`` (e.g. ``digits``, offline).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import runpy
import time

import jax
import numpy as np
from _common import cpu_model  # noqa: E402

from jaxgossip import data
from jaxgossip.run.plots import format_table, plot_training
from jaxgossip.run.runner import load_config, run_training

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(HERE, "configs")


def machine() -> str:
    """One line: CPU model, core count, JAX version and backend, date."""
    cpu = cpu_model()
    return (
        f"{cpu}, {os.cpu_count()} cores, JAX {jax.__version__} ({jax.default_backend()}), "
        f"{datetime.date.today().isoformat()}"
    )


def study_runs(study: str) -> list[dict]:
    """The runs of a study: name, group (plots / baseline scope), baseline flag, config dict."""
    if study == "powergossip":
        module = runpy.run_path(os.path.join(CONFIGS, "powergossip_cpu.py"))
        return [
            {"name": v, "group": "", "baseline": v == "gossip", "config": module["get_config"](v)}
            for v in module["VARIANTS"]
        ]
    if study == "sparsepush":
        module = runpy.run_path(os.path.join(CONFIGS, "sparsepush_cpu.py"))
        return [
            {"name": f"{m} [{p}]", "group": p, "baseline": m == "push_sum", "config": module["get_config"](m, p)}
            for p in module["PARTITIONS"]
            for m in module["METHODS"]
        ]
    raise ValueError(f"unknown study {study!r}")


def _summary(config: dict) -> str:
    options = config["algorithm_options"]
    parts = [config["algorithm"]]
    for key in ("rank", "num_iterations", "warm_start", "compressor", "fraction", "gamma"):
        if key in options:
            parts.append(f"{key}={options[key]}")
    if "compressor_options" in options:
        parts.append(",".join(f"{k}={v}" for k, v in options["compressor_options"].items()))
    parts.append(f"lr={config['lr']:.4g}")
    if config.get("final_merge"):
        parts.append(f"merge={config['final_merge']}")
    return " ".join(parts)


def run_study(
    study: str,
    seeds: int,
    variants: list[str] | None,
    rounds: int | None,
    out: str,
    dataset,
    partitions: list[str] | None = None,
    settings: dict | None = None,
) -> list[dict]:
    runs = study_runs(study)
    if variants:
        runs = [r for r in runs if r["name"] in variants or r["name"].split(" ")[0] in variants]
    if partitions:
        runs = [r for r in runs if r["group"] in partitions]
    results = []
    for run in runs:
        overrides = dict(settings or {})
        if rounds:  # the schedule scales with the run, as in the configs
            overrides |= {
                "num_rounds": rounds,
                # up to 6 evaluation points that divide the run evenly
                "eval_every": rounds // next(k for k in (6, 5, 4, 3, 2, 1) if rounds % k == 0),
                "warmup_rounds": rounds // 20,
                "decay_rounds": (rounds // 2, (3 * rounds) // 4),
            }
        finals, curves, walls = [], None, []
        for seed in range(seeds):
            config = load_config(None, {**run["config"], **overrides, "seed": seed, "dataset": dataset.name})
            try:
                result = run_training(config, None, progress=False, dataset=dataset, log=lambda s: None)
            except FloatingPointError as err:  # diverged: recorded as NaN accuracy, bits unknown
                print(f"{study} {run['name']} seed {seed}: diverged ({err})", flush=True)
                nan = float("nan")
                finals.append({"test_acc": nan, "node_acc_mean": nan, "MB_per_node": nan, "diverged": str(err)})
                walls.append(nan)
                continue
            finals.append(result.rows[-1])
            walls.append(result.wall_time)
            if curves is None:
                curves = result.rows
            print(
                f"{study} {run['name']} seed {seed}: acc {finals[-1]['test_acc']:.4f} "
                f"MB/node {finals[-1]['MB_per_node']:.3f} ({result.wall_time:.1f} s)",
                flush=True,
            )
        train_size = dataset.y_train.shape[0]
        epochs = config.num_rounds * config.num_nodes * config.batch_size / train_size
        accs = np.array([f["test_acc"] for f in finals])
        mb = float(np.mean([f["MB_per_node"] for f in finals]))
        results.append(
            {
                "name": run["name"],
                "group": run["group"],
                "baseline": run["baseline"],
                "setup": _summary(run["config"]),
                "acc_mean": float(accs.mean()),
                "acc_std": float(accs.std(ddof=1)) if seeds > 1 else 0.0,
                "node_acc": float(np.mean([f["node_acc_mean"] for f in finals])),
                "MB_per_node": mb,
                "MB_per_epoch": mb / epochs,
                "epochs": epochs,
                "wall_time": float(np.mean(walls)),
                "finals": finals,
                "curves": curves or [],
                "config": config.to_dict(),
            }
        )
    for r in results:
        base = next((b for b in results if b["baseline"] and b["group"] == r["group"]), None)
        r["reduction"] = base["MB_per_epoch"] / r["MB_per_epoch"] if base and r["MB_per_epoch"] > 0 else float("nan")
        r["acc"] = f"{r['acc_mean']:.4f} +- {r['acc_std']:.4f}"
        diverged = sum("diverged" in f for f in r["finals"])
        if diverged:
            r["acc"] = f"diverged (NaN loss) in {diverged}/{len(r['finals'])} seeds"
    return results


COLUMNS = [
    ("name", "variant", ""),
    ("setup", "setup", ""),
    ("acc", "acc (avg model)", ""),
    ("node_acc", "acc (nodes)", ".4f"),
    ("MB_per_epoch", "MB / epoch / worker", ".4f"),
    ("reduction", "x less than baseline", ".1f"),
    ("wall_time", "wall s / run", ".1f"),
]


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(h for _, h, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = [format(r[k], f) if isinstance(r[k], float) else str(r[k]) for k, _, f in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write(study: str, results: list[dict], args, dataset, wall: float, out: str) -> None:
    folder = os.path.join(out, f"repro_{study}")
    os.makedirs(folder, exist_ok=True)
    groups = sorted({r["group"] for r in results}, key=[r["group"] for r in results].index)
    for group in groups:
        sub = os.path.join(folder, group.replace(":", "")) if group else folder
        plot_training(
            {r["name"]: r["curves"] for r in results if r["group"] == group},
            sub,
            title=f"{study} CPU reproduction {group}, seed 0",
        )
    header = (
        f"CPU-sized {study} reproduction: {args.seeds} seeds, data: {dataset.source}\n\n"
        f"Machine: {machine()}; study wall time {wall / 60:.1f} min.\n"
        f"Command: `python experiments/run_reproductions.py --study {study} --seeds {args.seeds}"
        + (f" --rounds {args.rounds}" if args.rounds else "")
        + (f" --partitions {' '.join(args.partitions)}" if args.partitions else "")
        + (f" --set {' '.join(args.set)}" if args.set else "")
        + "`\n\n"
    )
    table = markdown(results)
    with open(os.path.join(folder, "table.md"), "w") as f:
        f.write(header + table + "\n")
    with open(os.path.join(folder, "results.json"), "w") as f:
        json.dump(
            {"machine": machine(), "data": dataset.source, "seeds": args.seeds, "wall_time": wall, "results": results},
            f,
            indent=1,
            default=str,
        )
    print(header + table)
    print(format_table(results, [c for c in COLUMNS if c[0] != "setup"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", choices=["all", "powergossip", "sparsepush"], default="all")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--variants", nargs="*", help="only these variant names (e.g. gossip pg_i1_warm scsp)")
    parser.add_argument("--partitions", nargs="*", help="Sparse-Push study: only these partitions (e.g. dirichlet:0.1)")
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="override a config field of every run (grad_clip=2)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="override num_rounds (smoke runs)")
    parser.add_argument("--dataset", default=None, help="override the configs' dataset (default: theirs)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    settings = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set {item!r}: expected KEY=VALUE")
        settings[key] = value  # typed and checked by load_config, as a command-line override
    studies = ["powergossip", "sparsepush"] if args.study == "all" else [args.study]
    for study in studies:
        # Found where the runs will look (a --set raw_dir / data_dir applies here too).
        first = {**study_runs(study)[0]["config"], **settings}
        dataset = data.load_dataset(
            args.dataset or first["dataset"], first.get("data_dir"), raw_dir=first.get("raw_dir")
        )
        start = time.perf_counter()
        results = run_study(study, args.seeds, args.variants, args.rounds, args.out, dataset, args.partitions, settings)
        write(study, results, args, dataset, time.perf_counter() - start, args.out)


if __name__ == "__main__":
    main()
