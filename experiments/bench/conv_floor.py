"""ResNet-20 training on CPU: each convolution formulation against XLA's own floor and the machine's
matmul peak (results: experiments/studies/conv_cpu.md).

In one process, calls interleaved rep by rep, medians of ``--reps`` after one warm-up, compile time
apart, 0.2 s idle before every call:

  floor <impl> 1 model x N
                      one ResNet-20 forward + backward + SGD step (batch B, BN in train mode) of one
                      model, jitted, straight-line code (no loop); impl = lax (JAX's own gradient
                      convolutions: the floor) and explicit; times N: the cost of N models
                      if XLA ran them one after another at its best
  round <impl>        the trainer's CPU round structure for N nodes: ``lax.map`` over the nodes (one
                      model per loop iteration) of that step, then ring gossip; impl = matmul (im2col
                      + one matmul), explicit (lax forward, gradients as canonical forward
                      convolutions: the new default), lax (JAX's own gradient convolutions)
  trainer             ``runner.build``'s own compiled chunk of one round (``run_chunk(state, 1)``:
                      device-side batch sampling, the local step with the trainer's optimizer,
                      gossip on the ring, conv_impl "auto"), minus its evaluation timed apart
  torch 1 model x N   the same step of one ``torch_loop.ResNet20`` (oneDNN) at 1 and 2 threads, x N
  matmul peak         GFLOP/s of an 8192x576 @ 576x64 float32 matmul (the shape of ResNet-20's
                      largest im2col product at batch 128, 8x8 maps) and of 2048^2 @ 2048^2, XLA
                      (all threads) and torch (1 and 2 threads)

GFLOP/s = XLA's cost analysis of one model's step (FLOPs) x N / time. Random CIFAR-shaped data,
fixed batches (no data loading on either side).

  python experiments/bench/conv_floor.py                      # ~6 min on the 2-core box
  python experiments/bench/conv_floor.py --batch 32 --reps 3  # quicker
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "baselines"))
sys.path.insert(0, os.path.dirname(HERE))
import bench_training  # noqa: E402
from _benchlib import compiled_flops, header_line, linen_sgd_step, machine_info, write_result  # noqa: E402

import jaxgossip as jg  # noqa: E402
from jaxgossip import data, models  # noqa: E402
from jaxgossip.models.adapters import linen_model_fns  # noqa: E402
from jaxgossip.run.runner import TrainConfig  # noqa: E402

try:
    import torch
    import torch_loop as tl
except ImportError:  # torch is an optional benchmark-only dependency
    torch = None


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--impls", default="matmul,explicit", help="round formulations (lax is very slow in loops)")
    parser.add_argument(
        "--settle",
        type=float,
        default=1.0,
        help="idle seconds before each call: torch's OpenMP threads spin ~0.2 s after a call, "
        "which slowed the next XLA call by up to 1.5x with 0.2 s",
    )
    parser.add_argument("--skip-trainer", action="store_true", help="do not time the trainer's own round")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    n, b = args.nodes, args.batch
    info = machine_info()
    print(header_line(info), flush=True)

    rng = np.random.default_rng(1)
    images = rng.standard_normal((n, b, 32, 32, 3)).astype(np.float32)
    labels = rng.integers(0, 10, (n, b)).astype(np.int32)
    x, y = jnp.asarray(images), jnp.asarray(labels)
    opt = optax.sgd(0.1, momentum=0.9)
    topo = jg.topology.ring(n)
    gossip = jg.algorithms.make("gossip", topo)

    cands, compile_s, flops = {}, {}, None
    impls = args.impls.split(",")
    for impl in dict.fromkeys(["lax", "explicit"] + impls):
        fns = linen_model_fns(models.make_model("resnet20", num_classes=10, conv_impl=impl))
        params, bstats = jax.vmap(lambda k, fns=fns: fns.init(k, jnp.zeros((1, 32, 32, 3))))(
            jax.random.split(jax.random.key(0), n)
        )
        opt_state = jax.vmap(opt.init)(params)
        step = linen_sgd_step(fns, opt)
        if impl in ("lax", "explicit"):  # the floor: one model, straight-line code
            one = jax.tree.map(lambda a: a[0], (params, bstats, opt_state))
            start = time.perf_counter()
            c = jax.jit(step).lower(*one, x[0], y[0]).compile()
            compile_s[f"floor {impl}"] = time.perf_counter() - start
            flops = flops or compiled_flops(c)
            cands[f"floor {impl} 1 model x {n}"] = (lambda c=c, one=one: c(*one, x[0], y[0]), n)
        if impl in impls:

            def round_fn(p, bs, o, comm, x, y, step=step):
                p, bs, o, loss = jax.lax.map(lambda a: step(*a), (p, bs, o, x, y))
                p, comm, _ = gossip.step(p, comm, jax.random.key(0))
                return p, bs, o, comm, loss

            state = (params, bstats, opt_state, gossip.init(params))
            start = time.perf_counter()
            c = jax.jit(round_fn).lower(*state, x, y).compile()
            compile_s[f"round {impl}"] = time.perf_counter() - start
            cands[f"round {impl}"] = (lambda c=c, state=state: c(*state, x, y), 1)
        print(f"compiled {impl}: {compile_s}", flush=True)

    if not args.skip_trainer:
        # The trainer as the runner configures it (conv_impl "auto", node_batch "auto"), on a
        # synthetic CIFAR-shaped task; bench_training.vectorized compiles its chunk and evaluation.
        config = TrainConfig(
            dataset="synthetic",
            num_nodes=n,
            topology="ring",
            algorithm="gossip",
            model="resnet20",
            batch_size=b,
            num_rounds=1,
            eval_every=1,
            eval_size=16,
            eval_chunk=16,
            seed=0,
        )
        dataset = data.make_synthetic(num_train=n * b, num_test=16, shape=(32, 32, 3))
        vec = bench_training.vectorized(config, dataset)
        compile_s["trainer"] = vec["compile_s"]
        cands["trainer"] = (vec["chunk"], 1)
        cands["trainer eval (subtracted)"] = (vec["eval"], 1)
        print(f"compiled trainer: {compile_s['trainer']:.1f} s", flush=True)

    if torch is not None:
        torch_model = tl.ResNet20()
        topt = torch.optim.SGD(torch_model.parameters(), lr=0.1, momentum=0.9)
        tx = torch.from_numpy(np.ascontiguousarray(images[0].transpose(0, 3, 1, 2)))
        ty = torch.from_numpy(labels[0].astype(np.int64))

        def torch_step(threads):
            def run():
                torch.set_num_threads(threads)
                topt.zero_grad()
                loss = torch.nn.functional.cross_entropy(torch_model(tx), ty)
                loss.backward()
                topt.step()

            return run

        for threads in (1, 2):
            cands[f"torch 1 model x {n}, {threads} thread{'s' if threads > 1 else ''}"] = (torch_step(threads), n)

    times = {name: [] for name in cands}
    for fn, _ in cands.values():  # warm-up
        jax.block_until_ready(fn())
    for _ in range(args.reps):
        for name, (fn, _) in cands.items():
            time.sleep(args.settle)
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - start)

    # matmul peaks
    peaks = {}
    for label, (m, k, nn) in {"im2col 8192x576 @ 576x64": (8192, 576, 64), "2048^3": (2048, 2048, 2048)}.items():
        a = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32))
        bm = jnp.asarray(rng.standard_normal((k, nn)).astype(np.float32))
        f = jax.jit(jnp.dot).lower(a, bm).compile()
        jax.block_until_ready(f(a, bm))
        reps = max(3, int(2e9 / (2 * m * k * nn)))
        t = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(reps):
                out = f(a, bm)
            jax.block_until_ready(out)
            t.append((time.perf_counter() - start) / reps)
        peaks[f"XLA {label}"] = 2 * m * k * nn / statistics.median(t) / 1e9
        if torch is not None:
            ta, tb = torch.from_numpy(np.asarray(a)), torch.from_numpy(np.asarray(bm))
            for threads in (1, 2):
                torch.set_num_threads(threads)
                t = []
                for _ in range(5):
                    start = time.perf_counter()
                    for _ in range(reps):
                        torch.mm(ta, tb)
                    t.append((time.perf_counter() - start) / reps)
                peaks[f"torch {threads}t {label}"] = 2 * m * k * nn / statistics.median(t) / 1e9

    rows = {}
    print()
    print(f"| ResNet-20, batch {b}, {n} models | s per {n} models | GFLOP/s | x floor |")
    print("|---|---|---|---|")
    floor = statistics.median(times[f"floor lax 1 model x {n}"]) * n
    for name, (_, mult) in cands.items():
        if name == "trainer eval (subtracted)":
            continue
        sec = statistics.median(times[name]) * mult
        if name == "trainer":
            sec -= statistics.median(times["trainer eval (subtracted)"])
        gflops = flops * n / sec / 1e9 if flops else float("nan")
        rows[name] = {"s": sec, "gflops": gflops, "over_floor": sec / floor, "all_s": times[name], "mult": mult}
        print(f"| {name} | {sec:.2f} | {gflops:.0f} | {sec / floor:.2f} |")
    print(
        f"(one model's step: {flops / 1e9 if flops else float('nan'):.1f} GFLOP, XLA cost analysis; compile s {compile_s})"
    )
    print("matmul GFLOP/s: " + ", ".join(f"{k} {v:.0f}" for k, v in peaks.items()))
    result = {
        "machine": info,
        "nodes": n,
        "batch": b,
        "flops_per_model_step": flops,
        "rows": rows,
        "compile_s": compile_s,
        "matmul_gflops": peaks,
    }
    return write_result(args.json, result)


if __name__ == "__main__":
    main()
