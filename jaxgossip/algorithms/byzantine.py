"""Byzantine nodes: a wrapper that replaces what attackers send on each of their edges.

``byzantine(algorithm, topology, attack, ids=... | num=K, key=...)`` runs an algorithm whose messages
are its models (its metadata has :attr:`~jaxgossip.types.TrainerHooks.receive`) with K nodes
that follow the algorithm on their own state but send, on every edge to an honest receiver i, a
message chosen by the attack. Attackers are omniscient (they read every honest model, as the
threat model of He et al. 2022 allows). The messages live on the M directed edges from attackers
to honest receivers ([T, M] host tables): each round they are appended to the models
(``[N + M, ...]``) and the receivers' in-neighbour slots of those edges point at them
(:class:`~jaxgossip.algorithms.Received`), so a different message per neighbour costs
no dense ``N x N`` table and the algorithm's round is unchanged.

Attacks (per edge e from attacker j to honest receiver i; H_i = i and its honest in-neighbours):

* ``gaussian``: ``N(0, sigma^2)`` per coordinate, one draw per attacker and round (``sigma=100``).
* ``signflip``: ``-x_j``, the negative of the model it would send.
* ``alie`` (a little is enough, Baruch et al., NeurIPS 2019): ``mean(H_i) - z std(H_i)``
  coordinate-wise (unbiased std), ``z`` from the paper's rule ``s = floor(N/2 + 1) - K``,
  ``z = Phi^{-1}((N - K - s) / (N - K))`` unless given.
* ``ipm`` (inner product manipulation, Xie et al., UAI 2020): ``-epsilon mean(H_i)``
  (``epsilon=0.1``).
* ``dissensus`` (He et al. 2022): ``x_i - epsilon sum_{h honest} W_ih (x_h - x_i) / sum_{b attacker} W_ib``;
  with ``epsilon = 1`` the attackers cancel the pull of i's honest neighbours, above 1 they push
  i away from them (``epsilon=1.0``).

Metrics of a run under attack are over the honest nodes only: :func:`honest_mask`,
:func:`honest_mean`, :func:`honest_consensus_distance` (the wrapper's state carries the mask, and its
:attr:`~jaxgossip.types.GossipAlgorithm.honest` hook reads it for the trainer).

References:
  He, Karimireddy, Jaggi, "Byzantine-robust decentralized learning via ClippedGossip", 2022
  (arXiv:2202.01545); code epfml/byzantine-robust-decentralized-optimizer (codes/attacks.py).
  Baruch, Baruch, Goldberg, "A little is enough: circumventing defenses for distributed
  learning", NeurIPS 2019 (arXiv:1902.06156).
  Xie, Koyejo, Gupta, "Fall of empires: breaking Byzantine-tolerant SGD by inner product
  manipulation", UAI 2020 (arXiv:1903.03936).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse
import scipy.sparse.csgraph
import scipy.stats

from jaxgossip.algorithms._shared.messages import Received, check_fixed_graph, received_models, slot_round
from jaxgossip.algorithms.registry import INFOS, make, resolve
from jaxgossip.checks import is_concrete
from jaxgossip.ops.mixing import per_node
from jaxgossip.topology import Topology
from jaxgossip.types import AlgorithmInfo, Array, GossipAlgorithm, Params

__all__ = [
    "ATTACKS",
    "ByzantineState",
    "EdgeTables",
    "byzantine",
    "attackers",
    "attack_edges",
    "honest_mask",
    "honest_mean",
    "honest_consensus_distance",
    "alie_z",
]

#: attack name -> its options and their defaults (None: derived, see the module docstring).
ATTACKS: dict[str, dict[str, Any]] = {
    "gaussian": {"sigma": 100.0},
    "signflip": {},
    "alie": {"z": None},
    "ipm": {"epsilon": 0.1},
    "dissensus": {"epsilon": 1.0},
}
# The stream of the step key the attack draws from: the algorithm keeps the step key itself.
_ATTACK_STREAM = 0x62797A61


class ByzantineState(NamedTuple):
    """State of an algorithm under attack: the wrapped algorithm's state and who is honest."""

    inner: Any  # the wrapped algorithm's state
    honest: Array  # [N] bool, False for the attackers


