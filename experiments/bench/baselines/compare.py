"""jaxgossip vs a PyTorch per-worker loop (``torch_loop.py``), timed side by side in one process.

Workloads (the consensus setting of ``experiments/consensus_study.py``: 8-ring, 1/3
weights, one 100x100 N(0, 1) float32 matrix per worker):

  gossip          one round ``x <- W x`` (gamma 1)                                    ms / round
  power_gossip    rank 1, one iteration per round, warm start, gamma* = 1.3084       ms / round
  choco_topk      top-k, k = 50 of 10 000, gamma 0.01468 (the study's best)          ms / round
  gamma_sweep     Choco top-k, 20 gammas log-spaced in [1e-4, 1.3084] x 500 rounds,
                  final consensus error of each                                      s / sweep
  resnet20        8 ResNet-20 workers (272,474 parameters each, BN), batch 128 of
                  random CIFAR-shaped data per worker, one SGD step (lr 0.1,
                  momentum 0.9) each, then ring gossip of the parameters             s / round

How each side is timed (same process, same data, calls interleaved rep by rep so that load from
other processes spreads over all three; medians over ``--reps``; wall clock):

* jaxgossip: the library's algorithms (``jaxgossip.algorithms.make``) and model
  (``jaxgossip.models.make_model("resnet20")``). Consensus: ``jit`` of R rounds of ``alg.step`` in a
  ``lax.fori_loop`` from the same x0 and fresh state every call, time / R. Sweep: ``jit(vmap)`` over
  the 20 traced gammas of 500 rounds (one compile). ResNet-20: ``jit`` of one round = ``vmap`` of
  the local step (loss, grad, ``optax.sgd``, batch-norm statistics) over the 8 workers, then
  ``gossip.step`` on the stacked parameters; buffers donated, outputs fed back. Compiled ahead of
  time (``lower().compile()``); compile time is reported apart and never included; one warm-up
  call; ``block_until_ready``. XLA:CPU uses its own thread pool (all cores); it is not limited.
* torch loop: ``torch_loop.py`` at ``torch.set_num_threads(1)`` and ``(2)``, each with one warm-up
  call, under ``torch.no_grad`` for the consensus workloads. Same R rounds from the same x0.
* Before every timed call the process sleeps ``--settle`` s (0.2) so that the worker threads of the
  runtime that ran last (OpenMP, XLA's pool) have stopped spinning and do not steal the cores.

Data loading is timed on neither side (fixed batches). Before timing, correctness checks compare
torch and jaxgossip on the same inputs (PASS/FAIL; exit status 1 on any FAIL): one gossip round
against ``jaxgossip.mix`` and 10 rounds against ``gossip``; 12 PowerGossip rounds started from
jaxgossip's own initial per-edge bases (so the same random vectors); 20 Choco top-k rounds
(x and the public copies); the parameter count of the two ResNet-20s. The gamma-sweep's best gamma
is printed for both (informational).

Without torch it prints one SKIPPED line and exits 0 (torch is an optional, benchmark-only
dependency: ``pip install -e .[bench]``, i.e. ``torch==2.13.0``, the CPU build on the project's
machines).

  python experiments/bench/baselines/compare.py --quick   # the lead's run: < 6 min on a quiet 2-core box
  python experiments/bench/baselines/compare.py           # more reps and rounds (~10 min)
  python experiments/bench/baselines/compare.py --quick --reps 1 --resnet-batch 8 --sweep-rounds 50  # smoke test
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, BENCH)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _benchlib import header_line, linen_sgd_step, machine_info, write_result  # noqa: E402

N_NODES = 8
DIM = 100
TOPK = 50
CHOCO_GAMMA = 0.01468  # the consensus study's best top-k gamma (experiments/studies/consensus_powergossip.md)
NUM_GAMMAS = 20
THREADS = (1, 2)
TOL = 1e-5  # max |torch - jax| / max |x0| for the round checks (float32 round-off, a few rounds)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer reps and rounds: < 6 min on a quiet 2-core box")
    p.add_argument("--reps", type=int, default=None,
                   help="timed reps per cell (default: --quick 5 consensus / 3 sweep / 2 ResNet-20; full 15 / 5 / 5)")
    p.add_argument("--rounds", type=int, default=None, help="consensus rounds per timed call (quick 200, full 1000)")
    p.add_argument("--sweep-rounds", type=int, default=500)
    p.add_argument("--num-gammas", type=int, default=NUM_GAMMAS)
    p.add_argument("--resnet-batch", type=int, default=128)
    p.add_argument("--skip-resnet", action="store_true")
    p.add_argument("--conv-impl", default="auto", choices=["auto", "lax", "matmul", "explicit"],
                   help="jaxgossip ResNet-20 convolution; auto: the trainer's choice (explicit on CPU, one node at a time)")
    p.add_argument("--settle", type=float, default=0.2,
                   help="seconds of sleep before each timed call, so that the other runtime's worker threads "
                        "(OpenMP / XLA pools spin a while after a call) are idle")
    p.add_argument("--json", default=None, help="write the result JSON here")
    p.add_argument("--md", default=None,
                   help="Markdown table path (default experiments/bench/torch_baseline[_quick].md)")
    return p.parse_args(argv)


SETTLE_S = 0.2


def timed_interleaved(cands: dict, reps: int) -> dict:
    """cands: name -> (setup() -> arg, run(arg) -> result, threads or None). One warm-up each, then
    ``reps`` rounds of calls in turn; returns name -> list of seconds."""
    import torch

    def one(name):
        setup, run, threads = cands[name]
        if threads is not None:
            torch.set_num_threads(threads)
        arg = setup()
        time.sleep(SETTLE_S)
        start = time.perf_counter()
        jax.block_until_ready(run(arg))
        return time.perf_counter() - start

    for name in cands:
        one(name)
    times = {name: [] for name in cands}
    for _ in range(reps):
        for name in cands:
            times[name].append(one(name))
    return times


def stats(ts, scale=1.0):
    return {"median": statistics.median(ts) * scale, "min": min(ts) * scale, "max": max(ts) * scale, "n": len(ts)}


# ---- jaxgossip sides ------------------------------------------------------------------------------


def jax_rounds(alg, rounds):
    key = jax.random.key(0)

    def run(x, state):
        def body(_, carry):
            x, state = carry
            x, state, _ = alg.step(x, state, key)
            return x, state

        return jax.lax.fori_loop(0, rounds, body, (x, state))

    return jax.jit(run)


def compiled(fn, *args):
    start = time.perf_counter()
    c = fn.lower(*args).compile()
    return c, time.perf_counter() - start


# ---- checks -----------------------------------------------------------------------------------------


def run_checks(jg, tl, torch, topo, nbrs, x0, gamma_star, log) -> dict:
    """torch loop vs jaxgossip on the same data. Returns name -> {value, tol, pass}."""
    scale = float(np.max(np.abs(x0)))
    xs0 = [torch.from_numpy(x0[i].copy()) for i in range(N_NODES)]
    out = {}

    def report(name, value, tol, what):
        ok = bool(np.isfinite(value) and value <= tol)
        out[name] = {"value": float(value), "tol": tol, "pass": ok, "what": what}
        log(f"check {name}: {'PASS' if ok else 'FAIL'}  {what} = {value:.3g} (tol {tol:g})")

    def rel(xs, ref):
        return float(np.max(np.abs(np.stack([x.numpy() for x in xs]) - np.asarray(ref)))) / scale

    # gossip: one round vs jaxgossip.mix; 10 rounds vs algorithms.gossip
    report("gossip_vs_mix", rel(tl.gossip_round(xs0, nbrs), jg.mix(topo, jnp.asarray(x0))), TOL,
           "1 round, max|torch - jg.mix| / max|x0|")
    alg = jg.algorithms.make("gossip", topo)
    xj, _ = jax_rounds(alg, 10)(jnp.asarray(x0), alg.init(jnp.asarray(x0)))
    xs = xs0
    for _ in range(10):
        xs = tl.gossip_round(xs, nbrs)
    report("gossip_10_rounds", rel(xs, xj), TOL, "10 rounds, max|diff| / max|x0|")

    # PowerGossip: the same initial per-edge bases (jaxgossip's state rows follow the sorted a < b pairs)
    alg = jg.algorithms.make("power_gossip", topo, rank=1, gamma=gamma_star)
    state0 = alg.init(jnp.asarray(x0))
    w = topo.matrix()
    pairs = [(a, b) for a in range(N_NODES) for b in range(a + 1, N_NODES) if w[a, b] != 0 or w[b, a] != 0]
    u0, v0 = np.asarray(state0.u[0]), np.asarray(state0.v[0])
    assert u0.shape[0] == len(pairs), (u0.shape, len(pairs))
    bases = {pair: (u0[p], v0[p]) for p, pair in enumerate(pairs)}
    rounds = 12  # round 0 (no exchange), then 6 right and 5 left half-steps
    xj, sj = jax_rounds(alg, rounds)(jnp.asarray(x0), state0)
    pg = tl.PowerGossipLoop(xs0, nbrs, rank=1, gamma=gamma_star, init_bases=bases)
    xs = xs0
    for _ in range(rounds):
        xs = pg.step(xs)
    report("power_gossip_12_rounds", rel(xs, xj), TOL, "12 rounds, same initial bases, max|diff| / max|x0|")
    uj = np.asarray(sj.u[0])
    ut = np.stack([pg.state[a][b][0].numpy() for a, b in pairs])
    ub = np.stack([pg.state[b][a][0].numpy() for a, b in pairs])
    report("power_gossip_bases", max(np.max(np.abs(ut - uj)), np.max(np.abs(ub - uj))) / max(np.max(np.abs(uj)), 1e-30),
           1e-4, "final U of every edge (both endpoint copies), max|diff| / max|U|")
    mean_gap = float(np.max(np.abs(np.mean(np.stack([x.numpy() for x in xs]), 0) - np.mean(x0, 0)))) / scale
    report("power_gossip_mean", mean_gap, TOL, "torch loop keeps the node mean, max|mean(x) - mean(x0)| / max|x0|")

    # Choco top-k
    alg = jg.algorithms.make("choco", topo, gamma=CHOCO_GAMMA, compressor="top_k", compressor_options={"k": TOPK})
    rounds = 20
    xj, sj = jax_rounds(alg, rounds)(jnp.asarray(x0), alg.init(jnp.asarray(x0)))
    ch = tl.ChocoTopKLoop(xs0, nbrs, TOPK, CHOCO_GAMMA)
    xs = xs0
    for _ in range(rounds):
        xs = ch.step(xs)
    report("choco_topk_20_rounds", rel(xs, xj), TOL, "20 rounds, max|diff x| / max|x0|")
    report("choco_topk_public_copies", rel(ch.x_hat, sj.x_hat), TOL, "20 rounds, max|diff x_hat| / max|x0|")
    return out


def load_flax_resnet(model, tree, torch):
    """Copies one node's jaxgossip ResNet-20 parameters (flax layout) into a ``torch_loop.ResNet20``."""

    def conv(mod, leaf):
        mod.weight.copy_(torch.from_numpy(np.ascontiguousarray(np.transpose(np.asarray(leaf["kernel"]), (3, 2, 0, 1)))))

    def bn(mod, leaf):
        mod.weight.copy_(torch.from_numpy(np.array(leaf["scale"])))
        mod.bias.copy_(torch.from_numpy(np.array(leaf["bias"])))

    with torch.no_grad():
        conv(model.conv1, tree["conv1"])
        bn(model.bn1, tree["bn1"])
        for idx, block in enumerate(model.layers):
            leaf = tree[f"layer{idx // 3 + 1}_{idx % 3}"]
            conv(block.conv1, leaf["conv1"])
            bn(block.bn1, leaf["bn1"])
            conv(block.conv2, leaf["conv2"])
            bn(block.bn2, leaf["bn2"])
            if "downsample_conv" in leaf:
                conv(block.shortcut[0], leaf["downsample_conv"])
                bn(block.shortcut[1], leaf["downsample_bn"])
        model.fc.weight.copy_(torch.from_numpy(np.ascontiguousarray(np.asarray(tree["fc"]["kernel"]).T)))
        model.fc.bias.copy_(torch.from_numpy(np.array(tree["fc"]["bias"])))
    return model


