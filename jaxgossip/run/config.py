"""Typed run configurations and their validation (edge module: the CLI and the runner use it; the
library below never imports it).

:class:`TrainConfig` holds every field of a training run; :func:`check_train_config` checks all of
them (ranges, names, spec grammars, combinations such as algorithm vs graph) without loading data
or compiling anything, so a bad run fails in a second, not after training. Errors are
``ValueError`` whose message names the field and the fix; the CLI prints them and exits with 2.
Field meanings live in :func:`train_field_help` (shown by ``jaxgossip <command> --help``).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import os
from typing import Any

import numpy as np

from jaxgossip.types import EXECUTIONS, ORDERINGS

__all__ = [
    "TrainConfig",
    "train_field_help",
    "ORDERINGS",
    "WEIGHT_DECAY_MASKS",
    "LR_SCHEDULES",
    "OPTIMIZERS",
    "check_train_config",
    "check_optimizer_options",
    "check_partition",
    "check_topology",
    "check_algorithm",
    "check_model_options",
    "with_trainer_options",
    "TIME_OPTIONS",
    "check_time",
    "check_byzantine",
    "byzantine_args",
    "BYZANTINE_OPTIONS",
    "time_model_of",
    "normalise_time",
    "availability_of",
    "gamma_warning",
    "did_you_mean",
    "allowed_values",
    "EXECUTIONS",
    "check_execution_options",
    "async_form_of",
    "check_sync_only",
    "resolved_config",
]

WEIGHT_DECAY_MASKS = ("all", "no_1d", "no_norm")
#: learning-rate schedules after the warm-up (runner.make_schedule).
LR_SCHEDULES = ("step", "cosine")
#: the keys of TrainConfig.time (the --time.* options) and their defaults.
TIME_OPTIONS = {
    "compute": 0.0,
    "latency": 1e-4,
    "bandwidth": 1e9,
    "mode": "serial",
    "allreduce_model": "ring",
    "availability": "always",
}
#: the keys of TrainConfig.byzantine (the --byzantine.* options) and their defaults: K attackers
#: drawn from the data seed (nodes) or explicit ids, the attack and its options.
BYZANTINE_OPTIONS = {"nodes": 0, "ids": None, "attack": "gaussian", "attack_options": {}}
#: optimizer -> its optimizer_options and their defaults (sgd takes momentum/nesterov as fields).
OPTIMIZERS = {
    "sgd": {},
    "adam": {"b1": 0.9, "b2": 0.999, "eps": 1e-8},
    "adamw": {"b1": 0.9, "b2": 0.999, "eps": 1e-8},
}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run (YAML/JSON/Python configs map onto these fields;
    meanings in :func:`train_field_help`)."""

    dataset: str = "auto"
    data_dir: str | None = None
    raw_dir: str | None = None
    download: bool = False
    partition: str = "iid"
    num_nodes: int = 8
    topology: str = "ring"
    algorithm: str = "gossip"
    algorithm_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    model: str = "cnn"
    model_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    lr: float = 0.05
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 1e-4
    weight_decay_mask: str = "all"
    warmup_rounds: int = 0
    warmup_from: float = 0.0
    decay_rounds: tuple[int, ...] = ()
    decay_factor: float = 0.1
    lr_schedule: str = "step"
    final_lr: float = 0.0
    optimizer: str = "sgd"
    optimizer_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    grad_clip: float | None = None
    local_steps: int = 1
    outer_optimizer: str = "none"
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    outer_message: str = "model"
    precision: str = "fp32"
    message_dtype: str = "fp32"
    batch_size: int = 32
    num_rounds: int = 200
    eval_every: int = 20
    evals_per_chunk: int = 1
    ordering: str = "atc"
    identical_init: bool = True
    augment: bool = False
    eval_size: int = 2000
    eval_chunk: int = 500
    seed: int = 0
    data_seed: int | None = None
    name: str = ""
    devices: int = 1
    node_batch: int | str = "auto"
    final_merge: int | str | None = None
    tensorboard: bool = False
    time: dict[str, Any] = dataclasses.field(default_factory=dict)
    byzantine: dict[str, Any] = dataclasses.field(default_factory=dict)
    execution: str = "sync"
    async_form: str = "auto"

    def replace(self, **changes) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    @property
    def resolved_data_seed(self) -> int:
        """The seed of the data partition and of random graphs: ``data_seed``, or ``seed`` when unset."""
        return self.seed if self.data_seed is None else self.data_seed

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def allowed_values() -> dict[str, list[str]]:
    """The closed sets of names: datasets, models, algorithms, topologies, partitions, compressors."""
    from jaxgossip import algorithms, compress, data, models, topology
    from jaxgossip.engine import outer
    from jaxgossip.ops import precision

    families = topology.FAMILIES
    return {
        "dataset": list(data.DATASET_NAMES),
        "model": sorted(models.REGISTRY),
        "algorithm": list(algorithms.REGISTRY),
        "topology": list(families),
        "partition": list(data.SCHEMES),
        "compressor": sorted(compress.REGISTRY),
        "ordering": list(ORDERINGS),
        "weight_decay_mask": list(WEIGHT_DECAY_MASKS),
        "optimizer": list(OPTIMIZERS),
        "outer_optimizer": list(outer.OUTER_OPTIMIZERS),
        "outer_message": list(outer.OUTER_MESSAGES),
        "precision": list(precision.PRECISIONS),
        "message_dtype": list(precision.MESSAGE_DTYPES),
        "execution": list(EXECUTIONS),
    }


