"""Communication algorithms and their registry.

Every algorithm is a factory ``name(topology, **hyperparameters) -> GossipAlgorithm`` in its own
file, next to its metadata ``INFO`` (:class:`~jaxgossip.types.AlgorithmInfo`, one group of facts
per reader); one line below registers it, which enrolls it in the shared test suite, the CLI,
sweeps and the cost model, and its asynchronous forms in :data:`ASYNC_FORMS`. An
algorithm outside the package is registered with :func:`register` or named by an import path
``"package.module:factory"`` (README, section "Adding an algorithm").

The pieces the algorithm modules share live in the private sub-package ``_shared``; what other
rooms use of them is re-exported here: :class:`Received` (what a receiver reads per in-neighbour
slot, the argument of a metadata's ``receive`` round), :func:`oriented_pairs`, :func:`pair_tables`
and :func:`pair_round` (the per-pair tables of edge-wise algorithms), :func:`tree_tables` (the
directed-edge tables of a tree).
"""

from __future__ import annotations

from jaxgossip.algorithms import allreduce as _allreduce
from jaxgossip.algorithms import choco as _choco
from jaxgossip.algorithms import clipped_gossip as _clipped_gossip
from jaxgossip.algorithms import d2 as _d2
from jaxgossip.algorithms import deepsqueeze as _deepsqueeze
from jaxgossip.algorithms import demo_momentum as _demo_momentum
from jaxgossip.algorithms import gossip as _gossip
from jaxgossip.algorithms import gradient_tracking as _gradient_tracking
from jaxgossip.algorithms import median as _median
from jaxgossip.algorithms import moniqua as _moniqua
from jaxgossip.algorithms import power_gossip as _power_gossip
from jaxgossip.algorithms import push_sum as _push_sum
from jaxgossip.algorithms import qgm as _qgm
from jaxgossip.algorithms import relaysgd as _relaysgd
from jaxgossip.algorithms import relaysum_grad as _relaysum_grad
from jaxgossip.algorithms import scsp as _scsp
from jaxgossip.algorithms import sparse_push as _sparse_push
from jaxgossip.algorithms import sparta as _sparta
from jaxgossip.algorithms import trimmed_mean as _trimmed_mean
from jaxgossip.algorithms._shared.messages import Received
from jaxgossip.algorithms._shared.pair_tables import oriented_pairs, pair_round, pair_tables
from jaxgossip.algorithms._shared.tree_tables import tree_tables
from jaxgossip.algorithms.allreduce import allreduce
from jaxgossip.algorithms.byzantine import (
    ATTACKS,
    ByzantineState,
    attackers,
    byzantine,
    honest_consensus_distance,
    honest_mask,
    honest_mean,
)
from jaxgossip.algorithms.choco import choco
from jaxgossip.algorithms.clipped_gossip import clipped_gossip
from jaxgossip.algorithms.d2 import d2
from jaxgossip.algorithms.deepsqueeze import deepsqueeze
from jaxgossip.algorithms.demo_momentum import demo_momentum
from jaxgossip.algorithms.gossip import gossip
from jaxgossip.algorithms.gradient_tracking import gradient_tracking
from jaxgossip.algorithms.median import median
from jaxgossip.algorithms.merge import make_merge, merge
from jaxgossip.algorithms.moniqua import moniqua
from jaxgossip.algorithms.power_gossip import power_gossip
from jaxgossip.algorithms.push_sum import push_sum
from jaxgossip.algorithms.qgm import qgm
from jaxgossip.algorithms.registry import (
    ASYNC_FORMS,
    INFOS,
    REGISTRY,
    check_execution,
    check_graph,
    info,
    make,
    register,
    register_builtin,
    resolve,
    sign,
    unregister,
)
from jaxgossip.algorithms.relaysgd import relaysgd
from jaxgossip.algorithms.relaysum_grad import relaysum_grad
from jaxgossip.algorithms.scsp import scsp
from jaxgossip.algorithms.sparse_push import sparse_push
from jaxgossip.algorithms.sparta import sparta
from jaxgossip.algorithms.trimmed_mean import trimmed_mean
from jaxgossip.types import (
    AlgorithmInfo,
    AsyncForm,
    CostFacts,
    Execution,
    GraphNeeds,
    SweepFacts,
    TrainerHooks,
)

# One line per algorithm: its name and the metadata its file declares next to the factory.
register_builtin("gossip", _gossip.INFO)
register_builtin("allreduce", _allreduce.INFO)
register_builtin("choco", _choco.INFO)
register_builtin("deepsqueeze", _deepsqueeze.INFO)
register_builtin("power_gossip", _power_gossip.INFO)
register_builtin("push_sum", _push_sum.INFO)
register_builtin("sparse_push", _sparse_push.INFO)
register_builtin("scsp", _scsp.INFO)
register_builtin("gradient_tracking", _gradient_tracking.INFO)
register_builtin("d2", _d2.INFO)
register_builtin("qgm", _qgm.INFO)
register_builtin("moniqua", _moniqua.INFO)
register_builtin("clipped_gossip", _clipped_gossip.INFO)
register_builtin("trimmed_mean", _trimmed_mean.INFO)
register_builtin("median", _median.INFO)
register_builtin("relaysgd", _relaysgd.INFO)
register_builtin("relaysum_grad", _relaysum_grad.INFO)
register_builtin("sparta", _sparta.INFO)
register_builtin("demo_momentum", _demo_momentum.INFO)

__all__ = [
    "REGISTRY",
    "INFOS",
    "AlgorithmInfo",
    "GraphNeeds",
    "CostFacts",
    "SweepFacts",
    "TrainerHooks",
    "Execution",
    "AsyncForm",
    "ASYNC_FORMS",
    "make",
    "register",
    "unregister",
    "info",
    "resolve",
    "check_graph",
    "check_execution",
    "sign",
    "gossip",
    "allreduce",
    "choco",
    "deepsqueeze",
    "power_gossip",
    "push_sum",
    "sparse_push",
    "scsp",
    "gradient_tracking",
    "d2",
    "qgm",
    "moniqua",
    "clipped_gossip",
    "trimmed_mean",
    "median",
    "relaysgd",
    "relaysum_grad",
    "sparta",
    "demo_momentum",
    "byzantine",
    "attackers",
    "honest_mask",
    "honest_mean",
    "honest_consensus_distance",
    "ATTACKS",
    "ByzantineState",
    "merge",
    "make_merge",
    "Received",
    "oriented_pairs",
    "pair_tables",
    "pair_round",
    "tree_tables",
]
