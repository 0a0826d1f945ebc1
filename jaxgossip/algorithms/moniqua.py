"""Moniqua: gossip with modulo-quantized messages, no error memory and no extra model copies.

References:
  Lu, De Sa, "Moniqua: Modulo Quantized Communication in Decentralized SGD", ICML 2020
  (arXiv:2002.11787). The PowerGossip study's 2-bit variant (Vogels et al., NeurIPS 2020,
  arXiv:2008.01425; docs/algorithms.md, section moniqua) fixes the details followed here:
  centred modulo, stochastic rounding with randomness shared by all nodes, 2 bits per entry.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxgossip.algorithms._shared.common import CountState, check_positive, per_round
from jaxgossip.algorithms.registry import check_graph, sign
from jaxgossip.checks import check_int
from jaxgossip.ops.mixing import check_params, num_params_per_node, per_node
from jaxgossip.topology import Topology
from jaxgossip.types import AlgorithmInfo, Array, GossipAlgorithm, GraphNeeds, StepInfo, SweepFacts

__all__ = ["moniqua", "moniqua_bound", "INFO"]


def moniqua_bound(theta: Any, bits: int) -> Any:
    """``B_theta = 2 theta / (1 - 2 delta)``, the modulus of :func:`moniqua` with ``bits`` bits per
    entry; ``delta = 1 / (2^bits - 1)`` is the largest stochastic-rounding error in units of B."""
    delta = 1.0 / (2**bits - 1)
    return 2.0 * theta / (1.0 - 2.0 * delta)


def _cmod(a: Array, b: Any) -> Array:
    """Centred modulo: ``a - b round(a / b)``, in ``[-b/2, b/2]``."""
    return a - b * jnp.round(a / b)


def _edge_tables(topology: Topology, t: Array) -> tuple[Array, Array, Array]:
    """``senders, receivers [E] int32, weights [E] float32`` of round ``t`` (host or traced tables)."""
    period = topology.period
    tables = (topology.senders, topology.receivers, topology.weights)
    if period == 1:
        return tuple(jnp.asarray(a)[0] for a in tables)
    idx = jnp.asarray(t, jnp.int32) % period
    return tuple(jnp.asarray(a)[idx] for a in tables)


def moniqua(
    topology: Topology, theta: Any = 1.0, gamma: Any = 0.05, bits: int = 2, shared_randomness: bool = True
) -> GossipAlgorithm:
    """Moniqua: each node sends its model modulo ``B`` quantized to ``bits`` bits per entry; a
    receiver recovers the sender's model from its own, since neighbours differ by less than theta.

    With ``L = 2^bits - 1`` levels, ``delta = 1/L``, ``B = 2 theta / (1 - 2 delta)``
    (:func:`moniqua_bound`), ``cmod(a, B) = a - B round(a / B)`` and ``u`` uniform in [0, 1)
    (the same draw on every node with ``shared_randomness``, one per entry and round):

    .. math::

        q_i = \\big\\lfloor L\\,(\\mathrm{cmod}(x_i / B, 1) + \\tfrac12) + u \\big\\rfloor / L - \\tfrac12
        \\quad(\\text{sent: } 2^{bits} \\text{ values, } bits \\text{ bits per entry}) \\\\
        x_i \\leftarrow x_i + \\gamma \\sum_{j \\ne i} W_{ij}(t)\\,
            \\big(\\mathrm{cmod}(B q_j - x_i, B) - \\mathrm{cmod}(B q_i - x_i, B)\\big)

    If ``|x_j - x_i| + delta B < B / 2`` entrywise (guaranteed by ``|x_j - x_i| < theta``),
    ``x_i + cmod(B q_j - x_i, B) = x_j + e_j`` exactly, with ``e_j`` node j's unbiased rounding
    error, and the round is relaxed gossip on ``x + e``: the node mean is preserved for doubly
    stochastic W. With shared randomness, identical models send identical messages, so consensus is
    a fixed point and the rounding noise shrinks with the disagreement (stochastic rounding of the
    *differences*), but consensus-only rounds still stall at a mean squared disagreement of order
    ``(gamma delta B)^2`` per entry (the grid the differences are rounded to); with independent
    draws the noise stays of order ``gamma delta B`` whatever the disagreement. Beyond theta the
    recovery wraps around and the iteration breaks: theta must bound the disagreement, which the
    paper ensures with a small ``gamma`` and learning rate (the PowerGossip study: theta = 0.25,
    gamma = 5e-3, 2 bits).

    Why the default ``gamma`` is small. One rounding step is ``B / L = 2 theta / (L - 2)``
    (``2 theta`` at 2 bits), and with shared randomness a received difference is off by one step
    with probability about ``|x_j - x_i| L / B``: a round adds noise of variance about
    ``gamma^2 (B / L) |x_j - x_i|`` per entry while gossip removes a fraction ``gamma (1 - lambda_2)``
    of the disagreement, so the noise alone holds the disagreement near
    ``gamma (B / L) / (1 - lambda_2)``, which must stay well below theta. At 2 bits that needs
    ``gamma`` well below ``(1 - lambda_2) / 2`` (about 0.1 on the 8-node ring): ``gamma = 1`` wraps
    within a few rounds (the default digits CNN on the 8-ring: consensus distance 45, 221, 556, ...
    from round 1, NaN loss by round 20). With ``theta = 1, gamma = 0.05`` the same task trains to
    97.2 % test accuracy (gossip: 98.6 %) with every pair of nodes within 0.22 per entry, also on
    the exponential, one-peer exponential, 2x4 torus and random-matching graphs and on 16- and
    32-node rings (the MLP); the study's ``theta = 0.25, gamma = 5e-3`` lets pairs drift past theta
    there (86.9 %).

    Args:
      topology: doubly stochastic graph, static, time-varying or stochastic (``random_matching``,
        ``with_failures`` of an undirected graph). The decoding needs ``|x_j - x_i| < theta`` for
        every pair that exchanges a message: on a fixed graph its neighbours, under failures a
        subset of them (but failures slow the mixing, so the disagreement grows), on a random
        matching *every pair of nodes*, since any two may be matched: theta must then bound the
        global disagreement ``max_ij |x_j - x_i|``.
      theta: > 0, the assumed bound on ``|x_j - x_i|`` between nodes that exchange messages
        (default 1).
      gamma: consensus step size > 0 (float or array); default 0.05, small enough for 2 bits (see
        above); with more bits a larger step is stable.
      bits: bits per entry, a Python int >= 2 (``delta < 1/2`` needs at least 4 levels).
      shared_randomness: one rounding draw for all nodes (True, the reference) or one per node.

    Returns:
      A :class:`~jaxgossip.types.GossipAlgorithm` with state ``CountState``; every node sends
      ``bits * D`` bits to each out-neighbour per round (no side information: theta and the
      shared seed are known to all).

    References:
      Lu and De Sa, ICML 2020 (arXiv:2002.11787).
    """
    check_graph("moniqua", INFO, topology)
    check_positive("theta", theta)
    check_positive("gamma", gamma)
    bits = check_int("bits", bits, 2, 16)
    if not isinstance(shared_randomness, bool):
        raise TypeError(f"shared_randomness={shared_randomness!r} must be True or False")
    levels = float(2**bits - 1)
    num_nodes = topology.num_nodes

    def init_fn(params):
        check_params(topology, params)
        return CountState(count=jnp.zeros([], jnp.int32))

    def step_fn(params, state, key):
        t = state.count
        # The graph's draw uses its own stream of the key (fold_in), so the rounding draws below
        # are those of a fixed graph.
        graph = topology.draw(key, t).graph
        senders, receivers, weights = _edge_tables(graph, t)
        leaves, treedef = jax.tree_util.tree_flatten(params)
        keys = jax.random.split(key, len(leaves))
        out = []
        for leaf, leaf_key in zip(leaves, keys):
            x = leaf.astype(jnp.float32)
            modulus = jnp.asarray(moniqua_bound(theta, bits), jnp.float32)
            shape = x.shape[1:] if shared_randomness else x.shape
            u = jax.random.uniform(leaf_key, shape, jnp.float32)
            q = jnp.floor(levels * (_cmod(x / modulus, 1.0) + 0.5) + u) / levels - 0.5
            sent = modulus * q  # what a receiver reconstructs from the bits (B known to all)
            own = _cmod(sent - x, modulus)  # [N, ...] each node's own rounding offset
            w = per_node(weights, x)
            # per edge s -> r: what r recovers of x_s minus x_r, relative to r's own offset; the
            # self-loop and padding edges contribute exactly 0.
            term = w * (_cmod(sent[senders] - x[receivers], modulus) - own[receivers])
            delta = jax.ops.segment_sum(term, receivers, num_segments=num_nodes)
            out.append((x + jnp.asarray(gamma, jnp.float32) * delta).astype(leaf.dtype))
        new_params = jax.tree_util.tree_unflatten(treedef, out)
        sent_bits = per_round(graph.out_degree, t) * float(bits * num_params_per_node(params))
        return new_params, CountState(count=t + 1), StepInfo(bits=sent_bits)

    def debias_fn(params, state):
        del state
        return params

    return sign(GossipAlgorithm(init_fn, step_fn, debias_fn), "moniqua", INFO)


INFO = AlgorithmInfo(
    moniqua,
    graph=GraphNeeds(mixing="doubly_stochastic", stochastic_graphs="any"),
    sweep=SweepFacts(relaxation_gamma=True),
)
