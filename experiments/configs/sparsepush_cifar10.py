"""Sparse-Push / SCSP CIFAR-10 recipe (docs/training.md, section training recipes and models):
push-sum (SGP) vs Sparse-Push
vs Skew-Compensated Sparse-Push on a directed time-varying graph, IID and non-IID.

Recipe of the first author's Nov-2021 code (docs/training.md, section training recipes and models):
batch 32 per worker, Nesterov
momentum 0.9, weight decay 1e-4 on all parameters, peak learning rate 0.1 with one epoch of warm-up
from 0.01, 200 epochs; ResNet-20: x0.1 at epochs 100 and 150; VGG-11: x0.5 at epochs 30, 60, 90,
120, 150 and 180. Adapt-then-combine ordering (``"atc"``, SGP / Choco-SGD form), crop + flip
augmentation, gradients at the debiased models x_i / w_i. The graph is the time-varying directed
one-peer exponential graph (SGP's graph; node i sends to i + 2^(t mod log2 N)). The top-k
compressed runs use the author's consensus step eta = gamma = 0.01 at 1 % density.

Our choices where the recipe leaves one (say so when reporting):

* The author's code runs epoch 0 at 0.1 x lr and then jumps to lr; jaxgossip's warm-up is linear,
  so epoch 0 ramps linearly from 0.01 to 0.1 instead.
* Normalization: BatchNorm (the Feb-2021 code's choice; the Nov-2021 code's EvoNorm-S0 is not
  implemented in jaxgossip). Running statistics stay node-local and are averaged for evaluation.
* 0.1 % density: the recipe only gives gamma for 1 %; we use gamma = 0.001 (scaled with the
  density, as the consensus study's stable range suggests). Untuned.
* SCSP = Sparse-Push + (a) final merge + (b) residual-adaptive top-k budget: OUR INTERPRETATION
  (see ``jaxgossip/algorithms/scsp.py``). The final merge is log2(N) uncompressed push-sum rounds
  (one period of the graph, which averages exactly on the one-peer exponential graph); the
  author's code ran 51 gossip-only rounds on a directed ring: ``--final_merge=51`` reproduces that
  count.
* Top-k indices cost ceil(log2 D_leaf) bits (the library default).
* Epochs in rounds: ceil(50 000 / N / 32) rounds per epoch (196 at N = 8, 98 at N = 16).

Grid (``grid_config(model, num_nodes, method)``; each point is an argument of this file,
``CONFIG_ARGS``: ``--config experiments/configs/sparsepush_cifar10.py:MODEL_nN_METHOD``, e.g.
``:resnet20_n8_scsp`` or ``:vgg11_n16_push_sum``; without one, ``resnet20_n8_sparse_push_1pct``); the
partition is an override because it does not change any round count:

* model: ``resnet20``, ``vgg11``; num_nodes: 8, 16;
* method: ``push_sum`` (SGP, uncompressed), ``sparse_push_1pct``, ``sparse_push_0p1pct``, ``scsp``
  (1 %, compensation on, final merge);
* partition: ``--partition=iid`` (default), ``--partition=skew:0.8`` (the author's non-IID skew;
  docs/training.md, section partitioners) or ``--partition=dirichlet:0.1``.

Data: ``dataset="cifar10"`` needs the CIFAR-10 *python* tarball ``cifar-10-python.tar.gz`` (or a
tfds-prepared copy) in ``--data_dir`` (or ``data_dir/downloads/manual``); nothing is downloaded.

Run (needs a GPU: 39 200 rounds of 8 ResNet-20s at N = 8; not run on CPU):

    jaxgossip train --config experiments/configs/sparsepush_cifar10.py:resnet20_n8_scsp \\
        --data_dir=/path/to/cifar --partition=skew:0.8 --out runs/sp_resnet20_n8_scsp_skew08
"""

import math

TRAIN_SIZE = 50_000
BATCH = 32
EPOCHS = 200
LR = 0.1

#: method -> (algorithm, algorithm_options, final_merge uses the graph period)
METHODS = {
    "push_sum": ("push_sum", {}, False),
    "sparse_push_1pct": ("sparse_push", {"fraction": 0.01, "gamma": 0.01}, False),
    "sparse_push_0p1pct": ("sparse_push", {"fraction": 0.001, "gamma": 0.001}, False),
    "scsp": ("scsp", {"fraction": 0.01, "gamma": 0.01, "compensation": True}, True),
}

#: model -> decay epochs, decay factor
SCHEDULES = {
    "resnet20": ((100, 150), 0.1),
    "vgg11": ((30, 60, 90, 120, 150, 180), 0.5),
}

NUM_NODES = (8, 16)

#: argument of ``--config sparsepush_cifar10.py:ARG`` -> (model, num_nodes, method)
GRID = {
    f"{model}_n{num_nodes}_{method}": (model, num_nodes, method)
    for model in SCHEDULES
    for num_nodes in NUM_NODES
    for method in METHODS
}

#: the arguments of ``--config sparsepush_cifar10.py:ARG`` (read by jaxgossip.run.parsing)
CONFIG_ARGS = tuple(GRID)


def steps_per_epoch(num_nodes: int) -> int:
    return math.ceil(TRAIN_SIZE / num_nodes / BATCH)


def get_config(point: str = "resnet20_n8_sparse_push_1pct") -> dict:
    """The TrainConfig fields of the grid point ``point`` (a key of ``GRID``, ``MODEL_nN_METHOD``)."""
    if point not in GRID:
        raise ValueError(f"unknown grid point {point!r}; known: {', '.join(GRID)}")
    return grid_config(*GRID[point])


def grid_config(model: str = "resnet20", num_nodes: int = 8, method: str = "sparse_push_1pct") -> dict:
    """The TrainConfig fields of one grid point (see the module docstring)."""
    if model not in SCHEDULES:
        raise ValueError(f"unknown model {model!r}; known: {sorted(SCHEDULES)}")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; known: {sorted(METHODS)}")
    if num_nodes not in NUM_NODES:
        raise ValueError(f"num_nodes={num_nodes} must be one of {NUM_NODES}")
    algorithm, options, merge = METHODS[method]
    decay_epochs, factor = SCHEDULES[model]
    spe = steps_per_epoch(num_nodes)
    return {
        "name": f"sparsepush_cifar10_{model}_n{num_nodes}_{method}",
        "dataset": "cifar10",
        "partition": "iid",
        "num_nodes": num_nodes,
        "topology": "one_peer_exponential",
        "algorithm": algorithm,
        "algorithm_options": dict(options),
        "model": model,
        "model_options": {},
        "lr": LR,
        "warmup_from": 0.1 * LR,
        "warmup_rounds": spe,
        "decay_rounds": tuple(e * spe for e in decay_epochs),
        "decay_factor": factor,
        "momentum": 0.9,
        "nesterov": True,
        "weight_decay": 1e-4,
        "weight_decay_mask": "all",
        "batch_size": BATCH,
        "num_rounds": EPOCHS * spe,
        "eval_every": 5 * spe,  # every 5 epochs: 40 evaluation points
        "evals_per_chunk": 1,
        "ordering": "atc",
        "identical_init": True,
        "augment": True,
        "eval_size": 10_000,
        "eval_chunk": 500,
        "final_merge": int(math.log2(num_nodes)) if merge else None,
        "seed": 0,
    }
