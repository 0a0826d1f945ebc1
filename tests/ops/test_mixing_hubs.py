"""Graphs with a few rows of more than 16 in-neighbours (a star's hub): the segment layout of a host
graph mixes them by ``hub_split``, a reduction per hub plus the slot kernel for the other rows,
against a NumPy per-node loop (float64), with mean conservation on doubly stochastic graphs.

Bound: node i's value is the sum of its M_i float32 products ``w_ij x_j`` (weights rounded to
float32 first), taken in some order, so it is within ``(M_i + 1) u sum_j |w_ij x_j|`` of the exact
float64 sum (u = 2^-24, first order); the tests allow twice that.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgossip as jg
from jaxgossip import topology as T
from jaxgossip.topology import layout

U = 2.0**-24


def loop_mix(topo, x):
    """y_i = sum over the in-edges of i of w * x_sender, one node at a time, in float64, with
    ``sum |w x|`` and the in-edge count M_i of every node."""
    s, r, w = topo.senders[0], topo.receivers[0], topo.weights[0]
    live = w != 0
    s, r, w = s[live], r[live], w[live]
    x64 = x.astype(np.float64)
    y, scale = np.zeros_like(x64), np.zeros_like(x64)
    count = np.zeros(topo.num_nodes)
    for i in range(topo.num_nodes):
        edges = np.flatnonzero(r == i)
        terms = w[edges].reshape((-1,) + (1,) * (x.ndim - 1)) * x64[s[edges]]
        y[i], scale[i], count[i] = terms.sum(axis=0), np.abs(terms).sum(axis=0), edges.size
    return y, scale, count


def two_hubs(n):
    """A ring of n nodes plus hubs 0 and 1 linked to every node (Metropolis weights)."""
    adj = np.zeros((n, n))
    nodes = np.arange(n)
    adj[nodes, (nodes + 1) % n] = adj[(nodes + 1) % n, nodes] = 1
    adj[:2, :] = adj[:, :2] = 1
    return T.from_adjacency(adj)


def uneven_star(n):
    """A star whose hub puts a different weight on every leaf (symmetric, so doubly stochastic):
    the hub's row is not one weight times a sum, as it is for Metropolis weights."""
    leaves = np.arange(1, n)
    w = np.random.default_rng(0).uniform(0.1, 1.0, n - 1) / n
    senders = np.concatenate([[0], leaves, np.zeros(n - 1, int), leaves])
    receivers = np.concatenate([[0], np.zeros(n - 1, int), leaves, leaves])
    weights = np.concatenate([[1 - w.sum()], w, w, 1 - w])
    return T.from_weights(senders[None], receivers[None], weights[None], n)


GRAPHS = {
    "star(1024)": lambda: T.star(1024),
    "star(300)": lambda: T.star(300),
    "two_hubs(200)": lambda: two_hubs(200),
    "uneven_star(500)": lambda: uneven_star(500),
}


@pytest.mark.parametrize("name", GRAPHS)
@pytest.mark.parametrize("shape", [(), (3,), (2, 5)])
def test_hub_rounds_equal_the_per_node_loop(name, shape):
    topo = GRAPHS[name]()
    split = layout.hub_split(topo.senders[0], topo.receivers[0], topo.weights[0], topo.num_nodes)
    assert topo.resolved_kernel == "segment" and split is not None
    uniform = [np.unique(w.astype(np.float32)).size == 1 for w in split.hub_weights]
    assert all(uniform) == (name != "uneven_star(500)")  # both reductions of a hub row are met
    x = np.random.default_rng(1).standard_normal((topo.num_nodes,) + shape).astype(np.float32)
    got = np.asarray(jax.jit(lambda x: jg.mix(topo, x))(x), np.float64)
    want, scale, count = loop_mix(topo, x)
    bound = 2 * (count.reshape((-1,) + (1,) * len(shape)) + 1) * U * scale
    assert np.all(np.abs(got - want) <= bound), name
    # Mean conservation: the graphs are doubly stochastic.
    assert topo.is_doubly_stochastic
    np.testing.assert_allclose(got.mean(axis=0), x.astype(np.float64).mean(axis=0), atol=1e-6)


def test_hub_split_finds_the_hubs_and_leaves_bounded_rows():
    star = T.star(64)
    split = layout.hub_split(star.senders[0], star.receivers[0], star.weights[0], 64)
    assert split.hubs == (0,) and split.neighbors.shape == (64, 2)
    np.testing.assert_array_equal(split.hub_senders[0], np.arange(64))
    assert layout.hub_split(*(a[0] for a in (T.ring(64).senders, T.ring(64).receivers, T.ring(64).weights)), 64) is None
    # A pytree of leaves mixes leaf by leaf; a constant leaf stays constant.
    x = {"a": jnp.arange(64.0), "b": jnp.ones((64, 2))}
    y = jg.mix(star, x)
    np.testing.assert_allclose(np.asarray(y["b"]), 1.0, rtol=1e-6)


def test_hub_rounds_under_vmap_and_in_bfloat16():
    star = T.star(300)
    xs = np.random.default_rng(2).standard_normal((3, 300, 4)).astype(np.float32)
    batched = np.asarray(jax.jit(jax.vmap(lambda x: jg.mix(star, x)))(xs))
    for x, got in zip(xs, batched):
        np.testing.assert_array_equal(got, np.asarray(jg.mix(star, x)))
    low = jg.mix(star, jnp.asarray(xs[0], jnp.bfloat16))
    assert low.dtype == jnp.bfloat16
    want, scale, _ = loop_mix(star, xs[0])
    np.testing.assert_allclose(np.asarray(low, np.float64), want, atol=2.0**-7 * (scale.max() + np.abs(xs[0]).max()))
