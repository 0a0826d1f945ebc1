"""Benchmark: one SGD training step of N stacked small CNNs, per conv formulation and batching.

Justifies `conv_impl="auto"` (jaxgossip.models.conv.resolve_conv_impl). Times, on the default
backend, one cross-entropy SGD step of `jaxgossip.models.CNN` (104,202 parameters on 28x28x1) for
N nodes with per-node batch B:

  vmap/<impl>       jit(vmap(step)) over stacked params [N, ...] and batches [N, B, ...]
  lax.map<k>/<impl> jit(lax.map(step, batch_size=k)): vmap over k nodes at a time, sequential over
                    the N / k chunks inside one compiled program (impl=matmul only by default: with
                    impl=lax the convolution inside the loop body was >10x slower than the loop)
  loop/<impl>       Python loop of N calls to a jitted single-model step (per-node pytrees)
  1 model/<impl>    one jitted single-model step (x N shown as the ideal sequential cost)

Each timing excludes compilation and one warm-up call, blocks on the result, and is the median of
--reps runs; the runs of all variants are interleaved so that load from other processes on a
shared machine spreads over all of them.

  python experiments/bench_conv.py --nodes 16 --batch 32 --reps 7

Measured on the shared 2-core XLA:CPU dev box (jax 0.10.2, other jobs running, load ~4), N=16,
B=32, median of 7 (ms): vmap/lax 2117, vmap/matmul 704 (3.0x faster), lax.map4/matmul 532,
loop/lax 366, loop/matmul 438, one model lax 21.2 / matmul 25.3. Separate runs: lax.map1/matmul
415 vs loop/matmul 441; lax.map8/matmul 650 vs vmap/matmul 735. So on CPU the matmul conv is the
right choice under vmap (hence conv_impl="auto" -> "matmul" there), while a sequential map over
nodes (Python loop or lax.map with a small batch_size) beats a full vmap by ~1.7x for conv nets.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import jax
import optax

from jaxgossip.models import CNN


def make_step(model, lr=0.05):
    def loss_fn(params, x, y):
        logits = model.apply({"params": params}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss

    return step


def time_interleaved(candidates, reps):
    """Median (and min) seconds per candidate; rounds interleave candidates to spread load noise."""
    for fn in candidates.values():
        jax.block_until_ready(fn())  # compilation
        jax.block_until_ready(fn())  # warm-up
    times = {name: [] for name in candidates}
    for _ in range(reps):
        for name, fn in candidates.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(t), min(t)) for name, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--impls", default="lax,matmul")
    parser.add_argument("--skip-lax-vmap", action="store_true", help="skip vmap/lax (slow on CPU)")
    parser.add_argument(
        "--map-batch", type=int, default=4, help="lax.map batch_size: nodes vmapped per iteration of the sequential map"
    )
    parser.add_argument(
        "--lax-map-all",
        action="store_true",
        help="also time lax.map with impl=lax (over 10x slower than the loop on CPU)",
    )
    args = parser.parse_args()
    n, b = args.nodes, args.batch

    key_x, key_y, key_p = jax.random.split(jax.random.key(0), 3)
    xs = jax.random.normal(key_x, (n, b, 28, 28, 1))
    ys = jax.random.randint(key_y, (n, b), 0, 10)
    keys = jax.random.split(key_p, n)

    print(f"backend={jax.default_backend()} devices={jax.devices()} jax={jax.__version__}")
    print(f"CNN 104,202 params, N={n} nodes, B={b} per node, 28x28x1, median of {args.reps}")
    candidates = {}
    for impl in args.impls.split(","):
        model = CNN(num_classes=10, conv_impl=impl)
        step = make_step(model)
        stacked = jax.jit(jax.vmap(lambda k, m=model: m.init(k, xs[0])["params"]))(keys)
        per_node = [jax.tree.map(lambda leaf, i=i: leaf[i], stacked) for i in range(n)]
        if not (impl == "lax" and args.skip_lax_vmap):
            vstep = jax.jit(jax.vmap(step))
            candidates[f"vmap/{impl}"] = partial(vstep, stacked, xs, ys)
        if impl == "matmul" or args.lax_map_all:
            mstep = jax.jit(
                lambda p, x, y, step=step: jax.lax.map(lambda a: step(*a), (p, x, y), batch_size=args.map_batch)
            )
            candidates[f"lax.map{args.map_batch}/{impl}"] = partial(mstep, stacked, xs, ys)
        sstep = jax.jit(step)
        candidates[f"loop/{impl}"] = partial(
            lambda sstep, per_node: [sstep(per_node[i], xs[i], ys[i]) for i in range(n)], sstep, per_node
        )
        candidates[f"1 model/{impl}"] = partial(sstep, per_node[0], xs[0], ys[0])

    results = time_interleaved(candidates, args.reps)
    base_name = next(name for name in results if name.startswith("loop/"))
    base = results[base_name][0]
    print(f"{'variant':<18}{'median ms':>11}{'min ms':>9}{'vs ' + base_name:>16}")
    for name, (median, best) in results.items():
        print(f"{name:<18}{1e3 * median:>11.1f}{1e3 * best:>9.1f}{median / base:>15.2f}x")
        if name.startswith("1 model"):
            print(f"{'  x ' + str(n):<18}{1e3 * n * median:>11.1f}{'':>9}{n * median / base:>15.2f}x")
    if "vmap/lax" in results and "vmap/matmul" in results:
        ratio = results["vmap/lax"][0] / results["vmap/matmul"][0]
        print(f"vmap/lax / vmap/matmul = {ratio:.2f}")


if __name__ == "__main__":
    main()
