"""Checks every room shares (the ground floor, beside ``types``): whether a value can be checked in
Python at all (``is_concrete``: not a tracer of ``jit``/``vmap``), the integer options that fix
shapes (``positive_int``, ``check_int``), the finite numbers of a model (``check_number``) and the
suggestion an unknown name gets (``did_you_mean``), the keys of an option group (``check_group``)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

__all__ = [
    "is_concrete",
    "any_traced",
    "positive_int",
    "check_int",
    "check_number",
    "did_you_mean",
    "check_group",
]


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


def check_number(name: str, value: Any, *, minimum: float | None = None, strict: bool = False, maximum=None) -> None:
    """Raises ValueError naming ``name`` when a concrete number or array ``value`` is not finite or
    breaks the bound (traced values pass: a sweep checks them where they are made).

    An array (a trace of thousands of entries) is described, not printed: how many entries break
    the rule and the first of them, its index and value.
    """
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return
    if arr.ndim == 0:
        if not np.isfinite(arr):
            raise ValueError(f"{name}={value!r} must be finite")
        if minimum is not None and (arr <= minimum if strict else arr < minimum):
            raise ValueError(f"{name}={value!r} must be {'>' if strict else '>='} {minimum}")
        if maximum is not None and arr > maximum:
            raise ValueError(f"{name}={value!r} must be <= {maximum}")
        return
    rule, bad = "finite", ~np.isfinite(arr)
    with np.errstate(invalid="ignore"):
        if minimum is not None:
            rule += f" and {'>' if strict else '>='} {minimum}"
            bad |= (arr <= minimum) if strict else (arr < minimum)
        if maximum is not None:
            rule += f" and <= {maximum}"
            bad |= arr > maximum
    if np.any(bad):
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{name} must be {rule}: {int(np.sum(bad))} of {arr.size} entries are not; the first is "
            f"[{', '.join(map(str, first))}] = {arr[first]:g}"
        )


def did_you_mean(word: str, choices) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or ``""``."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_group(field: str, options: Any, known: Any, what: str, example: str) -> dict:
    """The given options of a group of dotted options (``--time.*``, ``--byzantine.*``): a mapping
    whose keys are all ``known``, without the keys set to None (a default).

    Raises:
      ValueError: not a mapping (with ``example``), or the first unknown key, named ``field.key``,
        with a suggestion and the ``known`` keys.
    """
    if not isinstance(options, Mapping):
        raise ValueError(f"{field}={options!r} must be a mapping, e.g. {example}")
    known = list(known)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(
            f"{field}.{unknown[0]}: unknown {what}{did_you_mean(unknown[0], known)}; known: {', '.join(known)}"
        )
    return {key: value for key, value in options.items() if value is not None}