def train_field_help() -> dict[str, str]:
    """field -> one-line meaning of every :class:`TrainConfig` field (with the allowed names)."""
    values = allowed_values()
    return {
        "dataset": "data set: " + ", ".join(values["dataset"]) + " (auto: fashion_mnist if available, else digits), "
        "or npz:PATH, a .npz file with arrays x_train, y_train, x_test, y_test (labels 0..C-1); "
        "python_docs (CPython's documentation topics) and text:PATH (a .txt file or a folder of them, one "
        "source each) are next-token text for model=transformer (byte tokens, examples of its context)",
        "data_dir": "folder of prepared data sets (tfds builders); default: ~/tensorflow_datasets",
        "raw_dir": "folder with raw data files (MNIST/Fashion-MNIST IDX .gz files or the CIFAR python tarball)",
        "download": "download MNIST / Fashion-MNIST / CIFAR when not found locally (never by default)",
        "partition": "how data is split over nodes: iid, dirichlet:ALPHA (ALPHA > 0, e.g. dirichlet:0.1), "
        "shards:K (K label shards per node), skew:S (S in [0, 1], e.g. skew:0.8), by_source (whole labels, the "
        "sources of a text data set, per node); text is partitioned by its sources",
        "num_nodes": "N, the number of simulated workers (>= 1)",
        "topology": "graph spec: "
        + ", ".join(values["topology"])
        + "; with an argument: torus:ROWSxCOLS, erdos_renyi:P, random_directed:P, random_out:S "
        "(s random out-neighbours per round); random_matching and random_out are drawn every round; "
        "failures drawn every round: SPEC+drop:P (links) and/or SPEC+nodedrop:Q (nodes), e.g. ring+drop:0.3",
        "algorithm": "communication algorithm: "
        + ", ".join(values["algorithm"])
        + ", or a plug-in's import path package.module:factory (options: see below)",
        "algorithm_options": "hyperparameters of the algorithm, e.g. --algorithm_options.gamma=0.5 "
        "--algorithm_options.compressor=top_k --algorithm_options.compressor_options.fraction=0.1",
        "model": "model: " + ", ".join(values["model"]),
        "model_options": "model attributes, e.g. --model_options.hidden=64,64 (mlp) or "
        "--model_options.features=16,32 (cnn)",
        "lr": "peak learning rate of the local optimizer (> 0)",
        "momentum": "SGD momentum in [0, 1) (0: plain SGD; optimizer=sgd only)",
        "nesterov": "Nesterov momentum (optimizer=sgd only)",
        "weight_decay": "weight decay (>= 0): L2 added to the gradient for sgd and adam, decoupled (times the "
        "learning rate) for adamw",
        "weight_decay_mask": "leaves that decay: all, no_1d (skip 1-D leaves), no_norm (skip normalization layers)",
        "warmup_rounds": "rounds of linear learning-rate warm-up (>= 0)",
        "warmup_from": "learning rate at round 0 of the warm-up (>= 0)",
        "decay_rounds": "rounds where the learning rate is multiplied by decay_factor, e.g. 100,150 or [100,150]",
        "decay_factor": "factor of each learning-rate decay (> 0)",
        "lr_schedule": "after the warm-up: step (lr times decay_factor at each of decay_rounds) or cosine (cosine "
        "decay from lr to final_lr over the remaining rounds)",
        "final_lr": "learning rate at the last round of lr_schedule=cosine (0 <= final_lr <= lr)",
        "optimizer": "local optimizer: " + ", ".join(values["optimizer"]) + " (sgd: with momentum and nesterov)",
        "optimizer_options": "options of adam/adamw: b1, b2 in [0, 1), eps > 0, e.g. --optimizer_options.b2=0.99",
        "grad_clip": "clip each node's gradient to this global L2 norm (> 0; null: no clipping)",
        "local_steps": "H, local optimizer steps per round, each on a fresh batch (>= 1; the learning-rate "
        "schedule still counts rounds)",
        "outer_optimizer": "decentralized DiLoCo: "
        + ", ".join(values["outer_optimizer"])
        + " (none: no outer step; otherwise each node takes an outer step on the pseudo-gradient x - z of its "
        "round, z its model after the local_steps inner steps and the communication; with local_steps=1 it "
        "is a second momentum over each round's change; ordering=atc only)",
        "outer_lr": "learning rate of the outer optimizer (> 0; DiLoCo: 0.7)",
        "precision": "dtype of each node's forward and backward pass: "
        + ", ".join(values["precision"])
        + " (bf16: float32 master weights and optimizer state, the pass in bfloat16)",
        "message_dtype": "dtype of the values the algorithm sends: "
        + ", ".join(values["message_dtype"])
        + " (bf16: 16 bits per value in the bit accounting; the round's arithmetic in bfloat16)",
        "outer_momentum": "Nesterov momentum of outer_optimizer=nesterov, in [0, 1) (DiLoCo: 0.9)",
        "outer_message": "what the algorithm communicates under an outer optimizer: "
        + ", ".join(values["outer_message"])
        + " (model: the inner result, as without one, and the models reach consensus; pseudo_gradient: "
        "x - x^(H), the original DiLoCo with algorithm=allreduce, but under gossip nothing pulls the models "
        "together); pseudo_gradient needs an outer_optimizer",
        "batch_size": "B, samples per node and local step (>= 1)",
        "num_rounds": "training rounds (local_steps local steps + one communication each; a multiple of eval_every)",
        "eval_every": "rounds between evaluations (>= 1)",
        "evals_per_chunk": "evaluation intervals per compiled chunk (progress, metrics and checkpoints between)",
        "ordering": "atc (local step, then gossip) or same_iterate (gradient and gossip on the same iterate)",
        "identical_init": "all nodes start from the same model",
        "augment": "CIFAR-style random crop and flip",
        "eval_size": "test samples used per evaluation (>= 1)",
        "eval_chunk": "test samples per evaluation batch (>= 1)",
        "seed": "seed of model init, batches and compression randomness (>= 0)",
        "data_seed": "seed of the partition and random graphs (default: seed)",
        "name": "run name (default: the algorithm)",
        "devices": "spread the node axis over this many devices; must divide num_nodes",
        "node_batch": "local gradients k nodes at a time (lax.map); 0: one vmap over all N; auto: 1 for conv "
        "models on CPU",
        "final_merge": "after training: null (none), R (R extra gossip / push-sum rounds) or exact (averaging)",
        "tensorboard": "also write TensorBoard event files under --out (needs tensorboardX)",
        "time": "the simulated time model (jaxgossip.sim.timing; every metrics row has sim_time): "
        "--time.compute=SECONDS per local step, or stragglers:C,F,S (round(F N) nodes S times slower), "
        "lognormal:MEDIAN,SIGMA, exponential:MEAN, trace:PATH ([steps, N] .npy/.csv); default 0; "
        "--time.latency=S per message (default 1e-4); --time.bandwidth=BIT/S (default 1e9); "
        "--time.mode=serial|parallel (a node's messages share its uplink, or not); "
        "--time.allreduce_model=ring|message (how an all-reduce round is priced); "
        "--time.availability=always|markov:P_OFF,P_ON|trace:PATH (offline nodes neither compute nor send; a round "
        "waits only for online nodes)",
        "byzantine": "Byzantine attackers (jaxgossip.algorithms.byzantine; metrics over the honest nodes only): "
        "--byzantine.nodes=K (K attackers drawn by the data seed, shared by every seed of a sweep) or "
        "--byzantine.ids=0,5; --byzantine.attack=" + "|".join(_attack_names()) + " (default gaussian); "
        "--byzantine.attack_options.NAME=VALUE, e.g. --byzantine.attack_options.sigma=10",
        "execution": "sync (lock-step rounds) or async (every node on its own simulated clock, no waiting: "
        "a round is N node events, N local steps in total; needs --time.compute > 0; algorithms with an "
        "asynchronous form: gossip, push_sum)",
        "async_form": "with --execution=async, the asynchronous form of the algorithm: auto (its first: gossip -> "
        "async_gossip, push_sum -> async_sgp), async_gossip or ad_psgd (gossip), async_sgp (push_sum)",
    }


