"""Communication algorithms and their registry.

Every algorithm is a factory ``name(topology, **hyperparameters) -> GossipAlgorithm`` in its own
file; adding it to :data:`REGISTRY` enrolls it in the shared test suite and the CLI.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from jaxgossip.algorithms.allreduce import allreduce
from jaxgossip.algorithms.choco import choco
from jaxgossip.algorithms.deepsqueeze import deepsqueeze
from jaxgossip.algorithms.gossip import gossip
from jaxgossip.algorithms.merge import make_merge, merge
from jaxgossip.algorithms.power_gossip import power_gossip
from jaxgossip.algorithms.push_sum import push_sum
from jaxgossip.algorithms.scsp import scsp
from jaxgossip.algorithms.sparse_push import sparse_push
from jaxgossip.topology import Topology
from jaxgossip.types import GossipAlgorithm

REGISTRY: dict[str, Callable[..., GossipAlgorithm]] = {
    "gossip": gossip,
    "allreduce": allreduce,
    "choco": choco,
    "deepsqueeze": deepsqueeze,
    "power_gossip": power_gossip,
    "push_sum": push_sum,
    "sparse_push": sparse_push,
    "scsp": scsp,
}


def make(name: str, topology: Topology, **hyperparameters) -> GossipAlgorithm:
    """Builds the registered algorithm ``name`` on ``topology``.

    Raises:
      ValueError: unknown name (the message lists the known ones).
      TypeError: a hyperparameter the algorithm does not take (the message lists the ones it does).
    """
    if name not in REGISTRY:
        raise ValueError(f"unknown algorithm {name!r}; known algorithms: {sorted(REGISTRY)}")
    factory = REGISTRY[name]
    accepted = [p for p in inspect.signature(factory).parameters if p != "topology"]
    unknown = sorted(set(hyperparameters) - set(accepted))
    if unknown:
        raise TypeError(f"algorithm {name!r} does not take {unknown}; it takes {accepted}")
    return factory(topology, **hyperparameters)


__all__ = [
    "REGISTRY",
    "make",
    "gossip",
    "allreduce",
    "choco",
    "deepsqueeze",
    "power_gossip",
    "push_sum",
    "sparse_push",
    "scsp",
    "merge",
    "make_merge",
]
