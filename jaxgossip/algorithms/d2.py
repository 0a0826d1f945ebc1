"""D^2 (Exact Diffusion): decentralized SGD corrected by the previous round, exact on
heterogeneous data.

References:
  Tang, Lian, Yan, Zhang, Liu, "D^2: Decentralized Training over Decentralized Data", ICML 2018
  (arXiv:1803.07068).
  Yuan, Ying, Zhao, Sayed, "Exact Diffusion for Distributed Optimization and Learning, Part I",
  IEEE TSP 2019 (arXiv:1702.05122): the same recursion with W replaced by (I + W) / 2.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from optax import tree_utils as otu

from jaxgossip.algorithms._shared.common import check_positive, per_round, relax, tree_add
from jaxgossip.algorithms.registry import check_graph, sign
from jaxgossip.checks import is_concrete
from jaxgossip.ops.mixing import check_params, leaf_bits, mix, node_mean
from jaxgossip.topology import Topology
from jaxgossip.types import AlgorithmInfo, Array, Execution, GossipAlgorithm, GraphNeeds, Params, StepInfo, TrainerHooks

__all__ = ["d2", "D2State", "INFO"]

# D^2 converges only when every eigenvalue of its mixing matrix exceeds -1/3 (Tang et al. 2018).
_LAMBDA_MIN_BOUND = -1.0 / 3.0


class D2State(NamedTuple):
    """State of :func:`d2` (leaves like the params, ``[N, ...]``)."""

    x: Params  # [N, ...] the params this round started from (the previous round's output)
    psi: Params  # [N, ...] what the previous round communicated (x_{t-1} + u_{t-1}); x at start
    count: Array  # [] int32, communication rounds done


def _check_spectrum(topology: Topology, gamma: Any) -> None:
    """Raises ValueError unless lambda_min(I + gamma (W - I)) > -1/3 (host tables, concrete gamma)."""
    if not topology.host_tables or not is_concrete(gamma) or topology.num_nodes > 4096:
        return
    gammas = np.atleast_1d(np.asarray(gamma, np.float64))
    w = np.asarray(topology.matrix(0), np.float64)
    lam_min = float(np.linalg.eigvalsh((w + w.T) / 2)[0])
    worst = 1.0 - gammas.max() * (1.0 - lam_min)
    if worst <= _LAMBDA_MIN_BOUND + 1e-7:  # float eigenvalues: -1/3 exactly (8-ring) must fail
        largest = (1.0 - _LAMBDA_MIN_BOUND) / (1.0 - lam_min)
        raise ValueError(
            f"d2 needs every eigenvalue of its mixing matrix I + gamma (W - I) above -1/3 (Tang et al. 2018; "
            f"at or below it the recursion x <- W(2x - x_prev) oscillates or diverges); on {topology.name} "
            f"lambda_min(W) = {lam_min:.4g}, so gamma={gamma} gives {worst:.4g}. Use gamma < {largest:.4g}, "
            "e.g. gamma=0.5 (Exact Diffusion's (I + W) / 2), or a graph with larger self-weights"
        )


def d2(topology: Topology, gamma: Any = 1.0) -> GossipAlgorithm:
    """D^2: D-SGD whose communicated model is corrected by the previous round's, which removes the
    bias D-SGD keeps on heterogeneous data (exact minimiser with a constant step size).

    With ``u_t`` the local optimizer's update of round t (``-eta g_t`` for ``optax.sgd(eta)``; the
    sum of the H updates with local steps) and ``W_g = I + gamma (W - I)``:

    .. math::

        x_{t+1} = W_g \\big(2 x_t - x_{t-1} + u_t - u_{t-1}\\big)
                = W_g \\big(2 x_t - x_{t-1} - \\eta (g_t - g_{t-1})\\big),
        \\qquad x_1 = W_g (x_0 + u_0)

    i.e. the first round is plain D-SGD. ``step`` receives ``y_t = x_t + u_t`` (``ordering="atc"``,
    the only ordering it accepts: under ``"same_iterate"`` the update would be added after mixing
    and the correction no longer cancels the bias) and communicates
    ``y_t + x_t - psi_t``, where ``psi_t = y_{t-1}`` is the previous round's input and ``x_t``
    its output (both in the state; ``psi_0 = x_0``). Only x is sent: D_bits per out-neighbour.
    ``gamma = 1`` is the paper's D^2; ``gamma = 0.5`` uses ``(I + W) / 2``, which is Exact
    Diffusion. The recursion converges only if ``lambda_min(W_g) > -1/3``, checked at
    construction (the uniform 8-ring has ``lambda_min(W) = -1/3`` exactly, so it needs
    ``gamma < 1``).

    Args:
      topology: symmetric doubly stochastic graph, static (T = 1).
      gamma: relaxation of W (float > 0 or an array, sweepable).

    Returns:
      A :class:`~jaxgossip.types.GossipAlgorithm` with state :class:`D2State` (two model copies).

    Raises:
      ValueError: ``lambda_min(I + gamma (W - I)) <= -1/3``, or a directed, asymmetric,
        time-varying or stochastic graph (refused from the metadata ``INFO`` by
        :func:`jaxgossip.algorithms.check_graph`).

    References:
      Tang et al., ICML 2018 (arXiv:1803.07068); Yuan et al., IEEE TSP 2019 (arXiv:1702.05122).
    """
    check_graph("d2", INFO, topology)
    check_positive("gamma", gamma)
    _check_spectrum(topology, gamma)

    def init_fn(params):
        check_params(topology, params)
        return D2State(x=params, psi=params, count=jnp.zeros([], jnp.int32))

    def step_fn(params, state, key):
        del key
        t = state.count
        # params = x_t + u_t; adding x_t - psi_t = x_t - x_{t-1} - u_{t-1} gives D^2's input.
        corrected = tree_add(params, otu.tree_sub(state.x, state.psi))
        new_params = relax(corrected, _mix_centred(topology, corrected, t), gamma)
        # The node mean (and a traced gamma) come in float32; the models keep the dtype they were
        # sent in, so that bf16 messages keep a bf16 state.
        new_params = jax.tree_util.tree_map(lambda n, p: n.astype(p.dtype), new_params, params)
        bits = per_round(topology.out_degree, t) * leaf_bits(params)
        return new_params, D2State(x=new_params, psi=params, count=t + 1), StepInfo(bits=bits)

    def debias_fn(params, state):
        del state
        return params

    return sign(GossipAlgorithm(init_fn, step_fn, debias_fn), "d2", INFO)


def _mix_centred(topology: Topology, x: Params, t: Array) -> Params:
    """``W(t) x`` computed as ``r + W(t)(x - r)`` with ``r`` the node mean (equal in exact arithmetic,
    since W's rows sum to 1).

    Why: D^2 conserves ``mean(x_{t+1}) - mean(y_t)`` (an integrator of the mean), so any error in
    the mean of a round is never corrected. Float32 weights such as 1/3 have rows summing to
    ``1 - 6e-8``, which shrinks the mean of ``W x`` by ``6e-8 |x|`` every round, a bias that grows
    linearly with the rounds (to ~1e-4 relative in 1000 rounds on the 8-ring); mixing only the
    deviations from the mean keeps that error proportional to the disagreement instead.
    """
    ref = node_mean(x)
    mixed = mix(topology, otu.tree_sub(x, ref), t)
    return tree_add(mixed, ref)


# The correction x_t - psi_t cancels D-SGD's bias only because x_t = W psi_t with the same W in
# every round (the fixed point of x = W(2x - x_prev) is consensus for one W); with W(t) changing
# (a schedule, or drawn anew) the difference carries W(t-1) - W(t) terms that do not cancel.
INFO = AlgorithmInfo(
    d2,
    graph=GraphNeeds(
        mixing="symmetric",
        time_varying=False,
        stackable=True,
        reasons={
            "time_varying": "its correction uses the previous round's model, exact only when W is the same every round",
            "stochastic_graphs": "its correction uses the previous round's model, exact only when W is the same "
            "every round; use gradient_tracking on graphs drawn every round",
        },
    ),
    # gamma = 1 (D^2 itself) is refused on graphs with lambda_min(W) <= -1/3, every even ring among them
    hooks=TrainerHooks(example_options={"gamma": 0.5}),
    execution=Execution(orderings=("atc",)),
)
