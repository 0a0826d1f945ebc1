"""Kernels and backends on the node axis: mixing ``x <- W(t) x`` (``mixing``), the node axis over
devices (``sharding``), number formats of compute and messages (``precision``) and the choice of
platform and program form (``platforms``). Below the algorithms: nothing here knows one."""
