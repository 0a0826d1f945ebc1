"""Benchmark: one decentralized training round of N nodes, vectorized trainer vs per-node loops.

One round = a local optimizer step on every node (batch B = 32, SGD + Nesterov momentum + weight
decay from ``resolve.make_optimizer``) followed by one gossip round (plain gossip on a ring). Models:
the small CNN (``make_model("cnn")``, 104,202 parameters on 28x28x1), an MLP with hidden
(256, 256) (269,322 parameters), all on 28x28x1 inputs, and ``mlp_small``: the scaling benchmark's
model and task (``bench/scaling.py``: MLP hidden (32,), 2,698 parameters, 8x8x1 inputs). N = 16, 64
and 256 (MLPs). Three ways of running a round are timed in ONE process, their calls
interleaved rep by rep so that load from other processes on a shared machine spreads over all:

  (a) vec  the trainer exactly as ``runner.build`` configures it: ``trainer.run_chunk(state, 1)``
           (compiled ahead of time) with ``eval_every = R`` rounds per chunk and a 16-sample
           evaluation set. The compiled ``trainer.evaluate`` is timed alongside and subtracted, so
           ms/round is ``(t_chunk - t_eval) / R``; the raw chunk and eval times are printed too.
           Variants: ``conv_impl`` (lax / matmul, CNN only), ``node_batch`` (all = one vmap over N;
           4 or 1 = ``lax.map`` over groups of that many nodes) and ``devices`` (1, or the node axis
           spread over 2 CPU devices with ``jax.sharding``; ``jax_num_cpu_devices`` is set first).
  (b) 1xN  one node's jitted local step (same model, loss and optimizer) called N times on the N
           nodes' parameters with fixed batches: no sampling, no gossip.
  (c) loop a per-process-style simulator: a Python loop over nodes, each drawing its batch with
           NumPy from its host-side shard and calling the jitted single-node step, then gossip in
           NumPy (each node's parameters flattened by a jitted ravel, copied to the host, mixed with
           the ring's in-neighbour weights, copied back). ``np-gossip`` times that gossip alone.

Breakdown rows (each piece jitted alone on the stacked [N, ...] state): ``vmap-step`` (jit(vmap(local
step)), i.e. a round without the trainer's scan, sampler and gossip), ``opt-update`` (the vmapped
optimizer update alone), ``gossip`` (``algorithm.step``) and ``sample`` (``data.sample_batch``).
GFLOP/s uses the XLA cost analysis of one node's step times N. The targets are checked at the end
(experiments/studies/training_benchmark.md, "Targets"): CNN at N = 16 >= 2x faster than (c); MLP at
N = 64 >= 10x faster than (c); vectorized <= 1.0x the time of (b).

With ``conv_impl="lax"`` the trainer takes tens of seconds per round on XLA:CPU (its convolutions
run inside ``lax.scan``/``lax.map`` loop bodies, where the kernel-gradient convolution is 35-45x
slower; jax-ml/jax#12868), so by default only its default variant (all nodes, 1 device) is timed,
once, for R = 1; ``--full`` adds node_batch=4 and 2 devices for it (+~4 min). ``--conv-in-loop``
times just that effect on one convolution layer (~10 s).

  python experiments/bench_training.py           # ~6 min (347 s) on the shared 2-core dev box
  python experiments/bench_training.py --quick   # ~3 min: CNN N=16 (no lax trainer) and MLP N=64

Results on the dev box and conclusions: experiments/studies/training_benchmark.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from functools import partial

import jax
from _common import cpu_model  # noqa: E402

# Must run before anything touches the backend, hence read from argv by hand (--cpu-devices=K form).
_CPU_DEVICES = 2
for _arg in sys.argv[1:]:
    if _arg.startswith("--cpu-devices="):
        _CPU_DEVICES = int(_arg.split("=", 1)[1])
jax.config.update("jax_num_cpu_devices", _CPU_DEVICES)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402

from jaxgossip import data, models  # noqa: E402
from jaxgossip.models.adapters import linen_model_fns  # noqa: E402
from jaxgossip.ops import sharding
from jaxgossip.run.resolve import make_optimizer  # noqa: E402
from jaxgossip.run.runner import TrainConfig, build  # noqa: E402

BATCH = 32
EVAL = 16


def machine_info() -> str:
    model = cpu_model()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"date {datetime.datetime.now().isoformat(timespec='minutes')} | nproc {os.cpu_count()} | CPU {model} | "
        f"jax {jax.__version__} | backend {jax.default_backend()} x{len(jax.devices())} | load avg {load}"
    )


def machine_ceiling() -> str:
    """Peak-ish GFLOP/s of one big matmul and GB/s of one big elementwise pass, for context."""
    a = jnp.ones((1024, 1024), jnp.float32)
    v = jnp.ones((16 * 2**20,), jnp.float32)  # 64 MiB
    mm, ax = jax.jit(lambda a: a @ a), jax.jit(lambda v: v * 1.5 + 1.0)
    out = {}
    for name, fn, arg in (("mm", mm, a), ("ax", ax, v)):
        jax.block_until_ready(fn(arg))
        ts = []
        for _ in range(5):
            start = time.perf_counter()
            jax.block_until_ready(fn(arg))
            ts.append(time.perf_counter() - start)
        out[name] = statistics.median(ts)
    return (
        f"1024^3 f32 matmul {2 * 1024**3 / out['mm'] / 1e9:.0f} GFLOP/s; 64 MiB read+write "
        f"{2 * v.nbytes / out['ax'] / 1e9:.1f} GB/s (medians of 5)"
    )


# ----------------------------------------------------------------------------------------------
# Candidates


# Case name -> (model, options, input shape). "mlp_small" is the scaling benchmark's small MLP on
# 8x8x1 inputs: a round there is dominated by per-call overheads, which is what
# vectorizing the nodes removes; "mlp" (269,322 parameters) is memory-bound.
MODELS = {
    "cnn": ("cnn", {}, (28, 28, 1)),
    "mlp": ("mlp", {"hidden": (256, 256)}, (28, 28, 1)),
    "mlp_small": ("mlp", {"hidden": (32,)}, (8, 8, 1)),
}


def base_config(model: str, n: int, impl: str | None, rounds: int) -> TrainConfig:
    name, options, _ = MODELS[model]
    return TrainConfig(
        dataset="synthetic",
        num_nodes=n,
        topology="ring",
        algorithm="gossip",
        model=name,
        model_options={**options, "conv_impl": impl} if name == "cnn" else options,
        batch_size=BATCH,
        num_rounds=rounds,
        eval_every=rounds,
        eval_size=EVAL,
        eval_chunk=EVAL,
        seed=0,
    )


def vectorized(config: TrainConfig, dataset) -> dict:
    """(a): the trainer's compiled chunk of R rounds + one evaluation, and that evaluation alone.

    Both are compiled ahead of time (``lower().compile()``), so their first call is already warm."""
    built = build(config, dataset)
    trainer = built.trainer
    state = trainer.init(jax.random.key(config.seed))
    if built.mesh is not None:
        state = sharding.shard_nodes(state, built.mesh, config.num_nodes)
    start = time.perf_counter()
    chunk = trainer.run_chunk.lower(state, 1).compile()
    evaluate = jax.jit(trainer.evaluate).lower(state, jnp.float32(0.0)).compile()
    return {
        "chunk": partial(chunk, state),
        "eval": partial(evaluate, state, jnp.float32(0.0)),
        "compile_s": time.perf_counter() - start,
        "built": built,
        "state": state,
    }


def single_step_fn(config: TrainConfig, num_classes: int):
    """One node's local step (the trainer's loss and optimizer, no node axis)."""
    fns = linen_model_fns(models.make_model(config.model, num_classes=num_classes, **config.model_options))
    optimizer = make_optimizer(config)

    def loss_fn(params, x, y):
        logits, _ = fns.apply(params, {}, x, True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, optimizer


def per_node(tree, n):
    host = jax.device_get(tree)
    dev = jax.devices()[0]
    return [jax.device_put(jax.tree_util.tree_map(lambda leaf, i=i: leaf[i], host), dev) for i in range(n)]


def loops(config: TrainConfig, dataset, vec_state, built) -> dict:
    """(b) N single-node steps, (c) the per-node simulator with NumPy gossip, and (c)'s gossip alone."""
    n = config.num_nodes
    step, optimizer = single_step_fn(config, dataset.num_classes)
    sstep = jax.jit(step)
    params = per_node(vec_state.params, n)
    dev = jax.devices()[0]
    # Everything committed to one device, so the jitted step sees one signature in every round.
    opts = [jax.device_put(optimizer.init(p), dev) for p in params]
    rng = np.random.default_rng(0)
    parts = data.partition(dataset.y_train, n, config.partition, seed=config.seed)
    shard_x = [np.ascontiguousarray(dataset.x_train[p]) for p in parts]
    shard_y = [np.ascontiguousarray(dataset.y_train[p]) for p in parts]
    fixed = [jax.device_put((shard_x[i][:BATCH], shard_y[i][:BATCH]), jax.devices()[0]) for i in range(n)]

    def n_single():
        return [sstep(params[i], opts[i], *fixed[i]) for i in range(n)]

    _, unravel = ravel_pytree(params[0])
    ravel = jax.jit(lambda p: ravel_pytree(p)[0])
    unravel = jax.jit(unravel)
    nbr, w = built.topology.slots
    nbr, w = nbr[0], w[0].astype(np.float32)  # ring: static, T = 1
    state = {"params": list(params), "opts": list(opts)}

    def np_gossip(p):
        vecs = [np.asarray(ravel(p[i])) for i in range(n)]  # each node "sends" a host copy
        out = []
        for i in range(n):
            mixed = w[i, 0] * vecs[nbr[i, 0]]
            for k in range(1, nbr.shape[1]):
                mixed = mixed + w[i, k] * vecs[nbr[i, k]]
            # committed to the device like the initial per-node params, so sstep is not recompiled
            out.append(unravel(jax.device_put(mixed, dev)))
        return out

    def simulator():
        p, o = state["params"], state["opts"]
        for i in range(n):
            idx = rng.integers(0, shard_y[i].shape[0], BATCH)
            p[i], o[i], _ = sstep(p[i], o[i], shard_x[i][idx], shard_y[i][idx])
        state["params"] = np_gossip(p)
        return state["params"]

    flops = None
    try:
        cost = sstep.lower(params[0], opts[0], *fixed[0]).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        flops = float(cost.get("flops", 0.0)) or None
    except Exception:  # cost analysis is best-effort
        pass
    return {
        "1xN": n_single,
        "loop": simulator,
        "np-gossip": partial(np_gossip, params),
        "flops": flops,
        "step": step,
        "optimizer": optimizer,
    }


