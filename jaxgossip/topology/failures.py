"""Failures of any graph, drawn inside the compiled run like the stochastic graphs of
:mod:`jaxgossip.topology.stochastic`: :func:`with_failures` drops every edge with probability p and
every node with probability q, independently every round, and repairs the weights so that the
graph's invariant holds; :func:`with_availability` takes the nodes' availability from a given
[rounds, N] trace instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.checks import any_traced, is_concrete
from jaxgossip.topology.coins import coins as draw_coins
from jaxgossip.topology.coins import folded_uniform, hashed_coins
from jaxgossip.topology.edges import is_canonical
from jaxgossip.topology.graph import GraphRound, Topology
from jaxgossip.topology.layout import slot_edges
from jaxgossip.topology.moves import circulant_shift
from jaxgossip.topology.random_spectra import SparseGram
from jaxgossip.topology.stochastic import one_round

__all__ = ["with_failures", "with_availability"]


# ---- failures ------------------------------------------------------------------------------------

# Up to N^2 = this, the pair code ``min * N + max`` of a drawn undirected edge fits int32 (N <= 46,340).
_CODE_LIMIT = 2**31 - 1


def _known_zero(probability: Any) -> bool:
    """Whether a failure probability is a concrete 0 (not traced), so that its draw can be skipped."""
    return is_concrete(probability) and np.ndim(probability) == 0 and float(probability) == 0.0


def _check_drop(name: str, value: Any) -> Any:
    """A failure probability as a float32 scalar. A concrete value must lie in [0, 1); a traced
    one (``with_failures`` called inside ``jax.vmap`` or ``jit``) cannot be checked here, only its
    shape: its range is the caller's promise."""
    if not is_concrete(value):
        if jnp.ndim(value) != 0 or not jnp.issubdtype(value.dtype, jnp.floating):
            raise TypeError(f"{name} must be a scalar float probability, got a traced {value.dtype}{list(value.shape)}")
        return value.astype(jnp.float32)
    if isinstance(value, (np.ndarray, jax.Array)) and np.ndim(value) == 0 and np.issubdtype(value.dtype, np.floating):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}={value!r} must be a probability in [0, 1), a real number")
    value = float(value)
    if not 0.0 <= value < 1.0:  # also rejects NaN
        raise ValueError(f"{name}={value!r} must be a probability in [0, 1) (1 would drop every round)")
    return np.float32(value)


def _base_identity(topology: Topology) -> tuple:
    """What makes two wrapped graphs the same for compilation: the sampler of a stochastic graph,
    else the facts and the bytes of the host tables (so two ``ring(16)`` built apart are equal)."""
    if topology.stochastic:
        return ("stochastic", topology.sampler)
    digest = hashlib.sha256()
    for table in (topology.senders, topology.receivers, topology.weights):
        digest.update(np.ascontiguousarray(table).tobytes())
        digest.update(str(table.shape).encode())
    facts = (topology.name, topology.num_nodes, topology.directed, topology.resolved_kernel)
    return ("fixed", facts, digest.hexdigest())


