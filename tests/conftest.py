"""Shared fixtures and compile settings. 8 CPU devices are requested before any JAX operation so
that sharding tests can run on a CPU-only machine. Shared NumPy references and builders live in ``_reference.py``,
the tiny training configuration in ``tiny.py`` (both importable: pytest puts ``tests/`` on
``sys.path``)."""

import os

import jax

jax.config.update("jax_num_cpu_devices", 8)

# Compile time is most of this suite's time: in-process tests compile without XLA's expensive
# backend (LLVM) optimizations (default suite on 2 cores: 12:39 -> 8:07-9:16). HLO passes (fusion,
# layout) still run; results agree with the optimized programs to float32 round-off, though not
# always bitwise (a 2-process run and a 1-process run differ in the last bit at this setting).
# So a test comparing bitwise with subprocesses compiles both sides alike: the subprocess like
# this one (_reference.fast_compile_env: SIGKILL-and-resume) or this one fully optimized (the
# `fully_optimized` fixture: the multi-process run, whose workers compile fully).
# JAXGOSSIP_TEST_OPTIMIZE=1 compiles everything fully.
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
