"""PowerGossip: gossip of low-rank projections of the pairwise model differences.

Follows the semantics of the authors' code: oriented edges ``a < b``, alternating right/left
power-iteration half-steps on a global iteration counter, the unnormalised product kept as the next
warm start, 1-D leaves gossiped uncompressed, >= 2-D leaves viewed as matrices. The reasoning
behind the schedule, the shared randomness, the kernel and the ``flax_kernel`` view is in
docs/algorithms.md, section power_gossip.

One round is a composition of pure functions, read top to bottom:

* :func:`~jaxgossip.algorithms.matrix_views.leaf_plan`: the static per-leaf plan (which leaves are
  matrices, and their ``(m, n, R)``; :mod:`jaxgossip.algorithms.matrix_views`);
* :func:`orth`, :func:`half_step`: one power-iteration half-step of one matrix leaf, all pairs;
* :func:`exchange`: one half-step of every matrix leaf, with the bases it leaves behind;
* ``working_view``, ``working_bases``, ``view_bases`` (:mod:`~jaxgossip.algorithms.matrix_views`):
  the ``flax_kernel`` view;
* :func:`matrix_round`: the I iterations of one round; :func:`gossip_vectors`: the 1-D leaves;
* :func:`round_bits`: what every node sent.

The per-pair tables come from :mod:`jaxgossip.algorithms._shared.pair_tables`.

References:
  Vogels, Karimireddy, Jaggi, "Practical Low-Rank Communication Compression in Decentralized Deep
  Learning" (PowerGossip), NeurIPS 2020 (arXiv:2008.01425).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip import compress
from jaxgossip.algorithms._shared.common import check_positive, relax
from jaxgossip.algorithms._shared.pair_tables import PairRound, PairTables, pair_round, pair_tables
from jaxgossip.algorithms.matrix_views import (
    MATRIX_VIEWS,
    LeafPlan,
    MatrixLeaf,
    leaf_plan,
    permute_rows,
    view_bases,
    working_bases,
    working_side,
    working_view,
)
from jaxgossip.algorithms.registry import check_graph, sign
from jaxgossip.checks import check_int
from jaxgossip.ops.mixing import check_params, mix
from jaxgossip.topology import Topology
from jaxgossip.types import (
    AlgorithmInfo,
    Array,
    CostFacts,
    GossipAlgorithm,
    GraphNeeds,
    StepInfo,
    SweepFacts,
    TrainerHooks,
)

__all__ = [
    "power_gossip",
    "PowerGossipState",
    "MATRIX_VIEWS",
    "MatrixLeaf",
    "LeafPlan",
    "Schedule",
    "leaf_plan",
    "orth",
    "half_step",
    "exchange",
    "matrix_round",
    "gossip_vectors",
    "round_bits",
    "failed_pairs",
    "INFO",
]

_EPS = 1e-8  # column normalisation c / (||c|| + eps), as in the reference code
_HIGHEST = jax.lax.Precision.HIGHEST  # no TF32 / bf16 passes: gossip must preserve the mean


class PowerGossipState(NamedTuple):
    """State of :func:`power_gossip`.

    Rows of ``u`` and ``v`` follow the *edge list* of the topology: every unordered pair
    ``(a, b)``, ``a < b``, that is an edge in at least one round, sorted by ``(a, b)`` (P pairs).
    ``u`` and ``v`` hold one entry per matrix leaf (node leaf ndim >= 2), in
    ``jax.tree_util.tree_leaves`` order; ``m, n`` are the leaf's matrix view and
    ``R = min(m, n, rank)``.
    """

    count: Array  # [] int32, rounds done; the gossip-iteration counter is t = count * num_iterations
    u: tuple  # per matrix leaf: [P, m, R] float32, left basis / last right-step product D_e V_hat
    v: tuple  # per matrix leaf: [P, n, R] float32, right basis / last left-step product D_e^T U_hat
    key: Array  # [] PRNG key, the base of the shared per-edge randomness


class Schedule(NamedTuple):
    """The static settings of one :func:`power_gossip` instance that shape its round."""

    num_iterations: int  # I, half-steps per round
    warm_start: bool  # reuse the last product as the next basis (False: fresh random bases)
    skip_first_round: bool  # round 0 exchanges nothing for matrix leaves
    matrix_view: str  # one of MATRIX_VIEWS
    static_edges: bool  # every pair is an edge in every round (no masking needed)


# ---- the power-iteration half-steps ----------------------------------------------------------------


def orth(c: Array) -> Array:
    """Column-wise Gram-Schmidt of ``c [..., d, R]``, each column scaled as ``c / (||c|| + 1e-8)``."""
    cols = [c[..., i] for i in range(c.shape[-1])]
    out = []
    for i in range(len(cols)):
        q = cols[i] / (jnp.linalg.norm(cols[i], axis=-1, keepdims=True) + _EPS)
        out.append(q)
        for j in range(i + 1, len(cols)):
            cols[j] = cols[j] - jnp.sum(q * cols[j], axis=-1, keepdims=True) * q
    return jnp.stack(out, axis=-1)


def _edge_products(x: Array, basis_slots: Array, side: str, pairs: PairRound) -> Array:
    """``D_e B_e`` (right) or ``D_e^T B_e`` (left) for every pair e, without gathering x per pair.

    Each node multiplies its own matrix by the basis of each of its K incident pairs (what it would
    send), ``[N, K, m or n, R]``; the pair's product is the difference of its two endpoints' messages.
    """
    num_nodes, k = basis_slots.shape[:2]
    if side == "right":  # x [N, m, n], basis_slots [N, K, n, R]
        sent = jnp.einsum("imn,iknr->ikmr", x, basis_slots, precision=_HIGHEST)
    else:  # basis_slots [N, K, m, R]
        sent = jnp.einsum("imn,ikmr->iknr", x, basis_slots, precision=_HIGHEST)
    sent = sent.reshape((num_nodes * k,) + sent.shape[2:])
    return sent[pairs.flat_b] - sent[pairs.flat_a]


def half_step(x: Array, basis: Array, side: str, pairs: PairRound) -> tuple[Array, Array, Array]:
    """One right or left power-iteration half-step of one matrix leaf, all pairs at once.

    Right (``side="right"``, ``basis`` = V [P, n, R]):
    ``V_hat = orth(V)``, ``P_e = D_e V_hat_e``, ``x_i += sum_e c_ie P_e V_hat_e^T``.
    Left (``basis`` = U [P, m, R]):
    ``U_hat = orth(U)``, ``Q_e = D_e^T U_hat_e``, ``x_i += sum_e c_ie U_hat_e Q_e^T``.
    ``c_ie`` are the slot coefficients ``pairs.coef`` (relaxation included).

    Args:
      x: [N, m, n] float32, every node's matrix.
      basis: the basis on the ``side`` of the step, [P, n, R] (right) or [P, m, R] (left).
      side: ``"right"`` or ``"left"`` (static).
      pairs: the round's :class:`~jaxgossip.algorithms._shared.pair_tables.PairRound`.

    Returns:
      ``(x + delta, basis_hat [P, n or m, R], product [P, m or n, R])``.
    """
    basis_hat = orth(basis)
    basis_slots = basis_hat[pairs.inc]  # [N, K, n or m, R]
    product = _edge_products(x, basis_slots, side, pairs)  # [P, m or n, R]
    product_slots = pairs.coef[:, :, None, None] * product[pairs.inc]  # [N, K, m or n, R]
    if side == "right":
        delta = jnp.einsum("ikmr,iknr->imn", product_slots, basis_slots, precision=_HIGHEST)
    else:
        delta = jnp.einsum("ikmr,iknr->imn", basis_slots, product_slots, precision=_HIGHEST)
    return x + delta, basis_hat, product


class MatrixCarry(NamedTuple):
    """What the iterations of one round carry, per matrix leaf, in the working view."""

    mats: tuple  # [N, rows, cols] float32, every node's working matrix
    u: tuple  # [P, rows, R] float32, working left bases
    v: tuple  # [P, cols, R] float32, working right bases


def exchange(carry: MatrixCarry, side: str, pairs: PairRound, fresh: tuple | None, static_edges: bool) -> MatrixCarry:
    """One ``side`` half-step of every matrix leaf (in the working view).

    A right step reads V (or its ``fresh`` random replacement), keeps ``V_hat`` in V (the
    reference orthonormalises in place) and stores the product in U; a left step mirrors it. Pairs
    that are not edges this round keep their bases (unless ``static_edges``).
    """
    mats, us, vs = [], [], []
    for l, (x, u, v) in enumerate(zip(*carry)):
        basis = (v if side == "right" else u) if fresh is None else fresh[l]
        x, basis_hat, product = half_step(x, basis, side, pairs)
        new_u, new_v = (product, basis_hat) if side == "right" else (basis_hat, product)
        if not static_edges:
            mask = pairs.active[:, None, None]
            new_u, new_v = jnp.where(mask, new_u, u), jnp.where(mask, new_v, v)
        mats.append(x)
        us.append(new_u)
        vs.append(new_v)
    return MatrixCarry(tuple(mats), tuple(us), tuple(vs))


# ---- the matrix views ---------------------------------------------------------------------------------
#
# The half-steps run on a free reshape of each leaf, never on a transposed copy. "leading" is the
# matrix M = reshape(x, (m, n)) itself. For "flax_kernel" the working matrix is M' = Pi M^T, the
# ---- shared per-pair randomness ----------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=3)
def _pair_normals(key: Array, codes: Array, counter: Array, size: int) -> Array:
    """[P, size] float32: row p is N(0, 1) from ``fold_in(fold_in(key, codes[p]), counter)``."""

    def one(code):
        return jax.random.normal(jax.random.fold_in(jax.random.fold_in(key, code), counter), (size,), jnp.float32)

    return jax.vmap(one)(codes)


@functools.partial(jax.jit, static_argnums=2)
def _initial_bases(key: Array, codes: Array, shapes: tuple) -> tuple[tuple, tuple]:
    """U_l [P, m, R], V_l [P, n, R] for ``shapes = ((m, n, R), ...)`` cut, in the order
    U_1, V_1, U_2, ..., from one packed draw per pair with counter 0 (jitted: one dispatch)."""
    sizes = [size for m, n, r in shapes for size in (m * r, n * r)]
    chunks = jnp.split(_pair_normals(key, codes, 0, int(sum(sizes))), np.cumsum(sizes)[:-1], axis=1)
    us = tuple(c.reshape(-1, m, r) for c, (m, n, r) in zip(chunks[0::2], shapes))
    vs = tuple(c.reshape(-1, n, r) for c, (m, n, r) in zip(chunks[1::2], shapes))
    return us, vs


def _fresh_bases(key: Array, codes: Array, t: Array, side: str, matrices: tuple, view: str) -> tuple:
    """Random working bases that replace the ones a ``side`` step reads (``warm_start=False``):
    V (right) or U (left) of every matrix leaf, one packed draw per pair from counter ``t + 1``."""
    rows = [leaf.n if side == "right" else leaf.m for leaf in matrices]
    sizes = [d * leaf.rank for d, leaf in zip(rows, matrices)]
    chunks = jnp.split(_pair_normals(key, codes, t + 1, int(sum(sizes))), np.cumsum(sizes)[:-1], axis=1)
    fresh = [c.reshape(-1, d, leaf.rank) for c, d, leaf in zip(chunks, rows, matrices)]
    if view == "flax_kernel" and side == "right":  # a fresh V enters the working view as Pi V
        fresh = [permute_rows(f, leaf.shape, True) for f, leaf in zip(fresh, matrices)]
    return tuple(fresh)


def _as_key(seed: Any) -> Array:
    if isinstance(seed, jax.Array) and jnp.issubdtype(seed.dtype, jax.dtypes.prng_key):
        if seed.shape != ():
            raise ValueError(f"seed must be a single PRNG key (shape ()), got shape {seed.shape}")
        return seed
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be a Python int or a jax.random.key, got {type(seed).__name__} {seed!r}")
    return jax.random.key(int(seed))


# ---- one round ----------------------------------------------------------------------------------------


def matrix_round(
    leaves: list, state: PowerGossipState, matrices: tuple[MatrixLeaf, ...], pairs: PairRound, schedule: Schedule
) -> tuple[list, tuple, tuple]:
    """The I iterations of round ``state.count`` on the matrix leaves.

    Iteration ``j`` is the global iteration ``t = count * I + j``: a right step for odd t, a left
    step for even t, none in round 0 with ``skip_first_round``. ``pairs.coef`` must already carry
    the relaxation gamma.

    Returns:
      ``(new matrix leaves in the order of matrices, u, v)`` with the stored (view) bases.
    """
    view = schedule.matrix_view

    def step(side, t, carry):
        fresh = None
        if not schedule.warm_start:
            fresh = _fresh_bases(state.key, pairs.codes, t, side, matrices, view)
        return exchange(carry, working_side(side, view), pairs, fresh, schedule.static_edges)

    def iteration(j, carry):
        t = state.count * schedule.num_iterations + j
        branch = jnp.where(t % 2 == 1, 1, 2)
        if schedule.skip_first_round:
            # The reference's iteration loop breaks at t = 0, which ends the whole first round:
            # no iteration of round 0 exchanges (docs/algorithms.md, section power_gossip).
            branch = jnp.where(state.count == 0, 0, branch)
        branches = [lambda c: c, functools.partial(step, "right", t), functools.partial(step, "left", t)]
        return jax.lax.switch(branch, branches, carry)

    mats = tuple(working_view(leaves[leaf.index], view) for leaf in matrices)
    carry = MatrixCarry(mats, *working_bases(state.u, state.v, matrices, view))
    carry = jax.lax.fori_loop(0, schedule.num_iterations, iteration, carry)
    new_leaves = [
        mat.reshape(leaves[leaf.index].shape).astype(leaves[leaf.index].dtype)
        for leaf, mat in zip(matrices, carry.mats)
    ]
    return (new_leaves, *view_bases(carry.u, carry.v, matrices, view))


def gossip_vectors(topology: Topology, leaves: list, vectors: tuple[int, ...], count: Array, gamma: Any) -> list:
    """Exact relaxed gossip of the vector leaves, once per round, as one [N, sum of sizes] buffer.

    ``x_i <- x_i + gamma (sum_j W_ij x_j - x_i)``; returns the new leaves in the order of ``vectors``.
    """
    vec = [leaves[i] for i in vectors]
    dtype = jnp.promote_types(jnp.result_type(*vec), jnp.float32)
    flat = jnp.concatenate([leaf.reshape(topology.num_nodes, -1).astype(dtype) for leaf in vec], axis=1)
    flat = relax(flat, mix(topology, flat, count), gamma)
    sizes = [int(np.prod(leaf.shape[1:], dtype=np.int64)) for leaf in vec]
    parts = jnp.split(flat, np.cumsum(sizes)[:-1], axis=1)
    return [part.reshape(leaf.shape).astype(leaf.dtype) for leaf, part in zip(vec, parts)]


def round_bits(
    leaves: list, matrices: tuple, vectors: tuple, pairs: PairRound, count: Array, schedule: Schedule
) -> Array:
    """[N] bits each node sent in round ``count``, to each of its ``pairs.degree`` neighbours:
    per exchange ``R m`` (right) or ``R n`` (left) values per matrix leaf, and every vector leaf
    once; a value costs its leaf dtype's bits (:func:`jaxgossip.compress.value_bits`)."""

    def value_bits(i):
        return compress.value_bits(jnp.result_type(leaves[i]))

    right = float(sum(leaf.rank * leaf.m * value_bits(leaf.index) for leaf in matrices))
    left = float(sum(leaf.rank * leaf.n * value_bits(leaf.index) for leaf in matrices))
    dense = float(sum(int(np.prod(jnp.shape(leaves[i])[1:], dtype=np.int64)) * value_bits(i) for i in vectors))
    t = count * schedule.num_iterations + jnp.arange(schedule.num_iterations)
    if schedule.skip_first_round:
        exchanged = jnp.broadcast_to(count != 0, t.shape)
    else:
        exchanged = jnp.ones_like(t, bool)
    num_right = jnp.sum(exchanged & (t % 2 == 1)).astype(jnp.float32)
    num_left = jnp.sum(exchanged & (t % 2 == 0)).astype(jnp.float32)
    return jnp.asarray(pairs.degree, jnp.float32) * (num_right * right + num_left * left + dense)


