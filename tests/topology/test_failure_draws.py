"""Failure draws of fixed graphs on the slot layout: a concrete 0 probability skips its draw, and
the repaired self weights are summed in each node's slot row; both leave the bits of the round as
the full draw and segment_sum over the edge list give them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgossip import topology as T


@pytest.mark.parametrize(
    "topo",
    [
        T.with_failures(T.erdos_renyi(64, 0.06, 2), 0.3, 0.1),  # Metropolis weights: unequal terms
        T.make("torus+drop:0.3+nodedrop:0.1", 64),
        T.make("ring+drop:0.3", 64),  # node_drop a concrete 0: its draw is skipped
    ],
)
def test_failure_draws_agree_bitwise_with_traced_probabilities_and_the_edge_list_repair(topo):
    # Concrete probabilities (a 0 skips its draw) and traced ones (every draw made) give the same
    # bits; the slot rows' repair equals segment_sum over the edge list bitwise (same order).
    assert topo.resolved_kernel == "slots"
    key = jax.random.key(11)
    concrete = topo.draw(key, 3)
    traced = jax.jit(lambda g, k: g.draw(k, 3))(topo, key)
    for a, b in zip(jax.tree_util.tree_leaves(concrete), jax.tree_util.tree_leaves(traced)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    base = topo.sampler.base
    n, e = topo.num_nodes, base.num_edges
    kept = concrete.graph.weights[0, :e]
    repair = jax.ops.segment_sum(jnp.asarray(base.weights[0], jnp.float32) - kept, base.receivers[0], num_segments=n)
    np.testing.assert_array_equal(np.asarray(concrete.graph.weights[0, e:]), np.asarray(repair))
