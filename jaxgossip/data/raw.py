"""Readers for the raw files of MNIST, Fashion-MNIST, CIFAR-10 and CIFAR-100.

These are the only functions in :mod:`jaxgossip.data` that read user files
directly; they are called by the tfds builders in :mod:`jaxgossip.data.builders`
and by the locator used by :func:`jaxgossip.data.load_dataset`. Nothing here
writes files, prints or downloads.

Raw formats
-----------
* IDX (LeCun et al., 1998): a big-endian header ``0, 0, type, ndim`` followed
    by ``ndim`` big-endian uint32 sizes and the data. MNIST and Fashion-MNIST
    ship ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
    ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``, each optionally
    gzipped (``.gz``). The Debian package ``dataset-fashion-mnist`` installs the
    gzipped files under ``/usr/share/datasets/fashion-mnist``.
* CIFAR "python version" (Krizhevsky, 2009): ``cifar-10-python.tar.gz``
    (folder ``cifar-10-batches-py`` with ``data_batch_1`` .. ``data_batch_5``
    and ``test_batch``) and ``cifar-100-python.tar.gz`` (folder
    ``cifar-100-python`` with ``train`` and ``test``). Each file is a pickled
    dict with ``data`` (uint8, [M, 3072], channel-major) and ``labels``
    (CIFAR-10) or ``fine_labels``/``coarse_labels`` (CIFAR-100).

References:
    Y. LeCun, L. Bottou, Y. Bengio, P. Haffner. Gradient-based learning applied
    to document recognition. Proc. IEEE, 1998.
    H. Xiao, K. Rasul, R. Vollgraf. Fashion-MNIST: a novel image dataset for
    benchmarking machine learning algorithms. arXiv:1708.07747, 2017.
    A. Krizhevsky. Learning multiple layers of features from tiny images.
    Technical report, University of Toronto, 2009.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import tarfile
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np


class DatasetNotFoundError(FileNotFoundError, ValueError):
    """Raw or prepared files of a dataset are missing.

    Subclasses both :class:`FileNotFoundError` and :class:`ValueError`, so it is
    caught by either; the message says which files to put where.
    """


# IDX type codes -> numpy big-endian dtypes.
_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

#: File stems of the IDX datasets, per split: (images, labels).
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

#: Archive and folder names of the CIFAR python versions.
CIFAR_FILES = {
    "cifar10": ("cifar-10-python.tar.gz", "cifar-10-batches-py"),
    "cifar100": ("cifar-100-python.tar.gz", "cifar-100-python"),
}

_CIFAR_MEMBERS = {
    "cifar10": {
        "train": tuple(f"data_batch_{i}" for i in range(1, 6)),
        "test": ("test_batch",),
    },
    "cifar100": {"train": ("train",), "test": ("test",)},
}

#: Where the Debian package ``dataset-fashion-mnist`` installs its files.
DEBIAN_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"


class RawSplit(NamedTuple):
    """One split of a raw image-classification dataset (host NumPy arrays).

    Attributes:
        images: uint8 array, shape [M, H, W, C].
        labels: int64 array, shape [M].
        coarse_labels: int64 array, shape [M], or None (CIFAR-100 only).
    """

    images: np.ndarray
    labels: np.ndarray
    coarse_labels: np.ndarray | None = None


# --------------------------------------------------------------------------
# IDX
# --------------------------------------------------------------------------


def parse_idx(buffer: bytes) -> np.ndarray:
    """Parses the bytes of one (uncompressed) IDX file.

    Args:
        buffer: the file content.

    Returns:
        An array with the shape and dtype stored in the header, in native byte
        order.

    Raises:
        ValueError: if the header is malformed or the size does not match.
    """
    if len(buffer) < 4 or buffer[0] != 0 or buffer[1] != 0:
        raise ValueError("not an IDX file: the magic number must start with two zero bytes")
    type_code, ndim = buffer[2], buffer[3]
    if type_code not in _IDX_DTYPES:
        raise ValueError(f"not an IDX file: unknown data type code 0x{type_code:02x}")
    header = 4 + 4 * ndim
    if len(buffer) < header:
        raise ValueError("truncated IDX header")
    shape = tuple(int(s) for s in np.frombuffer(buffer, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_DTYPES[type_code]
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(buffer) != expected:
        raise ValueError(
            f"IDX size mismatch: header says shape {shape} ({expected} bytes), file has {len(buffer)} bytes"
        )
    data = np.frombuffer(buffer, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="), copy=True)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Reads an IDX file, gzipped (by ``.gz`` suffix or magic bytes) or not.

    Args:
        path: path of the file.

    Returns:
        The stored array (see :func:`parse_idx`).
    """
    with open(path, "rb") as f:
        buffer = f.read()
    if buffer[:2] == b"\x1f\x8b":
        buffer = gzip.decompress(buffer)
    return parse_idx(buffer)