class EdgeTables(NamedTuple):
    """The directed edges from attackers to honest receivers, per round (NumPy, host side).

    M = the most such edges in one round (at least 1; padding edges are inactive).
    """

    receiver: np.ndarray  # [T, M] int32, the honest receiver i of edge e
    sender: np.ndarray  # [T, M] int32, the attacker j
    active: np.ndarray  # [T, M] bool, a real edge this round
    neighbors: np.ndarray  # [T, N, K] int32, the slot table with each attacked slot pointing at row N + e
    honest_slot: np.ndarray  # [T, N, K] bool, the slot holds the node itself or an honest in-neighbour
    byz_slot: np.ndarray  # [T, N, K] bool, the slot holds an attacker (weight != 0)


# ---- who attacks -------------------------------------------------------------------------------------


def attackers(num_nodes: int, ids: Any = None, num: int | None = None, key: Any = None) -> np.ndarray:
    """The attackers' node ids, sorted: given (``ids``) or ``num`` drawn without replacement from ``key``.

    Args:
      num_nodes: N.
      ids: explicit node ids (a sequence of ints), or None.
      num: K, the number of attackers drawn (with ``key``), or None.
      key: a concrete ``jax.random`` key or an int seed (only with ``num``); the draw is made on
        the host, also when called inside ``jit`` or ``vmap``.

    Raises:
      ValueError: both or neither of ``ids`` and ``num``, K >= N (no honest node would be left),
        an id out of range or repeated, a negative K, a traced ``key``.
      TypeError: ``num`` is not an int.
    """
    if (ids is None) == (num is None):
        raise ValueError(f"give the attackers either as ids=[...] or as num=K (with key); got ids={ids!r}, num={num!r}")
    if num is not None:
        if isinstance(num, bool) or not isinstance(num, (int, np.integer)):
            raise TypeError(f"num={num!r} must be an int, the number of attackers")
        if num < 0 or num >= num_nodes:
            raise ValueError(
                f"num={num} attackers out of range: need 0 <= K < N = {num_nodes} (at least one honest node)"
            )
        if key is None:
            raise ValueError("num=K draws the attackers from a key: give key= (a jax.random key or an int seed)")
        if not is_concrete(key):
            raise ValueError(
                "num=K draws the attackers on the host (they fix the shapes of the edge tables): key= must be "
                "concrete, an int seed or a key made outside jit/vmap, not a traced key"
            )
        # The draw runs eagerly even when the wrapper is built inside jit or vmap (a sweep builds
        # its trainer there): the ids are host-side NumPy, like the graph's tables.
        with jax.ensure_compile_time_eval():
            if isinstance(key, (int, np.integer)):
                key = jax.random.key(int(key))
            chosen = np.asarray(jax.random.choice(key, num_nodes, (int(num),), replace=False))
        return np.sort(chosen).astype(np.int64)
    chosen = np.asarray(list(ids) if not isinstance(ids, (int, np.integer)) else [ids])
    if chosen.size and (chosen.dtype.kind not in "iu"):
        raise ValueError(f"ids={ids!r} must be node ids (ints)")
    chosen = chosen.astype(np.int64)
    bad = chosen[(chosen < 0) | (chosen >= num_nodes)]
    if bad.size:
        raise ValueError(f"ids={ids!r}: node {int(bad[0])} is out of range 0..{num_nodes - 1}")
    if np.unique(chosen).size != chosen.size:
        raise ValueError(f"ids={ids!r} repeats a node")
    if chosen.size >= num_nodes:
        raise ValueError(
            f"ids={ids!r}: {chosen.size} attackers of N = {num_nodes} nodes leave no honest node (need K < N)"
        )
    return np.sort(chosen)


