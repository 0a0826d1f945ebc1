"""The Colab demo notebook: its install cell, its badge, and a run end to end (small settings).

The install cell is executed on its own with ``importlib.util.find_spec`` and ``subprocess.check_call``
replaced, so no test ever installs anything or touches the network.
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest
from _reference import fast_compile_vars

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "experiments" / "colab_demo.ipynb"
EMPTY_SOURCE = 'JAXGOSSIP_SOURCE = ""'


def _load_badge_module():
    spec = importlib.util.spec_from_file_location("colab_badge", ROOT / "experiments" / "colab_badge.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


colab_badge = _load_badge_module()


def _images(cell) -> int:
    return sum("image/png" in out.get("data", {}) for out in cell.get("outputs", []))


def _install_cell() -> str:
    return "".join(json.loads(NOTEBOOK.read_text())["cells"][1]["source"])


def test_notebook_is_stored_without_outputs_and_matches_the_repository_address():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert nb.cells[0].cell_type == "markdown" and code[0] is nb.cells[1]
    assert "OWNER/REPO" not in NOTEBOOK.read_text()
    # the badge and the install cell's default follow pyproject.toml's [project.urls] Repository
    repo = colab_badge.repository()
    stored = json.loads(NOTEBOOK.read_text())
    assert colab_badge.render_notebook(stored, repo) == stored, "run python experiments/colab_badge.py"
    readme = (ROOT / "README.md").read_text()
    assert colab_badge.render_text(readme, repo) == readme, "run python experiments/colab_badge.py"
    assert ("colab.research.google.com/github/" in nb.cells[0].source) == (repo is not None)
    assert (EMPTY_SOURCE in code[0].source) == (repo is None)


def test_badge_appears_once_the_repository_is_set(tmp_path):
    stored = json.loads(NOTEBOOK.read_text())
    rendered = colab_badge.render_notebook(stored, "https://github.com/someone/jaxgossip")
    intro, install = ("".join(c["source"]) for c in rendered["cells"][:2])
    link = "https://colab.research.google.com/github/someone/jaxgossip/blob/main/experiments/colab_demo.ipynb"
    assert f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({link})" in intro
    assert 'JAXGOSSIP_SOURCE = "git+https://github.com/someone/jaxgossip"' in install
    assert rendered["cells"][2:] == stored["cells"][2:]
    unset = colab_badge.render_notebook(rendered, None)
    assert unset == colab_badge.render_notebook(stored, None)
    assert "colab-badge.svg" not in "".join(unset["cells"][0]["source"])

    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n')
    assert colab_badge.repository(pyproject) is None
    pyproject.write_text('[project]\nname = "x"\n[project.urls]\nRepository = "https://github.com/a/b.git"\n')
    assert colab_badge.repository(pyproject) == "https://github.com/a/b"
    pyproject.write_text('[project]\nname = "x"\n[project.urls]\nRepository = "https://gitlab.com/a/b"\n')
    with pytest.raises(ValueError, match=r"Repository='https://gitlab.com/a/b' must be a GitHub address"):
        colab_badge.repository(pyproject)
    with pytest.raises(ValueError, match="the badge markers are missing"):
        colab_badge.render_text("# no markers\n", "https://github.com/a/b")


class _Pip:
    """Stands in for ``subprocess.check_call``: records the command, then makes jaxgossip importable."""

    def __init__(self, state):
        self.state, self.calls = state, []

    def __call__(self, command, *args, **kwargs):
        self.calls.append(command)
        self.state["installed"] = self.state["installs_ok"]
        return 0


@pytest.fixture
def sandbox(monkeypatch):
    """Runs the install cell with ``JAXGOSSIP_SOURCE`` set; jaxgossip starts not importable."""
    real_find_spec = importlib.util.find_spec
    state = {"installed": False, "installs_ok": True}

    def find_spec(name, *args, **kwargs):
        if name == "jaxgossip" and not state["installed"]:
            return None
        return real_find_spec(name, *args, **kwargs)

    pip = _Pip(state)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(subprocess, "check_call", pip)

    def run(source: str | None, installed: bool = False, installs_ok: bool = True):
        state.update(installed=installed, installs_ok=installs_ok)
        code = _install_cell()
        assert code.count(EMPTY_SOURCE) == 1  # the stored default: nothing to install from
        if source is not None:
            code = code.replace(EMPTY_SOURCE, f"JAXGOSSIP_SOURCE = {source!r}")
        exec(compile(code, "install_cell", "exec"), {"__name__": "__main__"})
        return pip.calls

    return run


def test_install_cell_uses_an_importable_jaxgossip(sandbox, capsys):
    assert sandbox("", installed=True) == []
    assert f"jaxgossip from {ROOT / 'jaxgossip'}" in capsys.readouterr().out


def test_install_cell_stops_with_the_steps_when_no_source_is_set(sandbox):
    with pytest.raises(RuntimeError) as err:
        sandbox(None)
    message = str(err.value)
    assert "jaxgossip is not installed and JAXGOSSIP_SOURCE" in message
    assert 'JAXGOSSIP_SOURCE = "git+https://github.com/' in message and "python -m build" in message
    with pytest.raises(RuntimeError, match="JAXGOSSIP_SOURCE .* is empty"):
        sandbox("   ")


@pytest.mark.parametrize(
    "source, target",
    [
        ("git+https://github.com/a/jaxgossip@v0.1", "git+https://github.com/a/jaxgossip@v0.1"),
        ("https://github.com/a/jaxgossip", "git+https://github.com/a/jaxgossip"),
    ],
)
def test_install_cell_installs_from_a_git_url(sandbox, source, target, capsys):
    assert sandbox(source) == [[sys.executable, "-m", "pip", "install", "-q", target]]
    assert f"installing jaxgossip from {target}" in capsys.readouterr().out


def test_install_cell_installs_an_uploaded_wheel(sandbox, tmp_path):
    wheel = tmp_path / "jaxgossip-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    assert sandbox(str(wheel)) == [[sys.executable, "-m", "pip", "install", "-q", str(wheel)]]
    with pytest.raises(FileNotFoundError, match=r"jaxgossip-9\.whl': no such file; upload it first"):
        sandbox(str(tmp_path / "jaxgossip-9.whl"))
    with pytest.raises(ValueError, match="JAXGOSSIP_SOURCE='jaxgossip' is neither a git URL nor a .whl"):
        sandbox("jaxgossip")


def test_install_cell_reports_an_install_that_is_not_importable(sandbox):
    with pytest.raises(RuntimeError, match="yet jaxgossip is not importable; restart the runtime"):
        sandbox("git+https://github.com/a/jaxgossip", installs_ok=False)


def test_notebook_runs(tmp_path, monkeypatch):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.setenv("JAXGOSSIP_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    for name, value in fast_compile_vars().items():  # the kernel is a subprocess; outputs checked loosely
        monkeypatch.setenv(name, value)
    # The kernel is this interpreter (jupyter_client maps the "python3" spec's "python" to
    # sys.executable), so it sees the same installed jaxgossip.
    client = nbclient.NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute(cwd=str(tmp_path))
    errors = [out for c in nb.cells if c.cell_type == "code" for out in c.outputs if out.output_type == "error"]
    assert not errors, errors
    images = [_images(c) for c in nb.cells if c.cell_type == "code"]
    # topology: ring + torus + one-peer exponential rounds (log2 8 = 3); consensus: 1;
    # training: labels per worker + 3 (accuracy vs rounds, vs MB, consensus); prototype: accuracy vs
    # MB; sweep: 1.
    assert sum(images) == 2 + 3 + 1 + 1 + 3 + 1 + 1, images
    assert os.path.exists(tmp_path / "jaxgossip_notebook" / "sweep.png")
    assert os.path.exists(tmp_path / "jaxgossip_notebook" / "prototype" / "accuracy_vs_bits.png")
    text = "".join(out.get("text", "") for c in nb.cells if c.cell_type == "code" for out in c.outputs)
    assert "SMALL=True" in text and "spectral gap" in text and "acc(avg)" in text
    # the method defined in the notebook was registered and trained next to gossip and PowerGossip
    assert "registered quantized_gossip: mixing=doubly_stochastic" in text
    table = text.split("power_gossip r1", 2)[-1]
    assert "quantized_gossip" in table
    assert not os.path.exists(os.path.join(os.path.dirname(NOTEBOOK), "jaxgossip_notebook"))