def _attack_names() -> list[str]:
    from jaxgossip import algorithms

    return list(algorithms.ATTACKS)


def did_you_mean(word: str, choices) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or ``""``."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unknown(field: str, value: str, known) -> ValueError:
    known = list(known)
    return ValueError(f"unknown {field} {value!r}{did_you_mean(value, known)}; known: {', '.join(known)}")


def check_partition(spec: str, field: str = "partition") -> None:
    """Checks the grammar of a partition spec: iid, dirichlet:ALPHA, shards:K or skew:S."""
    if not isinstance(spec, str):
        raise ValueError(f"{field}={spec!r} must be a string such as iid, dirichlet:0.1, shards:2 or skew:0.8")
    name, sep, arg = spec.strip().partition(":")
    kinds = {"iid": None, "by_source": None, "dirichlet": "ALPHA > 0", "shards": "an int K >= 1", "skew": "S in [0, 1]"}
    if name not in kinds:
        raise _unknown(field, name, ["iid", "dirichlet:ALPHA", "shards:K", "skew:S", "by_source"])
    if kinds[name] is None:
        if sep:
            raise ValueError(f"{field}={spec!r}: {name} takes no parameter")
        return
    try:
        value = int(arg) if name == "shards" else float(arg)
    except ValueError:
        example = {"dirichlet": "dirichlet:0.1", "shards": "shards:2", "skew": "skew:0.8"}[name]
        raise ValueError(f"{field}={spec!r}: {name} needs {kinds[name]}, e.g. {example}") from None
    ok = {
        "dirichlet": math.isfinite(value) and value > 0,
        "shards": value >= 1,
        "skew": 0.0 <= value <= 1.0,
    }[name]
    if not ok:
        raise ValueError(f"{field}={spec!r}: {name} needs {kinds[name]}")


def check_topology(spec: str, num_nodes: int, seed: int = 0, field: str = "topology"):
    """Builds the topology of ``spec`` at ``num_nodes`` nodes (cheap, no data), or raises a
    ValueError naming the field."""
    from jaxgossip import topology

    if not isinstance(spec, str) or not spec:
        raise ValueError(f"{field}={spec!r} must be a graph spec such as ring, torus:4x8 or erdos_renyi:0.3")
    families = list(topology.FAMILIES)
    name = spec.partition("+")[0].partition(":")[0]
    if name not in families:
        raise _unknown(field, name, families)
    try:
        return topology.make(spec, num_nodes, seed=seed)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{field}={spec!r} with num_nodes={num_nodes}: {err}") from None


def check_algorithm(name: str, options: dict, topo, *, trainer_defaults: bool = False):
    """Builds algorithm ``name`` with ``options`` on ``topo`` (no compile), or raises a ValueError
    naming the field; an unknown option is answered with the options the algorithm takes."""
    from jaxgossip import algorithms

    if not isinstance(name, str) or not name:
        raise ValueError(
            f"algorithm={name!r} must be a name: {', '.join(algorithms.REGISTRY)}, or an import path 'module:factory'"
        )
    if name not in algorithms.REGISTRY and ":" not in name:
        raise _unknown("algorithm", name, algorithms.REGISTRY)
    if not isinstance(options, dict):
        raise ValueError(f"algorithm_options={options!r} must be a mapping of option -> value")
    try:
        entry = algorithms.resolve(name)
    except (ValueError, TypeError) as err:
        raise ValueError(str(err)) from None
    params = inspect.signature(entry.factory).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        takes = list(params)[1:]
        for key in options:
            if key not in takes:
                raise ValueError(
                    f"algorithm_options.{key}: {name} has no option {key!r}{did_you_mean(key, takes)}; "
                    f"it takes: {', '.join(takes) or 'no options'}"
                )
    if trainer_defaults:  # the trainer's defaults (runner.make_algorithm)
        options = with_trainer_options(name, options)
    options = dict(options)
    _check_compressor_options(options, params)
    try:
        return algorithms.make(name, topo, **options)
    except (ValueError, TypeError) as err:
        raise ValueError(f"algorithm={name!r} on {topo.name} with algorithm_options={options}: {err}") from None


def _check_compressor_options(options: dict, params) -> None:
    """Names the first ``compressor_options`` key the named compressor does not take, with a
    suggestion, so a misspelled key is not reported together with the correct ones."""
    from jaxgossip import compress

    given = options.get("compressor_options")
    if not isinstance(given, dict) or not given:
        return
    default = params["compressor"].default if "compressor" in params else None
    compressor = options.get("compressor", default)
    if not isinstance(compressor, str) or compressor not in compress.REGISTRY:
        return  # an unknown compressor or a spec mapping: the factory's own error names it
    takes = list(inspect.signature(compress.REGISTRY[compressor]).parameters)
    for key in given:
        if key not in takes:
            raise ValueError(
                f"algorithm_options.compressor_options.{key}: compressor {compressor!r} has no option {key!r}"
                f"{did_you_mean(key, takes)}; it takes: {', '.join(takes) or 'no options'}"
            )


