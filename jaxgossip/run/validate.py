"""The checks of a training config's fields (edge module, :mod:`jaxgossip.run`).

Each check raises a ``ValueError`` whose message names the field, the value and the fix; the CLI
prints it and exits with 2. The builders check by building (:func:`check_topology`,
:func:`check_algorithm`); :func:`jaxgossip.run.resolve.resolve` keeps what they build.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os

import numpy as np

from jaxgossip.checks import did_you_mean
from jaxgossip.run.config import (
    LR_SCHEDULES,
    OPTIMIZERS,
    ORDERINGS,
    WEIGHT_DECAY_MASKS,
    TrainConfig,
    final_merge_value,
    node_batch_value,
    unknown_name,
)

__all__ = [
    "check_fields",
    "check_partition",
    "check_topology",
    "check_algorithm",
    "check_model_options",
    "check_optimizer_options",
    "with_trainer_options",
    "gamma_warning",
    "check_sync_only",
]


def check_partition(spec: str, field: str = "partition") -> None:
    """Checks the grammar of a partition spec: iid, dirichlet:ALPHA, shards:K or skew:S."""
    if not isinstance(spec, str):
        raise ValueError(f"{field}={spec!r} must be a string such as iid, dirichlet:0.1, shards:2 or skew:0.8")
    name, sep, arg = spec.strip().partition(":")
    kinds = {"iid": None, "by_source": None, "dirichlet": "ALPHA > 0", "shards": "an int K >= 1", "skew": "S in [0, 1]"}
    if name not in kinds:
        raise unknown_name(field, name, ["iid", "dirichlet:ALPHA", "shards:K", "skew:S", "by_source"])
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
    ValueError naming the field. ``file:PATH`` reads the graph from a ``.npz`` file
    (:mod:`jaxgossip.run.topology_files`)."""
    from jaxgossip import topology
    from jaxgossip.run.topology_files import FILE_PREFIX, is_file_spec, load_topology

    if not isinstance(spec, str) or not spec:
        raise ValueError(f"{field}={spec!r} must be a graph spec such as ring, torus:4x8 or erdos_renyi:0.3")
    if is_file_spec(spec):
        try:
            return load_topology(spec[len(FILE_PREFIX):], num_nodes)
        except ValueError as err:
            raise ValueError(f"{field}={spec!r}: {err}") from None
    families = list(topology.FAMILIES)
    name = spec.partition("+")[0].partition(":")[0]
    if name not in families:
        raise unknown_name(field, name, families)
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
        raise unknown_name("algorithm", name, algorithms.REGISTRY)
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
    if trainer_defaults:  # the trainer's defaults (resolve.make_algorithm)
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


def check_model_options(model: str, options: dict) -> dict:
    """Checks ``model`` and its options (:func:`jaxgossip.models.check_options`; the run's model is
    built once, at the data's number of classes, by :func:`jaxgossip.run.resolve.resolve`); a scalar
    given for a sequence attribute (``hidden=32``) becomes a one-element tuple, a list a tuple.
    Returns the options."""
    from jaxgossip import models

    if model not in models.REGISTRY:
        raise unknown_name("model", model, sorted(models.REGISTRY))
    if not isinstance(options, dict):
        raise ValueError(f"model_options={options!r} must be a mapping of attribute -> value")
    defaults = models.attributes(model)
    takes = [key for key in defaults if key != "num_classes"]
    fixed = {}
    for key, value in options.items():
        if key not in takes:
            raise ValueError(
                f"model_options.{key}: model {model!r} has no attribute {key!r}{did_you_mean(key, takes)}; "
                f"it takes: {', '.join(takes)}"
            )
        if isinstance(defaults[key], (tuple, list)) and isinstance(value, (int, float)):
            value = (value,)
        fixed[key] = tuple(value) if isinstance(value, list) else value
    try:
        models.check_options(model, **fixed)
    except (ValueError, TypeError) as err:
        raise ValueError(f"model={model!r} with model_options={options}: {err}") from None
    return fixed


def check_optimizer_options(optimizer: str, options: dict) -> dict:
    """Checks ``optimizer`` and its ``optimizer_options``; returns the options with defaults filled in."""
    if optimizer not in OPTIMIZERS:
        raise unknown_name("optimizer", optimizer, OPTIMIZERS)
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


