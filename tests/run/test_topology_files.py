"""Topologies in files (jaxgossip.run.topology_files, jaxgossip.topology.from_weights): the two
forms of a ``.npz`` file, a designed graph written and read back, ``--topology=file:PATH`` in a
command, and one clear refusal per kind of bad file."""

import numpy as np
import pytest

import jaxgossip as jg
from jaxgossip.cli import main
from jaxgossip.run.topology_files import load_topology, save_topology
from jaxgossip.run.validate import check_topology


def test_a_designed_signed_graph_is_written_and_read_back(tmp_path):
    design = jg.design.fastest_mixing(jg.topology.star(6), nonnegative=False)
    assert design.topology.matrix().min() < 0  # FDLA weights are signed here
    path = tmp_path / "topology.npz"
    save_topology(design.topology, str(path))
    loaded = check_topology(f"file:{path}", 6)
    np.testing.assert_array_equal(loaded.matrix(), design.topology.matrix())
    assert loaded.is_doubly_stochastic and loaded.is_symmetric and not loaded.directed


def test_matrix_and_time_varying_edge_forms(tmp_path):
    schedule = jg.topology.one_peer_exponential(8)
    np.savez(tmp_path / "m.npz", matrix=schedule.matrices())
    np.testing.assert_array_equal(load_topology(str(tmp_path / "m.npz")).matrices(), schedule.matrices())
    np.savez(tmp_path / "e.npz", senders=schedule.senders, receivers=schedule.receivers, weights=schedule.weights)
    loaded = load_topology(str(tmp_path / "e.npz"), 8)
    assert loaded.period == 3 and loaded.directed
    np.testing.assert_array_equal(loaded.matrices(), schedule.matrices())
    ring = jg.topology.ring(5)
    np.savez(tmp_path / "flat.npz", senders=ring.senders[0], receivers=ring.receivers[0], weights=ring.weights[0])
    np.testing.assert_array_equal(load_topology(str(tmp_path / "flat.npz")).matrix(), ring.matrix())


def bad_files():
    ring = jg.topology.ring(4).matrix()
    directed = np.array([[0.5, 0.5, 0, 0], [0, 0.5, 0.5, 0], [0, 0, 0.5, 0.5], [0.5, 0, 0, 0.5]])
    signed = directed + np.array([[0.7, -0.7, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [-0.7, 0, 0, 0.7]])
    two_pairs = np.kron(np.eye(2), np.full((2, 2), 0.5))
    return {
        "wrong_shape": ({"matrix": np.ones((3, 4)) / 4}, r"\[N, N\] or \[T, N, N\], got shape \(3, 4\)"),
        "not_stochastic": ({"matrix": ring * 0.9}, "not stochastic"),
        "negative_not_symmetric": ({"matrix": signed}, r"negative weight W\[0\]\[0, 1\].*not symmetric"),
        "disconnected": ({"matrix": two_pairs}, "not strongly connected"),
        "nan": ({"matrix": np.where(ring > 0, np.nan, 0)}, "NaN or inf"),
        "both_forms": ({"matrix": ring, "senders": [0], "receivers": [0], "weights": [1.0]}, "either"),
        "edges_of_other_shapes": ({"senders": [0, 1], "receivers": [0], "weights": [1.0]}, "share one"),
        "index_out_of_range": ({"senders": [0, 9], "receivers": [0, 1], "weights": [1.0, 1.0]}, r"\[0, 4\)"),
        "float_indices": ({"senders": [0.0], "receivers": [0.0], "weights": [1.0]}, "integer node indices"),
    }


@pytest.mark.parametrize("name", list(bad_files()))
def test_bad_files_are_refused_naming_the_problem(tmp_path, name):
    arrays, match = bad_files()[name]
    path = tmp_path / f"{name}.npz"
    np.savez(path, **{k: np.asarray(v) for k, v in arrays.items()})
    with pytest.raises(ValueError, match=match):
        check_topology(f"file:{path}", 4)


def test_missing_unreadable_and_other_node_count_files(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        check_topology(f"file:{tmp_path / 'none.npz'}", 4)
    (tmp_path / "text.npz").write_text("not an archive")
    with pytest.raises(ValueError, match="not a readable .npz"):
        check_topology(f"file:{tmp_path / 'text.npz'}", 4)
    np.savez(tmp_path / "ring.npz", matrix=jg.topology.ring(5).matrix())
    with pytest.raises(ValueError, match="graph of 5 nodes, but num_nodes=4"):
        check_topology(f"file:{tmp_path / 'ring.npz'}", 4)


def test_a_command_runs_on_a_file_and_refuses_a_bad_one_with_exit_2(tmp_path, capsys):
    path = tmp_path / "topology.npz"
    save_topology(jg.design.fastest_mixing(jg.topology.erdos_renyi(8, 0.4, seed=1)).topology, str(path))
    argv = ["consensus", f"--topology=file:{path}", "--algorithm=gossip", "--shape=4", "--num_steps=20"]
    assert main([*argv, "--num_nodes=8", "--out", str(tmp_path / "ok")]) == 0
    capsys.readouterr()
    assert main([*argv, "--num_nodes=9", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "graph of 8 nodes, but num_nodes=9" in err