def with_trainer_options(name: str, options: dict) -> dict:
    """``options`` over the trainer's defaults for algorithm ``name`` (its metadata's
    ``trainer_options``; the user's option wins): the options a training run builds it with."""
    from jaxgossip import algorithms

    return {**algorithms.resolve(name).hooks.trainer_options, **options}


def check_model_options(model: str, options: dict, num_classes: int = 10) -> dict:
    """Checks ``model`` and its options by constructing the (uninitialized) module; a scalar given
    for a sequence attribute (``hidden=32``) becomes a one-element tuple. Returns the options."""
    from jaxgossip import models

    if model not in models.REGISTRY:
        raise _unknown("model", model, sorted(models.REGISTRY))
    if not isinstance(options, dict):
        raise ValueError(f"model_options={options!r} must be a mapping of attribute -> value")
    default = models.make_model(model, num_classes=num_classes)
    takes = [f.name for f in dataclasses.fields(default) if f.name not in ("parent", "name", "num_classes")]
    fixed = {}
    for key, value in options.items():
        if key not in takes:
            raise ValueError(
                f"model_options.{key}: model {model!r} has no attribute {key!r}{did_you_mean(key, takes)}; "
                f"it takes: {', '.join(takes)}"
            )
        if isinstance(getattr(default, key), (tuple, list)) and isinstance(value, (int, float)):
            value = (value,)
        fixed[key] = tuple(value) if isinstance(value, list) else value
    try:
        models.make_model(model, num_classes=num_classes, **fixed)
    except (ValueError, TypeError) as err:
        raise ValueError(f"model={model!r} with model_options={options}: {err}") from None
    return fixed


def check_optimizer_options(optimizer: str, options: dict) -> dict:
    """Checks ``optimizer`` and its ``optimizer_options``; returns the options with defaults filled in."""
    if optimizer not in OPTIMIZERS:
        raise _unknown("optimizer", optimizer, OPTIMIZERS)
    if not isinstance(options, dict):
        raise ValueError(f"optimizer_options={options!r} must be a mapping of option -> value")
    takes = OPTIMIZERS[optimizer]
    for key, value in options.items():
        if key not in takes:
            raise ValueError(
                f"optimizer_options.{key}: optimizer {optimizer!r} has no option {key!r}{did_you_mean(key, takes)}; "
                f"it takes: {', '.join(takes) or 'no options (sgd uses the fields momentum and nesterov)'}"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"optimizer_options.{key}={value!r} must be a number")
        ok = value > 0 if key == "eps" else 0 <= value < 1
        if not ok:
            raise ValueError(f"optimizer_options.{key}={value!r} must be {'> 0' if key == 'eps' else 'in [0, 1)'}")
    return {**takes, **options}


def _final_merge(value: Any) -> Any:
    if value is None or value in (0, "none", "None", "null"):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not (value == "exact" or (isinstance(value, int) and value >= 1)):
        raise ValueError(
            f"final_merge={value!r} must be null (no merge), a number of merge rounds >= 1, or 'exact'"
        )
    return value


def _node_batch(value: Any) -> Any:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    raise ValueError(f"node_batch={value!r} must be 'auto', 0 (one vmap over all nodes) or a positive int")


def _number(config: TrainConfig, field: str, low: float, *, strict: bool = False, high: float | None = None,
            integer: bool = False) -> None:
    value = getattr(config, field)
    kind = "an int" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise ValueError(f"{field}={value!r} must be {kind}")
    if not math.isfinite(value) or (value <= low if strict else value < low) or (high is not None and value >= high):
        bound = f"> {low}" if strict else f">= {low}"
        if high is not None:
            bound += f" and < {high}"
        finite = "" if math.isfinite(value) else "finite, "
        raise ValueError(f"{field}={value!r} must be {finite}{kind} {bound}")


