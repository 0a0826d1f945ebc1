"""Tests for jaxgossip.data: datasets, tfds builders, partitioners, shards sampler, augmentation."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import os
import pathlib
import pickle
import sys
import tarfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds
from _reference import assert_refused, call_cli, one_line_error
from tiny import TINY_FLAGS

from jaxgossip import data
from jaxgossip.cli import main
from jaxgossip.data import builders, datasets, raw

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------------------------
# helpers: write raw files the way the originals are laid out
# ----------------------------------------------------------------------------------------------


def write_idx(path, array, compress=False):
    array = np.asarray(array, dtype=np.uint8)
    buffer = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, ">u4").tobytes() + array.tobytes()
    pathlib.Path(path).write_bytes(gzip.compress(buffer) if compress else buffer)


def make_idx_dir(directory, num_train=40, num_test=20, seed=0):
    """Fake MNIST-style folder: images gzipped, labels plain (both spellings are accepted)."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out = {}
    for prefix, count in (("train", num_train), ("t10k", num_test)):
        images = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        labels = (np.arange(count) % 10).astype(np.uint8)
        write_idx(directory / f"{prefix}-images-idx3-ubyte.gz", images, compress=True)
        write_idx(directory / f"{prefix}-labels-idx1-ubyte", labels)
        out["train" if prefix == "train" else "test"] = (images, labels)
    return out


def fingerprint(images, labels):
    """Order-free multiset of (label, image hash): tfds shuffles examples when writing."""
    return sorted(
        (int(l), hashlib.sha1(np.ascontiguousarray(im).tobytes()).hexdigest()) for im, l in zip(images, labels)
    )


def _cifar_batch(rng, count, fine_classes=None):
    images = rng.integers(0, 256, (count, 32, 32, 3), dtype=np.uint8)
    flat = images.transpose(0, 3, 1, 2).reshape(count, 3072)  # channel-major rows, as in the originals
    if fine_classes is None:
        batch = {b"data": flat, b"labels": [int(i % 10) for i in range(count)]}
    else:
        batch = {
            b"data": flat,
            b"fine_labels": [int(i % fine_classes) for i in range(count)],
            b"coarse_labels": [int(i % 20) for i in range(count)],
        }
    return images, batch


def make_cifar10_tarball(directory, per_batch=3, seed=0):
    rng = np.random.default_rng(seed)
    path = pathlib.Path(directory) / "cifar-10-python.tar.gz"
    train = []
    with tarfile.open(path, "w:gz") as tar:
        for member in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            images, batch = _cifar_batch(rng, per_batch)
            payload = pickle.dumps(batch, protocol=2)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{member}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
            if member != "test_batch":
                train.append((images, np.asarray(batch[b"labels"])))
    return np.concatenate([t[0] for t in train]), np.concatenate([t[1] for t in train])


# ----------------------------------------------------------------------------------------------
# embedded and synthetic datasets, load_dataset
# ----------------------------------------------------------------------------------------------


def test_digits_loader_shapes_classes_and_split():
    ds = data.load_dataset("digits")
    assert ds.name == "digits" and ds.num_classes == 10
    assert ds.x_train.shape == (1437, 8, 8, 1) and ds.x_test.shape == (360, 8, 8, 1)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
    assert ds.y_train.shape == (1437,) and ds.y_test.shape == (360,)
    assert set(np.unique(ds.y_train)) == set(range(10)) == set(np.unique(ds.y_test))
    # stratified: every class is ~20 % held out
    frac = np.bincount(ds.y_test, minlength=10) / (
        np.bincount(ds.y_test, minlength=10) + np.bincount(ds.y_train, minlength=10)
    )
    np.testing.assert_allclose(frac, 0.2, atol=0.02)
    # standardized with train statistics
    assert abs(float(ds.x_train.mean())) < 1e-4 and abs(float(ds.x_train.std()) - 1) < 1e-3
    assert "scikit-learn" in ds.source and "1437 train / 360 test" in ds.source
    # seeded split
    same, other = data.load_digits(seed=0), data.load_digits(seed=1)
    np.testing.assert_array_equal(ds.y_train, same.y_train)
    assert not np.array_equal(ds.y_train, other.y_train)
    raw_ds = data.load_digits(normalize=False)
    assert raw_ds.x_train.min() == 0 and raw_ds.x_train.max() == 16


def test_synthetic_is_seeded_and_linearly_separable():
    ds = data.load_dataset("synthetic", seed=3)
    assert ds.x_train.shape == (1024, 8, 8, 1) and ds.num_classes == 10 and "synthetic" in ds.source
    np.testing.assert_array_equal(ds.x_train, data.make_synthetic(seed=3).x_train)
    assert not np.array_equal(ds.x_train, data.make_synthetic(seed=4).x_train)
    # a linear classifier (nearest class centroid) is exact
    x = ds.x_train.reshape(len(ds.y_train), -1)
    centroids = np.stack([x[ds.y_train == c].mean(0) for c in range(10)])
    for xs, ys in ((ds.x_train, ds.y_train), (ds.x_test, ds.y_test)):
        xs = xs.reshape(len(ys), -1)
        pred = np.argmin(((xs[:, None] - centroids[None]) ** 2).sum(-1), axis=1)
        assert (pred == ys).all()


def test_load_dataset_unknown_name_lists_known():
    with pytest.raises(ValueError, match=r"unknown dataset 'imagenet'.*digits.*fashion_mnist.*cifar100"):
        data.load_dataset("imagenet")


