"""The tfds builder classes of MNIST, Fashion-MNIST and CIFAR-10/100 (imports tensorflow-datasets).

Importing this module imports ``tensorflow_datasets`` and registers the builders with it under the
names of :data:`jaxgossip.data.builders.BUILDER_NAMES`, after which ``tfds.data_source(
"jaxgossip_mnist", data_dir=...)`` (and ``tfds.testing.mock_data``) work as for any registered data
set. Nothing else in jaxgossip imports it at import time: the functions of
:mod:`jaxgossip.data.builders` import it when a builder is first needed, so the embedded data sets
work where tensorflow-datasets is not installed.

Each builder is a ``tfds.core.GeneratorBasedBuilder`` whose features are ``image``, a
``tfds.features.Tensor`` uint8 [H, W, C], and ``label``, a ``tfds.features.ClassLabel`` (an int64
scalar tensor that also records the number of classes), plus ``coarse_label`` (20 classes) for
CIFAR-100. It never downloads: the raw files are read from the tfds *manual* folder.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from jaxgossip.data import raw

__all__ = [
    "BUILDER_CLASSES",
    "JaxgossipCifar10",
    "JaxgossipCifar100",
    "JaxgossipFashionMnist",
    "JaxgossipMnist",
]

_FASHION_NAMES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


class _RawImageBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Shared code: reads raw files from the manual folder, writes one example per image."""

    VERSION = tfds.core.Version(raw.PREPARED_VERSION)
    RELEASE_NOTES = {raw.PREPARED_VERSION: "Prepared by jaxgossip from local raw files."}
    # Subclasses set these.
    _KEY: str = ""
    _SHAPE: tuple[int, int, int] = (0, 0, 0)
    _NUM_CLASSES: int = 0
    _DESCRIPTION: str = ""
    _HOMEPAGE: str = ""
    _CITATION: str = ""

    _CLASS_NAMES: tuple[str, ...] | None = None

    def _label_feature(self, num_classes: int) -> tfds.features.ClassLabel:
        if self._CLASS_NAMES is not None and len(self._CLASS_NAMES) == num_classes:
            return tfds.features.ClassLabel(names=list(self._CLASS_NAMES))
        return tfds.features.ClassLabel(num_classes=num_classes)

    def _extra_features(self) -> dict[str, Any]:
        return {}

    def _info(self) -> tfds.core.DatasetInfo:
        features = {
            "image": tfds.features.Tensor(shape=self._SHAPE, dtype=np.uint8),
            # ClassLabel is an int64 scalar Tensor that also records the class count (and names),
            # so tfds.testing.mock_data draws valid labels.
            "label": self._label_feature(self._NUM_CLASSES),
            **self._extra_features(),
        }
        return tfds.core.DatasetInfo(
            builder=self,
            description=self._DESCRIPTION,
            features=tfds.features.FeaturesDict(features),
            supervised_keys=("image", "label"),
            homepage=self._HOMEPAGE,
            citation=self._CITATION,
        )

    def _locate(self, directory: str) -> Any:
        raise NotImplementedError

    def _read_split(self, located: Any, split: str) -> raw.RawSplit:
        raise NotImplementedError

    def _split_generators(self, dl_manager):
        directory = os.fspath(dl_manager.manual_dir)
        located = self._locate(directory)
        if located is None:
            raise raw.DatasetNotFoundError(
                f"no raw {self._KEY} files in {directory}: {self.MANUAL_DOWNLOAD_INSTRUCTIONS}"
            )
        return {split: self._generate_examples(located, split) for split in ("train", "test")}

    def _generate_examples(self, located, split):
        data = self._read_split(located, split)
        for i in range(data.labels.shape[0]):
            example = {"image": data.images[i], "label": data.labels[i]}
            if data.coarse_labels is not None:
                example["coarse_label"] = data.coarse_labels[i]
            yield i, example

    # tfds prints these two messages to stdout; the library stays silent.
    def _log_download_bytes(self) -> None:
        pass

    def _log_download_done(self) -> None:
        pass


class _IdxBuilder(_RawImageBuilder, skip_registration=True):
    _SHAPE = (28, 28, 1)
    _NUM_CLASSES = 10

    def _locate(self, directory):
        return raw.find_idx_files(directory)

    def _read_split(self, located, split):
        return raw.read_idx_split(located, split)


class JaxgossipMnist(_IdxBuilder):
    """MNIST (60,000 train / 10,000 test 28x28 grey digits) from local IDX files."""

    _KEY = "mnist"
    MANUAL_DOWNLOAD_INSTRUCTIONS = raw.idx_instructions("mnist")
    _DESCRIPTION = "MNIST handwritten digits, prepared by jaxgossip from local IDX files."
    _HOMEPAGE = "http://yann.lecun.com/exdb/mnist/"
    _CITATION = (
        "LeCun, Bottou, Bengio, Haffner. Gradient-based learning applied to document recognition. Proc. IEEE 1998."
    )


class JaxgossipFashionMnist(_IdxBuilder):
    """Fashion-MNIST (60,000 / 10,000 28x28 grey clothing images) from local IDX files."""

    _KEY = "fashion_mnist"
    _CLASS_NAMES = _FASHION_NAMES
    MANUAL_DOWNLOAD_INSTRUCTIONS = raw.idx_instructions("fashion_mnist")
    _DESCRIPTION = (
        "Fashion-MNIST (Zalando), prepared by jaxgossip from local IDX files. Classes: "
        + ", ".join(f"{i}={n}" for i, n in enumerate(_FASHION_NAMES))
        + "."
    )
    _HOMEPAGE = "https://github.com/zalandoresearch/fashion-mnist"
    _CITATION = (
        "Xiao, Rasul, Vollgraf. Fashion-MNIST: a novel image dataset for benchmarking machine learning "
        "algorithms. arXiv:1708.07747, 2017."
    )


class _CifarBuilder(_RawImageBuilder, skip_registration=True):
    _SHAPE = (32, 32, 3)
    _HOMEPAGE = "https://www.cs.toronto.edu/~kriz/cifar.html"
    _CITATION = "Krizhevsky. Learning multiple layers of features from tiny images. Tech. report, U. Toronto, 2009."

    def _locate(self, directory):
        return raw.find_cifar(self._KEY, directory)

    def _read_split(self, located, split):
        return raw.read_cifar_split(self._KEY, located, split)


class JaxgossipCifar10(_CifarBuilder):
    """CIFAR-10 (50,000 / 10,000 32x32 colour images, 10 classes) from the python-version archive."""

    _KEY = "cifar10"
    _NUM_CLASSES = 10
    MANUAL_DOWNLOAD_INSTRUCTIONS = raw.cifar_instructions("cifar10")
    _DESCRIPTION = "CIFAR-10, prepared by jaxgossip from the local python-version archive."


class JaxgossipCifar100(_CifarBuilder):
    """CIFAR-100 (50,000 / 10,000 32x32 colour images, 100 fine / 20 coarse classes)."""

    _KEY = "cifar100"
    _NUM_CLASSES = 100
    MANUAL_DOWNLOAD_INSTRUCTIONS = raw.cifar_instructions("cifar100")
    _DESCRIPTION = "CIFAR-100, prepared by jaxgossip from the local python-version archive; label = fine label."

    def _extra_features(self):
        return {"coarse_label": tfds.features.ClassLabel(num_classes=20)}


#: ``load_dataset`` name -> builder class.
BUILDER_CLASSES = {
    "mnist": JaxgossipMnist,
    "fashion_mnist": JaxgossipFashionMnist,
    "cifar10": JaxgossipCifar10,
    "cifar100": JaxgossipCifar100,
}
