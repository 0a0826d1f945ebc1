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

The consensus watchdog warns; the **divergence check** (:func:`check_divergence`) stops a training
run (exit status 3, like a NaN loss) or marks a sweep row "diverged at round r". It fires at the
first evaluation point where

* **nonfinite**: the training loss, the averaged model's squared norm or the consensus distance is
  NaN or infinite;
* **loss**: the training loss exceeds :data:`LOSS_BLOWUP` (1e3) times its first recorded value;
* **model_norm**: ``||z_bar||^2`` exceeds :data:`NORM_BLOWUP` (1e6) times its initial value
  (``||z_bar||`` 1000x the initial model's norm; the first recorded value where the initial one is
  not given);
* **consensus**: the consensus distance exceeds :data:`CONSENSUS_BLOWUP` (1e3) times ``||z_bar||^2``
  (the nodes are 30x farther from their average than the average is from 0); in a
  communication-only run (``jaxgossip consensus``, ``topology-sweep``), 1e3 times its first value.

The factors sit orders of magnitude above healthy training (losses fall from their first value, the
averaged model's squared norm grows by less than 10x over the digits and CIFAR configs, the
consensus distance stays below ``||z_bar||^2``) and below what a step size that blows up reaches
within a few evaluations (Adam at lr=100 on digits: ``||z_bar||^2`` 5e6x its initial value by
round 10).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "WatchdogAlarm",
    "check_consensus",
    "GROWTH",
    "Divergence",
    "DivergenceError",
    "check_divergence",
    "consensus_diverged_at",
    "LOSS_BLOWUP",
    "NORM_BLOWUP",
    "CONSENSUS_BLOWUP",
]

GROWTH = 10.0
LOSS_BLOWUP = 1e3
NORM_BLOWUP = 1e6
CONSENSUS_BLOWUP = 1e3


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


class Divergence(NamedTuple):
    """The first point at which a run diverged (:func:`check_divergence`).

    Attributes:
      round: the round of that point.
      rule: ``"nonfinite"``, ``"loss"``, ``"model_norm"`` or ``"consensus"``.
      value: the value that fired (NaN/inf for ``nonfinite``).
      reference: what it was compared with (the first loss, the initial ``||z_bar||^2``, or
        ``||z_bar||^2`` at that point; NaN for ``nonfinite``).
      message: one line for logs and tables.
    """

    round: int
    rule: str
    value: float
    reference: float
    message: str

    def to_dict(self) -> dict:
        return self._asdict()


class DivergenceError(FloatingPointError):
    """A training run diverged (:class:`Divergence` in ``divergence``); the CLI exits 3 on it."""

    def __init__(self, divergence: Divergence):
        super().__init__(divergence.message)
        self.divergence = divergence


_ADVICE = "try a smaller learning rate, gradient clipping (--grad_clip) or a smaller consensus step gamma"


def _series(values: Any, size: int | None = None) -> np.ndarray | None:
    if values is None:
        return None
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if size is not None and array.size != size:
        raise ValueError(f"got {array.size} points, expected {size}")
    return array


