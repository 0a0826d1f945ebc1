"""Datasets as host NumPy arrays: the embedded ``digits`` set, a synthetic task, and tfds loaders.

:func:`load_dataset` is the single entry point. It returns a :class:`Dataset`
whose ``source`` field says exactly which data was used and where it came
from; the library never prints it (the CLI does).

Lookup order for ``mnist``/``fashion_mnist``/``cifar10``/``cifar100``:

1. already prepared by our tfds builder in ``data_dir`` -> read with
   ``tfds.data_source`` (no TensorFlow needed);
2. raw files found in ``raw_dir``, ``data_dir``, ``data_dir/downloads/manual``
   (and, for Fashion-MNIST, ``/usr/share/datasets/fashion-mnist``, where the
   Debian package ``dataset-fashion-mnist`` installs them) -> prepared into
   ``data_dir`` first, then read;
3. ``download=True`` and TensorFlow installed -> tfds's own builder with
   ``tfds.load(name, download=True)`` (needs internet);
4. otherwise :class:`DatasetNotFoundError` saying which files to put where.

A raw or prepared file that exists but is truncated or corrupt raises
:class:`~jaxgossip.data.raw.CorruptDataError` (a ``ValueError``) naming the
file, the problem and the fix, never a bare traceback from gzip, tarfile,
pickle or tfds.

``auto`` picks Fashion-MNIST when step 1 or 2 succeeds and the embedded
``digits`` set otherwise, so it always works offline.

Only the four tfds data sets need tensorflow-datasets, imported when one of them is loaded; without
it they raise :class:`~jaxgossip.data.raw.MissingPackageError` naming ``pip install
tensorflow-datasets``, and ``auto`` takes ``digits``.
"""

from __future__ import annotations

import importlib.util
import os
import zipfile
import zlib

import numpy as np

from jaxgossip.data import builders, raw, text
from jaxgossip.data.base import Dataset

#: Names accepted by :func:`load_dataset`.
DATASET_NAMES = ("auto", "digits", "synthetic", "mnist", "fashion_mnist", "cifar10", "cifar100", "python_docs")

_NUM_CLASSES = {"mnist": 10, "fashion_mnist": 10, "cifar10": 10, "cifar100": 100}


