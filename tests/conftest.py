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

# XLA:CPU's classic (LLVM IR) fusion emitters compile the suite's small programs about 2.5 times
# faster than its default MLIR fusion emitters (four test trainers: 3.3 s -> 1.3 s of XLA compile),
# with results equal to float32 round-off. Put in this process's XLA_FLAGS before the CPU backend
# starts, so the subprocesses that inherit the environment compile alike (and
# _reference.fast_compile_vars adds it to an environment built from scratch). Off with
# JAXGOSSIP_TEST_OPTIMIZE=1, which compiles as a user's run does.
CLASSIC_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
if not FULLY_OPTIMIZED and "xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {CLASSIC_EMITTERS}".strip()

# With JAXGOSSIP_TEST_COMPILE_CACHE=1, compiled programs are shared across the tests, the xdist
# workers and the CLI subprocesses they start, through JAX's persistent compilation cache. It keys on
# the settings the suite changes (tests/project/test_compile_cache.py). The folder persists between runs
# (under .cache/, ignored by git) and is emptied when it outgrows _CACHE_LIMIT. It is off by default: with a warm cache,
# tests/engine/test_train.py::test_training_sharded_over_8_devices_equals_one_device[sparse_push] diverges
# (8 CPU devices, one node each); cold it equals the one-device run. It is not the project's native
# kernels (it happens with JAXGOSSIP_NATIVE=0 too, and with XLA:CPU's default emitters): an executable
# loaded from the cache is not the one a compile gives for that program. The library never turns the
# cache on.
_CACHE_LIMIT = 2 * 1024**3
if os.environ.get("JAXGOSSIP_TEST_COMPILE_CACHE", "0") == "1":
    _cache = os.environ.setdefault(
        "JAX_COMPILATION_CACHE_DIR",
        os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "jax-test-compiles"),
    )
    # Read by the subprocesses' JAX (their config comes from the environment) and set here for this one.
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    jax.config.update("jax_compilation_cache_dir", _cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import numpy as np  # noqa: E402
import pytest  # noqa: E402


def pytest_sessionstart(session):
    """Empties the compilation cache folder when it has outgrown its limit (the controlling process
    only, before any worker compiles)."""
    folder = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if not folder or hasattr(session.config, "workerinput") or not os.path.isdir(folder):
        return
    size = sum(entry.stat().st_size for entry in os.scandir(folder) if entry.is_file())
    if size > _CACHE_LIMIT:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


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


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    """A folder on ``sys.path`` holding the README's plug-in as ``my_file.py`` (import path
    ``my_file:damped_gossip``), for one test module."""
    import importlib
    import sys

    from _reference import readme_plugin

    folder = tmp_path_factory.mktemp("plugin")
    (folder / "my_file.py").write_text(readme_plugin())
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    yield folder
    sys.path.remove(str(folder))
    sys.modules.pop("my_file", None)
