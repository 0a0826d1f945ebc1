"""The container every data set loader returns (host NumPy arrays)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Dataset"]


class Dataset(NamedTuple):
    """A data set held as host NumPy arrays: inputs with class labels, or next-token text.

    Attributes:
        x_train: float32 [M, H, W, C] (normalized, see :func:`jaxgossip.data.load_dataset`), any
            [M, ...] inputs, or int32 tokens [M, T] of a text data set.
        y_train: int32 [M], labels in [0, num_classes) (text: next tokens [M, T]).
        x_test: float32 [M_test, H, W, C].
        y_test: int32 [M_test].
        num_classes: number of classes C (text: the vocabulary size V).
        name: which dataset this is ("digits", "fashion_mnist", ...), after
            resolving "auto".
        source: one human-readable line saying where the data came from.
        groups: None, or int32 [M], the source (document) of every training sample; the
            partitioners then split by source (:func:`jaxgossip.data.partition_labels`). Text data
            sets (:mod:`jaxgossip.data.text`) set it; their x / y are int32 tokens [M, T].
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    name: str
    source: str
    groups: np.ndarray | None = None
