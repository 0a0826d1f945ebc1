"""Communication graphs as index arrays with weights (sparse mixing matrices).

* :mod:`~jaxgossip.topology.graph`: the :class:`Topology` pytree (one type for a single graph, a
  stack of graphs, and a member with traced tables);
* :mod:`~jaxgossip.topology.constructors`: ring, torus, exponential, ..., ``from_adjacency``,
  ``from_matrix``, ``schedule``;
* :mod:`~jaxgossip.topology.spectral`: ``spectral_gap``, ``optimal_gamma``;
* :mod:`~jaxgossip.topology.specs`: spec strings (``make``) and the public ``FAMILIES``;
* :mod:`~jaxgossip.topology.stack`: stacking graphs of one shape for one compile;
* :mod:`~jaxgossip.topology.stochastic`: graphs drawn every round inside the run
  (``random_matching``, ``random_out``, ``with_failures``);
* :mod:`~jaxgossip.topology.random_spectra`: what a drawn graph does in expectation
  (``expected_gram``, ``exact_gram``, ``expected_gap``, ``mean_out_degree``);
* :mod:`~jaxgossip.topology.finite_time`: the Base-(k+1) graph (exact averaging after one period);
* :mod:`~jaxgossip.topology.equitopo`: EquiTopo (``d_equistatic``, ``u_equistatic``,
  ``od_equidyn``, ``ou_equidyn``);
* :mod:`~jaxgossip.topology.trees`: ``chain``, ``binary_tree``, ``spanning_tree``, ``dumbbell``.
"""

from jaxgossip.topology.constructors import (
    WEIGHT_SCHEMES,
    complete,
    directed_ring,
    erdos_renyi,
    exponential,
    from_adjacency,
    from_matrix,
    from_weights,
    hypercube,
    one_peer_exponential,
    random_directed,
    ring,
    schedule,
    star,
    torus,
)
from jaxgossip.topology.equitopo import d_equistatic, od_equidyn, ou_equidyn, u_equistatic
from jaxgossip.topology.failures import with_availability, with_failures
from jaxgossip.topology.finite_time import base_graph
from jaxgossip.topology.graph import KERNELS, GraphRound, Topology, TopologyKey
from jaxgossip.topology.random_spectra import (
    ExchangeableGram,
    GapEstimate,
    exact_gram,
    expected_gap,
    expected_gram,
    mean_out_degree,
    sample_matrices,
)
from jaxgossip.topology.specs import FAMILIES, check_spec, make
from jaxgossip.topology.spectral import (
    NeighborsEstimate,
    effective_neighbors,
    gap_estimate,
    neighbors_estimate,
    optimal_gamma,
    spectral_gap,
)
from jaxgossip.topology.stack import buckets, group, signature, stack
from jaxgossip.topology.stochastic import random_matching, random_out
from jaxgossip.topology.trees import binary_tree, chain, dumbbell, spanning_tree

__all__ = [
    "Topology",
    "TopologyKey",
    "ring",
    "directed_ring",
    "torus",
    "hypercube",
    "exponential",
    "one_peer_exponential",
    "complete",
    "star",
    "erdos_renyi",
    "random_directed",
    "base_graph",
    "chain",
    "binary_tree",
    "dumbbell",
    "spanning_tree",
    "d_equistatic",
    "u_equistatic",
    "od_equidyn",
    "ou_equidyn",
    "from_adjacency",
    "from_matrix",
    "from_weights",
    "schedule",
    "random_matching",
    "random_out",
    "with_failures",
    "with_availability",
    "GraphRound",
    "sample_matrices",
    "expected_gram",
    "mean_out_degree",
    "spectral_gap",
    "gap_estimate",
    "GapEstimate",
    "ExchangeableGram",
    "exact_gram",
    "expected_gap",
    "effective_neighbors",
    "neighbors_estimate",
    "NeighborsEstimate",
    "optimal_gamma",
    "WEIGHT_SCHEMES",
    "KERNELS",
    "FAMILIES",
    "make",
    "check_spec",
    "signature",
    "group",
    "buckets",
    "stack",
]