def breakdown(config: TrainConfig, built, state, step, optimizer) -> dict:
    """Pieces of the vectorized round, each jitted alone: vmapped local step (= a round without the
    trainer's scan, sampler and gossip), the optimizer update alone, the gossip step, the sampler."""
    parts = data.partition(built.dataset.y_train, config.num_nodes, config.partition, seed=config.seed)
    node_shards = data.shard_dataset(built.dataset, parts)
    sample = jax.jit(lambda key: data.sample_batch(node_shards, key, BATCH))
    x, y = sample(jax.random.key(1))
    vstep = jax.jit(jax.vmap(step))
    grads = jax.tree_util.tree_map(jnp.ones_like, state.params)
    update = jax.jit(jax.vmap(lambda g, o, p: optax.apply_updates(p, optimizer.update(g, o, p)[0])))
    comm = jax.jit(built.algorithm.step)
    return {
        "vmap-step": partial(vstep, state.params, state.opt_state, x, y),
        "opt-update": partial(update, grads, state.opt_state, state.params),
        "gossip": partial(comm, state.params, state.comm_state, jax.random.key(2)),
        "sample": partial(sample, jax.random.key(1)),
    }


def conv_in_loop(log) -> None:
    """Why the trainer cannot use ``conv_impl="lax"`` on XLA:CPU: one 3x3 convolution of the CNN
    (32 x 14x14x32 -> 64 channels) and its two gradients, twice in straight-line code vs inside a
    2-iteration ``lax.fori_loop`` (what ``lax.scan`` / ``lax.map`` compile to)."""
    from jax import lax

    x = jax.random.normal(jax.random.key(0), (BATCH, 14, 14, 32))
    k = jax.random.normal(jax.random.key(1), (3, 3, 32, 64))
    g = jax.random.normal(jax.random.key(2), (BATCH, 14, 14, 64))

    def conv(x, k):
        return lax.conv_general_dilated(x, k, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC"))

    pieces = {
        "forward": conv,
        "kernel gradient": lambda x, k: jax.vjp(lambda k: conv(x, k), k)[1](g)[0],
        "input gradient": lambda x, k: jax.vjp(lambda x: conv(x, k), x)[1](g)[0],
    }

    def timed(fn):
        fn = jax.jit(fn)
        jax.block_until_ready(fn(x, k))
        ts = []
        for _ in range(5):
            start = time.perf_counter()
            jax.block_until_ready(fn(x, k))
            ts.append(time.perf_counter() - start)
        return 1e3 * statistics.median(ts)

    log("lax conv 14x14x32->64, B=32, two evaluations (ms): straight-line vs inside fori_loop(2)")
    for name, f in pieces.items():
        outside = timed(lambda x, k, f=f: f(x, k).sum() + f(x * 1.0001, k).sum())
        inside = timed(lambda x, k, f=f: lax.fori_loop(0, 2, lambda i, c: c + f(x, k).sum(), 0.0))
        log(f"  {name:<16} {outside:8.2f} {inside:9.2f}  ({inside / outside:.1f}x)")


# ----------------------------------------------------------------------------------------------
# Timing


def time_interleaved(candidates: dict, reps: dict, log) -> dict:
    """Median/min/max seconds per candidate; calls interleaved round-robin across candidates.

    A candidate gets one untimed warm-up call and then ``reps[name]`` timed calls, except that with
    ``reps[name] == 1`` (slow ones, compiled ahead of time) the single call is the measurement."""
    times = {name: [] for name in candidates}
    for name, fn in candidates.items():
        start = time.perf_counter()
        jax.block_until_ready(fn())
        elapsed = time.perf_counter() - start
        log(f"    first call {name:<30} {elapsed:7.2f} s")
        if reps[name] == 1:  # slow and compiled ahead of time: the first call is the measurement
            times[name].append(elapsed)
    for r in range(max(reps.values())):
        for name, fn in candidates.items():
            if reps[name] == 1 or r >= reps[name]:
                continue
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(t), min(t), max(t), len(t)) for name, t in times.items()}