def check_train_config(config: TrainConfig) -> TrainConfig:
    """Validates every field of ``config`` and their combinations without loading data.

    Builds the topology, the algorithm on it, the model module and the optimizer (all cheap), so
    unknown names, bad options, graphs that do not exist at ``num_nodes`` and algorithms that do not
    fit the graph fail here.

    Returns:
      the config with normalized values (``decay_rounds`` a tuple, ``final_merge`` "3" -> 3,
      scalar model options for sequence attributes as 1-tuples).

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    from jaxgossip import data

    # Every check below reads the time specs as single strings, whatever split them.
    config = dataclasses.replace(config, time=normalise_time(config.time))
    if isinstance(config.dataset, str) and config.dataset.startswith(data.NPZ_PREFIX):
        path = config.dataset[len(data.NPZ_PREFIX):]
        if not os.path.isfile(path):
            raise ValueError(f"dataset={config.dataset!r}: no file {path!r} (npz:PATH names a .npz file)")
    elif isinstance(config.dataset, str) and config.dataset.startswith(data.TEXT_PREFIX):
        path = config.dataset[len(data.TEXT_PREFIX):]
        if not os.path.exists(path):
            raise ValueError(f"dataset={config.dataset!r}: no file or folder {path!r} (text:PATH names a .txt file "
                             "or a folder of them)")
    elif config.dataset not in data.DATASET_NAMES:
        raise _unknown("dataset", config.dataset, [*data.DATASET_NAMES, "npz:PATH", "text:PATH"])
    for field in ("data_dir", "raw_dir"):
        value = getattr(config, field)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{field}={value!r} must be a folder path")
    for field in ("download", "nesterov", "identical_init", "augment", "tensorboard"):
        if not isinstance(getattr(config, field), bool):
            raise ValueError(f"{field}={getattr(config, field)!r} must be true or false")
    for field in ("num_nodes", "batch_size", "num_rounds", "eval_every", "evals_per_chunk", "eval_size",
                  "eval_chunk", "devices", "local_steps"):
        _number(config, field, 1, integer=True)
    for field in ("warmup_rounds", "seed"):
        _number(config, field, 0, integer=True)
    if config.data_seed is not None:
        _number(config, "data_seed", 0, integer=True)
    _number(config, "lr", 0, strict=True)
    from jaxgossip.engine import outer

    if config.outer_optimizer not in outer.OUTER_OPTIMIZERS:
        raise _unknown("outer_optimizer", config.outer_optimizer, outer.OUTER_OPTIMIZERS)
    _number(config, "outer_lr", 0, strict=True)
    _number(config, "outer_momentum", 0, high=1)
    if config.outer_message not in outer.OUTER_MESSAGES:
        raise _unknown("outer_message", config.outer_message, outer.OUTER_MESSAGES)
    if config.outer_optimizer == "none" and config.outer_message != outer.OUTER_MESSAGES[0]:
        raise ValueError(
            f"outer_message={config.outer_message!r} with outer_optimizer='none': without an outer optimizer "
            "there is no pseudo-gradient and every round communicates the model; give --outer_optimizer="
            + "|".join(name for name in outer.OUTER_OPTIMIZERS if name != "none")
            + " (or drop --outer_message)"
        )
    from jaxgossip.ops import precision

    if config.precision not in precision.PRECISIONS:
        raise _unknown("precision", config.precision, precision.PRECISIONS)
    if config.message_dtype not in precision.MESSAGE_DTYPES:
        raise _unknown("message_dtype", config.message_dtype, precision.MESSAGE_DTYPES)
    if config.outer_optimizer != "none" and config.ordering != "atc":
        raise ValueError(
            f"outer_optimizer={config.outer_optimizer!r} with ordering={config.ordering!r}: the outer "
            "optimizer's pseudo-gradient is that of the local steps' result; use --ordering=atc"
        )
    _number(config, "momentum", 0, high=1)
    _number(config, "weight_decay", 0)
    _number(config, "warmup_from", 0)
    _number(config, "decay_factor", 0, strict=True)
    if config.lr_schedule not in LR_SCHEDULES:
        raise _unknown("lr_schedule", config.lr_schedule, LR_SCHEDULES)
    _number(config, "final_lr", 0)
    if config.lr_schedule == "cosine":
        if config.decay_rounds:
            raise ValueError(f"decay_rounds={config.decay_rounds!r}: lr_schedule=cosine decays every round; "
                             "give decay_rounds with lr_schedule=step")
        if config.final_lr > config.lr:
            raise ValueError(f"final_lr={config.final_lr} must be <= lr={config.lr} (cosine decays from lr to it)")
        if config.warmup_rounds >= config.num_rounds:
            raise ValueError(f"warmup_rounds={config.warmup_rounds} leaves no round of lr_schedule=cosine "
                             f"(num_rounds={config.num_rounds})")
    elif config.final_lr:
        raise ValueError(f"final_lr={config.final_lr} applies to lr_schedule=cosine only (lr_schedule=step)")
    if config.grad_clip is not None:
        _number(config, "grad_clip", 0, strict=True)
    check_optimizer_options(config.optimizer, dict(config.optimizer_options))
    if config.num_rounds % config.eval_every:
        raise ValueError(
            f"num_rounds={config.num_rounds} must be a multiple of eval_every={config.eval_every} "
            f"(e.g. num_rounds={config.num_rounds - config.num_rounds % config.eval_every or config.eval_every})"
        )
    decay = config.decay_rounds
    if isinstance(decay, (int, float)) and not isinstance(decay, bool):
        decay = (decay,)
    if not isinstance(decay, (tuple, list)) or not all(isinstance(b, int) and not isinstance(b, bool) for b in decay):
        raise ValueError(f"decay_rounds={config.decay_rounds!r} must be a list of rounds, e.g. 100,150")
    decay = tuple(decay)
    if list(decay) != sorted(set(decay)) or any(b <= config.warmup_rounds for b in decay):
        raise ValueError(
            f"decay_rounds={list(decay)} must be increasing rounds after warmup_rounds={config.warmup_rounds}"
        )
    if config.ordering not in ORDERINGS:
        raise _unknown("ordering", config.ordering, ORDERINGS)
    if config.weight_decay_mask not in WEIGHT_DECAY_MASKS:
        raise _unknown("weight_decay_mask", config.weight_decay_mask, WEIGHT_DECAY_MASKS)
    if config.num_nodes % config.devices:
        raise ValueError(
            f"devices={config.devices} must divide num_nodes={config.num_nodes} "
            f"({config.num_nodes} nodes cannot be split evenly over {config.devices} devices)"
        )
    if not isinstance(config.name, str):
        raise ValueError(f"name={config.name!r} must be a string")
    check_partition(config.partition)
    merge = _final_merge(config.final_merge)
    node_batch = _node_batch(config.node_batch)
    topo = check_topology(config.topology, config.num_nodes, config.resolved_data_seed)
    available = availability_of(config)
    if available is not None:  # offline nodes drop out of the graph: the algorithm must accept failures
        from jaxgossip import topology as topologies

        topo = topologies.with_availability(topo, available)
    alg = check_algorithm(config.algorithm, dict(config.algorithm_options), topo, trainer_defaults=True)
    if available is not None and alg.gradient is not None:
        raise ValueError(
            f"--time.availability={config.time['availability']!r}: {config.algorithm} has a gradient hook "
            "(its state would see an offline node's gradient); use an algorithm without one"
        )
    from jaxgossip import algorithms

    if (
        config.outer_optimizer != "none"
        and config.outer_message == "pseudo_gradient"
        and algorithms.info(config.algorithm).graph.mixing == "column_stochastic"
        and not topo.is_doubly_stochastic
    ):
        raise ValueError(
            f"outer_message='pseudo_gradient' with {config.algorithm} on {topo.name}: push-sum de-biases with "
            "the weights of the sequence it carries, which are not those of each round's pseudo-gradients once "
            "W is not doubly stochastic; use --outer_message=model"
        )
    if config.ordering not in alg.orderings:
        raise ValueError(
            f"ordering={config.ordering!r}: {config.algorithm} is registered with orderings={alg.orderings} "
            f"(its docstring says why); use --ordering={alg.orderings[0]}"
        )
    if merge is not None:
        try:
            algorithms.make_merge(topo, merge)
        except (ValueError, TypeError) as err:
            raise ValueError(f"final_merge={merge!r} on {topo.name}: {err}") from None
    model_options = check_model_options(config.model, dict(config.model_options))
    from jaxgossip import models

    if models.is_sequence_model(config.model) != data.is_text_dataset(config.dataset):
        raise ValueError(
            f"model={config.model!r} with dataset={config.dataset!r}: next-token models "
            f"({', '.join(models.SEQUENCE_MODELS)}) train on text data sets ({', '.join(data.TEXT_DATASETS)}, "
            "text:PATH), the other models on the image and array data sets"
        )
    check_time(config, topo)
    check_byzantine(config, topo)
    check_execution_options(dataclasses.replace(config, final_merge=merge), topo)
    return dataclasses.replace(
        config,
        decay_rounds=decay,
        final_merge=merge,
        node_batch=node_batch,
        model_options=model_options,
    )


def _option_group(field: str, options: Any, known: Any, what: str, example: str) -> dict:
    """``options`` of a mapping field of dotted options (``--time.*``, ``--byzantine.*``), checked:
    a mapping whose keys are all ``known`` (ValueError naming the first unknown key, with did you mean)."""
    if not isinstance(options, dict):
        raise ValueError(f"{field}={options!r} must be a mapping, e.g. {example}")
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(
            f"{field}.{unknown[0]}: unknown {what}{did_you_mean(unknown[0], known)}; known: {', '.join(known)}"
        )
    return options


def time_model_of(config: TrainConfig, topo):
    """The :class:`jaxgossip.sim.timing.TimeModel` of a run: ``config.time`` over :data:`TIME_OPTIONS`,
    the algorithm's exchanges and all-reduce pricing from its metadata, the run's ordering.

    Raises:
      ValueError: naming the ``--time.*`` option and the rule (unknown key, bad value or shape).
    """
    from jaxgossip.sim import timing

    example = "--time.compute=0.01 --time.bandwidth=1e8"
    options = _option_group("time", config.time, TIME_OPTIONS, "time option", example)
    values = {**TIME_OPTIONS, **{k: v for k, v in normalise_time(options).items() if v is not None}}
    for key in ("latency", "bandwidth"):
        value = values[key]
        traced = hasattr(value, "shape") and not isinstance(value, np.ndarray)  # a sweep's traced value
        if not traced and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"--time.{key}={value!r} must be a number ({'s' if key == 'latency' else 'bit/s'})")
    for key, known in (("mode", timing.LINK_MODES), ("allreduce_model", timing.ALLREDUCE_MODELS)):
        if values[key] not in known:
            raise ValueError(f"--time.{key}={values[key]!r} is unknown; known: {', '.join(known)}")
    # An asynchronous event sends one message per out-neighbour: no exchanges or all-reduce pricing.
    asynchronous = config.execution == "async"
    try:
        return timing.time_model(
            topo,
            compute=values["compute"],
            latency=values["latency"],
            bandwidth=values["bandwidth"],
            mode=values["mode"],
            algorithm=None if asynchronous else config.algorithm,
            options=None if asynchronous else with_trainer_options(config.algorithm, dict(config.algorithm_options)),
            exchanges=1 if asynchronous else None,
            ordering=config.ordering,
            allreduce_model=values["allreduce_model"],
            available=availability_of(config),
            names=("--time.latency", "--time.bandwidth"),
        )
    except ValueError as err:
        text = str(err)
        raise ValueError(text if text.startswith("--time.") else f"--time.compute: {text}") from None


def availability_of(config: TrainConfig) -> np.ndarray | None:
    """The run's ``[num_rounds, N]`` online mask from ``--time.availability`` (None: always online),
    drawn from ``config.seed``: the runner's graph and its clock use this same mask."""
    from jaxgossip.sim import timing

    options = normalise_time(config.time) if isinstance(config.time, dict) else {}
    spec = options.get("availability") or TIME_OPTIONS["availability"]
    return timing.availability(spec, int(config.num_rounds), int(config.num_nodes), int(config.seed))


