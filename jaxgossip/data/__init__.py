"""Data for jaxgossip: datasets, tfds builders, partitioners, on-device shards, augmentation.

Typical use::

    from jaxgossip import data
    ds = data.load_dataset("auto")                     # Fashion-MNIST if available, else digits
    parts = data.partition(ds.y_train, 8, "dirichlet:0.1", seed=0)
    shards = data.shard_dataset(ds, parts)             # x [N, M_max, H, W, C], counts [N]
    x, y = data.sample_batch(shards, key, 32)          # x [N, B, H, W, C], y [N, B]

tensorflow-datasets is needed only to load mnist, fashion_mnist, cifar10 or cifar100 and is imported
then (see :mod:`jaxgossip.data.builders`); the tfds builder classes (``data.JaxgossipMnist``, ...)
are imported with it on first access.
"""

from jaxgossip.data import builders
from jaxgossip.data.augment import augment_cifar, random_crop, random_flip
from jaxgossip.data.builders import (
    BUILDER_NAMES,
    TFDS_INSTALL,
    builder_classes,
    get_builder,
    is_prepared,
    prepare,
    read_prepared,
    tfds_installed,
)
from jaxgossip.data.datasets import (
    DATASET_NAMES,
    NPZ_PREFIX,
    Dataset,
    fashion_mnist_available,
    from_arrays,
    load_dataset,
    load_digits,
    load_npz,
    make_synthetic,
    standardize,
)
from jaxgossip.data.node_shards import (
    NodeShards,
    check_batch_size,
    make_node_shards,
    sample_batch,
    sample_node_batch,
    shard_dataset,
)
from jaxgossip.data.partitioners import SCHEMES, by_source, dirichlet, iid, label_histograms, partition, shards, skew
from jaxgossip.data.raw import (
    DEBIAN_FASHION_MNIST_DIR,
    CorruptDataError,
    DatasetNotFoundError,
    MissingPackageError,
    RawSplit,
    read_idx,
)
from jaxgossip.data.text import (
    BYTE_VOCAB,
    TEXT_DATASETS,
    TEXT_PREFIX,
    TextCorpus,
    byte_tokens,
    is_text_dataset,
    load_text,
    next_token_windows,
    partition_labels,
    python_docs_corpus,
    text_files_corpus,
)

__all__ = [
    "BUILDER_NAMES",
    "BYTE_VOCAB",
    "DATASET_NAMES",
    "DEBIAN_FASHION_MNIST_DIR",
    "NPZ_PREFIX",
    "SCHEMES",
    "TEXT_DATASETS",
    "TEXT_PREFIX",
    "TextCorpus",
    "CorruptDataError",
    "Dataset",
    "DatasetNotFoundError",
    "MissingPackageError",
    "TFDS_INSTALL",
    "NodeShards",
    "RawSplit",
    "augment_cifar",
    "builder_classes",
    "by_source",
    "byte_tokens",
    "check_batch_size",
    "dirichlet",
    "fashion_mnist_available",
    "from_arrays",
    "get_builder",
    "iid",
    "is_text_dataset",
    "is_prepared",
    "label_histograms",
    "load_dataset",
    "load_digits",
    "load_npz",
    "load_text",
    "make_node_shards",
    "make_synthetic",
    "next_token_windows",
    "partition",
    "partition_labels",
    "python_docs_corpus",
    "prepare",
    "random_crop",
    "random_flip",
    "read_idx",
    "read_prepared",
    "sample_batch",
    "sample_node_batch",
    "shard_dataset",
    "shards",
    "skew",
    "standardize",
    "text_files_corpus",
    "tfds_installed",
]


# The builder classes import tensorflow-datasets, so they are looked up on first access (and left out
# of ``__all__``): importing jaxgossip.data needs no tfds.
_BUILDER_CLASSES = ("JaxgossipMnist", "JaxgossipFashionMnist", "JaxgossipCifar10", "JaxgossipCifar100")


def __getattr__(name: str):
    if name in _BUILDER_CLASSES:
        return getattr(builders, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
