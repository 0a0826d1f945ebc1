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

A file that is found but truncated, corrupt or malformed raises
:class:`CorruptDataError`, a ``ValueError`` whose message names the file, what
is wrong and how to fix it.

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
import zlib
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

#: The version under which data prepared from these raw files is written (the tfds builders'
#: version: prepared data lives in ``<data_dir>/<builder name>/<PREPARED_VERSION>``).
PREPARED_VERSION = "1.0.0"


class DatasetNotFoundError(FileNotFoundError, ValueError):
    """Raw or prepared files of a dataset are missing.

    Subclasses both :class:`FileNotFoundError` and :class:`ValueError`, so it is
    caught by either; the message says which files to put where.
    """


class MissingPackageError(ModuleNotFoundError, ValueError):
    """An optional package that a data set needs (tensorflow-datasets) is not installed.

    A :class:`ModuleNotFoundError`, for code that guards imports, and a :class:`ValueError`, since
    asking for that data set is the input to change when the package cannot be installed; the
    message names the package, the ``pip install`` that fixes it, and the data sets that need
    nothing.
    """


class CorruptDataError(ValueError):
    """A raw data file exists but is truncated, corrupt or not in the expected format.

    The message names the file, what is wrong with it and how to fix it
    (usually: delete the file and fetch it again).
    """


#: The config fields (and ``load_dataset`` arguments) that say where data comes from; the
#: CLI spells them ``--data_dir``, ``--raw_dir`` and ``--download``.
_WHERE_FROM = (
    "set the config field raw_dir to that folder (--raw_dir=DIR on the command line; "
    "load_dataset(name, data_dir, raw_dir=DIR) in Python), or put the files in the folder given by the "
    "config field data_dir or in its downloads/manual subfolder; or else set the config field download "
    "(--download=true; load_dataset(..., download=True)) to let tfds fetch the dataset, which needs "
    "TensorFlow (pip install 'jaxgossip[tf]') and internet"
)


def _corrupt(path: str | os.PathLike, problem: str, refetch: str) -> CorruptDataError:
    return CorruptDataError(
        f"{os.fspath(path)}: {problem}. The file is damaged or incomplete (an interrupted download or "
        f"copy?). To fix: delete it and {refetch}"
    )


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