def normalise_time(options: Any) -> Any:
    """``config.time`` with the specs the command line split at their commas
    (``stragglers:C,F,S``, ``markov:P_OFF,P_ON`` -> a list) joined back into one string."""
    if not isinstance(options, dict):
        return options
    joined = {
        key: ",".join(str(v) for v in options[key])
        for key in ("compute", "availability")
        if isinstance(options.get(key), (list, tuple))
    }
    return {**options, **joined} if joined else options


def check_time(config: TrainConfig, topo) -> None:
    """Checks ``config.time`` (see :func:`time_model_of`) before any data is loaded."""
    time_model_of(config, topo)


def gamma_warning(algorithm: str, options: dict, topo) -> str | None:
    """A warning when a gossip-type step size ``gamma`` is outside the stable range of the graph.

    The relaxed step ``x <- x + gamma (W - I) x`` on a symmetric W contracts the disagreement only
    for ``0 < gamma < 2 / (1 - lambda_min(W))``; compressed methods (Choco, DeepSqueeze) need a
    smaller gamma still, so beyond this bound every one of them diverges. Directed graphs have no
    such simple bound and get no warning.
    """
    gamma = options.get("gamma")
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)):
        return None
    from jaxgossip import algorithms

    try:
        if not algorithms.resolve(algorithm).sweep.relaxation_gamma:
            return None
    except (ValueError, TypeError):  # an unknown algorithm is reported by check_algorithm
        return None
    if topo.directed or topo.num_nodes > 2048 or topo.stochastic:
        return None
    lam_min = 1.0
    for t in range(topo.period):
        w = np.asarray(topo.matrix(t), dtype=np.float64)
        if not np.allclose(w, w.T, atol=1e-6):
            return None
        lam_min = min(lam_min, float(np.linalg.eigvalsh(w)[0]))
    bound = 2.0 / (1.0 - lam_min) if lam_min < 1.0 else math.inf
    if gamma <= 0 or gamma >= bound:
        return (
            f"algorithm_options.gamma={gamma} is outside the stable range (0, {bound:.4g}) of {algorithm} on "
            f"{topo.name} (2 / (1 - lambda_min(W)), lambda_min = {lam_min:.4g}); the run will likely diverge"
        )
    return None