@dataclasses.dataclass(frozen=True)
class _FailureSampler:
    """Failures of a graph ``base``: a fixed graph (host tables [T, E]) or a stochastic one (its
    round drawn first, then failed). The probabilities are not fields but the topology's
    ``draw_args`` (pytree leaves), so failures of one graph at several p share one sampler, one
    signature and one compiled program (equality and hash: ``identity`` only).

    Fixed base: ``unit[t, e]`` is the coin an edge uses (its undirected pair for
    ``repair="symmetric"``, its own slot e for ``repair="sender"``), one uniform draw of
    ``num_units`` per round. Stochastic base: a symmetric edge's coin is drawn from its pair code
    ``min * N + max`` (both directions agree; above N = 46,340, where that code would wrap in int32,
    from ``min`` and ``max`` folded into the key in turn), a directed edge's from its slot. ``slot_edge[t, i, k]``
    is the edge behind slot k of node i (slot layout only). See :func:`with_failures`.

    ``slot_unit[t, i, k]`` (fixed symmetric base on the slot layout) is the coin of the edge in
    slot k of node i, -1 where the slot holds no real edge: the slot weights are drawn from it
    directly, without the edge list; ``slot_order`` says whether a row's lost weights must be
    summed in edge order (:func:`_slot_order_matters`).
    """

    identity: tuple  # (repair, _base_identity(base)), then ("hash",) for hashed coins
    base: Topology = dataclasses.field(compare=False)
    repair: str = dataclasses.field(compare=False)  # "symmetric" (doubly stochastic) or "sender" (column)
    name: str = dataclasses.field(compare=False)
    unit: np.ndarray | None = dataclasses.field(compare=False)  # [T, E] int32 (fixed base)
    num_units: int = dataclasses.field(compare=False)
    pair_codes: np.ndarray | None = dataclasses.field(compare=False)  # [P] int64 sorted a * N + b
    pair_ends: tuple | None = dataclasses.field(compare=False)  # ([P], [P]) int32 endpoints a < b
    slot_edge: np.ndarray | None = dataclasses.field(compare=False)  # [T, N, K] int32
    slot_unit: np.ndarray | None = dataclasses.field(default=None, compare=False)  # [T, N, K] int32
    slot_order: bool = dataclasses.field(default=True, compare=False)
    coins: str = dataclasses.field(default="threefry", compare=False)  # or "hash" (part of identity)

    @property
    def support(self) -> Topology | None:
        return self.base.support

    @property
    def period(self) -> int:
        return self.base.period

    @property
    def num_edges(self) -> int:
        return self.base.num_edges + self.base.num_nodes

    @property
    def symmetric(self) -> bool:
        return self.repair == "symmetric"

    def exact_gram(self, draw_args) -> SparseGram | None:
        """``E[W(t)^T W(t)]`` in closed form for a static symmetric base with independent drops
        (None otherwise: a stochastic base, a schedule, sender repair, an availability mask, traced
        probabilities). Write the base ``W = I - L``, L the weighted Laplacian
        ``sum_e w_e L_e`` over undirected pairs e (``L_e = (e_i - e_j)(e_i - e_j)^T``), so that
        ``W(t) = I - sum_e w_e k_e L_e`` with ``k_e = c_e a_i a_j``. Then ``E[k_e] = pi
        = (1 - p)(1 - q)^2``, ``E[k_e k_f] = sigma = (1 - p)^2 (1 - q)^3`` for pairs sharing one
        node, and ``L_e L_f = 0`` for disjoint pairs, ``L_e^2 = 2 L_e``; summing,

        .. math::  E[W(t)^T W(t)] = I - 2 \\pi L + \\sigma L^2 + 2 (\\pi - \\sigma) L_{w^2}

        with ``L_{w^2}`` the Laplacian of the squared weights (p = q = 0 gives ``W^2``)."""
        base = self.base
        if base.stochastic or base.period != 1 or self.repair != "symmetric" or "available" in draw_args:
            return None
        if any_traced((draw_args["link_drop"], draw_args["node_drop"])):
            return None
        import scipy.sparse

        p, q = float(draw_args["link_drop"]), float(draw_args["node_drop"])
        pi, sigma = (1 - p) * (1 - q) ** 2, (1 - p) ** 2 * (1 - q) ** 3
        n = base.num_nodes
        s, r, w = (np.asarray(a[0]) for a in (base.senders, base.receivers, base.weights))
        off = (s != r) & (w != 0)
        s, r, w = s[off], r[off], w[off].astype(np.float64)

        def laplacian(values):
            adj = scipy.sparse.csr_matrix((values, (r, s)), shape=(n, n))
            return scipy.sparse.diags(np.asarray(adj.sum(axis=1)).ravel()) - adj

        lap, lap_sq = laplacian(w), laplacian(w * w)
        gram = scipy.sparse.identity(n) - 2 * pi * lap + sigma * (lap @ lap) + 2 * (pi - sigma) * lap_sq
        return SparseGram(scipy.sparse.csr_matrix(gram))

    def draw(self, key, t, draw_args):
        base = self.base
        n = base.num_nodes
        link_drop, node_drop = draw_args["link_drop"], draw_args["node_drop"]
        key_link, key_node, key_base = jax.random.split(key, 3)
        flip = draw_coins if self.coins == "threefry" else hashed_coins
        # A probability known to be 0 at trace time draws nothing: a uniform in [0, 1) is always
        # >= 0, so skipping its draw (and the gathers of its all-true mask) leaves every bit as is.
        all_alive = _known_zero(node_drop)
        alive = jnp.ones((n,), bool) if all_alive else flip(key_node, n, node_drop)
        available = draw_args.get("available")
        if available is not None:  # the nodes online in round t (with_availability), row t mod R
            alive = alive & (jnp.asarray(available)[jnp.asarray(t, jnp.int32) % available.shape[0]] > 0)
            all_alive = False
        if base.stochastic:
            inner = base.sampler.draw(key_base, t, base.draw_args)
            graph, idx = inner.graph, 0
            if inner.alive is not None:
                alive = alive & inner.alive
                all_alive = False
        else:
            graph = base
            idx = 0 if base.period == 1 else jnp.asarray(t, jnp.int32) % base.period

        def row(table, dtype):
            return jnp.asarray(table, dtype)[idx]

        # The edge list's tables (and ``lost``) are built whenever asked for; a round only mixed by
        # the slot kernel reads the slot tables, and XLA drops the rest.
        senders, receivers = row(graph.senders, jnp.int32), row(graph.receivers, jnp.int32)
        weights = row(graph.weights, jnp.float32)
        real = (senders != receivers) & (weights != 0)
        no_links = _known_zero(link_drop)
        if no_links:
            coins = jnp.ones((self.num_units,), bool)
            edge_up = jnp.ones(senders.shape, bool)
        elif self.unit is not None:
            coins = flip(key_link, self.num_units, link_drop)
            edge_up = coins[row(self.unit, jnp.int32)]
        elif self.repair == "symmetric":
            low, high = jnp.minimum(senders, receivers), jnp.maximum(senders, receivers)
            if n * n <= _CODE_LIMIT:
                edge_up = folded_uniform(key_link, low * n + high) >= link_drop
            else:
                # The code a N + b would wrap in int32 (and two pairs share a coin): fold both.
                edge_up = folded_uniform(key_link, low, high) >= link_drop
        else:
            edge_up = flip(key_link, senders.shape[0], link_drop)
        up = edge_up if all_alive else edge_up & alive[senders] & alive[receivers]
        keep = jnp.where(real, up, True)
        kept = jnp.where(keep, weights, jnp.zeros((), jnp.float32))
        # Symmetric W: the receiver takes back the weight it put on the lost edge (row sums stay 1;
        # the reverse edge fails with it, so columns too). Column stochastic: the undelivered mass
        # stays with the sender (column sums stay 1).
        slot_w = sw = neighbors = None
        if graph.resolved_kernel == "slots":
            slot_w = row(graph.slot_weights, jnp.float32)
            # Host neighbours stay host arrays: the slot kernel then rolls x along the slot columns
            # that are shifts instead of gathering it (the same values, so the same bits).
            static = isinstance(graph.neighbors, np.ndarray) and isinstance(idx, int)
            neighbors = graph.neighbors[idx].astype(np.int32) if static else row(graph.neighbors, jnp.int32)
            if self.slot_unit is not None:
                # Column by column: XLA then computes each slot column of the table inside the slot
                # kernel that reads it, without an [N, K] table in memory.
                up_coins = None if no_links else coins
                down = _slot_down(self.slot_unit, idx, neighbors, None if all_alive else alive, up_coins)
                zero = jnp.zeros((), jnp.float32)
                sw_columns = [
                    slot_w[:, k] if d is None else jnp.where(d, zero, slot_w[:, k]) for k, d in enumerate(down)
                ]
                sw = jnp.stack(sw_columns, axis=1)
            else:
                slot_keep = keep[row(self.slot_edge, jnp.int32)]
                sw = jnp.where(slot_keep, slot_w, jnp.zeros((), jnp.float32))
        if sw is not None and self.repair == "symmetric":
            # A receiver's lost weights lie in its own slot row: sum them there, in edge order (the
            # order segment_sum adds them in, so the bits agree), instead of a scatter over E.
            # Slots without an edge lose 0, wherever they fall in the order; where each row's
            # losses are the same values in slot order as in edge order, the slot order is it.
            if self.slot_unit is not None and not self.slot_order:
                losses = [slot_w[:, k] - sw_columns[k] for k in range(len(sw_columns))]
            else:
                order = np.argsort(self.slot_edge, axis=-1, kind="stable")  # [T, N, K]
                losses = jnp.take_along_axis(slot_w - sw, row(order, jnp.int32), axis=1)
                losses = [losses[:, k] for k in range(losses.shape[1])]
            repair = jnp.zeros((n,), jnp.float32)
            for loss in losses:
                repair = repair + loss
        else:
            owner = receivers if self.repair == "symmetric" else senders
            repair = jax.ops.segment_sum(weights - kept, owner, num_segments=n)
        nodes = jnp.arange(n, dtype=jnp.int32)
        edges = {"senders": jnp.concatenate([senders, nodes]), "receivers": jnp.concatenate([receivers, nodes])}
        tables = dict(edges, weights=jnp.concatenate([kept, repair]))
        lost = dict(edges, weights=jnp.concatenate([weights - kept, -repair]))
        if sw is not None:
            tables["neighbors"] = lost["neighbors"] = neighbors
            # Slot 0 is the node itself. Joined rather than updated in place (.at[:, 0].add), so that
            # XLA can compute the table inside the kernel that reads it instead of writing it out.
            tables["slot_weights"] = jnp.concatenate([sw[:, :1] + repair[:, None], sw[:, 1:]], axis=1)
            lost_w = slot_w - sw
            lost["slot_weights"] = jnp.concatenate([lost_w[:, :1] - repair[:, None], lost_w[:, 1:]], axis=1)
        facts = (n, self.name, graph.resolved_kernel, base.directed)
        out = one_round(tables, *facts, self.repair == "symmetric", base.is_column_stochastic)
        pair_keep = None
        if self.pair_ends is not None:
            a, b = self.pair_ends
            pair_keep = coins if all_alive else coins & alive[a] & alive[b]
        return GraphRound(out, alive, pair_keep, one_round(lost, *facts, False, False))


