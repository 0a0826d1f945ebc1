"""Sweep benchmark: 16 seeds x 4 learning rates in ONE compile vs 64 separate runs.

Same tiny config for both: 8 nodes on a ring, plain gossip, MLP hidden (32,) on the synthetic
Gaussian-blob task (``dataset="synthetic"``: 1 024 train / 256 test samples, 8x8x1), batch 16,
100 rounds, evaluation every 25 rounds on 256 test samples.

* one compile: ``jaxgossip.run.training_sweeps.sweep_training(config, {"lr": LRS}, seeds=range(16))`` — a jitted
  double ``vmap`` over [4 lrs, 16 seeds]; the wall time includes data preparation, tracing, compile
  and the run (first and only call).
* separate: ``jaxgossip.run.runner.run_training(config.replace(lr=lr, seed=s))``, each timed from
  ``build`` to the last metric (so each includes its own trace + compile, as a user's loop would).
  By default only ``--separate 8`` of the 64 (lr, seed) points, spread over the grid, are run and the
  total for 64 is extrapolated linearly (64 / 8 x their sum) — printed as an extrapolation;
  ``--separate 64`` runs all of them.

Speed-up = extrapolated (or measured) 64-run time / one-compile time; the target is >= 5x.
The final test loss of every separate run is compared with its entry in the sweep (they should agree
to float32 round-off: the sweep is the same computation, vmapped; the accuracy saturates at 1.0 on
this easy task, so the loss is the informative check).

  python experiments/bench/sweep.py            # ~30 s on the 2-core dev box (8 separate runs, extrapolated)
  python experiments/bench/sweep.py --separate 64
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _benchlib import header_line, machine_info, write_result  # noqa: E402

from jaxgossip import data  # noqa: E402
from jaxgossip.run import training_sweeps  # noqa: E402
from jaxgossip.run.runner import TrainConfig, run_training  # noqa: E402

LRS = (0.01, 0.03, 0.1, 0.3)
SEEDS = tuple(range(16))


def tiny_config(rounds: int) -> TrainConfig:
    return TrainConfig(
        dataset="synthetic",
        num_nodes=8,
        topology="ring",
        algorithm="gossip",
        model="mlp",
        model_options={"hidden": (32,)},
        batch_size=16,
        num_rounds=rounds,
        eval_every=25,
        evals_per_chunk=rounds // 25,  # one chunk: as run_training would run a short job
        eval_size=256,
        eval_chunk=256,
        seed=0,
        data_seed=0,
    )


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--separate", type=int, default=8, help="separate runs actually timed (1..64)")
    parser.add_argument("--rounds", type=int, default=100, help="training rounds (multiple of 25)")
    parser.add_argument("--quick", action="store_true", help="accepted for the suite; same as the default")
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    args = parser.parse_args(argv)
    if not 1 <= args.separate <= len(LRS) * len(SEEDS):
        raise ValueError(f"--separate={args.separate} must be in 1..{len(LRS) * len(SEEDS)}")
    if args.rounds % 25 or args.rounds <= 0:
        raise ValueError(f"--rounds={args.rounds} must be a positive multiple of 25")
    info = machine_info()
    print(header_line(info), flush=True)
    config = tiny_config(args.rounds)
    dataset = data.load_dataset("synthetic", seed=0)
    total = len(LRS) * len(SEEDS)

    start = time.perf_counter()
    points, metrics = training_sweeps.sweep_training(config, {"lr": LRS}, SEEDS, dataset=dataset)
    metrics = jax.block_until_ready(metrics)
    sweep_s = time.perf_counter() - start
    acc = np.asarray(metrics.test_acc)  # [G, S, E]
    loss = np.asarray(metrics.test_loss)  # [G, S, E]
    print(
        f"one compile: {len(LRS)} lrs x {len(SEEDS)} seeds = {total} runs in {sweep_s:.2f} s "
        f"(data prep + trace + compile + run)",
        flush=True,
    )

    # Separate runs: points spread evenly over the flattened (lr, seed) grid, seeds inner.
    flat = np.linspace(0, total - 1, args.separate).round().astype(int)
    times, max_diff, max_abs = [], 0.0, 0.0
    for idx in flat:
        g, s = divmod(int(idx), len(SEEDS))
        run_config = config.replace(lr=LRS[g], seed=SEEDS[s])
        t0 = time.perf_counter()
        out = run_training(run_config, progress=False, dataset=dataset, log=lambda *_: None)
        jax.block_until_ready(out.state)
        times.append(time.perf_counter() - t0)
        final = out.rows[-1]["test_loss"]
        diff = abs(final - float(loss[g, s, -1])) / max(abs(final), 1e-12)
        max_diff = max(max_diff, diff)
        max_abs = max(max_abs, abs(final - float(loss[g, s, -1])))
        print(
            f"  separate run lr={LRS[g]} seed={SEEDS[s]}: {times[-1]:.2f} s, final test loss "
            f"{final:.6g} (sweep {loss[g, s, -1]:.6g})",
            flush=True,
        )
    measured = sum(times)
    extrapolated = measured * total / len(times)
    speedup = extrapolated / sweep_s
    kind = "measured" if len(times) == total else f"EXTRAPOLATED linearly from {len(times)} measured runs"
    print(
        f"separate: {len(times)} runs took {measured:.2f} s ({measured / len(times):.2f} s each); "
        f"{total} runs: {extrapolated:.1f} s ({kind})",
        flush=True,
    )
    print(
        f"speed-up of one compile over {total} separate runs: {speedup:.1f}x "
        f"(target >= 5x: {'HOLDS' if speedup >= 5 else 'FAILS'})",
        flush=True,
    )
    print(
        f"max |final test loss separate - sweep| over the {len(times)} runs: relative {max_diff:.2e}, "
        f"absolute {max_abs:.2e} (expected: float32 round-off only)",
        flush=True,
    )
    rows = [
        {
            "lr": float(points["lr"][g]),
            "final_test_acc_mean": float(acc[g, :, -1].mean()),
            "final_test_acc_std": float(acc[g, :, -1].std()),
            "final_test_loss_mean": float(loss[g, :, -1].mean()),
        }
        for g in range(len(LRS))
    ]
    for r in rows:
        print(
            f"  lr={r['lr']:.3g}: final test acc {r['final_test_acc_mean']:.4f} +- {r['final_test_acc_std']:.4f}, "
            f"loss {r['final_test_loss_mean']:.4g}, over {len(SEEDS)} seeds",
            flush=True,
        )
    result = {
        "machine": info,
        "config": config.to_dict(),
        "sweep_s": sweep_s,
        "separate_measured_runs": len(times),
        "separate_measured_s": measured,
        "separate_per_run_s": times,
        "separate_total_s": extrapolated,
        "separate_total_is_extrapolated": len(times) != total,
        "speedup": speedup,
        "target_5x_holds": speedup >= 5,
        "max_rel_loss_diff": max_diff,
        "max_abs_loss_diff": max_abs,
        "per_lr": rows,
    }
    return write_result(args.json, result)


if __name__ == "__main__":
    main()
