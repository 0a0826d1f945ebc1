"""Helpers shared by the experiment scripts (run them from the repository root, e.g.
``python experiments/bench_mixing.py``; this folder is then on ``sys.path``)."""

from __future__ import annotations

import platform


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


def resnet20_shapes(num_classes: int = 10) -> dict:
    """Per-node shapes of ResNet-20 (CIFAR; 1x1-conv + BN shortcut on the downsampling blocks) in
    flax layout: 65 tensors, 272,474 parameters (docs/algorithms.md, section training recipes and models)."""
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
