"""``jaxgossip design`` (jaxgossip.cli.design): the designed weights written as topology.npz and read
back by ``--topology=file:``, the comparison table, and exit 2 with one line on bad input."""

import json

import numpy as np
import pytest

import jaxgossip as jg
from jaxgossip.cli import main
from jaxgossip.run.validate import check_topology


@pytest.mark.parametrize("objective", ["slem", "fdla"])
def test_design_writes_weights_table_json_and_plot(tmp_path, capsys, objective):
    out = tmp_path / objective
    argv = ["design", "--topology=erdos_renyi:0.3", "--num_nodes=12", "--seed=2", f"--objective={objective}"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert {p.name for p in out.iterdir()} >= {"topology.npz", "design.json", "design.md", "design.png"}
    saved = json.loads((out / "design.json").read_text())
    rows = {r["weights"]: r for r in saved["rows"]}
    assert set(rows) == {"designed", "metropolis", "max-degree", "best constant"}
    assert (
        rows["designed"]["slem"] <= rows["metropolis"]["slem"]
        and rows["designed"]["slem"] <= rows["max-degree"]["slem"]
    )
    for r in rows.values():
        assert abs(r["spectral_gap"] - (1 - r["slem"])) < 1e-12
    assert "designed" in printed and "best constant" in printed
    # the file is an ordinary graph of every command, with the designed SLEM
    graph = check_topology(f"file:{out / 'topology.npz'}", 12)
    w = graph.matrix()
    np.testing.assert_allclose(np.max(np.abs(np.linalg.eigvalsh(w - 1 / 12))), rows["designed"]["slem"], atol=1e-12)
    support = check_topology("erdos_renyi:0.3", 12, 2).matrix() != 0
    assert np.all(w[~support] == 0)
    if objective == "slem":
        assert w.min() >= 0
    design = jg.design.fastest_mixing(check_topology("erdos_renyi:0.3", 12, 2), nonnegative=objective == "slem")
    assert abs(design.slem - rows["designed"]["slem"]) < 1e-12


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--topology=directed_ring"], "needs an undirected support"),
        (["--topology=one_peer_exponential"], "needs a static graph"),
        (["--objective=spectral"], "known objectives: slem, fdla"),
        (["--tol=0"], "must be a finite number > 0"),
        (["--num_nodes=1"], "num_nodes=1 must be an int >= 2"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, flags, message):
    assert main(["design", "--num_nodes=8", *flags, "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "d").exists()
