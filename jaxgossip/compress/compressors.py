"""Compressors with exact bit accounting.

A compressor acts on ONE node's leaf (any shape ``[...]``, flattened to ``[D_leaf]``) and returns
the dense *decompressed* value the receivers reconstruct, together with the number of bits the
message costs. :func:`compress_tree` applies it to every leaf of a stacked pytree (leaves
``[N, ...]``) with ``vmap`` over the node axis and returns the bits each node's message costs.

Bit rules (the only place for them; see docs/algorithms.md, section compressors and bit rules):
a value costs its dtype's width (:func:`value_bits`, 32 bits for fp32); a top-k / random-k message
keeps :func:`num_kept` entries per leaf and an index costs :func:`bits_per_index`:
``ceil(log2 D_leaf)`` bits by default, or a fixed width (``index_bits=64`` reproduces the EPFL
codes' int64 indices); sign costs 1 bit per entry plus one fp32 scale per leaf; QSGD costs one fp32
norm plus a sign bit and ``ceil(log2(levels + 1))`` bits per entry; the push-sum weight that
travels with every push-sum message costs :data:`WEIGHT_BITS`.

Derivatives (:data:`GRADIENT_RULES`; every compressor states its rule in :attr:`Compressor.gradient`,
docs/algorithms.md lists them): ``exact`` (identity: the uncompressed derivative), ``mask``
(top-k, random-k: the kept entries pass their tangent, times the unbiased scale of random-k;
the choice of indices passes none) and ``straight_through`` (sign, QSGD: the backward pass treats
the compressor as the identity, times QSGD's contractive scale with ``rescale=True``; Bengio,
Leonard, Courville, arXiv:1308.3432, 2013). Forward values are unchanged by the rules.

Compressor specs: every compressed algorithm takes its compressor as a :class:`Compressor`, a name
from :data:`REGISTRY` or a spec mapping ``{"name": ..., **options}``, resolved by
:func:`resolve_compressor`.

References:
  Stich et al., "Sparsified SGD with Memory", NeurIPS 2018 (top-k, random-k).
  Karimireddy et al., "Error Feedback Fixes SignSGD", ICML 2019 (scaled sign).
  Alistarh et al., "QSGD", NeurIPS 2017 (arXiv:1610.02132).
  Koloskova et al., "Decentralized Stochastic Optimization and Gossip Algorithms with Compressed
  Communication", ICML 2019 (arXiv:1902.00340): compressors used with Choco.
  Bengio, Leonard, Courville, "Estimating or Propagating Gradients Through Stochastic Neurons for
  Conditional Computation", arXiv:1308.3432, 2013 (the straight-through estimator).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgossip.compress import selection
from jaxgossip.types import Array, Params, PRNGKey

__all__ = [
    "Compressor",
    "TopKSpec",
    "identity",
    "top_k",
    "random_k",
    "sign",
    "qsgd",
    "compress_tree",
    "make",
    "make_for",
    "resolve_compressor",
    "CompressorSpec",
    "REGISTRY",
    "WEIGHT_BITS",
    "value_bits",
    "num_kept",
    "bits_per_index",
    "GRADIENT_RULES",
]

WEIGHT_BITS = 32  # the push-sum weight travels uncompressed, one fp32 value per message

ApplyFn = Callable[[Array, PRNGKey], tuple[Array, Array]]

# How a compressor's output is differentiated in its input (Compressor.gradient).
GRADIENT_RULES = {
    "exact": "the derivative of the function itself (lossless: the uncompressed derivative)",
    "mask": "the kept entries pass their tangent (times a fixed scale), the others and the indices pass none",
    "straight_through": "the backward pass treats the compressor as the identity (times a fixed scale)",
}


class TopKSpec(NamedTuple):
    """What an exact top-k compressor keeps and charges, known from the leaf size alone (static).

    Lets an algorithm run its top-k round in a fused kernel (:mod:`jaxgossip.compress.fused`)
    instead of calling :attr:`Compressor.apply`, with the same kept entries and bits.
    """

    fraction: float | None
    k: int | None
    index_bits: Any

    def kept(self, size: int) -> int:
        """K for a leaf of ``size`` entries (:func:`num_kept`)."""
        return num_kept(size, self.fraction, self.k)

    def bits(self, size: int, dtype: Any) -> int:
        """Bits of one node's message for a leaf of ``size`` entries of ``dtype``: K values and K indices."""
        return self.kept(size) * (value_bits(dtype) + bits_per_index(self.index_bits, size))