def test_auto_falls_back_to_digits(tmp_path, monkeypatch):
    monkeypatch.setattr(raw, "DEBIAN_FASHION_MNIST_DIR", str(tmp_path / "no-debian-package"))
    ds = data.load_dataset("auto", data_dir=tmp_path / "tfds")
    assert ds.name == "digits"
    assert ds.source.startswith("auto -> digits") and "Fashion-MNIST is not prepared" in ds.source


def test_missing_raw_files_error_says_what_to_put_where(tmp_path, monkeypatch):
    monkeypatch.setattr(raw, "DEBIAN_FASHION_MNIST_DIR", str(tmp_path / "no-debian-package"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(data.DatasetNotFoundError, match=r"train-images-idx3-ubyte\[\.gz\].*dataset-fashion-mnist") as info:
        data.load_dataset("fashion_mnist", data_dir=tmp_path / "tfds", raw_dir=empty)
    # names the config fields a CLI user can set (not only Python arguments)
    message = str(info.value)
    for field in ("config field raw_dir", "--raw_dir=DIR", "config field data_dir", "config field download"):
        assert field in message, field
    assert "pass it as raw_dir" not in message
    with pytest.raises(ValueError, match=r"cifar-10-python\.tar\.gz"):  # also a ValueError
        data.load_dataset("cifar10", data_dir=tmp_path / "tfds", raw_dir=empty)
    with pytest.raises(FileNotFoundError, match="no raw mnist files"):
        data.prepare("mnist", empty, tmp_path / "tfds")


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is not None, reason="TensorFlow is installed")
def test_download_without_tensorflow_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="needs TensorFlow"):
        data.load_dataset("mnist", data_dir=tmp_path, raw_dir=tmp_path, download=True)


@pytest.fixture
def without_tfds(monkeypatch):
    """tensorflow-datasets made unimportable, as on an image without it (``import`` raises
    ModuleNotFoundError, ``find_spec`` finds nothing), also where this process imported it already."""
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    assert not data.tfds_installed()


def test_embedded_datasets_load_without_tfds(without_tfds, tmp_path, monkeypatch):
    assert data.load_dataset("digits").name == "digits"
    assert data.load_dataset("synthetic").name == "synthetic"
    assert data.load_dataset("python_docs", context=16).name == "python_docs"
    # auto does not look for Fashion-MNIST (raw files found would be of no use) and says why.
    monkeypatch.setattr(raw, "DEBIAN_FASHION_MNIST_DIR", str(tmp_path / "no-debian-package"))
    auto = data.load_dataset("auto", data_dir=tmp_path / "tfds")
    assert auto.name == "digits" and "tensorflow-datasets is not installed" in auto.source
    assert not data.fashion_mnist_available(tmp_path / "tfds", raw_dir=tmp_path)


def test_tfds_dataset_without_tfds_names_the_install(without_tfds, tmp_path):
    make_idx_dir(tmp_path / "raw")  # raw files present: only the package is missing
    with pytest.raises(data.MissingPackageError, match=r"'mnist'.*pip install tensorflow-datasets") as info:
        data.load_dataset("mnist", data_dir=tmp_path / "tfds", raw_dir=tmp_path / "raw")
    # an ImportError for code that guards imports, a ValueError for the CLI's bad-input exit
    assert isinstance(info.value, ModuleNotFoundError) and isinstance(info.value, ValueError)
    assert info.value.name == "tensorflow_datasets" and "digits" in str(info.value)
    for call in (
        lambda: data.prepare("cifar10", tmp_path / "raw", tmp_path / "tfds"),
        lambda: data.read_prepared("cifar100", tmp_path / "tfds"),
        lambda: data.is_prepared("fashion_mnist", tmp_path / "tfds"),
        lambda: data.JaxgossipMnist,
    ):
        with pytest.raises(data.MissingPackageError, match="pip install tensorflow-datasets"):
            call()
    assert not (tmp_path / "tfds").exists()
    with pytest.raises(ValueError, match="no tfds builder for dataset 'svhn'"):  # names are checked first
        data.get_builder("svhn")