def _slot_down(slot_unit, idx, neighbors, alive, coins) -> list:
    """Which slots of a failed round of a fixed symmetric graph lose their weight, drawn in its
    slot table: slot k of node i does when it holds a real edge (``slot_unit >= 0``) and the edge's
    coin says down or one of its two nodes is down.

    Args:
      slot_unit: [T, N, K] int32 host table, the coin of each slot's edge, -1 for none.
      idx: the round's row of the tables (Python int, or traced for a schedule).
      neighbors: the round's neighbours ``[N, K]``.
      alive: [N] bool, or None when every node is up.
      coins: [P] bool, whether each undirected pair is up, or None when no link fails.

    Returns:
      K entries: [N] bool, or None for a column of a host table without a real edge (the self
      column), which loses nothing.
    """
    static = isinstance(idx, int)
    unit = slot_unit[idx] if static else jnp.asarray(slot_unit)[idx]
    real = unit >= 0
    down = []
    for k in range(unit.shape[1]):
        if static and not real[:, k].any():
            down.append(None)
            continue
        # One gather per column (measured faster on XLA:CPU than one [N, K] gather).
        up = jnp.ones(unit.shape[:1], bool) if coins is None else coins[jnp.where(real[:, k], unit[:, k], 0)]
        if alive is not None:
            column = neighbors[:, k]
            shift = circulant_shift(column) if isinstance(column, np.ndarray) else None
            # A neighbour column that is a shift of the nodes reads alive rolled, not gathered.
            up = up & alive & (alive[column] if shift is None else jnp.roll(alive, -shift))
        down.append(real[:, k] & ~up)
    return down


