"""Resolve a training config: check it and build every object it names, once.

:func:`resolve` is the one place a run's objects are made: the graph, the algorithm (with the
trainer's defaults, the attackers and the message dtype), the final merge, the clock, the local
optimizer, the data and its partition, and the model at the data's number of classes. The checks
ARE these constructions: a config that resolves runs, one that does not raises a ``ValueError``
naming the field (exit 2 on the command line). The runner, the reports and the commands read the
:class:`Resolved` run; a sweep point builds only what its traced values change
(:func:`jaxgossip.run.runner.make_trainer`).

Everything that needs no data is built first (:func:`check_train_config` stops there), so a bad
config fails before any data set is read.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import optax

from jaxgossip import algorithms, data, models, topology
from jaxgossip.checks import is_concrete
from jaxgossip.ops import platforms, precision, sharding
from jaxgossip.run.config import TrainConfig
from jaxgossip.run.groups import (
    async_form_of,
    byzantine_args,
    check_byzantine,
    check_execution_options,
    network_of,
    time_model_of,
)
from jaxgossip.run.validate import (
    check_algorithm,
    check_fields,
    check_model_options,
    check_optimizer_options,
    check_topology,
    with_trainer_options,
)
from jaxgossip.sim.network import Network

__all__ = [
    "Checked",
    "Resolved",
    "check_run",
    "resolve",
    "check_train_config",
    "load_data",
    "make_algorithm",
    "make_optimizer",
    "make_schedule",
]


class Resolved(NamedTuple):
    """A checked config and every object of its run, each built once.

    Attributes:
      config: the checked config, values normalized (:func:`check_train_config`).
      topology: the run's graph (offline nodes of ``--time.availability`` dropped each round).
      algorithm: the synchronous algorithm as the trainer runs it (trainer defaults under the
        user's options, the Byzantine wrapper with ``--byzantine.*``, messages sent in
        ``message_dtype``); None for ``execution="async"``.
      async_form: the asynchronous algorithm of an ``execution="async"`` run, else None.
      merge: the final merge (:func:`jaxgossip.algorithms.make_merge`), None without one.
      network: the run's :class:`jaxgossip.sim.network.Network` (``--time.*``).
      time: the run's clock, :class:`jaxgossip.sim.timing.TimeModel` (the network on the graph).
      optimizer: the local optimizer of one node (:func:`make_optimizer`).
      dataset: the data set; parts: each node's sample indices; shards: the per-node data
        ``[N, ...]`` (placed on ``mesh`` when ``devices > 1``); mesh: the node mesh or None.
      model: the flax module at the data's number of classes.
      choices: the build-time choices of the target platform
        (:class:`jaxgossip.ops.platforms.BuildChoices`).
    """

    config: TrainConfig
    topology: topology.Topology
    algorithm: Any
    async_form: str | None
    merge: Any
    network: Network
    time: Any
    optimizer: optax.GradientTransformation
    dataset: data.Dataset
    parts: list
    shards: Any
    mesh: Any
    model: Any
    choices: platforms.BuildChoices


class Checked(NamedTuple):
    """A checked config and the objects of its run that need no data (:func:`check_run`); the
    fields mean what they mean in :class:`Resolved`."""

    config: TrainConfig
    topology: topology.Topology
    algorithm: Any
    async_form: str | None
    merge: Any
    network: Network
    time: Any


def check_run(config: TrainConfig) -> Checked:
    """Checks ``config`` without reading data, building the objects of its run that need none, in
    the order their errors are reported: fields (with the network of ``--time.*``), graph,
    algorithm, merge, model options, clock, attackers, execution. :func:`resolve` takes the result
    on (a command checks, prints its ``--print-config`` and takes its output folder in between) and
    builds nothing of it again.

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    config = check_fields(config)
    network = network_of(config)
    topo = check_topology(config.topology, config.num_nodes, config.resolved_data_seed)
    available = network.online(config.num_rounds, config.num_nodes, config.seed)  # the graph's and the clock's
    # Offline nodes drop out of a synchronous round's graph (the algorithm must accept failures); an
    # asynchronous run keeps its fixed graph and plans the mask into its events.
    if available is not None and config.execution != "async":
        topo = topology.with_availability(topo, available)
    alg = check_algorithm(config.algorithm, dict(config.algorithm_options), topo, trainer_defaults=True)
    if available is not None and alg.gradient is not None:
        raise ValueError(
            f"--time.availability={network.availability!r}: {config.algorithm} has a gradient hook "
            "(its state would see an offline node's gradient); use an algorithm without one"
        )
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
    if config.outer_message_bits != 32 and not algorithms.info(config.algorithm).cost.dense_values:
        raise ValueError(
            f"outer_message_bits={config.outer_message_bits} with {config.algorithm}: its messages are not "
            "dense (compressed, sparse or low-rank values), so B-bit values cannot reprice them; use an "
            "algorithm that sends every value (gossip, allreduce, push_sum) or --outer_message_bits=32"
        )
    if config.ordering not in alg.orderings:
        raise ValueError(
            f"ordering={config.ordering!r}: {config.algorithm} is registered with orderings={alg.orderings} "
            f"(its docstring says why); use --ordering={alg.orderings[0]}"
        )
    merge = None
    if config.final_merge is not None:
        try:
            merge = algorithms.make_merge(topo, config.final_merge)
        except (ValueError, TypeError) as err:
            raise ValueError(f"final_merge={config.final_merge!r} on {topo.name}: {err}") from None
    config = dataclasses.replace(config, model_options=check_model_options(config.model, dict(config.model_options)))
    if models.is_sequence_model(config.model) != data.is_text_dataset(config.dataset):
        raise ValueError(
            f"model={config.model!r} with dataset={config.dataset!r}: next-token models "
            f"({', '.join(models.SEQUENCE_MODELS)}) train on text data sets ({', '.join(data.TEXT_DATASETS)}, "
            "text:PATH), the other models on the image and array data sets"
        )
    time = time_model_of(config, topo, network, available)
    if byzantine_args(config) is not None:  # the wrapper replaces the algorithm (check_byzantine builds it)
        alg = check_byzantine(config, topo, alg)
    check_execution_options(config, topo, network)
    if config.execution == "async":
        return Checked(config, topo, None, async_form_of(config), merge, network, time)
    alg = precision.with_message_dtype(alg, config.message_dtype)
    return Checked(config, topo, alg, None, merge, network, time)


