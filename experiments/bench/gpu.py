"""GPU benchmark: 32 ResNet-20 nodes on CIFAR-shaped random data, rounds/s and achieved FLOP/s.

The issue's GPU variant of the training benchmark. N = 32 nodes (``--nodes``), each a CIFAR
ResNet-20 (``make_model("resnet20")``, batch norm, 0.27 M parameters) trained with SGD + Nesterov
momentum and plain gossip on an exponential graph, batch 32 per node, on 32x32x3 synthetic
Gaussian-blob images (``data.make_synthetic``: random class means plus clipped noise, 10 classes;
no real CIFAR needed). Measured:

* ``rounds/s``: the trainer's ``run_chunk`` (compiled ahead of time; compile time reported apart)
  for R = ``--rounds`` rounds with a 32-sample evaluation set, minus the separately timed
  evaluation, median over ``--reps`` calls after a warm-up call.
* ``achieved FLOP/s``: FLOPs of one round's local work = XLA ``cost_analysis`` of the jitted, vmapped
  forward + backward pass of all N nodes on one batch (optimizer and gossip add < 1% and are not
  counted, so this is a slight underestimate), divided by the measured time per round. The chunk's
  own ``cost_analysis`` is printed too but counts a loop body once, not R times.
* ``peak MB``: XLA ``memory_analysis`` of the compiled chunk (arguments + outputs + temporaries -
  aliased).

Designed to finish in well under 5 minutes on one GPU (compile ~1 min, timing seconds). On a machine
without a GPU it refuses (exit code 0, one "SKIPPED" line) unless ``--allow-cpu`` is given; then it
runs a smoke test with tiny sizes (2 nodes, batch 4, 2 rounds, 1 rep) unless sizes are given.

  python experiments/bench/gpu.py                 # on a GPU machine
  python experiments/bench/gpu.py --allow-cpu     # CPU smoke test (~1 min)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _benchlib import compiled_bytes, compiled_flops, header_line, machine_info, median_seconds, write_result  # noqa: E402

from jaxgossip import data  # noqa: E402
from jaxgossip.runner import TrainConfig, make_trainer, prepare  # noqa: E402
from jaxgossip.train import linen_model_fns  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--allow-cpu", action="store_true", help="run on CPU (tiny smoke-test sizes by default)")
    parser.add_argument("--nodes", type=int, default=None, help="N (default 32; 2 on CPU)")
    parser.add_argument("--batch", type=int, default=None, help="batch per node (default 32; 4 on CPU)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per timed chunk (default 20; 2 on CPU)")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions (default 5; 1 on CPU)")
    parser.add_argument("--topology", default="exponential")
    parser.add_argument("--quick", action="store_true", help="accepted for the suite: fewer repetitions")
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    args = parser.parse_args(argv)
    info = machine_info()
    print(header_line(info), flush=True)
    on_gpu = jax.default_backend() == "gpu"
    if not on_gpu and not args.allow_cpu:
        msg = (
            f"SKIPPED: this benchmark needs a GPU (JAX backend is {jax.default_backend()!r}); "
            f"pass --allow-cpu for a tiny CPU smoke test"
        )
        print(msg, flush=True)
        return write_result(args.json, {"machine": info, "skipped": msg})
    small = not on_gpu
    n = args.nodes or (2 if small else 32)
    batch = args.batch or (4 if small else 32)
    rounds = args.rounds or (2 if small else 20)
    reps = args.reps or (1 if small else (3 if args.quick else 5))
    eval_size = 8 if small else 32
    if small:
        print(
            f"CPU smoke test with tiny sizes: N={n}, batch {batch}, {rounds} rounds, {reps} rep(s); the "
            f"numbers below are NOT a GPU measurement",
            flush=True,
        )

    dataset = data.make_synthetic(num_train=n * batch, num_test=eval_size, shape=(32, 32, 3), seed=0)
    config = TrainConfig(
        dataset="synthetic",
        num_nodes=n,
        topology=args.topology,
        algorithm="gossip",
        model="resnet20",
        batch_size=batch,
        num_rounds=rounds,
        eval_every=rounds,
        eval_size=eval_size,
        eval_chunk=eval_size,
        lr=0.1,
        seed=0,
    )
    prep = prepare(config, dataset)
    trainer, _ = make_trainer(config, prep)
    state = jax.block_until_ready(jax.jit(trainer.init)(jax.random.key(0)))
    num_params = sum(int(leaf[0].size) for leaf in jax.tree_util.tree_leaves(state.params))
    start = time.perf_counter()
    chunk = trainer.run_chunk.lower(state, 1).compile()
    evaluate = jax.jit(trainer.evaluate).lower(state, jnp.float32(0.0)).compile()
    compile_s = time.perf_counter() - start
    print(
        f"{prep.topology.name}, {n} x ResNet-20 ({num_params:,} params/node), batch {batch}/node, "
        f"R = {rounds} rounds/chunk; compile {compile_s:.1f} s",
        flush=True,
    )

    # FLOPs of one round's local work: forward + backward of every node on one batch.
    fns = linen_model_fns(prep.model)

    def loss(params, stats, x, y):
        logits, new_stats = fns.apply(params, stats, x, True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), new_stats

    grads = jax.jit(jax.vmap(jax.value_and_grad(loss, has_aux=True)))
    xs = jnp.zeros((n, batch, 32, 32, 3), jnp.float32)
    ys = jnp.zeros((n, batch), jnp.int32)
    step_flops = compiled_flops(grads.lower(state.params, state.batch_stats, xs, ys).compile())
    chunk_flops_raw = compiled_flops(chunk)
    mem = compiled_bytes(chunk)

    jax.block_until_ready(chunk(state))  # warm-up, excluded
    jax.block_until_ready(evaluate(state, jnp.float32(0.0)))
    t_chunk = median_seconds(lambda: chunk(state), reps)
    t_eval = median_seconds(lambda: evaluate(state, jnp.float32(0.0)), reps)
    per_round = max(t_chunk - t_eval, 1e-12) / rounds
    achieved = step_flops / per_round if step_flops else None
    result = {
        "machine": info,
        "smoke_test_on_cpu": small,
        "topology": prep.topology.name,
        "nodes": n,
        "batch_per_node": batch,
        "rounds_per_chunk": rounds,
        "reps": reps,
        "params_per_node": num_params,
        "compile_s": compile_s,
        "chunk_s": t_chunk,
        "eval_s": t_eval,
        "ms_per_round": per_round * 1e3,
        "rounds_per_s": 1.0 / per_round,
        "flops_per_round_fwd_bwd": step_flops,
        "achieved_TFLOPs": achieved / 1e12 if achieved else None,
        "chunk_cost_analysis_flops_raw": chunk_flops_raw,
        "peak_MB": mem / 1e6 if mem is not None else None,
    }
    print("| N | batch/node | ms/round | rounds/s | GFLOP/round (fwd+bwd) | achieved TFLOP/s | peak MB |", flush=True)
    print("|---|---|---|---|---|---|---|", flush=True)
    gflop = f"{step_flops / 1e9:.2f}" if step_flops else "n/a"
    tflops = f"{achieved / 1e12:.3f}" if achieved else "n/a"
    peak = f"{mem / 1e6:.1f}" if mem is not None else "n/a"
    print(
        f"| {n} | {batch} | {per_round * 1e3:.2f} | {1.0 / per_round:.2f} | {gflop} | {tflops} | {peak} |", flush=True
    )
    return write_result(args.json, result)


if __name__ == "__main__":
    main()