def test_cli_tfds_dataset_without_tfds_is_bad_input(without_tfds, tmp_path, capsys):
    from jaxgossip.cli import main

    status = main(["train", "--dataset=cifar10", f"--data_dir={tmp_path}", f"--out={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert status == 2 and "pip install tensorflow-datasets" in err and "internal error" not in err, err


def test_idx_parser_rejects_garbage(tmp_path):
    path = tmp_path / "bad"
    path.write_bytes(b"\x01\x02\x03\x04garbage")
    with pytest.raises(ValueError, match="not an IDX file"):
        data.read_idx(path)
    write_idx(path, np.zeros((3, 2, 2), np.uint8))
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ValueError, match="size mismatch"):
        data.read_idx(path)


# ----------------------------------------------------------------------------------------------
# tfds builders
# ----------------------------------------------------------------------------------------------


def test_builders_are_registered_under_their_own_names():
    classes = [data.JaxgossipMnist, data.JaxgossipFashionMnist, data.JaxgossipCifar10, data.JaxgossipCifar100]
    for (name, builder_name), cls in zip(data.BUILDER_NAMES.items(), classes):
        assert builder_name != name and tfds.builder_cls(builder_name) is cls


def test_tfds_mock_data_with_our_builder(tmp_path):
    data.builder_classes()  # registers the builders with tfds (done by the first builder function)
    with tfds.testing.mock_data(num_examples=7, max_value=9, policy=tfds.testing.MockPolicy.USE_CODE):
        source = tfds.data_source("jaxgossip_cifar10", split="train", data_dir=tmp_path)
        assert len(source) == 7 and source[0]["image"].shape == (32, 32, 3)
        splits = data.read_prepared("fashion_mnist", tmp_path)
    assert splits["train"].images.shape == (7, 28, 28, 1) and splits["train"].images.dtype == np.uint8
    assert splits["test"].labels.shape == (7,) and splits["test"].labels.max() <= 9


def test_offline_manual_dir_idx_prepare_and_read(tmp_path, capsys):
    raw_dir = tmp_path / "raw"
    truth = make_idx_dir(raw_dir)
    data_dir = tmp_path / "tfds"
    assert not data.is_prepared("mnist", data_dir)
    ds = data.load_dataset("mnist", data_dir, raw_dir=raw_dir, normalize=False)
    assert data.is_prepared("mnist", data_dir)
    assert f"prepared from raw files in {raw_dir}" in ds.source and "jaxgossip_mnist" in ds.source
    assert ds.x_train.shape == (40, 28, 28, 1) and ds.x_test.shape == (20, 28, 28, 1) and ds.num_classes == 10
    for x, y, split in ((ds.x_train, ds.y_train, "train"), (ds.x_test, ds.y_test, "test")):
        assert fingerprint(x[..., 0].astype(np.uint8), y) == fingerprint(*truth[split])
    # second call reads the ArrayRecord files; tfds's own API sees them too (no TensorFlow involved)
    again = data.load_dataset("mnist", data_dir, normalize=False)
    assert "read with tfds.data_source" in again.source
    source = tfds.data_source("jaxgossip_mnist", split="test", data_dir=data_dir, download=False)
    assert len(source) == 20
    assert list((data_dir / "jaxgossip_mnist" / "1.0.0").glob("*.array_record*"))
    assert capsys.readouterr().out == ""  # tfds's "Downloading and preparing" banner is silenced


def test_offline_cifar10_tarball_and_cifar100_folder(tmp_path):
    raw10 = tmp_path / "raw10"
    raw10.mkdir()
    train_images, train_labels = make_cifar10_tarball(raw10)
    ds = data.load_dataset("cifar10", tmp_path / "tfds", raw_dir=raw10, normalize=False)
    assert ds.x_train.shape == (15, 32, 32, 3) and ds.x_test.shape == (3, 32, 32, 3)
    assert fingerprint(ds.x_train.astype(np.uint8), ds.y_train) == fingerprint(train_images, train_labels)

    folder = tmp_path / "raw100" / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    images, batch = _cifar_batch(rng, 6, fine_classes=100)
    (folder / "train").write_bytes(pickle.dumps(batch, protocol=2))
    (folder / "test").write_bytes(pickle.dumps(_cifar_batch(rng, 2, fine_classes=100)[1], protocol=2))
    ds100 = data.load_dataset("cifar100", tmp_path / "tfds", raw_dir=folder.parent, normalize=False)
    assert ds100.num_classes == 100 and ds100.x_train.shape == (6, 32, 32, 3)
    assert fingerprint(ds100.x_train.astype(np.uint8), ds100.y_train) == fingerprint(images, batch[b"fine_labels"])
    splits = data.read_prepared("cifar100", tmp_path / "tfds")
    assert sorted(splits["train"].coarse_labels) == sorted(batch[b"coarse_labels"])


def test_cifar_reader_refuses_non_numpy_pickles(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": os.getcwd}))
    with pytest.raises(ValueError, match=r"test_batch: refusing .*could run code.*delete it"):
        raw.read_cifar_split("cifar10", str(folder), "test")


# ----------------------------------------------------------------------------------------------
# corrupt raw files: a ValueError naming the file, the problem and the fix (never a download)
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def no_download(monkeypatch):
    """Fails the test if anything tries tfds's downloading path or the Debian folder."""

    def refuse(*args, **kwargs):
        raise AssertionError("a download was attempted")

    monkeypatch.setattr(tfds, "load", refuse)
    monkeypatch.setattr(raw, "DEBIAN_FASHION_MNIST_DIR", "/nonexistent/no-debian-package")


def _truncate(path, keep=0.5):
    content = path.read_bytes()
    path.write_bytes(content[: int(len(content) * keep)])


def test_truncated_gz_idx_file_is_a_value_error_naming_it(tmp_path, no_download):
    raw_dir = tmp_path / "raw"
    make_idx_dir(raw_dir)
    bad = raw_dir / "train-images-idx3-ubyte.gz"
    _truncate(bad)
    pattern = rf"{bad}: truncated gzip stream.*delete it and download it again"
    with pytest.raises(ValueError, match=pattern) as info:
        data.load_dataset("mnist", tmp_path / "tfds", raw_dir=raw_dir, download=True)
    assert isinstance(info.value, raw.CorruptDataError)
    # nothing half-prepared is left behind: once the file is fixed, the same call works
    make_idx_dir(raw_dir)
    assert data.load_dataset("mnist", tmp_path / "tfds", raw_dir=raw_dir).x_train.shape == (40, 28, 28, 1)


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda b: b[:-1], "IDX size mismatch"),  # raw file cut short
        (lambda b: b"\x00\x00\x07\x03" + b[4:], "unknown data type code"),  # bad header
        (lambda b: gzip.compress(b)[:-8] + b"\xff" * 8, "corrupt gzip stream.*CRC check failed"),  # bad checksum
        (lambda b: b"", "not an IDX file"),  # empty file
    ],
)
def test_damaged_idx_files_name_the_file(tmp_path, damage, problem):
    path = tmp_path / "t10k-labels-idx1-ubyte"
    write_idx(path, np.arange(10, dtype=np.uint8))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=rf"{path}: .*{problem}.*To fix: delete it"):
        data.read_idx(path)


