"""The installed wheel: it carries every file of the package (the native kernels' C++ sources and the
header they include among them), a fresh environment holding only the wheel builds those kernels from
its own copy and runs top-k consensus on them with this checkout's results, its console script finds
the example configs by bare name (``--config digits_choco.yaml``) outside any checkout, and the Colab
notebook's install cell installs it.

The wheel is built once per module, offline, from a copy of the checkout's files (what
``pip install git+URL`` clones): ``pip wheel --no-deps --no-build-isolation``, so with this
environment's setuptools (the ``test`` extra asks for one that builds wheels by itself). A fresh
environment is a virtual environment without packages of its own whose ``.pth`` file lists this
environment's site-packages folders: jax and the other dependencies come from here, jaxgossip from
the wheel. A path line in a ``.pth`` file only adds the folder to ``sys.path``; the ``.pth`` files
inside it (this environment's editable install of jaxgossip among them) are not run, so the
checkout stays out of sight.
"""

import importlib.metadata
import json
import os
import pathlib
import re
import shutil
import site
import subprocess
import sys
import tarfile
import textwrap
import zipfile

import jax
import numpy as np
import pytest
import yaml
from _reference import fast_compile_env

from jaxgossip.compress import native

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "experiments" / "colab_demo.ipynb"
PACKAGE = "jaxgossip"
# setuptools builds wheels without the separate `wheel` package from 70.1 on and reads an SPDX
# license string (pyproject.toml) from 77 on.
SETUPTOOLS_FLOOR = (77, 0)


def _checkout_files() -> list[str]:
    """The checkout's files as a clone would have them: tracked ones plus new ones not ignored."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    return sorted(p for p in out.decode().split("\0") if p and (ROOT / p).is_file())


def _copy_checkout(dest: pathlib.Path, files: list[str]) -> pathlib.Path:
    """A build leaves build/ and *.egg-info in its source folder (and reads a stale egg-info's file
    list back), so every build gets its own copy."""
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    return dest


def _pip_wheel(source: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    proc = subprocess.run([*cmd, "-w", str(out), str(source)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (wheel,) = out.glob(f"{PACKAGE}-*.whl")
    return wheel


@pytest.fixture(scope="module")
def checkout_files():
    return _checkout_files()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, checkout_files):
    """The wheel built from a copy of the checkout."""
    version = tuple(int(p) for p in re.findall(r"\d+", importlib.metadata.version("setuptools"))[:2])
    assert version >= SETUPTOOLS_FLOOR, (
        f"setuptools {importlib.metadata.version('setuptools')} cannot build a wheel without build isolation; "
        "`pip install -e '.[test]'` installs a newer one"
    )
    base = tmp_path_factory.mktemp("wheel")
    source = _copy_checkout(base / "src", checkout_files)
    return _pip_wheel(source, base / "dist")


def _package_files(files: list[str]) -> list[str]:
    return [p for p in files if p.startswith(f"{PACKAGE}/")]


def _local_includes(path: pathlib.Path) -> list[str]:
    """The ``#include "..."`` files of a C++ source, relative to its folder."""
    return re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.M)


def test_wheel_and_sdist_carry_every_file_of_the_package(wheel, checkout_files, tmp_path):
    package = _package_files(checkout_files)
    csrc = [p for p in package if p.startswith(f"{PACKAGE}/compress/csrc/")]
    # what jaxgossip/compress/native.py compiles: every source there and the headers they include
    assert any(p.endswith(".cc") for p in csrc) and any(p.endswith(".h") for p in csrc), csrc
    for rel in csrc:
        for name in _local_includes(ROOT / rel):  # ours, or the FFI headers jaxlib ships
            assert f"{PACKAGE}/compress/csrc/{name}" in csrc or os.path.isfile(
                os.path.join(jax.ffi.include_dir(), name)
            ), f"{rel} includes {name}: neither in csrc/ nor in jax.ffi.include_dir()"
    # the example configs that --config finds by bare name (jaxgossip/configs)
    shipped = [p for p in package if p.startswith(f"{PACKAGE}/configs/") and p.endswith(".yaml")]
    assert {os.path.basename(p) for p in shipped} >= {"digits_choco.yaml", "digits_sweep.yaml"}, shipped
    # the package opens no file of its own outside csrc/ and configs/: any other would be listed here
    assert [p for p in package if not p.endswith(".py") and p not in csrc + shipped] == []

    wheel_names = set(zipfile.ZipFile(wheel).namelist())
    missing = [p for p in package if p not in wheel_names]
    assert not missing, f"the wheel lacks {missing}: add them to [tool.setuptools.package-data] in pyproject.toml"

    # The sdist (an uploaded .tar.gz, or what `python -m build` builds the wheel from) carries them
    # too, and a wheel built from it holds the same package files.
    source = _copy_checkout(tmp_path / "src", checkout_files)
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])"]
        + [str(tmp_path / "sdist")],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sdist,) = (tmp_path / "sdist").glob(f"{PACKAGE}-*.tar.gz")
    with tarfile.open(sdist) as tar:
        sdist_names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    missing = [p for p in package + ["pyproject.toml", "README.md"] if p not in sdist_names]
    assert not missing, f"the sdist lacks {missing}: list them in MANIFEST.in or package-data"
    again = _pip_wheel(sdist, tmp_path / "from_sdist")
    package_names = sorted(n for n in zipfile.ZipFile(again).namelist() if n.startswith(f"{PACKAGE}/"))
    assert package_names == sorted(n for n in wheel_names if n.startswith(f"{PACKAGE}/"))