def check_train_config(config: TrainConfig) -> TrainConfig:
    """Checks every field of ``config`` and their combinations without loading data: builds the
    graph, the algorithm on it, the final merge, the clock and the attackers (all cheap), so
    unknown names, bad options, graphs that do not exist at ``num_nodes`` and algorithms that do
    not fit the graph fail here. What needs the data (the model at its number of classes, the
    partition) is checked by :func:`resolve`.

    Returns:
      the config with normalized values (``decay_rounds`` a tuple, ``final_merge`` "3" -> 3,
      scalar model options for sequence attributes as 1-tuples).

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    return check_run(config).config


def resolve(
    config: TrainConfig | Checked, dataset: data.Dataset | None = None, platform: str | None = None
) -> Resolved:
    """Checks ``config`` and builds its run (see :class:`Resolved`) for ``platform`` (one of
    :data:`jaxgossip.ops.platforms.PLATFORMS`; None: the backend JAX runs on): everything of
    :func:`check_run` (or its result, given), then the data (``dataset``, or loaded from the
    config), its partition and shards, the model and the optimizer.

    Raises:
      ValueError: naming the field and the rule.
    """
    objects = config if isinstance(config, Checked) else check_run(config)
    config = objects.config
    choices = platforms.resolve(config.model, config.node_batch, platform)
    if dataset is None:
        dataset = load_data(config)
    if config.num_nodes > dataset.y_train.shape[0]:
        raise ValueError(
            f"num_nodes={config.num_nodes} exceeds the {dataset.y_train.shape[0]} training samples of {dataset.name}"
        )
    parts = data.partition(
        data.partition_labels(dataset)[0], config.num_nodes, config.partition, seed=config.resolved_data_seed
    )
    shards = data.shard_dataset(dataset, parts)
    mesh = None
    if jax.process_count() > 1 and config.devices != jax.device_count():
        # Each process holds only its own nodes; a mesh that leaves a process out would make it
        # compute nothing while still being asked to write its share of the checkpoint.
        raise ValueError(
            f"devices={config.devices}: a run over {jax.process_count()} processes must spread the node axis "
            f"over all their devices, devices={jax.device_count()}"
        )
    if config.devices != 1:
        mesh = sharding.node_mesh(config.num_nodes, config.devices)
        shards = sharding.shard_nodes(shards, mesh, config.num_nodes)
    options = dict(config.model_options)
    if choices.conv_impl is not None and options.get("conv_impl", "auto") == "auto":
        # The fastest convolution depends on the platform and the node batching.
        options["conv_impl"] = choices.conv_impl
    try:
        model = models.make_model(config.model, num_classes=dataset.num_classes, **options)
    except (ValueError, TypeError) as err:
        raise ValueError(f"model={config.model!r} with model_options={dict(config.model_options)}: {err}") from None
    return Resolved(
        config,
        objects.topology,
        objects.algorithm,
        objects.async_form,
        objects.merge,
        objects.network,
        objects.time,
        make_optimizer(config),
        dataset,
        parts,
        shards,
        mesh,
        model,
        choices,
    )


def load_data(config: TrainConfig) -> data.Dataset:
    """The data set of a training config (``dataset``, ``data_dir``, ``raw_dir``, ``download``; a
    text data set in examples of the sequence model's ``context``, 64 for other models)."""
    context = 64
    if models.is_sequence_model(config.model):
        context = dict(config.model_options).get("context", models.attributes(config.model)["context"])
    return data.load_dataset(
        config.dataset, config.data_dir, raw_dir=config.raw_dir, download=config.download, context=context
    )


def make_algorithm(config: TrainConfig, topo: topology.Topology):
    """The synchronous algorithm of ``config`` on ``topo``: the user's options over the algorithm's
    trainer defaults (its metadata's ``trainer_options``), with ``--byzantine.*`` the Byzantine
    wrapper (the trainer's metrics skip the attackers). A sweep point's options may be traced."""
    options = with_trainer_options(config.algorithm, config.algorithm_options)
    attack = byzantine_args(config)
    if attack is not None:
        return algorithms.byzantine(config.algorithm, topo, options=options, **attack)
    return algorithms.make(config.algorithm, topo, **options)


def _is_norm_key(entry: Any) -> bool:
    name = str(getattr(entry, "key", getattr(entry, "name", ""))).lower()
    return name.startswith(("bn", "norm", "batchnorm", "groupnorm", "layernorm"))


def make_schedule(config: TrainConfig) -> optax.Schedule:
    """The learning rate as a function of the optimizer's step count: linear warm-up from
    ``warmup_from`` over ``warmup_rounds``, then (``lr_schedule="step"``) ``lr`` multiplied by
    ``decay_factor`` at each of ``decay_rounds``, or (``"cosine"``) the cosine decay
    ``final_lr + (lr - final_lr) (1 + cos(pi r / R')) / 2`` at round r after the warm-up, over the
    R' = ``num_rounds - warmup_rounds`` remaining rounds (Loshchilov & Hutter, SGDR, ICLR 2017,
    arXiv:1608.03983). All are counted in communication rounds: with ``local_steps = H > 1`` the
    schedule is evaluated at ``count // H`` (the H local steps of a round share its rate); with
    H = 1 it is the plain per-step schedule."""
    if is_concrete(config.lr) and (config.lr <= 0 or not math.isfinite(config.lr)):
        raise ValueError(f"lr={config.lr} must be a positive number")
    if config.lr_schedule == "cosine":
        # optax's cosine runs from lr to alpha * lr over decay_steps, then stays there.
        decay = max(int(config.num_rounds) - int(config.warmup_rounds), 1)
        schedule = optax.cosine_decay_schedule(config.lr, decay, alpha=config.final_lr / config.lr)
    else:
        boundaries = {int(b) - config.warmup_rounds: config.decay_factor for b in config.decay_rounds}
        if any(b <= 0 for b in boundaries):
            raise ValueError(f"decay_rounds={config.decay_rounds} must come after warmup_rounds={config.warmup_rounds}")
        schedule = optax.piecewise_constant_schedule(config.lr, boundaries)
    if config.warmup_rounds > 0:
        warm = optax.linear_schedule(config.warmup_from, config.lr, config.warmup_rounds)
        schedule = optax.join_schedules([warm, schedule], [config.warmup_rounds])
    local_steps = int(config.local_steps)
    if local_steps > 1:
        per_step = schedule

        def schedule(count):
            return per_step(count // local_steps)

    return schedule


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """The local optimizer of one node (the trainer vmaps it), an ``optax.chain`` of

    * ``clip_by_global_norm(grad_clip)`` if ``grad_clip`` is set (each node's own gradient norm);
    * ``optimizer="sgd"`` (default): ``add_decayed_weights(weight_decay, mask)`` (weight decay added
      to the gradient, as PyTorch's SGD does; omitted when 0), then
      ``sgd(schedule, momentum or None, nesterov and momentum > 0)`` — the paper recipes of
      docs/training.md, section training recipes and models;
    * ``optimizer="adam"``: ``add_decayed_weights(weight_decay, mask)`` (L2, PyTorch's Adam), then
      ``adam(schedule, b1, b2, eps)``;
    * ``optimizer="adamw"``: ``adamw(schedule, b1, b2, eps, weight_decay, mask)`` (decoupled decay,
      scaled by the learning rate as in PyTorch's AdamW).

    ``schedule`` is :func:`make_schedule` (warm-up and step decay, counted in rounds); ``mask`` is
    ``weight_decay_mask``; ``b1``, ``b2``, ``eps`` come from ``optimizer_options`` (defaults
    0.9, 0.999, 1e-8). ``momentum`` and ``nesterov`` apply to sgd only.
    """
    schedule = make_schedule(config)
    masks = {
        "all": None,
        "no_1d": lambda params: jax.tree_util.tree_map(lambda p: p.ndim > 1, params),
        # The BN exclusion of the PowerGossip recipe (docs/training.md, section training recipes and
        # models): no decay on the scale and bias of normalization layers (named bn*/norm* in jaxgossip.models).
        "no_norm": lambda params: jax.tree_util.tree_map_with_path(
            lambda path, p: not any(_is_norm_key(k) for k in path), params
        ),
    }
    if config.weight_decay_mask not in masks:
        raise ValueError(f"weight_decay_mask={config.weight_decay_mask!r} must be one of {sorted(masks)}")
    mask = masks[config.weight_decay_mask]
    options = check_optimizer_options(config.optimizer, dict(config.optimizer_options))
    parts = []
    if config.grad_clip is not None:
        if is_concrete(config.grad_clip) and not config.grad_clip > 0:
            raise ValueError(f"grad_clip={config.grad_clip} must be a positive number or None")
        parts.append(optax.clip_by_global_norm(config.grad_clip))
    decay = not is_concrete(config.weight_decay) or bool(config.weight_decay)
    if config.optimizer == "adamw":
        parts.append(optax.adamw(schedule, weight_decay=config.weight_decay, mask=mask, **options))
        return optax.chain(*parts)
    if decay:
        parts.append(optax.add_decayed_weights(config.weight_decay, mask))
    if config.optimizer == "adam":
        parts.append(optax.adam(schedule, **options))
    else:
        parts.append(
            optax.sgd(schedule, momentum=config.momentum or None, nesterov=config.nesterov and bool(config.momentum))
        )
    return optax.chain(*parts)
