"""Asynchronous execution: every node on its own simulated clock, no rounds.

* :mod:`~jaxgossip.engine.asynchronous.rules`: the event rules of the asynchronous forms
  (``ad_psgd``, ``async_gossip``, ``async_sgp``) and ``run_async_optimization``;
* :mod:`~jaxgossip.engine.asynchronous.planning`: the host plan of a run (the form and its graph,
  the schedule of events on the clock, link delays, the per-event tables of the waves, bits);
* :mod:`~jaxgossip.engine.asynchronous.exchanges`: AD-PSGD's priced exchanges (busy nodes, the
  link time both ways);
* :mod:`~jaxgossip.engine.asynchronous.churn`: the online mask on the clock (``--time.availability``);
* :mod:`~jaxgossip.engine.asynchronous.rates`: the nodes' step rates and the rate-compensated rule;
* :mod:`~jaxgossip.engine.asynchronous.waves`: stale versions, delayed messages and the packing of
  commuting events into waves;
* :mod:`~jaxgossip.engine.asynchronous.training`: the asynchronous trainer (``make_async_train``,
  ``--execution=async``).

The public names of ``rules``, ``planning`` and ``rates`` are re-exported here.
"""

from jaxgossip.engine.asynchronous.planning import *  # noqa: F403  (the plan's public names, listed there)
from jaxgossip.engine.asynchronous.planning import __all__ as planning_names
from jaxgossip.engine.asynchronous.rates import *  # noqa: F403  (the rates' public names, listed there)
from jaxgossip.engine.asynchronous.rates import __all__ as rates_names
from jaxgossip.engine.asynchronous.rules import *  # noqa: F403  (the rules' public names, listed there)
from jaxgossip.engine.asynchronous.rules import __all__ as rules_names

__all__ = [*planning_names, *rates_names, *rules_names]
