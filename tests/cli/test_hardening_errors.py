"""Bad input the command line once answered with a traceback now exits 2 with one line naming the file,
option or value and the fix: a damaged .npz data set, non-positive or non-integer layer sizes (in a
run and in --print-config), a plug-in with a syntax error or whose code raises (the message names the
user's file and line). A data set that fails to load leaves the data folder as it was."""

import importlib
import os
import subprocess
import sys

import numpy as np
import pytest
from _reference import fast_compile_env
from tiny import TINY_FLAGS

from jaxgossip import algorithms, models, topology
from jaxgossip.data import builders, datasets, raw

NO_HIDDEN = [f for f in TINY_FLAGS if not f.startswith("--model_options.hidden")]


def _cli(*argv, env=None):
    proc = subprocess.run(
        [sys.executable, "-m", "jaxgossip.cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=fast_compile_env(env),
    )
    return proc.returncode, proc.stdout, proc.stderr


def _refused(rc, stderr, *parts):
    """Exit 2, no traceback, and one error line holding every one of ``parts``."""
    assert rc == 2, stderr
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, stderr
    for part in parts:
        assert part in errors[0], errors[0]
    return errors[0]


def _tree(folder):
    return sorted(os.path.relpath(os.path.join(r, n), folder) for r, ds, fs in os.walk(folder) for n in ds + fs)


def _npz(path):
    x = np.random.default_rng(0).normal(size=(24, 4)).astype(np.float32)
    y = np.arange(24) % 3
    np.savez(path, x_train=x, y_train=y, x_test=x, y_test=y)
    return path.read_bytes()


# --- damaged .npz ---------------------------------------------------------------------------------


def test_load_npz_refuses_truncated_flipped_random_and_npy_files_naming_the_file_and_fix(tmp_path):
    good = _npz(tmp_path / "good.npz")
    assert datasets.load_npz(tmp_path / "good.npz").num_classes == 3  # the intact file loads
    cases = {
        "truncated.npz": good[: len(good) // 2],
        "random.npz": np.random.default_rng(1).bytes(600),
        "flipped.npz": bytes(b ^ 0xFF if i == len(good) // 3 else b for i, b in enumerate(good)),
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match=r"numpy\.savez") as err:
            datasets.load_npz(tmp_path / name)
        assert str(tmp_path / name) in str(err.value) and "allow_pickle=True" not in str(err.value)
    np.save(tmp_path / "array.npy", np.zeros(3))
    with pytest.raises(ValueError, match=r"is not a \.npz archive"):
        datasets.load_npz(tmp_path / "array.npy")


def test_truncated_npz_on_the_command_line_exits_2_naming_the_file(tmp_path):
    good = _npz(tmp_path / "good.npz")
    path = tmp_path / "cut.npz"
    path.write_bytes(good[: len(good) - 40])
    flags = [f for f in TINY_FLAGS if not f.startswith("--dataset")]
    rc, _, err = _cli("train", *flags, f"--dataset=npz:{path}", "--out", str(tmp_path / "run"))
    _refused(rc, err, str(path), "is not a .npz archive", "numpy.savez")
    assert not (tmp_path / "run").exists()


# --- layer sizes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model, options",
    [
        ("mlp", {"hidden": (0,)}),
        ("mlp", {"hidden": (8, -5)}),
        ("mlp", {"hidden": (1.5,)}),
        ("mlp", {"hidden": "abc"}),
        ("cnn", {"features": (0, 8)}),
        ("transformer", {"heads": 0}),
        ("resnet20", {"width": True}),
    ],
)
def test_make_model_refuses_non_positive_and_non_integer_sizes(model, options):
    (key,) = options
    with pytest.raises(ValueError, match=rf"^{key}=.* must be a positive integer"):
        models.make_model(model, num_classes=10, **options)


def test_group_count_and_fixed_resnet_depth_are_refused_naming_the_option():
    import jax
    import jax.numpy as jnp

    cnn = models.make_model("cnn", features=(6,), norm="group", norm_groups=4)
    with pytest.raises(ValueError, match=r"norm_groups=4 must divide the 6 channels"):
        cnn.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    ok = models.make_model("cnn", features=(6,), norm="group", norm_groups=3)
    norm = ok.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))["params"]["norm1"]  # the path stays
    assert norm["scale"].shape == norm["bias"].shape == (6,)
    with pytest.raises(ValueError, match=r"depth=21: resnet20's depth is fixed"):
        models.make_model("resnet20", depth=21)


