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
  drawn from the run's seed, or ``[R, N]`` per round; ``edge_trace:PATH``
  (:mod:`jaxgossip.sim.edge_traces`) gives ``[T, E]``, or ``[R, E]`` per round on a static graph.
  No loss; a synchronous round's messages do not queue behind another round's, an asynchronous
  run's do on a serial uplink (:mod:`jaxgossip.engine.asynchronous.waves`). :func:`make_links`
  lays them out on a graph (:class:`Links`).
* **Downlinks** (:attr:`Network.downlink`, default unlimited: not modelled, every result as
  without it). Node j's downlink ``b^down_j`` bounds every message it receives: a message of B
  bits from i to j takes ``l_e + B / min(b_e, b^down_j)``, with ``b_e`` the uplink (or edge)
  bandwidth. In ``serial`` mode a node's incoming messages also share its downlink, one after
  another: it is busy receiving for ``D_j = I sum_{e: r(e)=j} B_{s(e)} / (I b^down_j)`` (the bits
  only: a message's latency is paid once, on its sender's side, while the downlink carries
  another message), and its communication time is ``c_j = max(U_j, D_j)``, ``U_j`` its uploads
  below (each bounded by its receiver's downlink). Each side is one resource working back to
  back, and the node is done when the busier side is; how one node's uplink waits on another's
  downlink beyond the per-message ``min`` is not modelled (the round's max over nodes still waits
  for the slowest downlink). An all-reduce step
  sends one chunk and receives one: it goes at ``min(b_i, b^down_i)``. A stochastic graph (drawn
  every round) does not say where a node's messages go, and is refused with a downlink. The
  asynchronous planner prices each message and exchange at ``min(b_e, b^down_receiver)``;
  messages do not queue on a downlink there.
* **Asynchronous exchanges** (:attr:`Network.exchange`). ``priced`` (the default): an
  asynchronous run's pairwise averaging (AD-PSGD) takes the time of the model going over the link
  and the reply coming back, and both nodes are busy for it; ``free``: it takes no time, the model
  of Lian et al. 2018, kept for comparison. Messages (asynchronous gossip and SGP, synchronous
  rounds) always take their link time.
* **A round's communication** (:func:`comm_seconds`). In round r (graph ``t = r mod T``) node i
  sends one message to each of its ``d_{t,i}`` out-neighbours (self excluded), all of the same
  size ``B_i = bits_i / d_{t,i}`` (true of every algorithm here), split over the I sequential
  exchanges of the round (PowerGossip's ``num_iterations``), each paying the latency again:
  ``serial`` (the messages share the uplink) ``U_i = I sum_e (l_e + B_i / (I b'_e))``, ``parallel``
  (independent links) ``c_i = I max_e (l_e + B_i / (I b'_e))``, where ``b'_e = b_e`` without a
  downlink and ``min(b_e, b^down_{r(e)})`` with one; serial ``c_i = U_i`` without a downlink and
  ``max(U_i, D_i)`` with one. A node that sent (and received) nothing pays nothing. A stochastic
  graph has no fixed edge list: a node sends ``d`` equal messages, ``d`` its mean out-degree, over
  its uplink. All-reduce: ``ring`` (bandwidth-optimal, ``2 (N - 1)`` steps of ``B / N`` bits)
  ``c_i = 2 (N - 1) (l_i + B_i / (N b'_i))``; ``message``: ``c_i = l_i + B_i / b'_i``, with
  ``b'_i = min(b_i, b^down_i)`` (``b_i`` without a downlink).

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
from jaxgossip.sim.edge_traces import PerRoundEdge, edge_values
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
    "PerRoundEdge",
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
_UNITS = {"latency": "s", "bandwidth": "bit/s", "downlink": "bit/s"}

# The base of a stragglers:F,S spec (a downlink is unlimited by default; its stragglers are S times
# slower than the default bandwidth).
_DEFAULTS = {"latency": DEFAULT_LATENCY, "bandwidth": DEFAULT_BANDWIDTH, "downlink": DEFAULT_BANDWIDTH}
_LINK_FIELDS = ("latency", "bandwidth", "downlink")


def _link_value(field: str, value: Any) -> Any:
    """A latency or bandwidth as a number, array or :class:`~jaxgossip.sim.link_specs.LinkSpec` (a
    config file's ``"1e-4"`` is the number, ``"stragglers:0.1,10"`` a spec), checked: finite,
    ``> 0`` (bandwidth, downlink) or ``>= 0`` (latency), at most 2-D; traced values pass; a
    downlink of None or ``"unlimited"`` is not modelled."""
    name = f"--time.{field}"
    if field == "downlink" and (value is None or (isinstance(value, str) and value.strip() == "unlimited")):
        return None
    if isinstance(value, str):
        value = parse_link(field, value, _DEFAULTS[field])
        if isinstance(value, LinkSpec):
            return value
    if isinstance(value, (PerRound, PerRoundEdge)):  # a row of a sweep's link table (make_links checks it)
        if field == "downlink" and isinstance(value, PerRoundEdge):
            raise ValueError(f"{name} is a node's: a scalar, [N] or per round [R, N]; got per-edge values")
        check_number(name, value.values, minimum=0.0, strict=field != "latency")
        return value
    elif isinstance(value, (list, tuple)):
        value = np.asarray(value, np.float64) if all(isinstance(v, (int, float)) for v in value) else value
    if isinstance(value, bool) or not (
        isinstance(value, (int, float, np.number, np.ndarray, jax.Array)) or not is_concrete(value)
    ):
        raise ValueError(f"{name}={value!r} must be a number ({_UNITS[field]})")
    if np.ndim(value) > 2:
        raise ValueError(f"{name} must be a scalar, [N] or [T, E]; got shape {np.shape(value)}")
    if field == "downlink" and np.ndim(value) > 1:
        raise ValueError(f"{name} is a node's: a scalar or [N]; got shape {np.shape(value)}")
    check_number(name, value, minimum=0.0, strict=field != "latency")
    return value


@dataclasses.dataclass(frozen=True, eq=False)
class Network:
    """The simulated cluster of a run: its nodes' compute and availability, its links (the
    ``--time.*`` options; every field checked on construction, errors naming ``--time.FIELD``).

    Attributes:
      compute: seconds per local step: a number, a ``--time.compute`` spec
        (``stragglers:C,F,S``, ``lognormal:MEDIAN,SIGMA``, ``exponential:MEAN``, ``trace:PATH``;
        :func:`jaxgossip.sim.compute.parse_compute`) or a :class:`~jaxgossip.sim.compute.Compute`.
      latency: >= 0 s per message; scalar, ``[N]`` per node or ``[T, E]`` per edge, a
        :class:`PerRound` ``[R, N]`` or :class:`PerRoundEdge` ``[R, E]``, or a per-node spec
        (``constant:V``, ``stragglers:F,S``, ``lognormal:MEDIAN,SIGMA``, ``trace:PATH``;
        :mod:`jaxgossip.sim.link_specs`), a node's value pricing its uplink.
      bandwidth: > 0 bit/s; same shapes and specs, and ``edge_trace:PATH`` (per edge, with
        latency too: :mod:`jaxgossip.sim.edge_traces`).
      downlink: > 0 bit/s of each node's downlink, scalar, ``[N]`` or a per-node spec
        (``trace:PATH`` reads a device trace's ``downlink_bps``); None or ``"unlimited"`` (the
        default): not modelled, every result as without it.
      mode: ``"serial"`` (a node's messages of a round share its uplink) or ``"parallel"``.
      exchange: ``"priced"`` (an asynchronous pairwise average takes its link time both ways and
        keeps both nodes busy) or ``"free"`` (instantaneous, the AD-PSGD paper's model).
      allreduce_model: how a round of an all-reduce algorithm is priced: ``"ring"`` (the
        bandwidth-optimal ring) or ``"message"`` (one model-sized message per node).
      availability: ``always``, ``markov:P_OFF,P_ON`` or ``trace:PATH``
        (:func:`jaxgossip.sim.compute.availability`).
      link_specs: (set on construction, not an option) ``{"latency"|"bandwidth"|"downlink": LinkSpec}`` of
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
    downlink: float | str | None = None
    mode: str = "serial"
    exchange: str = "priced"
    allreduce_model: str = "ring"
    availability: str = "always"

    def __post_init__(self):
        specs = {}
        for field in _LINK_FIELDS:
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
        """Whether a link changes with the round (a ``trace:PATH`` or ``edge_trace:PATH`` of R > 1 rows)."""
        return bool(self.round_varying_fields)

    @property
    def round_varying_fields(self) -> tuple[str, ...]:
        """The link fields that change with the round (:attr:`round_varying`)."""
        return tuple(
            field
            for field, spec in self.link_specs.items()
            if (spec.kind == "trace" and spec.trace.shape[0] > 1) or (spec.kind == "edge_trace" and spec.trace.rows > 1)
        )

    def link_values(self, num_nodes: int, seed: int | None = None) -> NodeLinks:
        """``(latency, bandwidth)`` as :func:`make_links` takes them: a number or array as given, a
        spec as its per-node values ``[N]`` (or :class:`PerRound` ``[R, N]``), drawn from ``seed``
        (the run's; needed by ``stragglers`` and ``lognormal`` only).

        Raises:
          ValueError: naming the option: a drawn spec without a seed, a trace that does not fit N.
        """
        return NodeLinks(*(self.field_values(field, num_nodes, seed) for field in ("latency", "bandwidth")))

    def downlink_values(self, num_nodes: int, seed: int | None = None) -> Any:
        """:attr:`downlink` as :func:`make_links` takes it: None (not modelled), a number or array
        as given, or a spec's per-node values ``[N]`` (:class:`PerRound` ``[R, N]``) drawn from ``seed``."""
        return self.field_values("downlink", num_nodes, seed)

    def field_values(self, field: str, num_nodes: int, seed: int | None, edges_of: tuple = ()) -> Any:
        """One link field as :func:`make_links` takes it: the value as given, or a per-node spec's
        values drawn from ``seed``; with ``edges_of=(topology,)`` an ``edge_trace`` is laid out on
        that graph's edges (a None topology, an all-reduce's, refuses it)."""
        spec = self.link_specs.get(field)
        if spec is None:
            return getattr(self, field)
        if spec.kind == "edge_trace" and edges_of:
            return edge_values(spec.name, spec.trace, edges_of[0])
        return link_values(spec, num_nodes, seed, _DEFAULTS[field])

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
        graph = None if allreduce else topology
        values = [self.field_values(field, n, seed, (graph,)) for field in ("latency", "bandwidth")]
        return make_links(
            None if allreduce else topology,
            *values,
            mode=self.mode,
            exchanges=1 if allreduce else exchanges,
            allreduce=self.allreduce_model if allreduce else None,
            num_nodes=topology.num_nodes if allreduce and topology is not None else num_nodes,
            names=("--time.latency", "--time.bandwidth", "--time.downlink"),
            downlink=self.downlink_values(n, seed),
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
        named in ``cycled`` is ``[R, N]`` per node, one in ``edge_cycled`` ``[R, E]`` per edge of a
        static graph, row ``r mod R`` in round r.
      senders: ``[T, E]`` int32 (graph) or None.
      real: ``[T, E]`` bool, a real edge: weight != 0 and not a self loop (graph) or None.
      degree: ``[T, N]`` out-degrees (graph), the mean out-degree (``"mean"``) or None.
      kind: static; ``"graph"`` (a fixed graph priced per edge), ``"mean"`` (a stochastic graph:
        ``degree`` equal messages over the uplink), ``"ring"`` or ``"message"`` (all-reduce).
      mode: static, ``"serial"`` or ``"parallel"``.
      exchanges: static, I.
      num_nodes: static, N.
      cycled: static, the per-node fields (``"latency"``, ``"bandwidth"``, ``"downlink"``) that
        change with the round.
      downlink: None (not modelled), ``[N]`` or (cycled) ``[R, N]`` bit/s of each node's downlink.
      receivers: ``[T, E]`` int32 (graph, with a downlink) or None.
      edge_cycled: static, the per-edge fields that change with the round (``[R, E]``).
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
    downlink: Any = None
    receivers: Any = None
    edge_cycled: tuple = ()


jax.tree_util.register_dataclass(
    Links,
    data_fields=["latency", "bandwidth", "senders", "real", "degree", "downlink", "receivers"],
    meta_fields=["kind", "mode", "exchanges", "num_nodes", "cycled", "edge_cycled"],
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
    names: tuple[str, ...] = ("latency", "bandwidth", "downlink"),
    downlink: Any = None,
) -> Links:
    """The :class:`Links` of a run on ``topology`` (or of an all-reduce).

    Args:
      topology: the run's graph (a fixed one is priced per edge; a stochastic one by its mean
        out-degree); ignored with ``allreduce`` (then give ``num_nodes``, or the topology for N).
      latency: >= 0 s per message; scalar, ``[N]``, ``[T, E]`` (fixed graphs only),
        :class:`PerRound` ``[R, N]`` (per node, row ``r mod R`` in round r) or
        :class:`PerRoundEdge` ``[R, E]`` (per edge of a static graph).
      bandwidth: > 0 bit/s of the uplinks; same shapes.
      mode: ``"serial"`` or ``"parallel"`` (see the module docstring).
      exchanges: I >= 1 sequential exchanges per round.
      allreduce: None (gossip on the graph), ``"ring"`` or ``"message"``.
      num_nodes: N, when there is no topology.
      names: how error messages call ``latency``, ``bandwidth`` and ``downlink``.
      downlink: None (not modelled), > 0 bit/s of each node's downlink: scalar, ``[N]`` or
        :class:`PerRound` ``[R, N]``; fixed graphs and all-reduces only.

    Raises:
      ValueError: a value out of range, a wrong shape, an unknown mode or model, a downlink or
        per-edge values on a stochastic graph.
    """
    lat_name, bw_name = names[:2]
    down_name = names[2] if len(names) > 2 else "downlink"
    given = (("latency", latency), ("bandwidth", bandwidth), ("downlink", downlink))
    cycled = tuple(f for f, v in given if isinstance(v, PerRound))
    edge_cycled = tuple(f for f, v in given if isinstance(v, PerRoundEdge))
    latency, bandwidth, downlink = (v.values if isinstance(v, (PerRound, PerRoundEdge)) else v for _, v in given)
    check_number(lat_name, latency, minimum=0.0)
    check_number(bw_name, bandwidth, minimum=0.0, strict=True)
    if downlink is not None:
        check_number(down_name, downlink, minimum=0.0, strict=True)
    if mode not in LINK_MODES:
        raise ValueError(f"mode={mode!r} is unknown; known modes: {', '.join(LINK_MODES)}")
    if isinstance(exchanges, bool) or not isinstance(exchanges, (int, np.integer)) or exchanges < 1:
        raise ValueError(f"exchanges must be an int >= 1; got {exchanges!r}")
    n = num_nodes if topology is None else topology.num_nodes
    if n is None:
        raise ValueError("make_links needs a topology or num_nodes")
    named = ((lat_name, latency, "latency"), (bw_name, bandwidth, "bandwidth"), (down_name, downlink, "downlink"))
    for name, value, field in named:
        if field in cycled and (np.ndim(value) != 2 or np.shape(value)[1] != n):
            raise ValueError(f"{name} per round must have shape [R, N] = [R, {n}]; got {np.shape(value)}")
    if downlink is not None and "downlink" not in cycled and np.ndim(downlink) > 1:
        raise ValueError(f"{down_name} is a node's: a scalar, [N] or [R, N] per round; got shape {np.shape(downlink)}")
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
        down = None if downlink is None else per_node(down_name, downlink, "downlink")
        return Links(lat, bw, None, None, None, allreduce, mode, 1, n, cycled, down)
    if topology.stochastic and downlink is not None:
        raise ValueError(
            f"{down_name} needs a fixed graph: {topology.name} is drawn every round, so the receivers of a "
            "node's messages are not known where its round is priced; leave the downlink unlimited"
        )
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
        if field in edge_cycled:  # [R, E]: row r mod R in round r (comm_seconds)
            if np.shape(senders)[0] != 1 or np.ndim(value) != 2 or np.shape(value)[1] != np.shape(senders)[1]:
                raise ValueError(
                    f"{name} per edge and round must have shape [R, E] = [R, {np.shape(senders)[1]}] on a static "
                    f"graph; got {np.shape(value)} on {np.shape(senders)[0]} graphs"
                )
            return jnp.asarray(value, jnp.result_type(float))
        if np.ndim(value) == 2:
            if np.shape(value) != np.shape(senders):
                raise ValueError(f"{name} per edge must have shape [T, E] = {np.shape(senders)}; got {np.shape(value)}")
            return jnp.asarray(value, jnp.result_type(float))
        return _as_node_array(name, value, n)[senders]

    degree = xp.asarray(topology.out_degree, np.float64 if xp is np else jnp.result_type(float))
    down = receivers = None
    if downlink is not None:
        down = per_node(down_name, downlink, "downlink")
        receivers = xp.asarray(topology.receivers, xp.int32)
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
        down,
        receivers,
        edge_cycled,
    )


def comm_seconds(links: Links, bits: Array, t: Any) -> Array:
    """``c_i``: seconds each node spends on its messages of round ``t`` (module docstring).

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

    def node_value(field):  # [N] this round's value of each node's uplink (or downlink)
        value = jnp.asarray(getattr(links, field))
        return value[jnp.asarray(t, jnp.int32) % value.shape[0]] if field in links.cycled else value

    down = None if links.downlink is None else node_value("downlink")
    if kind in ALLREDUCE_MODELS:
        steps, chunk = (2 * (n - 1), n) if kind == "ring" else (1, 1)
        lat, bw = node_value("latency"), node_value("bandwidth")
        if down is not None:  # a node sends and receives a chunk per step: the slower side bounds it
            bw = jnp.minimum(bw, down)
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
        if field in links.cycled:
            return node_value(field)[senders]
        value = jnp.asarray(getattr(links, field))
        return value[jnp.asarray(t, jnp.int32) % value.shape[0]] if field in links.edge_cycled else value[idx]

    message = bits / jnp.maximum(degree, 1) / exchanges  # [N] bits per message
    size = message[senders]  # [E]
    bandwidth = edge_value("bandwidth")
    if down is not None:  # a message goes no faster than its receiver's downlink
        receivers = jnp.asarray(links.receivers)[idx]
        bandwidth = jnp.minimum(bandwidth, down[receivers])
    edge = jnp.where(real & (size > 0), edge_value("latency") + size / bandwidth, 0).astype(dtype)
    zeros = jnp.zeros([n], dtype)
    comm = zeros.at[senders].add(edge) if mode == "serial" else zeros.at[senders].max(edge)
    if down is None or mode == "parallel":
        return exchanges * comm
    # serial: the I messages from each in-neighbour share the receiver's downlink as well
    incoming = zeros.at[receivers].add(jnp.where(real, size, 0).astype(dtype))
    return jnp.maximum(exchanges * comm, exchanges * incoming / down)
