"""Where XLA:CPU's convolution time goes: ResNet-20's 3x3 layers, one pass at a time, vs the
machine's matmul peak and PyTorch's oneDNN: the gap to oneDNN (results: experiments/studies/conv_cpu.md).

For each distinct 3x3 layer shape of ResNet-20 at batch B (CIFAR, NHWC float32) it times, jitted,
straight-line (no loop), median of ``--reps`` after one warm-up, 0.5 s idle before each call:

  fwd            y = conv(x, K)                                   (lax.conv_general_dilated)
  dx explicit    the input gradient as a canonical forward conv   (models.conv "explicit" VJP)
  dK explicit    the kernel gradient as a canonical forward conv  (models.conv "explicit" VJP)
  dK jax         the kernel gradient JAX's transpose rule emits   (jax.vjp of the lax conv)
  dK im2col      patches(x)^T @ dy as one matmul                  (the "matmul" formulation)
  torch fwd, torch fwd+bwd (1 and 2 threads), oneDNN through torch.nn.functional.conv2d

Every pass costs the same 2 B Ho Wo F kh kw C FLOPs; GFLOP/s = that / time. The matmul peak of
the shape ``[B Ho Wo, kh kw C] @ [kh kw C, F]`` is printed next to it.

  python experiments/bench/conv_layers.py            # ~1 min on the 2-core box
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
from jax import lax

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _benchlib import header_line, machine_info, write_result  # noqa: E402

from jaxgossip import models  # noqa: E402

try:
    import torch
except ImportError:  # torch is an optional benchmark-only dependency
    torch = None

# (H = W, C_in, C_out, stride) of ResNet-20's 3x3 convolutions, and how many the model has (19; the
# two 1x1 shortcut convolutions are left out).
LAYERS = [
    ((32, 3, 16, 1), 1),  # the stem
    ((32, 16, 16, 1), 6),
    ((32, 16, 32, 2), 1),
    ((16, 32, 32, 1), 5),
    ((16, 32, 64, 2), 1),
    ((8, 64, 64, 1), 5),
]
DN = ("NHWC", "HWIO", "NHWC")


def _time(fn, reps, settle):
    jax.block_until_ready(fn())
    out = []
    for _ in range(reps):
        time.sleep(settle)
        start = time.perf_counter()
        jax.block_until_ready(fn())
        out.append(time.perf_counter() - start)
    return statistics.median(out)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--settle", type=float, default=0.5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    b = args.batch
    info = machine_info()
    print(header_line(info), flush=True)
    rng = np.random.default_rng(0)
    rows, totals = [], {}
    for (hw, c, f, s), count in LAYERS:
        x = jnp.asarray(rng.standard_normal((b, hw, hw, c)).astype(np.float32))
        kernel = jnp.asarray(rng.standard_normal((3, 3, c, f)).astype(np.float32))
        pads = ((1, 1), (1, 1))

        def fwd(x, kernel, s=s):
            return lax.conv_general_dilated(x, kernel, (s, s), pads, dimension_numbers=DN)

        y = fwd(x, kernel)
        dy = jnp.asarray(rng.standard_normal(y.shape).astype(np.float32))
        ho = y.shape[1]
        flops = 2 * b * ho * ho * f * 9 * c

        conv = models.Conv(f, 3, s, 1, use_bias=False, impl="explicit")
        params = {"params": {"kernel": kernel}}

        def explicit_vjp(x, dy, conv=conv, params=params):
            _, vjp = jax.vjp(lambda p, x: conv.apply(p, x), params, x)
            return vjp(dy)

        # The two explicit gradients apart: jit's dead-code elimination keeps only what is returned.
        dx_ex = jax.jit(lambda x, dy: explicit_vjp(x, dy)[1]).lower(x, dy).compile()
        dk_ex = jax.jit(lambda x, dy: explicit_vjp(x, dy)[0]).lower(x, dy).compile()
        dk_jax = (
            jax.jit(lambda x, kernel, dy: jax.vjp(lambda k: fwd(x, k), kernel)[1](dy)[0]).lower(x, kernel, dy).compile()
        )
        mm = models.Conv(f, 3, s, 1, use_bias=False, impl="matmul")
        dk_mm = jax.jit(lambda x, dy: jax.vjp(lambda p: mm.apply(p, x), params)[1](dy)[0]).lower(x, dy).compile()
        fwd_c = jax.jit(fwd).lower(x, kernel).compile()
        patches = jnp.zeros((b * ho * ho, 9 * c), jnp.float32)
        mat = jax.jit(lambda a, k: a @ k).lower(patches, kernel.reshape(9 * c, f)).compile()
        cells = {
            "fwd": lambda: fwd_c(x, kernel),
            "dx explicit": lambda: dx_ex(x, dy),
            "dK explicit": lambda: dk_ex(x, dy),
            "dK jax": lambda: dk_jax(x, kernel, dy),
            "dK im2col": lambda: dk_mm(x, dy),
            "matmul peak": lambda: mat(patches, kernel.reshape(9 * c, f)),
        }
        if torch is not None:
            tx = torch.from_numpy(np.ascontiguousarray(np.asarray(x).transpose(0, 3, 1, 2)))
            tk = torch.from_numpy(np.ascontiguousarray(np.asarray(kernel).transpose(3, 2, 0, 1))).requires_grad_(True)
            txg = tx.clone().requires_grad_(True)
            tdy = torch.from_numpy(np.ascontiguousarray(np.asarray(dy).transpose(0, 3, 1, 2)))
            for threads in (1, 2):

                def tfwd(threads=threads):
                    torch.set_num_threads(threads)
                    with torch.no_grad():
                        return torch.nn.functional.conv2d(tx, tk, stride=s, padding=1)

                def tboth(threads=threads):
                    torch.set_num_threads(threads)
                    out = torch.nn.functional.conv2d(txg, tk, stride=s, padding=1)
                    return torch.autograd.grad(out, (txg, tk), tdy)

                cells[f"torch {threads}t fwd"] = tfwd
                cells[f"torch {threads}t dx+dK"] = tboth
        times = {name: _time(fn, args.reps, args.settle) for name, fn in cells.items()}
        row = {"layer": f"{hw}x{hw} {c}->{f} s{s}", "count": count, "gflop": flops / 1e9}
        for name, sec in times.items():
            work = 2 * flops if name.endswith("dx+dK") else flops
            row[name] = {"ms": sec * 1e3, "gflops": work / sec / 1e9}
            totals[name] = totals.get(name, 0.0) + count * sec
        rows.append(row)
        print(
            row["layer"], " ".join(f"{n}={v['gflops']:.0f}" for n, v in row.items() if isinstance(v, dict)), flush=True
        )

    names = [n for n in rows[0] if isinstance(rows[0][n], dict)]
    print()
    print(f"GFLOP/s per pass, batch {b} (ResNet-20's 3x3 layers; count = layers of that shape)")
    print("| layer | count | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for row in rows:
        print(f"| {row['layer']} | {row['count']} | " + " | ".join(f"{row[n]['gflops']:.0f}" for n in names) + " |")
    print("| all 3x3 layers, ms | | " + " | ".join(f"{totals[n] * 1e3:.0f}" for n in names) + " |")
    return write_result(args.json, {"machine": info, "batch": b, "rows": rows, "total_s": totals})


if __name__ == "__main__":
    main()
