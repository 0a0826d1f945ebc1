"""Backend-dependent choices of a training build, resolved in one place for a target platform.

A run is built for one platform: the one JAX runs on (``jax.default_backend()``), or another one
named explicitly, e.g. to lower and export the compiled programs for a GPU from a CPU machine
(``jax.export``; tests/ops/test_export_platforms.py). Two kinds of choice exist:

* **build time** (Python decides while tracing, so the platform must be known before tracing):

  - ``node_batch``: how the trainer batches the node axis of the local gradients. On CPU every
    model but the MLP runs one node at a time (``lax.map``; for conv nets 1.4-2.6x faster than one
    ``vmap`` over all nodes on XLA:CPU, ``experiments/bench_training.py``); the MLP, and every
    model on an accelerator, use one ``vmap`` over all N nodes (the expected fast path there).
  - ``conv_impl``: the convolution formulation (:func:`jaxgossip.models.resolve_conv_impl`):
    ``"explicit"`` on CPU with one node at a time, ``"matmul"`` on CPU under a ``vmap``, ``"lax"``
    (cuDNN / the TPU MXU) elsewhere.

* **compile time** (both branches are in the program, ``lax.platform_dependent`` keeps one when
  XLA compiles it for a platform, so nothing is resolved here):

  - the native CPU top-k kernels (:mod:`jaxgossip.compress.native`, FFI custom calls registered for
    ``"cpu"`` only) versus ``lax.top_k`` (:mod:`jaxgossip.compress.selection`);
  - the fused CPU Sparse-Push / SCSP round (:mod:`jaxgossip.compress.fused`) versus its XLA
    formulation.

:func:`resolve` returns the build-time choices as a :class:`BuildChoices`; the runner
(:func:`jaxgossip.run.runner.build`) takes its ``platform`` argument from here.
"""

from __future__ import annotations

from typing import NamedTuple

import jax

from jaxgossip import models

__all__ = ["PLATFORMS", "BuildChoices", "check_platform", "resolve"]

#: the platforms a build can target (``jax.export`` names).
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


class BuildChoices(NamedTuple):
    """The build-time choices of one training build (module docstring).

    Attributes:
      platform: the target platform, one of :data:`PLATFORMS`.
      node_batch: the trainer's ``node_batch`` (nodes per ``lax.map`` group; None: one ``vmap``).
      conv_impl: the convolution formulation for a conv model's ``conv_impl="auto"``; None for a
        model without convolutions.
    """

    platform: str
    node_batch: int | None
    conv_impl: str | None


def check_platform(platform: str | None) -> str:
    """The target platform: ``platform``, or the default backend's for None.

    Raises:
      ValueError: a name outside :data:`PLATFORMS`.
    """
    if platform is None:
        platform = "cuda" if jax.default_backend() == "gpu" else jax.default_backend()
    if platform not in PLATFORMS:
        raise ValueError(f"platform={platform!r} is unknown; known: {', '.join(PLATFORMS)}")
    return platform


def resolve(model: str, node_batch: int | str | None = "auto", platform: str | None = None) -> BuildChoices:
    """The build-time choices for ``model`` (a registered model name) on ``platform``.

    Args:
      model: a name of :data:`jaxgossip.models.REGISTRY`.
      node_batch: ``"auto"`` (the platform's choice), 0 or None (one ``vmap``), or k >= 1.
      platform: one of :data:`PLATFORMS`; None for the backend JAX runs on.

    Returns:
      :class:`BuildChoices`.
    """
    platform = check_platform(platform)
    has_conv = "conv_impl" in models.attributes(model)
    if node_batch == "auto":
        batch = 1 if model != "mlp" and platform == "cpu" else None
    else:
        batch = node_batch or None
    conv = models.resolve_conv_impl("auto", backend=platform, node_batch=batch) if has_conv else None
    return BuildChoices(platform, batch, conv)