def _fresh_venv(path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A virtual environment at ``path`` that sees this environment's packages but not its jaxgossip
    (module docstring); returns its python and its site-packages folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    purelib = pathlib.Path(purelib)
    (purelib / "_test_environment.pth").write_text("".join(f"{d}\n" for d in site.getsitepackages()))
    return python, purelib


def _venv_env(**extra) -> dict:
    """This process's environment, compiling like the in-process tests, without a PYTHONPATH that
    could put the checkout back on the path; pip offline, installing into the fresh environment only
    (``--ignore-installed``: it never considers, let alone uninstalls, this environment's jaxgossip)."""
    env = fast_compile_env()
    env.pop("PYTHONPATH", None)
    env.update(PIP_NO_INDEX="1", PIP_NO_DEPS="1", PIP_IGNORE_INSTALLED="1", **extra)
    return env


def _run(python, args, cwd, env, timeout=300) -> str:
    proc = subprocess.run([str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


# Run in the fresh environment and in this process alike: top-k Choco and Sparse-Push consensus, one
# exact top-k selection, and the facts that show the native kernels serve them.
RUNS = textwrap.dedent(
    """
    import importlib.metadata
    import warnings

    import jax
    import numpy as np


    def consensus_runs():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import jaxgossip as jg
            from jaxgossip import topology as tp
            from jaxgossip.compress import native, selection

            n, d, steps = 8, 4096, 4  # d >= 1,024: the kernels' sampled (histogram) selection
            x0 = {"w": jax.numpy.asarray(np.random.default_rng(0).standard_normal((n, d)).astype(np.float32))}
            algorithms = {
                "choco": jg.algorithms.choco(tp.ring(n), gamma=0.4, compressor="top_k",
                                             compressor_options={"fraction": 0.01}),
                "sparse_push": jg.algorithms.sparse_push(tp.one_peer_exponential(n), fraction=0.01, gamma=0.3),
            }
            arrays, fused_in_program = {}, {}
            for name, alg in algorithms.items():
                result = jg.run_consensus(alg, x0, steps, jax.random.key(1))
                arrays.update({f"{name}_x": result.x["w"], f"{name}_error": result.error,
                               f"{name}_bits": result.bits, f"{name}_node_bits": result.node_bits})
                text = jax.jit(alg.step).lower(x0, alg.init(x0), jax.random.key(0)).as_text()
                fused_in_program[name] = "jaxgossip_fused_top_k_f32" in text
            values, indices = jax.jit(lambda x: selection.top_k(x, 40))(x0["w"])
            arrays.update(top_k_values=values, top_k_indices=indices)
            top_k_text = jax.jit(lambda x: selection.top_k(x, 40)).lower(x0["w"]).as_text()
            status = native.load()
        dist = importlib.metadata.distribution("jaxgossip")
        facts = {
            "jaxgossip_file": jg.__file__,
            "distribution_at": str(dist.locate_file("")),
            "direct_url": dist.read_text("direct_url.json") or "",
            "source_dir": native.SOURCE_DIR,
            "status": status._asdict(),
            "fused_in_program": fused_in_program,
            "top_k_in_program": "jaxgossip_top_k_f32" in top_k_text,
            "warnings": [str(w.message) for w in caught],
        }
        return {k: np.asarray(v) for k, v in arrays.items()}, facts
    """
)

SAVE = textwrap.dedent(
    """
    import json, sys
    arrays, facts = consensus_runs()
    np.savez(sys.argv[1], **arrays)
    with open(sys.argv[2], "w") as f:
        json.dump(facts, f)
    """
)


def _inside(path, folder) -> bool:
    return pathlib.Path(path).resolve().is_relative_to(pathlib.Path(folder).resolve())


@pytest.mark.skipif(not native.load().available, reason="native CPU kernels unavailable here")
def test_installed_wheel_builds_the_native_kernels_from_its_own_sources(wheel, tmp_path):
    python, purelib = _fresh_venv(tmp_path / "venv")
    env = _venv_env(JAXGOSSIP_NATIVE_CACHE=str(tmp_path / "cache"))
    _run(python, ["-m", "pip", "install", "-q", "--no-compile", str(wheel)], tmp_path, env)
    script = tmp_path / "runs.py"
    script.write_text(RUNS + SAVE)
    _run(python, [str(script), str(tmp_path / "runs.npz"), str(tmp_path / "facts.json")], tmp_path, env)
    facts = json.loads((tmp_path / "facts.json").read_text())

    # jaxgossip is the wheel's (installed from the file, not editable), and so are its kernel sources
    assert _inside(facts["jaxgossip_file"], purelib / PACKAGE), facts["jaxgossip_file"]
    assert _inside(facts["distribution_at"], purelib), facts["distribution_at"]
    assert "editable" not in facts["direct_url"], facts["direct_url"]
    assert _inside(facts["source_dir"], purelib / PACKAGE / "compress" / "csrc"), facts["source_dir"]
    # the kernels were compiled there (the cache started empty), loaded, and the programs call them
    status = facts["status"]
    assert status["available"] and not status["reason"], status
    assert _inside(status["library"], tmp_path / "cache") and os.path.isfile(status["library"]), status
    assert facts["fused_in_program"] == {"choco": True, "sparse_push": True}
    assert facts["top_k_in_program"]
    assert not [w for w in facts["warnings"] if "native CPU kernels unavailable" in w], facts["warnings"]
    # same sources, compiler and jaxlib as this checkout's kernels (the name is their digest)
    assert os.path.basename(status["library"]) == os.path.basename(native.load().library)

    # the same results as this process (both compile without XLA's backend optimizations)
    namespace = {}
    exec(compile(RUNS, "runs", "exec"), namespace)
    want, want_facts = namespace["consensus_runs"]()
    assert want_facts["fused_in_program"] == {"choco": True, "sparse_push": True}
    got = np.load(tmp_path / "runs.npz")
    assert sorted(got.files) == sorted(want)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_installed_wheel_runs_the_readme_configs_by_name(wheel, tmp_path):
    """The README's ``jaxgossip train --config digits_choco.yaml ...`` and ``jaxgossip sweep --config
    digits_sweep.yaml``, with ``--print-config``, through the wheel's console script in a folder with
    no config file: the configs come from the installed package."""
    python, purelib = _fresh_venv(tmp_path / "venv")
    env = _venv_env()
    _run(python, ["-m", "pip", "install", "-q", "--no-compile", str(wheel)], tmp_path, env)
    assert (purelib / PACKAGE / "configs" / "digits_choco.yaml").is_file()
    work = tmp_path / "elsewhere"
    work.mkdir()
    script = python.parent / "jaxgossip"
    out = _run(script, ["train", "--config", "digits_choco.yaml", "--lr=0.1", "--print-config"], work, env)
    resolved = yaml.safe_load(out)
    assert resolved["name"] == "digits_choco_top10" and resolved["algorithm"] == "choco" and resolved["lr"] == 0.1
    out = _run(script, ["sweep", "--config", "digits_sweep.yaml", "--print-config"], work, env)
    assert yaml.safe_load(out)["sweep"]["lr"] == [0.01, 0.05, 0.1]
    # a name that is not shipped is refused with the list of those that are
    proc = subprocess.run(
        [str(script), "train", "--config", "nope.yaml"], cwd=work, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2 and "digits_choco.yaml" in proc.stderr, proc.stderr
    assert list(work.iterdir()) == []


def test_notebook_install_cell_installs_the_wheel(wheel, tmp_path):
    """experiments/colab_demo.ipynb's first code cell with JAXGOSSIP_SOURCE set to the wheel: its
    real pip install, into a fresh environment, then jaxgossip imported from there."""
    python, purelib = _fresh_venv(tmp_path / "venv")
    cell = "".join(json.loads(NOTEBOOK.read_text())["cells"][1]["source"])
    cell, count = re.subn(r"^JAXGOSSIP_SOURCE = .*$", f"JAXGOSSIP_SOURCE = {str(wheel)!r}", cell, flags=re.M)
    assert count == 1, "the install cell sets JAXGOSSIP_SOURCE once"
    script = tmp_path / "install_cell.py"
    script.write_text(cell + "\nimport jaxgossip\nprint('imported', jaxgossip.__file__)\n")
    before = importlib.metadata.distribution(PACKAGE).locate_file("")
    out = _run(python, [str(script)], tmp_path, _venv_env())
    assert f"installing jaxgossip from {wheel} ..." in out
    assert f"jaxgossip from {purelib / PACKAGE}" in out, out
    imported = out.split("imported ", 1)[1].strip()
    assert _inside(imported, purelib / PACKAGE), imported
    assert (purelib / PACKAGE / "compress" / "csrc").is_dir()
    # this environment's own jaxgossip is untouched
    assert importlib.metadata.distribution(PACKAGE).locate_file("") == before