def honest_mask(num_nodes: int, ids: Any) -> np.ndarray:
    """[N] bool, True for the honest nodes (not in ``ids``)."""
    mask = np.ones(num_nodes, dtype=bool)
    mask[np.asarray(list(ids), dtype=np.int64)] = False
    return mask


def honest_mean(x: Params, honest: Any) -> Params:
    """The average model of the honest nodes, ``(1/|H|) sum_{i in H} x_i`` per leaf (leaves ``[...]``).

    Args:
      x: pytree of leaves ``[N, ...]``.
      honest: [N] bool (:func:`honest_mask`, or ``ByzantineState.honest``).
    """
    h = jnp.asarray(honest)

    def mean(leaf):
        acc = leaf.astype(jnp.promote_types(leaf.dtype, jnp.float32))
        w = per_node(h, leaf).astype(acc.dtype)
        return jnp.sum(w * acc, axis=0) / jnp.sum(h).astype(acc.dtype)

    return jax.tree_util.tree_map(mean, x)


def honest_consensus_distance(x: Params, honest: Any, target: Params | None = None) -> Array:
    """``(1/|H|) sum_{i in H} ||x_i - target||^2`` over all leaves; target defaults to the honest mean.

    The consensus distance of :func:`jaxgossip.consensus_distance` restricted to the honest nodes.
    """
    h = jnp.asarray(honest)
    if target is None:
        target = honest_mean(x, h)

    def per_leaf(leaf, ref):
        diff = leaf.astype(jnp.promote_types(leaf.dtype, jnp.float32)) - ref[None]
        sq = jnp.sum(jnp.reshape(diff * diff, (leaf.shape[0], -1)), axis=1)
        return jnp.sum(jnp.where(h, sq, 0.0))

    total = sum(jax.tree_util.tree_leaves(jax.tree_util.tree_map(per_leaf, x, target)))
    return total / jnp.sum(h)


def _check_honest_connected(topology: Topology, byz: np.ndarray) -> None:
    """Raises ValueError when removing the attackers disconnects the honest nodes (every round's
    edges together; strongly connected for a directed graph)."""
    n = topology.num_nodes
    honest = honest_mask(n, byz)
    index = -np.ones(n, dtype=np.int64)
    index[honest] = np.arange(honest.sum())
    s, r, w = (np.asarray(a).reshape(-1) for a in (topology.senders, topology.receivers, topology.weights))
    keep = (w != 0) & (s != r) & honest[s] & honest[r]
    m = int(honest.sum())
    if m <= 1:
        return
    adj = scipy.sparse.coo_matrix((np.ones(int(keep.sum())), (index[r[keep]], index[s[keep]])), shape=(m, m))
    count, labels = scipy.sparse.csgraph.connected_components(adj, directed=topology.directed, connection="strong")
    if count > 1:
        nodes = np.flatnonzero(honest)
        parts = [nodes[labels == c].tolist() for c in range(count)]
        shown = "; ".join(str(p[:8])[:-1] + (", ...]" if len(p) > 8 else "]") for p in parts[:3])
        raise ValueError(
            f"the attackers {byz.tolist()} disconnect the honest nodes of {topology.name} into {count} parts "
            f"({shown}{'; ...' if count > 3 else ''}): no aggregation rule can reach honest consensus. "
            "Choose attackers whose removal leaves the honest graph connected"
        )


