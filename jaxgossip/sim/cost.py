"""Cost model: simulated wall-clock, compute, memory and energy of a decentralized run.

Bits alone do not say how long a round takes: a ring pays two latencies per round, a dense graph
many, and a compressed message still pays the full latency. This module turns the bits each node
sent in each round (``StepInfo.bits`` stacked over rounds, or the cumulative ``Metrics.bits`` of a
training run via :func:`per_round_bits`) into simulated time on a network of links, and adds
per-node compute (FLOPs), memory and energy, the quantities Sparse-Push reports for edge devices.

The model: the round times are those of :mod:`jaxgossip.sim.timing` under a
:class:`jaxgossip.sim.network.Network`, the one model of links, exchanges, all-reduce and compute
that the compiled runs also advance every round; :func:`simulate` prices recorded bits with it on
the host, in float64, with the network's compute or a constant compute time per node
``p_i = F / s_i`` (``F`` the FLOPs of one local step, :func:`flops_per_step`, ``s_i`` the node's
FLOP/s). What this module adds:

* Bits from an interval: :func:`per_round_bits` spreads cumulative bits (``Metrics.bits``) over the
  rounds between evaluation points.
* Bits on the wire (:func:`wire_bits`): gossip puts ``bits`` on the wire; the ring all-reduce
  ``2 (N - 1) B / N``.
* Energy per node and round: ``e_{r,i} = F j^flop_i + (bits on the wire)_{r,i} j^bit_i``.
* Memory per node from shapes (:func:`memory_per_node`) and FLOPs from XLA's cost analysis.

References:
  Aketi, Singh, Roy, "Sparse-Push: Communication- & Energy-Efficient Decentralized Distributed
  Learning over Directed & Time-Varying Graphs with non-IID Datasets", 2021 (arXiv:2102.05715).
  Patarasuk, Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 2009
  (the ring all-reduce).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxgossip.sim import timing
from jaxgossip.sim.compute import Compute
from jaxgossip.sim.network import Network
from jaxgossip.topology import Topology

__all__ = [
    "EnergyModel",
    "CostReport",
    "simulate",
    "wire_bits",
    "per_round_bits",
    "flops_per_step",
    "memory_per_node",
]


def _array(name: str, value: Any, minimum: float, strict: bool) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim > 2:
        raise ValueError(f"{name} must be a scalar, [N] or [T, E]; got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite; got {value!r}")
    below = arr <= minimum if strict else arr < minimum
    if np.any(below):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {minimum}; got min {arr.min()}")
    return arr


@dataclasses.dataclass(frozen=True, eq=False)
class EnergyModel:
    """Energy prices, scalars or per node [N]: joules per FLOP computed and per bit sent (>= 0)."""

    joules_per_flop: Any
    joules_per_bit: Any

    def __post_init__(self):
        object.__setattr__(self, "joules_per_flop", _array("joules_per_flop", self.joules_per_flop, 0.0, False))
        object.__setattr__(self, "joules_per_bit", _array("joules_per_bit", self.joules_per_bit, 0.0, False))


class CostReport(NamedTuple):
    """What :func:`simulate` returns (seconds, bits, joules, bytes)."""

    comm_time: np.ndarray  # [R] s, communication time of the slowest node in each round
    compute_time: np.ndarray  # [N] s, each node's compute time per round
    round_time: np.ndarray  # [R] s, wall-clock of each synchronous round
    total_time: float  # s, sum of round_time
    bits: np.ndarray  # [R, N] bits each node put on the wire (ring all-reduce: 2 (N-1) / N of B)
    energy: np.ndarray  # [R, N] J each node spent per round (zeros without an EnergyModel)
    memory: float | None  # bytes per node, as given to simulate (see memory_per_node)

    @property
    def total_energy(self) -> np.ndarray:
        """[N] J each node spent over all R rounds."""
        return self.energy.sum(axis=0)


def _per_node(name: str, arr: np.ndarray, num_nodes: int) -> np.ndarray:
    """A scalar or [N] array as [N]."""
    if arr.ndim == 0:
        return np.full(num_nodes, float(arr))
    if arr.shape != (num_nodes,):
        raise ValueError(f"{name} per node must have shape [N] = ({num_nodes},); got {arr.shape}")
    return arr


def _check_senders(bits: np.ndarray, topology: Topology, start_round: int) -> None:
    """Refuses bits sent by a node that has no out-neighbours in that round (a fixed graph)."""
    graph = (start_round + np.arange(bits.shape[0])) % topology.period  # [R] graph index of each round
    bad = (bits > 0) & (topology.out_degree[graph] == 0)
    if np.any(bad):
        r, i = np.argwhere(bad)[0]
        raise ValueError(
            f"bits[{r}, {i}] > 0 but node {i} has no out-neighbours in round {start_round + r} of "
            f"{topology.name}; for an all-reduce pass allreduce='ring' or 'message'"
        )


def simulate(
    bits: Any,
    topology: Topology | None,
    network: Network | None = None,
    *,
    allreduce: bool = False,
    exchanges: int = 1,
    flops_per_step: float = 0.0,
    device_flops: Any = None,
    overlap: bool = False,
    local_steps: int = 1,
    energy: EnergyModel | None = None,
    memory_bytes: float | None = None,
    start_round: int = 0,
    seed: int | None = None,
) -> CostReport:
    """Simulated wall-clock and energy of R synchronous rounds (model in the module docstring).

    Args:
      bits: [R, N] bits each node sent in each round (``StepInfo.bits`` stacked over rounds, or
        :func:`per_round_bits` of ``Metrics.bits``); row r is round ``start_round + r`` and uses
        graph ``(start_round + r) mod T``.
      topology: the graph the bits were sent on; ``None`` (or ignored) with ``allreduce``.
      network: the :class:`~jaxgossip.sim.network.Network` (links, mode, all-reduce model,
        compute); default ``Network()``. A ``trace:PATH`` of ``[R, N]`` links cycles with the
        rounds (row ``(start_round + r) mod R``).
      allreduce: whether the rounds are all-reduces (priced by ``network.allreduce_model``; links
        must then be scalar or per node) rather than gossip over ``topology``.
      exchanges: I >= 1, sequential exchanges per round (PowerGossip's ``num_iterations``).
      flops_per_step: F >= 0, FLOPs of one node's local step (:func:`flops_per_step`); with F > 0
        a step takes ``F / device_flops`` seconds instead of the network's compute.
      device_flops: > 0, FLOP/s, scalar or [N]; required when ``flops_per_step > 0``.
      overlap: whether compute and communication of a round overlap.
      local_steps: H >= 0, local steps per round (0: rounds of communication only, such as a final
        merge's or a consensus run's).
      energy: an :class:`EnergyModel`, or None for zero energy.
      memory_bytes: bytes per node (:func:`memory_per_node`), copied into the report.
      start_round: int >= 0, the round the first row of ``bits`` is (e.g. ``num_rounds`` for the
        rounds of a final merge, which continue the graph sequence of training).
      seed: the run's seed, from which per-node link specs are drawn (``stragglers:F,S``,
        ``lognormal:MEDIAN,SIGMA``; :meth:`~jaxgossip.sim.network.Network.link_values`).

    Returns:
      A :class:`CostReport`.
    """
    network = Network() if network is None else network
    bits = np.asarray(bits, dtype=np.float64)
    if bits.ndim != 2 or bits.shape[0] < 1:
        raise ValueError(f"bits must have shape [R, N] with R >= 1; got {bits.shape}")
    if not np.all(np.isfinite(bits)) or np.any(bits < 0):
        raise ValueError("bits must be finite and >= 0")
    if isinstance(exchanges, bool) or not isinstance(exchanges, (int, np.integer)) or exchanges < 1:
        raise ValueError(f"exchanges must be an int >= 1; got {exchanges!r}")
    if isinstance(start_round, bool) or not isinstance(start_round, (int, np.integer)) or start_round < 0:
        raise ValueError(f"start_round must be an int >= 0; got {start_round!r}")
    if isinstance(local_steps, bool) or not isinstance(local_steps, (int, np.integer)) or local_steps < 0:
        raise ValueError(f"local_steps must be an int >= 0; got {local_steps!r}")
    num_nodes = bits.shape[1]
    if not allreduce:
        if topology is None:
            raise ValueError("topology is None; pass the Topology the bits were sent on, or allreduce=True")
        if topology.num_nodes != num_nodes:
            raise ValueError(
                f"bits has N = {num_nodes} columns but topology {topology.name} has {topology.num_nodes} nodes"
            )
        if not topology.stochastic:
            _check_senders(bits, topology, int(start_round))
    wire = wire_bits(bits, network.allreduce_model if allreduce else None)
    flops = float(flops_per_step)
    if not np.isfinite(flops) or flops < 0:
        raise ValueError(f"flops_per_step must be finite and >= 0; got {flops_per_step!r}")
    if device_flops is None:
        if flops > 0:
            raise ValueError("flops_per_step > 0 needs device_flops (FLOP/s, scalar or [N])")
        compute = network.compute_model
    else:
        seconds = flops / _per_node("device_flops", _array("device_flops", device_flops, 0.0, True), num_nodes)
        compute = Compute("constant", seconds)
    # The round times come from the one time model the compiled runs use (jaxgossip.sim.timing), in float64.
    with jax.enable_x64(True):
        links = network.links(
            None if allreduce else topology,
            exchanges=int(exchanges),
            allreduce=allreduce,
            num_nodes=num_nodes,
            seed=seed,
        )
        model = timing.TimeModel(compute, links, overlap=bool(overlap))
        rounds = start_round + np.arange(bits.shape[0])
        per_round = jax.vmap(lambda b, t: timing.round_seconds(model, jax.random.key(0), b, t, int(local_steps)))
        round_time, comm_time = (np.asarray(a, np.float64) for a in per_round(bits, rounds))
    joules = np.zeros_like(bits)
    if energy is not None:
        j_flop = _per_node("joules_per_flop", energy.joules_per_flop, num_nodes)
        j_bit = _per_node("joules_per_bit", energy.joules_per_bit, num_nodes)
        joules = flops * j_flop + wire * j_bit
    return CostReport(
        comm_time=comm_time,
        compute_time=np.asarray(compute.seconds, np.float64) * np.ones(num_nodes),
        round_time=round_time,
        total_time=float(round_time.sum()),
        bits=wire,
        energy=joules,
        memory=memory_bytes,
    )


def wire_bits(bits: Any, allreduce: str | None = None) -> np.ndarray:
    """The bits each node puts on the wire, [R, N], for the bits it sent, [R, N]: the same for
    gossip (``allreduce=None``) and a one-message all-reduce (``"message"``), ``2 (N - 1) / N`` of
    them for the bandwidth-optimal ring all-reduce (``"ring"``)."""
    bits = np.asarray(bits, dtype=np.float64)
    n = bits.shape[-1]
    return bits * (2 * (n - 1) / n if allreduce == "ring" else 1.0)


def per_round_bits(cumulative_bits: Any, rounds: Any, topology: Topology | None = None) -> np.ndarray:
    """Per-round bits [R, N] from cumulative bits at evaluation points (``Metrics.bits``).

    Without ``topology`` the bits a node sent between two evaluation points are spread evenly over
    the rounds between them: exact when every round of an interval sent the same bits (static
    graphs, fixed compression). With ``topology`` they are spread in proportion to the node's
    out-degree in each round (round r, 0-based, uses graph ``r mod T``), matching how every
    algorithm here sends one message per out-neighbour: exact on time-varying graphs whenever a
    node's message size is constant within an interval, and a node never gets bits in a round in
    which it has no out-neighbour. Either way it is an approximation for messages whose size
    changes inside an interval (SCSP's adaptive k, PowerGossip's skipped first round); use
    ``eval_every=1`` or stack ``StepInfo.bits`` to be exact.

    Args:
      cumulative_bits: [M, N] cumulative bits of each node at M evaluation points.
      rounds: [M] increasing round counts of those points (``Metrics.round``); R = rounds[-1].
      topology: optional, the graph the bits were sent on (N nodes).
    """
    cumulative = np.asarray(cumulative_bits, dtype=np.float64)
    rounds = np.asarray(rounds).astype(np.int64)
    if cumulative.ndim != 2 or rounds.shape != cumulative.shape[:1] or rounds.size == 0:
        raise ValueError(f"cumulative_bits must be [M, N] and rounds [M]; got {cumulative.shape}, {rounds.shape}")
    gaps = np.diff(rounds, prepend=0)
    if np.any(gaps < 0) or rounds[-1] < 1:
        raise ValueError(f"rounds must be non-decreasing, >= 0 and end >= 1; got {rounds}")
    sent = np.diff(cumulative, axis=0, prepend=0.0)
    if np.any(sent[gaps == 0] != 0):
        raise ValueError("cumulative_bits changes between two evaluation points with the same round")
    if topology is None or topology.stochastic:  # a stochastic graph's degrees are not known here
        return np.repeat(sent / np.maximum(gaps, 1)[:, None], gaps, axis=0)
    if topology.num_nodes != cumulative.shape[1]:
        raise ValueError(
            f"cumulative_bits has N = {cumulative.shape[1]} columns but topology {topology.name} has "
            f"{topology.num_nodes} nodes"
        )
    degree = topology.out_degree[np.arange(rounds[-1]) % topology.period].astype(np.float64)  # [R, N]
    interval = np.repeat(np.arange(rounds.size), gaps)  # [R] evaluation interval of each round
    per_interval = np.zeros_like(cumulative)
    np.add.at(per_interval, interval, degree)  # [M, N] out-degree summed over each interval
    bad = (sent != 0) & (per_interval == 0)
    if np.any(bad):
        m, i = np.argwhere(bad)[0]
        raise ValueError(
            f"node {i} sent bits up to round {rounds[m]} but has no out-neighbour in any of those rounds of "
            f"{topology.name}; pass topology=None for an all-reduce"
        )
    return degree * (sent / np.where(per_interval > 0, per_interval, 1.0))[interval]


def _flops_from_analysis(analysis: Any) -> float:
    """The "flops" entry of ``Compiled.cost_analysis()`` (a dict, a list of dicts, or None)."""
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else None
    flops = analysis.get("flops") if isinstance(analysis, dict) else None
    if flops is None or not np.isfinite(flops) or flops < 0:
        raise RuntimeError(
            f"this backend ({jax.default_backend()}) gave no FLOP count in cost_analysis(); "
            "pass flops_per_step to simulate by hand (about 6 x batch x parameters for a dense net)"
        )
    return float(flops)


def flops_per_step(loss_fn: Callable, params: Any, batch: Any, *, grad: bool = True) -> float:
    """FLOPs of one node's local step, as counted by XLA for the compiled program.

    Lowers and compiles ``jax.grad(loss_fn)(params, batch)`` (or ``loss_fn`` itself with
    ``grad=False``, e.g. a whole train step) and reads ``cost_analysis()["flops"]``. A multiply-add
    counts 2; a dense layer ``[B, in] @ [in, out]`` costs ``2 B in out`` forward and 1x (weight
    gradient only) to 2x (weight and input gradients) that again backward, so a step is 2x to 3x
    the forward matmul FLOPs. The optimizer update (``O(D)``) is not included.

    Args:
      loss_fn: ``loss_fn(params, batch) -> scalar`` for ONE node (no node axis).
      params: one node's parameters (arrays or ``jax.ShapeDtypeStruct``).
      batch: one node's batch [B, ...].
      grad: differentiate ``loss_fn`` w.r.t. ``params`` (True) or count ``loss_fn`` as is.

    Raises:
      RuntimeError: the backend reports no FLOP count (supply the number by hand).
    """
    fn = jax.grad(loss_fn) if grad else loss_fn
    return _flops_from_analysis(jax.jit(fn).lower(params, batch).compile().cost_analysis())


def _nbytes(leaf: Any) -> int:
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        leaf = jax.eval_shape(jax.random.key_data, leaf)
        dtype = leaf.dtype
    if dtype is None:  # Python scalars
        dtype = jax.numpy.result_type(leaf)
    return int(np.prod(np.shape(leaf), dtype=np.int64)) * np.dtype(dtype).itemsize


def memory_per_node(params: Any, opt_state: Any = None, comm_state: Any = None, num_nodes: int | None = None) -> float:
    """Bytes per node: the stacked params, optimizer state and algorithm state, divided by N.

    Every leaf counts ``size * itemsize`` (arrays or ``jax.ShapeDtypeStruct``, e.g. from
    ``jax.eval_shape``); the total is divided by N. Per-node leaves ``[N, ...]`` thus count their
    own slice, while shared leaves (round counters, PRNG keys) and per-pair state (PowerGossip's
    ``[P, m, R]`` bases, held by the two endpoints in a real deployment) are spread evenly over the
    nodes. Choco holds two extra model copies (``x_hat`` and ``s``); PowerGossip only ``O((m + n)
    R)`` per pair and leaf.

    Args:
      params: pytree with leaves [N, ...].
      opt_state, comm_state: pytrees (stacked optimizer state, ``GossipAlgorithm.init`` state).
      num_nodes: N; by default the leading axis of the first leaf of ``params``.
    """
    if num_nodes is None:
        leaves = jax.tree_util.tree_leaves(params)
        if not leaves or not np.shape(leaves[0]):
            raise ValueError("num_nodes is None and params has no leaf with a leading node axis")
        num_nodes = np.shape(leaves[0])[0]
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, (int, np.integer)) or num_nodes < 1:
        raise ValueError(f"num_nodes must be an int >= 1; got {num_nodes!r}")
    trees = (params, opt_state, comm_state)
    return sum(_nbytes(leaf) for leaf in jax.tree_util.tree_leaves(trees)) / num_nodes
