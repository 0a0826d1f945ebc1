"""The node axis sharded over 8 (CPU) devices gives the same mixing and consensus results as one
device. tests/conftest.py requests 8 CPU devices before JAX starts."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxgossip as jg
from jaxgossip import algorithms
from jaxgossip import topology as T

NUM_DEVICES = 8

pytestmark = pytest.mark.skipif(
    len(jax.devices()) < NUM_DEVICES,
    reason=f"needs {NUM_DEVICES} devices (conftest sets jax_num_cpu_devices=8; got {len(jax.devices())})",
)

TOPOLOGIES = {
    "ring8": lambda: T.ring(8),
    "one_peer16": lambda: T.one_peer_exponential(16),
    "complete8_dense": lambda: dataclasses.replace(T.complete(8), kernel="dense"),
}


def node_sharding():
    mesh = Mesh(np.array(jax.devices()[:NUM_DEVICES]), ("nodes",))
    return NamedSharding(mesh, P("nodes"))


def make_x(n, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "w": jnp.asarray(rng.normal(size=(n, 4, 3)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(n, 6)), jnp.float32),
    }


def shard(tree):
    sharding = node_sharding()
    return jax.tree_util.tree_map(lambda leaf: jax.device_put(leaf, sharding), tree)


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_mix_sharded_matches_single_device(name):
    topo = TOPOLOGIES[name]()
    x = make_x(topo.num_nodes)
    xs = shard(x)
    assert len(xs["w"].sharding.device_set) == NUM_DEVICES
    mix = jax.jit(lambda x, t: jg.mix(topo, x, t))
    for t in range(topo.period + 1):
        single = mix(x, jnp.int32(t))
        sharded = mix(xs, jnp.int32(t))
        leaves = zip(*(jax.tree_util.tree_leaves(tree) for tree in (sharded, single, x)))
        for a, b, leaf in leaves:
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
            want = (topo.matrix(t) @ np.asarray(leaf, np.float64).reshape(leaf.shape[0], -1)).reshape(leaf.shape)
            np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_run_consensus_gossip_sharded_matches_single_device(name):
    topo = TOPOLOGIES[name]()
    alg = algorithms.make("gossip", topo, gamma=1.0)
    x0 = make_x(topo.num_nodes, seed=1)
    single = jg.run_consensus(alg, x0, 12, jax.random.key(0))
    sharded = jg.run_consensus(alg, shard(x0), 12, jax.random.key(0))
    np.testing.assert_allclose(sharded.error, single.error, rtol=1e-5, atol=1e-9)
    np.testing.assert_array_equal(sharded.bits, single.bits)
    for a, b in zip(jax.tree_util.tree_leaves(sharded.x), jax.tree_util.tree_leaves(single.x)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert int(sharded.state.count) == 12