def attack_edges(topology: Topology, byz: np.ndarray) -> EdgeTables:
    """The :class:`EdgeTables` of ``topology`` with attackers ``byz`` (host side, NumPy)."""
    nbr, slot_w = topology.slots
    period, n, k = nbr.shape
    is_byz = ~honest_mask(n, byz)
    slots = np.arange(k)[None, None, :]
    real = (slot_w != 0) & (slots > 0)
    from_byz = real & is_byz[nbr]
    attacked = from_byz & ~is_byz[:, None][None]  # honest receivers only
    width = max(1, int(attacked.reshape(period, -1).sum(axis=1).max()))
    receiver = np.zeros((period, width), np.int32)
    sender = np.zeros((period, width), np.int32)
    active = np.zeros((period, width), bool)
    rewired = nbr.astype(np.int32).copy()
    for t in range(period):
        rows, cols = np.nonzero(attacked[t])
        e = np.arange(rows.size)
        receiver[t, e], sender[t, e], active[t, e] = rows, nbr[t, rows, cols], True
        rewired[t, rows, cols] = n + e
    honest_slot = ((slot_w != 0) | (slots == 0)) & ~is_byz[nbr]
    return EdgeTables(receiver, sender, active, rewired, honest_slot, from_byz)


# ---- the attacks --------------------------------------------------------------------------------------


def alie_z(num_nodes: int, num_byzantine: int) -> float:
    """Baruch et al.'s z: ``s = floor(N/2 + 1) - K``, ``z = Phi^{-1}((N - K - s) / (N - K))``.

    Raises:
      ValueError: the rule has no finite z (``K >= N/2``): give ``z`` explicitly.
    """
    s = math.floor(num_nodes / 2 + 1) - num_byzantine
    p = (num_nodes - num_byzantine - s) / (num_nodes - num_byzantine)
    if not 0.0 < p < 1.0:
        raise ValueError(
            f"alie: with N = {num_nodes} and K = {num_byzantine} attackers Baruch et al.'s rule gives no finite z "
            f"(Phi^-1({p:.3g})); give attack option z explicitly"
        )
    return float(scipy.stats.norm.ppf(p))


def _check_options(attack: str, options: Mapping[str, Any], num_nodes: int, num_byzantine: int) -> dict:
    if attack not in ATTACKS:
        raise ValueError(f"unknown attack {attack!r}; known attacks: {', '.join(ATTACKS)}")
    unknown = sorted(set(options) - set(ATTACKS[attack]))
    if unknown:
        known = ", ".join(ATTACKS[attack]) or "none"
        raise ValueError(f"attack {attack!r} has no option {unknown}; its options: {known}")
    values = {**ATTACKS[attack], **options}
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, (bool, str, bytes)):  # np.asarray would read "1" as 1.0 and fail on "abc"
            raise ValueError(f"attack {attack!r}: {name}={value!r} must be a finite number")
        try:
            arr = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"attack {attack!r}: {name}={value!r} must be a finite number") from None
        if arr.shape != () or not np.isfinite(arr):
            raise ValueError(f"attack {attack!r}: {name}={value!r} must be a finite number")
        if name in ("sigma", "epsilon") and arr <= 0:
            raise ValueError(f"attack {attack!r}: {name}={value!r} must be > 0")
    if attack == "alie" and values["z"] is None:
        values["z"] = alie_z(num_nodes, num_byzantine)
    return values


def _neighbourhood_stats(x: Params, rows: Array, members: Array, std: bool):
    """Mean (and unbiased std) per coordinate over the slots ``members`` [M, K] of receivers whose
    slot tables are ``rows`` [M, K]: leaves [M, ...] each."""
    count = jnp.sum(members, axis=1).astype(jnp.float32)

    def shape(v, leaf):
        return per_node(v, leaf)

    def mean_leaf(leaf):
        acc = leaf.astype(jnp.promote_types(leaf.dtype, jnp.float32))
        total = sum(shape(members[:, k], leaf) * acc[rows[:, k]] for k in range(rows.shape[1]))
        return total / shape(count, leaf)

    mean = jax.tree_util.tree_map(mean_leaf, x)
    if not std:
        return mean, None

    def std_leaf(leaf, mu):
        acc = leaf.astype(mu.dtype)
        sq = sum(shape(members[:, k], leaf) * (acc[rows[:, k]] - mu) ** 2 for k in range(rows.shape[1]))
        return jnp.sqrt(sq / shape(jnp.maximum(count - 1.0, 1.0), leaf))

    return mean, jax.tree_util.tree_map(std_leaf, x, mean)


