"""Tests for jaxgossip.topology.stack: padded graph tables mix exactly like each member, grouping by
signature, and algorithms with host tables refuse a stack member. Topology sweeps built on stacks:
test_sweeps.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import static_graphs_16

from jaxgossip import algorithms
from jaxgossip import topology as T
from jaxgossip.ops import mixing


def _check_stack_mix(topos, leaf_dtype=jnp.float32):
    stack = T.stack(topos)
    n = topos[0].num_nodes
    x = {"a": jax.random.normal(jax.random.key(0), (n, 3, 2)).astype(leaf_dtype), "b": jnp.arange(n * 1.0)}
    for t in range(stack.period + 1):
        static = jax.vmap(lambda s, t=t: mixing.mix(s, x, t))(stack)
        traced = jax.jit(jax.vmap(lambda s, t: mixing.mix(s, x, t), in_axes=(0, None)))(stack, jnp.int32(t))
        for g, topo in enumerate(topos):
            w = topo.matrix(t)
            for name in x:
                ref = np.einsum("ij,j...->i...", w, np.asarray(x[name], np.float64))
                tol = 1e-2 if leaf_dtype == jnp.bfloat16 else 1e-5
                np.testing.assert_allclose(np.asarray(static[name][g], np.float64), ref, rtol=tol, atol=tol)
                np.testing.assert_allclose(np.asarray(traced[name][g], np.float64), ref, rtol=tol, atol=tol)
                assert static[name].dtype == x[name].dtype


def test_stack_slots_equals_numpy_matrices():
    topos = static_graphs_16()
    assert T.group(topos) == [[0, 1, 2, 3, 4]]
    stack = T.stack(topos)
    assert stack.kernel == "slots" and stack.neighbors.shape[:3] == (5, 1, 16)
    _check_stack_mix(topos)
    _check_stack_mix(topos, jnp.bfloat16)


def test_stack_segment_and_dense_kernels():
    hub_ring = np.zeros((40, 40), bool)
    hub_ring[0, 1:] = hub_ring[1:, 0] = True
    for i in range(1, 40):
        hub_ring[i, i % 39 + 1] = hub_ring[i % 39 + 1, i] = True
    segment = [T.star(40), T.from_adjacency(hub_ring)]
    assert {t.resolved_kernel for t in segment} == {"segment"}
    _check_stack_mix(segment)
    dense = [T.complete(12), T.erdos_renyi(12, 0.8, seed=0)]
    assert {t.resolved_kernel for t in dense} == {"dense"}
    _check_stack_mix(dense)
    # a kernel override gives the same result
    _check_stack_mix([T.ring(12), T.torus(3, 4)])
    stack = T.stack([T.ring(12), T.torus(3, 4)], kernel="segment")
    x = jnp.arange(12.0)
    out = jax.vmap(lambda s: mixing.mix(s, x, 0))(stack)
    np.testing.assert_allclose(np.asarray(out[1]), T.torus(3, 4).matrix(0) @ np.arange(12.0), rtol=1e-6)


def test_time_varying_members_repeat_to_the_lcm_period():
    # periods 4 (one-peer exponential), 2 (a two-graph schedule) and 3: lcm 12
    two = T.schedule([T.ring(16), T.torus(4, 4)])
    three = T.schedule([T.ring(16), T.hypercube(16), T.exponential(16)])
    topos = [T.one_peer_exponential(16), two, three]
    assert T.group(topos) == [[0, 1, 2]]
    assert T.stack(topos).period == 12
    _check_stack_mix(topos)


def test_group_splits_by_signature_and_stack_refuses_mixed_signatures():
    topos = [
        T.ring(8),
        T.ring(16),
        T.one_peer_exponential(8),
        T.complete(8),
        T.torus(2, 4),
        T.make("random_directed:0.5", 8, seed=1),
        T.directed_ring(8),
    ]
    groups = T.group(topos)
    # the directed ring is doubly stochastic (1/2 self, 1/2 predecessor), so it mixes like the rings
    assert groups == [[0, 4, 6], [1], [2], [3], [5]]
    with pytest.raises(ValueError, match="cannot stack ring\\(8\\) with ring\\(16\\)"):
        T.stack([T.ring(8), T.ring(16)])
    with pytest.raises(ValueError, match="at least one"):
        T.stack([])
    with pytest.raises(ValueError, match="kernel='bogus'"):
        T.stack([T.ring(8)], kernel="bogus")
    with pytest.raises(ValueError, match="vmap over the stack"):
        mixing.mix(T.stack([T.ring(8), T.torus(2, 4)]), jnp.ones((8, 2)))


def test_host_table_algorithms_refuse_a_stack_member():
    stack = T.stack([T.ring(8), T.torus(2, 4)])
    col = T.stack([T.directed_ring(8)])
    for name, s in (("power_gossip", stack), ("sparse_push", col), ("scsp", col)):
        with pytest.raises(TypeError, match=f"{name} builds per-edge host tables.*stacked Topology"):
            jax.vmap(lambda m, name=name: algorithms.make(name, m).init(jnp.ones((8, 2))).count)(s)
