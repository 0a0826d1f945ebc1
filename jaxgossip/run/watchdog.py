"""Consensus watchdog: flags a compressed gossip run whose models drift apart instead of agreeing.

Compressed gossip (Choco, Sparse-Push, ...) with a consensus step size too large for its compressor
does not fail loudly: the node mean is conserved, the loss of the averaged model may look fine for
a while, and the consensus distance grows geometrically until the nodes' models are useless or NaN
(experiments/studies/dirichlet.md, "Mode A"). The watchdog reads the consensus distance
the run already records (at every evaluation point of a training run, every round of a consensus
run; nothing is added to the compiled scan and nothing is synced per round) and raises an alarm at
the first point where

* **growth**: the consensus distance is more than ``growth`` (10) times its running minimum, or
* **norm**: it exceeds the squared norm ``||z_bar||^2`` of the averaged model (the nodes are
  farther from their average than the average is from 0), where that norm is known.

Healthy runs pass both: consensus distances fall or settle (the digits Choco configs stay within
1.1-1.9x of their running minimum), and stay far below the model's norm. A learning-rate warm-up
raises the drift legitimately (consensus distance ~ lr^2), so training starts the running minimum
after the warm-up (``start_round``). Values below ``floor`` times the largest value seen so far are
treated as converged (float32 round-off, not growth).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = ["WatchdogAlarm", "check_consensus", "GROWTH"]

GROWTH = 10.0


class WatchdogAlarm(NamedTuple):
    """The first point at which the consensus watchdog fired.

    Attributes:
      round: the round of that point.
      rule: ``"growth"`` (``consensus > growth * running minimum``) or ``"norm"``
        (``consensus > ||z_bar||^2``).
      consensus: the consensus distance there.
      reference: the running minimum (growth) or ``||z_bar||^2`` (norm) it was compared with.
      message: one line for logs and tables.
    """

    round: int
    rule: str
    consensus: float
    reference: float
    message: str

    def to_dict(self) -> dict:
        return self._asdict()


def check_consensus(
    consensus: Any,
    rounds: Any = None,
    *,
    model_sq_norm: Any = None,
    growth: float = GROWTH,
    start_round: int = 0,
    floor: float = 1e-8,
) -> WatchdogAlarm | None:
    """The first alarm of the consensus watchdog over a recorded run, or None.

    Args:
      consensus: [M] consensus distances ``(1/N) sum_i ||z_i - z_bar||^2`` at M points (host or
        device array; a NaN/inf point is left to the divergence checks).
      rounds: [M] round of each point (default ``0..M-1``).
      model_sq_norm: optional [M] ``||z_bar||^2`` of the averaged model at the same points.
      growth: the growth factor over the running minimum that fires (> 1).
      start_round: points before this round are not checked and do not enter the running minimum
        (e.g. the learning-rate warm-up of a training run).
      floor: values at or below ``floor`` times the largest value so far count as converged.

    Returns:
      :class:`WatchdogAlarm` of the first point that fires, or None.
    """
    if not (isinstance(growth, (int, float)) and growth > 1):
        raise ValueError(f"growth={growth!r} must be a number > 1")
    values = np.asarray(consensus, dtype=np.float64).reshape(-1)
    at = np.arange(values.size) if rounds is None else np.asarray(rounds).reshape(-1)
    if at.shape != values.shape:
        raise ValueError(f"rounds has {at.size} points but consensus has {values.size}")
    norms = None if model_sq_norm is None else np.asarray(model_sq_norm, dtype=np.float64).reshape(-1)
    if norms is not None and norms.shape != values.shape:
        raise ValueError(f"model_sq_norm has {norms.size} points but consensus has {values.size}")
    running_min, peak = np.inf, 0.0
    for i, value in enumerate(values):
        if at[i] < start_round or not np.isfinite(value):
            continue
        peak = max(peak, value)
        if norms is not None and np.isfinite(norms[i]) and value > norms[i] > 0:
            message = (
                f"consensus watchdog: at round {int(at[i])} the consensus distance {value:.3g} exceeds the squared "
                f"norm of the averaged model {norms[i]:.3g}; the nodes are drifting apart (consensus step size "
                "too large for the compression, or unstable local training)"
            )
            return WatchdogAlarm(int(at[i]), "norm", float(value), float(norms[i]), message)
        bottom = max(running_min, floor * peak)
        if np.isfinite(running_min) and value > growth * bottom:
            message = (
                f"consensus watchdog: at round {int(at[i])} the consensus distance {value:.3g} is "
                f"{value / bottom:.3g}x its running minimum {running_min:.3g} (alarm at {growth:g}x); the nodes "
                "are drifting apart (consensus step size too large for the compression: try "
                "`jaxgossip tune-gamma`, or unstable local training: try grad_clip or a lower lr)"
            )
            return WatchdogAlarm(int(at[i]), "growth", float(value), float(running_min), message)
        running_min = min(running_min, value)
    return None
