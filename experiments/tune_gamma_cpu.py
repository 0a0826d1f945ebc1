"""Re-derive the consensus step sizes of the CPU reproductions with ``jaxgossip.tune_gamma``.

For every compressed variant of ``configs/powergossip_cpu.py`` (Choco sign / top-1 %, DeepSqueeze
sign on the 8-ring) and ``configs/sparsepush_cpu.py`` (Sparse-Push 1 % / 0.1 %, SCSP on the
one-peer exponential graph), one vmapped consensus sweep over 31 gammas (1e-3 .. 1, log-spaced)
on the config's own graph, compressor and CNN parameter shapes (Fashion-MNIST input 28x28x1), from
the spread-out start of :func:`jaxgossip.engine.tuning.tune_gamma`. Prints and writes a table of the
largest contracting gamma, the recommendation (/ 2.5) and the gamma the config uses.

    python experiments/tune_gamma_cpu.py [--out experiments/results/tune_gamma_cpu] [--quick]

13 minutes on 2 shared CPU cores (load average ~4; 30 under heavy load), a third of it Sparse-Push
0.1 % with 6000 rounds; ``--variants`` runs some and keeps the others' results, ``--quick``: 4 variants, 600 rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import time

import numpy as np

import jaxgossip as jg
from jaxgossip import algorithms, topology
from jaxgossip.engine.tuning import DEFAULT_GAMMAS, model_shapes, tuning_rows
from jaxgossip.run import plots

HERE = os.path.dirname(os.path.abspath(__file__))
# Choco-sign contracts up to gamma 1 here, so its grid extends to 2 (the gossip relaxation limit of
# the 8-ring is 2 / (1 - lambda_min) = 2.6): the same 1.26x spacing.
WIDE = tuple(DEFAULT_GAMMAS) + tuple(float(g) for g in np.geomspace(1.0, 2.0, 4)[1:])


def _load(name):
    return runpy.run_path(os.path.join(HERE, "configs", name))


def variants(quick: bool) -> list[tuple[str, dict, int]]:
    """(label, training config, consensus rounds) of every compressed variant."""
    pg, sp = _load("powergossip_cpu.py"), _load("sparsepush_cpu.py")
    # Rounds: several times 1 / (kept fraction) so that top-k has time to show its growth.
    out = [
        ("powergossip_cpu " + v, pg["get_config"](v), r)
        for v, r in (("choco_topk", 1500), ("choco_sign_tuned", 600), ("deepsqueeze_sign", 600))
    ]
    out += [
        ("sparsepush_cpu " + m, sp["get_config"](m), r)
        for m, r in (("sparse_push_1pct", 1500), ("sparse_push_0p1pct", 6000), ("scsp", 1500))
    ]
    if quick:
        out = [(label, config, min(rounds, 600)) for label, config, rounds in out if "0p1pct" not in label][:4]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(HERE, "results", "tune_gamma_cpu"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--variants", nargs="*", help="only these (e.g. scsp choco_topk)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.json")
    details = {}
    if os.path.exists(path):  # earlier variants are kept; each one is rewritten as soon as it is done
        with open(path) as f:
            details = json.load(f)
    for label, config, rounds in variants(args.quick):
        if args.variants and label.split(" ")[1] not in args.variants:
            continue
        topo = topology.make(config["topology"], config["num_nodes"], seed=config["seed"])
        entry = algorithms.resolve(config["algorithm"])
        options = {**entry.hooks.trainer_options, **config["algorithm_options"]}
        used = options.pop(entry.sweep.step_size)
        shapes = model_shapes(config["model"], (28, 28, 1), 10, **config["model_options"])
        start = time.perf_counter()
        gammas = WIDE if options.get("compressor") == "sign" and config["algorithm"] == "choco" else None
        result = jg.tune_gamma(config["algorithm"], topo, shapes, options=options, gammas=gammas, num_steps=rounds)
        wall = time.perf_counter() - start
        row = {
            "variant": label,
            "algorithm": config["algorithm"],
            "options": json.dumps({k: v for k, v in options.items()}, sort_keys=True),
            "graph": topo.name,
            "rounds": rounds,
            "largest_contracting": result.largest_contracting,
            "recommended": result.recommended,
            "config_gamma": used,
            "seconds": wall,
        }
        details[label] = {**row, "note": result.note, "rows": tuning_rows(result)}
        with open(path, "w") as f:
            json.dump(details, f, indent=1)
        name = label.replace(" ", "_")
        plots.plot_gamma_tuning(result, os.path.join(args.out, f"{name}.png"), title=f"{label} on {topo.name}")
        print(
            f"{label:<38} largest contracting {result.largest_contracting} -> recommended {result.recommended} "
            f"(config: {used}) {result.note} [{wall:.0f}s]",
            flush=True,
        )
    columns = [
        ("variant", "variant", ""),
        ("graph", "graph", ""),
        ("rounds", "rounds", "d"),
        ("largest_contracting", "largest contracting", ".3g"),
        ("recommended", "recommended", ".2g"),
        ("config_gamma", "config gamma", ".4g"),
    ]
    order = [label for label, _, _ in variants(False)]
    table = [details[label] for label in order if label in details]
    print(plots.format_table(table, columns))
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(plots.format_table(table, columns, markdown=True) + "\n")


if __name__ == "__main__":
    main()
