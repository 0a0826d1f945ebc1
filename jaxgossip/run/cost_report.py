"""The cost of configured runs, as the CLI reports it (built on :mod:`jaxgossip.sim.cost`).

:mod:`jaxgossip.sim.cost` prices bits, FLOPs and memory under the run's
:class:`jaxgossip.sim.network.Network`; this module holds what a report prices with (the network of
the ``--time.*`` options and the ``--energy.*`` prices: :data:`COST_OPTIONS`, :class:`CostModel`)
and applies it to whole runs: the cost fields of every evaluation point of a training run
(:func:`training_cost`, from the clock the run recorded; only a final merge, which runs after the
compiled training, is priced here) and of one graph of a consensus sweep
(:func:`consensus_graph_cost`). Host-side NumPy, not jittable; no file I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxgossip.run.config import TIME_HELP
from jaxgossip.sim.cost import EnergyModel, memory_per_node, per_round_bits, simulate, wire_bits
from jaxgossip.sim.cost import flops_per_step as _flops_per_step
from jaxgossip.sim.network import Network

__all__ = [
    "COST_OPTIONS",
    "LINK_OPTIONS",
    "ENERGY_OPTIONS",
    "cost_model_of_training",
    "CostModel",
    "cost_model_from_options",
    "simulate_bits",
    "exchanges_per_round",
    "priced_as_allreduce",
    "step_flops_and_memory",
    "training_cost",
    "consensus_graph_cost",
]

# --option: (metavar, help); the defaults are those of jaxgossip.sim.network.Network.
# The commands that train take the time options as TrainConfig.time (--time.*, jaxgossip.run.config)
# and only the energy options here; the consensus commands take both from here.
LINK_OPTIONS = {
    option: (metavar, TIME_HELP[option])
    for option, metavar in (
        ("time.bandwidth", "BIT/S"),
        ("time.latency", "S"),
        ("time.downlink", "BIT/S"),
        ("time.mode", "serial|parallel"),
        ("time.allreduce_model", "ring|message"),
    )
}
ENERGY_OPTIONS = {
    "energy.flop": ("J", "joules per FLOP computed; with --energy.bit adds energy per node (default 0)"),
    "energy.bit": ("J", "joules per bit sent (default 0)"),
}
COST_OPTIONS = {**LINK_OPTIONS, **ENERGY_OPTIONS}

def _check_price(option: str, value: float | None, text: Any = None) -> None:
    """Raises ValueError naming ``--option`` (as the user wrote it: ``text``) unless a finite number >= 0."""
    if value is not None and (not math.isfinite(value) or value < 0):
        raise ValueError(f"--{option}={value if text is None else text} must be a finite number >= 0 (J)")


@dataclasses.dataclass(frozen=True, eq=False)
class CostModel:
    """What a report prices with: the run's :class:`~jaxgossip.sim.network.Network` (the one model
    of links and compute that the run's clock used), the energy prices (J per FLOP, J per bit;
    None: not reported), validated on construction, and the run's seed (per-node link specs).

    Raises:
      TypeError: ``network`` is not a :class:`~jaxgossip.sim.network.Network`.
      ValueError: naming the option (``--energy.flop``, ...): not finite or negative.
    """

    network: Network = dataclasses.field(default_factory=Network)
    joules_per_flop: float | None = None
    joules_per_bit: float | None = None
    seed: int | None = None  # the run's seed: per-node link specs are drawn from it

    def __post_init__(self):
        if not isinstance(self.network, Network):
            raise TypeError(f"network must be a jaxgossip.sim.network.Network; got {self.network!r}")
        _check_price("energy.flop", self.joules_per_flop)
        _check_price("energy.bit", self.joules_per_bit)

    @property
    def energy(self) -> bool:
        """Whether energy is reported (either energy option was given)."""
        return self.joules_per_flop is not None or self.joules_per_bit is not None

    def to_dict(self) -> dict:
        """The network's ``--time.*`` values and the energy prices, by name."""
        prices = {"joules_per_flop": self.joules_per_flop, "joules_per_bit": self.joules_per_bit}
        return {**self.network.options(), **prices}


def _energy_prices(values: Mapping[str, Any]) -> dict:
    """``joules_per_flop`` / ``joules_per_bit`` from the ``--energy.*`` option values (None: not given)."""

    def number(option: str) -> float | None:
        text = values.get(option)
        if text is None:
            return None
        try:
            value = float(text)
        except (TypeError, ValueError):
            raise ValueError(f"--{option}={text!r} is not a number") from None
        _check_price(option, value, text)
        return value

    return {"joules_per_flop": number("energy.flop"), "joules_per_bit": number("energy.bit")}


