"""Asynchronous execution: every node on its own simulated clock, no rounds.

* :mod:`~jaxgossip.engine.asynchronous.rules`: the update rules (``ad_psgd``, ``async_gossip``,
  ``async_sgp``), their schedule on the clock and ``run_async_optimization``; its public names are
  re-exported here;
* :mod:`~jaxgossip.engine.asynchronous.waves`: the host planning of a run (stale versions, delayed
  messages, commuting events packed into waves);
* :mod:`~jaxgossip.engine.asynchronous.training`: the asynchronous trainer (``make_async_train``,
  ``--execution=async``).
"""

from jaxgossip.engine.asynchronous.rules import *  # noqa: F403  (the rules' public names, listed there)
from jaxgossip.engine.asynchronous.rules import __all__  # noqa: F401