# ---- main -------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse(argv)
    try:
        import torch
    except ImportError:
        msg = ("SKIPPED: torch is not installed (optional, benchmark-only: pip install torch==2.13.0, "
               "or pip install -e .[bench])")
        print(msg, flush=True)
        write_result(args.json, {"skipped": msg})
        return 0
    import optax
    import torch_loop as tl

    import jaxgossip as jg
    from jaxgossip import models
    from jaxgossip.models.adapters import linen_model_fns

    global SETTLE_S
    SETTLE_S = args.settle
    quick = args.quick
    reps_cons = args.reps or (5 if quick else 15)
    reps_long = args.reps or (3 if quick else 5)
    reps_resnet = args.reps or (2 if quick else 5)
    rounds = args.rounds or (200 if quick else 1000)
    lines = []

    def log(msg=""):
        print(msg, flush=True)
        lines.append(msg)

    info = machine_info()
    info["torch_version"] = torch.__version__
    info["torch_default_threads"] = torch.get_num_threads()
    log(header_line(info))
    log(f"torch {torch.__version__} (default threads {torch.get_num_threads()}); jaxgossip: XLA:CPU default "
        f"thread pool; torch loop timed at set_num_threads {THREADS}")
    wall0 = time.perf_counter()

    topo = jg.topology.ring(N_NODES)
    gamma_star = float(jg.topology.optimal_gamma(topo))
    nbrs = tl.neighbors_from_matrix(topo.matrix())
    x0 = np.random.default_rng(0).standard_normal((N_NODES, DIM, DIM)).astype(np.float32)
    x0j = jnp.asarray(x0)

    checks = run_checks(jg, tl, torch, topo, nbrs, x0, gamma_star, log)
    torch.set_num_threads(info["torch_default_threads"])

    rows = {}

    def torch_cands(make, run):
        return {f"torch{t}": (make, run, t) for t in THREADS}

    # ---- consensus rounds ----
    consensus = {
        "gossip": (
            "consensus, 8-ring, 100x100 per node: gossip, ms/round",
            jg.algorithms.make("gossip", topo),
            lambda xs: (xs, None),
            lambda st: tl.gossip_round(st[0], nbrs),
        ),
        "power_gossip": (
            "same, PowerGossip rank 1, ms/round",
            jg.algorithms.make("power_gossip", topo, rank=1, gamma=gamma_star),
            lambda xs: (xs, tl.PowerGossipLoop(xs, nbrs, rank=1, gamma=gamma_star)),
            lambda st: st[1].step(st[0]),
        ),
        "choco_topk": (
            f"same, Choco top-k ({TOPK} of {DIM * DIM:,}), ms/round",
            jg.algorithms.make("choco", topo, gamma=CHOCO_GAMMA, compressor="top_k", compressor_options={"k": TOPK}),
            lambda xs: (xs, tl.ChocoTopKLoop(xs, nbrs, TOPK, CHOCO_GAMMA)),
            lambda st: st[1].step(st[0]),
        ),
    }
    for key, (label, alg, make_torch, torch_step) in consensus.items():
        state0 = alg.init(x0j)
        fn, compile_s = compiled(jax_rounds(alg, rounds), x0j, state0)

        def torch_setup(make_torch=make_torch):
            return make_torch([torch.from_numpy(x0[i].copy()) for i in range(N_NODES)])

        def torch_run(st, torch_step=torch_step):
            with torch.no_grad():
                for _ in range(rounds):
                    st = (torch_step(st), st[1])
            return 0

        cands = {"jax": (lambda: None, lambda _, fn=fn, s=state0: fn(x0j, s), None),
                 **torch_cands(torch_setup, torch_run)}
        times = timed_interleaved(cands, reps_cons)
        rows[key] = {"label": label, "unit": "ms/round", "compile_s": compile_s, "rounds_per_call": rounds,
                     **{name: stats(ts, 1e3 / rounds) for name, ts in times.items()}}
        log(f"{key}: " + ", ".join(f"{n} {rows[key][n]['median']:.4g} ms" for n in times)
            + f" (compile {compile_s:.2f} s)")

    # ---- gamma sweep ----
    gammas = np.geomspace(1e-4, gamma_star, args.num_gammas).astype(np.float32)
    srounds = args.sweep_rounds

    def one(gamma):
        alg = jg.algorithms.make("choco", topo, gamma=gamma, compressor="top_k", compressor_options={"k": TOPK})
        x, _ = jax.lax.fori_loop(
            0, srounds, lambda _, c: alg.step(c[0], c[1], jax.random.key(0))[:2], (x0j, alg.init(x0j))
        )
        return jg.consensus_distance(x, jg.node_mean(x0j))

    sweep_fn, sweep_compile = compiled(jax.jit(jax.vmap(one)), jnp.asarray(gammas))
    xs0 = [torch.from_numpy(x0[i].copy()) for i in range(N_NODES)]
    results = {}

    def torch_sweep(_):
        results["torch"] = tl.choco_gamma_sweep(xs0, nbrs, gammas.tolist(), srounds, TOPK)
        return 0

    def jax_sweep(_):
        results["jax"] = sweep_fn(jnp.asarray(gammas))
        return results["jax"]

    times = timed_interleaved({"jax": (lambda: None, jax_sweep, None),
                               **{f"torch{t}": (lambda: None, torch_sweep, t) for t in THREADS}}, reps_long)
    label = f"Choco, {args.num_gammas} consensus rates x {srounds} rounds (a gamma sweep), s"
    rows["gamma_sweep"] = {"label": label, "unit": "s", "compile_s": sweep_compile,
                           **{name: stats(ts) for name, ts in times.items()}}
    ej, et = np.asarray(results["jax"], np.float64), np.asarray(results["torch"], np.float64)
    ej, et = np.where(np.isfinite(ej), ej, np.inf), np.where(np.isfinite(et), et, np.inf)
    best = {"jax": float(gammas[np.argmin(ej)]), "torch": float(gammas[np.argmin(et)])}
    rows["gamma_sweep"]["best_gamma"] = best
    log("gamma_sweep: " + ", ".join(f"{n} {rows['gamma_sweep'][n]['median']:.3g} s" for n in times)
        + f" (compile {sweep_compile:.1f} s); best gamma jax {best['jax']:.4g} / torch {best['torch']:.4g} "
        f"(final error {ej.min():.3g} / {et.min():.3g}; informational)")

    # ---- ResNet-20 round ----
    if not args.skip_resnet:
        bsz = args.resnet_batch
        rng = np.random.default_rng(1)
        images = rng.standard_normal((N_NODES, bsz, 32, 32, 3)).astype(np.float32)
        labels = rng.integers(0, 10, (N_NODES, bsz)).astype(np.int32)
        # jaxgossip
        # The trainer's choice (runner: node_batch "auto" -> 1 on CPU for conv nets, and conv_impl
        # resolved with it), unless --conv-impl says otherwise.
        node_batch = 1 if jax.default_backend() == "cpu" else None
        conv_impl = models.resolve_conv_impl(args.conv_impl, node_batch=node_batch)
        log(f"resnet20: conv_impl={conv_impl}, node_batch={node_batch}")
        model = models.make_model("resnet20", num_classes=10, conv_impl=conv_impl)
        fns = linen_model_fns(model)
        params, bstats = jax.vmap(lambda k: fns.init(k, jnp.zeros((1, 32, 32, 3))))(
            jax.random.split(jax.random.key(0), N_NODES))
        opt = optax.sgd(0.1, momentum=0.9)
        opt_state = jax.vmap(opt.init)(params)
        galg = jg.algorithms.make("gossip", topo)
        comm = galg.init(params)
        n_jax = int(sum(leaf.size for leaf in jax.tree_util.tree_leaves(params)) // N_NODES)
        n_torch = tl.num_params(tl.ResNet20())
        ok = n_jax == n_torch == 272_474
        checks["resnet20_params"] = {"value": n_torch, "tol": 0, "pass": ok, "what": f"jax {n_jax}, torch {n_torch}"}
        log(f"check resnet20_params: {'PASS' if ok else 'FAIL'}  jaxgossip {n_jax:,} / torch {n_torch:,} parameters")

        local = linen_sgd_step(fns, opt)

        def train_round(p, bs, o, c, x, y):
            # As the trainer does for conv models on CPU (node_batch="auto" -> 1): one node at a time
            # with lax.map; one vmap over all nodes measured 2-3x slower there (bench_training.py).
            if node_batch == 1:
                p, bs, o, loss = jax.lax.map(lambda a: local(*a), (p, bs, o, x, y))
            else:
                p, bs, o, loss = jax.vmap(local)(p, bs, o, x, y)
            p, c, _ = galg.step(p, c, jax.random.key(0))
            return p, bs, o, c, jnp.mean(loss)

        xj, yj = jnp.asarray(images), jnp.asarray(labels)
        rfn, rcompile = compiled(jax.jit(train_round, donate_argnums=(0, 1, 2, 3)),
                                 params, bstats, opt_state, comm, xj, yj)
        jstate = {"s": (params, bstats, opt_state, comm)}

        def jax_round(_):
            out = rfn(*jstate["s"], xj, yj)
            jstate["s"] = out[:4]
            return out

        batches = [(torch.from_numpy(np.ascontiguousarray(images[i].transpose(0, 3, 1, 2))),
                    torch.from_numpy(labels[i].astype(np.int64))) for i in range(N_NODES)]
        torch_rounds = {t: tl.ResNetRound(nbrs, batches) for t in THREADS}
        # Check: the same initial weights (jaxgossip's, copied into every torch worker), one round each.
        # Compared: the gradient part of the round, p_new - W p0 = -lr W g, per node (relative L2 over all
        # tensors). Both float32 sides are ~1e-3 (relative) from a float64 torch reference on this random
        # data (batch-norm backward at initialisation cancels a lot), hence the tolerance 1e-2.
        host = lambda tree, i: jax.tree_util.tree_map(lambda leaf: np.asarray(leaf[i]), tree)  # noqa: E731
        for rnd in torch_rounds.values():
            for i, m in enumerate(rnd.models):
                load_flax_resnet(m, host(params, i), torch)
        mixed0 = jax.tree_util.tree_map(np.asarray, jg.mix(topo, params))
        torch.set_num_threads(1)
        loss_t = torch_rounds[1].step()
        loss_j = float(jax_round(None)[4])  # donates params: use only the outputs from here on
        after = jax.tree_util.tree_map(np.asarray, jstate["s"][0])
        gap = 0.0
        with torch.no_grad():
            for i, m in enumerate(torch_rounds[1].models):
                ref = load_flax_resnet(tl.ResNet20(), host(after, i), torch)
                base = load_flax_resnet(tl.ResNet20(), host(mixed0, i), torch)
                num = sum(float(((pt - pr) ** 2).sum()) for pt, pr in zip(m.parameters(), ref.parameters()))
                den = sum(float(((pr - pb) ** 2).sum()) for pr, pb in zip(ref.parameters(), base.parameters()))
                gap = max(gap, (num / max(den, 1e-30)) ** 0.5)
        loss_gap = abs(loss_t - loss_j) / abs(loss_j)
        ok = gap <= 1e-2 and loss_gap <= 1e-5
        checks["resnet20_round"] = {"value": gap, "tol": 1e-2, "pass": ok, "loss_jax": loss_j, "loss_torch": loss_t,
                                    "what": "one round, same weights and data: max over nodes of "
                                            "||p_torch - p_jax|| / ||p_jax - W p0||; loss relative gap <= 1e-5"}
        log(f"check resnet20_round: {'PASS' if ok else 'FAIL'}  one round from the same weights and data: loss "
            f"{loss_j:.6f} / {loss_t:.6f} (rel. gap {loss_gap:.2g}, tol 1e-05); gradient part of the update, max over "
            f"nodes of ||p_torch - p_jax|| / ||p_jax - W p0|| = {gap:.3g} (tol 0.01)")
        cands = {"jax": (lambda: None, jax_round, None),
                 **{f"torch{t}": (lambda: None, lambda _, t=t: torch_rounds[t].step(), t) for t in THREADS}}
        times = timed_interleaved(cands, reps_resnet)
        label = f"ResNet-20 x {N_NODES} nodes, batch {bsz}, one training round (local step + ring gossip), s"
        rows["resnet20"] = {"label": label, "unit": "s", "compile_s": rcompile, "batch": bsz,
                            **{name: stats(ts) for name, ts in times.items()}}
        log("resnet20: " + ", ".join(f"{n} {rows['resnet20'][n]['median']:.3g} s" for n in times)
            + f" (compile {rcompile:.1f} s)")
    torch.set_num_threads(info["torch_default_threads"])

    # ---- table ----
    table = [
        "| workload | jaxgossip | torch loop, 1 thread | torch loop, 2 threads | torch 1t / jaxgossip | "
        "torch 2t / jaxgossip | jaxgossip compile s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows.values():
        fmt = (lambda v: f"{v:.3f}") if row["unit"] == "ms/round" else (lambda v: f"{v:.2f}")
        j, t1, t2 = row["jax"]["median"], row["torch1"]["median"], row["torch2"]["median"]
        table.append(f"| {row['label']} | {fmt(j)} | {fmt(t1)} | {fmt(t2)} | {t1 / j:.2f}x | {t2 / j:.2f}x | "
                     f"{row['compile_s']:.1f} |")
    wall = time.perf_counter() - wall0
    log("")
    for line in table:
        log(line)
    log("")
    info["load_average_end"] = list(os.getloadavg())
    log(f"load average at the end {info['load_average_end']}")
    log(f"Medians of {reps_cons} reps (consensus, {rounds} rounds per call), {reps_long} (sweep), "
        f"{reps_resnet} (ResNet-20), after one warm-up call each, {SETTLE_S} s idle before every call; "
        f"ratio > 1: jaxgossip faster; "
        f"compile time apart. Wall time {wall:.0f} s.")
    failed = [name for name, c in checks.items() if not c["pass"]]
    log("correctness: " + ("all PASS" if not failed else f"FAIL: {failed}"))

    md = args.md or os.path.join(BENCH, f"torch_baseline{'_quick' if quick else ''}.md")
    with open(md, "w") as f:
        f.write("# jaxgossip vs PyTorch per-worker loop (experiments/bench/baselines/compare.py)\n\n")
        f.write("```\n" + "\n".join(lines[:2]) + "\n```\n\n" + "\n".join(lines[2:]) + "\n")
    log(f"wrote {md}")
    write_result(args.json, {
        "machine": info, "quick": quick, "wall_s": wall, "checks": checks, "rows": rows,
        "settings": {"nodes": N_NODES, "dim": DIM, "topk": TOPK, "choco_gamma": CHOCO_GAMMA, "gamma_star": gamma_star,
                     "sweep_gammas": gammas.tolist(), "sweep_rounds": srounds, "consensus_rounds_per_call": rounds,
                     "reps": {"consensus": reps_cons, "sweep": reps_long, "resnet20": reps_resnet},
                     "torch_threads": list(THREADS)},
        "table_md": "\n".join(table), "all_pass": not failed,
    })
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