# ---- failures -----------------------------------------------------------------------------------------


def failed_pairs(pairs: PairRound, keep: Array) -> PairRound:
    """The round's pairs with the failed ones switched off (``keep`` [P] bool, by pair id).

    A failed pair gets coefficient 0 at both endpoints (no update of x), inactive (its U, V keep
    their warm start) and leaves both endpoints' degree (no bits).
    """
    slot_keep = keep[pairs.inc]  # [N, K]
    occupied = jnp.arange(pairs.inc.shape[1])[None, :] < jnp.asarray(pairs.degree)[:, None]
    return pairs._replace(
        coef=jnp.where(slot_keep, pairs.coef, jnp.zeros((), pairs.coef.dtype)),
        active=pairs.active & keep,
        degree=jnp.sum(occupied & slot_keep, axis=1),
    )


def _pair_map(topology: Topology, tables: PairTables) -> np.ndarray | None:
    """[P] int: the index of each PowerGossip pair in the failure sampler's pair list (None for a
    fixed graph)."""
    if not topology.stochastic:
        return None
    n = topology.num_nodes
    codes = tables.a.astype(np.int64) * n + tables.b
    ours = np.asarray(topology.sampler.pair_codes)
    index = np.searchsorted(ours, codes)
    if index.max(initial=0) >= ours.size or not np.array_equal(ours[index], codes):
        raise ValueError(f"power_gossip: the pairs of {topology.name} do not match its support's pairs")
    return index.astype(np.int32)