def _slot_order_matters(slot_edge: np.ndarray, slot_unit: np.ndarray, slot_w: np.ndarray) -> bool:
    """Whether the repair must sum some row's lost weights in edge order: False when in every row
    the real slots' weights (the only losses that are not 0) read the same in slot order as in
    edge order, e.g. equal weights (a regular graph's Metropolis weights) or slots in edge order.
    Host NumPy, O(T N K) for rows of equal weights, a sort of the others' slots."""
    real = slot_unit >= 0
    lowest = np.where(real, slot_w, np.inf).min(axis=-1)
    highest = np.where(real, slot_w, -np.inf).max(axis=-1)
    rows = ~((lowest == highest) | ~real.any(axis=-1))  # [T, N]: rows of unequal weights
    if not rows.any():
        return False
    real_w = np.where(real, slot_w, 0.0)[rows]
    in_edge_order = np.take_along_axis(real_w, np.argsort(slot_edge[rows], axis=-1, kind="stable"), axis=-1)

    def packed(a):  # each row's non-zero entries first, in their order
        return np.take_along_axis(a, np.argsort(a == 0, axis=-1, kind="stable"), axis=-1)

    return not np.array_equal(packed(real_w), packed(in_edge_order))


def with_availability(topology: Topology, available: Any) -> Topology:
    """A graph whose nodes are online only in the rounds ``available`` says: an offline node sends
    and receives nothing, its weights repaired as for a node that is down in :func:`with_failures`.

    Args:
      topology: a graph :func:`with_failures` accepts, or failures of one (its drops are kept).
      available: ``[R, N]`` 0/1 (or bool), node i online in round t iff ``available[t mod R, i]``
        (e.g. :func:`jaxgossip.sim.compute.availability`).

    Returns:
      A stochastic :class:`Topology` (failures with ``available`` among its ``draw_args``).
    """
    if not isinstance(topology, Topology):
        raise TypeError(f"with_availability needs a jaxgossip Topology, got {type(topology).__name__}")
    mask = np.asarray(available)
    n = topology.num_nodes
    if mask.ndim != 2 or mask.shape[1] != n or mask.shape[0] < 1:
        raise ValueError(f"available must be [rounds, N] = [R, {n}] of 0/1; got shape {mask.shape}")
    if not np.all((mask == 0) | (mask == 1)):
        raise ValueError("available must hold 0 (offline) or 1 (online) only")
    mask = jnp.asarray(mask, jnp.float32)
    if not isinstance(topology.sampler, _FailureSampler):
        topology = with_failures(topology)
    args = dict(topology.draw_args, available=mask)
    return Topology.from_sampler(
        topology.sampler,
        draw_args=args,
        name=f"{topology.name}+availability",
        num_nodes=n,
        directed=topology.directed,
        layout=topology.resolved_kernel,
        row_stochastic=topology.is_row_stochastic,
        column_stochastic=topology.is_column_stochastic,
    )


