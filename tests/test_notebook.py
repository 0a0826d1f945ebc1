"""The Colab demo notebook runs end to end (small settings) and shows its figures."""

import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = os.path.join(os.path.dirname(__file__), os.pardir, "experiments", "colab_demo.ipynb")


def _images(cell) -> int:
    return sum("image/png" in out.get("data", {}) for out in cell.get("outputs", []))


def test_notebook_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    first = nb.cells[0]
    assert first.cell_type == "markdown"
    assert "https://colab.research.google.com/github/OWNER/REPO/blob/main/experiments/colab_demo.ipynb" in first.source
    assert 'find_spec("jaxgossip")' in code[0].source and "git+https://github.com/OWNER/REPO" in code[0].source


def test_notebook_runs(tmp_path, monkeypatch):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.setenv("JAXGOSSIP_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
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
    # training: labels per worker + 3 (accuracy vs rounds, vs MB, consensus); sweep: 1.
    assert sum(images) == 2 + 3 + 1 + 1 + 3 + 1, images
    assert os.path.exists(tmp_path / "jaxgossip_notebook" / "sweep.png")
    text = "".join(out.get("text", "") for c in nb.cells if c.cell_type == "code" for out in c.outputs)
    assert "SMALL=True" in text and "spectral gap" in text and "acc(avg)" in text
    assert not os.path.exists(os.path.join(os.path.dirname(NOTEBOOK), "jaxgossip_notebook"))
