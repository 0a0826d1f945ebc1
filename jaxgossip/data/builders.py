"""tfds builders that prepare MNIST, Fashion-MNIST, CIFAR-10/100 from local raw files.

Each builder is a ``tfds.core.GeneratorBasedBuilder`` whose features are
``image``, a ``tfds.features.Tensor`` uint8 [H, W, C], and ``label``, a
``tfds.features.ClassLabel`` (an int64 scalar tensor that also records the
number of classes), plus ``coarse_label`` (20 classes) for CIFAR-100. It never
downloads: the raw files are read from the tfds *manual* folder, which
:func:`prepare` points at the folder the user names. Prepared data is written as ArrayRecord and read back with
``tfds.data_source`` (random access, no TensorFlow needed), so the whole path
works with ``tensorflow-datasets`` alone.

The builders are registered under their own names so they never clash with
tfds's built-in ``mnist``/``fashion_mnist``/``cifar10``/``cifar100``:

========================  ============================  =====================
``load_dataset`` name     tfds builder name             raw files
========================  ============================  =====================
``mnist``                 ``jaxgossip_mnist``           4 IDX files [.gz]
``fashion_mnist``         ``jaxgossip_fashion_mnist``   4 IDX files [.gz]
``cifar10``               ``jaxgossip_cifar10``         cifar-10-python.tar.gz
``cifar100``              ``jaxgossip_cifar100``        cifar-100-python.tar.gz
========================  ============================  =====================

tensorflow-datasets is imported on first use, not with this module, so that the embedded
``digits``, ``synthetic`` and text data sets work where it is not installed (an image with JAX and
no TensorFlow stack); asking for a tfds data set there raises
:class:`~jaxgossip.data.raw.MissingPackageError` naming ``pip install tensorflow-datasets``. The
builder classes live in :mod:`jaxgossip.data.tfds_builders`, imported by the first function here
that needs a builder (:func:`builder_classes` does only that); from then on
``tfds.data_source("jaxgossip_mnist", data_dir=...)`` works like for any registered dataset (and so
does ``tfds.testing.mock_data``).

Speed on an idle 2-core CPU: preparing Fashion-MNIST's 70,000 images takes
about 7 s and reading them back about 3 s, both dominated by tfds's
per-example (de)serialization in Python. Verified offline (no network
namespace): nothing is fetched.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from jaxgossip.data import raw

if TYPE_CHECKING:
    import tensorflow_datasets as tfds

#: ``load_dataset`` name -> tfds builder name.
BUILDER_NAMES = {
    "mnist": "jaxgossip_mnist",
    "fashion_mnist": "jaxgossip_fashion_mnist",
    "cifar10": "jaxgossip_cifar10",
    "cifar100": "jaxgossip_cifar100",
}

#: The version every builder writes: prepared data lives in ``<data_dir>/<builder name>/<VERSION>``.
VERSION = raw.PREPARED_VERSION

#: What to run when a tfds data set is asked for and tensorflow-datasets is missing.
TFDS_INSTALL = "pip install tensorflow-datasets"


def tfds_installed() -> bool:
    """Whether tensorflow-datasets can be imported (looked up without importing it)."""
    return importlib.util.find_spec("tensorflow_datasets") is not None


_TFDS_SETS = "a tfds data set (mnist, fashion_mnist, cifar10 or cifar100)"


def import_tfds(what: str = _TFDS_SETS):
    """``tensorflow_datasets``, imported on first use.

    Args:
        what: what needs it, for the error message.

    Raises:
        MissingPackageError: tensorflow-datasets is not installed; the message names ``what`` and
            the ``pip install`` that fixes it.
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError as err:
        raise raw.MissingPackageError(
            f"{what} is read through tensorflow-datasets, which is not installed ({err}). To fix: {TFDS_INSTALL}; "
            "or use a data set that needs nothing: digits, synthetic, python_docs, text:PATH or npz:PATH",
            name="tensorflow_datasets",
        ) from None
    return tfds


def builder_classes(what: str = _TFDS_SETS) -> dict[str, Any]:
    """``load_dataset`` name -> tfds builder class, registering the builders with tfds first.

    After the first call ``tfds.data_source("jaxgossip_mnist", ...)`` works like for any registered
    data set; every function below that needs a builder calls it.

    Raises:
        MissingPackageError: tensorflow-datasets is not installed (the message says what to install).
    """
    import_tfds(what)
    from jaxgossip.data import tfds_builders

    return tfds_builders.BUILDER_CLASSES