def test_gz_name_without_gzip_content(tmp_path):
    path = tmp_path / "train-labels-idx1-ubyte.gz"
    write_idx(path, np.arange(10, dtype=np.uint8))  # not compressed
    with pytest.raises(ValueError, match=rf"{path}: named \.gz but not gzip-compressed"):
        data.read_idx(path)


def test_mismatched_idx_pair_names_both_files(tmp_path):
    raw_dir = tmp_path / "raw"
    make_idx_dir(raw_dir)
    write_idx(raw_dir / "t10k-labels-idx1-ubyte", np.zeros(7, np.uint8))  # 20 images, 7 labels
    files = raw.find_idx_files(raw_dir)
    with pytest.raises(ValueError, match=r"t10k-images.*t10k-labels.*To fix: replace both"):
        raw.read_idx_split(files, "test")


def test_damaged_prepared_data_names_the_folder(tmp_path, no_download):
    raw_dir = tmp_path / "raw"
    make_idx_dir(raw_dir, num_train=10, num_test=10)
    data.load_dataset("mnist", tmp_path / "tfds", raw_dir=raw_dir)
    folder = tmp_path / "tfds" / "jaxgossip_mnist" / "1.0.0"
    info = (folder / "dataset_info.json").read_text()
    (folder / "dataset_info.json").write_text("{")
    with pytest.raises(ValueError, match=rf"{folder}: the prepared mnist data cannot be read.*delete the folder"):
        data.load_dataset("mnist", tmp_path / "tfds")
    (folder / "dataset_info.json").write_text(info)
    train = next(folder.glob("*-train.array_record*"))
    _truncate(train)
    with pytest.raises(ValueError, match=rf"{folder}: the prepared mnist data cannot be read.*delete the folder"):
        data.load_dataset("mnist", tmp_path / "tfds")


def test_corrupt_cifar_tarball_is_a_value_error_naming_it(tmp_path, no_download):
    raw_dir = tmp_path / "raw"
    raw_dir.mkdir()
    make_cifar10_tarball(raw_dir)
    tarball = raw_dir / "cifar-10-python.tar.gz"
    _truncate(tarball)
    with pytest.raises(ValueError, match=rf"{tarball}: truncated archive.*delete it and download"):
        data.load_dataset("cifar10", tmp_path / "tfds", raw_dir=raw_dir, download=True)
    tarball.write_bytes(b"this is not a tar archive" * 40)
    with pytest.raises(ValueError, match=rf"{tarball}: not a readable tar archive.*cs\.toronto\.edu"):
        data.load_dataset("cifar10", tmp_path / "tfds", raw_dir=raw_dir)


def test_cifar_tarball_with_a_missing_or_damaged_member(tmp_path):
    tarball = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:  # test_batch is a truncated pickle, data_batch_* absent
        payload = pickle.dumps(_cifar_batch(np.random.default_rng(0), 2)[1], protocol=2)[:100]
        info = tarfile.TarInfo("cifar-10-batches-py/test_batch")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    with pytest.raises(ValueError, match=rf"{tarball}: the archive has no regular file cifar-10-batches-py/data_batch_1"):
        raw.read_cifar_split("cifar10", str(tarball), "train")
    with pytest.raises(ValueError, match=r"member cifar-10-batches-py/test_batch\): not a readable pickle"):
        raw.read_cifar_split("cifar10", str(tarball), "test")


