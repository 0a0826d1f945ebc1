"""Choco-Gossip: gossip with compressed messages and public copies (the communication of Choco-SGD).

Every node keeps a public copy ``x_hat_i`` of its own model, known to its neighbours, and the
weighted sum ``s_i = sum_j W_ij x_hat_j`` of the public copies it can see (itself included). Each
round it sends only the compressed difference ``q_i = C(x_i - x_hat_i)``; everyone who receives it
moves ``x_hat_i`` by ``q_i``, and nodes pull their model towards ``s_i`` with step size ``gamma``.

References:
  Koloskova, Stich, Jaggi, "Decentralized Stochastic Optimization and Gossip Algorithms with
  Compressed Communication", ICML 2019 (arXiv:1902.00340).
  Koloskova*, Lin*, Stich, Jaggi, "Decentralized Deep Learning with Arbitrary Communication
  Compression", ICLR 2020 (arXiv:1907.09356).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from optax import tree_utils as otu

from jaxgossip import compress
from jaxgossip.algorithms._shared.common import (
    check_positive,
    check_public_init,
    per_round,
    tree_add,
    tree_add_scaled,
)
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
    StepInfo,
    SweepFacts,
    TrainerHooks,
)

__all__ = ["choco", "ChocoState", "INFO"]


class ChocoState(NamedTuple):
    """State of :func:`choco`."""

    x_hat: Params  # leaves [N, ...], public copies x_hat_i (what the neighbours know of node i)
    s: Params  # leaves [N, ...], s_i = sum_j W_ij x_hat_j over in-neighbours and self (W: the fixed graph)
    count: Array  # [] int32, communication rounds done so far


def choco(
    topology: Topology,
    gamma: Any = 1.0,
    compressor: compress.CompressorSpec = "identity",
    compressor_options: Mapping[str, Any] | None = None,
    public_init: str = "zero",
) -> GossipAlgorithm:
    """Choco-Gossip: compressed gossip with public copies, the communication step of Choco-SGD.

    Use it to gossip with any compressor (top-k, sign, QSGD, ...) while still converging to the
    exact average: compression errors are not lost but stay in ``x_i - x_hat_i`` and are sent in
    later rounds. Needs a consensus step size ``gamma`` tuned to the compressor (sign on the
    8-ring: 0.45 in the ChocoSGD CIFAR-10 example). With the identity compressor and
    ``gamma = 1`` it is plain gossip ``x <- W x``.

    One round, for every node i (``C`` the compressor, W the static mixing matrix):

    .. math::

        q_i &= C(x_i - \\hat x_i) \\\\
        \\hat x_i &\\leftarrow \\hat x_i + q_i \\\\
        s_i &\\leftarrow s_i + \\sum_j W_{ij}\\, q_j \\\\
        x_i &\\leftarrow x_i + \\gamma\\, (s_i - \\hat x_i)

    The invariant ``s_i = sum_j W_ij x_hat_j`` holds for a static graph (both start at 0, or with
    ``public_init="model"`` at ``x_hat = x^0`` and ``s = W x^0``). The node mean is preserved for any
    column-stochastic W: ``sum_i s_i = sum_i x_hat_i`` after every round.

    Public copies at 0 (the papers' choice, the default) make the first rounds of an identically
    initialised training run re-send the initial model, top-k coordinate by coordinate, and the
    nodes' different choices of coordinates pull the models apart meanwhile; ``public_init="model"``
    starts them at the shared initial model instead (no bits spent: every node already knows it).

    Ordering: ``step`` compresses the model it is given. The trainer calls it after the local
    optimizer step for the ICML 2019 / ChocoSGD "adapt then combine" order
    (``x^{k+1/2} = x^k - eta g``, then this step on ``x^{k+1/2}``); the PowerGossip code's
    same-iterate order (gossip the pre-update model, then apply the update) is the trainer's
    choice, not this function's. Within a round the order is that of the ICML 2019 algorithm
    (compress and exchange, then correct with the new copies); the ChocoSGD deep-learning code
    applies the correction with the previous copies first and compresses afterwards (so the
    gradient step falls between compressing and correcting); that variant is not reproduced here.

    Static graphs only: a node knows only what reached it, so on a time-varying graph ``s_i`` could
    only be the accumulated sum of the weighted messages it received (the information-flow
    decision, see docs/algorithms.md, section decisions). Then ``s_i = sum_j W_ij x_hat_j`` no
    longer holds and the iteration stalls away from consensus (measured: with the identity
    compressor on ``one_peer_exponential(8)`` the consensus error stops falling after a few
    rounds), so a topology with period T > 1 is rejected. Use ``sparse_push`` (compressed
    push-sum) or ``deepsqueeze`` on time-varying graphs.

    Bits: node i's message ``q_i`` (its compressed cost, all leaves) is charged once per
    out-neighbour, self excluded.

    Speed: with the exact top-k compressor on a fixed graph and float32 leaves, a CPU program runs
    the round as one native call over all leaves (:mod:`jaxgossip.compress.fused`): the same kept entries,
    copies and bits, ``x`` and ``s`` equal to float32 round-off (``JAXGOSSIP_FUSED=0`` keeps the
    XLA formulation below).

    Failures (``with_failures`` of a static graph W, drawn W(t) per round; docs/topologies.md,
    section stochastic graphs): the public copies must stay identical at every holder, so the
    compressed update ``q_j`` is delivered to all of j's neighbours in W (and charged to each), and
    a failed link only leaves the *averaging* of that round: ``x_i += gamma (sum_j W(t)_ij x_hat_j
    - x_hat_i)`` with the repaired W(t), computed from the (consistent) copies as
    ``s_i - ((W - W(t)) x_hat)_i`` (``s = W x_hat`` is kept exactly as without failures). A node that
    is down sends nothing (``q_j = 0``: its copy stays put at every holder, no bits) and does not
    average. Without failures (p = q = 0) this is bitwise the rule above.

    Args:
      topology: static (T = 1) doubly stochastic graph, or ``with_failures`` of one.
      gamma: consensus step size > 0; float or array (sweepable under vmap).
      compressor: a :class:`~jaxgossip.compress.Compressor`, a compressor name (``"identity"``,
        ``"top_k"``, ``"random_k"``, ``"sign"``, ``"qsgd"``) or a spec mapping
        ``{"name": ..., **options}``; see :func:`jaxgossip.compress.resolve_compressor`.
      compressor_options: keyword options of a compressor given by name, e.g.
        ``{"fraction": 0.01, "index_bits": 64}``.
      public_init: ``"zero"`` (default) or ``"model"``: the public copies start at 0, or at the
        models ``init`` is given (see :func:`~jaxgossip.algorithms._shared.common.check_public_init`).

    Returns:
      A :class:`~jaxgossip.types.GossipAlgorithm` with state :class:`ChocoState`; ``step`` uses its
      key for random compressors (random-k, QSGD).

    References:
      Koloskova, Stich, Jaggi, ICML 2019 (arXiv:1902.00340), Algorithm 1 (Choco-Gossip).
      Koloskova*, Lin*, Stich, Jaggi, ICLR 2020 (arXiv:1907.09356).
    """
    check_graph("choco", INFO, topology)
    support = topology.support  # the fixed graph W: the graph itself, or the one with_failures wraps
    check_positive("gamma", gamma)
    comp = compress.resolve_compressor(compressor, compressor_options, "choco")
    check_public_init(public_init, "choco")

    def init_fn(params):
        check_params(topology, params)
        count = jnp.zeros([], jnp.int32)
        if public_init == "model":
            return ChocoState(x_hat=params, s=mix(support, params, count), count=count)  # W x^0 on the fixed graph
        zeros = otu.tree_zeros_like(params)
        return ChocoState(x_hat=zeros, s=zeros, count=count)

    def step_fn(params, state, key):
        t = state.count
        # Exact top-k on a fixed graph: jaxgossip.compress.fused may run this round in one CPU kernel.
        request = None if comp.top_k is None else fused.FusedRequest(comp.top_k, copy=0, self_in_s=True)
        new_params, new_state, msg_bits = fused.dispatch(
            topology,
            params,
            state.x_hat,
            state.s,
            t,
            gamma,
            request,
            xla_round=lambda: xla_round(params, state, key),
            finish=lambda x, x_hat, s, bits: (x, ChocoState(x_hat=x_hat, s=s, count=t + 1), bits),
        )
        return new_params, new_state, StepInfo(bits=per_round(support.out_degree, t) * msg_bits)

    def xla_round(params, state, key):
        t = state.count
        q, msg_bits = compress.compress_tree(comp, otu.tree_sub(params, state.x_hat), key)
        if topology.stochastic:
            drawn = topology.draw(key, t)
            alive = drawn.alive.astype(jnp.float32)
            q = jax.tree_util.tree_map(lambda a: a * per_node(alive, a, cast=True), q)  # a down node sends nothing
            msg_bits = msg_bits * alive
        x_hat = tree_add(state.x_hat, q)
        s = tree_add(state.s, mix(support, q, t))  # s = W x_hat on the fixed graph W, as without failures
        mixing = s
        if topology.stochastic:
            # W(t) x_hat = W x_hat - (W - W(t)) x_hat: the failed links leave the averaging only.
            mixing = otu.tree_sub(s, mix(drawn.lost, x_hat, t))
        new_params = tree_add_scaled(params, gamma, otu.tree_sub(mixing, x_hat))
        return new_params, ChocoState(x_hat=x_hat, s=s, count=t + 1), msg_bits

    def debias_fn(params, state):
        del state
        return params

    return sign(GossipAlgorithm(init_fn, step_fn, debias_fn), "choco", INFO)


INFO = AlgorithmInfo(
    choco,
    graph=GraphNeeds(
        mixing="doubly_stochastic",
        time_varying=False,
        stackable=True,
        stochastic_graphs="failures",
        reasons={
            "time_varying": "s_i = sum_j W_ij x_hat_j assumes a fixed W",
            "stochastic_graphs": "its public copies x_hat_j live at j's fixed neighbours",
        },
    ),
    sweep=SweepFacts(
        shape_options={
            "compressor_options": "compressor options fix the kept entries, a static shape",
            "fraction": "top-k keeps K = floor(fraction * D) entries, a static shape",
            "k": "top-k keeps K entries, a static shape",
        },
        step_size="gamma",
        relaxation_gamma=True,
    ),
    hooks=TrainerHooks(public_init=True),
)
