"""The training config (edge module: the CLI and the runner use it; the library below never
imports it).

:class:`TrainConfig` holds every field of a training run, :func:`train_field_help` their meanings
(shown by ``jaxgossip <command> --help``) and :func:`resolved_config` the run a config spells, every
default filled in. The checks live in :mod:`jaxgossip.run.validate` and :mod:`jaxgossip.run.groups`;
:func:`jaxgossip.run.resolve.resolve` builds the objects a config names, once.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from typing import Any

from jaxgossip.checks import did_you_mean
from jaxgossip.sim.network import Network
from jaxgossip.types import EXECUTIONS, ORDERINGS

__all__ = [
    "TrainConfig",
    "unknown_name",
    "train_field_help",
    "allowed_values",
    "ORDERINGS",
    "EXECUTIONS",
    "WEIGHT_DECAY_MASKS",
    "LR_SCHEDULES",
    "OPTIMIZERS",
    "ByzantineOptions",
    "TIME_HELP",
    "option_group",
    "typed_options",
    "factory_hints",
    "group_help",
    "final_merge_value",
    "node_batch_value",
    "resolved_config",
]

WEIGHT_DECAY_MASKS = ("all", "no_1d", "no_norm")
#: learning-rate schedules after the warm-up (resolve.make_schedule).
LR_SCHEDULES = ("step", "cosine")


@dataclasses.dataclass(frozen=True)
class ByzantineOptions:
    """The ``--byzantine.*`` group: K attackers drawn from the data seed (``nodes``) or explicit
    ``ids``, the attack and its options (:func:`jaxgossip.algorithms.byzantine`)."""

    nodes: int = 0
    ids: list[int] | int | str | None = None
    attack: str = "gaussian"
    attack_options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def options(self) -> dict:
        """The fields by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def option_group(schema: type, what: str) -> Any:
    """A config field holding a group of dotted options (``--time.*``): a mapping of the options
    given, whose keys and value types are the fields of the dataclass ``schema`` (the command line
    and config files are checked against it; ``what`` names a key in errors: "unknown WHAT")."""
    return dataclasses.field(default_factory=dict, metadata={"group": schema, "what": what})


def typed_options(hints_of: Callable[[dict], dict[str, Any]], invalid: str | None = None) -> Any:
    """A config field holding a free-form mapping (``--algorithm_options.*``, ``--sweep.*``) whose
    keys depend on other fields: ``hints_of(values)`` (the parsed values of every field) gives the
    type of each dotted key it knows, which jsonargparse checks like any field; keys it does not
    name are left to the config checks. ``invalid`` (optional) is the error's ending for a value of
    the wrong type ("must be a list of finite numbers"), after ``--key=VALUE``."""
    return dataclasses.field(default_factory=dict, metadata={"typed_by": hints_of, "invalid": invalid})


def factory_hints(factory: Callable, skip: int = 0) -> dict[str, Any]:
    """Parameter -> type hint of ``factory`` after its first ``skip`` parameters (Any where the
    signature gives none); empty for a factory that takes ``**kwargs`` (a plug-in's own rules)."""
    params = list(inspect.signature(factory).parameters.values())
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return {}
    try:
        hints = typing.get_type_hints(factory)
    except Exception:  # noqa: BLE001 (a plug-in's annotations may not resolve: its options stay untyped)
        hints = {}
    return {p.name: hints.get(p.name, Any) for p in params[skip:]}


