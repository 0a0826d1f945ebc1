"""CPU-sized version of the PowerGossip CIFAR-10 study (``powergossip_cifar10.py``).

Same variants, same relative learning-rate factors F, same gammas and the same recipe shape
(8-ring, Nesterov 0.9, wd 1e-4 off the norm layers, linear warm-up from lr / F, x0.1 at 50 % and
75 % of the run, same-iterate ordering, identical init, averaged-model accuracy), shrunk to run in
about a minute per variant on a 2-core CPU: Fashion-MNIST (60 000 training images; prepare it once
with ``jaxgossip.data.prepare``, see the data docs, or pass ``--dataset=digits`` for the embedded
offline set), a small CNN (two conv stages of 16 and 32 channels), batch 32 per worker, no
augmentation, 720 rounds = 3.07 epochs (8 x 32 = 256 images per round).

The peak learning rate is ``BASE_LR x F / 11.3``: the CIFAR factors F of
docs/training.md, section training recipes and models, relative
to the all-reduce / D-SGD value, so that the variants keep the reference's ratios (DeepSqueeze
runs at 4.8 / 11.3 of the D-SGD rate, tuned Choco-sign at 16 / 11.3). The gammas are the CIFAR
ones, not re-tuned for this model.

Run one variant (an argument of this file; default: gossip) or all of them with seeds and tables:

    jaxgossip train --config experiments/configs/powergossip_cpu.py --out runs/pg_cpu_gossip
    jaxgossip train --config experiments/configs/powergossip_cpu.py:choco_sign_tuned --out runs/pg_cpu_choco_sign_tuned
    python experiments/run_reproductions.py --study powergossip
"""

import os
import runpy

_FULL = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "powergossip_cifar10.py"))

VARIANTS = _FULL["VARIANTS"]
#: the arguments of ``--config powergossip_cpu.py:VARIANT`` (read by jaxgossip.run.parsing)
CONFIG_ARGS = tuple(VARIANTS)
REFERENCE_F = 11.3
BASE_LR = 0.1
NUM_ROUNDS = 720  # 3.07 epochs of Fashion-MNIST (234.4 rounds per epoch at 8 x 32)


def get_config(variant: str = "gossip") -> dict:
    """The TrainConfig fields of one CPU-sized variant."""
    full = _FULL["get_config"](variant)
    factor = VARIANTS[variant][2]
    lr = BASE_LR * factor / REFERENCE_F
    return {
        **full,
        "name": f"powergossip_cpu_{variant}",
        "dataset": "fashion_mnist",
        "model": "cnn",
        "model_options": {"features": [16, 32]},
        "lr": lr,
        "warmup_from": lr / factor,
        "warmup_rounds": NUM_ROUNDS // 20,
        "decay_rounds": (NUM_ROUNDS // 2, (3 * NUM_ROUNDS) // 4),
        "batch_size": 32,
        "num_rounds": NUM_ROUNDS,
        "eval_every": NUM_ROUNDS // 6,
        "evals_per_chunk": 6,
        "augment": False,
        "eval_size": 2000,
        "eval_chunk": 500,
        "seed": 0,
    }