def _find_file(directory: str | os.PathLike, stem: str) -> str | None:
    # Accept "stem", "stem.gz" and the "stem.idx3-ubyte" spelling some mirrors use.
    for candidate in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        path = os.path.join(directory, candidate)
        if os.path.isfile(path):
            return path
    return None


def find_idx_files(directory: str | os.PathLike) -> dict[str, tuple[str, str]] | None:
    """Finds the four IDX files of MNIST/Fashion-MNIST in ``directory``.

    Args:
        directory: folder to look in (not searched recursively).

    Returns:
        ``{"train": (images_path, labels_path), "test": (...)}`` or None when any
        of the four files is missing.
    """
    if directory is None or not os.path.isdir(directory):
        return None
    found = {}
    for split, stems in IDX_FILES.items():
        paths = tuple(_find_file(directory, stem) for stem in stems)
        if any(p is None for p in paths):
            return None
        found[split] = paths
    return found


def idx_instructions(name: str) -> str:
    """Human-readable list of the IDX files a user must provide."""
    files = ", ".join(f"{stem}[.gz]" for stems in IDX_FILES.values() for stem in stems)
    text = f"put the four {name} IDX files ({files}) in one folder and pass it as raw_dir"
    if name == "fashion_mnist":
        text += (
            f" (the Debian/Ubuntu package 'dataset-fashion-mnist' installs them in "
            f"{DEBIAN_FASHION_MNIST_DIR}; without root, `apt-get download dataset-fashion-mnist && "
            f"dpkg-deb -x dataset-fashion-mnist_*.deb DIR` unpacks them under DIR{DEBIAN_FASHION_MNIST_DIR}, "
            f"see .ci/fetch_fashion_mnist.sh)"
        )
    return text


def read_idx_split(files: dict[str, tuple[str, str]], split: str) -> RawSplit:
    """Reads one split of an IDX dataset located by :func:`find_idx_files`.

    Returns:
        RawSplit with images uint8 [M, H, W, 1] and labels int64 [M].
    """
    images_path, labels_path = files[split]
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"inconsistent IDX files: images {images.shape} ({images_path}), labels {labels.shape} ({labels_path})"
        )
    return RawSplit(images.astype(np.uint8)[..., None], labels.astype(np.int64))