def check_divergence(
    rounds: Any,
    *,
    train_loss: Any = None,
    model_sq_norm: Any = None,
    consensus: Any = None,
    initial_sq_norm: float | None = None,
    initial_consensus: float | None = None,
    loss_blowup: float = LOSS_BLOWUP,
    norm_blowup: float = NORM_BLOWUP,
    consensus_blowup: float = CONSENSUS_BLOWUP,
) -> Divergence | None:
    """The first point of a recorded run that diverged (rules in the module docstring), or None.

    Args:
      rounds: [M] round of each point.
      train_loss: optional [M] training loss.
      model_sq_norm: optional [M] ``||z_bar||^2`` of the averaged model.
      consensus: optional [M] consensus distance.
      initial_sq_norm: ``||z_bar||^2`` of the initial model (round 0); default the first recorded
        finite value of ``model_sq_norm``.
      initial_consensus: without ``model_sq_norm`` (a communication-only run), the consensus distance
        is compared with ``consensus_blowup`` times this value (e.g. its first recorded value).
      loss_blowup, norm_blowup, consensus_blowup: the factors (> 1).

    Returns:
      :class:`Divergence` of the first point that fires, or None.
    """
    for name, factor in (
        ("loss_blowup", loss_blowup),
        ("norm_blowup", norm_blowup),
        ("consensus_blowup", consensus_blowup),
    ):
        if not (isinstance(factor, (int, float)) and factor > 1):
            raise ValueError(f"{name}={factor!r} must be a number > 1")
    at = np.asarray(rounds).reshape(-1)
    loss, norm, cons = (_series(v, at.size) for v in (train_loss, model_sq_norm, consensus))
    first_loss = next((v for v in (loss if loss is not None else []) if np.isfinite(v)), None)
    norm0 = initial_sq_norm
    if norm0 is None and norm is not None:
        norm0 = next((v for v in norm if np.isfinite(v)), None)
    for i in range(at.size):
        r = int(at[i])
        for name, series in (
            ("training loss", loss),
            ("squared norm of the averaged model", norm),
            ("consensus distance", cons),
        ):
            if series is not None and not np.isfinite(series[i]):
                message = f"training diverged at round {r}: the {name} became {series[i]}; {_ADVICE}"
                return Divergence(r, "nonfinite", float(series[i]), float("nan"), message)
        if loss is not None and first_loss is not None and first_loss > 0 and loss[i] > loss_blowup * first_loss:
            message = (
                f"training diverged at round {r}: the training loss {loss[i]:.3g} is {loss[i] / first_loss:.3g}x its "
                f"first value {first_loss:.3g} (limit {loss_blowup:g}x); {_ADVICE}"
            )
            return Divergence(r, "loss", float(loss[i]), float(first_loss), message)
        if norm is not None and norm0 is not None and norm0 > 0 and norm[i] > norm_blowup * norm0:
            message = (
                f"training diverged at round {r}: the squared norm of the averaged model {norm[i]:.3g} is "
                f"{norm[i] / norm0:.3g}x its initial value {norm0:.3g} (limit {norm_blowup:g}x); {_ADVICE}"
            )
            return Divergence(r, "model_norm", float(norm[i]), float(norm0), message)
        if cons is not None and norm is None and initial_consensus and cons[i] > consensus_blowup * initial_consensus:
            message = (
                f"diverged at round {r}: the consensus distance {cons[i]:.3g} is {cons[i] / initial_consensus:.3g}x "
                f"its first value {initial_consensus:.3g} (limit {consensus_blowup:g}x); try a smaller gamma"
            )
            return Divergence(r, "consensus", float(cons[i]), float(initial_consensus), message)
        if cons is not None and norm is not None and norm[i] > 0 and cons[i] > consensus_blowup * norm[i]:
            message = (
                f"training diverged at round {r}: the consensus distance {cons[i]:.3g} is {cons[i] / norm[i]:.3g}x the "
                f"squared norm of the averaged model {norm[i]:.3g} (limit {consensus_blowup:g}x); {_ADVICE}"
            )
            return Divergence(r, "consensus", float(cons[i]), float(norm[i]), message)
    return None


def consensus_diverged_at(error: Any, blowup: float = CONSENSUS_BLOWUP) -> int | None:
    """The first round at which a communication-only run diverged, or None: a consensus distance
    NaN/inf or above ``blowup`` times the first value of its series.

    Args:
      error: [..., M] consensus distances at rounds ``0..M-1`` (leading axes: seeds); every series
        is checked against its own first value.
    """
    values = np.asarray(error, dtype=np.float64)
    series = values.reshape(-1, values.shape[-1])
    hits = []
    for one in series:
        first = one[0] if one.size and np.isfinite(one[0]) and one[0] > 0 else None
        found = check_divergence(np.arange(one.size), consensus=one, initial_consensus=first, consensus_blowup=blowup)
        if found is not None:
            hits.append(found.round)
    return min(hits, default=None)