def test_damaged_cifar_folder_files(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    with pytest.raises(ValueError, match=rf"{folder / 'test'} is missing.*extract the archive again"):
        raw.read_cifar_split("cifar100", str(folder), "test")
    _, batch = _cifar_batch(np.random.default_rng(0), 4, fine_classes=100)
    del batch[b"coarse_labels"]
    (folder / "test").write_bytes(pickle.dumps(batch, protocol=2))
    with pytest.raises(ValueError, match=r"test: the CIFAR batch has no coarse_labels entry"):
        raw.read_cifar_split("cifar100", str(folder), "test")
    _, batch = _cifar_batch(np.random.default_rng(0), 4, fine_classes=100)
    batch[b"data"] = batch[b"data"][:, :100]
    (folder / "test").write_bytes(pickle.dumps(batch, protocol=2))
    with pytest.raises(ValueError, match=r"test: data has shape \(4, 100\).*expected \[M, 3072\]"):
        raw.read_cifar_split("cifar100", str(folder), "test")
    (folder / "test").write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(ValueError, match=r"holds a list, not a CIFAR batch dict"):
        raw.read_cifar_split("cifar100", str(folder), "test")


def _fashion_mnist_dir():
    candidates = [
        os.environ.get("JAXGOSSIP_FASHION_MNIST_DIR"),
        raw.DEBIAN_FASHION_MNIST_DIR,
        str(REPO_ROOT / ".cache" / "fashion-mnist" / "usr" / "share" / "datasets" / "fashion-mnist"),
    ]
    for candidate in candidates:
        if candidate and raw.find_idx_files(candidate) is not None:
            return candidate
    return None


@pytest.fixture(scope="module")
def fashion_mnist_raw_dir():
    raw_dir = _fashion_mnist_dir()
    if raw_dir is None:
        pytest.skip(
            "Fashion-MNIST raw IDX files not found in $JAXGOSSIP_FASHION_MNIST_DIR, "
            f"{raw.DEBIAN_FASHION_MNIST_DIR} or .cache/fashion-mnist (run .ci/fetch_fashion_mnist.sh .cache/fashion-mnist)"
        )
    return raw_dir


def test_real_fashion_mnist_slice_from_debian_package(fashion_mnist_raw_dir, tmp_path):
    """The first 5,000 images of each split (tfds max_examples_per_split), ~1 s; the full set is a slow test."""
    data.prepare("fashion_mnist", fashion_mnist_raw_dir, tmp_path, max_examples_per_split=5000)
    ds = data.load_dataset("fashion_mnist", tmp_path, normalize=False)
    assert ds.x_train.shape == (5000, 28, 28, 1) and ds.x_test.shape == (5000, 28, 28, 1) and ds.num_classes == 10
    assert "read with tfds.data_source" in ds.source
    truth = raw.read_idx_split(raw.find_idx_files(fashion_mnist_raw_dir), "test")
    assert truth.images.shape == (10000, 28, 28, 1)
    assert fingerprint(ds.x_test[..., 0].astype(np.uint8), ds.y_test) == fingerprint(
        truth.images[:5000, ..., 0], truth.labels[:5000]
    )
    assert data.fashion_mnist_available(tmp_path / "elsewhere", raw_dir=fashion_mnist_raw_dir)


@pytest.mark.slow
def test_real_fashion_mnist_full_from_debian_package(fashion_mnist_raw_dir, tmp_path):
    """All 70,000 images: prepare ~7 s, read ~3 s on an idle 2-core CPU."""
    start = time.perf_counter()
    data.prepare("fashion_mnist", fashion_mnist_raw_dir, tmp_path)
    assert time.perf_counter() - start < 120
    ds = data.load_dataset("auto", tmp_path)
    assert ds.name == "fashion_mnist" and ds.source.startswith("auto -> fashion_mnist")
    assert ds.x_train.shape == (60000, 28, 28, 1) and ds.x_test.shape == (10000, 28, 28, 1)
    np.testing.assert_array_equal(np.bincount(ds.y_train), np.full(10, 6000))
    np.testing.assert_array_equal(np.bincount(ds.y_test), np.full(10, 1000))
    assert abs(float(ds.x_train.mean())) < 1e-3 and abs(float(ds.x_train.std()) - 1) < 1e-3


def test_auto_picks_fashion_mnist_when_raw_files_exist(tmp_path, monkeypatch):
    fake = tmp_path / "debian" / "usr" / "share" / "datasets" / "fashion-mnist"
    make_idx_dir(fake, num_train=30, num_test=10)
    monkeypatch.setattr(raw, "DEBIAN_FASHION_MNIST_DIR", str(fake))  # as if the Debian package were installed
    ds = data.load_dataset("auto", tmp_path / "tfds")
    assert ds.name == "fashion_mnist" and ds.x_train.shape == (30, 28, 28, 1)
    assert ds.source.startswith("auto -> fashion_mnist") and f"raw files in {fake}" in ds.source
    again = data.load_dataset("auto", tmp_path / "tfds")  # now prepared: no raw files needed
    monkeypatch.setattr(raw, "DEBIAN_FASHION_MNIST_DIR", str(tmp_path / "gone"))
    assert data.load_dataset("auto", tmp_path / "tfds").name == "fashion_mnist"
    assert "read with tfds.data_source" in again.source


# ----------------------------------------------------------------------------------------------
# partitioners
# ----------------------------------------------------------------------------------------------

LABELS = np.random.default_rng(0).permutation(np.arange(10_000) % 10)
SCHEMES = ["iid", "dirichlet:0.1", "dirichlet:1000", "shards:2", "skew:0", "skew:0.8", "skew:1"]


def _fractions(parts, labels=LABELS, num_classes=10):
    hist = data.label_histograms(labels, parts, num_classes)
    return hist / hist.sum(1, keepdims=True)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_partition_disjoint_covering_and_seeded(scheme):
    parts = data.partition(LABELS, 8, scheme, seed=0)
    assert len(parts) == 8 and all(len(p) > 0 for p in parts)
    everything = np.concatenate(parts)
    assert everything.dtype == np.int64
    np.testing.assert_array_equal(np.sort(everything), np.arange(len(LABELS)))  # disjoint and covering
    again = data.partition(LABELS, 8, scheme, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = data.partition(LABELS, 8, scheme, seed=1)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other))


def test_label_histograms():
    parts = data.partition(LABELS, 4, "iid")
    hist = data.label_histograms(LABELS, parts, 10)
    assert hist.shape == (4, 10) and hist.sum() == len(LABELS)
    np.testing.assert_array_equal(hist.sum(0), np.bincount(LABELS))


def test_dirichlet_large_alpha_is_near_iid_and_small_alpha_is_skewed():
    near_iid = _fractions(data.partition(LABELS, 8, "dirichlet:1000"))
    assert np.abs(near_iid - 0.1).max() < 0.03
    skewed = _fractions(data.partition(LABELS, 8, "dirichlet:0.01"))
    assert skewed.max(1).mean() > 0.6
    mid = _fractions(data.partition(LABELS, 8, "dirichlet:1"))
    assert near_iid.max(1).mean() < mid.max(1).mean() < skewed.max(1).mean()