def _messages(attack: str, values: dict, x: Params, key: Array, tables: Any, byz_index: np.ndarray, num_byz: int):
    """The messages [M, ...] of round t's attacked edges (``tables``: the round's rows)."""
    receiver, sender, nbr, weights, honest_slot, byz_slot = tables
    leaves, treedef = jax.tree_util.tree_flatten(x)
    if attack == "gaussian":
        keys = jax.random.split(key, len(leaves))
        who = jnp.asarray(byz_index)[sender]  # one draw per attacker, sent to all of its receivers
        draws = [
            jax.random.normal(k, (max(num_byz, 1),) + leaf.shape[1:], jnp.float32) for k, leaf in zip(keys, leaves)
        ]
        out = [(values["sigma"] * d)[who].astype(leaf.dtype) for d, leaf in zip(draws, leaves)]
        return jax.tree_util.tree_unflatten(treedef, out)
    if attack == "signflip":
        return jax.tree_util.tree_map(lambda leaf: -leaf[sender], x)
    rows = nbr[receiver]  # [M, K], the receivers' slot tables (honest slots read models)
    if attack in ("alie", "ipm"):
        mean, std = _neighbourhood_stats(x, rows, honest_slot[receiver], std=attack == "alie")
        if attack == "ipm":
            return jax.tree_util.tree_map(lambda mu, leaf: (-values["epsilon"] * mu).astype(leaf.dtype), mean, x)
        return jax.tree_util.tree_map(lambda mu, sd, leaf: (mu - values["z"] * sd).astype(leaf.dtype), mean, std, x)
    # dissensus
    w = weights[receiver]  # [M, K]
    pull = jnp.where(honest_slot[receiver] & (jnp.arange(w.shape[1]) > 0)[None, :], w, 0.0)
    byz_weight = jnp.sum(jnp.where(byz_slot[receiver], w, 0.0), axis=1)

    def leaf_msg(leaf):
        acc = leaf.astype(jnp.promote_types(leaf.dtype, jnp.float32))
        own = acc[receiver]

        def shape(v):
            return per_node(v, leaf)

        total = sum(shape(pull[:, k]) * (acc[rows[:, k]] - own) for k in range(rows.shape[1]))
        return (own - values["epsilon"] * total / shape(byz_weight)).astype(leaf.dtype)

    return jax.tree_util.tree_map(leaf_msg, x)


# ---- the wrapper --------------------------------------------------------------------------------------


def _attackable(algorithm: Any) -> tuple[str, AlgorithmInfo]:
    if isinstance(algorithm, AlgorithmInfo):
        name, entry = getattr(algorithm.factory, "__name__", "algorithm"), algorithm
    elif isinstance(algorithm, str):
        name, entry = algorithm, resolve(algorithm)
    else:
        raise TypeError(f"algorithm={algorithm!r} must be a registered name, an import path or an AlgorithmInfo")
    if entry.hooks.receive is None:
        why = entry.hooks.reasons.get(
            "receive",
            "its metadata has no round as a function of the received models (TrainerHooks.receive): its "
            "messages are not plain models (compressed differences, push-sum pairs, low-rank factors, ...)",
        )
        able = ", ".join(n for n, i in INFOS.items() if i.hooks.receive is not None)
        raise ValueError(f"{name} cannot be attacked: {why}. Algorithms that can: {able}")
    return name, entry