def _slot_edges(topology: Topology) -> np.ndarray:
    """[T, N, K] int32: the edge (index into round t's edge list) behind slot k of node i; padding
    slots point at the node's self-loop edge, or edge 0 (their weight is 0 whatever the coin)."""
    return slot_edges(topology.senders, topology.receivers, topology.weights, topology.num_nodes, topology.max_slots)


def _pair_units(senders: np.ndarray, receivers: np.ndarray, real: np.ndarray, n: int) -> tuple | None:
    """The undirected pairs of a static symmetric graph in canonical order, in O(E): ``(pair_codes
    [P] int64 sorted a * N + b with a < b, unit [1, E] int32 the pair of each real edge, 0 else)``.

    The pairs are the real edges with receiver < sender, already sorted; the reverse of every edge
    comes from the CSR-to-CSC conversion of the edge ids (column j of the transpose lists the edges
    into j's neighbours in canonical order). None for a schedule or edges not in canonical order
    (the caller sorts instead).
    """
    if senders.shape[0] != 1:
        return None
    live = np.flatnonzero(real[0])
    s, r = senders[0][live], receivers[0][live]
    if not is_canonical(s, r):
        return None
    forward = r < s
    codes = r[forward].astype(np.int64) * n + s[forward]
    import scipy.sparse

    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(r, minlength=n), out=indptr[1:])
    ids = scipy.sparse.csr_matrix((np.arange(s.size, dtype=np.int64), s, indptr), shape=(n, n))
    transposed = ids.tocsc()
    if not (np.array_equal(transposed.indptr, ids.indptr) and np.array_equal(transposed.indices, ids.indices)):
        return None
    rank = np.cumsum(forward) - 1
    unit = np.zeros(senders.shape, dtype=np.int32)
    unit[0, live] = np.where(forward, rank, rank[transposed.data])
    return codes, unit


