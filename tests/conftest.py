"""Shared fixtures. 8 CPU devices are requested before any JAX operation so that sharding tests
can run on a CPU-only machine. Shared NumPy references and builders live in ``_reference.py``,
the tiny training configuration in ``tiny.py`` (both importable: pytest puts ``tests/`` on
``sys.path``)."""

import jax

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def rng():
    """A fresh ``default_rng(0)`` per test."""
    return np.random.default_rng(0)