def byzantine_args(config: TrainConfig) -> dict | None:
    """The keyword arguments of :func:`jaxgossip.algorithms.byzantine` for ``config.byzantine``
    (``ids`` or ``num`` with the run's data seed as key, ``attack`` and its options), None without
    attackers.

    Raises:
      ValueError: naming the ``--byzantine.*`` option and the rule.
    """
    options = _option_group(
        "byzantine", config.byzantine, BYZANTINE_OPTIONS, "option", "--byzantine.nodes=2 --byzantine.attack=alie"
    )
    values = {**BYZANTINE_OPTIONS, **options}
    nodes, ids = values["nodes"], values["ids"]
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 0:
        raise ValueError(f"--byzantine.nodes={nodes!r} must be an int K >= 0 (attackers drawn by the data seed)")
    if isinstance(ids, str):
        try:
            ids = [int(part) for part in ids.split(",") if part.strip()]
        except ValueError:
            raise ValueError(f"--byzantine.ids={values['ids']!r} must be node ids, e.g. 0,5") from None
    elif isinstance(ids, int) and not isinstance(ids, bool):
        ids = [ids]
    if ids is not None and (not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) for i in ids)):
        raise ValueError(f"--byzantine.ids={values['ids']!r} must be node ids, e.g. 0,5")
    if ids is not None and nodes:
        raise ValueError(
            "--byzantine.nodes and --byzantine.ids: give one of them (K drawn by the data seed, or the ids)"
        )
    if not isinstance(values["attack_options"], dict):
        raise ValueError(f"--byzantine.attack_options={values['attack_options']!r} must be a mapping, e.g. "
                         "--byzantine.attack_options.sigma=10")
    for key, value in values["attack_options"].items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"--byzantine.attack_options.{key}={value!r} must be a number")
    if not nodes and not ids:
        return None
    # K attackers are drawn from the data seed, like the partition and random graphs: they fix the
    # shapes of the attack's edge tables, so every seed of a sweep (one vmapped program) shares them.
    who = {"ids": list(ids)} if ids else {"num": nodes, "key": config.resolved_data_seed}
    return {**who, "attack": values["attack"], **values["attack_options"]}


def check_byzantine(config: TrainConfig, topo) -> None:
    """Checks ``config.byzantine`` on the run's graph before any data is loaded (the wrapper is
    built: attack names and options, K < N, an honest graph that stays connected, an algorithm
    whose messages are models)."""
    from jaxgossip import algorithms

    args = byzantine_args(config)
    if args is None:
        return
    try:
        options = with_trainer_options(config.algorithm, dict(config.algorithm_options))
        algorithms.byzantine(config.algorithm, topo, options=options, **args)
    except (ValueError, TypeError) as err:
        raise ValueError(f"--byzantine: {err}") from None


def async_form_of(config: TrainConfig) -> str:
    """The asynchronous algorithm of an ``--execution=async`` run (:mod:`jaxgossip.engine.asynchronous`):
    ``async_form``, or with ``auto`` the first of the algorithm's asynchronous forms
    (:attr:`jaxgossip.types.AlgorithmInfo.asynchronous`).

    Raises:
      ValueError: an algorithm without an asynchronous form (its reason), or an ``async_form``
        that is not one of its forms.
    """
    from jaxgossip import algorithms

    entry = algorithms.resolve(config.algorithm)
    algorithms.check_execution(config.algorithm, entry, "async")
    form = config.async_form
    if form == "auto":
        return entry.execution.form_names[0]
    if form not in entry.execution.form_names:
        raise ValueError(
            f"async_form={form!r}{did_you_mean(form, entry.execution.form_names)}: the asynchronous forms of "
            f"{config.algorithm} are {', '.join(entry.execution.form_names)} (or auto, the first)"
        )
    return form


def _async_refusals(config: TrainConfig) -> list[tuple[str, str]]:
    """(option=value, why) of every option set that an asynchronous run does not model."""
    options = config.time if isinstance(config.time, dict) else {}
    availability = options.get("availability") or TIME_OPTIONS["availability"]
    checks = [
        (config.local_steps != 1, f"local_steps={config.local_steps}",
         "a round is N node events of one local step each (num_rounds counts them); use --local_steps=1"),
        (bool(config.algorithm_options), f"algorithm_options={dict(config.algorithm_options)}",
         "the asynchronous forms mix or push with the graph's weights and take no options (no compression)"),
        (config.outer_optimizer != "none", f"outer_optimizer={config.outer_optimizer!r}",
         "an outer step needs a common round; use --outer_optimizer=none"),
        (byzantine_args(config) is not None, f"byzantine={dict(config.byzantine)}",
         "attackers are modelled in synchronous rounds only"),
        (config.final_merge is not None, f"final_merge={config.final_merge!r}",
         "the merge runs synchronous rounds on the synchronous algorithm's state"),
        (config.ordering != "atc", f"ordering={config.ordering!r}",
         "the asynchronous rules fix where each gradient is taken; use --ordering=atc"),
        (config.message_dtype != "fp32", f"message_dtype={config.message_dtype!r}",
         "asynchronous messages are float32 models"),
        (config.devices != 1, f"devices={config.devices}", "asynchronous runs are planned for one device"),
        (availability != "always", f"time.availability={availability!r}",
         "availability is not modelled (a node is always computing)"),
    ]
    return [(what, why) for bad, what, why in checks if bad]