_IDX_REFETCH = (
    "download it again (MNIST: http://yann.lecun.com/exdb/mnist/ or a mirror; Fashion-MNIST: "
    "https://github.com/zalandoresearch/fashion-mnist or the Debian package dataset-fashion-mnist)"
)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Reads an IDX file, gzipped (recognised by its magic bytes) or not.

    Args:
        path: path of the file.

    Returns:
        The stored array (see :func:`parse_idx`).

    Raises:
        CorruptDataError: (a ValueError) the file is a truncated or corrupt gzip stream, or its IDX
            header or size is wrong; the message names the file and the fix.
    """
    with open(path, "rb") as f:
        buffer = f.read()
    if buffer[:2] == b"\x1f\x8b":
        try:
            buffer = gzip.decompress(buffer)
        except EOFError as err:
            problem = "truncated gzip stream (the file ends before the compressed data does)"
            raise _corrupt(path, problem, _IDX_REFETCH) from err
        except (OSError, zlib.error) as err:
            raise _corrupt(path, f"corrupt gzip stream ({err})", _IDX_REFETCH) from err
    elif os.fspath(path).endswith(".gz"):
        raise _corrupt(path, "named .gz but not gzip-compressed", _IDX_REFETCH)
    try:
        return parse_idx(buffer)
    except ValueError as err:
        raise _corrupt(path, str(err), _IDX_REFETCH) from err


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
    text = f"put the four {name} IDX files ({files}) in one folder"
    if name == "fashion_mnist":
        text += (
            f" (the Debian/Ubuntu package 'dataset-fashion-mnist' installs them in "
            f"{DEBIAN_FASHION_MNIST_DIR}, which is searched too; without root, `apt-get download "
            f"dataset-fashion-mnist && dpkg-deb -x dataset-fashion-mnist_*.deb DIR` unpacks them under "
            f"DIR{DEBIAN_FASHION_MNIST_DIR}, see .ci/fetch_fashion_mnist.sh)"
        )
    return f"{text} and {_WHERE_FROM}"


def read_idx_split(files: dict[str, tuple[str, str]], split: str) -> RawSplit:
    """Reads one split of an IDX dataset located by :func:`find_idx_files`.

    Returns:
        RawSplit with images uint8 [M, H, W, 1] and labels int64 [M].
    """
    images_path, labels_path = files[split]
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise CorruptDataError(
            f"inconsistent IDX files: {images_path} holds images of shape {images.shape} and {labels_path} "
            f"labels of shape {labels.shape}; expected [M, H, W] images and [M] labels of the same split. To fix: "
            f"replace both files with the matching pair of one dataset "
            f"({_IDX_REFETCH.replace('download it', 'download them')})"
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


def _cifar_refetch(name: str) -> str:
    archive, _ = CIFAR_FILES[name]
    return f"download {archive} again from https://www.cs.toronto.edu/~kriz/cifar.html"


def _unpickle(buffer: bytes, where: str, name: str) -> dict:
    """Loads one CIFAR batch; ``where`` names it (file, or archive:member) in errors."""
    try:
        data = _NumpyOnlyUnpickler(io.BytesIO(buffer), encoding="bytes").load()
    except pickle.UnpicklingError as err:
        if "refusing" in str(err):
            raise CorruptDataError(
                f"{where}: {err}: not a CIFAR batch (those hold only NumPy arrays and lists), and it is not "
                f"loaded because unpickling it could run code. To fix: delete it and {_cifar_refetch(name)}"
            ) from err
        raise _corrupt(where, f"not a readable pickle ({err})", _cifar_refetch(name)) from err
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError, MemoryError) as err:
        raise _corrupt(where, f"not a readable pickle ({type(err).__name__}: {err})", _cifar_refetch(name)) from err
    if not isinstance(data, dict):
        raise _corrupt(where, f"holds a {type(data).__name__}, not a CIFAR batch dict", _cifar_refetch(name))
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
        f"or its extracted folder {folder}/ in a folder and {_WHERE_FROM}"
    )


def _cifar_buffers(name: str, path: str, member_names: Iterable[str]) -> list[tuple[str, bytes]]:
    """``(where, bytes)`` of each batch, from the extracted folder or the archive at ``path``."""
    _, folder = CIFAR_FILES[name]
    if os.path.isdir(path):
        out = []
        for member in member_names:
            file = os.path.join(path, member)
            if not os.path.isfile(file):
                raise CorruptDataError(
                    f"{file} is missing: the extracted CIFAR folder {path} is incomplete. To fix: delete the "
                    f"folder and extract the archive again, or {_cifar_refetch(name)}"
                )
            with open(file, "rb") as f:
                out.append((file, f.read()))
        return out
    out = []
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in member_names:
                where = f"{path} (member {folder}/{member})"
                try:
                    handle = tar.extractfile(f"{folder}/{member}")
                except KeyError:
                    handle = None
                if handle is None:
                    raise _corrupt(path, f"the archive has no regular file {folder}/{member}", _cifar_refetch(name))
                out.append((where, handle.read()))
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        problem = "truncated archive" if isinstance(err, EOFError) else f"not a readable tar archive ({err})"
        raise _corrupt(path, problem.replace("\n", " "), _cifar_refetch(name)) from err
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
    label_keys = ("labels",) if name == "cifar10" else ("fine_labels", "coarse_labels")
    datas, labels = [], {key: [] for key in label_keys}
    for where, buffer in _cifar_buffers(name, path, _CIFAR_MEMBERS[name][split]):
        batch = _unpickle(buffer, where, name)
        missing = [key for key in ("data", *label_keys) if key not in batch]
        if missing:
            raise _corrupt(where, f"the CIFAR batch has no {', '.join(missing)} entry", _cifar_refetch(name))
        try:
            data = np.asarray(batch["data"], dtype=np.uint8)
            batch_labels = {key: np.asarray(batch[key], dtype=np.int64) for key in label_keys}
        except (ValueError, TypeError, OverflowError) as err:
            raise _corrupt(where, f"the CIFAR batch holds unreadable arrays ({err})", _cifar_refetch(name)) from err
        if data.ndim != 2 or data.shape[1] != 3072 or any(v.shape != (data.shape[0],) for v in batch_labels.values()):
            shapes = ", ".join(f"{key} {v.shape}" for key, v in batch_labels.items())
            raise _corrupt(
                where, f"data has shape {data.shape} and {shapes}; expected [M, 3072] and [M]", _cifar_refetch(name)
            )
        datas.append(data)
        for key in label_keys:
            labels[key].append(batch_labels[key])
    images = np.concatenate(datas).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    label_arrays = [np.concatenate(labels[key]) for key in label_keys]
    return RawSplit(np.ascontiguousarray(images), *label_arrays)


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
