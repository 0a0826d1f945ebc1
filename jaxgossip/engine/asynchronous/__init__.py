"""Asynchronous execution: every node on its own simulated clock, no rounds.

* :mod:`~jaxgossip.engine.asynchronous.rules`: the update rules (``ad_psgd``, ``async_gossip``,
  ``async_sgp``), their schedule on the clock and ``run_async_optimization``; its public names are
  re-exported here;
* :mod:`~jaxgossip.engine.asynchronous.waves`: the host planning of a run (stale versions, delayed
  messages, commuting events packed into waves);
* :mod:`~jaxgossip.engine.asynchronous.training`: the asynchronous trainer (``make_async_train``,
  ``--execution=async``).
"""

from jaxgossip.engine.asynchronous.rules import (
    ALGORITHMS,
    ADPSGDState,
    AsyncGossipState,
    AsyncPlan,
    AsyncResult,
    AsyncSchedule,
    AsyncSGPState,
    WaveStats,
    WaveTables,
    async_schedule,
    check_async_graph,
    event_bits,
    init_async_state,
    make_wave,
    message_bits,
    neighbor_table,
    node_models,
    plan_async,
    resolve_algorithm,
    run_async_optimization,
    step_durations,
)

__all__ = [
    "ALGORITHMS",
    "AsyncSchedule",
    "WaveStats",
    "AsyncResult",
    "ADPSGDState",
    "AsyncGossipState",
    "AsyncSGPState",
    "resolve_algorithm",
    "neighbor_table",
    "step_durations",
    "async_schedule",
    "WaveTables",
    "AsyncPlan",
    "check_async_graph",
    "plan_async",
    "event_bits",
    "init_async_state",
    "make_wave",
    "message_bits",
    "node_models",
    "run_async_optimization",
]
