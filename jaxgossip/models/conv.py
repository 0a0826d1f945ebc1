"""A 2-D convolution with two interchangeable formulations, chosen for speed under `vmap`.

jaxgossip trains N stacked models with `jax.vmap` over the node axis. On XLA:CPU the batched
weight-gradient convolution that `vmap` makes of `lax.conv_general_dilated` is pathological: one
vmapped SGD step of 16 stacked ~100k-parameter CNNs took 1061 ms with `flax.linen.Conv`, against
11.4 ms for one model and 188 ms for a Python loop of 16 jitted single-model steps. Writing the
convolution as im2col (pad, take the kh*kw shifted strided slices, stack them on the channel axis)
followed by ONE matmul turns the vmapped convolution into a batched matmul, which XLA:CPU handles
well (269 ms in the same measurement). `experiments/bench_conv.py` re-measures it: on the shared
2-core dev box (jax 0.10.2, N=16, B=32) one vmapped step took 2117 ms with "lax" and 704 ms with
"matmul" (3.0x); per layer (3x3, 14x14x32->64 and 7x7x64->128, fwd+grad, 16 nodes) the vmapped
"matmul" is 2.3x and 4.8x faster than vmapped "lax". A kh*kw-tap variant (nine small matmuls
summed, no im2col buffer) is 2.2-2.4x slower than im2col and is not offered. Unbatched, "lax" is
slightly faster (21 vs 25 ms per single-model step). Also measured: inside `lax.map` over nodes
the "lax" convolution was >10x slower than a Python loop, the "matmul" one was not.

A third formulation, `impl="explicit"`, is the lax convolution with a custom VJP whose two
gradients are canonical forward convolutions; XLA:CPU runs JAX's own gradient convolutions 4-45x
slower inside loop bodies (`lax.map` over nodes, the trainer's `lax.scan` over rounds), this one at
straight-line speed; its forward value is the lax one bit for bit and its gradients agree with
JAX's to 1e-6 (tests/models/test_models.py).

`Conv(impl="lax")`, `Conv(impl="explicit")` and `Conv(impl="matmul")` have the same parameters (`kernel` [kh, kw, C_in,
C_out], `bias` [C_out]) as `flax.linen.Conv`, so checkpoints are interchangeable, and they agree to
float32 rounding in value and gradient.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax import lax

__all__ = ["CONV_IMPLS", "Conv", "conv_output_pads", "resolve_conv_impl"]

CONV_IMPLS = ("auto", "lax", "matmul", "explicit")

PaddingLike = str | int | Sequence[int] | Sequence[tuple[int, int]]


def resolve_conv_impl(impl: str, backend: str | None = None, node_batch: int | None = None) -> str:
    """Maps a `conv_impl` option to the concrete formulation ("lax", "matmul" or "explicit").

    "auto" picks by backend (`jax.default_backend()` unless `backend` is given) and by how the
    node axis is batched (`node_batch`, as in `jaxgossip.engine.training.make_train`):

    * GPU/TPU: "lax", whose convolution kernels (cuDNN, the TPU MXU) handle batched convolutions
      natively and avoid the kh*kw-fold im2col memory (not measured here: no accelerator was
      available; rerun `experiments/bench_conv.py` there to confirm).
    * CPU, one model per loop iteration (`node_batch=1`, the trainer's CPU default for conv nets):
      "explicit", the lax convolution with both gradients written as canonical forward
      convolutions, which XLA:CPU runs at straight-line speed inside `lax.map`/`lax.scan` bodies
      (ResNet-20 x 8 nodes, batch 128: 6.60 s vs 8.58 s per round with "matmul", 1.3x;
      experiments/studies/conv_cpu.md).
    * CPU, several models per call (`node_batch` None or > 1, a `vmap` over nodes): "matmul",
      because the vmapped lax convolution measured 3x slower (2117 vs 704 ms per vmapped step of
      16 CNNs; see the module docstring and `experiments/bench_conv.py`).

    Args:
      impl: "auto", "lax", "matmul" or "explicit".
      backend: optional backend name; defaults to `jax.default_backend()`.
      node_batch: nodes per vmapped group in the trainer (1: one model at a time); None: a vmap
        over all nodes, or unknown.

    Returns:
      "lax", "matmul" or "explicit".
    """
    if impl not in CONV_IMPLS:
        raise ValueError(f"conv_impl must be one of {CONV_IMPLS}, got {impl!r}")
    if impl != "auto":
        return impl
    backend = jax.default_backend() if backend is None else backend
    if backend != "cpu":
        return "lax"
    return "explicit" if node_batch == 1 else "matmul"


def _pair(value: int | Sequence[int], name: str) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    value = tuple(value)
    if len(value) != 2 or not all(isinstance(v, int) for v in value):
        raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
    return value  # type: ignore[return-value]


def conv_output_pads(
    in_size: Sequence[int],
    kernel_size: Sequence[int],
    strides: Sequence[int],
    padding: PaddingLike,
) -> list[tuple[int, int]]:
    """Explicit (low, high) padding per spatial dimension, with `lax.conv_general_dilated` semantics.

    "SAME" pads `max((ceil(H / s) - 1) * s + k - H, 0)` in total, the smaller half at the low end
    (TensorFlow/XLA convention); "VALID" pads nothing; an int p pads (p, p) like PyTorch's
    `padding=p`; a sequence gives per-dimension ints or (low, high) pairs.
    """
    if isinstance(padding, str):
        mode = padding.upper()
        if mode == "VALID":
            return [(0, 0)] * len(in_size)
        if mode != "SAME":
            raise ValueError(f"padding must be 'SAME', 'VALID', an int or pairs, got {padding!r}")
        pads = []
        for h, k, s in zip(in_size, kernel_size, strides):
            out = -(-h // s)
            total = max((out - 1) * s + k - h, 0)
            pads.append((total // 2, total - total // 2))
        return pads
    if isinstance(padding, int):
        return [(padding, padding)] * len(in_size)
    pads = []
    for p in padding:
        pads.append((p, p) if isinstance(p, int) else tuple(p))
    if len(pads) != len(in_size):
        raise ValueError(f"padding needs {len(in_size)} entries, got {padding!r}")
    return pads  # type: ignore[return-value]


def _conv_matmul(x, kernel, strides, pads, precision):
    """im2col convolution: x [B, H, W, C], kernel [kh, kw, C, F] -> [B, Ho, Wo, F]."""
    kh, kw, c, f = kernel.shape
    sh, sw = strides
    (lo_h, hi_h), (lo_w, hi_w) = pads
    b, h, w, _ = x.shape
    out_h = (h + lo_h + hi_h - kh) // sh + 1
    out_w = (w + lo_w + hi_w - kw) // sw + 1
    if any(p != 0 for pair in pads for p in pair):
        x = jnp.pad(x, ((0, 0), (lo_h, hi_h), (lo_w, hi_w), (0, 0)))
    # Patch channel index is (i * kw + j) * C + c, matching kernel.reshape(kh * kw * C, F).
    patches = [
        lax.slice(
            x,
            (0, i, j, 0),
            (b, i + (out_h - 1) * sh + 1, j + (out_w - 1) * sw + 1, c),
            (1, sh, sw, 1),
        )
        for i in range(kh)
        for j in range(kw)
    ]
    patches = patches[0] if len(patches) == 1 else jnp.concatenate(patches, axis=-1)
    return jnp.dot(patches, kernel.reshape(kh * kw * c, f), precision=precision)


def _conv_nhwc(x, kernel, strides, pads, precision, lhs_dilation=(1, 1), rhs_dilation=(1, 1)):
    return lax.conv_general_dilated(
        x,
        kernel,
        window_strides=strides,
        padding=pads,
        lhs_dilation=lhs_dilation,
        rhs_dilation=rhs_dilation,
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        precision=precision,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _conv_explicit(x, kernel, strides, pads, precision):
    """``lax`` convolution (x [B, H, W, C], kernel [kh, kw, C, F] -> [B, Ho, Wo, F]) whose two
    gradients are themselves plain NHWC/HWIO forward convolutions (see ``_conv_explicit_bwd``)."""
    return _conv_nhwc(x, kernel, strides, pads, precision)


def _conv_explicit_fwd(x, kernel, strides, pads, precision):
    return _conv_nhwc(x, kernel, strides, pads, precision), (x, kernel)


def _conv_explicit_bwd(strides, pads, precision, residuals, dy):
    """Both gradients as forward convolutions with the canonical NHWC/HWIO dimension numbers.

    XLA:CPU runs the convolutions that JAX's own transpose rules emit (batch and feature dims
    swapped for the kernel gradient, a dilated transposed kernel for the input gradient) 4-45x
    slower inside a loop body (``lax.scan``/``lax.map``/``fori_loop``) than in straight-line code
    (jax-ml/jax#12868; ``experiments/bench_training.py --conv-in-loop``). Written with explicit
    transposes around canonical convolutions they run at straight-line speed in loops too.

      dK[a, b, c, f] = sum_{n, i, j} x_pad[n, s i + a, s j + b, c] dy[n, i, j, f]
                     = conv(lhs = x^T [C, H, W, B], rhs = dy^T [Ho, Wo, B, F], rhs_dilation = s)
      dx = conv(dy dilated by s, kernel flipped in space with C and F swapped, padding k - 1 - p)
    """
    x, kernel = residuals
    kh, kw, _, _ = kernel.shape
    (sh, sw), ((lo_h, _), (lo_w, _)) = strides, pads
    dk = _conv_nhwc(
        jnp.transpose(x, (3, 1, 2, 0)),
        jnp.transpose(dy, (1, 2, 0, 3)),
        (1, 1),
        pads,
        precision,
        rhs_dilation=strides,
    )
    # The correlation spans every offset the padded input allows; the kernel's are the first kh x kw.
    dk = jnp.transpose(dk[:, :kh, :kw, :], (1, 2, 0, 3)).astype(kernel.dtype)
    _, h, w, _ = x.shape
    _, out_h, out_w, _ = dy.shape
    low_h, low_w = kh - 1 - lo_h, kw - 1 - lo_w
    dx_pads = (
        (low_h, h - ((out_h - 1) * sh + 1) - low_h + kh - 1),
        (low_w, w - ((out_w - 1) * sw + 1) - low_w + kw - 1),
    )
    flipped = jnp.transpose(kernel[::-1, ::-1], (0, 1, 3, 2))
    dx = _conv_nhwc(dy, flipped, (1, 1), dx_pads, precision, lhs_dilation=strides).astype(x.dtype)
    return dx, dk


_conv_explicit.defvjp(_conv_explicit_fwd, _conv_explicit_bwd)


class Conv(nn.Module):
    """2-D convolution over NHWC inputs with a selectable formulation ("lax", "matmul", "explicit").

    Drop-in for the 2-D case of `flax.linen.Conv`: same parameter names and shapes (`kernel`
    [kh, kw, C_in, F], `bias` [F]), same default initializers (LeCun normal kernel, zero bias), and
    `lax.conv_general_dilated` padding semantics. `impl="matmul"` computes the same function as one
    matmul over im2col patches, which vectorizes well under `jax.vmap` over the node axis on CPU;
    `impl="explicit"` is the lax convolution with loop-friendly gradients (see the module docstring);
    `impl="auto"` resolves with `resolve_conv_impl(impl)`: lax on GPU/TPU, matmul on CPU (the
    trainer's runner resolves it with its `node_batch`, which gives "explicit" for one node at a
    time on CPU).

    Attributes:
      features: number of output channels F.
      kernel_size: int or (kh, kw).
      strides: int or (sh, sw).
      padding: "SAME", "VALID", an int p (PyTorch-style (p, p) on both spatial dims) or a sequence
        of per-dimension ints or (low, high) pairs.
      use_bias: whether to add a bias [F].
      impl: "auto", "lax", "matmul" or "explicit".
      precision: passed to the convolution / matmul.
      kernel_init, bias_init: initializers.

    Input: x [..., H, W, C_in] (any number of leading batch dims, e.g. [B, H, W, C]).
    Output: [..., H_out, W_out, F].
    """

    features: int
    kernel_size: int | Sequence[int] = 3
    strides: int | Sequence[int] = 1
    padding: PaddingLike = "SAME"
    use_bias: bool = True
    impl: str = "auto"
    precision: Any = None
    kernel_init: Callable[..., jax.Array] = nn.initializers.lecun_normal()
    bias_init: Callable[..., jax.Array] = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kh, kw = _pair(self.kernel_size, "kernel_size")
        strides = _pair(self.strides, "strides")
        impl = resolve_conv_impl(self.impl)
        in_features = x.shape[-1]
        kernel = self.param("kernel", self.kernel_init, (kh, kw, in_features, self.features))
        batch_shape = x.shape[:-3]
        x = x.reshape((-1,) + x.shape[-3:])
        pads = conv_output_pads(x.shape[1:3], (kh, kw), strides, self.padding)
        if impl == "explicit":
            y = _conv_explicit(x, kernel, strides, tuple(map(tuple, pads)), self.precision)
        elif impl == "lax":
            y = _conv_nhwc(x, kernel, strides, pads, self.precision)
        else:
            y = _conv_matmul(x, kernel, strides, pads, self.precision)
        if self.use_bias:
            y = y + self.param("bias", self.bias_init, (self.features,))
        return y.reshape(batch_shape + y.shape[1:])
