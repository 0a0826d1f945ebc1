"""The simulated network: the one model of links, compute and availability that every clock and
every report of a run uses.

:class:`Network` holds the parameters, the ``--time.*`` options of every command: each node's
seconds per local step and its availability (:mod:`jaxgossip.sim.compute`), each link's latency
and bandwidth, how a node's messages share its uplink and how an all-reduce is priced. The clock
inside a compiled run (:func:`jaxgossip.sim.timing.time_model`, :func:`jaxgossip.sim.timing.advance`),
:func:`jaxgossip.sim.cost.simulate` and the command-line reports all start from a ``Network``.

* **Links.** A message of B bits over a link of latency l (s) and bandwidth b (bit/s) takes
  ``l + B / b``. A link is a node's uplink (scalar or ``[N]``) or a directed edge of the graph
  (``[T, E]``, aligned with ``topology.senders``); a per-node spec (``stragglers:F,S``,
  ``lognormal:MEDIAN,SIGMA``, ``trace:PATH``; :mod:`jaxgossip.sim.link_specs`) gives ``[N]``
  drawn from the run's seed, or ``[R, N]`` per round. Only the sending side is modelled: no downlink
  contention, no loss; a synchronous round's messages do not queue behind another round's, an
  asynchronous run's do on a serial uplink (:mod:`jaxgossip.engine.asynchronous.waves`).
  :func:`make_links` lays them out on a graph (:class:`Links`).
* **Asynchronous exchanges** (:attr:`Network.exchange`). ``priced`` (the default): an
  asynchronous run's pairwise averaging (AD-PSGD) takes the time of the model going over the link
  and the reply coming back, and both nodes are busy for it; ``free``: it takes no time, the model
  of Lian et al. 2018, kept for comparison. Messages (asynchronous gossip and SGP, synchronous
  rounds) always take their link time.
* **A round's communication** (:func:`comm_seconds`). In round r (graph ``t = r mod T``) node i
  sends one message to each of its ``d_{t,i}`` out-neighbours (self excluded), all of the same
  size ``B_i = bits_i / d_{t,i}`` (true of every algorithm here), split over the I sequential
  exchanges of the round (PowerGossip's ``num_iterations``), each paying the latency again:
  ``serial`` (the messages share the uplink) ``c_i = I sum_e (l_e + B_i / (I b_e))``, ``parallel``
  (independent links) ``c_i = I max_e (l_e + B_i / (I b_e))``. A node that sent nothing pays
  nothing. A stochastic graph has no fixed edge list: a node sends ``d`` equal messages, ``d`` its
  mean out-degree, over its uplink. All-reduce: ``ring`` (bandwidth-optimal, ``2 (N - 1)`` steps of
  ``B / N`` bits) ``c_i = 2 (N - 1) (l_i + B_i / (N b_i))``; ``message``: ``c_i = l_i + B_i / b_i``.

References:
  Patarasuk, Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 2009.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.checks import check_group, check_number, is_concrete
from jaxgossip.sim import compute as compute_lib
from jaxgossip.sim.link_specs import LinkSpec, NodeLinks, PerRound, link_values, parse_link
from jaxgossip.types import Array

__all__ = [
    "LINK_MODES",
    "EXCHANGE_MODES",
    "ALLREDUCE_MODELS",
    "DEFAULT_BANDWIDTH",
    "DEFAULT_LATENCY",
    "Network",
    "Links",
    "make_links",
    "comm_seconds",
    "PerRound",
]

LINK_MODES = ("serial", "parallel")
EXCHANGE_MODES = ("priced", "free")
ALLREDUCE_MODELS = ("ring", "message")
# The default links: 1 Gbit/s is commodity Ethernet; 100 us per message is an assumption, not a
# measurement: the order of a small TCP message's one-way latency inside a LAN or data centre (a
# switch hop plus two kernel network stacks); wide-area or wireless edge links have 10-100x more.
DEFAULT_BANDWIDTH = 1e9
DEFAULT_LATENCY = 1e-4

# The unit each link field is given in (error messages).
_UNITS = {"latency": "s", "bandwidth": "bit/s"}


_DEFAULTS = {"latency": DEFAULT_LATENCY, "bandwidth": DEFAULT_BANDWIDTH}


def _link_value(field: str, value: Any) -> Any:
    """A latency or bandwidth as a number, array or :class:`~jaxgossip.sim.link_specs.LinkSpec` (a
    config file's ``"1e-4"`` is the number, ``"stragglers:0.1,10"`` a spec), checked: finite,
    ``> 0`` (bandwidth) or ``>= 0`` (latency), at most 2-D; traced values pass."""
    name = f"--time.{field}"
    if isinstance(value, str):
        value = parse_link(field, value, _DEFAULTS[field])
        if isinstance(value, LinkSpec):
            return value
    elif isinstance(value, (list, tuple)):
        value = np.asarray(value, np.float64) if all(isinstance(v, (int, float)) for v in value) else value
    if isinstance(value, bool) or not (
        isinstance(value, (int, float, np.number, np.ndarray, jax.Array)) or not is_concrete(value)
    ):
        raise ValueError(f"{name}={value!r} must be a number ({_UNITS[field]})")
    if np.ndim(value) > 2:
        raise ValueError(f"{name} must be a scalar, [N] or [T, E]; got shape {np.shape(value)}")
    check_number(name, value, minimum=0.0, strict=field == "bandwidth")
    return value


@dataclasses.dataclass(frozen=True, eq=False)
class Network:
    """The simulated cluster of a run: its nodes' compute and availability, its links (the
    ``--time.*`` options; every field checked on construction, errors naming ``--time.FIELD``).

    Attributes:
      compute: seconds per local step: a number, a ``--time.compute`` spec
        (``stragglers:C,F,S``, ``lognormal:MEDIAN,SIGMA``, ``exponential:MEAN``, ``trace:PATH``;
        :func:`jaxgossip.sim.compute.parse_compute`) or a :class:`~jaxgossip.sim.compute.Compute`.
      latency: >= 0 s per message; scalar, ``[N]`` per node or ``[T, E]`` per edge, or a per-node
        spec (``constant:V``, ``stragglers:F,S``, ``lognormal:MEDIAN,SIGMA``, ``trace:PATH``;
        :mod:`jaxgossip.sim.link_specs`), a node's value pricing its uplink.
      bandwidth: > 0 bit/s; same shapes and specs.
      mode: ``"serial"`` (a node's messages of a round share its uplink) or ``"parallel"``.
      exchange: ``"priced"`` (an asynchronous pairwise average takes its link time both ways and
        keeps both nodes busy) or ``"free"`` (instantaneous, the AD-PSGD paper's model).
      allreduce_model: how a round of an all-reduce algorithm is priced: ``"ring"`` (the
        bandwidth-optimal ring) or ``"message"`` (one model-sized message per node).
      availability: ``always``, ``markov:P_OFF,P_ON`` or ``trace:PATH``
        (:func:`jaxgossip.sim.compute.availability`).
      link_specs: (set on construction, not an option) ``{"latency"|"bandwidth": LinkSpec}`` of
        the link options given as per-node specs; the fields keep the spec's text.

    Raises:
      ValueError: naming the ``--time.*`` option and the rule (not a number, out of range, an
        unknown mode, a bad compute spec).
    """

    # The hints are what the command line and config files take (arrays and traced values go in
    # from Python, as documented above).
    compute: float | str = 0.0
    latency: float | str = DEFAULT_LATENCY
    bandwidth: float | str = DEFAULT_BANDWIDTH
    mode: str = "serial"
    exchange: str = "priced"
    allreduce_model: str = "ring"
    availability: str = "always"

    def __post_init__(self):
        specs = {}
        for field in ("latency", "bandwidth"):
            value = _link_value(field, getattr(self, field))
            if isinstance(value, LinkSpec):  # the field keeps the text (the run's resolved options)
                specs[field] = value
            else:
                object.__setattr__(self, field, value)
        object.__setattr__(self, "link_specs", specs)
        for field, known in (("mode", LINK_MODES), ("exchange", EXCHANGE_MODES), ("allreduce_model", ALLREDUCE_MODELS)):
            value = getattr(self, field)
            if value not in known:
                raise ValueError(f"--time.{field}={value!r} is unknown; known: {', '.join(known)}")
        if self.availability is None:
            object.__setattr__(self, "availability", "always")
        self.compute_model  # noqa: B018 (parsed once: the spec's errors now rather than at the first round)

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | Network | None) -> Network:
        """The network of a ``--time.*`` mapping (``TrainConfig.time``, a config file's ``time:``);
        a key set to None keeps its default.

        Raises:
          ValueError: not a mapping; an unknown key (naming it, with a suggestion); a bad value.
        """
        if isinstance(options, Network):
            return options
        if options is None:
            return cls()
        example = "--time.compute=0.01 --time.bandwidth=1e8"
        return cls(**check_group("time", options, [f.name for f in dataclasses.fields(cls)], "time option", example))

    @functools.cached_property
    def compute_model(self) -> compute_lib.Compute:
        """:attr:`compute` parsed (:func:`jaxgossip.sim.compute.parse_compute`; a trace file is read once)."""
        return compute_lib.parse_compute(self.compute)

    def options(self) -> dict:
        """The fields by name (the ``--time.*`` values a run resolves to)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def round_varying(self) -> bool:
        """Whether a link changes with the round (a ``trace:PATH`` of R > 1 rows)."""
        return any(spec.kind == "trace" and spec.trace.shape[0] > 1 for spec in self.link_specs.values())

    def link_values(self, num_nodes: int, seed: int | None = None) -> NodeLinks:
        """``(latency, bandwidth)`` as :func:`make_links` takes them: a number or array as given, a
        spec as its per-node values ``[N]`` (or :class:`PerRound` ``[R, N]``), drawn from ``seed``
        (the run's; needed by ``stragglers`` and ``lognormal`` only).

        Raises:
          ValueError: naming the option: a drawn spec without a seed, a trace that does not fit N.
        """
        out = []
        for field in ("latency", "bandwidth"):
            spec = self.link_specs.get(field)
            value = getattr(self, field)
            out.append(value if spec is None else link_values(spec, num_nodes, seed, _DEFAULTS[field]))
        return NodeLinks(*out)

    def links(
        self,
        topology: Any,
        *,
        exchanges: int = 1,
        allreduce: bool = False,
        num_nodes: int | None = None,
        seed: int | None = None,
    ):
        """The :class:`Links` of a round on ``topology`` (:func:`make_links`): gossip with
        ``exchanges`` sequential exchanges, or an all-reduce priced by :attr:`allreduce_model`;
        ``seed``: the run's seed, from which per-node specs are drawn (:meth:`link_values`)."""
        n = num_nodes if topology is None else topology.num_nodes
        if n is None:
            raise ValueError("Network.links needs a topology or num_nodes")
        latency, bandwidth = self.link_values(n, seed)
        return make_links(
            None if allreduce else topology,
            latency,
            bandwidth,
            mode=self.mode,
            exchanges=1 if allreduce else exchanges,
            allreduce=self.allreduce_model if allreduce else None,
            num_nodes=topology.num_nodes if allreduce and topology is not None else num_nodes,
            names=("--time.latency", "--time.bandwidth"),
        )

    def online(self, num_rounds: int, num_nodes: int, seed: int) -> np.ndarray | None:
        """The ``[num_rounds, N]`` online mask of :attr:`availability` drawn from ``seed``, or None
        (always online)."""
        return compute_lib.availability(self.availability, int(num_rounds), int(num_nodes), int(seed))


@dataclasses.dataclass(frozen=True)
class Links:
    """A run's links, laid out for :func:`comm_seconds` (a pytree; built by :func:`make_links`).

    Attributes:
      latency, bandwidth: ``[T, E]`` per edge (``kind="graph"``) or ``[N]`` per node; a field
        named in ``cycled`` is ``[R, N]`` per node, row ``r mod R`` in round r.
      senders: ``[T, E]`` int32 (graph) or None.
      real: ``[T, E]`` bool, a real edge: weight != 0 and not a self loop (graph) or None.
      degree: ``[T, N]`` out-degrees (graph), the mean out-degree (``"mean"``) or None.
      kind: static; ``"graph"`` (a fixed graph priced per edge), ``"mean"`` (a stochastic graph:
        ``degree`` equal messages over the uplink), ``"ring"`` or ``"message"`` (all-reduce).
      mode: static, ``"serial"`` or ``"parallel"``.
      exchanges: static, I.
      num_nodes: static, N.
      cycled: static, the fields (``"latency"``, ``"bandwidth"``) that change with the round.
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
    cycled: tuple = ()


jax.tree_util.register_dataclass(
    Links,
    data_fields=["latency", "bandwidth", "senders", "real", "degree"],
    meta_fields=["kind", "mode", "exchanges", "num_nodes", "cycled"],
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
      latency: >= 0 s per message; scalar, ``[N]``, ``[T, E]`` (fixed graphs only) or
        :class:`PerRound` ``[R, N]`` (per node, row ``r mod R`` in round r).
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
    cycled = tuple(f for f, v in (("latency", latency), ("bandwidth", bandwidth)) if isinstance(v, PerRound))
    latency, bandwidth = (v.values if isinstance(v, PerRound) else v for v in (latency, bandwidth))
    check_number(lat_name, latency, minimum=0.0)
    check_number(bw_name, bandwidth, minimum=0.0, strict=True)
    if mode not in LINK_MODES:
        raise ValueError(f"mode={mode!r} is unknown; known modes: {', '.join(LINK_MODES)}")
    if isinstance(exchanges, bool) or not isinstance(exchanges, (int, np.integer)) or exchanges < 1:
        raise ValueError(f"exchanges must be an int >= 1; got {exchanges!r}")
    n = num_nodes if topology is None else topology.num_nodes
    if n is None:
        raise ValueError("make_links needs a topology or num_nodes")
    for name, value, field in ((lat_name, latency, "latency"), (bw_name, bandwidth, "bandwidth")):
        if field in cycled and (np.ndim(value) != 2 or np.shape(value)[1] != n):
            raise ValueError(f"{name} per round must have shape [R, N] = [R, {n}]; got {np.shape(value)}")
    # Per-edge [T, E] arrays (2-D and not cycled) need a fixed edge list.
    fields = (("latency", latency), ("bandwidth", bandwidth))
    per_edge_given = any(np.ndim(v) == 2 and f not in cycled for f, v in fields)

    def per_node(name, value, field):
        if field in cycled:
            return jnp.asarray(value, jnp.result_type(float))
        return _as_node_array(name, value, n)

    if allreduce is not None:
        if allreduce not in ALLREDUCE_MODELS:
            raise ValueError(f"allreduce={allreduce!r} is unknown; known models: {', '.join(ALLREDUCE_MODELS)}")
        if per_edge_given:
            raise ValueError("allreduce needs scalar or per-node [N] links, not per-edge [T, E] arrays")
        lat, bw = per_node(lat_name, latency, "latency"), per_node(bw_name, bandwidth, "bandwidth")
        return Links(lat, bw, None, None, None, allreduce, mode, 1, n, cycled)
    if topology.stochastic:
        if per_edge_given:
            raise ValueError(
                f"per-edge links [T, E] need a fixed edge list; {topology.name} is drawn every round: "
                "give scalar or per-node [N] latency and bandwidth"
            )
        from jaxgossip.topology import mean_out_degree

        degree = mean_out_degree(topology)  # traced for a member of a stack of failure graphs
        degree = np.float64(max(degree, 1e-9)) if isinstance(degree, float) else jnp.maximum(degree, 1e-9)
        lat, bw = per_node(lat_name, latency, "latency"), per_node(bw_name, bandwidth, "bandwidth")
        return Links(lat, bw, None, None, degree, "mean", mode, int(exchanges), n, cycled)
    # Host tables stay NumPy (constants of the compiled run); traced ones (a member of a stack of
    # graphs inside a topology sweep) stay traced.
    xp = np if topology.host_tables else jnp
    senders = xp.asarray(topology.senders, xp.int32)
    real = (xp.asarray(topology.weights) != 0) & (senders != xp.asarray(topology.receivers))

    def per_edge(name, value, field):
        if field in cycled:  # [R, N]: gathered per edge in each round (comm_seconds)
            return jnp.asarray(value, jnp.result_type(float))
        if np.ndim(value) == 2:
            if np.shape(value) != np.shape(senders):
                raise ValueError(
                    f"{name} per edge must have shape [T, E] = {np.shape(senders)}; got {np.shape(value)}"
                )
            return jnp.asarray(value, jnp.result_type(float))
        return _as_node_array(name, value, n)[senders]

    degree = xp.asarray(topology.out_degree, np.float64 if xp is np else jnp.result_type(float))
    return Links(
        per_edge(lat_name, latency, "latency"),
        per_edge(bw_name, bandwidth, "bandwidth"),
        senders,
        real,
        degree,
        "graph",
        mode,
        int(exchanges),
        n,
        cycled,
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

    def node_value(field):  # [N] this round's value of each node's uplink
        value = jnp.asarray(getattr(links, field))
        return value[jnp.asarray(t, jnp.int32) % value.shape[0]] if field in links.cycled else value

    if kind in ALLREDUCE_MODELS:
        steps, chunk = (2 * (n - 1), n) if kind == "ring" else (1, 1)
        lat, bw = node_value("latency"), node_value("bandwidth")
        return jnp.where(sent, steps * (lat + bits / chunk / bw), 0).astype(dtype)
    if kind == "mean":
        degree = jnp.asarray(links.degree, dtype)
        one = node_value("latency") + bits / degree / exchanges / node_value("bandwidth")
        comm = degree * one if mode == "serial" else one
        return jnp.where(sent, exchanges * comm, 0).astype(dtype)
    period = np.shape(links.senders)[0]
    idx = 0 if period == 1 else jnp.asarray(t, jnp.int32) % period
    senders = jnp.asarray(links.senders)[idx]
    real = jnp.asarray(links.real)[idx]
    degree = jnp.asarray(links.degree, dtype)[idx]

    def edge_value(field):  # [E] this round's value of each edge (its sender's uplink when cycled)
        return node_value(field)[senders] if field in links.cycled else jnp.asarray(getattr(links, field))[idx]

    message = bits / jnp.maximum(degree, 1) / exchanges  # [N] bits per message
    size = message[senders]  # [E]
    edge = jnp.where(real & (size > 0), edge_value("latency") + size / edge_value("bandwidth"), 0).astype(dtype)
    zeros = jnp.zeros([n], dtype)
    comm = zeros.at[senders].add(edge) if mode == "serial" else zeros.at[senders].max(edge)
    return exchanges * comm
