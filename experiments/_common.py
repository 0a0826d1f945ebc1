"""Helpers shared by the experiment scripts (run them from the repository root, e.g.
``python experiments/bench_mixing.py``; this folder is then on ``sys.path``)."""

from __future__ import annotations

import datetime
import math
import platform

import numpy as np


def cpu_model() -> str:
    """The CPU model from /proc/cpuinfo (or platform.processor()), for result headers."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine() -> dict:
    """The result files' machine header: CPU model, JAX version and today's date."""
    import jax

    return {"cpu": cpu_model(), "jax": jax.__version__, "date": datetime.date.today().isoformat()}


def jsonable(value, digits: int | None = 4):
    """``value`` for ``json.dump(..., allow_nan=False)``: arrays as lists, floats rounded to
    ``digits`` significant digits (the curves make the files large; None keeps them whole), NaN /
    inf (a diverged run) as null, mapping keys as strings."""
    if isinstance(value, dict):
        return {str(k): jsonable(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, digits) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist(), digits)
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            return None
        return float(value) if digits is None else float(f"{value:.{digits}g}")
    return value


def resnet20_shapes(num_classes: int = 10) -> dict:
    """Per-node shapes of ResNet-20 (CIFAR; 1x1-conv + BN shortcut on the downsampling blocks) in
    flax layout: 65 tensors, 272,474 parameters (docs/training.md, section training recipes and models)."""
    tree = {"conv1": {"kernel": (3, 3, 3, 16)}, "bn1": {"scale": (16,), "bias": (16,)}}
    c_in = 16
    for stage, width in enumerate((16, 32, 64), start=1):
        for block in range(3):
            blk = {
                "conv1": {"kernel": (3, 3, c_in, width)},
                "bn1": {"scale": (width,), "bias": (width,)},
                "conv2": {"kernel": (3, 3, width, width)},
                "bn2": {"scale": (width,), "bias": (width,)},
            }
            if c_in != width:
                blk["shortcut_conv"] = {"kernel": (1, 1, c_in, width)}
                blk["shortcut_bn"] = {"scale": (width,), "bias": (width,)}
            tree[f"layer{stage}_{block}"] = blk
            c_in = width
    tree["fc"] = {"kernel": (64, num_classes), "bias": (num_classes,)}
    return tree
