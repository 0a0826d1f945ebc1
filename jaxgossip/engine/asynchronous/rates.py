"""Node rates of an asynchronous run and the rate-compensated rule (``--async_rate_compensation``).

Node i finishes local steps at the rate ``1 / E[p_i]``, its expected step time
(:func:`jaxgossip.sim.compute.expected_seconds` with the run's clock key). The rates set the period
of the churn rows (:mod:`~jaxgossip.engine.asynchronous.churn`) and the weights of the
rate-compensated rule (:func:`rate_weights`, :func:`compensates_rates`; docs/training.md, "Rate
compensation"). Host-side NumPy.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxgossip.sim import timing
from jaxgossip.sim.compute import Compute, expected_seconds
from jaxgossip.types import AsyncForm, PRNGKey

__all__ = ["step_rates", "rate_weights", "compensates_rates"]


def step_rates(compute: Compute, num_nodes: int, key: PRNGKey) -> np.ndarray:
    """``E[p_i]``: ``[N]`` float64 expected seconds of each node's local step in the run with key
    ``key`` (:func:`jaxgossip.sim.compute.expected_seconds` with the clock's key, the stragglers
    the schedule draws)."""
    clock_key = jax.random.wrap_key_data(timing.init_clock(key).key)
    return expected_seconds(compute, clock_key, num_nodes)


def rate_weights(compute: Compute, num_nodes: int, key: PRNGKey) -> np.ndarray:
    """``[N]`` float32 weights ``c_i = E[p_i] mean_j (1 / E[p_j])`` (mean rate over node i's rate,
    :func:`step_rates`) of the rate-compensated rule: node i takes steps at the rate
    ``1 / E[p_i]``, so the expected drift of the plain rule is ``sum_i grad f_i / E[p_i]``, the
    event-rate-weighted objective; steps scaled by ``c_i`` make it ``mean_j (1 / E[p_j]) sum_i
    grad f_i``, the uniform objective's gradient at the mean rate. Equal expected times give
    weights of exactly 1 (the plain rule, bit for bit).

    Raises:
      ValueError: a node whose expected step time is 0 (an infinite rate has no finite weight).
    """
    expected = step_rates(compute, num_nodes, key)
    if np.all(expected == expected[0]):
        return np.ones(num_nodes, np.float32)
    if np.any(expected <= 0):
        raise ValueError(
            f"rate compensation needs every node's expected step time > 0; node(s) "
            f"{np.flatnonzero(expected <= 0)[:3].tolist()} take 0 s"
        )
    return (expected * np.mean(1.0 / expected)).astype(np.float32)


def compensates_rates(form: AsyncForm) -> str | None:
    """None when ``form``'s rule is biased towards fast nodes, which rate compensation
    (:func:`rate_weights`) removes; otherwise why it is not (the option is then refused).

    AD-PSGD's pairwise averages keep the node mean, which moves by the sum of the steps: node i
    adds its step at the rate ``1 / E[p_i]``, so the mean drifts along the event-rate-weighted
    gradient. Asynchronous gossip's update is a contraction towards ``sum_j W_ij x_j - lr g_i``
    whose fixed point does not depend on how often it is applied (summed over i with W doubly
    stochastic: ``sum_i g_i = 0``, the uniform objective). Asynchronous SGP's step is scaled by
    ``w_i``, and in the steady state of push-sum a node's weight is inversely proportional to its
    rate (its outflow ``(1 - p_ii) w_i / E[p_i]`` balances its inflow; ``w_i / E[p_i]`` equal on
    a regular graph with uniform weights), so ``w_i / E[p_i]`` is already the same on every node.
    """
    if form.rule == "pairwise_averaging":
        return None
    if form.rule == "stale_mixing":
        return (
            f"{form.name}'s fixed point weights every node equally already (each node's update is a "
            "contraction whose fixed point does not depend on its rate)"
        )
    return (
        f"{form.name}'s steps are scaled by the push-sum weight w_i, which push-sum keeps inversely "
        "proportional to a node's rate: the rates are compensated already"
    )
