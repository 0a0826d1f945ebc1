"""Next-token text data sets split by source: Python's documentation topics and folders of .txt files.

A *corpus* is a list of sources (documents), each a token stream. Tokens are UTF-8 bytes by default
(vocabulary V = 256), so no tokenizer or download is needed. :func:`next_token_windows` turns a
corpus into a :class:`~jaxgossip.data.Dataset` of next-token examples of length T = ``context``:

* every source is cut once: its last ``max(ceil(test_fraction * L), T + 1)`` tokens are its held-out
  part, the rest its training part, so every source that is kept has held-out text and no token is in
  both splits;
* each part is read as windows of T + 1 tokens, ``x = w[:-1]``, ``y = w[1:]`` (non-overlapping by
  default, ``stride`` = T); a source too short for one training and one held-out window (it needs at
  least 2 (T + 1) tokens) is left out, and the dataset's ``source`` line says how many were;
* ``Dataset.groups`` [M] holds the source index of every training window, so the partitioners split
  by source: ``by_source`` gives each node whole sources (non-IID by source), ``iid`` spreads windows,
  ``dirichlet:ALPHA`` draws each node's mixture of sources (:func:`partition_labels`).

``x`` and ``y`` are int32 [M, T]; ``num_classes`` is the vocabulary size V, which the language model
takes as its output size. Host NumPy, not jittable.

Data sets:

* ``python_docs``: the documentation topics that ship with CPython in ``pydoc_data.topics`` (79
  topics, about 466 kB of English text with code on Python 3.11; what ``help("if")`` shows).
* ``text:PATH``: a ``.txt`` file (one source) or a folder whose ``*.txt`` files (sorted, not
  recursive) are the sources.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import numpy as np

from jaxgossip.data import raw
from jaxgossip.data.base import Dataset

__all__ = [
    "BYTE_VOCAB",
    "TEXT_DATASETS",
    "TEXT_PREFIX",
    "TextCorpus",
    "byte_tokens",
    "is_text_dataset",
    "load_text",
    "next_token_windows",
    "partition_labels",
    "python_docs_corpus",
    "text_files_corpus",
]

#: Vocabulary size of byte-level tokens.
BYTE_VOCAB = 256
#: Names of the embedded text data sets.
TEXT_DATASETS = ("python_docs",)
#: Prefix of a dataset spec that names a .txt file or a folder of them.
TEXT_PREFIX = "text:"


class TextCorpus(NamedTuple):
    """Sources as token streams.

    Attributes:
      names: the name of every source (S of them).
      tokens: S int32 arrays [L_s] with values in [0, vocab).
      vocab: V, the vocabulary size.
      name: the corpus name ("python_docs", "text").
      source: one line saying where the text came from.
    """

    names: tuple[str, ...]
    tokens: tuple[np.ndarray, ...]
    vocab: int
    name: str
    source: str


def byte_tokens(text: str) -> np.ndarray:
    """UTF-8 bytes of ``text`` as int32 tokens [L] in [0, 256)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)


def is_text_dataset(name) -> bool:
    """Whether dataset spec ``name`` is a next-token text data set (``python_docs`` or ``text:PATH``)."""
    return isinstance(name, str) and (name in TEXT_DATASETS or name.startswith(TEXT_PREFIX))


def python_docs_corpus() -> TextCorpus:
    """The documentation topics of ``pydoc_data.topics`` (part of CPython), one source per topic,
    sorted by topic name, as byte tokens."""
    from pydoc_data import topics as pydoc_topics

    names = tuple(sorted(pydoc_topics.topics))
    tokens = tuple(byte_tokens(pydoc_topics.topics[n]) for n in names)
    total = sum(t.shape[0] for t in tokens)
    source = f"python_docs: pydoc_data.topics of this Python ({len(names)} topics, {total:,} bytes), byte tokens"
    return TextCorpus(names, tokens, BYTE_VOCAB, "python_docs", source)