class Compressor(NamedTuple):
    """A compressor for one node's leaf.

    Attributes:
      apply: ``dense, bits = apply(leaf, key)``; ``leaf`` has any shape, ``dense`` the same shape
        and dtype, ``bits`` is a float32 scalar (the message's exact cost).
      name: display name, e.g. ``"top_k(fraction=0.01)"``.
      lossless: True when ``dense == leaf`` always (identity).
      top_k: for the exact top-k compressor, its :class:`TopKSpec`; None for every other one.
      gradient: how ``dense`` is differentiated in ``leaf``, a key of :data:`GRADIENT_RULES`.
    """

    apply: ApplyFn
    name: str
    lossless: bool = False
    top_k: TopKSpec | None = None
    gradient: str = "exact"


def _straight_through(quantize: Callable[[Array, PRNGKey], Array], scale: float = 1.0) -> Callable:
    """``quantize`` whose derivative is ``scale`` times the identity (the straight-through
    estimator); the forward value is ``quantize``'s, bit for bit."""

    @jax.custom_jvp
    def dense(leaf, key):
        return quantize(leaf, key)

    @dense.defjvp
    def dense_jvp(primals, tangents):
        leaf, key = primals
        return dense(leaf, key), (tangents[0] * jnp.asarray(scale, leaf.dtype)).astype(leaf.dtype)

    return dense


def value_bits(x: Any) -> int:
    """Bits of one uncompressed value of ``x``'s dtype (``x`` an array or a dtype; 32 for float32)."""
    return jnp.dtype(getattr(x, "dtype", x)).itemsize * 8


def identity() -> Compressor:
    """No compression: sends every entry at its dtype width (32 bits for fp32). Gradient: exact."""

    def apply(leaf, key):
        del key
        return leaf, jnp.float32(leaf.size * value_bits(leaf))

    return Compressor(apply, "identity", lossless=True)


def num_kept(size: int, fraction: float | None = None, k: int | None = None) -> int:
    """Kept entries of a top-k / random-k leaf of ``size`` entries (static).

    ``max(1, floor(fraction * size))`` when ``fraction`` is given, else ``min(k, size)``.
    """
    if fraction is not None:
        return max(1, int(math.floor(fraction * size)))
    return min(int(k), size)


def _check_fraction_k(name: str, fraction: Any, k: Any) -> tuple[float | None, int | None]:
    if (fraction is None) == (k is None):
        raise ValueError(f"{name} needs exactly one of fraction= or k=, got fraction={fraction!r}, k={k!r}")
    if fraction is not None:
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or math.isnan(fraction):
            raise TypeError(f"{name} fraction must be a float in (0, 1], got {fraction!r}")
        if not 0 < fraction <= 1:
            raise ValueError(f"{name} fraction={fraction} is out of range: need 0 < fraction <= 1")
        return float(fraction), None
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"{name} k must be an int, got {k!r}")
    if k <= 0:
        raise ValueError(f"{name} k={k} is out of range: need k >= 1")
    return None, int(k)


def bits_per_index(index_bits: Any, size: int) -> int:
    """Bits of one index into a leaf of ``size`` entries: ``ceil(log2 size)`` (at least 1) for
    ``index_bits="log2"``, else the fixed width ``index_bits``."""
    if index_bits == "log2":
        return max(1, math.ceil(math.log2(size))) if size > 1 else 1
    return int(index_bits)


def _check_index_bits(index_bits: Any) -> Any:
    if index_bits == "log2":
        return index_bits
    if isinstance(index_bits, bool) or not isinstance(index_bits, (int, np.integer)) or index_bits < 1:
        raise ValueError(f"index_bits must be 'log2' or a positive int (e.g. 64), got {index_bits!r}")
    return int(index_bits)


def _scatter(flat: Array, idx: Array, values: Array) -> Array:
    return jnp.zeros_like(flat).at[idx].set(values)


def top_k(fraction: float | None = None, k: int | None = None, index_bits: Any = "log2") -> Compressor:
    """Keeps the K largest-magnitude entries of each leaf.

    ``K = max(1, floor(fraction * D_leaf))`` or ``K = min(k, D_leaf)`` (at least one entry per
    leaf). Message: K values and K indices. Gradient: ``mask`` (the kept entries pass their
    tangent; :func:`jaxgossip.compress.selection.top_k_dense`).

    Args:
      fraction: kept fraction in (0, 1].
      k: kept entries per leaf (>= 1); exactly one of fraction/k.
      index_bits: ``"log2"`` (``ceil(log2 D_leaf)`` bits per index) or a fixed width such as 64.
    """
    fraction, k = _check_fraction_k("top_k", fraction, k)
    spec = TopKSpec(fraction, k, _check_index_bits(index_bits))

    def apply(leaf, key):
        del key
        flat = leaf.reshape(-1)
        kept = spec.kept(flat.size)
        if kept == flat.size:
            dense = leaf
        else:
            dense = selection.top_k_dense(flat, kept).reshape(leaf.shape)
        return dense, jnp.float32(spec.bits(flat.size, leaf.dtype))

    label = f"top_k(fraction={fraction})" if fraction is not None else f"top_k(k={k})"
    return Compressor(apply, label, top_k=spec, gradient="mask")


