"""Graphs of up to millions of nodes: how fast every family reaches consensus, what its spectral
tools cost, and the largest digits-MLP run that fits a 24 GB accelerator; writes
``experiments/studies/million_nodes.md``.

Parts (``--parts``, comma list):

* ``consensus``: for every family of ``experiments/bench/million_nodes.py`` and N in
  ``--log2-sizes``, gossip ``x <- W(t) x`` (``jaxgossip.mix``, a stochastic graph drawn every
  round from the key) from x0 ~ N(0, 1) ``[N, 1]`` float32 until the relative consensus error
  ``||x - mean|| / ||x0 - mean||`` is at most ``--tol`` (1e-6; push-sum graphs: of ``x / w``), in one jitted ``lax.while_loop``
  capped at ``--max-rounds``; the table gives the rounds (or "> cap"), the bytes of the graph's
  arrays and of x, and the time per round of ``experiments/bench/million_nodes.json`` (D = 1) where
  that file has the row (measured there on a quiet machine; nothing is timed here).
* ``spectral``: ``jaxgossip.topology.spectral_gap`` of every family at increasing N until one call
  passes ``--spectral-seconds`` (60) or N reaches ``--spectral-max-log2``; its wall time is printed
  only to say where the tool stops being practical.
* ``training``: the memory planner's estimate (``jaxgossip.run.plan.plan_memory``) of the largest N
  of the default digits MLP that fits 24 GB, then the training run at that N on this machine
  (``--train-rounds``), with its peak resident memory beside the planner's compiled size.

Consensus rows of a family and size run earlier are kept (the JSON beside the page); a rerun
replaces its own rows, so sizes can be added one command at a time (``--parts page`` only
re-renders the page, e.g. after the bench's JSON changed).

    PYTHONPATH=. python experiments/studies/million_nodes.py --log2-sizes 10,12,14,16 --parts consensus
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxgossip as jg
from jaxgossip import topology

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
from million_nodes import FAMILIES  # noqa: E402

BENCH_JSON = os.path.join(HERE, "..", "bench", "million_nodes.json")
GiB24 = 24 * 10**9


def graph_bytes(graph) -> int:
    """Bytes of the graph's arrays (edge tables, slot table); a graph with failures counts its
    support's, a graph drawn from scratch every round (random_matching, random_out) none."""
    held = graph.support if graph.stochastic and graph.support is not None else graph
    return int(sum(np.asarray(leaf).nbytes for leaf in jax.tree_util.tree_leaves(held)))


def rounds_to_tol(graph, n: int, tol: float, max_rounds: int, seed: int = 0) -> tuple[int, float]:
    """(rounds until the relative consensus error is <= tol, that error), or (max_rounds, error).

    A column-stochastic graph (push-sum: random_out) mixes the values and a weight column of
    ones together and measures the ratio ``x / w``, whose consensus is the average."""
    key = jax.random.key(seed)
    x0 = jax.random.normal(jax.random.key(seed + 1), (n, 1), jnp.float32)
    push_sum = not graph.is_row_stochastic
    if push_sum:
        x0 = jnp.concatenate([x0, jnp.ones_like(x0)], axis=1)

    def error(x, scale):
        values = x[:, :1] / x[:, 1:] if push_sum else x
        return jnp.linalg.norm(values - jnp.mean(x0[:, :1], axis=0)) / scale

    @jax.jit
    def run(x0):
        scale = jnp.linalg.norm(x0[:, :1] - jnp.mean(x0[:, :1], axis=0))

        def cond(carry):
            t, _, err = carry
            return (t < max_rounds) & (err > tol)

        def body(carry):
            t, x, _ = carry
            x = jg.mix(graph.draw(jax.random.fold_in(key, t), t).graph, x, t)
            return t + 1, x, error(x, scale)

        t, _, err = jax.lax.while_loop(cond, body, (jnp.int32(0), x0, jnp.float32(1.0)))
        return t, err

    t, err = run(x0)
    return int(t), float(err)


def bench_round_ms(rows: list[dict], family: str, n: int) -> float | None:
    for row in rows:
        if row["family"] == family and row["num_nodes"] == n and "1" in row["dims"]:
            return row["dims"]["1"]["jaxgossip_round_s"] * 1e3
    return None


