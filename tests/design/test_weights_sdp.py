"""fastest_mixing against a semidefinite solver (cvxpy, an optional test extra): the same optimum
within 0.5% on path, cycle, grid, Petersen and random graphs, for the chain and for FDLA."""

import importlib.util
import pathlib
import sys

import networkx as nx
import pytest

import jaxgossip as jg
from jaxgossip.design import fastest_mixing

cp = pytest.importorskip("cvxpy")


def _load_sdp_slem():
    """The SDP of experiments/bench/design_vs_sdp.py (one formulation for the benchmark and the test)."""
    path = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "bench" / "design_vs_sdp.py"
    sys.path.insert(0, str(path.parent))  # the script imports its sibling _benchlib
    spec = importlib.util.spec_from_file_location("design_vs_sdp", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.sdp_slem


sdp_optimum = _load_sdp_slem()


GRAPHS = {
    "path": lambda: jg.topology.chain(9),
    "cycle": lambda: jg.topology.ring(10),
    "grid": lambda: jg.topology.from_adjacency(nx.convert_node_labels_to_integers(nx.grid_2d_graph(3, 4))),
    "petersen": lambda: jg.topology.from_adjacency(nx.petersen_graph()),
    "random": lambda: jg.topology.erdos_renyi(14, 0.3, seed=5),
}


@pytest.mark.parametrize("nonnegative", [True, False])
@pytest.mark.parametrize("name", list(GRAPHS))
def test_slem_matches_the_sdp_optimum(name, nonnegative):
    topo = GRAPHS[name]()
    design = fastest_mixing(topo, nonnegative=nonnegative)
    optimum = sdp_optimum(design.edges, topo.num_nodes, nonnegative)
    assert abs(design.slem - optimum) <= 0.005 * optimum
    # the barrier method is the more accurate of the two: never above the SDP solver's value by
    # more than that solver's own tolerance
    assert design.slem <= optimum + 1e-6