def random_k(
    fraction: float | None = None, k: int | None = None, unbiased: bool = False, index_bits: Any = "log2"
) -> Compressor:
    """Keeps K uniformly random entries of each leaf (without replacement).

    With ``unbiased=True`` kept entries are scaled by ``D_leaf / K`` so that ``E[C(v)] = v``.
    K and the bit cost as in :func:`top_k`. Gradient: ``mask`` (the kept entries pass their
    tangent, times ``D_leaf / K`` when unbiased; the random choice passes none).
    """
    fraction, k = _check_fraction_k("random_k", fraction, k)
    index_bits = _check_index_bits(index_bits)

    def apply(leaf, key):
        flat = leaf.reshape(-1)
        kept = num_kept(flat.size, fraction, k)
        if kept == flat.size:
            dense = leaf
        else:
            # top_k of i.i.d. uniforms is a uniform K-subset, in O(D) instead of a permutation.
            _, idx = selection.top_k(jax.random.uniform(key, (flat.size,)), kept)
            values = flat[idx]
            if unbiased:
                values = values * jnp.asarray(flat.size / kept, flat.dtype)
            dense = _scatter(flat, idx, values).reshape(leaf.shape)
        bits = kept * (value_bits(leaf) + bits_per_index(index_bits, flat.size))
        return dense, jnp.float32(bits)

    label = f"random_k({'fraction=' + str(fraction) if fraction is not None else 'k=' + str(k)}, unbiased={unbiased})"
    return Compressor(apply, label, gradient="mask")


def sign() -> Compressor:
    """Scaled sign: ``C(v) = (||v||_1 / D_leaf) sign(v)``; 1 bit per entry + 32 bits per leaf.

    Gradient: ``straight_through`` (``dC/dv = I``; sign's own derivative is 0 almost everywhere).
    """

    def quantize(leaf, key):
        del key
        return (jnp.mean(jnp.abs(leaf)) * jnp.sign(leaf)).astype(leaf.dtype)

    dense = _straight_through(quantize)

    def apply(leaf, key):
        return dense(leaf, key), jnp.float32(leaf.size + 32)

    return Compressor(apply, "sign", gradient="straight_through")


def qsgd(levels: int = 16, rescale: bool = False) -> Compressor:
    """QSGD stochastic quantisation to ``s = levels`` levels per sign.

    .. math::  C(v)_i = \\|v\\|_2\\, \\mathrm{sign}(v_i)\\, \\xi_i / s,\\quad
               \\xi_i = \\lfloor s|v_i|/\\|v\\|_2 \\rfloor + \\mathrm{Bernoulli}(\\text{frac. part})

    Unbiased; with ``rescale=True`` the result is multiplied by ``1 / (min(D/s^2, sqrt(D)/s) + 1)``
    (the biased, contractive variant used with Choco). Bits: 32 (norm) + ``D (1 + ceil(log2(s+1)))``.
    Gradient: ``straight_through``, the derivative of the expectation ``E[C(v)]``: the identity,
    times the contractive factor with ``rescale=True``.

    Args:
      levels: s >= 1.
      rescale: use the contractive scaling.
    """
    if isinstance(levels, bool) or not isinstance(levels, (int, np.integer)):
        raise TypeError(f"qsgd levels must be an int, got {levels!r}")
    if levels < 1:
        raise ValueError(f"qsgd levels={levels} is out of range: need levels >= 1")
    s = int(levels)
    per_entry = 1 + math.ceil(math.log2(s + 1))

    def factor(d):  # the contractive scale of rescale=True (static: D is a shape)
        return 1.0 / (min(d / s**2, math.sqrt(d) / s) + 1.0) if rescale else 1.0

    def quantize(leaf, key):
        flat = leaf.reshape(-1).astype(jnp.float32)
        norm = jnp.linalg.norm(flat)
        ratio = jnp.where(norm > 0, jnp.abs(flat) / jnp.where(norm > 0, norm, 1.0), 0.0) * s
        lower = jnp.floor(ratio)
        xi = lower + (jax.random.uniform(key, flat.shape) < (ratio - lower))
        dense = norm * jnp.sign(flat) * xi / s
        if rescale:
            d = flat.size
            dense = dense / (min(d / s**2, math.sqrt(d) / s) + 1.0)
        return dense.reshape(leaf.shape).astype(leaf.dtype)

    def apply(leaf, key):
        dense = _straight_through(quantize, factor(leaf.size))
        return dense(leaf, key), jnp.float32(32 + leaf.size * per_entry)

    return Compressor(apply, f"qsgd(levels={s}, rescale={rescale})", gradient="straight_through")