@pytest.mark.parametrize("num_nodes", [8, 23])
def test_dirichlet_groups_and_minimum_size(num_nodes):
    parts = data.dirichlet(LABELS, num_nodes, 0.05, seed=2)
    sizes = np.array([len(p) for p in parts])
    # each group of <= 10 workers: every worker holds >= 50 % of its group's mean
    for start in range(0, num_nodes, 10):
        group = sizes[start : start + 10]
        assert group.min() >= int(0.5 * group.sum() / len(group))


def test_dirichlet_gives_up_after_max_tries():
    one_class = np.zeros(100, np.int64)
    with pytest.raises(ValueError, match="max_tries=3"):
        data.dirichlet(one_class, 4, 0.001, max_tries=3)


def test_shards_sorted_by_label():
    labels = np.repeat(np.arange(10), 100)
    parts = data.partition(labels, 10, "shards:2", seed=0)
    assert [len(p) for p in parts] == [100] * 10
    assert all(len(np.unique(labels[p])) <= 2 for p in parts)


def test_skew_extremes():
    iid_like = _fractions(data.partition(LABELS, 8, "skew:0"))
    assert np.abs(iid_like - 0.1).max() < 0.05
    parts = data.partition(LABELS, 8, "skew:1")
    # label-sorted contiguous: node i's labels all <= node i+1's labels, sizes equal up to one
    for a, b in zip(parts, parts[1:]):
        assert LABELS[a].max() <= LABELS[b].min()
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    mid = _fractions(data.partition(LABELS, 8, "skew:0.8"))
    assert iid_like.max(1).mean() < mid.max(1).mean() < _fractions(parts).max(1).mean()


@pytest.mark.parametrize(
    "scheme, match",
    [
        ("dirichlet:0", "alpha must be a finite number > 0"),
        ("dirichlet:-1", "alpha must be a finite number > 0"),
        ("dirichlet:nan", "alpha must be a finite number > 0"),
        ("dirichlet", "needs a parameter"),
        ("skew:1.5", r"s must be in \[0, 1\]"),
        ("skew:-0.1", r"s must be in \[0, 1\]"),
        ("skew:abc", "must be a number"),
        ("shards:0", "per_node must be an int >= 1"),
        ("shards:1.5", "must be an integer"),
        ("iid:3", "takes no parameter"),
        ("random", r"unknown partition scheme 'random'.*'iid'.*'dirichlet:ALPHA'.*'shards:PER_NODE'.*'skew:S'"),
    ],
)
def test_partition_bad_scheme(scheme, match):
    with pytest.raises(ValueError, match=match):
        data.partition(LABELS, 8, scheme)


def test_partition_bad_sizes():
    with pytest.raises(ValueError, match="more than the number of samples"):
        data.partition(np.arange(5), 6, "iid")
    with pytest.raises(ValueError, match="num_nodes must be a positive int"):
        data.partition(LABELS, 0, "iid")
    with pytest.raises(ValueError, match="per_node \\* num_nodes = 12 shards but only M=10"):
        data.partition(np.arange(10) % 2, 4, "shards:3")
    # 2 sorted + 2 random indices over 4 nodes: nodes 2 and 3 get nothing
    with pytest.raises(ValueError, match="node 2 was left empty"):
        data.partition(np.array([0, 0, 1, 1]), 4, "skew:0.5")
    with pytest.raises(ValueError, match="labels must be a 1-D"):
        data.iid(np.zeros((4, 2), np.int64), 2)


# ----------------------------------------------------------------------------------------------
# on-device shards and sampler
# ----------------------------------------------------------------------------------------------

SENTINEL = -12345.0
# Shared jitted entry points, so tests reuse compilations (the CPU is small).
_sample = jax.jit(data.sample_batch, static_argnames=("batch_size", "replace"))
_augment = jax.jit(data.augment_cifar, static_argnames=("padding", "flip"))


def _uneven_shards():
    counts = [1, 2, 50, 7]
    parts, start = [], 0
    for c in counts:
        parts.append(np.arange(start, start + c))
        start += c
    x = np.arange(start, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)  # x[m] = m
    y = (np.arange(start) % 10).astype(np.int32)
    return data.make_node_shards(x, y, parts, pad_value=SENTINEL), parts


def test_make_node_shards_layout():
    shards, parts = _uneven_shards()
    assert shards.x.shape == (4, 50, 3) and shards.y.shape == (4, 50) and shards.counts.dtype == jnp.int32
    np.testing.assert_array_equal(shards.counts, [1, 2, 50, 7])
    assert float(shards.x[0, 1, 0]) == SENTINEL and int(shards.y[0, 1]) == -1
    with pytest.raises(ValueError, match="disagree on the number of samples"):
        data.make_node_shards(np.zeros((3, 2)), np.zeros(4, np.int32), [np.arange(3)])


def test_sampler_never_reads_padding_inside_scan():
    shards, parts = _uneven_shards()
    batch = 64

    @jax.jit
    def run(key):
        def body(key, _):
            key, key_batch = jax.random.split(key)
            return key, data.sample_batch(shards, key_batch, batch)

        return jax.lax.scan(body, key, None, length=20)[1]

    xs, ys = run(jax.random.key(0))
    assert xs.shape == (20, 4, batch, 3) and ys.shape == (20, 4, batch)
    xs, ys = np.asarray(xs), np.asarray(ys)
    assert not (xs == SENTINEL).any() and (ys >= 0).all()
    for i, p in enumerate(parts):
        assert set(np.unique(xs[:, i, :, 0]).astype(int)) <= set(p.tolist())
    assert set(np.unique(xs[:, 0, :, 0])) == {0.0}  # node with a single sample
    assert len(np.unique(xs[:, 2, :, 0])) > 40  # uniform over the big node's 50 samples


