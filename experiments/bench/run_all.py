"""Runs the whole benchmark suite, prints a summary table and writes experiments/bench/results.json.

Each benchmark runs in its own subprocess (so compile caches and memory do not leak between them,
and one failure does not stop the rest) with the interpreter running this script, from the
repository root:

  bench/scaling.py, bench/sweep.py, bench/gpu_suite.py (skips itself politely without a GPU),
  bench/ppermute.py (8 virtual CPU devices),
  bench_mixing.py, bench_communication.py, bench_power_gossip.py, bench_training.py, bench_conv.py,
  bench/baselines/compare.py (optional: jaxgossip vs a PyTorch per-worker loop; skips itself politely
  without torch, which is a benchmark-only extra: pip install -e .[bench])

With ``--quick`` every benchmark gets its quick variant: ``--quick`` for all of them except
``bench_conv.py``, which has no such flag and gets ``--reps 3 --skip-lax-vmap`` instead. The suite's
own scripts write their results as JSON (``--json``), which is embedded; for the older scripts the
stdout (last 20 000 characters) is stored. Note: ``bench_communication.py`` also writes its own
files under ``experiments/results/`` as it always does.

  python experiments/bench/run_all.py --quick                 # tens of minutes on a 2-core CPU box
  python experiments/bench/run_all.py --only scaling,sweep    # a subset, by name
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from _benchlib import header_line, machine_info  # noqa: E402

# name -> (script relative to the repository root, writes --json, extra args with --quick)
BENCHMARKS = {
    "scaling": ("experiments/bench/scaling.py", True, ["--quick"]),
    "sweep": ("experiments/bench/sweep.py", True, ["--quick"]),
    "gpu": ("experiments/bench/gpu_suite.py", True, ["--quick"]),
    "ppermute": ("experiments/bench/ppermute.py", True, ["--quick"]),
    "mixing": ("experiments/bench_mixing.py", False, ["--quick"]),
    "communication": ("experiments/bench_communication.py", False, ["--quick"]),
    "power_gossip": ("experiments/bench_power_gossip.py", False, ["--quick"]),
    "training": ("experiments/bench_training.py", False, ["--quick"]),
    "conv": ("experiments/bench_conv.py", False, ["--reps", "3", "--skip-lax-vmap"]),
    "wan_rounds": ("experiments/bench/wan_rounds.py", True, ["--quick"]),
    # optional: needs torch (pip install -e .[bench]); without it the script prints SKIPPED and exits 0
    "torch_baseline": ("experiments/bench/baselines/compare.py", True, ["--quick"]),
}


def headline(name: str, result: dict | None, stdout: str) -> str:
    """A one-line summary of a benchmark for the table."""
    if result:
        if "skipped" in result:
            return result["skipped"][:90]
        if name == "scaling":
            return "; ".join(
                f"{t}: time x{v['time_ratio']:.1f} vs N*deg x{v['N_deg_ratio']:.1f} "
                f"({'at most linear' if v['at_most_linear'] else 'SUPERLINEAR'})"
                for t, v in result["verdicts"].items()
            )
        if name == "sweep":
            return (
                f"one compile {result['sweep_s']:.1f} s vs 64 separate {result['separate_total_s']:.0f} s"
                f"{' (extrap.)' if result['separate_total_is_extrapolated'] else ''}: x{result['speedup']:.1f}"
            )
        if name == "ppermute":
            s = result["summary"]
            return (
                f"auto/ppermute time: round x{s['round_auto_over_ppermute_geomean']:.2f}, "
                f"scan x{s['scan_auto_over_ppermute_geomean']:.2f} (geo-mean, max "
                f"x{s['scan_auto_over_ppermute_range'][1]:.1f}); {'all agree' if s['all_match'] else 'MISMATCH'}"
            )
        if name == "torch_baseline":
            ratios = ", ".join(
                f"{key} {row['torch1']['median'] / row['jax']['median']:.2f}x/"
                f"{row['torch2']['median'] / row['jax']['median']:.2f}x"
                for key, row in result["rows"].items()
            )
            return f"torch 1t/2t time / jaxgossip: {ratios}; checks {'PASS' if result['all_pass'] else 'FAIL'}"
        if name == "gpu":
            sections = result["sections"]
            train = sections.get("training", {}).get("result")
            if train is None:
                return "; ".join(f"{k}: {v['status']}" for k, v in sections.items())
            return (
                f"ResNet-20 x {train['nodes']}: {train['rounds_per_s']:.2f} rounds/s, "
                f"{train['achieved_TFLOPs'] or float('nan'):.3f} TFLOP/s; "
                + ", ".join(f"{k}: {v['status']}" for k, v in sections.items() if k != "training")
            )
    lines = [line.strip() for line in stdout.strip().splitlines() if line.strip()]
    return lines[-1][:100] if lines else "(no output)"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the quick variant of every benchmark")
    parser.add_argument("--only", default=None, help=f"comma list of names from {list(BENCHMARKS)}")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per benchmark")
    parser.add_argument("--out", default=os.path.join(HERE, "results.json"))
    args = parser.parse_args(argv)
    names = list(BENCHMARKS) if not args.only else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"--only: unknown benchmark(s) {unknown}; known: {list(BENCHMARKS)}")
    info = machine_info()
    print(header_line(info), flush=True)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            script, has_json, quick_args = BENCHMARKS[name]
            cmd = [sys.executable, script] + (quick_args if args.quick else [])
            json_path = os.path.join(tmp, f"{name}.json")
            if has_json:
                cmd += ["--json", json_path]
            print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
            start = time.perf_counter()
            try:
                proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
                rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
            except subprocess.TimeoutExpired as err:
                rc, stdout, stderr = "timeout", err.stdout or "", err.stderr or ""
                stdout = stdout if isinstance(stdout, str) else stdout.decode(errors="replace")
                stderr = stderr if isinstance(stderr, str) else stderr.decode(errors="replace")
            wall = time.perf_counter() - start
            parsed = None
            if has_json and os.path.exists(json_path):
                with open(json_path) as f:
                    parsed = json.load(f)
            results[name] = {
                "command": " ".join(cmd[1:]).replace(json_path, "<tmp>.json"),
                "returncode": rc,
                "wall_s": wall,
                "result": parsed,
                "stdout": stdout[-20000:],
                "stderr_tail": stderr[-4000:] if rc != 0 else "",
            }
            results[name]["headline"] = headline(name, parsed, stdout) if rc == 0 else f"FAILED (rc={rc})"
            print(stdout, flush=True)
            if rc != 0:
                print(stderr[-4000:], flush=True)
    print("\n| benchmark | rc | wall s | result |", flush=True)
    print("|---|---|---|---|", flush=True)
    for name, r in results.items():
        print(f"| {name} | {r['returncode']} | {r['wall_s']:.0f} | {r['headline']} |", flush=True)
    out = {"machine": info, "quick": args.quick, "benchmarks": results}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}", flush=True)
    return out


if __name__ == "__main__":
    main()
