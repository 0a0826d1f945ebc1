"""The edge of jaxgossip: everything that reads or writes files, parses configs or prints.

* :mod:`~jaxgossip.run.config`, :mod:`~jaxgossip.run.parsing`, :mod:`~jaxgossip.run.config_files`:
  the training config, its checks, ``--key=value`` options and config files;
* :mod:`~jaxgossip.run.runner`: builds a run from a config and trains it in chunks (progress bar,
  checkpoints, metrics files); :mod:`~jaxgossip.run.checkpoint`: orbax checkpoints and resume;
* :mod:`~jaxgossip.run.distributed`, :mod:`~jaxgossip.run.launch`: multi-process start-up and the
  local launcher;
* :mod:`~jaxgossip.run.metric_writers`, :mod:`~jaxgossip.run.plots`,
  :mod:`~jaxgossip.run.cost_report`, :mod:`~jaxgossip.run.watchdog`,
  :mod:`~jaxgossip.run.training_sweeps` (a config's training sweeps in one compile): what a run
  reports.

The core (``jaxgossip`` outside ``run`` and ``cli``) never imports this package; the command line
(:mod:`jaxgossip.cli`) is built on it.
"""