def cost_model_from_options(values: Mapping[str, Any], seed: int | None = None) -> CostModel:
    """A :class:`CostModel` from option values keyed by option name (``"time.bandwidth"``, ...).

    Args:
      values: option name (a key of :data:`COST_OPTIONS`) -> value as given (str, number) or None
        (not given: the default). Keys that are not cost options are ignored.
      seed: the run's seed (per-node link specs are drawn from it).

    Raises:
      ValueError: naming the option: not a number, not finite, out of range, unknown mode.
    """
    links = {option.split(".", 1)[1]: values.get(option) for option in LINK_OPTIONS}
    return CostModel(Network.from_options(links), **_energy_prices(values), seed=seed)


def cost_model_of_training(run, values: Mapping[str, Any], seed: int | None = None) -> CostModel:
    """The cost model of a training run: its network (``run``, the run's
    :class:`~jaxgossip.sim.network.Network`, or its TrainConfig, whose ``--time.*`` options give
    it, and its seed), the energy prices from ``values``; ``seed``: the run's seed with a Network."""
    network = run if isinstance(run, Network) else Network.from_options(run.time)
    return CostModel(network, **_energy_prices(values), seed=seed if isinstance(run, Network) else run.seed)


def simulate_bits(model: CostModel, bits, topo, *, allreduce: bool, exchanges: int = 1, **kwargs):
    """:func:`jaxgossip.sim.cost.simulate` of ``bits`` [R, N] on ``model.network``, rounds of
    communication only (no local steps).

    The energy of the FLOPs needs no time, so the callers add it (``F * joules_per_flop`` per
    round) and only the bits are priced here. ``kwargs`` go to :func:`~jaxgossip.sim.cost.simulate`
    (``start_round``).
    """
    return simulate(
        bits,
        None if allreduce else topo,
        model.network,
        local_steps=0,
        allreduce=allreduce,
        exchanges=1 if allreduce else exchanges,
        energy=EnergyModel(0.0, model.joules_per_bit or 0.0),
        seed=model.seed,
        **kwargs,
    )


def exchanges_per_round(algorithm: str, options: Mapping[str, Any]) -> int:
    """Sequential exchanges per round of ``algorithm`` with ``options``, from its registry metadata
    (:class:`jaxgossip.types.CostFacts`; PowerGossip's ``num_iterations``)."""
    from jaxgossip import algorithms

    return algorithms.resolve(algorithm).cost.exchanges_per_round(options)


def priced_as_allreduce(algorithm: str) -> bool:
    """Whether the cost model prices a round of ``algorithm`` as an all-reduce (registry metadata)."""
    from jaxgossip import algorithms

    return algorithms.resolve(algorithm).cost.allreduce_cost


def step_flops_and_memory(resolved, need_flops: bool, algorithm=None) -> tuple[float, float]:
    """FLOPs of one node's local step (0 unless ``need_flops``) and bytes per node of a run.

    The step is the gradient of :func:`jaxgossip.engine.training.cross_entropy_loss` on one node's batch
    [B, ...], as in :func:`jaxgossip.engine.training.make_train` (optimizer update, augmentation and
    evaluation not counted). Memory is params, normalization statistics, optimizer and algorithm
    state, from shapes only.

    Args:
      resolved: the :class:`jaxgossip.run.resolve.Resolved` run (its model, data, optimizer and
        algorithm).
      need_flops: whether to count the FLOPs.
      algorithm: the algorithm whose state is counted (default the run's; an asynchronous run,
        which has none, counts that of its synchronous algorithm on the run's graph).

    Raises:
      RuntimeError: ``need_flops`` and the backend counts no FLOPs.
    """
    import jax

    from jaxgossip import models
    from jaxgossip.engine import training as train

    config, dataset = resolved.config, resolved.dataset
    if algorithm is None:
        algorithm = resolved.algorithm
    if algorithm is None:
        from jaxgossip.run.resolve import make_algorithm

        algorithm = make_algorithm(config, resolved.topology)
    fns = models.linen_model_fns(resolved.model)
    x, y = dataset.x_train[: config.batch_size], dataset.y_train[: config.batch_size]
    params, stats = jax.eval_shape(fns.init, jax.random.key(0), x[:1])
    n = config.num_nodes
    stacked = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct((n, *a.shape), a.dtype), (params, stats))
    opt_state = jax.eval_shape(jax.vmap(resolved.optimizer.init), stacked[0])
    comm_state = jax.eval_shape(algorithm.init, stacked[0])
    memory = memory_per_node(stacked, opt_state, comm_state, num_nodes=n)
    if not need_flops:
        return 0.0, memory
    loss_fn = train.cross_entropy_loss(fns)

    def loss(p, batch):
        return loss_fn(p, *batch)[0]

    return _flops_per_step(loss, params, (stats, x, y)), memory


