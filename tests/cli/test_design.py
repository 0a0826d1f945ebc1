"""``jaxgossip design`` (jaxgossip.cli.design): the designed weights written as topology.npz and read
back by ``--topology=file:`` (and trained on), the comparison table, and exit 2 with one line on bad
input, for the objectives slem, fdla, consensus:T and heterogeneity:D."""

import json
import pathlib
import sys

import numpy as np
import pytest

import jaxgossip as jg
from jaxgossip.cli import main
from jaxgossip.cli.design import CONSENSUS_NOTE
from jaxgossip.run.validate import check_topology

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from tiny import TINY_FLAGS  # noqa: E402


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
        (["--objective=spectral"], "known objectives: slem, fdla, consensus:T, heterogeneity:D"),
        (["--objective=consensus:0"], "consensus needs T, an int >= 1"),
        (["--objective=consensus:x"], "consensus needs T, an int >= 1"),
        (["--objective=consensus"], "consensus needs T"),
        (["--objective=slem:3"], "is unknown"),
        (["--objective=heterogeneity:8"], "the degree bound D=8 must be below num_nodes=8"),
        (["--objective=heterogeneity:0"], "heterogeneity needs D, an int >= 1"),
        (["--objective=heterogeneity:2", "--partition=bogus"], "partition"),
        (["--objective=heterogeneity:2", "--dataset=nosuchdata"], "dataset"),
        (["--objective=heterogeneity:2", "--lam=-1"], "lam=-1"),
        (["--objective=consensus:4", "--probes=-1"], "probes=-1 must be an int >= 0"),
        (["--objective=consensus:4", "--max_steps=0"], "max_steps=0 must be an int >= 1"),
        (["--objective=consensus:4", "--topology=random_matching"], "fixed graphs"),
        (["--objective=consensus:4", "--topology=erdos_renyi:0.05"], "connected"),
        (["--topology=erdos_renyi:0.05"], "connected"),
        (["--tol=0"], "must be a finite number > 0"),
        (["--num_nodes=1"], "num_nodes=1 must be an int >= 2"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, flags, message):
    assert main(["design", "--num_nodes=8", *flags, "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "d").exists()


def test_consensus_design_of_a_schedule_writes_its_outputs_and_trains(tmp_path, capsys):
    """consensus:T on a time-varying graph: one weighting per round, its error below the uniform
    start's, the file loads as a schedule of the same period and trains (tiny run)."""
    out = tmp_path / "consensus"
    argv = ["design", "--topology=base:1", "--num_nodes=6", "--objective=consensus:4", "--tol=1e-12"]
    assert main([*argv, "--no-progress", "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} >= {"topology.npz", "design.json", "design.md", "design.png"}
    saved = json.loads((out / "design.json").read_text())
    rows = {r["weights"]: r for r in saved["rows"]}
    assert set(rows) == {"designed", "given"}  # a schedule has no Metropolis / max-degree rows
    assert saved["error"] < 1e-9 < saved["start_error"]
    graph = check_topology(f"file:{out / 'topology.npz'}", 6)
    given = check_topology("base:1", 6)
    assert graph.period == given.period == 4
    product = np.eye(6)
    for t in range(4):
        w = graph.matrix(t)
        assert w.min() >= 0 and np.all(w[(given.matrix(t) == 0) & ~np.eye(6, dtype=bool)] == 0)
        product = w @ product
    np.testing.assert_allclose(product, np.full((6, 6), 1 / 6), atol=3e-5)
    assert rows["designed"]["objective"] == pytest.approx(np.sum((product - 1 / 6) ** 2) / 5, abs=1e-12)
    assert "designed" in capsys.readouterr().out
    # the file trains
    flags = [f for f in TINY_FLAGS if not f.startswith("--num_nodes")]
    run = tmp_path / "train"
    topology = f"--topology=file:{out / 'topology.npz'}"
    assert main(["train", *flags, "--num_nodes=6", topology, "--no-progress", "--out", str(run)]) == 0


def test_static_consensus_design_beats_metropolis(tmp_path):
    out = tmp_path / "static"
    argv = ["design", "--topology=erdos_renyi:0.3", "--num_nodes=10", "--seed=1", "--objective=consensus:5"]
    assert main([*argv, "--no-progress", "--out", str(out)]) == 0
    rows = {r["weights"]: r for r in json.loads((out / "design.json").read_text())["rows"]}
    assert set(rows) == {"designed", "given", "metropolis", "max-degree", "best constant"}
    assert rows["designed"]["objective"] < rows["metropolis"]["objective"]
    graph = check_topology(f"file:{out / 'topology.npz'}", 10)
    assert graph.period == 1 and graph.is_symmetric and graph.matrix().min() >= 0


def test_heterogeneity_design_learns_from_the_partition_and_trains(tmp_path, capsys):
    out = tmp_path / "learned"
    data = ["--dataset=synthetic", "--partition=dirichlet:0.1"]
    argv = ["design", "--topology=ring", "--num_nodes=8", "--objective=heterogeneity:2", *data]
    assert main([*argv, "--out", str(out)]) == 0
    saved = json.loads((out / "design.json").read_text())
    rows = {r["weights"]: r for r in saved["rows"]}
    assert rows["designed"]["objective"] < rows["given"]["objective"]
    assert saved["max_in_degree"] <= 2
    graph = check_topology(f"file:{out / 'topology.npz'}", 8)
    w = graph.matrix()
    np.testing.assert_allclose(w.sum(axis=0), 1, atol=1e-9)
    np.testing.assert_allclose(w.sum(axis=1), 1, atol=1e-9)
    assert ((w != 0) & ~np.eye(8, dtype=bool)).sum(axis=1).max() <= 2
    # the heterogeneity reported is that of the partition train would draw
    from jaxgossip import data as jdata
    from jaxgossip.design import label_proportions, neighbourhood_heterogeneity

    dataset = jdata.load_dataset("synthetic")
    labels = np.asarray(dataset.y_train)
    parts = jdata.partition(labels, 8, "dirichlet:0.1", seed=0)
    node_of = np.zeros(labels.size, dtype=np.int64)
    for node, idx in enumerate(parts):
        node_of[idx] = node
    pi = label_proportions(labels, node_of, 8, dataset.num_classes)
    assert saved["heterogeneity"] == pytest.approx(neighbourhood_heterogeneity(w, pi), rel=1e-9)
    capsys.readouterr()
    flags = [f for f in TINY_FLAGS if not f.startswith("--num_nodes")]
    run = tmp_path / "train"
    topology = f"--topology=file:{out / 'topology.npz'}"
    assert main(["train", *flags, "--num_nodes=8", topology, "--no-progress", "--out", str(run)]) == 0


def bad_design_files():
    ring = jg.topology.ring(8).matrix()
    shift = np.roll(np.eye(8), 1, axis=1)
    signed_directed = 1.2 * np.eye(8) - 0.2 * shift  # rows and columns sum to 1, not symmetric
    return {
        "wrong_shape": ({"matrix": np.ones((3, 4)) / 4}, "got shape (3, 4)"),
        "not_stochastic": ({"matrix": ring * 0.9}, "not stochastic"),
        "negative": ({"matrix": signed_directed}, "negative weight"),
        "disconnected": ({"matrix": np.kron(np.eye(2), np.full((4, 4), 0.25))}, "not strongly connected"),
        "other_node_count": ({"matrix": jg.topology.ring(6).matrix()}, "graph of 6 nodes, but num_nodes=8"),
    }


@pytest.mark.parametrize("objective", ["slem", "consensus:4", "heterogeneity:2"])
@pytest.mark.parametrize("name", list(bad_design_files()))
def test_bad_topology_files_exit_2_naming_the_problem(tmp_path, capsys, name, objective):
    arrays, message = bad_design_files()[name]
    path = tmp_path / f"{name}.npz"
    np.savez(path, **arrays)
    argv = ["design", f"--topology=file:{path}", "--num_nodes=8", f"--objective={objective}", "--dataset=synthetic"]
    assert main([*argv, "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "d").exists()


def test_a_directed_schedule_file_is_refused_by_the_symmetric_design_and_designed_by_consensus(tmp_path, capsys):
    path = tmp_path / "schedule.npz"
    np.savez(path, matrix=jg.topology.one_peer_exponential(8).matrices())
    argv = ["design", f"--topology=file:{path}", "--num_nodes=8", "--no-progress"]
    assert main([*argv, "--objective=slem", "--out", str(tmp_path / "slem")]) == 2
    assert "needs a static graph" in capsys.readouterr().err
    assert main([*argv, "--objective=consensus:3", "--out", str(tmp_path / "consensus")]) == 0
    saved = json.loads((tmp_path / "consensus" / "design.json").read_text())
    assert saved["error"] < 1e-9


def test_static_consensus_design_states_what_it_does_not_promise(tmp_path, capsys):
    """consensus:T on a static graph prints, writes and records the note that the error after T
    rounds is not the SLEM; a schedule's design has no SLEM and no note."""
    out = tmp_path / "static"
    argv = ["design", "--topology=ring", "--num_nodes=8", "--objective=consensus:3", "--no-progress"]
    assert main([*argv, "--out", str(out)]) == 0
    note = CONSENSUS_NOTE.format(t=3)
    assert note in capsys.readouterr().out
    assert note in (out / "design.md").read_text()
    assert json.loads((out / "design.json").read_text())["notes"] == [note]
    schedule = tmp_path / "schedule"
    argv = ["design", "--topology=base:1", "--num_nodes=6", "--objective=consensus:4", "--no-progress"]
    assert main([*argv, "--out", str(schedule)]) == 0
    assert "note:" not in capsys.readouterr().out
    assert json.loads((schedule / "design.json").read_text())["notes"] == []