def run_case(case: dict, log) -> list[dict]:
    """All candidates of one (model, N), timed together. Returns rows for the table."""
    model, n, rounds, reps = case["model"], case["n"], case["rounds"], case["reps"]
    dataset = data.make_synthetic(num_train=n * 64, num_test=EVAL, shape=MODELS[model][2], seed=0)
    cands, meta, nreps, flops, compile_s = {}, {}, {}, {}, {}
    for impl in case["impls"]:
        impl_rounds = case.get("rounds_by_impl", {}).get(impl, rounds)
        cfg = base_config(model, n, impl, impl_rounds)
        tag = f"/{impl}" if impl else ""
        ref = None
        for nb, devs in case["vec"].get(impl, []):
            v = vectorized(cfg.replace(node_batch=nb or 0, devices=devs), dataset)
            name = f"vec nb={'all' if nb is None else nb} dev={devs}{tag}"
            compile_s[name] = v["compile_s"]
            log(f"    compiled {name:<30} {v['compile_s']:6.1f} s")
            cands[name], cands["eval " + name] = v["chunk"], v["eval"]
            meta[name] = ("a", impl, impl_rounds)
            slow = impl == "lax"  # the lax conv inside the trainer's scan: tens of seconds per round
            nreps[name] = nreps["eval " + name] = 1 if slow else reps
            if ref is None and devs == 1:
                ref = v
        if ref is None:  # no vectorized variant of this impl: a plain build for the loops' inputs
            ref = {"built": build(cfg, dataset)}
            ref["state"] = ref["built"].trainer.init(jax.random.key(cfg.seed))
        lp = loops(cfg, dataset, ref["state"], ref["built"])
        flops[impl] = lp["flops"]
        if impl not in case.get("loops_for", {impl}):
            continue
        for key, kind in (("1xN", "b"), ("loop", "c")):
            cands[f"{key}{tag}"] = lp[key]
            meta[f"{key}{tag}"] = (kind, impl, None)
        pieces = {"np-gossip": lp["np-gossip"]}
        if case["breakdown"]:
            pieces.update(breakdown(cfg, ref["built"], ref["state"], lp["step"], lp["optimizer"]))
        for part, fn in pieces.items():
            cands[f"{part}{tag}"] = fn
            meta[f"{part}{tag}"] = ("p", impl, None)
    for name in cands:
        nreps.setdefault(name, reps)
    log(f"  {model} N={n}: timing {len(cands)} callables")
    res = time_interleaved(cands, nreps, log)
    rows = []
    for name, (kind, impl, impl_rounds) in meta.items():
        med, lo, hi, count = res[name]
        row = dict(
            model=model,
            n=n,
            name=name,
            kind=kind,
            impl=impl,
            ms=1e3 * med,
            reps=count,
            spread=(1e3 * lo, 1e3 * hi),
            flops=flops.get(impl),
        )
        if kind == "a":
            ev = res["eval " + name][0]
            row.update(
                ms=1e3 * (med - ev) / impl_rounds,
                chunk_ms=1e3 * med,
                eval_ms=1e3 * ev,
                rounds=impl_rounds,
                compile_s=compile_s[name],
            )
        rows.append(row)
    return rows