def test_make_model_keeps_valid_sizes():
    assert models.make_model("mlp", hidden=(8, 4)).hidden == (8, 4)
    assert models.make_model("cnn", features=(4,), hidden=()).hidden == ()
    assert models.make_model("mlp", hidden=(np.int64(3),)).hidden == (3,)


@pytest.mark.parametrize("value", ["0", "abc", "-5", "1.5", "[8,0]"])
def test_bad_hidden_exits_2_in_print_config(tmp_path, value):
    rc, out, err = _cli("train", *NO_HIDDEN, f"--model_options.hidden={value}", "--print-config")
    _refused(rc, err, "model_options=", "hidden=", "must be a positive integer or a list of positive integers")
    assert out == ""


def test_hidden_0_in_a_run_exits_2_before_anything_is_written(tmp_path):
    rc, _, err = _cli("train", *NO_HIDDEN, "--model_options.hidden=0", "--out", str(tmp_path / "run"))
    _refused(rc, err, "hidden=(0,) must be a positive integer")
    assert not (tmp_path / "run").exists()


# --- plug-ins -------------------------------------------------------------------------------------

PLUGINS = {
    "plug_syntax": "def broken(topology):\n    return (\n",
    "plug_import": "SETTINGS = {}\nBETA = SETTINGS['beta']\n",
    "plug_factory": "def broken(topology, beta=0.5):\n    scale = 0\n    return beta / scale\n",
}


@pytest.fixture()
def plugin_dir(tmp_path):
    for module, source in PLUGINS.items():
        (tmp_path / f"{module}.py").write_text(source)
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for module in PLUGINS:
        sys.modules.pop(module, None)


def test_plugin_errors_name_the_users_file_and_line(plugin_dir):
    ring = topology.ring(4)
    with pytest.raises(ValueError, match="syntax error at") as err:
        algorithms.make("plug_syntax:broken", ring)
    assert f"{plugin_dir / 'plug_syntax.py'}:2" in str(err.value)
    with pytest.raises(ValueError, match="raised KeyError: 'beta'") as err:
        algorithms.make("plug_import:broken", ring)
    assert f"{plugin_dir / 'plug_import.py'}:2" in str(err.value)
    with pytest.raises(ValueError, match="its factory raised ZeroDivisionError") as err:
        algorithms.make("plug_factory:broken", ring)
    assert f"{plugin_dir / 'plug_factory.py'}:3" in str(err.value)


@pytest.mark.parametrize(
    "module, line, words",
    [("plug_syntax", 2, "syntax error"), ("plug_import", 2, "KeyError"), ("plug_factory", 3, "ZeroDivisionError")],
)
def test_broken_plugin_on_the_command_line_exits_2_with_its_file_and_line(plugin_dir, module, line, words):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")])}
    out = plugin_dir / "run"
    rc, _, err = _cli("train", *TINY_FLAGS, f"--algorithm={module}:broken", "--out", str(out), env=env)
    message = _refused(rc, err, f"{plugin_dir / module}.py:{line}", words, "fix")
    assert "jaxgossip/" not in message.replace(str(plugin_dir), "")  # no frame of jaxgossip's own
    assert not out.exists()


# --- failed loads leave the data folder as it was -------------------------------------------------


def test_missing_mnist_without_download_leaves_an_empty_data_dir_empty(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    flags = [f for f in TINY_FLAGS if not f.startswith("--dataset")]
    rc, _, err = _cli("train", *flags, "--dataset=mnist", f"--data_dir={data_dir}", "--out", str(tmp_path / "r"))
    _refused(rc, err, "mnist is not prepared", "raw_dir")
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
