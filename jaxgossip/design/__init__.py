"""Designing graphs and weights: mixing weights of least SLEM on a given graph, and sparse graphs
learned from the nodes' label distributions.

* :mod:`~jaxgossip.design.weights`: ``fastest_mixing`` (the fastest-mixing Markov chain,
  and with ``nonnegative=False`` the fastest distributed linear averaging iteration), returning a
  :class:`Design`;
* :mod:`~jaxgossip.design.support`: the undirected support of a graph and the classical
  weightings on it (Metropolis-Hastings, max-degree, best constant), ``slem``;
* :mod:`~jaxgossip.design.hyperparameters`: ``tune_by_gradient``, gamma, step-size schedules or
  mixing weights that minimise a scalar of a run, by differentiating through it;
* :mod:`~jaxgossip.design.schedule`: ``consensus_weights``, the weights of a T-periodic schedule
  (or of one static graph) of least consensus error after R rounds, by gradient through the rounds
  (a :class:`ScheduleDesign`);
* :mod:`~jaxgossip.design.heterogeneity`: ``learn_topology``, a doubly stochastic graph of
  in-degree at most d whose neighbourhoods see the global label distribution (a
  :class:`LearnedTopology`).

Host-side and pure: a design reads a :class:`~jaxgossip.topology.Topology` and returns an ordinary
one, usable by every algorithm and command.
"""

from jaxgossip.design.heterogeneity import (
    LearnedTopology,
    label_proportions,
    learn_topology,
    neighbourhood_heterogeneity,
)
from jaxgossip.design.hyperparameters import HyperparameterFit, tune_by_gradient
from jaxgossip.design.schedule import ScheduleDesign, consensus_weights, schedule_error, schedule_supports
from jaxgossip.design.support import (
    best_constant_weights,
    laplacian,
    max_degree_weights,
    metropolis_edge_weights,
    mixing_matrix,
    slem,
    symmetric_weights,
    topology_slem,
    undirected_edges,
    weighted_topology,
)
from jaxgossip.design.weights import Design, fastest_mixing

__all__ = [
    "Design",
    "fastest_mixing",
    "undirected_edges",
    "laplacian",
    "mixing_matrix",
    "slem",
    "max_degree_weights",
    "metropolis_edge_weights",
    "best_constant_weights",
    "weighted_topology",
    "symmetric_weights",
    "topology_slem",
    "ScheduleDesign",
    "consensus_weights",
    "schedule_error",
    "schedule_supports",
    "LearnedTopology",
    "learn_topology",
    "label_proportions",
    "neighbourhood_heterogeneity",
    "HyperparameterFit",
    "tune_by_gradient",
]