def print_table(rows, log):
    cases = {}
    for r in rows:
        cases.setdefault((r["model"], r["n"]), []).append(r)
    for (model, n), rs in cases.items():
        loop = {r["impl"]: r["ms"] for r in rs if r["kind"] == "c"}
        single = {r["impl"]: r["ms"] for r in rs if r["kind"] == "b"}
        best_loop = min(loop.values())
        log(f"\n{model.upper()} N={n}, B={BATCH}: ms per round (median); speedup = loop ms / variant ms")
        log(
            f"  {'variant':<28}{'ms/round':>10}{'vs loop':>9}{'vs best':>9}{'/ 1xN':>8}{'GFLOP/s':>9}"
            f"{'reps':>5}   chunk ms (R), eval ms"
        )
        for r in rs:
            impl, fl = r["impl"], r["flops"]
            compute = r["name"].split("/")[0] in ("1xN", "loop", "vmap-step") or r["kind"] == "a"
            gf = f"{n * fl / (r['ms'] * 1e6):9.1f}" if (fl and compute) else f"{'':>9}"
            if r["kind"] == "p":
                log(f"  {'  ' + r['name']:<28}{r['ms']:10.1f}{'':>26}{gf}{r['reps']:>5}")
                continue
            extra = f"   {r['chunk_ms']:.0f} ({r['rounds']}), {r['eval_ms']:.1f}" if r["kind"] == "a" else ""
            same = f"{loop[impl] / r['ms']:8.2f}x" if impl in loop else f"{'-':>9}"
            ones = single.get(impl, min(single.values()))  # no same-impl 1xN: the fastest one
            log(
                f"  {r['name']:<28}{r['ms']:10.1f}{same}{best_loop / r['ms']:8.2f}x"
                f"{r['ms'] / ones:7.2f}x{gf}{r['reps']:>5}{extra}"
            )
        fl = {r["impl"]: r["flops"] for r in rs if r["flops"]}
        if fl:
            log(
                "  one node's step (XLA cost analysis): "
                + ", ".join(f"{impl or model} {f / 1e9:.3f} GFLOP" for impl, f in fl.items())
            )