def training_cost(
    model: CostModel,
    config,
    topo,
    rounds,
    cumulative_bits,
    sim_time,
    comm_time,
    *,
    flops: float,
    memory: float,
    merge_bits=None,
) -> list[dict]:
    """Cost fields of every evaluation point of a training run (and of its final merge).

    The times are the ones the run recorded (``Metrics.sim_time`` / ``comm_time``, advanced every
    round by :mod:`jaxgossip.sim.timing`); only the final merge, which runs after the compiled
    training, is priced here, by the same time model (:func:`jaxgossip.sim.cost.simulate`).

    Args:
      model: the cost model (links as the run's, energy prices).
      config: the run's ``TrainConfig`` (algorithm, options, final_merge).
      topo: the run's topology.
      rounds: [M] ``Metrics.round``; cumulative_bits: [M, N] ``Metrics.bits``.
      sim_time, comm_time: [M] the recorded ``Metrics.sim_time`` and ``Metrics.comm_time``.
      flops: FLOPs of one local step (0: not measured); a round computes ``config.local_steps`` of
        them. memory: bytes per node.
      merge_bits: [N] bits each node sent in the final merge, or None.

    Returns:
      M dicts (M + 1 with ``merge_bits``), cumulative up to each point: ``comm_s`` and
      ``comm_s_per_round`` (its mean over the rounds so far), ``sim_s`` (simulated seconds),
      ``mem_MB_per_node``, with energy options ``energy_J_per_node`` (mean over nodes), and
      ``gflop_per_step`` when measured. The merge adds its rounds (communication only) to
      ``comm_s``, ``sim_s`` and the energy.
    """
    rounds = np.asarray(rounds).astype(np.int64)
    sim_time = np.asarray(sim_time, np.float64).reshape(-1)
    comm_time = np.asarray(comm_time, np.float64).reshape(-1)
    if sim_time.shape != rounds.shape or comm_time.shape != rounds.shape:
        raise ValueError(
            f"sim_time and comm_time must be [M] = {rounds.shape}; got {sim_time.shape}, {comm_time.shape}"
        )
    allreduce = priced_as_allreduce(config.algorithm)
    round_flops = flops * int(getattr(config, "local_steps", 1))
    joules = None
    if model.energy:  # energy needs no clock: the bits on the wire and the FLOPs, up to each point
        wire = wire_bits(cumulative_bits, model.network.allreduce_model if allreduce else None)
        flop_joules = round_flops * (model.joules_per_flop or 0.0)  # per node and round
        joules = wire.mean(axis=1) * (model.joules_per_bit or 0.0) + flop_joules * rounds
    out = []
    for i, r in enumerate(rounds):
        row = {"comm_s_per_round": float(comm_time[i] / r), "comm_s": float(comm_time[i]), "sim_s": float(sim_time[i])}
        row["mem_MB_per_node"] = memory / 1e6
        if flops:
            row["gflop_per_step"] = flops / 1e9
        if joules is not None:
            row["energy_J_per_node"] = float(joules[i])
        out.append(row)
    if merge_bits is not None:
        merge = config.final_merge
        merge = int(merge) if isinstance(merge, str) and merge.isdigit() else merge
        merge_bits = np.asarray(merge_bits, dtype=np.float64)
        start = int(rounds[-1])
        if merge == "exact":
            extra = simulate_bits(model, merge_bits[None], topo, allreduce=True)
        else:
            # The merge's rounds continue the graph sequence of training (rounds R .. R + merge - 1).
            spread = per_round_bits(np.stack([np.zeros_like(merge_bits), merge_bits]), [start, start + merge], topo)
            extra = simulate_bits(model, spread[start:], topo, allreduce=False, start_round=start)
        row = dict(out[-1])
        row["comm_s"] += float(extra.comm_time.sum())
        row["sim_s"] += extra.total_time
        if model.energy:
            row["energy_J_per_node"] += float(extra.energy.sum(axis=0).mean())
        out.append(row)
    return out


def consensus_graph_cost(model: CostModel, algorithm: str, options: dict, topo, node_bits, error, tol) -> dict:
    """Cost fields of one graph of a consensus sweep: means over seeds of the simulated
    communication time per round, in all, and until the relative error first drops below ``tol``.

    Args:
      node_bits: [S, R, N] bits each node sent in each round; error: [S, R + 1] consensus error.
    """
    reports = [
        simulate_bits(
            model,
            bits,
            topo,
            allreduce=priced_as_allreduce(algorithm),
            exchanges=exchanges_per_round(algorithm, options),
        )
        for bits in node_bits
    ]
    comm = np.cumsum([r.comm_time for r in reports], axis=1)  # [S, R]
    reached = error[:, 1:] / error[:, :1] <= tol  # the rounds_to_tol rule of sweeps.topology_rows
    to_tol = [comm[s, reached[s].argmax()] if reached[s].any() else np.nan for s in range(comm.shape[0])]
    row = {
        "comm_s_per_round": float(comm[:, -1].mean() / comm.shape[1]),
        "comm_s": float(comm[:, -1].mean()),
        "comm_s_to_tol": float(np.mean(to_tol)),
    }
    if model.energy:
        row["energy_J_per_node"] = float(np.mean([r.total_energy.mean() for r in reports]))
    return row