# ---- the factory --------------------------------------------------------------------------------------


def power_gossip(
    topology: Topology,
    rank: int = 1,
    num_iterations: int = 1,
    gamma: Any = 1.0,
    warm_start: bool = True,
    skip_first_round: bool = True,
    vector_gamma: Any = 1.0,
    matrix_view: str = "leading",
    seed: Any = 0,
) -> GossipAlgorithm:
    """PowerGossip: exact gossip with each edge difference projected onto a rank-R subspace.

    For every undirected edge ``e = (a, b)``, ``a < b``, and every matrix leaf, both endpoints
    share a rank-R linear compressor, refined by one power-iteration half-step per exchange and
    warm-started from the previous one. Use it on symmetric graphs when bandwidth is the bottleneck
    (ResNet-20 on the 8-ring: ~56x less traffic than exact gossip at rank 1). Leaves whose node
    part has ndim <= 1 (biases, norms) are gossiped exactly every round.

    .. math::

        D_e = X_b - X_a, \\qquad t \\text{ odd: } \\hat V_e = \\mathrm{orth}(V_e),\\;
        U_e \\leftarrow D_e \\hat V_e,\\; \\Delta_e = U_e \\hat V_e^\\top; \\qquad
        t \\text{ even: } \\hat U_e = \\mathrm{orth}(U_e),\\; V_e \\leftarrow D_e^\\top \\hat U_e,\\;
        \\Delta_e = \\hat U_e V_e^\\top;

        X_a \\leftarrow X_a + \\gamma \\sum_{e \\ni a} W_{ab} \\Delta_e, \\qquad
        X_b \\leftarrow X_b - \\gamma \\sum_{e \\ni b} W_{ba} \\Delta_e \\qquad \\text{(Jacobi: all } D_e
        \\text{ from the same X)},

        x_i \\leftarrow x_i + \\gamma_v \\Big(\\sum_j W_{ij} x_j - x_i\\Big) \\text{ for 1-D leaves, once per round.}

    ``orth`` is column-wise Gram-Schmidt with columns scaled ``c / (||c|| + 1e-8)``. The iteration
    counter is global, ``t = count * I + j`` for iteration ``j < I`` of round ``count``. Each
    node sends ``R m`` (right) or ``R n`` (left) values per matrix leaf and exchange, and every
    1-D leaf once, to each neighbour. The first-round rule, the shared per-pair randomness, the
    memory-lean kernel and the ``flax_kernel`` view are explained in docs/algorithms.md, section
    power_gossip.

    Failures (``with_failures`` of an undirected graph; docs/topologies.md, section stochastic
    graphs): a pair that fails in a round (link down, or an endpoint down) simply skips it: no
    update of either endpoint, no bits, and its U, V keep their warm start for the next round the
    pair is up. The 1-D leaves are gossiped with the repaired W(t). The per-pair state needs a fixed
    pair set, so graphs that draw new neighbours every round (``random_matching``) are refused.

    Args:
      topology: a symmetric (undirected), doubly stochastic graph, ``W(t) = W(t)^T``; static or
        time-varying (each pair keeps its own U, V over the rounds where it is not an edge), or
        ``with_failures`` of one.
      rank: R, the largest rank of the projections (Python int >= 1); a leaf uses
        ``min(m, n, rank)``.
      num_iterations: I, power-iteration half-steps (exchanges) per round (Python int >= 1).
      gamma: relaxation (the reference's ``diffusion_rate``) > 0 applied to the matrix leaves;
        float or array (sweepable). 1.308 is the 8-ring optimum used in the paper.
      warm_start: reuse the last product as the next basis (True, the method) or draw a fresh
        random basis before each iteration (False, the paper's "rand" ablation).
      skip_first_round: no compressed exchange in round 0 (True, the reference code); False
        exchanges from the start (a left half-step on the random U).
      vector_gamma: relaxation > 0 of the exact gossip on 1-D leaves; the reference uses 1.0 there
        whatever ``gamma`` is, ``vector_gamma=gamma`` gives a uniform rate.
      matrix_view: how a node leaf of ndim >= 2 becomes an ``m x n`` matrix: ``"leading"``,
        ``(shape[0], -1)`` (the reference's view of PyTorch tensors, right for any pytree), or
        ``"flax_kernel"``, the PyTorch matrix of a flax kernel, ``(kh, kw, C_in, F) -> (F, C_in *
        kh * kw)`` (as :func:`jaxgossip.algorithms.matrix_views.as_matrix`), computed without
        transposing the leaf.
      seed: Python int or ``jax.random.key``, base of the shared per-edge randomness.

    Returns:
      A :class:`~jaxgossip.types.GossipAlgorithm` whose state is :class:`PowerGossipState`; its
      ``debias`` is the identity.

    Raises:
      ValueError: non-symmetric (directed) or not doubly stochastic graph; ``rank`` or
        ``num_iterations`` < 1; ``gamma`` or ``vector_gamma`` <= 0; unknown ``matrix_view``.
      TypeError: non-int ``rank``/``num_iterations``/``seed``, non-bool flags.

    References:
      Vogels, Karimireddy, Jaggi, "Practical Low-Rank Communication Compression in Decentralized
      Deep Learning", NeurIPS 2020 (arXiv:2008.01425).
    """
    check_graph("power_gossip", INFO, topology)
    support = topology.support  # the fixed graph: the graph itself, or the one with_failures wraps
    rank = check_int("rank", rank, 1)
    num_iterations = check_int("num_iterations", num_iterations, 1)
    check_positive("gamma", gamma)
    check_positive("vector_gamma", vector_gamma)
    for name, flag in (("warm_start", warm_start), ("skip_first_round", skip_first_round)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    if matrix_view not in MATRIX_VIEWS:
        raise ValueError(f"matrix_view={matrix_view!r} is unknown; known views: {MATRIX_VIEWS}")
    base_key = _as_key(seed)
    tables = pair_tables(support)
    pair_map = _pair_map(topology, tables)
    static_edges = bool(tables.active.all()) and not topology.stochastic
    schedule = Schedule(num_iterations, bool(warm_start), bool(skip_first_round), matrix_view, static_edges)

    def init_fn(params):
        check_params(topology, params)
        matrices, _ = leaf_plan(jax.tree_util.tree_leaves(params), matrix_view, rank)
        codes = pair_round(tables, 0).codes
        us, vs = _initial_bases(base_key, codes, tuple((leaf.m, leaf.n, leaf.rank) for leaf in matrices))
        return PowerGossipState(jnp.zeros([], jnp.int32), us, vs, base_key)

    def step_fn(params, state, key):
        # The compression randomness is per edge (state.key), so both endpoints agree; the key only
        # draws the round's graph of a stochastic topology.
        drawn = topology.draw(key, state.count)
        leaves, treedef = jax.tree_util.tree_flatten(params)
        matrices, vectors = leaf_plan(leaves, matrix_view, rank)
        if len(matrices) != len(state.u):
            raise ValueError(
                f"params have {len(matrices)} matrix leaves but the state was built for {len(state.u)}; "
                "call init on params of the same structure"
            )
        pairs = pair_round(tables, state.count)
        if pair_map is not None:
            pairs = failed_pairs(pairs, drawn.pair_keep[pair_map])
        new_leaves, u, v = list(leaves), state.u, state.v
        if vectors:
            for i, leaf in zip(vectors, gossip_vectors(drawn.graph, leaves, vectors, state.count, vector_gamma)):
                new_leaves[i] = leaf
        if matrices:
            # The relaxation enters every pair update through its slot coefficient, once per round.
            relaxed = pairs._replace(coef=jnp.asarray(gamma, jnp.float32) * pairs.coef)
            mats, u, v = matrix_round(leaves, state, matrices, relaxed, schedule)
            for leaf, mat in zip(matrices, mats):
                new_leaves[leaf.index] = mat
        bits = round_bits(leaves, matrices, vectors, pairs, state.count, schedule)
        new_state = PowerGossipState(state.count + 1, u, v, state.key)
        return jax.tree_util.tree_unflatten(treedef, new_leaves), new_state, StepInfo(bits=bits)

    def debias_fn(params, state):
        del state
        return params

    return sign(GossipAlgorithm(init_fn, step_fn, debias_fn), "power_gossip", INFO)


def _exchanges(options) -> int:
    """Each of the ``num_iterations`` power iterations is one sequential exchange."""
    return int(options.get("num_iterations", 1))


INFO = AlgorithmInfo(
    power_gossip,
    graph=GraphNeeds(
        mixing="symmetric",
        stackable=False,
        stochastic_graphs="failures",
        reasons={"stochastic_graphs": "its U, V state lives on a fixed set of pairs"},
    ),
    cost=CostFacts(exchanges=_exchanges),
    sweep=SweepFacts(
        shape_options={
            "rank": "the PowerGossip rank R fixes the shapes of U [P, m, R] and V [P, n, R]",
            "num_iterations": "PowerGossip iterations are unrolled per round",
        },
        step_size="gamma",
        relaxation_gamma=True,
    ),
    # Flax kernels are (kh, kw, C_in, F): view them as PyTorch's (F, C_in kh kw) matrices, as
    # the reference compresses them (docs/training.md, section training recipes and models).
    hooks=TrainerHooks(trainer_options={"matrix_view": "flax_kernel"}),
)