def test_sampler_without_replacement_and_check_batch_size():
    shards, parts = _uneven_shards()
    data.check_batch_size(shards, 64)  # with replacement any positive B is fine
    with pytest.raises(ValueError, match="batch size larger than a shard"):
        data.check_batch_size(shards, 2, replace=False)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        data.check_batch_size(shards, 0)
    data.check_batch_size(shards, 1, replace=False)
    big = data.make_node_shards(
        np.arange(30, dtype=np.float32), np.zeros(30, np.int32), [np.arange(10), np.arange(10, 30)], pad_value=SENTINEL
    )
    data.check_batch_size(big, 10, replace=False)
    x, _ = _sample(big, jax.random.key(1), 10, replace=False)
    x = np.asarray(x)
    assert sorted(x[0].tolist()) == list(range(10))  # B == count: a permutation of the node's data
    assert len(set(x[1].tolist())) == 10 and not (x == SENTINEL).any()


def test_sampler_vmaps_over_keys():
    shards, _ = _uneven_shards()
    keys = jax.random.split(jax.random.key(2), 3)
    xs, ys = jax.jit(jax.vmap(lambda k: data.sample_batch(shards, k, 5)))(keys)
    assert xs.shape == (3, 4, 5, 3)
    np.testing.assert_array_equal(xs[1], _sample(shards, keys[1], 5)[0])


# ----------------------------------------------------------------------------------------------
# augmentation
# ----------------------------------------------------------------------------------------------


def _windows(image, padding):
    h, w, _ = image.shape
    padded = np.pad(image, ((padding, padding), (padding, padding), (0, 0)))
    return [padded[dy : dy + h, dx : dx + w] for dy in range(2 * padding + 1) for dx in range(2 * padding + 1)]


def test_augmentation_crop_and_flip_properties():
    images = jax.random.uniform(jax.random.key(0), (16, 8, 8, 3)) + 1.0  # strictly positive: padding is visible
    out = _augment(jax.random.key(1), images)
    assert out.shape == images.shape and out.dtype == images.dtype
    out, images = np.asarray(out), np.asarray(images)
    for a, b in zip(out, images):
        candidates = _windows(b, 4) + _windows(b[:, ::-1], 4)
        assert any(np.array_equal(a, c) for c in candidates)
    assert (out == 0).any()  # some crop reached into the zero padding
    assert not np.array_equal(out, images)
    np.testing.assert_array_equal(_augment(jax.random.key(1), images, padding=0, flip=False), images)
    flipped = np.asarray(jax.jit(data.random_flip)(jax.random.key(3), images))
    is_flip = [np.array_equal(f, im[:, ::-1]) for f, im in zip(flipped, images)]
    assert all(np.array_equal(f, im) or fl for f, im, fl in zip(flipped, images, is_flip))
    assert 0 < sum(is_flip) < len(images)


def test_augmentation_vmaps_over_nodes():
    images = jax.random.normal(jax.random.key(0), (3, 16, 8, 8, 3))  # [N, B, H, W, C]
    keys = jax.random.split(jax.random.key(5), 3)
    out = jax.jit(jax.vmap(data.augment_cifar))(keys, images)
    assert out.shape == images.shape
    np.testing.assert_allclose(out[2], _augment(keys[2], images[2]))


def _blobs():
    ds = data.make_synthetic(num_train=256, num_test=64, num_classes=4, shape=(4, 4, 1), seed=0)
    return ds.x_train, ds.y_train, ds.x_test, ds.y_test


def test_from_arrays_returns_a_dataset_that_trains():
    from tiny import tiny_config

    from jaxgossip.run.runner import run_training

    x_tr, y_tr, x_te, y_te = _blobs()
    ds = data.from_arrays(x_tr.astype(np.float64), y_tr.astype(np.int64), x_te, y_te)
    assert isinstance(ds, data.Dataset) and ds.num_classes == 4 and ds.name == "arrays"
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32 and "256 train / 64 test" in ds.source
    parts = data.partition(ds.y_train, 4, "dirichlet:0.5", seed=0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(256))
    result = run_training(tiny_config(), None, progress=False, log=lambda s: None, dataset=ds)
    assert result.rows[-1]["test_acc"] > 0.5


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda a: (np.where(np.arange(a[0].size).reshape(a[0].shape) == 5, np.nan, a[0]), *a[1:]), "contains NaN"),
        (lambda a: (a[0], a[1][:-1], *a[2:]), "y_train has shape"),
        (lambda a: (a[0], a[1], a[2][:, :2], a[3]), "x_test samples"),
        (lambda a: (a[0], a[1] - 1, a[2], a[3]), r"labels must be in \[0, 4\)"),
        (lambda a: (a[0], a[1] + 0.5, a[2], a[3]), "integer class indices"),
        (lambda a: (a[0][:, 0, 0, 0], *a[1:]), r"x_train has shape \(256,\)"),
    ],
)
def test_from_arrays_rejects_bad_input(change, match):
    arrays = change(_blobs())
    with pytest.raises(ValueError, match=match):
        data.from_arrays(*arrays, num_classes=4)