def text_files_corpus(path: str | os.PathLike) -> TextCorpus:
    """A ``.txt`` file (one source) or a folder whose ``*.txt`` files are the sources, as byte tokens.

    Raises:
      DatasetNotFoundError: no such file or folder, or a folder without .txt files.
      ValueError: a file that is not UTF-8 text, or an empty one.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".txt"))
        if not files:
            raise raw.DatasetNotFoundError(f"dataset=text:{path}: the folder holds no .txt files")
    elif os.path.isfile(path):
        files = [path]
    else:
        raise raw.DatasetNotFoundError(
            f"dataset=text:{path}: no such file or folder (text:PATH names a .txt file or a folder)"
        )
    names, tokens = [], []
    for f in files:
        try:
            with open(f, encoding="utf-8") as handle:
                text = handle.read()
        except UnicodeDecodeError as err:
            raise ValueError(f"dataset=text:{path}: {f} is not UTF-8 text ({err.reason} at byte {err.start})") from None
        if not text:
            raise ValueError(f"dataset=text:{path}: {f} is empty")
        names.append(os.path.splitext(os.path.basename(f))[0])
        tokens.append(byte_tokens(text))
    total = sum(t.shape[0] for t in tokens)
    source = f"text: {path} ({len(files)} .txt file{'s' * (len(files) != 1)}, {total:,} bytes), byte tokens"
    return TextCorpus(tuple(names), tuple(tokens), BYTE_VOCAB, "text", source)


def _windows(tokens: np.ndarray, context: int, stride: int) -> np.ndarray:
    """Windows [W, T + 1] of ``tokens`` [L] starting at 0, stride, 2 stride, ... (W = 0 if L <= T)."""
    count = (tokens.shape[0] - context - 1) // stride + 1 if tokens.shape[0] > context else 0
    starts = np.arange(count) * stride
    return tokens[starts[:, None] + np.arange(context + 1)]


def next_token_windows(
    corpus: TextCorpus,
    context: int,
    *,
    test_fraction: float = 0.1,
    stride: int | None = None,
    seed: int = 0,
) -> Dataset:
    """Next-token examples of length T = ``context`` from every source, with a held-out part of each.

    For a source of L tokens, the held-out part is its last ``n = max(ceil(test_fraction * L), T + 1)``
    tokens and the training part its first ``L - n``; each part is cut into windows ``w`` of T + 1
    tokens (training windows every ``stride`` tokens, held-out windows every T), with
    ``x = w[:-1]`` and ``y = w[1:]``. A source whose training part is shorter than T + 1 tokens
    (any source shorter than ``2 (T + 1)``) is left out (counted in ``source``). The held-out
    windows are shuffled (seeded), so that a prefix of them (``eval_size``) samples every source.

    Args:
      corpus: the sources.
      context: T >= 1, tokens per example.
      test_fraction: in (0, 1), the share of each source held out.
      stride: >= 1, tokens between training windows (default T; smaller values overlap windows).
      seed: seed of the shuffle of the held-out windows.

    Returns:
      Dataset with x / y int32 [M, T] (train) and [M_test, T] (held out), ``num_classes`` = V and
      ``groups`` int32 [M], the source of every training window (its index in ``corpus.names``
      among the sources that were kept).

    Raises:
      ValueError: ``context``, ``stride`` or ``test_fraction`` out of range, or a ``context`` larger
        than the data allows (no source holds ``2 (context + 1)`` tokens; the message gives the
        largest context that works).
    """
    for field, value in (("context", context), ("stride", stride)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
            raise ValueError(f"{field}={value!r} must be a positive int")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction={test_fraction!r} must be in (0, 1)")
    stride = context if stride is None else int(stride)
    train, test, groups, kept = [], [], [], []
    for tokens in corpus.tokens:
        held = max(math.ceil(test_fraction * tokens.shape[0]), context + 1)
        if tokens.shape[0] - held < context + 1:
            continue
        w_train = _windows(tokens[: tokens.shape[0] - held], context, stride)
        w_test = _windows(tokens[tokens.shape[0] - held :], context, context)
        groups.append(np.full(w_train.shape[0], len(kept), np.int32))
        kept.append(tokens.shape[0])
        train.append(w_train)
        test.append(w_test)
    if not kept:
        longest = max(t.shape[0] for t in corpus.tokens)
        raise ValueError(
            f"context={context} is larger than {corpus.name} allows: a source needs at least 2 * (context + 1) "
            f"tokens (one training and one held-out window) and the longest of its {len(corpus.tokens)} sources has "
            f"{longest}; use context <= {longest // 2 - 1}"
        )
    train, test = np.concatenate(train), np.concatenate(test)
    test = test[np.random.default_rng(seed).permutation(test.shape[0])]
    dropped = len(corpus.tokens) - len(kept)
    source = (
        f"{corpus.source}; context {context}: {train.shape[0]} training windows (stride {stride}) / "
        f"{test.shape[0]} held-out windows (last {test_fraction:g} of every source) from {len(kept)} sources"
        + (f" ({dropped} too short for a training and a held-out window left out)" if dropped else "")
    )
    return Dataset(
        train[:, :-1], train[:, 1:], test[:, :-1], test[:, 1:], corpus.vocab, corpus.name, source,
        groups=np.concatenate(groups),
    )


def load_text(
    name: str, context: int, *, test_fraction: float = 0.1, stride: int | None = None, seed: int = 0
) -> Dataset:
    """Loads a text data set by spec (``python_docs`` or ``text:PATH``) as next-token windows of
    length ``context`` (:func:`next_token_windows`).

    Raises:
      ValueError: an unknown name, bad options, a ``context`` larger than the data allows.
      DatasetNotFoundError: ``text:PATH`` names nothing usable.
    """
    if name == "python_docs":
        corpus = python_docs_corpus()
    elif isinstance(name, str) and name.startswith(TEXT_PREFIX):
        corpus = text_files_corpus(name[len(TEXT_PREFIX) :])
    else:
        raise ValueError(f"unknown text dataset {name!r}; known: {', '.join(TEXT_DATASETS)}, {TEXT_PREFIX}PATH")
    return next_token_windows(corpus, context, test_fraction=test_fraction, stride=stride, seed=seed)


def partition_labels(dataset: Dataset) -> tuple[np.ndarray, int]:
    """What the partitioners split a data set by: ``(labels [M], number of distinct values)``, the
    source of every training window (``dataset.groups``) for a text data set, the class labels
    otherwise."""
    if dataset.groups is not None:
        groups = np.asarray(dataset.groups)
        return groups, int(groups.max()) + 1
    return np.asarray(dataset.y_train), int(dataset.num_classes)

