"""Sparse-Push CIFAR-10 recipe: ``push_sum``, resnet20, 8 nodes (see sparsepush_cifar10.py); the partition is
an override: --partition=iid (default), skew:0.8 or dirichlet:0.1.

    jaxgossip train --config experiments/configs/sparsepush_cifar10_resnet20_n8_push_sum.py --data_dir=DIR --partition=skew:0.8 \\
        --out runs/sparsepush_cifar10_resnet20_n8_push_sum_skew08
"""

import os
import runpy

_BASE = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "sparsepush_cifar10.py"))


def get_config() -> dict:
    return _BASE["get_config"]("resnet20", 8, "push_sum")
