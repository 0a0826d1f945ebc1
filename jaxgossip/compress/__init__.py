"""Compression: compressors and their bit rules, exact top-k selection, the native CPU kernels and
the fused top-k round.

* :mod:`~jaxgossip.compress.compressors`: the compressors (one node's leaf -> decompressed value +
  bits), specs and the bit rules; re-exported here (``jg.compress.top_k(...)``).
* :mod:`~jaxgossip.compress.selection`: exact top-k selection (XLA or the native kernel).
* :mod:`~jaxgossip.compress.native`: builds and loads the C++ XLA:CPU kernels in ``csrc/``.
* :mod:`~jaxgossip.compress.fused`: the fused native round of top-k methods with public copies.
"""

from jaxgossip.compress.compressors import (
    GRADIENT_RULES,
    REGISTRY,
    WEIGHT_BITS,
    Compressor,
    CompressorSpec,
    TopKSpec,
    bits_per_index,
    compress_tree,
    identity,
    make,
    make_for,
    num_kept,
    qsgd,
    random_k,
    resolve_compressor,
    sign,
    top_k,
    value_bits,
)

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
