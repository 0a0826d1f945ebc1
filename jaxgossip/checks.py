"""Checks every room shares (the ground floor, beside ``types``): whether a value can be checked in
Python at all (``is_concrete``: not a tracer of ``jit``/``vmap``) and the integer options that fix
shapes (``positive_int``, ``check_int``)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

__all__ = ["is_concrete", "any_traced", "positive_int", "check_int"]


def is_concrete(value: Any) -> bool:
    """False for tracers (values swept under ``vmap`` or traced by ``jit``), which cannot be checked
    or read in Python."""
    return not isinstance(value, jax.core.Tracer)


def any_traced(tree: Any) -> bool:
    """Whether some leaf of ``tree`` is a tracer."""
    return not all(is_concrete(leaf) for leaf in jax.tree_util.tree_leaves(tree))


def positive_int(name: str, value: Any) -> int:
    """``value`` as an int >= 1, else a ValueError naming ``name`` (bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive int")
    return int(value)


def check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an int with ``minimum <= value`` (and ``value <= maximum`` when given).

    For the options that fix shapes or host tables (node counts, ranks, rounds of a static loop):
    they must be Python or NumPy ints, never traced values.

    Raises:
      TypeError: ``value`` is not an int (bools are refused), naming ``name``.
      ValueError: ``value`` is outside the bounds, naming ``name`` and the bounds: "is too small"
        without a ``maximum``, "is out of range" with one.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if maximum is None:
        if value < minimum:
            raise ValueError(f"{name}={value} is too small: need {name} >= {minimum}")
    elif not minimum <= value <= maximum:
        raise ValueError(f"{name}={value} is out of range: need {name} >= {minimum} and <= {maximum}")
    return int(value)