def byzantine(
    algorithm: Any,
    topology: Topology,
    attack: str = "gaussian",
    *,
    ids: Any = None,
    num: int | None = None,
    key: Any = None,
    options: Mapping[str, Any] | None = None,
    built: GossipAlgorithm | None = None,
    **attack_options: Any,
) -> GossipAlgorithm:
    """``algorithm`` on ``topology`` with Byzantine nodes that send what ``attack`` chooses.

    Attackers run the algorithm on their own state (receiving honest messages) and replace every
    message they send to an honest node; honest nodes run it unchanged on what they receive:

    .. math::  x_i^+ = \\mathrm{round}_i\\big(x_i, \\{m_{ji}\\}_{j \\in N_{in}(i)}\\big),\\qquad
               m_{ji} = x_j \\ (j \\text{ honest}),\\quad m_{ji} = \\mathrm{attack}_{ji}(x) \\ (j \\text{ Byzantine})

    Args:
      algorithm: a registered name or import path (or an AlgorithmInfo) whose metadata has
        ``receive`` (messages are models): ``gossip``, ``clipped_gossip``, ``trimmed_mean``, ``median``,
        ``sparta``.
      topology: a fixed or time-varying graph with host tables.
      attack: one of :data:`ATTACKS`.
      ids: the attackers' node ids; or ``num`` (K) attackers drawn from ``key`` (:func:`attackers`).
      options: the algorithm's options (e.g. ``{"tau": 1.0}``).
      built: the algorithm already built on ``topology`` with ``options`` (a config check built it),
        which every node then runs; by default it is built here.
      **attack_options: the attack's options (:data:`ATTACKS`: ``sigma``, ``z``, ``epsilon``).

    Returns:
      A :class:`~jaxgossip.types.GossipAlgorithm` with state :class:`ByzantineState` (``honest``
      the [N] mask of honest nodes) and the hook ``honest(state) = state.honest``
      (:attr:`~jaxgossip.types.GossipAlgorithm.honest`: the trainer's metrics are over the honest
      nodes only). Its debias and orderings are the algorithm's; bits are what every node sends,
      one model per directed edge.

    Raises:
      ValueError: an algorithm that cannot be attacked (with the reason), an unknown attack or
        attack option, K >= N, bad ids, attackers whose removal disconnects the honest graph, a
        stochastic graph.
    """
    name, entry = _attackable(algorithm)
    check_fixed_graph(topology, f"byzantine({name})")
    options = dict(options or {})
    n = topology.num_nodes
    byz = attackers(n, ids=ids, num=num, key=key)
    values = _check_options(attack, attack_options, n, byz.size)
    _check_honest_connected(topology, byz)
    if built is not None:
        inner = built
    elif isinstance(algorithm, str):
        inner = make(algorithm, topology, **options)
    else:
        inner = entry.factory(topology, **options)
    round_fn = entry.hooks.receive(topology, **options)
    edges = attack_edges(topology, byz)
    honest = honest_mask(n, byz)
    byz_index = np.zeros(n, np.int32)
    byz_index[byz] = np.arange(byz.size)
    slot_w = topology.slots[1].astype(np.float32)
    label = f"byzantine({name}, {attack}, ids={byz.tolist()})"

    def init_fn(params):
        return ByzantineState(inner=inner.init(params), honest=jnp.asarray(honest))

    def step_fn(params, state, key):
        if byz.size == 0:  # nobody attacks: the honest round
            view = received_models(topology, params, state.inner.count)
            new, inner_state, info = round_fn(params, state.inner, view, key)
            return new, state._replace(inner=inner_state), info
        t = state.inner.count
        tables = tuple(
            slot_round(a, t)
            for a in (edges.receiver, edges.sender, edges.neighbors, slot_w, edges.honest_slot, edges.byz_slot)
        )
        msgs = _messages(attack, values, params, jax.random.fold_in(key, _ATTACK_STREAM), tables, byz_index, byz.size)
        honest_view = received_models(topology, params, t)
        source = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b], axis=0), params, msgs)
        received = Received(source, tables[2], honest_view.weights, honest_view.mask)
        new, inner_state, info = round_fn(params, state.inner, received, key)
        return new, state._replace(inner=inner_state), info

    def debias_fn(params, state):
        return inner.debias(params, state.inner)

    def honest_fn(state):
        return state.honest

    return GossipAlgorithm(init_fn, step_fn, debias_fn, label, orderings=inner.orderings, honest=honest_fn)
