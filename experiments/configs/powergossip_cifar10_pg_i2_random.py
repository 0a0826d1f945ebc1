"""PowerGossip CIFAR-10 recipe, variant ``pg_i2_random`` (ResNet-20, 8-ring; see powergossip_cifar10.py).

jaxgossip train --config experiments/configs/powergossip_cifar10_pg_i2_random.py --data_dir=DIR --out runs/powergossip_cifar10_pg_i2_random
"""

import os
import runpy

_BASE = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "powergossip_cifar10.py"))


def get_config() -> dict:
    return _BASE["get_config"]("pg_i2_random")