REGISTRY: dict[str, Callable[..., Compressor]] = {
    "identity": identity,
    "top_k": top_k,
    "random_k": random_k,
    "sign": sign,
    "qsgd": qsgd,
}


def make(name: str, **options) -> Compressor:
    """Compressor by name (``"identity"``, ``"top_k"``, ``"random_k"``, ``"sign"``, ``"qsgd"``)."""
    if name not in REGISTRY:
        raise ValueError(f"unknown compressor {name!r}; known compressors: {sorted(REGISTRY)}")
    return REGISTRY[name](**options)


def make_for(algorithm: str, name: str, **options) -> Compressor:
    """:func:`make` for the factory of ``algorithm``: errors in the options name the algorithm."""
    try:
        return make(name, **options)
    except (ValueError, TypeError) as err:
        raise type(err)(f"{algorithm}: {err}") from err


CompressorSpec = Any  # Compressor | str | Mapping with a "name" key


def resolve_compressor(
    compressor: CompressorSpec, compressor_options: Mapping[str, Any] | None = None, algorithm: str = "choco"
) -> Compressor:
    """Turns a compressor argument into a :class:`Compressor`.

    Accepted forms (the same for every compressed algorithm, so configs and the CLI can name them):

    * a :class:`Compressor`, used as is;
    * a name from :data:`REGISTRY`, e.g. ``"sign"``, with its options in ``compressor_options``,
      e.g. ``compressor="top_k", compressor_options={"fraction": 0.01}``;
    * a spec mapping ``{"name": "top_k", "fraction": 0.01}``; ``compressor_options`` may add keys
      the spec does not set (a key set in both is an error, not a silent override).

    ``algorithm`` names the calling factory in error messages.

    Raises:
      ValueError: unknown compressor name (lists the known ones), a spec without ``"name"``, options
        given together with a ready-made Compressor, an option set twice, or a bad option value.
      TypeError: an argument of the wrong type, or an option the compressor does not take.
    """
    if compressor_options is None:
        options: dict[str, Any] = {}
    elif isinstance(compressor_options, Mapping):
        options = dict(compressor_options)
    else:
        raise TypeError(
            f"{algorithm}: compressor_options must be a mapping of keyword options, got "
            f"{type(compressor_options).__name__}"
        )
    if isinstance(compressor, Compressor):
        if options:
            raise ValueError(
                f"{algorithm}: compressor_options={options!r} only apply when the compressor is given by "
                f"name; {compressor.name} is already built"
            )
        return compressor
    if isinstance(compressor, Mapping):
        spec = dict(compressor)
        if "name" not in spec:
            raise ValueError(f"{algorithm}: a compressor spec mapping needs a 'name' key, got {spec!r}")
        name = spec.pop("name")
        twice = sorted(set(spec) & set(options))
        if twice:
            raise ValueError(
                f"{algorithm}: compressor option(s) {twice} given both in the spec and in compressor_options"
            )
        options = {**spec, **options}
    elif isinstance(compressor, str):
        name = compressor
    else:
        raise TypeError(
            f"{algorithm}: compressor must be a Compressor, a name or a spec mapping, got {type(compressor).__name__}"
        )
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"{algorithm}: unknown compressor {name!r}; known compressors: {sorted(REGISTRY)}")
    try:
        return make(name, **options)
    except TypeError as err:
        if "unexpected keyword" in str(err):
            raise TypeError(
                f"{algorithm}: compressor {name!r} does not take option(s) {sorted(options)}: {err}"
            ) from err
        raise


def compress_tree(compressor: Compressor, x: Params, key: PRNGKey) -> tuple[Params, Array]:
    """Applies ``compressor`` to every node's copy of every leaf.

    Args:
      compressor: a :class:`Compressor`.
      x: pytree of leaves ``[N, ...]``.
      key: PRNG key; every (leaf, node) pair gets its own subkey.

    Returns:
      ``(dense, bits)``: the decompressed pytree (leaves ``[N, ...]``) and ``bits`` [N] float32, the
      cost of one node's message (all leaves).
    """
    leaves, treedef = jax.tree_util.tree_flatten(x)
    keys = jax.random.split(key, len(leaves))
    outs, total = [], None
    for leaf, leaf_key in zip(leaves, keys):
        node_keys = jax.random.split(leaf_key, leaf.shape[0])
        dense, bits = jax.vmap(compressor.apply)(leaf, node_keys)
        outs.append(dense)
        total = bits if total is None else total + bits
    return jax.tree_util.tree_unflatten(treedef, outs), total