def check_targets(rows, log):
    log("\nTargets (best vectorized variant vs the fastest per-node variant of that model and N):")

    def best(model, n, kind):
        cands = [r for r in rows if r["model"] == model and r["n"] == n and r["kind"] == kind]
        return min(cands, key=lambda r: r["ms"]) if cands else None

    for model, n, factor in (("cnn", 16, 2.0), ("mlp", 64, 10.0), ("mlp_small", 64, 10.0)):
        vec, loop = best(model, n, "a"), best(model, n, "c")
        if vec is None or loop is None:
            log(f"  {model} N={n}: not measured")
            continue
        speed = loop["ms"] / vec["ms"]
        log(
            f"  {model} N={n} >= {factor:g}x faster than the per-node loop: {speed:.2f}x ({vec['name']} "
            f"{vec['ms']:.1f} ms vs {loop['name']} {loop['ms']:.1f} ms) -> {'HOLDS' if speed >= factor else 'MISSED'}"
        )
    for model, n in sorted({(r["model"], r["n"]) for r in rows}):
        vec, single = best(model, n, "a"), best(model, n, "b")
        if vec and single:
            ratio = vec["ms"] / single["ms"]
            log(
                f"  {model} N={n} vectorized <= 1.0x N single steps: {ratio:.2f}x ({vec['name']} {vec['ms']:.1f} ms vs "
                f"{single['name']} {single['ms']:.1f} ms) -> {'HOLDS' if ratio <= 1.0 else 'MISSED'}"
            )


