"""Helpers shared by the algorithm factories: hyperparameter checks, round counters, bit tables."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.checks import is_concrete
from jaxgossip.types import Array

__all__ = [
    "CountState",
    "check_positive",
    "per_round",
    "relax",
    "tree_add",
    "tree_add_scaled",
    "PUBLIC_INITS",
    "check_public_init",
]

# Where Choco-style public copies x_hat start (the ``public_init`` option of the algorithms whose
# metadata says ``public_init=True``): at 0, as in the papers, or at the initial models.
PUBLIC_INITS = ("zero", "model")


class CountState(NamedTuple):
    """State of memoryless algorithms: only the round counter."""

    count: Array  # [] int32, communication rounds done so far


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


# Tree maths that optax.tree_utils does not do with the same arithmetic on every supported optax
# (differences: tree_sub, tree_zeros_like, tree_mul are used from optax directly).


def relax(x: Any, target: Any, gamma: Any) -> Any:
    """``x + gamma (target - x)`` leaf-wise, in each leaf's dtype (optax has no such helper)."""
    return jax.tree_util.tree_map(lambda a, b: a + jnp.asarray(gamma, a.dtype) * (b - a), x, target)


def tree_add(x: Any, y: Any) -> Any:
    """``x + y`` leaf-wise (``optax.tree_utils.tree_add`` sums from 0, turning ``-0.0`` into ``+0.0``)."""
    return jax.tree_util.tree_map(jnp.add, x, y)


def tree_add_scaled(y: Any, a: Any, x: Any) -> Any:
    """``y + a x`` leaf-wise with ``a`` cast to each leaf's dtype (``optax.tree_utils.tree_add_scalar_mul``
    casts it in optax 0.2.4 but not from 0.2.5 on, so its result dtype depends on the version)."""
    return jax.tree_util.tree_map(lambda u, v: v + jnp.asarray(a, v.dtype) * u, x, y)


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
