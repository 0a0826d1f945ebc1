"""jaxgossip: decentralized (gossip) deep learning simulated on one accelerator.

All N workers live in one stacked pytree (leaves ``[N, ...]``); local work is ``vmap``ped and
communication is a kernel on the node axis.

This is the public surface: what the README and docs/ use in Python. The rooms behind it are
``topology``, ``algorithms``, ``compress``, ``data``, ``models``, ``ops`` (kernels), ``sim`` (clock,
cost, memory), ``engine`` (runs), ``run`` (configured runs, files) and ``cli``
(docs/architecture.md).
"""

from jaxgossip import algorithms, compress, design, topology
from jaxgossip.engine import problems, rounds
from jaxgossip.engine.asynchronous import run_async_optimization
from jaxgossip.engine.asynchronous.training import make_async_train
from jaxgossip.engine.consensus import ConsensusResult, consensus_scan, run_consensus
from jaxgossip.engine.optimization import OptimizationResult, optimization_scan, run_optimization
from jaxgossip.engine.sweeps import sweep_consensus, sweep_topologies
from jaxgossip.engine.training import Trainer, make_train
from jaxgossip.engine.tuning import GammaTuning, tune_gamma
from jaxgossip.models.adapters import ModelFns
from jaxgossip.ops.mixing import consensus_distance, mix, node_mean
from jaxgossip.sim import cost
from jaxgossip.sim.network import Network
from jaxgossip.sim.timing import time_model
from jaxgossip.types import (
    AlgorithmInfo,
    AsyncForm,
    CostFacts,
    Execution,
    GossipAlgorithm,
    GraphNeeds,
    StepInfo,
    SweepFacts,
    TrainerHooks,
)

__version__ = "0.1.0"

__all__ = [
    "algorithms",
    "compress",
    "design",
    "cost",
    "Network",
    "time_model",
    "problems",
    "rounds",
    "topology",
    "mix",
    "node_mean",
    "consensus_distance",
    "run_consensus",
    "consensus_scan",
    "ConsensusResult",
    "run_optimization",
    "optimization_scan",
    "OptimizationResult",
    "tune_gamma",
    "GammaTuning",
    "make_train",
    "Trainer",
    "ModelFns",
    "sweep_consensus",
    "sweep_topologies",
    "make_async_train",
    "run_async_optimization",
    "GossipAlgorithm",
    "AlgorithmInfo",
    "GraphNeeds",
    "CostFacts",
    "SweepFacts",
    "TrainerHooks",
    "Execution",
    "AsyncForm",
    "StepInfo",
    "__version__",
]