def check_execution_options(config: TrainConfig, topo) -> None:
    """Checks ``execution`` and, for ``async``, the algorithm's asynchronous form
    (:func:`async_form_of`), the options an asynchronous run does not model, the graph
    (:func:`jaxgossip.engine.asynchronous.check_async_graph`: fixed, static, the weights the form uses)
    and a positive compute time (the step times order the events).

    Raises:
      ValueError: naming the value and the rule.
    """
    if config.execution not in EXECUTIONS:
        raise _unknown("execution", config.execution, EXECUTIONS)
    if config.execution == "sync":
        if config.async_form != "auto":
            raise ValueError(f"async_form={config.async_form!r} applies to --execution=async only")
        return
    form = async_form_of(config)
    refused = _async_refusals(config)
    if refused:
        what, why = refused[0]
        raise ValueError(f"{what} with --execution=async: {why}")
    from jaxgossip.engine import asynchronous
    from jaxgossip.sim import timing

    try:
        asynchronous.check_async_graph(form, topo)
    except (ValueError, TypeError) as err:
        raise ValueError(f"--execution=async with {config.algorithm} ({form}) on {topo.name}: {err}") from None
    compute = timing.parse_compute(normalise_time(config.time).get("compute", TIME_OPTIONS["compute"]))
    zero = compute.trace is not None and not np.any(np.asarray(compute.trace) > 0)
    if zero or (compute.kind in ("constant", "stragglers") and not compute.seconds > 0):
        raise ValueError(
            "--execution=async needs --time.compute > 0 (the step times order the events; with 0 every step "
            "ends at time 0), e.g. --time.compute=0.01 or --time.compute=stragglers:0.01,0.25,4"
        )


def check_sync_only(config: TrainConfig, command: str) -> None:
    """Refuses ``--execution=async`` in a command that runs synchronous rounds only."""
    if config.execution != "sync":
        raise ValueError(
            f"execution={config.execution!r}: jaxgossip {command} runs synchronous rounds only; "
            "asynchronous runs go through jaxgossip train"
        )


def _json_value(value: Any) -> bool:
    """Whether ``value`` is plain JSON data (a default that a config file could spell out)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_json_value(v) for v in value)
    return False


def _signature_defaults(factory: Any, skip: int) -> dict:
    """The plain-data keyword defaults of ``factory`` after its first ``skip`` parameters."""
    params = list(inspect.signature(factory).parameters.values())[skip:]
    return {
        p.name: p.default
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is not p.empty and _json_value(p.default)
    }


def _resolved_byzantine(options: Any) -> Any:
    from jaxgossip import algorithms

    if not isinstance(options, dict):
        return options
    values = {**BYZANTINE_OPTIONS, **options}
    ids = values["ids"]
    if isinstance(ids, str):
        try:
            ids = [int(part) for part in ids.split(",") if part.strip()]
        except ValueError:
            return values
    elif isinstance(ids, int) and not isinstance(ids, bool):
        ids = [ids]
    if isinstance(ids, (list, tuple)):
        ids = sorted(ids) or None  # the wrapper sorts the attackers; no ids is no attacker
    values["ids"] = ids
    if not values["nodes"] and ids is None:  # nobody attacks: the attack and its options do nothing
        return dict(BYZANTINE_OPTIONS)
    given = values["attack_options"]
    if isinstance(given, dict) and values["attack"] in algorithms.ATTACKS:
        values["attack_options"] = {**algorithms.ATTACKS[values["attack"]], **given}
    return values


def resolved_config(values: Any) -> dict:
    """The configuration a run actually trains with, as a plain dict, from :meth:`TrainConfig.to_dict`
    (or the config an older checkpoint saved): every field present (a missing one at its default),
    every option group with its defaults filled in (``time``, ``byzantine`` and its attack's
    options, ``optimizer_options``, the algorithm's trainer defaults and keyword defaults, the
    model's attributes), and the values that stand for another resolved: ``data_seed`` null is the
    ``seed``, ``async_form`` auto is the algorithm's first asynchronous form, attacker ids are
    sorted, no attacker makes the attack irrelevant. Two configs that spell the same run
    differently resolve to equal dicts, so a checkpoint is compared with a run by what they train
    (:func:`jaxgossip.run.checkpoint.check_resume`). Never raises on a value it cannot resolve (an
    unknown name, a removed plug-in): that value is kept as given, and differs if it differs.
    """
    from jaxgossip import algorithms, models

    defaults = {f.name: getattr(TrainConfig(), f.name) for f in dataclasses.fields(TrainConfig)}
    out = {**defaults, **dict(values)}
    if isinstance(out["time"], dict):
        given = normalise_time(out["time"])
        out["time"] = {**TIME_OPTIONS, **{k: v for k, v in given.items() if v is not None}}
        for key in ("compute", "latency", "bandwidth"):  # "1e-4" in a config file is the number 1e-4
            if isinstance(out["time"].get(key), str):
                try:
                    out["time"][key] = float(out["time"][key])
                except ValueError:
                    pass
    out["byzantine"] = _resolved_byzantine(out["byzantine"])
    if out["data_seed"] is None:
        out["data_seed"] = out["seed"]
    if isinstance(out["optimizer_options"], dict) and out["optimizer"] in OPTIMIZERS:
        out["optimizer_options"] = {**OPTIMIZERS[out["optimizer"]], **out["optimizer_options"]}
    if isinstance(out["decay_rounds"], (int, float)) and not isinstance(out["decay_rounds"], bool):
        out["decay_rounds"] = [out["decay_rounds"]]
    for field, parse in (("final_merge", _final_merge), ("node_batch", _node_batch)):
        try:
            out[field] = parse(out[field])
        except ValueError:
            pass
    try:
        entry = algorithms.resolve(out["algorithm"])
    except (ValueError, TypeError, ImportError, AttributeError):
        entry = None
    if entry is not None and isinstance(out["algorithm_options"], dict):
        out["algorithm_options"] = {
            **_signature_defaults(entry.factory, 1),
            **entry.hooks.trainer_options,
            **out["algorithm_options"],
        }
        if out["execution"] == "async" and out["async_form"] == "auto" and entry.execution.form_names:
            out["async_form"] = entry.execution.form_names[0]
    if isinstance(out["model_options"], dict) and out["model"] in models.REGISTRY:
        try:
            module = models.make_model(out["model"], num_classes=10)
        except (ValueError, TypeError):
            module = None
        if module is not None:
            attrs = {
                f.name: getattr(module, f.name)
                for f in dataclasses.fields(module)
                if f.name not in ("parent", "name", "num_classes") and _json_value(getattr(module, f.name))
            }
            out["model_options"] = {**attrs, **out["model_options"]}
    return out