def test_npz_dataset(tmp_path):
    path = tmp_path / "blobs.npz"
    x_tr, y_tr, x_te, y_te = _blobs()
    np.savez(path, x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te)
    ds = data.load_dataset(f"npz:{path}")
    np.testing.assert_array_equal(ds.x_train, x_tr)
    assert ds.num_classes == 4 and ds.source.startswith(f"npz: {path}")
    np.savez(tmp_path / "partial.npz", x_train=x_tr, y_train=y_tr)
    with pytest.raises(ValueError, match=r"lacks the arrays \['x_test', 'y_test'\]"):
        data.load_dataset(f"npz:{tmp_path / 'partial.npz'}")
    with pytest.raises(raw.DatasetNotFoundError, match="does not exist"):
        data.load_dataset(f"npz:{tmp_path / 'missing.npz'}")


# ---- bad data files: one line naming the file and the fix, the data folder left as it was ----------


def _tree(folder):
    return sorted(os.path.relpath(os.path.join(r, n), folder) for r, ds, fs in os.walk(folder) for n in ds + fs)


def _npz(path):
    x = np.random.default_rng(0).normal(size=(24, 4)).astype(np.float32)
    y = np.arange(24) % 3
    np.savez(path, x_train=x, y_train=y, x_test=x, y_test=y)
    return path.read_bytes()


def test_load_npz_refuses_truncated_flipped_random_and_npy_files_naming_the_file_and_fix(tmp_path):
    good = _npz(tmp_path / "good.npz")
    assert datasets.load_npz(tmp_path / "good.npz").num_classes == 3  # the intact file loads
    cases = {
        "truncated.npz": good[: len(good) // 2],
        "random.npz": np.random.default_rng(1).bytes(600),
        "flipped.npz": bytes(b ^ 0xFF if i == len(good) // 3 else b for i, b in enumerate(good)),
    }
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=r"numpy\.savez") as err:
            datasets.load_npz(tmp_path / name)
        assert str(tmp_path / name) in str(err.value) and "allow_pickle=True" not in str(err.value)
    np.save(tmp_path / "array.npy", np.zeros(3))
    with pytest.raises(ValueError, match=r"is not a \.npz archive"):
        datasets.load_npz(tmp_path / "array.npy")


def test_truncated_npz_on_the_command_line_exits_2_naming_the_file(tmp_path, capsys):
    good = _npz(tmp_path / "good.npz")
    path = tmp_path / "cut.npz"
    path.write_bytes(good[: len(good) - 40])
    flags = [f for f in TINY_FLAGS if not f.startswith("--dataset")]
    rc, _, err = call_cli(capsys, "train", *flags, f"--dataset=npz:{path}", "--out", str(tmp_path / "run"))
    assert_refused(rc, err, str(path), "is not a .npz archive", "numpy.savez")
    assert not (tmp_path / "run").exists()


def test_missing_mnist_without_download_leaves_an_empty_data_dir_empty(tmp_path, capsys):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    flags = [f for f in TINY_FLAGS if not f.startswith("--dataset")]
    rc, _, err = call_cli(capsys, "train", *flags, "--dataset=mnist", f"--data_dir={data_dir}", "--out", str(tmp_path / "r"))
    assert_refused(rc, err, "mnist is not prepared", "raw_dir")
    assert _tree(data_dir) == []


@pytest.mark.parametrize(
    "name, files",
    [("mnist", [stem for stems in raw.IDX_FILES.values() for stem in stems]), ("cifar10", ["cifar-10-python.tar.gz"])],
)
def test_failed_prepare_of_damaged_raw_files_leaves_no_new_folders(tmp_path, name, files):
    raw_dir = tmp_path / "raw"
    raw_dir.mkdir()
    for f in files:
        (raw_dir / f).write_bytes(np.random.default_rng(2).bytes(200))
    data_dir = tmp_path / "data"
    (data_dir / "kept").mkdir(parents=True)  # a folder of the user's, untouched
    with pytest.raises(ValueError, match=str(raw_dir)):
        datasets.load_dataset(name, data_dir, raw_dir=raw_dir)
    assert _tree(data_dir) == ["kept"]
    assert not builders.is_prepared(name, data_dir)


def test_a_random_bytes_npz_is_named_as_not_an_npz_without_pickle_advice(tmp_path, capsys):
    path = tmp_path / "garbage.npz"
    path.write_bytes(np.random.default_rng(0).bytes(3000))
    out = tmp_path / "run"
    argv = ["train", f"--dataset=npz:{path}", "--num_rounds=1", "--eval_every=1", "--out", str(out)]
    assert main(argv) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"jaxgossip train: error: dataset file {str(path)!r} is not a .npz archive")
    assert "pickle" not in err


def test_labels_all_minus_one_name_the_labels_rule(tmp_path, capsys):
    path = tmp_path / "neg.npz"
    x = np.zeros((8, 3), np.float32)
    np.savez(path, x_train=x, y_train=np.full(8, -1), x_test=x[:4], y_test=np.full(4, -1))
    out = tmp_path / "run"
    argv = ["train", f"--dataset=npz:{path}", "--model=mlp", "--num_nodes=4", "--num_rounds=1", "--eval_every=1"]
    assert main([*argv, "--out", str(out)]) == 2
    err = one_line_error(capsys)
    assert "labels must be class indices 0..C-1; found -1 (negative)" in err and "num_classes" not in err
    assert not out.exists()
