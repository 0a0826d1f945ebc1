"""Sparse-Push: push-sum gossip with top-k compressed messages and public copies (Choco-style).

Our reconstruction (see docs/algorithms.md, sections sparse_push and decisions) of the
communication step of Sparse-Push: Choco-Gossip applied to push-sum numerators over a
column-stochastic, possibly directed and time-varying graph, with the push-sum weight sent
uncompressed. Each node sends only the top-k entries of the change of its model since its last
transmission; the public copies ``x_hat`` carry everything sent so far, so compression errors are
delayed, not lost.

On time-varying graphs a node keeps one public copy (and one received sum ``s``) per distinct graph
of the schedule, see :func:`sparse_push` for why the single accumulated ``s`` of the author's code
is not enough there.

References:
  Aketi, Singh, Rabaey, "Sparse-Push: Communication- & Energy-Efficient Decentralized Distributed
  Learning over Directed & Time-Varying Graphs with non-IID Datasets", arXiv:2102.05715, 2021.
  Koloskova, Stich, Jaggi, "Decentralized Stochastic Optimization and Gossip Algorithms with
  Compressed Communication", ICML 2019 (arXiv:1902.00340) (Choco-Gossip).
  Assran, Loizou, Ballas, Rabbat, "Stochastic Gradient Push for Distributed Deep Learning",
  ICML 2019 (arXiv:1811.10792) (push-sum / SGP).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from optax import tree_utils as otu

from jaxgossip import compress
from jaxgossip.algorithms._shared.common import check_positive, check_public_init, per_round, tree_add
from jaxgossip.algorithms.push_sum import divide_by_weight
from jaxgossip.algorithms.registry import check_graph, sign
from jaxgossip.compress import fused
from jaxgossip.ops.mixing import check_params, mix, per_node
from jaxgossip.topology import Topology
from jaxgossip.types import (
    AlgorithmInfo,
    Array,
    GossipAlgorithm,
    GraphNeeds,
    Params,
    PRNGKey,
    StepInfo,
    SweepFacts,
    TrainerHooks,
)

__all__ = [
    "sparse_push",
    "SparsePushState",
    "PUBLIC_COPIES",
    "check_public_copies",
    "graph_copies",
    "compressed_push_sum",
    "TopKBudget",
    "INFO",
]

PUBLIC_COPIES = ("per_graph", "shared")

# (residual tree, params tree, key) -> (q tree, payload bits [N] of one node's message, weight excluded)
CompressFn = Callable[[Params, Params, PRNGKey], tuple[Params, Array]]


class TopKBudget(NamedTuple):
    """The budget of a ``compress_fn`` that is an exact top-k, for the fused round (:mod:`jaxgossip.compress.fused`)."""

    spec: compress.TopKSpec  # K per leaf and the index bits
    # SCSP's budget growth: leaf sizes D_l -> the [L, M] steps of jaxgossip.compress.fused.top_k_round's
    # growth (None: k_i = K)
    growth: Callable[[Sequence[int]], Array] | None = None


class SparsePushState(NamedTuple):
    """State of :func:`sparse_push` (and :func:`~jaxgossip.algorithms.scsp.scsp`).

    P is the number of public-copy sets: the number of distinct graphs in the topology's schedule
    with ``public_copies="per_graph"`` (1 for a static graph), 1 with ``"shared"``.
    """

    w: Array  # [N] float32, push-sum weights w_i (init 1); the numerators are the params
    x_hat: Params  # leaves [P, N, ...], own public copies x_hat_i^(p) (init 0 or x^0), one per distinct graph p
    s: Params  # leaves [P, N, ...], s_i^(p): sum of the weighted messages received over graph p (init 0 or
    # sum_{j != i} W_ij(p) x^0_j)
    count: Array  # [] int32, communication rounds done so far
    # SCSP: the [L, M] steps of its budget rule for the fused round (jaxgossip.compress.fused.top_k_round's
    # growth), fixed for the run, so drawn once at init; None without a budget growth
    budget_steps: Array | None = None

    # Declares ``w`` push-sum weights (jaxgossip.types.carries_push_sum_weight): the final merge
    # mixes them with the numerators. A class attribute, not a field.
    push_sum_weight = True


def check_public_copies(public_copies: str) -> str:
    """Raises ValueError unless ``public_copies`` is one of :data:`PUBLIC_COPIES`."""
    if public_copies not in PUBLIC_COPIES:
        raise ValueError(f"public_copies={public_copies!r} is unknown; known modes: {PUBLIC_COPIES}")
    return public_copies


def graph_copies(topology: Topology, public_copies: str = "per_graph") -> np.ndarray:
    """Which public-copy set round ``t`` uses: ``table[t mod T]``, numpy [T] int32.

    ``"per_graph"`` gives every distinct mixing matrix of the schedule its own set (rounds whose
    graphs are identical share one); ``"shared"`` maps every round to set 0. P = ``table.max() + 1``.
    """
    check_public_copies(public_copies)
    table = np.zeros(topology.period, dtype=np.int32)
    if public_copies == "shared":
        return table
    seen: dict[bytes, int] = {}
    for t in range(topology.period):
        # from_edges sorts each round's edges and pads them alike, so identical graphs have
        # identical rows; compare them as bytes.
        signature = b"".join(
            np.ascontiguousarray(a[t]).tobytes() for a in (topology.senders, topology.receivers, topology.weights)
        )
        table[t] = seen.setdefault(signature, len(seen))
    return table


def compressed_push_sum(
    topology: Topology,
    name: str,
    compress_fn: CompressFn,
    gamma: Any,
    public_copies: str,
    public_init: str = "zero",
    top_k_budget: TopKBudget | None = None,
) -> GossipAlgorithm:
    """The Sparse-Push round with a pluggable compressor (shared by sparse_push and scsp).

    ``compress_fn(residual, params, key) -> (q, payload_bits [N])`` compresses every node's
    residual ``x_i - x_hat_i``; a message to one out-neighbour costs ``payload_bits + 32``.
    When ``compress_fn`` is an exact top-k whose budget ``top_k_budget`` describes, the round runs
    in the fused CPU kernel of :mod:`jaxgossip.compress.fused` on fixed graphs (same kept entries and bits,
    float32 round-off apart); the XLA formulation below serves every other case and platform.

    On ``with_failures`` of a fixed graph (round t: the repaired W(t) of the support's graph p) the
    copies stay consistent as in Choco (docs/topologies.md, section stochastic graphs): ``q_j`` (and
    ``w_j``) reach all of j's out-neighbours in the support and are charged, a down node sends
    ``q_j = 0`` and nothing is charged, and the averaging uses the repaired W(t) on the copies,
    ``x_i += gamma (sum_j W(t)_ij x_hat_j^(p) - x_hat_i^(p))``, ``w_i += gamma (sum_j W(t)_ij w_j - w_i)``
    (both column stochastic, so ``sum x`` and ``sum w`` are kept), computed as the rule without
    failures minus ``gamma ((W - W(t)) x_hat)_i`` (resp. ``w``); ``s^(p)`` keeps its meaning
    ``sum_{j != i} W_ij x_hat_j^(p)`` on the fixed graph. Without failures it is bitwise the rule above.

    ``public_init="model"`` starts every set p at ``x_hat^(p) = x^0`` and
    ``s_i^(p) = sum_{j != i} W_ij(p) x^0_j`` (as if the initial numerators had been sent over graph
    p), so the invariant of :func:`sparse_push` holds from round 0.

    The calling factory has checked the graph against its metadata (``check_graph`` with its
    ``INFO``: column stochastic, a fixed graph or failures of one).
    """
    check_positive("gamma", gamma)
    check_public_init(public_init, name)
    support = topology.support  # the fixed graph: the graph itself, or the one with_failures wraps
    table = graph_copies(support, public_copies)
    num_copies = int(table.max()) + 1
    # The first round that uses each public-copy set: its graph is the set's graph.
    first_round = [int(np.flatnonzero(table == p)[0]) for p in range(num_copies)]

    def copy_index(t):
        if num_copies == 1:
            return 0
        return jnp.asarray(table)[jnp.asarray(t, jnp.int32) % topology.period]

    def take(tree, c):
        if isinstance(c, int):
            return jax.tree_util.tree_map(lambda a: a[c], tree)
        return jax.tree_util.tree_map(lambda a: jax.lax.dynamic_index_in_dim(a, c, 0, keepdims=False), tree)

    def put(tree, c, value):
        if num_copies == 1:
            return jax.tree_util.tree_map(lambda v: v[None], value)
        return jax.tree_util.tree_map(lambda a, v: jax.lax.dynamic_update_index_in_dim(a, v, c, 0), tree, value)

    def received(params, t):
        """``sum_{j != i} W_ij(t) x_j`` for every node i: what one exchange of ``params`` over W(t) delivers."""
        a = per_round(support.self_weights, t)
        return jax.tree_util.tree_map(lambda m, x: m - per_node(a, x, cast=True) * x, mix(support, params, t), params)

    def growth_steps(params):
        if top_k_budget is None or top_k_budget.growth is None:
            return None
        return top_k_budget.growth([leaf[0].size for leaf in jax.tree_util.tree_leaves(params)])

    def init_fn(params):
        check_params(topology, params)
        if public_init == "model":
            x_hat = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (num_copies,) + x.shape), params)
            per_set = [received(params, t) for t in first_round]
            s = jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *per_set)
        else:
            x_hat = s = jax.tree_util.tree_map(lambda x: jnp.zeros((num_copies,) + x.shape, x.dtype), params)
        return SparsePushState(
            w=jnp.ones([topology.num_nodes], jnp.float32),
            x_hat=x_hat,
            s=s,
            count=jnp.zeros([], jnp.int32),
            budget_steps=growth_steps(params),
        )

    def step_fn(params, state, key):
        t = state.count
        request = None
        if top_k_budget is not None:  # an exact top-k: jaxgossip.compress.fused may run the round natively
            request = fused.FusedRequest(
                top_k_budget.spec,
                copy=copy_index(t),
                self_in_s=False,
                growth=None if top_k_budget.growth is None else state.budget_steps,
                header_bits=compress.WEIGHT_BITS,
            )

        def finish(new_params, all_x_hat, all_s, message_bits):
            mixed_w = mix(support, state.w, t)
            w = state.w + jnp.asarray(gamma, jnp.float32) * (mixed_w - state.w)
            return new_params, SparsePushState(w, all_x_hat, all_s, t + 1, state.budget_steps), message_bits

        new_params, new_state, message_bits = fused.dispatch(
            topology,
            params,
            state.x_hat,
            state.s,
            t,
            gamma,
            request,
            xla_round=lambda: xla_round(params, state, key),
            finish=finish,
        )
        return new_params, new_state, StepInfo(bits=per_round(support.out_degree, t) * message_bits)

    def xla_round(params, state, key):
        t = state.count
        c = copy_index(t)
        x_hat, s = take(state.x_hat, c), take(state.s, c)
        residual = otu.tree_sub(params, x_hat)
        q, payload_bits = compress_fn(residual, params, key)
        message_bits = payload_bits + compress.WEIGHT_BITS
        if topology.stochastic:
            drawn = topology.draw(key, t)
            alive = drawn.alive.astype(jnp.float32)
            q = jax.tree_util.tree_map(lambda q_: q_ * per_node(alive, q_, cast=True), q)  # a down node sends nothing
            message_bits = message_bits * alive
        x_hat = tree_add(x_hat, q)
        a = per_round(support.self_weights, t)  # [N], W_t[i, i]
        mixed_q, mixed_w = mix(support, (q, state.w), t)
        # r_i = sum_{j != i} W_t[i, j] q_j: what reached node i from its current in-neighbours.
        s = jax.tree_util.tree_map(lambda s_, m, q_: s_ + (m - per_node(a, q_, cast=True) * q_), s, mixed_q, q)

        def correct(x, s_, h):
            return x + jnp.asarray(gamma, x.dtype) * (s_ + per_node(a, h, cast=True) * h - h)

        all_x_hat, all_s = put(state.x_hat, c, x_hat), put(state.s, c, s)
        if num_copies > 1:
            # Read the updated copies back from the stacked buffers (same values). Otherwise XLA
            # fuses x_hat + q and s + r into the correction below as reads of the OLD [P, N, ...]
            # buffers after they are overwritten, so it copies both buffers whole every round
            # instead of updating the active slice in place (2x slower, 2.5x the temporary memory).
            x_hat, s = take(all_x_hat, c), take(all_s, c)
        if topology.stochastic:
            # W(t) = W - (W - W(t)): the failed links leave the averaging of x (on the copies) and w.
            lost_x, lost_w = mix(drawn.lost, (x_hat, state.w), t)

            def repaired(x, s_, h, lost):
                return x + jnp.asarray(gamma, x.dtype) * (s_ + per_node(a, h, cast=True) * h - lost - h)

            new_params = jax.tree_util.tree_map(repaired, params, s, x_hat, lost_x)
            mixed_w = mixed_w - lost_w
        else:
            new_params = jax.tree_util.tree_map(correct, params, s, x_hat)
        # w_i + gamma (mu_i + W_ii w_i - w_i) with mu_i + W_ii w_i = sum_j W_ij w_j.
        w = state.w + jnp.asarray(gamma, jnp.float32) * (mixed_w - state.w)
        new_state = SparsePushState(w, all_x_hat, all_s, t + 1, state.budget_steps)
        return new_params, new_state, message_bits

    def debias_fn(params, state):
        return divide_by_weight(params, state.w)

    return GossipAlgorithm(init_fn, step_fn, debias_fn)


def sparse_push(
    topology: Topology,
    fraction: float | None = None,
    k: int | None = None,
    gamma: Any = 0.05,
    index_bits: Any = "log2",
    public_copies: str = "per_graph",
    public_init: str = "zero",
) -> GossipAlgorithm:
    """Sparse-Push: compressed push-sum with top-k messages, public copies and exact weights.

    Use it for communication-efficient decentralized training on directed and time-varying graphs
    (``one_peer_exponential``, ``directed_ring``, ``random_directed``, schedules): every round a node
    sends its out-neighbours only the K largest entries (per leaf) of ``x_i - x_hat_i``, the change
    of its numerator since what it has already sent, plus its push-sum weight (uncompressed). The
    trainer evaluates gradients at ``z_i = x_i / w_i`` (``debias``) and updates ``x_i``, as in SGP.
    With ``fraction=1`` (or ``k >= D_leaf``) and ``gamma=1`` it is exactly :func:`push_sum`; with
    compression ``gamma`` must be small (Choco-style; the author's recipe is top-1 % with
    ``gamma = 0.01``; ``gamma = 1`` diverges under top-10 % on an 8-node directed ring).

    The default ``gamma = 0.05`` is small enough for the budgets in use: the untransmitted
    residual ``x_i - x_hat_i`` feeds back into the next round, and a step too large for the kept
    fraction makes it grow round after round. On the default training task (digits, 8 nodes, 200
    rounds) ``gamma = 1`` at top-10 % on the static exponential graph diverges (CNN: NaN by round 70;
    MLP: loss blow-up by round 100); with the MLP, top-1 % at ``gamma = 0.3`` drives the consensus
    distance above the squared norm of the averaged model, and ``gamma = 0.2`` leaves it 8x that of
    0.1. With ``gamma = 0.05`` the CNN trains at top-10 % and top-1 % on the ring, exponential,
    directed ring and one-peer exponential graphs (95-98 % test accuracy; push-sum: 98.6 %). The
    budget has no default: pass ``fraction`` or ``k``.

    One round t for node i, with ``W = W(t)`` column stochastic, ``p = p(t)`` the public-copy set of
    the graph used at round t (see below), ``x_i`` the numerator (params), ``w_i`` the weight:

    .. math::

        q_i &= \\mathrm{TopK}(x_i - \\hat x_i^{(p)}) \\quad\\text{(per leaf)} \\\\
        \\hat x_i^{(p)} &\\leftarrow \\hat x_i^{(p)} + q_i \\\\
        s_i^{(p)} &\\leftarrow s_i^{(p)} + \\textstyle\\sum_{j \\ne i} W_{ij}\\, q_j \\\\
        x_i &\\leftarrow x_i + \\gamma \\big(s_i^{(p)} + W_{ii}\\, \\hat x_i^{(p)} - \\hat x_i^{(p)}\\big) \\\\
        w_i &\\leftarrow w_i + \\gamma \\big(\\textstyle\\sum_{j \\ne i} W_{ij}\\, w_j + W_{ii}\\, w_i - w_i\\big)

    Node i only uses what reached it: its own copy and the messages ``W_ij q_j`` of its current
    in-neighbours, summed into ``s_i`` (the information-flow rule, docs/algorithms.md, section decisions).

    Why one public-copy set per distinct graph (``public_copies="per_graph"``, the default). The
    single accumulated ``s_i`` of the author's code (``"shared"``: one set, ``p = 0`` always) equals
    ``sum_{j != i} W_ij x_hat_j`` only while W is fixed. On a time-varying graph it is
    ``sum_tau sum_{j != i} W_ij(tau) q_j(tau)``, messages weighted with the graph of the round they
    were sent in. Summing the x-update over i then gives
    ``gamma sum_j sum_tau (W_jj(t) - W_jj(tau)) q_j(tau)``, so ``sum_i x_i`` is conserved only if
    every self weight is constant in time (true for ``one_peer_exponential``, false for schedules of
    irregular digraphs, where the shared rule drifts and diverges). Worse, even with constant self
    weights and no compression its fixed points are not consensus: on ``one_peer_exponential(8)``
    with ``fraction=1, gamma=1`` the shared rule stalls at ``x / w`` away from the average (checked
    in tests/algorithms/test_push_sum.py). Keeping a set ``(x_hat^(p), s^(p))`` for each distinct graph p of the
    schedule restores ``s_i^(p) = sum_{j != i} W_ij(p) x_hat_j^(p)`` with only received messages
    (graph p's in-neighbours are exactly the nodes that send to i whenever p is used), hence:
    ``sum_i x_i`` and ``sum_i w_i`` are conserved exactly (column stochasticity), the round is
    Choco-Gossip on graph p, and ``fraction=1, gamma=1`` reproduces push-sum ``x <- W(t) x`` on any
    schedule. Cost: P = number of distinct graphs (``ceil(log2 N)`` for ``one_peer_exponential``)
    sets of two model-sized buffers instead of one; messages and bits are unchanged. On a static
    graph both modes are identical (P = 1) and match the author's update rule.

    Bits: one message per (sender, out-neighbour) pair, self excluded, each costing
    ``sum over leaves of K_leaf (32 + index bits) + 32`` (values, indices, the fp32 weight); index
    bits are ``ceil(log2 D_leaf)`` or the fixed ``index_bits`` (64 reproduces the EPFL codes).

    Speed: on fixed graphs with float32 leaves a CPU program runs the round as one native call over
    all leaves (:mod:`jaxgossip.compress.fused`; same kept entries, copies and bits, ``x`` and ``s`` to
    float32 round-off; ``JAXGOSSIP_FUSED=0`` keeps the XLA formulation).

    Failures (``with_failures`` of a fixed graph): see :func:`compressed_push_sum`; graphs whose
    neighbours change every round (``random_out``) are refused, since no node holds its new
    in-neighbours' public copies.

    Args:
      topology: column-stochastic graph, static or time-varying, or ``with_failures`` of one.
      fraction: kept fraction of each leaf in (0, 1]: ``K_leaf = max(1, floor(fraction D_leaf))``.
      k: kept entries per leaf (>= 1), ``K_leaf = min(k, D_leaf)``; exactly one of fraction / k.
      gamma: consensus step size > 0 (the author's ``eta``); float or array (sweepable under vmap);
        default 0.05 (see above; ``jaxgossip tune-gamma`` finds the best one for a run).
      index_bits: ``"log2"`` or a fixed index width in bits (e.g. 64).
      public_copies: ``"per_graph"`` (default, sound on time-varying graphs) or ``"shared"`` (the
        literal single-``s`` rule; exact only on static graphs, kept for ablations).
      public_init: ``"zero"`` (default) or ``"model"``: the public copies start at 0, or at the
        initial numerators (no bits spent re-sending an identical initial model; see
        :func:`compressed_push_sum`).

    Returns:
      A :class:`~jaxgossip.types.GossipAlgorithm` with state :class:`SparsePushState`; ``debias``
      returns ``x / w``.

    References:
      Aketi, Singh, Rabaey, arXiv:2102.05715, 2021 (Sparse-Push); update rule reconstructed from the
      first author's compressed push-sum code (see docs/algorithms.md, section sparse_push).
      Koloskova, Stich, Jaggi, ICML 2019 (arXiv:1902.00340) (Choco-Gossip).
      Assran, Loizou, Ballas, Rabbat, ICML 2019 (arXiv:1811.10792) (SGP).
    """
    check_graph("sparse_push", INFO, topology)
    comp = compress.make_for("sparse_push", "top_k", fraction=fraction, k=k, index_bits=index_bits)
    check_positive("gamma", gamma)
    check_public_copies(public_copies)

    def compress_fn(residual, params, key):
        del params
        return compress.compress_tree(comp, residual, key)

    alg = compressed_push_sum(
        topology, "sparse_push", compress_fn, gamma, public_copies, public_init, TopKBudget(comp.top_k)
    )
    return sign(alg, "sparse_push", INFO)


INFO = AlgorithmInfo(
    sparse_push,
    graph=GraphNeeds(
        mixing="column_stochastic",
        stochastic_graphs="failures",
        reasons={"stochastic_graphs": "its public copies x_hat_j live at j's fixed out-neighbours"},
    ),
    sweep=SweepFacts(
        shape_options={
            "fraction": "top-k keeps K = floor(fraction * D) entries, a static shape",
            "k": "top-k keeps K entries, a static shape",
        },
        step_size="gamma",
    ),
    # the budget K = fraction * D is the user's choice: no default
    hooks=TrainerHooks(public_init=True, example_options={"fraction": 0.1}),
)