def algorithm_option_hints(values: dict) -> dict[str, Any]:
    """The types of ``algorithm_options``: the chosen algorithm's factory signature, and under
    ``compressor_options`` the chosen compressor's (the registries' metadata). Empty where the
    algorithm cannot be resolved: the config checks name it."""
    from jaxgossip import algorithms, compress

    name = values.get("algorithm")
    options = values.get("algorithm_options") or {}
    if not isinstance(name, str) or not isinstance(options, dict):
        return {}
    try:
        factory = algorithms.resolve(name).factory
    except Exception:  # noqa: BLE001 (an unknown name or a plug-in that fails to import: reported by the checks)
        return {}
    hints = {key: hint for key, hint in factory_hints(factory, 1).items() if key != "compressor_options"}
    compressor = options.get("compressor", inspect.signature(factory).parameters.get("compressor"))
    compressor = getattr(compressor, "default", compressor)
    if isinstance(compressor, str) and compressor in compress.REGISTRY:
        hints.update({f"compressor_options.{k}": h for k, h in factory_hints(compress.REGISTRY[compressor]).items()})
    return hints


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
    algorithm_options: dict[str, Any] = typed_options(algorithm_option_hints)
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
    outer_fragments: int = 1
    outer_overlap: int = 0
    outer_mix: float = 0.0
    outer_message_bits: int = 32
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
    time: dict[str, Any] = option_group(Network, "time option")
    byzantine: dict[str, Any] = option_group(ByzantineOptions, "option")
    execution: str = "sync"
    async_form: str = "auto"
    async_rate_compensation: bool = False

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
        **group_help(),
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
        "outer_fragments": "Streaming DiLoCo: F fragments of the model's layers (layer l in fragment l mod F), "
        "fragment f synchronised at inner step (f+1)*local_steps/F of every round (1 <= F <= local_steps and "
        "the model's layers; needs an outer_optimizer)",
        "outer_overlap": "Streaming DiLoCo: tau inner steps a fragment's outer result is in flight before it is "
        "merged (0 <= tau < local_steps)",
        "outer_mix": "Streaming DiLoCo: the merge keeps outer_mix of the fragment's inner value and takes the rest "
        "from the outer result, in [0, 1] (0: the result only, as DiLoCo; the paper reports 0.5 with overlap)",
        "outer_message_bits": "bits per value of the outer gradients sent: 4 (float4_e2m1fn), 8 (float8_e4m3fn), "
        "16 (bfloat16) or 32 (float32, the default); below 32 each node's leaf is sent with a float32 scale "
        "max|x|/FMAX (none for 16) and the bits count B per value plus 32 per scale, as Streaming DiLoCo's "
        "4-bit outer gradients; needs an outer_optimizer, outer_message=pseudo_gradient, message_dtype=fp32 and "
        "an algorithm sending dense messages (gossip, allreduce, push_sum)",
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
        "time": "the simulated network (jaxgossip.sim.network.Network): each node's compute and availability, "
        "each link's latency and bandwidth; every metrics row has sim_time",
        "byzantine": "Byzantine attackers (jaxgossip.algorithms.byzantine; metrics over the honest nodes only)",
        "execution": "sync (lock-step rounds) or async (every node on its own simulated clock, no waiting: "
        "a round is N node events, N local steps in total; needs --time.compute > 0; algorithms with an "
        "asynchronous form: gossip, push_sum)",
        "async_form": "with --execution=async, the asynchronous form of the algorithm: auto (its first: gossip -> "
        "async_gossip, push_sum -> async_sgp), async_gossip or ad_psgd (gossip), async_sgp (push_sum)",
        "async_rate_compensation": "with --execution=async, scale node i's step by E[p_i] mean_j 1 / E[p_j] (its "
        "expected step time over the mean one, from --time.compute) so that the run optimizes the uniform "
        "objective rather than the event-rate-weighted one (docs/training.md)",
    }


