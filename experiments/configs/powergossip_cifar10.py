"""PowerGossip CIFAR-10 recipe (docs/training.md, section training recipes and models):
ResNet-20 on the 8-ring, one variant per row of the reference's table.

The reference setup ("meant to be equivalent to the setup in the Choco DL paper"): 8 workers on the
ring (weights 1/3), ResNet-20 with BatchNorm, batch 128 per worker, 300 epochs, Nesterov momentum
0.9, weight decay 1e-4 except on normalization layers (``weight_decay_mask="no_norm"``), learning
rate warmed up linearly over 5 epochs from 0.1 to the peak 0.1 x F, then x0.1 at epochs 150 and
225, crop + flip augmentation, identical initialisation on all workers, gossip at the same iterate
as the gradient (``ordering="same_iterate"``, the D-PSGD form of the PowerGossip code). The
reported accuracy is the one of the exactly averaged model (``test_acc``), on the full test set.

Epochs are expressed in rounds: one round is one local SGD step of every worker, and an epoch is
ceil(50 000 / 8 / 128) = 49 rounds (the reference keeps the last, smaller batch), so 300 epochs =
14 700 rounds, warm-up 245 rounds, decays at rounds 7 350 and 11 025.

Variants (``VARIANTS``), each an argument of this file (``CONFIG_ARGS``):
``--config experiments/configs/powergossip_cifar10.py:VARIANT``; without one, ``gossip``:

===================  ==============================================  =====  ======
variant              algorithm                                       F      gamma
===================  ==============================================  =====  ======
allreduce            exact averaging every round                     11.3   -
gossip               D-SGD, uncompressed gossip                      11.3   1.308
choco_sign_tuned     Choco-SGD, scaled sign ("tuned")                16     0.45
choco_sign_untuned   Choco-SGD, scaled sign ("untuned")              11.3   1.308
choco_topk           Choco-SGD, top-1 % per tensor, 64-bit indices   11.3   0.0375
deepsqueeze_sign     DeepSqueeze, scaled sign                        4.8    0.01
pg_i1_warm           PowerGossip rank 1, 1 iteration, warm start     11.3   1.308
pg_i2_warm           PowerGossip rank 1, 2 iterations, warm start    11.3   1.308
pg_i1_random         PowerGossip rank 1, 1 iteration, random         11.3   1.308
pg_i2_random         PowerGossip rank 1, 2 iterations, random        11.3   1.308
===================  ==============================================  =====  ======

(Moniqua, also in that table, is not implemented in jaxgossip.) PowerGossip gossips 1-D
tensors uncompressed with rate ``vector_gamma = 1`` (the reference quirk;
docs/algorithms.md, section power_gossip).
Choco top-k counts 64-bit indices as the EPFL code does, so its MB/epoch can be compared with
docs/training.md, section training recipes and models (3.23 MB/epoch/worker).

Data: ``dataset="cifar10"`` needs the CIFAR-10 *python* tarball ``cifar-10-python.tar.gz`` (or a
tfds-prepared copy) in ``--data_dir`` (or ``data_dir/downloads/manual``); nothing is downloaded.

Run (one command per variant; needs a GPU: 14 700 rounds of 8 ResNet-20s, not run on CPU):

    jaxgossip train --config experiments/configs/powergossip_cifar10.py:pg_i1_warm \\
        --data_dir=/path/to/cifar --out runs/powergossip_cifar10_pg_i1_warm

Seeds: add ``--seed=S`` (the reference used seeds 10, 20, ..., 60).
"""

STEPS_PER_EPOCH = 49  # ceil(50_000 / 8 / 128)
EPOCHS = 300
BASE_LR = 0.1
GAMMA_RING8 = 1.308  # the reference's diffusion rate, optimal over-relaxation of the 8-ring

_SIGN = {"compressor": "sign"}

#: variant -> (algorithm, algorithm_options, lr factor F)
VARIANTS = {
    "allreduce": ("allreduce", {}, 11.3),
    "gossip": ("gossip", {"gamma": GAMMA_RING8}, 11.3),
    "choco_sign_tuned": ("choco", {**_SIGN, "gamma": 0.45}, 16.0),
    "choco_sign_untuned": ("choco", {**_SIGN, "gamma": GAMMA_RING8}, 11.3),
    "choco_topk": (
        "choco",
        {"compressor": "top_k", "compressor_options": {"fraction": 0.01, "index_bits": 64}, "gamma": 0.0375},
        11.3,
    ),
    "deepsqueeze_sign": ("deepsqueeze", {**_SIGN, "gamma": 0.01}, 4.8),
    "pg_i1_warm": ("power_gossip", {"rank": 1, "num_iterations": 1, "warm_start": True, "gamma": GAMMA_RING8}, 11.3),
    "pg_i2_warm": ("power_gossip", {"rank": 1, "num_iterations": 2, "warm_start": True, "gamma": GAMMA_RING8}, 11.3),
    "pg_i1_random": ("power_gossip", {"rank": 1, "num_iterations": 1, "warm_start": False, "gamma": GAMMA_RING8}, 11.3),
    "pg_i2_random": ("power_gossip", {"rank": 1, "num_iterations": 2, "warm_start": False, "gamma": GAMMA_RING8}, 11.3),
}

#: the arguments of ``--config powergossip_cifar10.py:ARG`` (read by jaxgossip.run.parsing)
CONFIG_ARGS = tuple(VARIANTS)


def get_config(variant: str = "gossip") -> dict:
    """The TrainConfig fields of one variant (see the module docstring)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {sorted(VARIANTS)}")
    algorithm, options, factor = VARIANTS[variant]
    return {
        "name": f"powergossip_cifar10_{variant}",
        "dataset": "cifar10",
        "partition": "iid",
        "num_nodes": 8,
        "topology": "ring",
        "algorithm": algorithm,
        "algorithm_options": dict(options),
        "model": "resnet20",
        "model_options": {},
        "lr": BASE_LR * factor,
        "warmup_from": BASE_LR,
        "warmup_rounds": 5 * STEPS_PER_EPOCH,
        "decay_rounds": (150 * STEPS_PER_EPOCH, 225 * STEPS_PER_EPOCH),
        "decay_factor": 0.1,
        "momentum": 0.9,
        "nesterov": True,
        "weight_decay": 1e-4,
        "weight_decay_mask": "no_norm",
        "batch_size": 128,
        "num_rounds": EPOCHS * STEPS_PER_EPOCH,
        "eval_every": 5 * STEPS_PER_EPOCH,  # every 5 epochs: 60 evaluation points
        "evals_per_chunk": 1,
        "ordering": "same_iterate",
        "identical_init": True,
        "augment": True,
        "eval_size": 10_000,
        "eval_chunk": 500,
        "seed": 10,
    }
