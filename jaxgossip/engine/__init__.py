"""The engine: one round driver (``rounds``) that consensus (``consensus``), optimization
(``optimization``) and training (``training``, ``local_step``, ``outer``) share, sweeps in one
compile (``sweeps``, ``tuning``), test problems (``problems``) and asynchronous execution on a
simulated clock (``asynchronous/``: its rules, their host planning in waves, its trainer).
It runs algorithms on graphs and data; it never reads a configuration (that is ``jaxgossip.run``)."""
