"""The graph type: a communication graph as index arrays with weights, registered as a pytree.

Convention: ``x_new = W @ x`` where ``W[i, j]`` is the weight *receiver* ``i`` puts on the value
sent by ``j``. A :class:`Topology` stores, for each of its ``T`` rounds (``T = 1`` for static
graphs), the edge list ``senders [T, E]``, ``receivers [T, E]``, ``weights [T, E]``; self-loops are
edges, and rounds with fewer edges are padded with weight-0 edges. Round ``t`` of a run uses the
graph ``t mod T``. Graphs on the slot layout also carry the in-neighbour slot table
``neighbors, slot_weights [T, N, K]`` (:func:`jaxgossip.topology.layout.slot_table`).

The tables are the pytree leaves; the static facts (name, N, directedness, stochasticity, kernel
layout) are auxiliary data, and T, E and K are read from the leaves' shapes. So one type serves:

* a graph built on the host: NumPy leaves, closed over by jitted code as constants (mixing then
  specializes on them, e.g. ``jnp.roll`` for circulant slot columns);
* a stack of G graphs (:func:`jaxgossip.topology.stack`): the same leaves with a leading graph
  axis ``[G, T, ...]``;
* one member of a stack under ``jax.vmap``, or a graph whose tables a traced function produced:
  traced leaves ``[T, ...]`` (:meth:`Topology.from_tables`);
* a stochastic graph (:mod:`jaxgossip.topology.stochastic`: ``random_matching``, ``random_out``,
  ``with_failures``): no tables at all (the leaves are None) but a *sampler*, auxiliary data, that
  draws round t's graph from a key inside the compiled run. Algorithms reach the graph of a round
  through :meth:`Topology.draw`, which returns the topology itself for a fixed graph, so a fixed
  graph runs exactly as if the algorithm used it directly.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.checks import is_concrete
from jaxgossip.topology.edges import transpose_check
from jaxgossip.topology.facts import HostFacts, count_at, host_facts
from jaxgossip.topology.facts import self_weights as diagonal_weights
from jaxgossip.topology.layout import KERNELS, choose_kernel, slot_layout, slot_table
from jaxgossip.topology.moves import gather_free, round_moves

__all__ = ["Topology", "TopologyKey", "GraphRound", "KERNELS"]

_TOL = 1e-6
# A graph keeps its slot table when it holds at most this many entries per edge, or for
# kernel="slots": a hub's in-degree (a star) makes T N K grow as N^2 while E grows as N.
_SLOT_ENTRIES_PER_EDGE = 8
# Beyond the graph's own table, :attr:`Topology.slots` builds one on first use up to this many
# entries (2^24 entries are 200 MB of neighbours and weights) and refuses a larger one.
_MAX_SLOT_ENTRIES = 2**24
# The stream of a round's key that draws a stochastic graph: the step key itself stays with the
# algorithm (random compressors), so fixed graphs see exactly the keys they saw before.
_GRAPH_STREAM = 0x67726170
_LEAVES = ("senders", "receivers", "weights", "neighbors", "slot_weights", "draw_args")


class GraphRound(NamedTuple):
    """The graph of one round, as :meth:`Topology.draw` returns it.

    Attributes:
      graph: the round's :class:`Topology`: the topology itself for a fixed graph, else a one-round
        graph with traced tables ``[1, E]`` (mix it with any round counter).
      alive: [N] bool, the nodes that communicate this round; None when all do.
      pair_keep: [P] bool, for failures of an undirected graph: whether each undirected pair of
        the support (sorted codes ``a * N + b``, ``a < b``, :attr:`pair_codes` of the sampler) is
        up this round; None otherwise.
      lost: for failures, the one-round graph of what the failures took away, ``W - W(t)`` (the
        failed edges' weights, minus the repaired weight on the diagonal; all zero when nothing
        failed), so that ``W(t) x = W x - lost x``; None otherwise.
    """

    graph: Topology
    alive: Any = None
    pair_keep: Any = None
    lost: Any = None


@dataclasses.dataclass(frozen=True, eq=False)
class Topology:
    """A static or time-varying communication graph with mixing weights.

    Built on the host from an edge list (the constructors in :mod:`jaxgossip.topology` do this);
    everything else is derived at construction: the slot table, the kernel layout ``mix`` uses and
    the stochasticity of the weights. A registered pytree: the five tables are the leaves, the other
    fields auxiliary data; stacks and traced tables are built with :meth:`from_tables`.

    Attributes:
      name: human-readable description, e.g. ``"ring(8)"``.
      num_nodes: N.
      senders: [T, E] int32, the node whose value an edge carries.
      receivers: [T, E] int32, the node that adds ``weight * x[sender]``.
      weights: [T, E] float64, ``W_t[receiver, sender]``; padding edges have weight 0.
      directed: whether the underlying graph is directed (edges need not be reciprocated).
      kernel: the requested mixing kernel, one of ``"auto"``, ``"slots"``, ``"dense"``,
        ``"segment"``; :attr:`resolved_kernel` is the one ``mix`` uses.
      neighbors, slot_weights: [T, N, K] in-neighbour slot table (derived; None in a stack of a
        dense or segment layout, and for a host graph whose table would exceed both 2^24 entries and
        8 E, e.g. a star of N > 4096, whose hub's in-degree makes it O(N^2); the dense and segment
        kernels do not read it).
      layout: the resolved kernel, ``"slots"``, ``"dense"`` or ``"segment"`` (derived).
      row_stochastic, column_stochastic: whether every W(t) has rows / columns summing to 1
        (derived).
      sampler: None for a fixed graph; for a stochastic graph the object that draws round t's
        tables (:mod:`jaxgossip.topology.stochastic`), and the tables are None.
      draw_args: the sampler's numeric arguments as pytree leaves (``with_failures``: float32
        ``link_drop`` and ``node_drop``), None for other graphs. Leaves rather than auxiliary data so
        that a sweep over failure probabilities is one program: :func:`jaxgossip.topology.stack`
        stacks them to ``[G]`` and ``jax.vmap`` hands each member traced scalars.
    """

    name: str
    num_nodes: int
    senders: Any
    receivers: Any
    weights: Any
    directed: bool
    kernel: str = "auto"
    neighbors: Any = dataclasses.field(default=None, init=False)
    slot_weights: Any = dataclasses.field(default=None, init=False)
    layout: str = dataclasses.field(default="", init=False)
    row_stochastic: bool = dataclasses.field(default=False, init=False)
    column_stochastic: bool = dataclasses.field(default=False, init=False)
    sampler: Any = dataclasses.field(default=None, init=False)
    draw_args: Any = dataclasses.field(default=None, init=False)

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel={self.kernel!r} is unknown; known kernels: {KERNELS}")
        senders, receivers, weights = (np.asarray(a) for a in (self.senders, self.receivers, self.weights))
        shapes = {senders.shape, receivers.shape, weights.shape}
        if len(shapes) != 1 or senders.ndim != 2:
            raise ValueError(
                "senders, receivers and weights must share one [T, E] shape; got "
                f"{senders.shape}, {receivers.shape}, {weights.shape}"
            )
        # A slot table far larger than the edge list (a hub's in-degree, e.g. a star) is left out
        # unless the slot kernel is asked for: the dense and segment kernels do not read it, and
        # the algorithms that do get it from ``slots`` when they ask.
        cap = None if self.kernel == "slots" else _SLOT_ENTRIES_PER_EDGE * weights.size
        slots = slot_layout(senders, receivers, weights, self.num_nodes, max_entries=cap)
        nbr, slot_w = slots.neighbors, slots.weights
        moves = None if nbr is None else [round_moves(a, b) for a, b in zip(nbr, slot_w)]
        facts = host_facts(senders, receivers, weights, self.num_nodes, nbr, slot_w, moves, slots.regular, _TOL)
        layout = self.kernel
        if layout == "auto":
            max_edges = max(int(np.count_nonzero(w)) for w in weights)  # per round: no [T, E] mask
            layout = choose_kernel(self.num_nodes, max_edges, slots.width)
            if layout == "segment" and nbr is not None and gather_free(nbr, slot_w, moves):
                layout = choose_kernel(self.num_nodes, max_edges, slots.width, gather_free=True)
        if layout == "slots" and nbr is None:
            nbr, slot_w = slot_layout(senders, receivers, weights, self.num_nodes)[:2]
        derived = dict(
            senders=senders,
            receivers=receivers,
            weights=weights,
            neighbors=nbr,
            slot_weights=slot_w,
            layout=layout,
            row_stochastic=_all_one(facts.row_sum_range),
            column_stochastic=_all_one(facts.col_sum_range),
        )
        for field, value in derived.items():
            object.__setattr__(self, field, value)
        # The per-node tables and the symmetry of a host graph, computed once here and kept on the
        # instance (not pytree data: a graph rebuilt from its leaves, e.g. a traced one, derives
        # them from its tables on access).
        object.__setattr__(self, "_host_facts", facts)
        object.__setattr__(self, "_slot_width", slots.width)

    @classmethod
    def from_tables(cls, tables: dict[str, Any], **facts: Any) -> Topology:
        """A topology from ready tables, without host-side checks or derivations (jittable).

        For stacks and for graphs whose tables are computed inside a compiled program (e.g. drawn
        per round from a key). The tables must follow the layout conventions: weight-0 padding,
        and slot 0 of ``neighbors`` the node itself.

        Args:
          tables: ``senders, receivers, weights`` [..., T, E], and for ``layout="slots"``
            ``neighbors, slot_weights`` [..., T, N, K].
          **facts: ``name, num_nodes, directed, layout, row_stochastic, column_stochastic`` (all
            required) and optionally ``kernel`` (default: the layout).
        """
        missing = {"name", "num_nodes", "directed", "layout", "row_stochastic", "column_stochastic"} - set(facts)
        if missing:
            raise ValueError(f"from_tables needs the facts {sorted(missing)}")
        if facts["layout"] not in KERNELS[1:]:
            raise ValueError(f"layout={facts['layout']!r} is unknown; layouts: {KERNELS[1:]}")
        if facts["layout"] == "slots" and tables.get("neighbors") is None:
            raise ValueError("layout='slots' needs the tables 'neighbors' and 'slot_weights'")
        return cls._assemble(tables, {"kernel": facts["layout"], "sampler": None, **facts})

    def with_weights(self, weights: Any) -> Topology:
        """The same graph with other weights on its edges, e.g. traced ones to differentiate a run
        with respect to the mixing weights (``jax.grad`` through ``consensus_scan``).

        The edges are those of this graph: ``weights`` [T, E] replaces :attr:`weights` entry for
        entry, and the slot table takes each edge's new weight in the edge's slot. Padding edges
        (weight 0 here) have no slot, so their entries do not act. The stochasticity and symmetry
        facts are this graph's: they are not checked again on traced weights, so a caller that
        leaves the doubly stochastic set (e.g. a finite-difference step) gets the run of that
        matrix, as a derivative needs.

        Args:
          weights: [T, E] array, or anything ``jnp.asarray`` takes (traced under jit / grad).

        Returns:
          A :class:`Topology` with device tables (the weights traced when ``weights`` is), the
          same layout and facts.

        Raises:
          ValueError: a stochastic, stacked or traced graph, or ``weights`` of another shape.
        """
        self._fixed("edge weights")
        if self.num_graphs is not None or not self.host_tables:
            raise ValueError(
                f"with_weights needs one graph built on the host; {self.name} has stacked or traced tables"
            )
        weights = jnp.asarray(weights)
        if weights.shape != self.weights.shape:
            raise ValueError(
                f"with_weights needs weights of shape {self.weights.shape} (T, E) of {self.name}; got {weights.shape}"
            )
        tables = dict(senders=jnp.asarray(self.senders), receivers=jnp.asarray(self.receivers), weights=weights)
        if self.neighbors is not None:
            # The slot of every edge: the slot table of the edge ids (1-based; 0 marks an empty slot).
            period, num_edges = self.weights.shape
            ids = np.where(self.weights != 0, np.arange(1, num_edges + 1, dtype=np.float64)[None], 0.0)
            _, slot_ids = slot_table(self.senders, self.receivers, ids, self.num_nodes)
            slot_ids = slot_ids.astype(np.int64)
            flat = np.where(slot_ids > 0, np.arange(period)[:, None, None] * num_edges + slot_ids - 1, 0)
            tables["neighbors"] = jnp.asarray(self.neighbors)
            tables["slot_weights"] = jnp.where(slot_ids > 0, weights.reshape(-1)[flat], 0)
        facts = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _LEAVES}
        return Topology._assemble(tables, facts)

    @classmethod
    def from_sampler(cls, sampler: Any, draw_args: Any = None, **facts: Any) -> Topology:
        """A stochastic topology: no tables, a sampler that draws each round's graph.

        Args:
          sampler: an object with ``draw(key, t, draw_args) -> GraphRound`` and the attributes
            ``period``, ``num_edges``, ``symmetric`` and ``support`` (see
            :mod:`jaxgossip.topology.stochastic`); auxiliary data, so equal samplers share a compile.
          draw_args: the sampler's traceable arguments (a pytree of arrays, or None).
          **facts: as for :meth:`from_tables`; the stochasticity facts are the sampler's promise
            for every round it draws.
        """
        return cls._assemble({"draw_args": draw_args}, {"kernel": facts["layout"], "sampler": sampler, **facts})

    @classmethod
    def _assemble(cls, tables: dict[str, Any], facts: dict[str, Any]) -> Topology:
        # Bypasses __init__: the tables may be tracers, device arrays or JAX's placeholders.
        topology = object.__new__(cls)
        for field in dataclasses.fields(cls):
            value = tables.get(field.name) if field.name in _LEAVES else facts[field.name]
            object.__setattr__(topology, field.name, value)
        return topology

    # ---- pytree ------------------------------------------------------------------------------
    def tree_flatten(self):
        children = tuple(getattr(self, name) for name in _LEAVES)
        aux = tuple((f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in _LEAVES)
        return children, aux

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls._assemble(dict(zip(_LEAVES, children)), dict(aux))

    # ---- stochastic graphs ---------------------------------------------------------------------
    @property
    def stochastic(self) -> bool:
        """Whether the graph is drawn anew every round (:mod:`jaxgossip.topology.stochastic`)."""
        return self.sampler is not None

    @property
    def support(self) -> Topology | None:
        """The fixed graph every round's edges are drawn from: the topology itself for a fixed
        graph, the wrapped graph for ``with_failures``, None for graphs whose neighbours change
        every round (``random_matching``, ``random_out``)."""
        return self.sampler.support if self.stochastic else self

    def draw(self, key: Any, t: Any) -> Any:
        """The graph of round ``t``: the accessor every algorithm uses once per step.

        A fixed graph returns itself (``GraphRound(self, None, None)``), so its algorithms run
        exactly as on the graph itself; a stochastic graph draws round t from
        ``fold_in(key, stream)`` with its sampler: a one-round :class:`Topology` (traced tables
        ``[1, E]``), the nodes that communicate (``alive`` [N] bool) and, for failures of an
        undirected graph, which of the support's undirected pairs are up (``pair_keep`` [P] bool).

        Args:
          key: the step's PRNG key (the runners derive it from the run key and the round).
          t: round counter (the algorithm's state count), Python int or traced int.

        Returns:
          a :class:`GraphRound`.
        """
        if not self.stochastic:
            return GraphRound(self, None, None)
        if self.num_graphs is not None:
            raise ValueError(
                f"{self.name} is a stack of {self.num_graphs} stochastic graphs: jax.vmap over its leading axis "
                "(jaxgossip.engine.sweeps.map_topologies does) and draw from each member"
            )
        return self.sampler.draw(jax.random.fold_in(key, _GRAPH_STREAM), t, self.draw_args)

    def _fixed(self, what: str) -> None:
        if self.stochastic:
            raise ValueError(
                f"{self.name} is a stochastic graph: it has no fixed {what}. Draw a round with "
                "topology.draw(key, t).graph, or sample matrices with "
                "jaxgossip.topology.sample_matrices(topology, keys)"
            )

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def period(self) -> int:
        """T, the number of distinct rounds before the schedule repeats (for a stochastic graph,
        the period of the graph it draws from: a failure-wrapped schedule's T, else 1)."""
        if self.stochastic:
            return self.sampler.period
        return int(jnp.shape(self.senders)[-2])

    @property
    def num_edges(self) -> int:
        """E, padded edge count per round (self-loops included)."""
        if self.stochastic:
            return self.sampler.num_edges
        return int(jnp.shape(self.senders)[-1])

    @property
    def num_graphs(self) -> int | None:
        """G for a stack (tables ``[G, T, ...]``, or stochastic ``draw_args [G]``), None for a single graph."""
        if self.stochastic:
            leaves = jax.tree_util.tree_leaves(self.draw_args)
            return int(jnp.shape(leaves[0])[0]) if leaves and jnp.ndim(leaves[0]) == 1 else None
        return int(jnp.shape(self.senders)[0]) if jnp.ndim(self.senders) == 3 else None

    @property
    def time_varying(self) -> bool:
        """Whether W changes between rounds (period > 1, or a stochastic graph)."""
        return self.period > 1 or self.stochastic

    @property
    def host_tables(self) -> bool:
        """Whether the tables are NumPy arrays (built on the host; static under ``jit``)."""
        return isinstance(self.senders, np.ndarray)

    @property
    def resolved_kernel(self) -> str:
        """The kernel layout ``mix`` uses: the requested one, or for ``"auto"`` the measured choice
        (:func:`jaxgossip.topology.layout.choose_kernel`)."""
        return self.layout

    @property
    def slots(self) -> tuple[Any, Any]:
        """In-neighbour slot table: ``(neighbors [T, N, K] int32, weights [T, N, K] float64)``.

        ``W_t @ x == sum_k weights[t, :, k, None] * x[neighbors[t, :, k]]``. K is the largest
        in-degree (self included) over all rounds; unused slots point at the node itself with
        weight 0. Slot 0 always holds the self-loop.
        """
        if self.neighbors is None and self.host_tables and self.num_graphs is None:
            table = self._late_slots()
            if table.neighbors is None:
                raise ValueError(
                    f"{self.name} has no slot table: T N K = {self.period} x {self.num_nodes} x {table.width} "
                    f"entries (K the largest in-degree, self included) would dwarf its {self.num_edges} edges; "
                    "build it with kernel='slots' to have one"
                )
            return table.neighbors, table.weights
        return self.neighbors, self.slot_weights

    def _late_slots(self):
        """The slot table of a host graph built without one (:attr:`slots`), made on first use and
        kept on the instance (not pytree data); its tables are None beyond ``_MAX_SLOT_ENTRIES``."""
        table = self.__dict__.get("_late_slot_table")
        if table is None:
            table = slot_layout(self.senders, self.receivers, self.weights, self.num_nodes, _MAX_SLOT_ENTRIES)
            object.__setattr__(self, "_late_slot_table", table)
        return table

    @property
    def max_slots(self) -> int:
        """K of the slot table: the largest in-degree, self included."""
        self._fixed("slot table")
        if self.neighbors is None and self.host_tables and self.num_graphs is None:
            width = self.__dict__.get("_slot_width")
            return self._late_slots().width if width is None else width
        return int(jnp.shape(self.slots[0])[-1])

    def __repr__(self) -> str:
        graphs = "" if self.num_graphs is None else f"G={self.num_graphs}, "
        return (
            f"Topology({self.name}, {graphs}N={self.num_nodes}, T={self.period}, E={self.num_edges}, "
            f"directed={self.directed}, kernel={self.resolved_kernel})"
        )

    # ---- dense views (tests, tiny graphs, analysis; host tables only) ------------------------
    def matrix(self, t: int = 0) -> np.ndarray:
        """Dense mixing matrix ``W(t)``, numpy [N, N] float64 (round ``t mod T``)."""
        self._fixed("mixing matrix")
        t = int(t) % self.period
        w = np.zeros((self.num_nodes, self.num_nodes))
        np.add.at(w, (self.receivers[t], self.senders[t]), self.weights[t])
        return w

    def matrices(self) -> np.ndarray:
        """All mixing matrices, numpy [T, N, N] float64."""
        return np.stack([self.matrix(t) for t in range(self.period)])

    # ---- stochasticity -----------------------------------------------------------------------
    @property
    def is_row_stochastic(self) -> bool:
        return self.row_stochastic

    @property
    def is_column_stochastic(self) -> bool:
        return self.column_stochastic

    @property
    def is_doubly_stochastic(self) -> bool:
        return self.row_stochastic and self.column_stochastic

    @property
    def is_symmetric(self) -> bool:
        """Whether every W(t) is symmetric, checked on the edge list (O(E), no [N, N] matrix):
        the weights summed per (receiver, sender) must equal those summed per (sender, receiver).
        For a stochastic graph, the sampler's promise for every round it draws."""
        if self.stochastic:
            return self.sampler.symmetric
        facts = self._facts()
        if facts is not None:
            return facts.symmetric
        return _is_symmetric(*(np.asarray(x) for x in (self.senders, self.receivers, self.weights)), self.num_nodes)

    # ---- per-node tables for bit accounting ----------------------------------------------------
    @property
    def out_degree(self) -> Any:
        """[T, N] int: out-neighbours (self excluded) each node sends to in round t ([G, T, N] for a
        stack; a traced array for traced tables)."""
        self._fixed("out-degree table")
        facts = self._facts()
        return facts.out_degree if facts is not None else _count_per_node(self, self.senders)

    @property
    def in_degree(self) -> Any:
        """[T, N] int: in-neighbours (self excluded) each node receives from in round t."""
        self._fixed("in-degree table")
        facts = self._facts()
        return facts.in_degree if facts is not None else _count_per_node(self, self.receivers)

    @property
    def self_weights(self) -> Any:
        """[T, N]: the diagonal ``W_t[i, i]`` (float64 NumPy for host tables; for traced tables a
        float32 ``segment_sum`` of the self-loops per round)."""
        self._fixed("self weights")
        facts = self._facts()
        if facts is not None:
            return facts.self_weights
        if self.host_tables:
            return diagonal_weights(self.senders, self.receivers, self.weights, self.num_nodes)
        n = self.num_nodes
        own = jnp.where(self.senders == self.receivers, self.weights, 0).astype(jnp.float32)
        per_round = jax.vmap(lambda r, w: jax.ops.segment_sum(w, r, num_segments=n))
        return per_round(jnp.reshape(self.receivers, (-1, self.num_edges)), jnp.reshape(own, (-1, self.num_edges)))

    def _facts(self) -> HostFacts | None:
        """The facts ``__post_init__`` derived from host tables still held; None for a graph built
        from its leaves (stacks, traced tables, stochastic graphs)."""
        return self.__dict__.get("_host_facts")

    # ---- value identity --------------------------------------------------------------------------
    def value_key(self) -> tuple:
        """A hashable key equal for equal graphs: the auxiliary facts (a stochastic graph's sampler
        among them) and a digest of every table's shape, dtype and bytes (so two ``ring(16)`` built
        apart have equal keys, while a Topology itself hashes by identity). Concrete tables only
        (host or device arrays, not tracers)."""
        children, aux = self.tree_flatten()
        digest = hashlib.sha256()
        for leaf in jax.tree_util.tree_leaves(children):
            if not is_concrete(leaf):
                raise TypeError(f"value_key of {self.name} needs concrete tables, got a traced one")
            table = np.ascontiguousarray(leaf)
            digest.update(f"{table.shape}{table.dtype.str}".encode())
            digest.update(table.tobytes())
        return aux, digest.hexdigest()


jax.tree_util.register_pytree_node(Topology, Topology.tree_flatten, Topology.tree_unflatten)


@dataclasses.dataclass(frozen=True)
class TopologyKey:
    """A topology as a cache key that hashes and compares by :meth:`Topology.value_key` (equal graphs
    share a cache entry); ``topology`` is the graph itself, left out of hash and equality."""

    key: tuple
    topology: Topology = dataclasses.field(compare=False, repr=False)

    @classmethod
    def of(cls, topology: Topology) -> TopologyKey:
        return cls(topology.value_key(), topology)


def _all_one(ranges: np.ndarray) -> bool:
    """``np.allclose(sums, 1.0, atol=_TOL)`` (rtol 1e-5) of every round's sums from their least
    and largest values ``ranges [T, 2]``; NaN fails. ``max_i |s_i - 1|`` is
    ``max(max(s) - 1, 1 - min(s))``: rounding ``s - 1`` is monotone in s."""
    bound = _TOL + 1e-5
    return bool(np.max(ranges[:, 1]) - 1.0 <= bound) and bool(1.0 - np.min(ranges[:, 0]) <= bound)


def _is_symmetric(senders: np.ndarray, receivers: np.ndarray, weights: np.ndarray, n: int) -> bool:
    """Whether every round's weights summed per (receiver, sender) equal those per (sender, receiver)."""
    for s, r, w in zip(senders, receivers, weights):
        if not all(transpose_check(s, r, w, n, atol=_TOL)):
            return False
    return True


def _count_per_node(topology: Topology, endpoint: Any) -> Any:
    """[T, N]: real (weight != 0) non-self edges per node, counted at ``endpoint`` (senders or
    receivers). NumPy for host tables; for traced tables a ``segment_sum`` per round."""
    real = (topology.weights != 0) & (topology.senders != topology.receivers)
    n = topology.num_nodes
    if topology.host_tables:
        shape = endpoint.shape
        ends, keep = endpoint.reshape(-1, shape[-1]), real.reshape(-1, shape[-1])
        return np.stack([count_at(e, k, n) for e, k in zip(ends, keep)]).reshape(shape[:-1] + (n,))
    shape = jnp.shape(endpoint)
    count = jax.vmap(lambda ends, keep: jax.ops.segment_sum(keep.astype(jnp.int32), ends, num_segments=n))
    deg = count(jnp.reshape(endpoint, (-1, shape[-1])), jnp.reshape(real, (-1, shape[-1])))
    return jnp.reshape(deg, shape[:-1] + (n,))
