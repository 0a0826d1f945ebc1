"""Communication algorithms and their registry.

Every algorithm is a factory ``name(topology, **hyperparameters) -> GossipAlgorithm`` in its own
file, next to its metadata ``INFO`` (:class:`~jaxgossip.types.AlgorithmInfo`); one line below
registers it, which enrolls it in the shared test suite, the CLI, sweeps and the cost model. An
algorithm outside the package is registered with :func:`register` or named by an import path
``"package.module:factory"`` (README, section "Adding an algorithm").
"""

from __future__ import annotations

from jaxgossip.algorithms import allreduce as _allreduce
from jaxgossip.algorithms import choco as _choco
from jaxgossip.algorithms import deepsqueeze as _deepsqueeze
from jaxgossip.algorithms import gossip as _gossip
from jaxgossip.algorithms import power_gossip as _power_gossip
from jaxgossip.algorithms import push_sum as _push_sum
from jaxgossip.algorithms import scsp as _scsp
from jaxgossip.algorithms import sparse_push as _sparse_push
from jaxgossip.algorithms.allreduce import allreduce
from jaxgossip.algorithms.choco import choco
from jaxgossip.algorithms.deepsqueeze import deepsqueeze
from jaxgossip.algorithms.gossip import gossip
from jaxgossip.algorithms.merge import make_merge, merge
from jaxgossip.algorithms.power_gossip import power_gossip
from jaxgossip.algorithms.push_sum import push_sum
from jaxgossip.algorithms.registry import INFOS, REGISTRY, check_graph, info, make, register, resolve
from jaxgossip.algorithms.scsp import scsp
from jaxgossip.algorithms.sparse_push import sparse_push
from jaxgossip.types import AlgorithmInfo

from jaxgossip.algorithms import registry  # noqa: E402

for _module in (_gossip, _allreduce, _choco, _deepsqueeze, _power_gossip, _push_sum, _sparse_push, _scsp):
    registry._register_builtin(_module.__name__.rpartition(".")[2], _module.INFO)

__all__ = [
    "REGISTRY",
    "INFOS",
    "AlgorithmInfo",
    "make",
    "register",
    "info",
    "resolve",
    "check_graph",
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