def consensus_part(families, log2_sizes, tol, max_rounds, log) -> list[dict]:
    rows = []
    for spec in families:
        for log2 in log2_sizes:
            n = 2**log2
            graph = topology.make(spec, n)
            rounds, err = rounds_to_tol(graph, n, tol, max_rounds)
            row = {
                "family": spec,
                "log2_nodes": log2,
                "rounds": rounds if err <= tol else None,
                "error": err,
                "graph_bytes": graph_bytes(graph),
                "x_bytes": n * 4,
                "max_rounds": max_rounds,
            }
            rows.append(row)
            log(f"{spec:30s} N=2^{log2}: rounds {rounds if err <= tol else f'> {max_rounds}'} (error {err:.2e})")
    return rows


def spectral_part(families, max_log2, seconds, log) -> list[dict]:
    rows = []
    for spec in families:
        for log2 in range(6, max_log2 + 1, 2):
            n = 2**log2
            graph = topology.make(spec, n)
            start = time.perf_counter()
            try:
                gap = float(topology.spectral_gap(graph))
            except Exception as err:  # noqa: BLE001 - not doubly stochastic (push-sum), or no convergence
                note = f"{type(err).__name__}: {str(err)[:90]}"
                rows.append({"family": spec, "log2_nodes": log2, "gap": None, "note": note})
                log(f"{spec:30s} N=2^{log2}: {note}")
                break
            wall = time.perf_counter() - start
            rows.append({"family": spec, "log2_nodes": log2, "gap": gap, "seconds": wall})
            log(f"{spec:30s} N=2^{log2}: gap {gap:.3e} in {wall:.1f} s")
            if wall > seconds:
                break
    return rows


def training_part(log, rounds: int) -> dict:
    """The planner's largest N of the default digits MLP in 24 GB (compiled for cuda and for this
    CPU), then that training run here, ``rounds`` rounds, with its peak resident memory."""
    import resource
    import subprocess
    import tempfile

    from jaxgossip.run.plan import plan_memory
    from jaxgossip.run.runner import TrainConfig

    config = TrainConfig(dataset="digits", num_nodes=64, topology="exponential", model="mlp", batch_size=1)
    plan = plan_memory(config, (("24 GB", GiB24),))
    fit = plan.fits[0]
    log(f"memory plan: {fit}")
    cpu_plan = plan_memory(config.replace(num_nodes=fit.num_nodes), (("24 GB", GiB24),), platform="cpu")
    row = {
        "num_nodes": fit.num_nodes,
        "bytes": fit.bytes,
        "cpu_bytes": cpu_plan.measured[fit.num_nodes],
        "predicted_nodes": fit.predicted,
        "limited_by": fit.limited_by,
        "rule": plan.rule,
        "measured": {str(k): v for k, v in plan.measured.items()},
    }
    with tempfile.TemporaryDirectory() as out:
        argv = [
            "train", "--dataset=digits", "--model=mlp", f"--num_nodes={fit.num_nodes}", "--topology=exponential",
            "--batch_size=1", f"--num_rounds={rounds}", f"--eval_every={rounds // 2}", "--no-progress", "--out", out,
        ]  # fmt: skip
        # its own process, so that its peak resident memory is the run's alone
        command = [sys.executable, "-c", "import sys; from jaxgossip.cli import main; sys.exit(main(sys.argv[1:]))"]
        command += argv
        start = time.perf_counter()
        subprocess.run(command, check=True)
        wall = time.perf_counter() - start
        metrics = json.load(open(os.path.join(out, "metrics.json")))
    # ru_maxrss: the largest resident set of any finished child, in KiB on Linux
    row["run"] = {
        "command": " ".join(["jaxgossip", *argv[:-2]]),
        "rounds": rounds,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
        "wall_s": wall,
        "final": {k: metrics["rows"][-1][k] for k in ("test_acc", "node_acc_mean", "node_acc_min", "consensus")},
    }
    log(f"training run: {row['run']}")
    return row