# --------------------------------------------------------------------------
# CIFAR (python version)
# --------------------------------------------------------------------------


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler that only reconstructs NumPy arrays, lists, dicts and scalars.

    The CIFAR python batches are pickles; refusing every other global means a
    tampered file cannot run code when it is read.
    """

    _ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("copy_reg", "_reconstructor"),
        ("copyreg", "_reconstructor"),
        ("__builtin__", "object"),
        ("builtins", "object"),
        ("_codecs", "encode"),  # how protocol-2 pickles written by Python 3 store bytes
    }

    def find_class(self, module, name):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR batch")
        return super().find_class(module, name)


def _unpickle(buffer: bytes) -> dict:
    data = _NumpyOnlyUnpickler(io.BytesIO(buffer), encoding="bytes").load()
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in data.items()}


def find_cifar(name: str, directory: str | os.PathLike) -> str | None:
    """Finds a CIFAR python-version archive or extracted folder.

    Looks for ``directory/<archive>``, ``directory/<folder>`` and ``directory``
    itself being the extracted folder.

    Args:
        name: "cifar10" or "cifar100".
        directory: folder to look in.

    Returns:
        The path of the archive or of the extracted folder, or None.
    """
    if directory is None or not os.path.isdir(directory):
        return None
    archive, folder = CIFAR_FILES[name]
    members = _CIFAR_MEMBERS[name]
    first = members["train"][0]
    for path in (os.path.join(directory, folder), os.fspath(directory)):
        if os.path.isfile(os.path.join(path, first)):
            return path
    path = os.path.join(directory, archive)
    if os.path.isfile(path):
        return path
    return None


def cifar_instructions(name: str) -> str:
    """Human-readable description of the CIFAR files a user must provide."""
    archive, folder = CIFAR_FILES[name]
    return (
        f"put {archive} (the CIFAR 'python version' from https://www.cs.toronto.edu/~kriz/cifar.html) "
        f"or its extracted folder {folder}/ in a folder and pass that folder as raw_dir"
    )


def _cifar_buffers(name: str, path: str, member_names: Iterable[str]) -> list[bytes]:
    _, folder = CIFAR_FILES[name]
    if os.path.isdir(path):
        out = []
        for member in member_names:
            with open(os.path.join(path, member), "rb") as f:
                out.append(f.read())
        return out
    with tarfile.open(path, "r:*") as tar:
        out = []
        for member in member_names:
            handle = tar.extractfile(f"{folder}/{member}")
            if handle is None:
                raise ValueError(f"{path} has no regular file {folder}/{member}")
            out.append(handle.read())
        return out


def read_cifar_split(name: str, path: str, split: str) -> RawSplit:
    """Reads one split of CIFAR-10/100 from an archive or folder.

    Args:
        name: "cifar10" or "cifar100".
        path: what :func:`find_cifar` returned.
        split: "train" or "test".

    Returns:
        RawSplit with images uint8 [M, 32, 32, 3], labels int64 [M] (fine labels
        for CIFAR-100) and, for CIFAR-100, coarse_labels int64 [M].
    """
    batches = [_unpickle(b) for b in _cifar_buffers(name, path, _CIFAR_MEMBERS[name][split])]
    data = np.concatenate([np.asarray(b["data"], dtype=np.uint8) for b in batches])
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    if name == "cifar10":
        labels = np.concatenate([np.asarray(b["labels"], dtype=np.int64) for b in batches])
        return RawSplit(np.ascontiguousarray(images), labels)
    fine = np.concatenate([np.asarray(b["fine_labels"], dtype=np.int64) for b in batches])
    coarse = np.concatenate([np.asarray(b["coarse_labels"], dtype=np.int64) for b in batches])
    return RawSplit(np.ascontiguousarray(images), fine, coarse)


def candidate_dirs(name: str, raw_dir: str | os.PathLike | None, data_dir: str | os.PathLike | None) -> Sequence[str]:
    """Folders searched for raw files, in order.

    ``raw_dir``; ``data_dir`` and ``data_dir/downloads/manual`` (tfds's manual
    folder); for Fashion-MNIST also the Debian package folder.
    """
    dirs = []
    if raw_dir is not None:
        dirs.append(os.fspath(raw_dir))
    if data_dir is not None:
        dirs += [os.fspath(data_dir), os.path.join(os.fspath(data_dir), "downloads", "manual")]
    if name == "fashion_mnist":
        dirs.append(DEBIAN_FASHION_MNIST_DIR)
    return dirs
