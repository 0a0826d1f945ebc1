"""Shared fixtures and compile settings. 8 CPU devices are requested before any JAX operation so
that sharding tests can run on a CPU-only machine. Shared NumPy references and builders live in ``_reference.py``,
the tiny training configuration in ``tiny.py`` (both importable: pytest puts ``tests/`` on
``sys.path``)."""

import os

import jax

jax.config.update("jax_num_cpu_devices", 8)

# Compile time is most of this suite's time: in-process tests compile without XLA's expensive
# backend (LLVM) optimizations (full suite on 2 cores: 12:40 -> ~9:30). HLO passes (fusion, layout)
# still run; results agree with the optimized programs to float32 round-off. Subprocess tests
# (multi-process runs, SIGKILL-and-resume, CLI commands) inherit no such setting, so bitwise claims
# are checked on fully optimized programs; JAXGOSSIP_TEST_OPTIMIZE=1 compiles everything that way.
FULLY_OPTIMIZED = os.environ.get("JAXGOSSIP_TEST_OPTIMIZE", "0") == "1"
if not FULLY_OPTIMIZED:
    jax.config.update("jax_disable_most_optimizations", True)

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def rng():
    """A fresh ``default_rng(0)`` per test."""
    return np.random.default_rng(0)


@pytest.fixture
def fully_optimized():
    """This test's programs compiled with all of XLA's optimizations, as a user's run: for tests that
    compare this process's results bitwise with those of subprocesses (which compile that way)."""
    # The setting is not part of jit's cache key: drop what this worker compiled before and after.
    jax.clear_caches()
    jax.config.update("jax_disable_most_optimizations", False)
    yield
    jax.config.update("jax_disable_most_optimizations", not FULLY_OPTIMIZED)
    jax.clear_caches()