def markdown(args, consensus, spectral, training) -> str:
    by_cap = {}
    for r in consensus:
        by_cap.setdefault(r.get("max_rounds", args.max_rounds), set()).add(r["log2_nodes"])
    caps = "; ".join(
        f"{cap} at N = {', '.join(f'2^{s}' for s in sorted(sizes))}" for cap, sizes in sorted(by_cap.items(), reverse=True)
    )
    bench = json.load(open(BENCH_JSON))["rows"] if os.path.exists(BENCH_JSON) else []
    lines = [
        "# Million-node graphs: consensus, spectral tools, memory",
        "",
        f"Written by `experiments/studies/million_nodes.py` (`--log2-sizes {args.log2_sizes} --tol {args.tol}`; "
        f"round caps {caps}). Gossip x <- W(t) x from x0 ~ N(0, 1) [N, 1] float32; rounds until "
        "||x - mean|| / ||x0 - mean|| <= tol. Time per round: `experiments/bench/million_nodes.json` (D = 1) "
        "where it has the row, else blank; nothing here is timed.",
        "",
        "## Consensus",
        "",
        "| family | log2 N | rounds to tol | graph MB | x MB | ms per round (bench) |",
        "|---|---|---|---|---|---|",
    ]
    for r in consensus:
        cap = r.get("max_rounds", args.max_rounds)
        rounds = r["rounds"] if r["rounds"] is not None else f"> {cap} (error {r['error']:.1e})"
        round_ms = bench_round_ms(bench, r["family"], 2 ** r["log2_nodes"])  # the bench's latest row
        ms = "" if round_ms is None else f"{round_ms:.3g}"
        lines.append(
            f"| {r['family']} | {r['log2_nodes']} | {rounds} | {r['graph_bytes'] / 1e6:.3g} | "
            f"{r['x_bytes'] / 1e6:.3g} | {ms} |"
        )
    lines += [
        "",
        "x is float32: a round rounds every entry to about 6e-8 relative, so a slowly mixing graph can stall "
        "near 1e-6 (an error just above tol after the cap is that floor, not slow mixing).",
    ]
    done = sorted({r["log2_nodes"] for r in consensus})
    missing = [s for s in range(10, 23, 2) if s not in done]
    if missing:
        lines += [
            "",
            f"Not run: N = {', '.join(f'2^{s}' for s in missing)} (minutes to hours on a 2-core CPU). Command: "
            f"`PYTHONPATH=. python experiments/studies/million_nodes.py --parts consensus --log2-sizes "
            f"{','.join(map(str, missing))}`.",
        ]
    lines += ["", "## Spectral gap", ""]
    if spectral:
        lines += [
            "`jaxgossip.topology.spectral_gap` per family from N = 2^6 up, by 4x, until one call passes "
            f"{args.spectral_seconds:.0f} s, N passes 2^{args.spectral_max_log2} or the tool fails (the failure is "
            "the last row). Seconds: wall time of the call on a loaded 2-core CPU, only to tell where the tool "
            "stops being practical. Graphs whose rounds are convolutions on a group (circulant families, torus, "
            "hypercube, and failures of the ring and torus through their expected Gram matrix) take the group's "
            "Fourier transform (`jaxgossip/topology/convolution.py`), trees (chain, binary tree, star) shift-invert "
            "Lanczos, the others Lanczos.",
            "",
            "| family | log2 N | gap | seconds |",
            "|---|---|---|---|",
        ]
        for r in spectral:
            gap = r.get("note", "n/a") if r["gap"] is None else f"{r['gap']:.4g}"
            seconds = "" if "seconds" not in r else f"{r['seconds']:.2g}"
            lines.append(f"| {r['family']} | {r['log2_nodes']} | {gap} | {seconds} |")
    else:
        lines.append(
            "Not run. Command: `PYTHONPATH=. python experiments/studies/million_nodes.py --parts spectral` "
            "(each family up to the N where one `spectral_gap` call passes 60 s)."
        )
    lines += ["", "## Training: the largest digits MLP run in 24 GB", ""]
    if training:
        measured = ", ".join(f"N = {n}: {b / 1e9:.3g} GB" for n, b in training["measured"].items())
        lines += [
            "`jaxgossip.run.plan.plan_memory` of the default digits MLP (gossip on exponential(N), batch 1 per "
            f"node, compiled for cuda): largest N in 24 GB = {training['num_nodes']} "
            f"({(training['bytes'] or 0) / 1e9:.3g} GB compiled), limited by: {training['limited_by']} "
            f"({training['rule']}); the memory line alone predicts {training['predicted_nodes']:.0f} nodes. "
            f"Compiled sizes: {measured}.",
        ]
        run = training.get("run")
        if run:
            final = run["final"]
            lines += [
                "",
                f"The run at that N on this CPU: `{run['command']}`. Peak resident memory "
                f"{run['peak_rss_bytes'] / 1e9:.3g} GB (the whole process: Python, JAX, the data, the "
                f"checkpoint writer) against the planner's compiled {training['cpu_bytes'] / 1e9:.3g} GB for "
                f"this CPU and {(training['bytes'] or 0) / 1e9:.3g} GB for cuda; after {run['rounds']} rounds "
                f"test accuracy of the average model {final['test_acc']:.4f}, of the nodes {final['node_acc_mean']:.4f} "
                f"(min {final['node_acc_min']:.4f}), consensus distance {final['consensus']:.3g}; "
                f"{run['wall_s']:.0f} s wall on a loaded 2-core CPU.",
            ]
    else:
        lines.append(
            "Not run. The planner's estimate and the run at that N: `PYTHONPATH=. python "
            "experiments/studies/million_nodes.py --parts training`."
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log2-sizes", default="10,12,14,16,18,20,22")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--parts", default="consensus,spectral,training")
    parser.add_argument("--tol", type=float, default=1e-6)
    parser.add_argument("--max-rounds", type=int, default=10_000)
    parser.add_argument("--spectral-seconds", type=float, default=60.0)
    parser.add_argument("--spectral-max-log2", type=int, default=22)
    parser.add_argument("--train-rounds", type=int, default=200, help="rounds of the training run")
    parser.add_argument("--out", default=os.path.join(HERE, "million_nodes.md"))
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    families = args.families.split(",")
    sizes = [int(v) for v in args.log2_sizes.split(",")]
    # Parts run earlier (another --parts) are kept in the JSON beside the page and shown again.
    saved_path = os.path.splitext(args.out)[0] + ".json"
    saved = json.load(open(saved_path)) if os.path.exists(saved_path) else {}
    if "consensus" in parts:
        # rows of other families and sizes, run earlier, are kept; a rerun replaces its own rows
        new = consensus_part(families, sizes, args.tol, args.max_rounds, print)
        keys = {(r["family"], r["log2_nodes"]) for r in new}
        rows = [r for r in saved.get("consensus", []) if (r["family"], r["log2_nodes"]) not in keys] + new
        order = {f: i for i, f in enumerate(FAMILIES)}
        rows.sort(key=lambda r: (order.get(r["family"], len(order)), r["family"], r["log2_nodes"]))
        saved["consensus"] = rows
        done = sorted({r["log2_nodes"] for r in rows})
        saved["consensus_args"] = {
            "log2_sizes": ",".join(map(str, done)),
            "tol": args.tol,
            "max_rounds": args.max_rounds,
        }
    if "spectral" in parts:
        # rows of other families are kept, a rerun replaces its families' rows
        new = spectral_part(families, args.spectral_max_log2, args.spectral_seconds, print)
        rows = [r for r in saved.get("spectral", []) if r["family"] not in set(families)] + new
        order = {f: i for i, f in enumerate(FAMILIES)}
        saved["spectral"] = sorted(rows, key=lambda r: (order.get(r["family"], len(order)), r["family"], r["log2_nodes"]))
    if "training" in parts:
        saved["training"] = training_part(print, args.train_rounds)
    with open(saved_path, "w") as f:
        json.dump(saved, f, indent=1)
    if "consensus_args" in saved:
        args = argparse.Namespace(**{**vars(args), **saved["consensus_args"]})
    text = markdown(args, saved.get("consensus", []), saved.get("spectral", []), saved.get("training"))
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
