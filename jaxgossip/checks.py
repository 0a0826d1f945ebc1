"""Checks every room shares (the ground floor, beside ``types``): whether a value can be checked in
Python at all (``is_concrete``: not a tracer of ``jit``/``vmap``) and the integer options that fix
shapes."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

__all__ = ["is_concrete", "any_traced", "positive_int"]


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