def standardize(x_train: np.ndarray, x_test: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Scales to [0, 1] by ``scale``, then standardizes per channel with train statistics.

    Args:
        x_train: [M, H, W, C] raw pixel values.
        x_test: [M_test, H, W, C].
        scale: maximum raw pixel value (255 for uint8 images, 16 for digits).

    Returns:
        float32 ``(x_train, x_test)``, each channel of ``x_train`` with mean 0
        and standard deviation 1.
    """
    x_train = np.asarray(x_train, np.float32) / np.float32(scale)
    x_test = np.asarray(x_test, np.float32) / np.float32(scale)
    mean = x_train.mean(axis=(0, 1, 2), dtype=np.float64).astype(np.float32)
    std = x_train.std(axis=(0, 1, 2), dtype=np.float64).astype(np.float32)
    std = np.where(std > 0, std, np.float32(1))
    return (x_train - mean) / std, (x_test - mean) / std


def load_digits(*, seed: int = 0, test_fraction: float = 0.2, normalize: bool = True) -> Dataset:
    """scikit-learn's bundled ``digits``: 1,797 8x8 grey images of 10 digits, no download.

    A stratified, seeded split (``sklearn.model_selection.train_test_split``);
    with the default ``test_fraction=0.2``: 1,437 train and 360 test images.

    Args:
        seed: seed of the split.
        test_fraction: fraction of images held out, in (0, 1).
        normalize: scale pixel values 0..16 to [0, 1] and standardize with
            the train mean and standard deviation; otherwise raw values as
            float32.

    Returns:
        Dataset with x [M, 8, 8, 1] float32, 10 classes.

    References:
        E. Alpaydin, C. Kaynak. Optical recognition of handwritten digits.
        UCI Machine Learning Repository, 1998.
    """
    from sklearn.datasets import load_digits as _sk_load_digits
    from sklearn.model_selection import train_test_split

    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    bunch = _sk_load_digits()
    images = bunch.images.astype(np.float32)[..., None]
    labels = bunch.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=test_fraction, stratify=labels, random_state=seed
    )
    if normalize:
        x_train, x_test = standardize(x_train, x_test, 16.0)
    source = (
        f"digits: scikit-learn bundled load_digits ({images.shape[0]} 8x8 images, 10 classes), "
        f"stratified split seed={seed} -> {len(y_train)} train / {len(y_test)} test"
        + (", standardized" if normalize else "")
    )
    return Dataset(x_train, y_train, x_test, y_test, 10, "digits", source)


def make_synthetic(
    *,
    num_train: int = 1024,
    num_test: int = 256,
    num_classes: int = 10,
    shape: tuple[int, ...] = (8, 8, 1),
    noise: float = 0.5,
    seed: int = 0,
) -> Dataset:
    """A seeded Gaussian-blob task that is linearly separable by construction.

    Class means ``mu_c ~ N(0, I_D)`` (D = prod(shape)); a sample of class c is
    ``mu_c + e`` with ``e ~ N(0, noise^2 I_D)`` whose norm is clipped to
    ``0.45 * min_{c != c'} ||mu_c - mu_c'||``. Hence the nearest-mean rule,
    a linear classifier, is exactly right on every sample, and small models
    reach 100 % accuracy quickly. Labels are balanced (``i mod C``, shuffled).

    Args:
        num_train: training samples M.
        num_test: test samples.
        num_classes: classes C (>= 2).
        shape: per-sample shape (H, W, C).
        noise: per-coordinate standard deviation before clipping.
        seed: NumPy seed.

    Returns:
        Dataset with float32 x [M, *shape] and int32 labels.
    """
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    if num_train < 1 or num_test < 1:
        raise ValueError(f"num_train and num_test must be >= 1, got {num_train}, {num_test}")
    rng = np.random.default_rng(seed)
    dim = int(np.prod(shape))
    means = rng.normal(size=(num_classes, dim))
    gaps = np.linalg.norm(means[:, None] - means[None], axis=-1)
    radius = 0.45 * gaps[~np.eye(num_classes, dtype=bool)].min()

    def draw(count):
        y = rng.permutation(np.arange(count) % num_classes).astype(np.int32)
        e = rng.normal(scale=noise, size=(count, dim))
        norms = np.linalg.norm(e, axis=1, keepdims=True)
        e *= np.minimum(1.0, radius / np.maximum(norms, 1e-12))
        return (means[y] + e).astype(np.float32).reshape((count, *shape)), y

    x_train, y_train = draw(num_train)
    x_test, y_test = draw(num_test)
    source = (
        f"synthetic: {num_classes} Gaussian blobs in {dim} dims (noise={noise}, clipped so the classes are "
        f"linearly separable), seed={seed}, {num_train} train / {num_test} test"
    )
    return Dataset(x_train, y_train, x_test, y_test, num_classes, "synthetic", source)


def from_arrays(
    x_train,
    y_train,
    x_test,
    y_test,
    *,
    num_classes: int | None = None,
    name: str = "arrays",
    source: str | None = None,
) -> Dataset:
    """Wraps user arrays as a :class:`Dataset`, so partitioners, sweeps and the trainer take them.

    Inputs are used as given (cast to float32; no normalization). Labels are class indices.

    Args:
        x_train: [M, ...] numeric inputs (e.g. [M, H, W, C] images or [M, D] features), finite.
        y_train: [M] integer labels in [0, num_classes).
        x_test: [M_test, ...] with the same per-sample shape as ``x_train``.
        y_test: [M_test] integer labels.
        num_classes: C; default ``max(label) + 1`` over both splits.
        name: the dataset's name; source: its one-line description (default: the shapes).

    Returns:
        Dataset with float32 x and int32 y.

    Raises:
        ValueError: mismatched lengths or sample shapes, non-integer or out-of-range labels,
            NaN or inf inputs, an empty split.
    """
    xs = {"x_train": np.asarray(x_train), "x_test": np.asarray(x_test)}
    ys = {"y_train": np.asarray(y_train), "y_test": np.asarray(y_test)}
    for (xn, x), (yn, y) in zip(xs.items(), ys.items()):
        if x.ndim < 2:
            raise ValueError(f"{xn} has shape {x.shape}; it needs a sample axis and features, [M, ...]")
        if y.ndim != 1 or y.shape[0] != x.shape[0]:
            raise ValueError(f"{yn} has shape {y.shape}; it needs one label per sample of {xn}, shape ({x.shape[0]},)")
        if x.shape[0] == 0:
            raise ValueError(f"{xn} is empty")
        if not (np.issubdtype(x.dtype, np.number) or x.dtype == bool):
            raise ValueError(f"{xn} has dtype {x.dtype}; it needs numbers")
        if not np.all(np.isfinite(x)):
            raise ValueError(f"{xn} contains NaN or inf")
        if not np.issubdtype(y.dtype, np.integer):
            if not (np.issubdtype(y.dtype, np.floating) and np.all(np.isfinite(y)) and np.all(y == np.round(y))):
                raise ValueError(f"{yn} has dtype {y.dtype}; labels must be integer class indices")
    if xs["x_train"].shape[1:] != xs["x_test"].shape[1:]:
        raise ValueError(
            f"x_train samples have shape {xs['x_train'].shape[1:]} but x_test samples {xs['x_test'].shape[1:]}"
        )
    labels = np.concatenate([ys["y_train"], ys["y_test"]]).astype(np.int64)
    if num_classes is None and labels.min() < 0:  # before C is read off the labels (all -1: C = 0)
        raise ValueError(f"labels must be class indices 0..C-1; found {labels.min()} (negative)")
    if num_classes is None:
        num_classes = int(labels.max()) + 1
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
        raise ValueError(f"num_classes={num_classes!r} must be an int >= 2")
    if labels.min() < 0 or labels.max() >= num_classes:
        raise ValueError(f"labels must be in [0, {num_classes}); found {labels.min()}..{labels.max()}")
    x_tr, x_te = (xs[k].astype(np.float32) for k in ("x_train", "x_test"))
    y_tr, y_te = (ys[k].astype(np.int32) for k in ("y_train", "y_test"))
    if source is None:
        source = (
            f"{name}: user arrays, {len(y_tr)} train / {len(y_te)} test samples of shape {x_tr.shape[1:]}, "
            f"{num_classes} classes"
        )
    return Dataset(x_tr, y_tr, x_te, y_te, int(num_classes), name, source)


#: Prefix of a dataset spec that names a ``.npz`` file (see :func:`load_npz`).
NPZ_PREFIX = "npz:"
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


def load_npz(path: str | os.PathLike) -> Dataset:
    """Reads a ``.npz`` file with arrays ``x_train``, ``y_train``, ``x_test``, ``y_test`` (and
    optionally a scalar ``num_classes``) through :func:`from_arrays`.

    Raises:
        DatasetNotFoundError: no such file. ValueError: missing keys or invalid arrays (naming
            the file).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise raw.DatasetNotFoundError(f"dataset file {path!r} does not exist (dataset=npz:PATH needs a .npz file)")
    fix = "write it with numpy.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)"
    # Anything but a zip archive (a truncated copy, a .npy, random bytes) is refused before numpy
    # reads it: numpy would take it for a pickle and advise allow_pickle=True.
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"dataset file {path!r} is not a .npz archive (it is not a complete zip file: truncated, or "
            f"another format); {fix}"
        )
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except ValueError as err:  # an object (pickled) array, refused: loading it could run code
        raise ValueError(
            f"dataset file {path!r} is not a readable .npz file: {err}; {fix} from numeric arrays"
        ) from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        raise ValueError(f"dataset file {path!r} is a damaged .npz archive ({err}); {fix}") from None
    missing = [k for k in NPZ_KEYS if k not in arrays]
    if missing:
        raise ValueError(
            f"dataset file {path!r} lacks the arrays {missing}; it has {sorted(arrays)} and needs {list(NPZ_KEYS)}"
        )
    num_classes = int(arrays["num_classes"]) if "num_classes" in arrays else None
    try:
        ds = from_arrays(*(arrays[k] for k in NPZ_KEYS), num_classes=num_classes, name="npz")
    except ValueError as err:
        raise ValueError(f"dataset file {path!r}: {err}") from None
    return ds._replace(source=f"npz: {path} ({ds.source.partition(': ')[2]})")


def _data_root(builder) -> str:
    # builder.data_dir is <root>/<builder name>/<version>.
    return os.path.dirname(os.path.dirname(os.fspath(builder.data_dir)))


def _from_raw_splits(name, splits, normalize, source) -> Dataset:
    train, test = splits["train"], splits["test"]
    if normalize:
        x_train, x_test = standardize(train.images, test.images, 255.0)
    else:
        x_train, x_test = train.images.astype(np.float32), test.images.astype(np.float32)
    return Dataset(
        x_train,
        train.labels.astype(np.int32),
        x_test,
        test.labels.astype(np.int32),
        _NUM_CLASSES[name],
        name,
        source + (", standardized" if normalize else ""),
    )


def _tfds_download(name: str, data_dir, normalize: bool) -> Dataset:
    if importlib.util.find_spec("tensorflow") is None:
        raise raw.DatasetNotFoundError(
            f"{name}: no local files were found, and download=True uses tfds's own '{name}' builder, which "
            "needs TensorFlow. To fix: pip install 'jaxgossip[tf]' (and have internet), or provide the raw "
            "files offline and set the config field raw_dir to their folder (--raw_dir=DIR; "
            "load_dataset(name, data_dir, raw_dir=DIR)); the error without download=True lists the files"
        )
    import tensorflow_datasets as tfds

    train, test = tfds.as_numpy(
        tfds.load(name, split=["train", "test"], data_dir=data_dir, batch_size=-1, as_supervised=True, download=True)
    )
    splits = {
        "train": raw.RawSplit(np.asarray(train[0], np.uint8), np.asarray(train[1], np.int64)),
        "test": raw.RawSplit(np.asarray(test[0], np.uint8), np.asarray(test[1], np.int64)),
    }
    source = f"{name}: tfds built-in '{name}' (downloaded by tfds.load, data_dir={data_dir or 'tfds default'})"
    return _from_raw_splits(name, splits, normalize, source)


def _load_tfds(name, data_dir, raw_dir, download, normalize) -> Dataset:
    builder = builders.get_builder(name, data_dir)
    where = os.fspath(builder.data_dir)
    if builders.is_prepared(name, data_dir):
        how = f"read with tfds.data_source from ArrayRecord prepared at {where}"
    else:
        dirs = raw.candidate_dirs(name, raw_dir, _data_root(builder))
        found = builders.find_raw(name, dirs)
        if found is None:
            if download:
                return _tfds_download(name, data_dir, normalize)
            raise raw.DatasetNotFoundError(
                f"{name} is not prepared in {where} and no raw files were found in {dirs}. "
                f"To fix: {builder.MANUAL_DOWNLOAD_INSTRUCTIONS}"
            )
        builders.prepare(name, found, data_dir)
        how = f"prepared from raw files in {found} into ArrayRecord at {where}, read with tfds.data_source"
    splits = builders.read_prepared(name, data_dir)
    source = (
        f"{name}: tfds builder '{builders.BUILDER_NAMES[name]}' {how}; "
        f"{len(splits['train'].labels)} train / {len(splits['test'].labels)} test"
    )
    return _from_raw_splits(name, splits, normalize, source)


def fashion_mnist_available(data_dir=None, raw_dir=None) -> bool:
    """Whether ``load_dataset("fashion_mnist", data_dir, raw_dir=raw_dir)`` works offline.

    True when tensorflow-datasets is installed and Fashion-MNIST is prepared in ``data_dir`` or its
    raw IDX files are found in the folders :func:`load_dataset` searches.
    """
    if not builders.tfds_installed():
        return False
    builder = builders.get_builder("fashion_mnist", data_dir)
    if builders.is_prepared("fashion_mnist", data_dir):
        return True
    dirs = raw.candidate_dirs("fashion_mnist", raw_dir, _data_root(builder))
    return builders.find_raw("fashion_mnist", dirs) is not None


def load_dataset(
    name: str,
    data_dir: str | os.PathLike | None = None,
    *,
    raw_dir: str | os.PathLike | None = None,
    seed: int = 0,
    normalize: bool = True,
    download: bool = False,
    context: int = 64,
) -> Dataset:
    """Loads a dataset by name as host NumPy arrays.

    Args:
        name: one of ``DATASET_NAMES``: "digits" (embedded, offline),
            "synthetic" (seeded blobs, see :func:`make_synthetic`), "mnist",
            "fashion_mnist", "cifar10", "cifar100", or "auto" (Fashion-MNIST if
            prepared or its raw files are found, else digits); or ``npz:PATH``, a
            ``.npz`` file of user arrays (:func:`load_npz`); or a next-token text data set,
            "python_docs" (embedded) or ``text:PATH`` (:func:`jaxgossip.data.load_text`).
        data_dir: tfds data folder where prepared datasets live and are written
            (None: tfds's default, ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``).
            Raw files placed directly in it or in ``data_dir/downloads/manual``
            are found too.
        raw_dir: folder with the raw files (IDX files or CIFAR python archive).
        seed: seed of the digits split and of the synthetic task (tfds datasets
            have fixed train/test splits).
        normalize: scale to [0, 1] then standardize per channel with the train
            mean/std (so zero-padding in :func:`augment_cifar` pads with the
            mean colour); otherwise raw pixel values as float32.
        download: only if nothing is found locally: fall back to tfds's
            built-in builder with ``tfds.load(name, download=True)``, which
            needs TensorFlow and internet.
        context: T, tokens per example of a text data set (ignored otherwise).

    Returns:
        Dataset; ``dataset.source`` says which data was used and from where.

    Raises:
        ValueError: unknown name (the message lists the known ones).
        DatasetNotFoundError: files missing (the message says which files to
            put where, naming the config fields ``data_dir``, ``raw_dir`` and
            ``download``). It is both a FileNotFoundError and a ValueError.
        CorruptDataError: a raw or prepared file is truncated or corrupt (a
            ValueError; the message names the file, the problem and the fix).
        MissingPackageError: a tfds data set without tensorflow-datasets
            installed (a ModuleNotFoundError and a ValueError; the message
            names ``pip install tensorflow-datasets``).
    """
    if isinstance(name, str) and name.startswith(NPZ_PREFIX):
        return load_npz(name[len(NPZ_PREFIX) :])
    if text.is_text_dataset(name):
        return text.load_text(name, context, seed=seed)
    if name not in DATASET_NAMES:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASET_NAMES)}, npz:PATH")
    if name == "digits":
        return load_digits(seed=seed, normalize=normalize)
    if name == "synthetic":
        return make_synthetic(seed=seed)
    if name == "auto":
        if fashion_mnist_available(data_dir, raw_dir):
            ds = _load_tfds("fashion_mnist", data_dir, raw_dir, False, normalize)
            return ds._replace(source="auto -> " + ds.source)
        ds = load_digits(seed=seed, normalize=normalize)
        if not builders.tfds_installed():
            return ds._replace(
                source=f"auto -> {ds.source} (tensorflow-datasets is not installed, so Fashion-MNIST is not "
                f"looked for: {builders.TFDS_INSTALL})"
            )
        where = os.fspath(builders.get_builder("fashion_mnist", data_dir).data_dir)
        dirs = raw.candidate_dirs("fashion_mnist", raw_dir, os.path.dirname(os.path.dirname(where)))
        return ds._replace(
            source=f"auto -> {ds.source} (Fashion-MNIST is not prepared in {where} and no raw IDX files in {dirs})"
        )
    return _load_tfds(name, data_dir, raw_dir, download, normalize)
