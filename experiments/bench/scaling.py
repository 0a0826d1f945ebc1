"""Scaling benchmark: ms per training round and peak memory vs node count N and graph degree.

A small MLP (hidden (32,), 2 698 parameters per node on 8x8x1 inputs, 10 classes) is trained with
plain gossip on ``ring(N)`` and ``exponential(N)`` for N in {16, 64, 256, 1024} (``--quick``: up to
256), synthetic Gaussian-blob data (``data.make_synthetic``, 16 samples per node), batch 16 per node,
SGD + Nesterov momentum. Per configuration:

* ``ms/round``: the trainer's ``run_chunk`` compiled ahead of time (``lower().compile()``, compile
  time reported separately and excluded) for one chunk of R = ``eval_every`` rounds, with a 16-sample
  evaluation set; the compiled ``evaluate`` alone is timed too and subtracted, so
  ms/round = (median chunk time - median eval time) / R, medians over ``--reps`` calls after one
  warm-up call.
* ``peak MB``: XLA's ``memory_analysis`` of the compiled chunk (arguments + outputs + temporaries -
  aliased); where the backend does not report it, the bytes of the training state.
* ``us/(N*deg)``: ms/round divided by N x mean out-degree (self excluded). The claim checked is
  "time per round grows at most linearly in N x degree": this column must not grow with N x deg.

  python experiments/bench/scaling.py --quick     # N in {16, 64, 256}
  python experiments/bench/scaling.py --json out.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _benchlib import compiled_bytes, header_line, machine_info, median_seconds, tree_bytes, write_result  # noqa: E402

from jaxgossip import data  # noqa: E402
from jaxgossip.run.resolve import resolve  # noqa: E402
from jaxgossip.run.runner import TrainConfig, make_trainer  # noqa: E402

HIDDEN = (32,)
BATCH = 16
EVAL = 16


def measure(topology: str, n: int, rounds: int, reps: int) -> dict:
    dataset = data.make_synthetic(num_train=BATCH * n, num_test=EVAL, shape=(8, 8, 1), seed=0)
    config = TrainConfig(
        dataset="synthetic",
        num_nodes=n,
        topology=topology,
        algorithm="gossip",
        model="mlp",
        model_options={"hidden": HIDDEN},
        batch_size=BATCH,
        num_rounds=rounds,
        eval_every=rounds,
        eval_size=EVAL,
        eval_chunk=EVAL,
        seed=0,
    )
    prep = resolve(config, dataset)
    trainer, _ = make_trainer(prep.config, prep)
    state = jax.block_until_ready(jax.jit(trainer.init)(jax.random.key(0)))
    start = time.perf_counter()
    chunk = trainer.run_chunk.lower(state, 1).compile()
    evaluate = jax.jit(trainer.evaluate).lower(state, jnp.float32(0.0)).compile()
    compile_s = time.perf_counter() - start
    mem = compiled_bytes(chunk)
    mem_source = "xla"
    if mem is None:
        mem, mem_source = float(tree_bytes(state)), "state"
    jax.block_until_ready(chunk(state))  # warm-up, excluded
    jax.block_until_ready(evaluate(state, jnp.float32(0.0)))
    t_chunk = median_seconds(lambda: chunk(state), reps)
    t_eval = median_seconds(lambda: evaluate(state, jnp.float32(0.0)), reps)
    deg = float(np.mean(prep.topology.out_degree))
    ms = max(t_chunk - t_eval, 0.0) / rounds * 1e3
    return {
        "topology": prep.topology.name,
        "N": n,
        "degree": deg,
        "rounds_per_chunk": rounds,
        "compile_s": compile_s,
        "chunk_ms": t_chunk * 1e3,
        "eval_ms": t_eval * 1e3,
        "ms_per_round": ms,
        "us_per_node_degree": ms * 1e3 / (n * deg),
        "peak_MB": mem / 1e6,
        "memory_source": mem_source,
        "state_MB": tree_bytes(state) / 1e6,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N in {16, 64, 256}")
    parser.add_argument("--rounds", type=int, default=20, help="rounds per timed chunk (R)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    args = parser.parse_args(argv)
    sizes = (16, 64, 256) if args.quick else (16, 64, 256, 1024)
    info = machine_info()
    print(header_line(info), flush=True)
    print(
        f"MLP hidden {HIDDEN}, batch {BATCH}/node, gossip, R = {args.rounds} rounds per chunk, median of {args.reps}",
        flush=True,
    )
    print("| topology | N | mean out-degree | ms/round | us/(N*deg) | peak MB | compile s |", flush=True)
    print("|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for topo in ("ring", "exponential"):
        for n in sizes:
            r = measure(topo, n, args.rounds, args.reps)
            rows.append(r)
            print(
                f"| {r['topology']} | {n} | {r['degree']:.2f} | {r['ms_per_round']:.3f} | "
                f"{r['us_per_node_degree']:.3f} | {r['peak_MB']:.2f}{'' if r['memory_source'] == 'xla' else '*'} | "
                f"{r['compile_s']:.1f} |",
                flush=True,
            )
    # Check: time per round grows at most linearly in N * degree, i.e. the per-(N*deg) cost at the
    # largest size is not above the smallest size's (10% slack for timing noise).
    verdicts = {}
    for topo in ("ring", "exponential"):
        sub = [r for r in rows if r["topology"].startswith(topo + "(")]
        small, large = sub[0], sub[-1]
        ratio_time = large["ms_per_round"] / small["ms_per_round"]
        ratio_work = (large["N"] * large["degree"]) / (small["N"] * small["degree"])
        holds = ratio_time <= 1.1 * ratio_work
        verdicts[topo] = {"time_ratio": ratio_time, "N_deg_ratio": ratio_work, "at_most_linear": holds}
        print(
            f"{topo}: N {small['N']} -> {large['N']}: time x{ratio_time:.1f}, N*deg x{ratio_work:.1f} -> "
            f"at most linear: {'HOLDS' if holds else 'FAILS'}",
            flush=True,
        )
    result = {"machine": info, "rows": rows, "verdicts": verdicts, "args": vars(args)}
    return write_result(args.json, result)


if __name__ == "__main__":
    main()