_CLASS_NAMES = {
    "JaxgossipMnist": "mnist",
    "JaxgossipFashionMnist": "fashion_mnist",
    "JaxgossipCifar10": "cifar10",
    "JaxgossipCifar100": "cifar100",
}


def __getattr__(name: str):
    # The builder classes as attributes (``builders.JaxgossipMnist``), imported with tfds on first access.
    if name in _CLASS_NAMES:
        return builder_classes()[_CLASS_NAMES[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _check_name(name: str) -> None:
    if name not in BUILDER_NAMES:
        raise ValueError(f"no tfds builder for dataset {name!r}; known: {sorted(BUILDER_NAMES)}")


def get_builder(name: str, data_dir: str | os.PathLike | None = None) -> tfds.core.DatasetBuilder:
    """Returns our tfds builder for ``name`` (ArrayRecord format; nothing is read or written).

    Args:
        name: "mnist", "fashion_mnist", "cifar10" or "cifar100".
        data_dir: tfds data folder (None: tfds's default, ``$TFDS_DATA_DIR`` or
            ``~/tensorflow_datasets``).

    Raises:
        MissingPackageError: tensorflow-datasets is not installed.
    """
    _check_name(name)
    cls = builder_classes(f"data set {name!r}")[name]
    try:
        return cls(data_dir=None if data_dir is None else os.fspath(data_dir), file_format="array_record")
    except Exception as err:
        # The constructor reads an existing dataset_info.json; a damaged one raises protobuf or JSON
        # errors of assorted types.
        root = os.fspath(data_dir) if data_dir is not None else import_tfds().core.constants.DATA_DIR
        folder = os.path.join(root, BUILDER_NAMES[name], VERSION)
        if not os.path.isdir(folder):
            raise
        raise _damaged_prepared(name, folder, err) from err


def _damaged_prepared(name: str, folder: str, err: Exception) -> raw.CorruptDataError:
    return raw.CorruptDataError(
        f"{folder}: the prepared {name} data cannot be read ({type(err).__name__}: {err}); the files are "
        f"damaged or incomplete (an interrupted run or copy?). To fix: delete the folder {folder}; the "
        "next run prepares it again from the raw files"
    )


def is_prepared(name: str, data_dir: str | os.PathLike | None = None) -> bool:
    """Whether ``name`` was already prepared in ``data_dir`` by :func:`prepare`."""
    return _prepared(get_builder(name, data_dir))


def _prepared(builder) -> bool:
    # Same test as ``builder.is_prepared()`` without its warning log for absent folders.
    return os.path.isfile(os.path.join(os.fspath(builder.data_dir), "dataset_info.json"))


def find_raw(name: str, dirs) -> str | None:
    """First folder of ``dirs`` that holds the raw files of ``name``, or None."""
    _check_name(name)
    for directory in dirs:
        if name in ("mnist", "fashion_mnist"):
            if raw.find_idx_files(directory) is not None:
                return directory
        elif raw.find_cifar(name, directory) is not None:
            return directory
    return None


@contextlib.contextmanager
def _quiet_progress():
    # tfds keeps the progress-bar switch in a module global; restore it afterwards.
    tfds = import_tfds()
    from tensorflow_datasets.core.utils import tqdm_utils

    previous = getattr(tqdm_utils, "_active", True)
    tfds.display_progress_bar(False)
    try:
        yield
    finally:
        tfds.display_progress_bar(previous)


def prepare(
    name: str,
    raw_dir: str | os.PathLike,
    data_dir: str | os.PathLike | None = None,
    *,
    max_examples_per_split: int | None = None,
) -> str:
    """Prepares ``name`` from the raw files in ``raw_dir`` into ``data_dir`` (ArrayRecord).

    Offline by construction: tfds only reads ``raw_dir`` (passed as its manual
    folder); no download is attempted. Does nothing if already prepared.

    Args:
        name: "mnist", "fashion_mnist", "cifar10" or "cifar100".
        raw_dir: folder with the raw files (see ``MANUAL_DOWNLOAD_INSTRUCTIONS``
            of the builder, repeated in the error message).
        data_dir: tfds data folder to write to (None: tfds's default).
        max_examples_per_split: if set, write only the first that many examples
            of each split (for quick tests).

    Returns:
        The folder of the prepared dataset (``data_dir/<builder name>/1.0.0``).

    Raises:
        DatasetNotFoundError: if the raw files are not in ``raw_dir``.
    """
    builder = get_builder(name, data_dir)
    if _prepared(builder):
        return os.fspath(builder.data_dir)
    tfds = import_tfds()
    if find_raw(name, [raw_dir]) is None:
        raise raw.DatasetNotFoundError(f"no raw {name} files in {raw_dir}: {builder.MANUAL_DOWNLOAD_INSTRUCTIONS}")
    config = tfds.download.DownloadConfig(
        manual_dir=os.fspath(raw_dir),
        compute_stats=tfds.download.ComputeStatsMode.SKIP,
        max_examples_per_split=max_examples_per_split,
        try_download_gcs=False,
    )
    root = os.path.dirname(os.path.dirname(os.fspath(builder.data_dir)))
    before = _dirs_near(root)
    try:
        with _quiet_progress():
            builder.download_and_prepare(download_config=config)
    except BaseException:
        _remove_new_empty_dirs(root, before)
        raise
    return os.fspath(builder.data_dir)


def _dirs_near(root: str) -> set[str]:
    """The folders ``root`` and its entries two levels down (where tfds creates ``<builder>/<version>``
    and ``downloads/extracted``)."""
    found = set()
    if os.path.isdir(root):
        found.add(root)
        for entry in os.scandir(root):
            if entry.is_dir(follow_symlinks=False):
                found.add(entry.path)
                found.update(e.path for e in os.scandir(entry.path) if e.is_dir(follow_symlinks=False))
    return found


def _remove_new_empty_dirs(root: str, before: set[str]) -> None:
    # A failed prepare (a damaged raw file) leaves the folders tfds made on the way empty: they are
    # removed so the data folder is as it was. Files are never deleted, nor folders that hold any.
    for path in sorted(_dirs_near(root) - before, key=len, reverse=True):
        for folder, _, _ in os.walk(path, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # fails, and is kept, when not empty


def source_to_numpy(source) -> raw.RawSplit:
    """Stacks a tfds random-access data source of our features into NumPy arrays.

    Args:
        source: a ``tfds.data_source(...)[split]`` (or anything with ``__len__``
            and ``__getitem__`` returning dicts with ``image`` and ``label``).

    Returns:
        RawSplit with images uint8 [M, H, W, C] and labels int64 [M].
    """
    length = len(source)
    try:
        examples = source.__getitems__(list(range(length)))  # batched read: ~2x faster than indexing
    except (AttributeError, TypeError):
        # No batched read (plain sequences), or tfds.testing.mock_data's mock, whose explicit
        # ``__getitems__`` call is not bound to the source.
        examples = [source[i] for i in range(length)]
    if length == 0:
        raise ValueError("empty data source")
    images = np.stack([np.asarray(e["image"], dtype=np.uint8) for e in examples])
    labels = np.asarray([int(e["label"]) for e in examples], dtype=np.int64)
    coarse = None
    if "coarse_label" in examples[0]:
        coarse = np.asarray([int(e["coarse_label"]) for e in examples], dtype=np.int64)
    return raw.RawSplit(images, labels, coarse)


def read_prepared(name: str, data_dir: str | os.PathLike | None = None) -> dict[str, raw.RawSplit]:
    """Reads a dataset prepared by :func:`prepare` with ``tfds.data_source`` (no download).

    Args:
        name: "mnist", "fashion_mnist", "cifar10" or "cifar100".
        data_dir: tfds data folder (None: tfds's default).

    Returns:
        ``{"train": RawSplit, "test": RawSplit}``.
    """
    _check_name(name)
    builder_classes(f"data set {name!r}")  # registers the builder that tfds.data_source looks up by name
    tfds = import_tfds()
    splits = ("train", "test")
    try:
        sources = tfds.data_source(
            BUILDER_NAMES[name],
            split=list(splits),
            data_dir=None if data_dir is None else os.fspath(data_dir),
            download=False,
            try_gcs=False,
        )
        return {split: source_to_numpy(source) for split, source in zip(splits, sources)}
    except Exception as err:
        # tfds and array_record raise assorted types (TypeError, protobuf ParseError, OSError, ...)
        # for damaged files; turn them all into one actionable message.
        builder = get_builder(name, data_dir)
        if not _prepared(builder):
            raise
        raise _damaged_prepared(name, os.fspath(builder.data_dir), err) from err