def _check_streaming(config: TrainConfig) -> None:
    """The Streaming DiLoCo options against H and the outer optimizer (the model's layer count is
    checked when the trainer is built)."""
    from jaxgossip.engine import streaming

    _number(config, "outer_fragments", 1, integer=True)
    _number(config, "outer_overlap", 0, integer=True)
    _number(config, "outer_mix", 0)
    if (config.outer_fragments > 1 or config.outer_overlap > 0) and config.outer_optimizer == "none":
        raise ValueError(
            f"outer_fragments={config.outer_fragments}, outer_overlap={config.outer_overlap}: Streaming DiLoCo "
            "synchronises fragments with an outer step; give --outer_optimizer=sgd|nesterov"
        )
    spec = streaming.Streaming(config.outer_fragments, config.outer_overlap, config.outer_mix)
    streaming.check_streaming(spec, config.local_steps)


def _check_outer_bits(config: TrainConfig) -> None:
    """``outer_message_bits`` against the outer options (the algorithm's dense messages are checked
    when it is resolved)."""
    from jaxgossip.ops import quantize

    bits = config.outer_message_bits
    quantize.check_message_bits(bits)
    if bits == 32:
        return
    if config.outer_optimizer == "none":
        raise ValueError(
            f"outer_message_bits={bits} quantises the outer gradients: it needs --outer_optimizer=sgd|nesterov "
            "and --outer_message=pseudo_gradient"
        )
    if config.outer_message != "pseudo_gradient":
        raise ValueError(
            f"outer_message_bits={bits} with outer_message={config.outer_message!r}: the message is then the "
            "model, and quantising models is a different method; use --outer_message=pseudo_gradient"
        )
    if config.message_dtype != "fp32":
        raise ValueError(
            f"outer_message_bits={bits} with message_dtype={config.message_dtype!r}: the outer message bits "
            "set the value format; use --message_dtype=fp32"
        )


def check_fields(config: TrainConfig) -> TrainConfig:
    """Checks every field of ``config`` that needs no object built: types, ranges, names, spec
    grammars and the combinations of plain fields (:func:`jaxgossip.run.resolve.check_train_config`
    adds the graph, the algorithm, the clock and the attackers).

    Returns:
      the config with normalized values (``decay_rounds`` a tuple,
      ``final_merge`` "3" -> 3, ``node_batch`` "2" -> 2).

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    from jaxgossip import data

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
        raise unknown_name("dataset", config.dataset, [*data.DATASET_NAMES, "npz:PATH", "text:PATH"])
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
        raise unknown_name("outer_optimizer", config.outer_optimizer, outer.OUTER_OPTIMIZERS)
    _number(config, "outer_lr", 0, strict=True)
    _number(config, "outer_momentum", 0, high=1)
    if config.outer_message not in outer.OUTER_MESSAGES:
        raise unknown_name("outer_message", config.outer_message, outer.OUTER_MESSAGES)
    if config.outer_optimizer == "none" and config.outer_message != outer.OUTER_MESSAGES[0]:
        raise ValueError(
            f"outer_message={config.outer_message!r} with outer_optimizer='none': without an outer optimizer "
            "there is no pseudo-gradient and every round communicates the model; give --outer_optimizer="
            + "|".join(name for name in outer.OUTER_OPTIMIZERS if name != "none")
            + " (or drop --outer_message)"
        )
    _check_streaming(config)
    _check_outer_bits(config)
    from jaxgossip.ops import precision

    if config.precision not in precision.PRECISIONS:
        raise unknown_name("precision", config.precision, precision.PRECISIONS)
    if config.message_dtype not in precision.MESSAGE_DTYPES:
        raise unknown_name("message_dtype", config.message_dtype, precision.MESSAGE_DTYPES)
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
        raise unknown_name("lr_schedule", config.lr_schedule, LR_SCHEDULES)
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
        raise unknown_name("ordering", config.ordering, ORDERINGS)
    if config.weight_decay_mask not in WEIGHT_DECAY_MASKS:
        raise unknown_name("weight_decay_mask", config.weight_decay_mask, WEIGHT_DECAY_MASKS)
    if config.num_nodes % config.devices:
        raise ValueError(
            f"devices={config.devices} must divide num_nodes={config.num_nodes} "
            f"({config.num_nodes} nodes cannot be split evenly over {config.devices} devices)"
        )
    if not isinstance(config.name, str):
        raise ValueError(f"name={config.name!r} must be a string")
    check_partition(config.partition)
    return dataclasses.replace(
        config,
        decay_rounds=decay,
        final_merge=final_merge_value(config.final_merge),
        node_batch=node_batch_value(config.node_batch),
    )


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


def check_sync_only(config: TrainConfig, command: str) -> None:
    """Refuses ``--execution=async`` in a command that runs synchronous rounds only."""
    if config.execution != "sync":
        raise ValueError(
            f"execution={config.execution!r}: jaxgossip {command} runs synchronous rounds only; "
            "asynchronous runs go through jaxgossip train"
        )
