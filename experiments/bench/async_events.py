"""Asynchronous execution speed: simulated events per second, the cost of a wave against a
synchronous round, and a plain Python event loop over the same jitted per-node step.

For N = 16, 64, 256 nodes of a heterogeneous least-squares problem (D = 100 per node) on a ring,
R rounds (E = R N events) with lognormal compute (median 1 s, sigma 0.5) and the default links:

* ``waves``: :func:`jaxgossip.engine.asynchronous.run_async_optimization` (AD-PSGD with priced
  exchanges, the default, and with free ones, ``ad_psgd_free``, side by side: ``priced_over_free``
  compares their events per second and planning times; asynchronous gossip). The first call compiles; the later ones (same shapes, the jit cache hit) are timed, the
  median of 7, minus the host planning of the schedule (:func:`jaxgossip.engine.asynchronous.plan_async`, timed apart), so
  ``events_per_s`` is the compiled run's, and ``plan_s`` is reported next to it.
* ``sync``: :func:`jaxgossip.run_optimization` of synchronous gossip, R rounds, timed the same way;
  ``wave_over_round`` = (run seconds / waves) / (sync seconds / rounds), the target being
  at most 2 at the same N.
* ``python_loop``: the way event-driven simulators work: a heap of the same E events processed
  one at a time in Python, each calling one jitted AD-PSGD event step (a gradient of one node and
  the pairwise average) on the [N, D] device arrays.

    python experiments/bench/async_events.py [--rounds 20] [--out experiments/bench/async_events.json]
"""

from __future__ import annotations

import argparse
import heapq
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxgossip as jg
from jaxgossip import algorithms
from jaxgossip import topology as T
from jaxgossip.engine import asynchronous, problems
from jaxgossip.sim import timing
from jaxgossip.sim.compute import parse_compute

SIZES = (16, 64, 256)
DIM = 100
COMPUTE = "lognormal:1.0,0.5"


def _timed(fn):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - start


REPS = 7  # millisecond-scale calls: the median of REPS after the first


def _median_timed(fn):
    """``(output, median seconds)`` of ``REPS`` calls of ``fn``."""
    times = []
    for _ in range(REPS):
        out, seconds = _timed(fn)
        times.append(seconds)
    return out, float(np.median(times))


def waves(problem, topo, x0, rounds, algorithm, exchange="priced"):
    key = jax.random.key(0)
    time_model = timing.time_model(topo, compute=COMPUTE, exchange=exchange)

    def run():
        return asynchronous.run_async_optimization(
            problem, topo, x0, lr=0.01, time=time_model, num_rounds=rounds, key=key, algorithm=algorithm
        )

    _, first_s = _timed(lambda: run().x)
    _, plan_s = _median_timed(
        lambda: asynchronous.plan_async(topo, time_model, rounds, key, algorithm, DIM).schedule.time
    )
    result, second_s = _median_timed(run)
    run_s = max(second_s - plan_s, 1e-9)
    events = rounds * topo.num_nodes
    return {
        "first_call_s": first_s,
        "plan_s": plan_s,
        "run_s": run_s,
        "events_per_s": events / run_s,
        "waves": int(result.waves.num_waves),
        "mean_width": float(result.waves.mean_width),
        "wave_ms": 1e3 * run_s / int(result.waves.num_waves),
    }


def sync_round(problem, topo, x0, rounds):
    alg = algorithms.make("gossip", topo)
    opt = optax.sgd(0.01)

    def run():
        return jg.run_optimization(alg, x0, problem.loss_fn, opt, rounds, jax.random.key(0)).x

    _, first_s = _timed(run)
    _, second_s = _median_timed(run)
    return {"first_call_s": first_s, "run_s": second_s, "round_ms": 1e3 * second_s / rounds}


def python_loop(problem, topo, x0, rounds):
    """AD-PSGD event by event: a Python heap, one jitted step per event."""
    n = topo.num_nodes
    table, degree = asynchronous.neighbor_table(topo)
    durations = asynchronous.step_durations(parse_compute(COMPUTE), n, rounds * 4 + 8, jax.random.key(0))
    grad = jax.grad(problem.loss_fn)

    @jax.jit
    def event(x, snap, i, j, key):
        g = grad(snap[i], i, key)
        avg = 0.5 * (x[i] + x[j])
        x = x.at[j].set(avg).at[i].set(avg - 0.01 * g)
        return x, snap.at[i].set(x[i])

    rng = np.random.default_rng(0)
    key = jax.random.key(1)
    x, snap = x0, x0
    jax.block_until_ready(event(x, snap, 0, int(table[0, 0]), key))  # compile outside the timing
    heap = [(float(durations[0, i]), i, 0) for i in range(n)]
    heapq.heapify(heap)
    events = rounds * n
    start = time.perf_counter()
    for e in range(events):
        t, i, k = heapq.heappop(heap)
        j = int(table[i, rng.integers(degree[i])])
        x, snap = event(x, snap, i, j, jax.random.fold_in(key, e))
        heapq.heappush(heap, (t + float(durations[k + 1, i]), i, k + 1))
    jax.block_until_ready(x)
    run_s = time.perf_counter() - start
    return {"run_s": run_s, "events_per_s": events / run_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--out", default="experiments/bench/async_events.json")
    args = parser.parse_args()
    rows = []
    for n in [int(s) for s in args.sizes.split(",")]:
        problem = problems.least_squares(n, DIM, 32, batch_size=8, seed=0)
        topo = T.ring(n)
        x0 = jnp.zeros((n, DIM), jnp.float32)
        row = {"nodes": n, "rounds": args.rounds, "events": args.rounds * n}
        row["sync"] = sync_round(problem, topo, x0, args.rounds)
        for algorithm in ("ad_psgd", "async_gossip"):
            row[algorithm] = waves(problem, topo, x0, args.rounds, algorithm)
            row[algorithm]["wave_over_round"] = row[algorithm]["wave_ms"] / row["sync"]["round_ms"]
        row["ad_psgd_free"] = waves(problem, topo, x0, args.rounds, "ad_psgd", exchange="free")
        row["priced_over_free"] = {
            key: row["ad_psgd"][key] / row["ad_psgd_free"][key] for key in ("events_per_s", "plan_s")
        }
        row["python_loop"] = python_loop(problem, topo, x0, args.rounds)
        row["waves_over_python_loop"] = row["ad_psgd"]["events_per_s"] / row["python_loop"]["events_per_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump({"compute": COMPUTE, "dim": DIM, "topology": "ring", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
