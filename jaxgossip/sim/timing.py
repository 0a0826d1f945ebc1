"""Simulated time inside the compiled run: compute per local step, links, and each round's clock.

One model with one implementation: the compiled runs (:mod:`jaxgossip.engine.consensus`,
:mod:`jaxgossip.engine.optimization`, :mod:`jaxgossip.engine.training`) advance a clock with it every round from
the bits the round actually sent, and :func:`jaxgossip.sim.cost.simulate` prices recorded bits with the
same functions (in float64 on the host).

* **Compute.** Local step k of node i takes ``p_{k,i}`` seconds (:class:`Compute`): a constant C;
  stragglers (``round(F N)`` nodes, drawn once from the run's key, take ``S C``); lognormal with
  median M and log-scale sigma, or exponential with mean mu, drawn per node and step from the run's
  key; or a trace ``[K, N]`` cycled over steps.
* **Links.** A message of B bits over a link of latency l (s) and bandwidth b (bit/s) takes
  ``l + B / b``. A link is a node's uplink (scalar or ``[N]``) or a directed edge of the graph
  (``[T, E]``, aligned with ``topology.senders``). Only the sending side is modelled: no downlink
  contention, no queueing, no loss.
* **A round's communication** (:func:`comm_seconds`). In round r (graph ``t = r mod T``) node i
  sends one message to each of its ``d_{t,i}`` out-neighbours (self excluded), all of the same
  size ``B_i = bits_i / d_{t,i}`` (true of every algorithm here), split over the I sequential
  exchanges of the round (PowerGossip's ``num_iterations``), each paying the latency again:
  ``serial`` (the messages share the uplink) ``c_i = I sum_e (l_e + B_i / (I b_e))``, ``parallel``
  (independent links) ``c_i = I max_e (l_e + B_i / (I b_e))``. A node that sent nothing pays
  nothing. A stochastic graph has no fixed edge list: a node sends ``d`` equal messages, ``d`` its
  mean out-degree, over its uplink. All-reduce: ``ring`` (bandwidth-optimal, ``2 (N - 1)`` steps of
  ``B / N`` bits) ``c_i = 2 (N - 1) (l_i + B_i / (N b_i))``; ``message``: ``c_i = l_i + B_i / b_i``.
* **A synchronous round** lasts until its slowest node is done (:func:`round_seconds`): with
  ``P_i = sum_h p_{rH+h, i}`` over the round's H local steps, ``atc`` (compute, then send)
  ``tau_r = max_i (P_i + c_i)`` and ``same_iterate`` (send ``x^k`` while computing at it)
  ``tau_r = max_i max(P_i, c_i)``. ``sim_time`` after R rounds is ``sum_{r < R} tau_r``,
  accumulated with a compensated (Kahan) float32 sum so that long runs keep their small rounds.

.. math::

   \\tau_r = \\max_i \\big(P_{r,i} + c_{r,i}\\big), \\qquad
   c_{r,i} = I \\sum_{e:\\,s(e)=i} \\Big(l_e + \\frac{\\mathrm{bits}_{r,i}}{I\\,d_{t,i}\\,b_e}\\Big)

Keys: the clock draws from ``fold_in(run key, TIME_STREAM)``, never from the run's key schedule,
so a timed run computes exactly the iterates of the same run untimed.

References:
  Lian, Zhang, Zhang, Liu, "Asynchronous Decentralized Parallel Stochastic Gradient Descent", ICML
  2018 (arXiv:1710.06952; stragglers and the cost of waiting).
  Patarasuk, Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 2009.
  Aketi, Singh, Roy, arXiv:2102.05715, 2021 (per-node time and energy of Sparse-Push).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.types import Array, PRNGKey

__all__ = [
    "COMPUTE_KINDS",
    "LINK_MODES",
    "AVAILABILITY_KINDS",
    "availability",
    "ALLREDUCE_MODELS",
    "TIME_STREAM",
    "Compute",
    "Links",
    "TimeModel",
    "Clock",
    "DEFAULT_BANDWIDTH",
    "DEFAULT_LATENCY",
    "time_model",
    "parse_compute",
    "make_links",
    "comm_seconds",
    "compute_seconds",
    "round_seconds",
    "init_clock",
    "with_ordering",
    "advance",
]

COMPUTE_KINDS = ("constant", "stragglers", "lognormal", "exponential", "trace")
LINK_MODES = ("serial", "parallel")
ALLREDUCE_MODELS = ("ring", "message")
# Folded into the run key for the clock's draws (an arbitrary constant, distinct from the graph
# sampler's stream).
TIME_STREAM = 0x7105


def _finite(name: str, value: Any, *, minimum: float | None = None, strict: bool = False, maximum=None) -> None:
    """Raises ValueError naming ``name`` when a concrete ``value`` breaks the rule (traced values pass).

    An array (a trace of thousands of entries) is described, not printed: how many entries break
    the rule and the first of them, its index and value.
    """
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return
    if arr.ndim == 0:
        if not np.isfinite(arr):
            raise ValueError(f"{name}={value!r} must be finite")
        if minimum is not None and (arr <= minimum if strict else arr < minimum):
            raise ValueError(f"{name}={value!r} must be {'>' if strict else '>='} {minimum}")
        if maximum is not None and arr > maximum:
            raise ValueError(f"{name}={value!r} must be <= {maximum}")
        return
    rule, bad = "finite", ~np.isfinite(arr)
    with np.errstate(invalid="ignore"):
        if minimum is not None:
            rule += f" and {'>' if strict else '>='} {minimum}"
            bad |= (arr <= minimum) if strict else (arr < minimum)
        if maximum is not None:
            rule += f" and <= {maximum}"
            bad |= arr > maximum
    if np.any(bad):
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{name} must be {rule}: {int(np.sum(bad))} of {arr.size} entries are not; the first is "
            f"[{', '.join(map(str, first))}] = {arr[first]:g}"
        )


@dataclasses.dataclass(frozen=True)
class Compute:
    """Seconds of one local step per node (a pytree: the numbers may be traced, ``kind`` is static).

    Attributes:
      kind: one of :data:`COMPUTE_KINDS`.
      seconds: C (constant, stragglers), the median M (lognormal) or the mean mu (exponential).
      fraction: F in [0, 1], the straggling share of the nodes (stragglers).
      slowdown: S >= 1, how many times slower a straggler is (stragglers).
      sigma: > 0, log-scale of the lognormal.
      trace: ``[K, N]`` seconds, row ``k mod K`` for local step k (trace).
    """

    kind: str = "constant"
    seconds: Any = 0.0
    fraction: Any = 0.0
    slowdown: Any = 1.0
    sigma: Any = 1.0
    trace: Any = None

    def __post_init__(self):
        if self.kind not in COMPUTE_KINDS:
            raise ValueError(f"compute kind {self.kind!r} is unknown; known: {', '.join(COMPUTE_KINDS)}")
        strict = self.kind in ("lognormal", "exponential")
        _finite("compute seconds", self.seconds, minimum=0.0, strict=strict)
        if self.kind == "stragglers":
            _finite("straggler fraction F", self.fraction, minimum=0.0, maximum=1.0)
            _finite("straggler slowdown S", self.slowdown, minimum=1.0)
        if self.kind == "lognormal":
            _finite("lognormal sigma", self.sigma, minimum=0.0, strict=True)
        if self.kind == "trace":
            if self.trace is None or np.ndim(self.trace) != 2:
                raise ValueError(f"a compute trace must be [steps, N] seconds; got shape {np.shape(self.trace)}")
            _finite("compute trace", self.trace, minimum=0.0)

    @property
    def is_zero(self) -> bool:
        """Whether every step is known to take no time (a constant 0), so the clock may skip it."""
        return self.kind == "constant" and isinstance(self.seconds, (int, float)) and self.seconds == 0


jax.tree_util.register_dataclass(
    Compute, data_fields=["seconds", "fraction", "slowdown", "sigma", "trace"], meta_fields=["kind"]
)


def _spec_numbers(spec: str, text: str, count: int, rule: str) -> list[float]:
    parts = text.split(",") if text else []
    if len(parts) != count:
        raise ValueError(f"--time.compute={spec!r}: expected {rule}")
    try:
        return [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"--time.compute={spec!r}: expected numbers, {rule}") from None


def parse_compute(spec: Any) -> Compute:
    """A :class:`Compute` from the ``--time.compute`` grammar (or a number, or a Compute).

    ``C`` | ``stragglers:C,F,S`` | ``lognormal:MEDIAN,SIGMA`` | ``exponential:MEAN`` | ``trace:PATH``
    (a ``.npy`` or ``.csv`` of shape ``[steps, N]``, seconds).

    Raises:
      ValueError: naming the spec and the rule it breaks.
    """
    if isinstance(spec, Compute):
        return spec
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return _checked(str(spec), "constant", float(spec))
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"--time.compute={spec!r} must be a number of seconds or KIND:ARGS")
    text = spec.strip()
    kind, _, args = text.partition(":")
    if not _:
        try:
            seconds = float(text)
        except ValueError:
            raise ValueError(
                f"--time.compute={spec!r} is not a number of seconds nor one of "
                "stragglers:C,F,S, lognormal:MEDIAN,SIGMA, exponential:MEAN, trace:PATH"
            ) from None
        return _checked(spec, "constant", seconds)
    if kind == "stragglers":
        c, f, s = _spec_numbers(spec, args, 3, "stragglers:C,F,S (C >= 0 s, F in [0, 1], S >= 1)")
        return _checked(spec, "stragglers", c, fraction=f, slowdown=s)
    if kind == "lognormal":
        median, sigma = _spec_numbers(spec, args, 2, "lognormal:MEDIAN,SIGMA (both > 0)")
        return _checked(spec, "lognormal", median, sigma=sigma)
    if kind == "exponential":
        (mean,) = _spec_numbers(spec, args, 1, "exponential:MEAN (> 0 s)")
        return _checked(spec, "exponential", mean)
    if kind == "trace":
        return _checked(spec, "trace", trace=_load_trace(f"--time.compute={spec!r}", args))
    raise ValueError(
        f"--time.compute={spec!r}: unknown kind {kind!r}; known: a number, stragglers:C,F,S, "
        "lognormal:MEDIAN,SIGMA, exponential:MEAN, trace:PATH"
    )


def _checked(spec: str, kind: str, seconds: Any = 0.0, **fields: Any) -> Compute:
    try:
        return Compute(kind, seconds, **fields)
    except ValueError as err:
        raise ValueError(f"--time.compute={spec!r}: {err}") from None


def _load_trace(prefix: str, path: str) -> np.ndarray:
    """A numeric ``[rows, N]`` array from a .npy or .csv file; errors start with ``prefix`` (the option)."""
    if not path or not os.path.isfile(path):
        raise ValueError(f"{prefix}: no trace file {path!r}")
    try:
        if path.endswith(".npy"):
            arr = np.load(path, allow_pickle=False)
        elif path.endswith(".csv"):
            arr = np.loadtxt(path, delimiter=",", ndmin=2)
        else:
            raise ValueError(f"{prefix}: a trace must be a .npy or .csv file")
    except (OSError, ValueError) as err:
        if prefix in str(err):
            raise
        raise ValueError(f"{prefix}: cannot read {path!r} as a [steps, N] array: {err}") from None
    if arr.ndim != 2 or arr.size == 0 or arr.dtype.kind not in "iuf":
        raise ValueError(f"{prefix}: a trace must be a numeric [steps, N] array; got {arr.shape}")
    return arr.astype(np.float32)


AVAILABILITY_KINDS = ("always", "markov", "trace")


def availability(spec: Any, num_rounds: int, num_nodes: int, seed: int) -> np.ndarray | None:
    """The ``[R, N]`` 0/1 online mask of a run from the ``--time.availability`` grammar, or None
    for ``always``.

    * ``always``: every node online in every round (None: nothing is masked);
    * ``markov:P_OFF,P_ON``: per node a two-state chain, all online before round 0; before every
      round an online node goes offline with probability P_OFF and an offline one comes back with
      probability P_ON (drawn on the host from ``seed``: the same seed gives the same mask);
    * ``trace:PATH``: a ``.npy`` / ``.csv`` of shape ``[rounds, N]`` of 0/1, cycled; at least one
      entry must be 1 (a node online at some round).

    Raises:
      ValueError: naming the spec and the rule it breaks.
    """
    name = f"--time.availability={spec!r}"
    if spec is None or spec == "always":
        return None
    if not isinstance(spec, str):
        raise ValueError(f"{name} must be always, markov:P_OFF,P_ON or trace:PATH")
    kind, _, args = spec.partition(":")
    if kind == "markov":
        parts = args.split(",")
        try:
            p_off, p_on = (float(v) for v in parts) if len(parts) == 2 else (None, None)
        except ValueError:
            p_off = p_on = None
        if p_off is None or not (0 <= p_off <= 1 and 0 < p_on <= 1):
            raise ValueError(f"{name}: expected markov:P_OFF,P_ON with P_OFF in [0, 1] and P_ON in (0, 1]")
        rng = np.random.default_rng(seed)
        online = np.ones(num_nodes, bool)
        out = np.empty((num_rounds, num_nodes), np.float32)
        for r in range(num_rounds):  # a loop over rounds (the chain), vectorized over nodes
            u = rng.random(num_nodes)
            online = np.where(online, u >= p_off, u < p_on)
            out[r] = online
        return out
    if kind == "trace":
        arr = _load_trace(name, args)
        if arr.shape[1] != num_nodes:
            raise ValueError(
                f"{name}: a trace of shape {arr.shape} does not fit N = {num_nodes}: it must be [rounds, {num_nodes}]"
            )
        if not np.all((arr == 0) | (arr == 1)):
            raise ValueError(f"{name}: a trace must hold 0 (offline) or 1 (online) only")
        if not arr.any():  # a file of zeros is a mistake; a markov draw may still leave everyone offline
            raise ValueError(f"{name}: no node is ever online (the trace holds only 0), so nothing would train")
        return arr.astype(np.float32)
    raise ValueError(f"{name}: unknown kind {kind!r}; known: always, markov:P_OFF,P_ON, trace:PATH")


@dataclasses.dataclass(frozen=True)
class Links:
    """A run's links, laid out for :func:`comm_seconds` (a pytree; built by :func:`make_links`).

    Attributes:
      latency, bandwidth: ``[T, E]`` per edge (``kind="graph"``) or ``[N]`` per node.
      senders: ``[T, E]`` int32 (graph) or None.
      real: ``[T, E]`` bool, a real edge: weight != 0 and not a self loop (graph) or None.
      degree: ``[T, N]`` out-degrees (graph), the mean out-degree (``"mean"``) or None.
      kind: static; ``"graph"`` (a fixed graph priced per edge), ``"mean"`` (a stochastic graph:
        ``degree`` equal messages over the uplink), ``"ring"`` or ``"message"`` (all-reduce).
      mode: static, ``"serial"`` or ``"parallel"``.
      exchanges: static, I.
      num_nodes: static, N.
    """

    latency: Any
    bandwidth: Any
    senders: Any
    real: Any
    degree: Any
    kind: str = "graph"
    mode: str = "serial"
    exchanges: int = 1
    num_nodes: int = 0


jax.tree_util.register_dataclass(
    Links,
    data_fields=["latency", "bandwidth", "senders", "real", "degree"],
    meta_fields=["kind", "mode", "exchanges", "num_nodes"],
)


def _as_node_array(name: str, value: Any, num_nodes: int):
    arr = jnp.asarray(value, jnp.result_type(float))
    if arr.ndim == 0:
        return jnp.broadcast_to(arr, (num_nodes,))
    if arr.shape != (num_nodes,):
        raise ValueError(f"{name} per node must have shape [N] = ({num_nodes},); got {arr.shape}")
    return arr


def make_links(
    topology: Any,
    latency: Any,
    bandwidth: Any,
    *,
    mode: str = "serial",
    exchanges: int = 1,
    allreduce: str | None = None,
    num_nodes: int | None = None,
    names: tuple[str, str] = ("latency", "bandwidth"),
) -> Links:
    """The :class:`Links` of a run on ``topology`` (or of an all-reduce).

    Args:
      topology: the run's graph (a fixed one is priced per edge; a stochastic one by its mean
        out-degree); ignored with ``allreduce`` (then give ``num_nodes``, or the topology for N).
      latency: >= 0 s per message; scalar, ``[N]`` or ``[T, E]`` (fixed graphs only).
      bandwidth: > 0 bit/s; same shapes.
      mode: ``"serial"`` or ``"parallel"`` (see the module docstring).
      exchanges: I >= 1 sequential exchanges per round.
      allreduce: None (gossip on the graph), ``"ring"`` or ``"message"``.
      num_nodes: N, when there is no topology.
      names: how error messages call ``latency`` and ``bandwidth``.

    Raises:
      ValueError: a value out of range, a wrong shape, an unknown mode or model.
    """
    lat_name, bw_name = names
    _finite(lat_name, latency, minimum=0.0)
    _finite(bw_name, bandwidth, minimum=0.0, strict=True)
    if mode not in LINK_MODES:
        raise ValueError(f"mode={mode!r} is unknown; known modes: {', '.join(LINK_MODES)}")
    if isinstance(exchanges, bool) or not isinstance(exchanges, (int, np.integer)) or exchanges < 1:
        raise ValueError(f"exchanges must be an int >= 1; got {exchanges!r}")
    n = num_nodes if topology is None else topology.num_nodes
    if n is None:
        raise ValueError("make_links needs a topology or num_nodes")
    if allreduce is not None:
        if allreduce not in ALLREDUCE_MODELS:
            raise ValueError(f"allreduce={allreduce!r} is unknown; known models: {', '.join(ALLREDUCE_MODELS)}")
        if np.ndim(latency) == 2 or np.ndim(bandwidth) == 2:
            raise ValueError("allreduce needs scalar or per-node [N] links, not per-edge [T, E] arrays")
        lat, bw = _as_node_array(lat_name, latency, n), _as_node_array(bw_name, bandwidth, n)
        return Links(lat, bw, None, None, None, allreduce, mode, 1, n)
    if topology.stochastic:
        if np.ndim(latency) == 2 or np.ndim(bandwidth) == 2:
            raise ValueError(
                f"per-edge links [T, E] need a fixed edge list; {topology.name} is drawn every round: "
                "give scalar or per-node [N] latency and bandwidth"
            )
        from jaxgossip.topology import mean_out_degree

        degree = mean_out_degree(topology)  # traced for a member of a stack of failure graphs
        degree = np.float64(max(degree, 1e-9)) if isinstance(degree, float) else jnp.maximum(degree, 1e-9)
        lat, bw = _as_node_array(lat_name, latency, n), _as_node_array(bw_name, bandwidth, n)
        return Links(lat, bw, None, None, degree, "mean", mode, int(exchanges), n)
    # Host tables stay NumPy (constants of the compiled run); traced ones (a member of a stack of
    # graphs inside a topology sweep) stay traced.
    xp = np if topology.host_tables else jnp
    senders = xp.asarray(topology.senders, xp.int32)
    real = (xp.asarray(topology.weights) != 0) & (senders != xp.asarray(topology.receivers))

    def per_edge(name, value):
        if np.ndim(value) == 2:
            if np.shape(value) != np.shape(senders):
                raise ValueError(
                    f"{name} per edge must have shape [T, E] = {np.shape(senders)}; got {np.shape(value)}"
                )
            return jnp.asarray(value, jnp.result_type(float))
        return _as_node_array(name, value, n)[senders]

    degree = xp.asarray(topology.out_degree, np.float64 if xp is np else jnp.result_type(float))
    return Links(
        per_edge(lat_name, latency),
        per_edge(bw_name, bandwidth),
        senders,
        real,
        degree,
        "graph",
        mode,
        int(exchanges),
        n,
    )


def comm_seconds(links: Links, bits: Array, t: Any) -> Array:
    """``c_i``: seconds each node spends sending its messages of round ``t`` (module docstring).

    Args:
      links: from :func:`make_links`.
      bits: ``[N]`` bits each node sent in the round (``StepInfo.bits``).
      t: the round counter (static or traced); graph ``t mod T``.

    Returns:
      ``[N]`` seconds (the dtype of ``bits`` and the links: float32 in a run, float64 under x64).
    """
    kind, mode, exchanges, n = links.kind, links.mode, links.exchanges, links.num_nodes
    dtype = jnp.result_type(bits, links.latency)
    bits = jnp.asarray(bits, dtype)
    sent = bits > 0
    if kind in ALLREDUCE_MODELS:
        steps, chunk = (2 * (n - 1), n) if kind == "ring" else (1, 1)
        return jnp.where(sent, steps * (links.latency + bits / chunk / links.bandwidth), 0).astype(dtype)
    if kind == "mean":
        degree = jnp.asarray(links.degree, dtype)
        one = links.latency + bits / degree / exchanges / links.bandwidth
        comm = degree * one if mode == "serial" else one
        return jnp.where(sent, exchanges * comm, 0).astype(dtype)
    period = np.shape(links.senders)[0]
    idx = 0 if period == 1 else jnp.asarray(t, jnp.int32) % period
    senders = jnp.asarray(links.senders)[idx]
    real = jnp.asarray(links.real)[idx]
    degree = jnp.asarray(links.degree, dtype)[idx]
    message = bits / jnp.maximum(degree, 1) / exchanges  # [N] bits per message
    size = message[senders]  # [E]
    edge = jnp.where(real & (size > 0), links.latency[idx] + size / links.bandwidth[idx], 0).astype(dtype)
    zeros = jnp.zeros([n], dtype)
    comm = zeros.at[senders].add(edge) if mode == "serial" else zeros.at[senders].max(edge)
    return exchanges * comm


def _stragglers(compute: Compute, key: PRNGKey, n: int) -> Array:
    """``[N]`` bool: the ``round(F N)`` straggling nodes, drawn once from ``key``. With F traced the
    set is the first ``round(F N)`` of one random order, so sweeping F nests the sets."""
    rank = jnp.argsort(jax.random.permutation(key, n))  # node -> its place in a random order
    count = jnp.round(jnp.asarray(compute.fraction, jnp.float32) * n)
    return rank < count


def compute_seconds(compute: Compute, key: PRNGKey, step: Any, n: int) -> Array:
    """``p_{k,i}``: ``[N]`` seconds of local step ``step`` (k) of every node (float32, or float64
    under x64).

    Args:
      compute: the compute model.
      key: the clock's key (:attr:`Clock.key`); stragglers use it as is (fixed for the run), the
        random kinds fold in the step.
      step: k, the global index of the local step (traced).
      n: N.
    """
    dtype = jnp.result_type(float)  # float32 in a run, float64 when cost.simulate prices under x64
    seconds = jnp.asarray(compute.seconds, dtype)
    if compute.kind == "constant":
        return jnp.broadcast_to(seconds, (n,))
    if compute.kind == "stragglers":
        slow = jnp.asarray(compute.slowdown, dtype)
        return jnp.where(_stragglers(compute, key, n), slow * seconds, seconds)
    draw = jax.random.fold_in(key, jnp.asarray(step, jnp.uint32))
    if compute.kind == "lognormal":
        return seconds * jnp.exp(jnp.asarray(compute.sigma, dtype) * jax.random.normal(draw, (n,), dtype))
    if compute.kind == "exponential":
        return seconds * jax.random.exponential(draw, (n,), dtype)
    trace = jnp.asarray(compute.trace, dtype)
    if trace.shape[1] != n:
        raise ValueError(f"a compute trace of shape {trace.shape} does not fit N = {n} nodes: it must be [steps, {n}]")
    return trace[jnp.asarray(step, jnp.int32) % trace.shape[0]]


@dataclasses.dataclass(frozen=True)
class TimeModel:
    """The time model of a run: compute per local step and the links (a pytree; build it with
    :func:`time_model`).

    Attributes:
      compute: :class:`Compute`.
      links: :class:`Links` (:func:`make_links`).
      overlap: static bool, whether a node sends while it computes (the ``same_iterate`` ordering).
      available: ``[R, N]`` 0/1, which nodes are online in round ``t mod R`` (:func:`availability`),
        or None (always online). An offline node computes nothing and sends nothing (its graph is
        :func:`jaxgossip.topology.with_availability`), and the round waits only for online nodes.
    """

    compute: Compute
    links: Links
    overlap: bool = False
    available: Any = None


jax.tree_util.register_dataclass(TimeModel, data_fields=["compute", "links", "available"], meta_fields=["overlap"])

# The default links: 1 Gbit/s is commodity Ethernet; 100 us per message is an assumption, not a
# measurement: the order of a small TCP message's one-way latency inside a LAN or data centre (a
# switch hop plus two kernel network stacks); wide-area or wireless edge links have 10-100x more.
DEFAULT_BANDWIDTH = 1e9
DEFAULT_LATENCY = 1e-4


def time_model(
    topology: Any,
    *,
    available: Any = None,
    compute: Any = 0.0,
    latency: Any = DEFAULT_LATENCY,
    bandwidth: Any = DEFAULT_BANDWIDTH,
    mode: str = "serial",
    algorithm: str | None = None,
    options: Any = None,
    ordering: str = "atc",
    exchanges: int | None = None,
    allreduce: str | None = None,
    allreduce_model: str = "ring",
    names: tuple[str, str] = ("latency", "bandwidth"),
) -> TimeModel:
    """The :class:`TimeModel` of a run on ``topology``.

    Args:
      topology: the run's graph.
      compute: seconds per local step: a number, a ``--time.compute`` spec string
        (:func:`parse_compute`) or a :class:`Compute`.
      latency, bandwidth, mode: the links (:func:`make_links`).
      algorithm, options: a registered algorithm's name and options: its metadata gives the
        exchanges per round and whether a round is priced as an all-reduce (its
        :class:`jaxgossip.types.CostFacts`; an all-reduce with ``allreduce_model``).
      ordering: ``"atc"`` (compute, then send) or ``"same_iterate"`` (overlap).
      exchanges, allreduce: explicit values instead of the metadata's (an unregistered algorithm).
      names: how error messages call latency and bandwidth (e.g. the command-line options).
      available: ``[R, N]`` online mask (:func:`availability`) or None; the run's graph must then
        be :func:`jaxgossip.topology.with_availability` of the same mask.
    """
    if algorithm is not None:
        from jaxgossip import algorithms

        info = algorithms.resolve(algorithm)
        if exchanges is None:
            exchanges = info.cost.exchanges_per_round(dict(options or {}))
        if allreduce is None and info.cost.allreduce_cost:
            allreduce = allreduce_model
    exchanges = 1 if exchanges is None or allreduce is not None else exchanges
    links = make_links(
        topology, latency, bandwidth, mode=mode, exchanges=exchanges, allreduce=allreduce, names=names
    )
    compute = parse_compute(compute)
    if compute.kind == "trace" and np.shape(compute.trace)[1] != topology.num_nodes:
        raise ValueError(
            f"--time.compute: a trace of shape {np.shape(compute.trace)} does not fit N = {topology.num_nodes} "
            f"nodes: it must be [steps, {topology.num_nodes}]"
        )
    if available is not None:
        available = np.asarray(available, np.float32)
        if available.ndim != 2 or available.shape[1] != topology.num_nodes:
            raise ValueError(f"available must be [rounds, N] = [R, {topology.num_nodes}]; got {available.shape}")
    return TimeModel(compute, links, overlap=ordering == "same_iterate", available=available)


class Clock(NamedTuple):
    """The simulated clock a run carries (``time`` + ``carry`` is the exact sum of the round times).

    Attributes:
      time: [] float32, seconds since the start (the compensated sum).
      carry: [] float32, the Kahan compensation of ``time`` (what float32 lost).
      comm: [] float32, seconds of communication so far (the slowest node's ``c_i``, summed).
      round: [] int32, rounds done.
      key: [2] uint32, raw data of the clock's key ``fold_in(run key, TIME_STREAM)``.
    """

    time: Array
    carry: Array
    comm: Array
    round: Array
    key: Array


def init_clock(run_key: PRNGKey) -> Clock:
    """The clock at time 0 of a run with key ``run_key`` (typed or raw)."""
    key = jax.random.fold_in(run_key, TIME_STREAM)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    zero = jnp.zeros([], jnp.float32)
    return Clock(zero, zero, zero, jnp.zeros([], jnp.int32), key)


def round_seconds(model: TimeModel, key: PRNGKey, bits: Array, t: Any, local_steps: int) -> tuple[Array, Array]:
    """``(tau_r, max_i c_i)`` of round ``t``: its synchronous duration and its communication time.

    Args:
      model: the run's time model.
      key: the clock's key (see :func:`compute_seconds`).
      bits: ``[N]`` bits sent in the round.
      t: round counter (0-based; its H local steps are ``t H .. t H + H - 1``).
      local_steps: H (static).
    """
    n = model.links.num_nodes
    comm = comm_seconds(model.links, bits, t)
    if model.compute.is_zero or local_steps == 0:
        work = jnp.zeros([n], comm.dtype)
    else:
        first = jnp.asarray(t, jnp.int32) * local_steps
        work = sum(compute_seconds(model.compute, key, first + h, n) for h in range(local_steps)).astype(comm.dtype)
    if model.available is not None:  # an offline node computes nothing; the round does not wait for it
        avail = jnp.asarray(model.available)
        work = work * avail[jnp.asarray(t, jnp.int32) % avail.shape[0]].astype(work.dtype)
    node = jnp.maximum(work, comm) if model.overlap else work + comm
    return jnp.max(node), jnp.max(comm)


def advance(clock: Clock, model: TimeModel, bits: Array, local_steps: int = 1) -> Clock:
    """The clock after one more synchronous round that sent ``bits`` ``[N]`` and took ``local_steps``
    local steps (Kahan sum of the round times: a float32 sum alone would drop rounds of 1e-4 s
    after about 1e3 s)."""
    key = jax.random.wrap_key_data(clock.key)
    tau, comm = round_seconds(model, key, bits, clock.round, local_steps)
    y = tau.astype(jnp.float32) - clock.carry
    total = clock.time + y
    carry = (total - clock.time) - y
    return Clock(total, carry, clock.comm + comm.astype(jnp.float32), clock.round + 1, clock.key)


def with_ordering(model: TimeModel, ordering: str) -> TimeModel:
    """``model`` with the overlap of a run's ordering (``same_iterate`` sends while it computes)."""
    return dataclasses.replace(model, overlap=ordering == "same_iterate")


