"""Communication graphs as index arrays with weights (sparse mixing matrices).

* :mod:`~jaxgossip.topology.graph`: the :class:`Topology` pytree (one type for a single graph, a
  stack of graphs, and a member with traced tables);
* :mod:`~jaxgossip.topology.constructors`: ring, torus, exponential, ..., ``from_adjacency``,
  ``from_matrix``, ``schedule``;
* :mod:`~jaxgossip.topology.spectral`: ``spectral_gap``, ``optimal_gamma``;
* :mod:`~jaxgossip.topology.specs`: spec strings (``make``) and the public ``FAMILIES``;
* :mod:`~jaxgossip.topology.stack`: stacking graphs of one shape for one compile;
* :mod:`~jaxgossip.topology.stochastic`: graphs drawn every round inside the run
  (``random_matching``, ``random_out``, ``with_failures``).
"""

from jaxgossip.topology.constructors import (
    WEIGHT_SCHEMES,
    complete,
    directed_ring,
    erdos_renyi,
    exponential,
    from_adjacency,
    from_matrix,
    hypercube,
    one_peer_exponential,
    random_directed,
    ring,
    schedule,
    star,
    torus,
)
from jaxgossip.topology.graph import KERNELS, GraphRound, Topology, TopologyKey
from jaxgossip.topology.specs import FAMILIES, make
from jaxgossip.topology.spectral import optimal_gamma, spectral_gap
from jaxgossip.topology.stack import buckets, group, signature, stack
from jaxgossip.topology.stochastic import (
    expected_gram,
    mean_out_degree,
    random_matching,
    random_out,
    sample_matrices,
    with_failures,
)

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
    "from_adjacency",
    "from_matrix",
    "schedule",
    "random_matching",
    "random_out",
    "with_failures",
    "GraphRound",
    "sample_matrices",
    "expected_gram",
    "mean_out_degree",
    "spectral_gap",
    "optimal_gamma",
    "WEIGHT_SCHEMES",
    "KERNELS",
    "FAMILIES",
    "make",
    "signature",
    "group",
    "buckets",
    "stack",
]