def plan(quick: bool, full: bool, two_devices: bool) -> list[dict]:
    """Which variants each (model, N) case times; sized for ~5-6 min on the shared 2-core box."""
    dev2 = [2] if two_devices else []
    grid = [(nb, d) for d in [1] + dev2 for nb in (None, 4)]
    lax_vec = grid if full else [(None, 1)]  # lax conv in the trainer: 17-45 s/round at N=16
    if quick:
        return [
            dict(
                model="cnn",
                n=16,
                impls=["lax", "matmul"],
                vec={"matmul": grid + [(1, 1)]},
                rounds=1,
                reps=2,
                breakdown=False,
            ),
            dict(model="mlp", n=64, impls=[None], vec={None: grid + [(1, 1)]}, rounds=4, reps=2, breakdown=True),
            dict(model="mlp_small", n=64, impls=[None], vec={None: [(None, 1)]}, rounds=8, reps=3, breakdown=False),
        ]
    return [
        dict(
            model="cnn",
            n=16,
            impls=["lax", "matmul"],
            vec={"lax": lax_vec, "matmul": grid + [(1, 1)]},
            rounds=2,
            rounds_by_impl={"lax": 1},
            reps=3,
            breakdown=True,
        ),
        dict(model="mlp", n=16, impls=[None], vec={None: grid + [(1, 1)]}, rounds=8, reps=4, breakdown=True),
        dict(model="mlp", n=64, impls=[None], vec={None: grid + [(1, 1)]}, rounds=8, reps=4, breakdown=True),
        dict(model="mlp", n=256, impls=[None], vec={None: [(None, 1), (4, 1)]}, rounds=4, reps=2, breakdown=False),
        *(
            dict(model="mlp_small", n=k, impls=[None], vec={None: [(None, 1)]}, rounds=8, reps=4, breakdown=False)
            for k in (16, 64, 256)
        ),
        # N=64 CNN: the per-node baselines with the faster (lax) conv; the trainer with matmul convs.
        dict(
            model="cnn",
            n=64,
            impls=["lax", "matmul"],
            vec={"matmul": [(None, 1), (4, 1), (1, 1)]},
            loops_for={"lax"},
            rounds=1,
            reps=2,
            breakdown=False,
        ),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="CNN N=16 (without the lax trainer) and MLP N=64, fewer reps (~3 min)"
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="also time the trainer with conv_impl=lax for node_batch=4 and 2 devices (+~4 min)",
    )
    parser.add_argument(
        "--cpu-devices",
        type=int,
        default=_CPU_DEVICES,
        help="CPU devices to create (read before jax starts); 2 on the 2-core box",
    )
    parser.add_argument("--only", default=None, help="comma list of model:N cases to run, e.g. mlp:64")
    parser.add_argument(
        "--conv-in-loop",
        action="store_true",
        help="only time one lax convolution and its gradients inside vs outside a loop (~10 s)",
    )
    args = parser.parse_args()

    def log(msg):
        print(msg, flush=True)

    cases = plan(args.quick, args.full, len(jax.devices()) >= 2)
    if args.only:
        keep = {(m, int(k)) for m, k in (c.split(":") for c in args.only.split(","))}
        cases = [c for c in cases if (c["model"], c["n"]) in keep]
    log(machine_info())
    if args.conv_in_loop:
        conv_in_loop(log)
        return
    log(machine_ceiling())
    start = time.perf_counter()
    rows = []
    for case in cases:
        rows += run_case(case, log)
    print_table(rows, log)
    check_targets(rows, log)
    log(f"\ntotal {time.perf_counter() - start:.0f} s | {machine_info()}")


if __name__ == "__main__":
    main()
