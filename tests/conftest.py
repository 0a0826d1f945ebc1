"""Shared fixtures. 8 CPU devices are requested before any JAX operation so that sharding tests
can run on a CPU-only machine."""

import jax

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def key():
    return jax.random.key(0)


@pytest.fixture
def num_nodes():
    return 8


@pytest.fixture
def rng():
    return np.random.default_rng(0)