#: ``--time.option`` -> its meaning (the fields of jaxgossip.sim.network.Network; every command
#: that takes them shows these).
TIME_HELP = {
    "time.compute": "seconds per local step: SECONDS, or stragglers:C,F,S (round(F N) nodes S times slower), "
    "lognormal:MEDIAN,SIGMA, exponential:MEAN, trace:PATH ([steps, N] .npy/.csv, or a device trace .npz / "
    "headed .csv: its compute_seconds); default 0",
    "time.latency": "seconds per message: SECONDS for every link (default 1e-4: 100 us, an assumed LAN / "
    "data-centre TCP message), or per node (its uplink): constant:V, stragglers:F,S (round(F N) nodes drawn "
    "from --seed, S times the default), lognormal:MEDIAN,SIGMA, trace:PATH ([N] or [rounds, N] .npy/.csv, cycled), "
    "or per edge: edge_trace:PATH (.csv row,sender,receiver,value, or .npy [P] / [rounds, P] over the "
    "real edges in (sender, receiver) order)",
    "time.bandwidth": "bit/s: BITS_PER_S for every link (default 1e9: 1 Gbit/s Ethernet), or per node (its "
    "uplink): constant:V, stragglers:F,S (round(F N) nodes drawn from --seed, 1/S of the default), "
    "lognormal:MEDIAN,SIGMA, trace:PATH ([N] or [rounds, N] .npy/.csv, cycled; or a device trace's uplink_bps), "
    "or per edge: edge_trace:PATH (as --time.latency)",
    "time.downlink": "bit/s of each node's downlink, which bounds every message it receives (and, with "
    "--time.mode=serial, is shared by them): BITS_PER_S, or per node: constant:V, stragglers:F,S (1/S of 1e9), "
    "lognormal:MEDIAN,SIGMA, trace:PATH ([N] or [rounds, N], cycled; or a device trace's downlink_bps); "
    "default unlimited (not modelled); fixed graphs and all-reduces",
    "time.mode": "serial: a node's messages of a round share its uplink one after another (default); "
    "parallel: they go out at once on independent links",
    "time.exchange": "priced: an asynchronous pairwise average (AD-PSGD) takes its link time both ways and keeps "
    "both nodes busy (default); free: it takes no time (the AD-PSGD paper's model, for comparison)",
    "time.allreduce_model": "cost of an all-reduce round: the bandwidth-optimal ring all-reduce (default) or one "
    "model-sized message per node",
    "time.availability": "always|markov:P_OFF,P_ON|trace:PATH: offline nodes neither compute nor send; a round "
    "waits only for online nodes (with --execution=async, row r covers simulated time [r P, (r + 1) P), P the "
    "expected time of a round; a step interrupted by going offline is lost) (default always)",
}


def group_help() -> dict[str, str]:
    """``group.option`` -> one-line meaning of every option of the :class:`TrainConfig` groups."""
    return {
        **TIME_HELP,
        "byzantine.nodes": "K attackers drawn by the data seed, shared by every seed of a sweep (default 0)",
        "byzantine.ids": "the attackers' node ids instead, e.g. 0,5",
        "byzantine.attack": "|".join(_attack_names()) + " (default gaussian)",
        "byzantine.attack_options": "the attack's options, e.g. --byzantine.attack_options.sigma=10",
    }


def _attack_names() -> list[str]:
    from jaxgossip import algorithms

    return list(algorithms.ATTACKS)


def unknown_name(field: str, value: str, known) -> ValueError:
    """The error of an unknown name: the field, the value, a suggestion and the known names."""
    known = list(known)
    return ValueError(f"unknown {field} {value!r}{did_you_mean(value, known)}; known: {', '.join(known)}")


def final_merge_value(value: Any) -> Any:
    """``final_merge`` parsed: None (no merge), a number of rounds >= 1 or ``"exact"``."""
    if value is None or value in (0, "none", "None", "null"):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not (value == "exact" or (isinstance(value, int) and value >= 1)):
        raise ValueError(f"final_merge={value!r} must be null (no merge), a number of merge rounds >= 1, or 'exact'")
    return value


def node_batch_value(value: Any) -> Any:
    """``node_batch`` parsed: ``"auto"``, 0 or a positive int."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    raise ValueError(f"node_batch={value!r} must be 'auto', 0 (one vmap over all nodes) or a positive int")


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
    values = {**ByzantineOptions().options(), **options}
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
        return ByzantineOptions().options()
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
        from jaxgossip.sim.network import Network

        try:  # every --time.* option at its value ("1e-4" in a config file is the number 1e-4)
            out["time"] = Network.from_options(out["time"]).options()
        except ValueError:
            out["time"] = {**Network().options(), **{k: v for k, v in out["time"].items() if v is not None}}
    out["byzantine"] = _resolved_byzantine(out["byzantine"])
    if out["data_seed"] is None:
        out["data_seed"] = out["seed"]
    if isinstance(out["optimizer_options"], dict) and out["optimizer"] in OPTIMIZERS:
        out["optimizer_options"] = {**OPTIMIZERS[out["optimizer"]], **out["optimizer_options"]}
    if isinstance(out["decay_rounds"], (int, float)) and not isinstance(out["decay_rounds"], bool):
        out["decay_rounds"] = [out["decay_rounds"]]
    for field, parse in (("final_merge", final_merge_value), ("node_batch", node_batch_value)):
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
        attrs = {
            key: value
            for key, value in models.attributes(out["model"]).items()
            if key != "num_classes" and _json_value(value)
        }
        out["model_options"] = {**attrs, **out["model_options"]}
    return out
