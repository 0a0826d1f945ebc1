"""Helpers shared by the algorithm factories: hyperparameter checks, round counters, bit tables."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.topology import Topology
from jaxgossip.types import Array

__all__ = [
    "CountState",
    "check_positive",
    "check_int",
    "is_concrete",
    "require_doubly_stochastic",
    "require_column_stochastic",
    "require_host_topology",
    "require_fixed_support",
    "per_round",
    "relax",
    "PUBLIC_INITS",
    "check_public_init",
]

# Where Choco-style public copies x_hat start (the ``public_init`` option of the algorithms whose
# metadata says ``public_init=True``): at 0, as in the papers, or at the initial models.
PUBLIC_INITS = ("zero", "model")


class CountState(NamedTuple):
    """State of memoryless algorithms: only the round counter."""

    count: Array  # [] int32, communication rounds done so far


def is_concrete(value: Any) -> bool:
    """False for tracers (values swept under ``vmap``/``jit``), which cannot be checked in Python."""
    return not isinstance(value, jax.core.Tracer)


def check_positive(name: str, value: Any, upper: float | None = None) -> Any:
    """Checks a (possibly array-valued, sweepable) hyperparameter is finite and > 0 (and <= upper).

    Traced values pass through unchecked. Returns the value unchanged.
    """
    if value is None:
        raise ValueError(f"{name} must be given")
    if is_concrete(value):
        arr = np.asarray(value, dtype=np.float64)
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name}={value!r} must be finite")
        if np.any(arr <= 0):
            raise ValueError(f"{name}={value!r} must be > 0")
        if upper is not None and np.any(arr > upper):
            raise ValueError(f"{name}={value!r} must be <= {upper}")
    return value


def check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    """Checks a static integer hyperparameter (it fixes shapes, so it cannot be traced)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a Python int (it fixes array shapes), got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        hi = "" if maximum is None else f" and <= {maximum}"
        raise ValueError(f"{name}={value} is out of range: need {name} >= {minimum}{hi}")
    return int(value)


def _names_where(field: str, value: Any) -> str:
    """Registered algorithms whose metadata ``field`` equals ``value`` (for error messages)."""
    from jaxgossip.algorithms import registry  # the registry imports the algorithm files

    return ", ".join(name for name, entry in registry.INFOS.items() if getattr(entry, field) == value)


def require_doubly_stochastic(topology: Topology, algorithm: str) -> None:
    """Raises ValueError unless every W(t) has rows and columns summing to 1 (mean-preserving)."""
    if not isinstance(topology, Topology):
        raise TypeError(f"{algorithm} needs a jaxgossip Topology, got {type(topology).__name__}")
    if not topology.is_doubly_stochastic:
        note = ""
        if topology.stochastic and topology.is_column_stochastic:
            note = (
                " (a stochastic graph that is only column stochastic: random_out, or with_failures of a "
                "directed graph, which leaves undelivered mass with the sender)"
            )
        raise ValueError(
            f"{algorithm} needs doubly stochastic mixing weights (rows and columns summing to 1) so "
            f"that the node mean is preserved; {topology.name} is not{note}. Use metropolis weights, or a "
            f"push-sum algorithm ({_names_where('mixing', 'column_stochastic')}) for column-stochastic graphs"
        )


def require_column_stochastic(topology: Topology, algorithm: str) -> None:
    """Raises ValueError unless every W(t) has columns summing to 1 (mass-preserving push-sum)."""
    if not isinstance(topology, Topology):
        raise TypeError(f"{algorithm} needs a jaxgossip Topology, got {type(topology).__name__}")
    if not topology.is_column_stochastic:
        raise ValueError(
            f"{algorithm} is a push-sum method and needs column-stochastic weights (each sender's "
            f"outgoing weights, self included, summing to 1); {topology.name} is not. Build the graph "
            "with weights='column'"
        )


def require_host_topology(topology: Any, algorithm: str) -> None:
    """Raises TypeError unless ``topology`` is a :class:`Topology` with host (NumPy) tables, not a
    stack or a stack member with traced tables.

    For algorithms that build per-edge or per-graph tables with NumPy at construction time.
    """
    if not isinstance(topology, Topology):
        raise TypeError(f"{algorithm} needs a jaxgossip Topology, got {type(topology).__name__}")
    if topology.stochastic:  # its sampler holds host tables; fixed supports are checked apart
        return
    if not topology.host_tables:
        raise TypeError(
            f"{algorithm} builds per-edge host tables from the graph and cannot run on a stacked Topology "
            f"(traced graph tables); give it a graph built on the host (sweep_topologies then runs one "
            f"compile per graph). Stackable algorithms: {_names_where('stackable', True)}"
        )


def require_fixed_support(topology: Topology, algorithm: str, why: str) -> Topology:
    """The fixed graph whose edges every round uses: the topology itself, or the graph that
    ``with_failures`` wraps. Raises ValueError for graphs whose neighbours change every round
    (``random_matching``, ``random_out``), naming ``why`` the algorithm needs fixed neighbours."""
    support = topology.support
    if support is None:
        raise ValueError(
            f"{algorithm} cannot run on {topology.name}: {why}, but this graph draws new neighbours "
            f"every round. It runs on failures of a fixed graph (with_failures / '+drop'); algorithms "
            f"for any stochastic graph: {_names_where('stochastic_graphs', 'any')}"
        )
    return support


def per_round(table: Any, t: Any) -> Array:
    """Row ``t mod T`` of a table ``[T, ...]`` (t static or traced), as float32.

    ``table`` is a host array, or a device/traced array (a stack member's, under ``vmap``).
    """
    if isinstance(table, jax.Array):
        table = table.astype(jnp.float32)
        if table.shape[0] == 1:
            return table[0]
        return table[jnp.asarray(t, jnp.int32) % table.shape[0]]
    table = np.asarray(table, dtype=np.float32)
    if table.shape[0] == 1:
        return jnp.asarray(table[0])
    return jnp.asarray(table)[jnp.asarray(t, jnp.int32) % table.shape[0]]


def relax(x: Any, target: Any, gamma: Any) -> Any:
    """``x + gamma (target - x)`` leaf-wise, in each leaf's dtype."""
    return jax.tree_util.tree_map(lambda a, b: a + jnp.asarray(gamma, a.dtype) * (b - a), x, target)


def check_public_init(public_init: str, algorithm: str) -> str:
    """Raises ValueError unless ``public_init`` is one of :data:`PUBLIC_INITS`.

    ``"model"`` starts every public copy at its node's initial model, as if the initial models had
    been exchanged for free: exact for identically initialised runs (every node already knows the
    shared initial model, so no bits are spent re-sending it); with different initial models it
    assumes each node knows its in-neighbours' initial models.
    """
    if public_init not in PUBLIC_INITS:
        raise ValueError(
            f"{algorithm}: public_init={public_init!r} is unknown; known: {', '.join(map(repr, PUBLIC_INITS))} "
            "(start the public copies at 0 or at the initial models)"
        )
    return public_init
