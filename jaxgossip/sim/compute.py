"""The nodes of the simulated cluster: seconds per local step and which nodes are online.

* **Compute** (:class:`Compute`, the ``--time.compute`` grammar of :func:`parse_compute`): local
  step k of node i takes ``p_{k,i}`` seconds: a constant C; stragglers (``round(F N)`` nodes, drawn
  once from the run's key, take ``S C``); lognormal with median M and log-scale sigma, or
  exponential with mean mu, drawn per node and step from the run's key; or a trace ``[K, N]``
  cycled over steps (:func:`compute_seconds`).
* **Availability** (the ``--time.availability`` grammar of :func:`availability`): an ``[R, N]`` 0/1
  mask of the nodes online in each round, drawn on the host from the run's seed.

The links between the nodes are :mod:`jaxgossip.sim.network`; the clock that adds both up every
round is :mod:`jaxgossip.sim.timing`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.checks import check_number
from jaxgossip.sim import traces
from jaxgossip.types import Array, PRNGKey

__all__ = [
    "COMPUTE_KINDS",
    "AVAILABILITY_KINDS",
    "Compute",
    "parse_compute",
    "availability",
    "compute_seconds",
    "expected_seconds",
    "load_trace",
]

COMPUTE_KINDS = ("constant", "stragglers", "lognormal", "exponential", "trace")


@dataclasses.dataclass(frozen=True)
class Compute:
    """Seconds of one local step per node (a pytree: the numbers may be traced, ``kind`` is static).

    Attributes:
      kind: one of :data:`COMPUTE_KINDS`.
      seconds: C (constant, stragglers), the median M (lognormal) or the mean mu (exponential).
      fraction: F in [0, 1], the straggling share of the nodes (stragglers).
      slowdown: S >= 1, how many times slower a straggler is (stragglers).
      sigma: > 0, log-scale of the lognormal.
      trace: ``[K, N]`` seconds, row ``k mod K`` for local step k (trace).
    """

    kind: str = "constant"
    seconds: Any = 0.0
    fraction: Any = 0.0
    slowdown: Any = 1.0
    sigma: Any = 1.0
    trace: Any = None

    def __post_init__(self):
        if self.kind not in COMPUTE_KINDS:
            raise ValueError(f"compute kind {self.kind!r} is unknown; known: {', '.join(COMPUTE_KINDS)}")
        strict = self.kind in ("lognormal", "exponential")
        check_number("compute seconds", self.seconds, minimum=0.0, strict=strict)
        if self.kind == "stragglers":
            check_number("straggler fraction F", self.fraction, minimum=0.0, maximum=1.0)
            check_number("straggler slowdown S", self.slowdown, minimum=1.0)
        if self.kind == "lognormal":
            check_number("lognormal sigma", self.sigma, minimum=0.0, strict=True)
        if self.kind == "trace":
            if self.trace is None or np.ndim(self.trace) != 2:
                raise ValueError(f"a compute trace must be [steps, N] seconds; got shape {np.shape(self.trace)}")
            check_number("compute trace", self.trace, minimum=0.0)

    @property
    def is_zero(self) -> bool:
        """Whether every step is known to take no time (a constant 0), so the clock may skip it."""
        return self.kind == "constant" and isinstance(self.seconds, (int, float)) and self.seconds == 0


jax.tree_util.register_dataclass(
    Compute, data_fields=["seconds", "fraction", "slowdown", "sigma", "trace"], meta_fields=["kind"]
)


def _spec_numbers(spec: str, text: str, count: int, rule: str) -> list[float]:
    parts = text.split(",") if text else []
    if len(parts) != count:
        raise ValueError(f"--time.compute={spec!r}: expected {rule}")
    try:
        return [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"--time.compute={spec!r}: expected numbers, {rule}") from None


def parse_compute(spec: Any) -> Compute:
    """A :class:`Compute` from the ``--time.compute`` grammar (or a number, or a Compute).

    ``C`` | ``stragglers:C,F,S`` | ``lognormal:MEDIAN,SIGMA`` | ``exponential:MEAN`` | ``trace:PATH``
    (a ``.npy`` or ``.csv`` of shape ``[steps, N]``, seconds, or a device trace's
    ``compute_seconds``, :mod:`jaxgossip.sim.traces`).

    Raises:
      ValueError: naming the spec and the rule it breaks.
    """
    if isinstance(spec, Compute):
        return spec
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return _checked(str(spec), "constant", float(spec))
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"--time.compute={spec!r} must be a number of seconds or KIND:ARGS")
    text = spec.strip()
    kind, _, args = text.partition(":")
    if not _:
        try:
            seconds = float(text)
        except ValueError:
            raise ValueError(
                f"--time.compute={spec!r} is not a number of seconds nor one of "
                "stragglers:C,F,S, lognormal:MEDIAN,SIGMA, exponential:MEAN, trace:PATH"
            ) from None
        return _checked(spec, "constant", seconds)
    if kind == "stragglers":
        c, f, s = _spec_numbers(spec, args, 3, "stragglers:C,F,S (C >= 0 s, F in [0, 1], S >= 1)")
        return _checked(spec, "stragglers", c, fraction=f, slowdown=s)
    if kind == "lognormal":
        median, sigma = _spec_numbers(spec, args, 2, "lognormal:MEDIAN,SIGMA (both > 0)")
        return _checked(spec, "lognormal", median, sigma=sigma)
    if kind == "exponential":
        (mean,) = _spec_numbers(spec, args, 1, "exponential:MEAN (> 0 s)")
        return _checked(spec, "exponential", mean)
    if kind == "trace":
        return _checked(spec, "trace", trace=load_trace(f"--time.compute={spec!r}", args, column="compute_seconds"))
    raise ValueError(
        f"--time.compute={spec!r}: unknown kind {kind!r}; known: a number, stragglers:C,F,S, "
        "lognormal:MEDIAN,SIGMA, exponential:MEAN, trace:PATH"
    )


def _checked(spec: str, kind: str, seconds: Any = 0.0, **fields: Any) -> Compute:
    try:
        return Compute(kind, seconds, **fields)
    except ValueError as err:
        raise ValueError(f"--time.compute={spec!r}: {err}") from None


def load_trace(
    prefix: str, path: str, vector: bool = False, shape: str = "[steps, N]", column: str | None = None
) -> np.ndarray:
    """A numeric ``[rows, N]`` float32 array from a .npy or .csv file, or with ``column`` the
    column of a device trace (a ``.npz`` or a ``.csv`` with a header, :mod:`jaxgossip.sim.traces`); errors
    start with ``prefix`` (the option). ``vector``: a 1-D ``.npy`` of N values is accepted as one
    row ``[1, N]`` (a one-line .csv always is). ``shape`` names the expected shape in the errors."""
    if not path or not os.path.isfile(path):
        raise ValueError(f"{prefix}: no trace file {path!r}")
    if column is not None and traces.is_device_trace(path):
        try:
            values = getattr(traces.load_device_trace(path), column)
        except ValueError as err:
            raise ValueError(f"{prefix}: {err}") from None
        if values is None:
            raise ValueError(f"{prefix}: the device trace {path!r} has no {column} column")
        return values
    try:
        if path.endswith(".npy"):
            arr = np.load(path, allow_pickle=False)
        elif path.endswith(".csv"):
            arr = np.loadtxt(path, delimiter=",", ndmin=2)
        else:
            raise ValueError(f"{prefix}: a trace must be a .npy or .csv file")
    except (OSError, ValueError) as err:
        if prefix in str(err):
            raise
        raise ValueError(f"{prefix}: cannot read {path!r} as a {shape} array: {err}") from None
    if vector and arr.ndim == 1:
        arr = arr[None]
    if arr.ndim != 2 or arr.size == 0 or arr.dtype.kind not in "iuf":
        raise ValueError(f"{prefix}: a trace must be a numeric {shape} array; got {arr.shape}")
    return arr.astype(np.float32)


AVAILABILITY_KINDS = ("always", "markov", "trace")


def availability(spec: Any, num_rounds: int, num_nodes: int, seed: int) -> np.ndarray | None:
    """The ``[R, N]`` 0/1 online mask of a run from the ``--time.availability`` grammar, or None
    for ``always``.

    * ``always``: every node online in every round (None: nothing is masked);
    * ``markov:P_OFF,P_ON``: per node a two-state chain, all online before round 0; before every
      round an online node goes offline with probability P_OFF and an offline one comes back with
      probability P_ON (drawn on the host from ``seed``: the same seed gives the same mask);
    * ``trace:PATH``: a ``.npy`` / ``.csv`` of shape ``[rounds, N]`` of 0/1, cycled; at least one
      entry must be 1 (a node online at some round).

    Raises:
      ValueError: naming the spec and the rule it breaks.
    """
    name = f"--time.availability={spec!r}"
    if spec is None or spec == "always":
        return None
    if not isinstance(spec, str):
        raise ValueError(f"{name} must be always, markov:P_OFF,P_ON or trace:PATH")
    kind, _, args = spec.partition(":")
    if kind == "markov":
        parts = args.split(",")
        try:
            p_off, p_on = (float(v) for v in parts) if len(parts) == 2 else (None, None)
        except ValueError:
            p_off = p_on = None
        if p_off is None or not (0 <= p_off <= 1 and 0 < p_on <= 1):
            raise ValueError(f"{name}: expected markov:P_OFF,P_ON with P_OFF in [0, 1] and P_ON in (0, 1]")
        rng = np.random.default_rng(seed)
        online = np.ones(num_nodes, bool)
        out = np.empty((num_rounds, num_nodes), np.float32)
        for r in range(num_rounds):  # a loop over rounds (the chain), vectorized over nodes
            u = rng.random(num_nodes)
            online = np.where(online, u >= p_off, u < p_on)
            out[r] = online
        return out
    if kind == "trace":
        arr = load_trace(name, args)
        if arr.shape[1] != num_nodes:
            raise ValueError(
                f"{name}: a trace of shape {arr.shape} does not fit N = {num_nodes}: it must be [rounds, {num_nodes}]"
            )
        if not np.all((arr == 0) | (arr == 1)):
            raise ValueError(f"{name}: a trace must hold 0 (offline) or 1 (online) only")
        if not arr.any():  # a file of zeros is a mistake; a markov draw may still leave everyone offline
            raise ValueError(f"{name}: no node is ever online (the trace holds only 0), so nothing would train")
        return arr.astype(np.float32)
    raise ValueError(f"{name}: unknown kind {kind!r}; known: always, markov:P_OFF,P_ON, trace:PATH")


def _stragglers(compute: Compute, key: PRNGKey, n: int) -> Array:
    """``[N]`` bool: the ``round(F N)`` straggling nodes, drawn once from ``key``. With F traced the
    set is the first ``round(F N)`` of one random order, so sweeping F nests the sets."""
    rank = jnp.argsort(jax.random.permutation(key, n))  # node -> its place in a random order
    count = jnp.round(jnp.asarray(compute.fraction, jnp.float32) * n)
    return rank < count


def compute_seconds(compute: Compute, key: PRNGKey, step: Any, n: int) -> Array:
    """``p_{k,i}``: ``[N]`` seconds of local step ``step`` (k) of every node (float32, or float64
    under x64).

    Args:
      compute: the compute model.
      key: the clock's key (:attr:`Clock.key`); stragglers use it as is (fixed for the run), the
        random kinds fold in the step.
      step: k, the global index of the local step (traced).
      n: N.
    """
    dtype = jnp.result_type(float)  # float32 in a run, float64 when cost.simulate prices under x64
    seconds = jnp.asarray(compute.seconds, dtype)
    if compute.kind == "constant":
        return jnp.broadcast_to(seconds, (n,))
    if compute.kind == "stragglers":
        slow = jnp.asarray(compute.slowdown, dtype)
        return jnp.where(_stragglers(compute, key, n), slow * seconds, seconds)
    draw = jax.random.fold_in(key, jnp.asarray(step, jnp.uint32))
    if compute.kind == "lognormal":
        return seconds * jnp.exp(jnp.asarray(compute.sigma, dtype) * jax.random.normal(draw, (n,), dtype))
    if compute.kind == "exponential":
        return seconds * jax.random.exponential(draw, (n,), dtype)
    trace = jnp.asarray(compute.trace, dtype)
    if trace.shape[1] != n:
        raise ValueError(f"a compute trace of shape {trace.shape} does not fit N = {n} nodes: it must be [steps, {n}]")
    return trace[jnp.asarray(step, jnp.int32) % trace.shape[0]]


def expected_seconds(compute: Compute, key: PRNGKey, n: int) -> np.ndarray:
    """``E[p_i]``: ``[N]`` float64 expected seconds of one local step of each node (host), as
    :func:`compute_seconds` draws them with the clock's key ``key``: C (constant), C or S C
    (stragglers: the set drawn from ``key``), ``M exp(sigma^2 / 2)`` (lognormal), the mean
    (exponential), the mean of node i's column (trace). Node i finishes steps at the rate
    ``1 / E[p_i]`` when it runs free."""
    seconds = float(np.asarray(compute.seconds))
    if compute.kind == "constant":
        return np.full(n, seconds)
    if compute.kind == "stragglers":
        slow = np.asarray(_stragglers(compute, key, n))
        return np.where(slow, float(np.asarray(compute.slowdown)) * seconds, seconds)
    if compute.kind == "lognormal":
        return np.full(n, seconds * np.exp(float(np.asarray(compute.sigma)) ** 2 / 2))
    if compute.kind == "exponential":
        return np.full(n, seconds)
    trace = np.asarray(compute.trace, np.float64)
    if trace.shape[1] != n:
        raise ValueError(f"a compute trace of shape {trace.shape} does not fit N = {n} nodes: it must be [steps, {n}]")
    return trace.mean(axis=0)