def with_failures(
    topology: Topology, link_drop: float = 0.0, node_drop: float = 0.0, coins: str = "threefry"
) -> Topology:
    """A fixed graph whose links and nodes fail at random every round, weights repaired.

    Every round, independently: each edge fails with probability ``link_drop`` (on an undirected
    graph each undirected pair fails as a whole, both directions), and each node is down with
    probability ``node_drop`` (all of its edges fail). The weights are repaired so that the
    invariant the algorithms need holds in every round:

    * symmetric, doubly stochastic graphs (ring, torus, hypercube, complete, erdos_renyi, ...): the
      weight a node put on a failed edge returns to its own self weight, ``W_ii += W_ij``; as the
      pair fails in both directions, ``W(t)`` stays symmetric and doubly stochastic;
    * other column-stochastic graphs (directed_ring, exponential, one_peer_exponential,
      random_directed, ...): the mass a sender could not deliver stays with it, ``W_jj += W_ij``;
      ``W(t)`` stays column stochastic (push-sum), but not row stochastic in general, so gossip
      refuses such a wrapped directed graph.

    .. math::

        W(t)_{ij} = W_{ij}\\, k_{ij}(t)\\ (i \\ne j), \\qquad
        W(t)_{ii} = W_{ii} + \\sum_{j \\ne i} W_{ij} (1 - k_{ij}(t))
        \\ \\ \\text{(sender repair: } \\textstyle\\sum_{i \\ne j} W_{ij}(1 - k_{ij}) \\text{ to } W_{jj}),

        k_{ij}(t) = c_{\\{ij\\}}(t)\\, a_i(t)\\, a_j(t), \\quad
        c \\sim \\mathrm{Bernoulli}(1 - p), \\ a \\sim \\mathrm{Bernoulli}(1 - q)

    With ``link_drop = node_drop = 0`` it is the wrapped graph (bitwise: same kernels, same bits).
    Messages on failed edges are not sent and not counted (``StepInfo.bits``).

    Args:
      topology: a graph with host tables (static or a schedule; not a stack), or a stochastic graph
        (``random_matching``, ``random_out``: its round is drawn first, then failed).
      link_drop: p in [0, 1), the probability that an edge (undirected pair) fails in a round.
      node_drop: q in [0, 1), the probability that a node does not communicate in a round.
      coins: ``"threefry"`` (default): the coins are ``jax.random.uniform``'s bits; ``"hash"``:
        a keyed 32-bit hash, cheaper per coin (:func:`jaxgossip.topology.coins.hashed_coins`),
        other bits of the same law (independent Bernoulli(1 - p) coins per undirected pair or
        directed edge, Bernoulli(1 - q) per node, new every round). The pairs of a stochastic
        undirected base draw threefry coins either way.

    Both probabilities are pytree leaves of the result (``draw_args``), not compile-time constants:
    failures of one graph at several p stack (:func:`jaxgossip.topology.stack`) into one program
    that ``jax.vmap`` runs for every p (``jaxgossip.engine.sweeps.map_topologies`` does this for a
    list of them); a traced p or q (``with_failures`` inside ``vmap``) is accepted unchecked.

    Returns:
      A stochastic :class:`Topology` with the wrapped graph's layout, period and E + N edges per
      round (N self edges carry the repaired weight).
    """
    if not isinstance(topology, Topology):
        raise TypeError(f"with_failures needs a jaxgossip Topology, got {type(topology).__name__}")
    if isinstance(topology.sampler, _FailureSampler):
        raise ValueError(f"{topology.name} already has failures; give with_failures the graph it wraps")
    if not topology.stochastic and (not topology.host_tables or topology.num_graphs is not None):
        raise TypeError("with_failures needs a graph built on the host (not a stack or a stack member)")
    p = _check_drop("link_drop", link_drop)
    q = _check_drop("node_drop", node_drop)
    if coins not in ("threefry", "hash"):
        raise ValueError(f"coins={coins!r}: the coins are drawn by 'threefry' (default) or 'hash'")
    n = topology.num_nodes
    if topology.is_doubly_stochastic and topology.is_symmetric:
        repair = "symmetric"
    elif topology.is_column_stochastic:
        repair = "sender"
    else:
        raise ValueError(
            f"with_failures needs a symmetric doubly stochastic graph (repaired at the receiver) or a "
            f"column-stochastic graph (repaired at the sender); {topology.name} is neither"
        )
    unit, num_units, pair_codes, pair_ends = None, 0, None, None
    slot_unit, slot_order = None, True
    if topology.stochastic:
        slot_edge = getattr(topology.sampler, "slot_edge", None)
    else:
        senders, receivers, weights = topology.senders, topology.receivers, topology.weights
        real = (senders != receivers) & (weights != 0)
        if repair == "symmetric":
            pairs = _pair_units(senders, receivers, real, n)
            if pairs is None:
                codes = np.minimum(senders, receivers).astype(np.int64) * n + np.maximum(senders, receivers)
                pair_codes = np.unique(codes[real])
                unit = np.where(real, np.searchsorted(pair_codes, codes), 0).astype(np.int32)
            else:
                pair_codes, unit = pairs
            num_units = max(1, pair_codes.size)
            pair_ends = ((pair_codes // n).astype(np.int32), (pair_codes % n).astype(np.int32))
        else:
            unit = np.broadcast_to(np.arange(topology.num_edges, dtype=np.int32), senders.shape).copy()
            num_units = topology.num_edges
        slot_edge = _slot_edges(topology) if topology.resolved_kernel == "slots" else None
        if slot_edge is not None and repair == "symmetric":
            nbr, slot_w = topology.slots
            edge_unit = np.take_along_axis(unit, slot_edge.reshape(unit.shape[0], -1), axis=1).reshape(nbr.shape)
            slot_real = (nbr != np.arange(n, dtype=nbr.dtype)[:, None]) & (slot_w != 0)
            slot_unit = np.where(slot_real, edge_unit, -1).astype(np.int32)
            slot_order = _slot_order_matters(slot_edge, slot_unit, slot_w)

    def show(value):
        return f"{float(value):g}" if is_concrete(value) else "traced"

    parts = [f"link_drop={show(p)}"] + ([f"node_drop={show(q)}"] if not is_concrete(q) or q else [])
    parts += [f"coins={coins}"] if coins != "threefry" else []
    name = f"{topology.name}+failures({', '.join(parts)})"
    identity = (repair, _base_identity(topology)) + ((coins,) if coins != "threefry" else ())
    sampler = _FailureSampler(
        identity,
        topology,
        repair,
        f"{topology.name}+failures",
        unit,
        num_units,
        pair_codes,
        pair_ends,
        slot_edge,
        slot_unit,
        slot_order,
        coins,
    )
    return Topology.from_sampler(
        sampler,
        draw_args={"link_drop": p, "node_drop": q},
        name=name,
        num_nodes=n,
        directed=topology.directed,
        layout=topology.resolved_kernel,
        row_stochastic=repair == "symmetric",
        column_stochastic=topology.is_column_stochastic,
    )
