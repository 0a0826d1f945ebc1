"""Tests for jaxgossip.algorithms.merge, the final merge of docs/algorithms.md (section final merge):
merge rounds equal push_sum rounds, the exact merge, states without push-sum weights, errors."""

import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import PUSH_N as N
from _reference import PUSH_SHAPES as SHAPES
from _reference import (
    assert_tree_close,
    column_stochastic_graphs,
    fold_in_keys,
    node_average,
    node_sums,
    push_x0,
    row_stochastic_only,
    run_rounds,
    to_jax,
)

from jaxgossip import topology as tp
from jaxgossip.algorithms.gossip import gossip
from jaxgossip.algorithms.merge import make_merge, merge
from jaxgossip.algorithms.push_sum import push_sum
from jaxgossip.algorithms.scsp import scsp
from jaxgossip.algorithms.sparse_push import sparse_push
from jaxgossip.types import carries_push_sum_weight, round_counter

RTOL, ATOL = 1e-4, 1e-5
TOPOLOGIES = column_stochastic_graphs(N)


def test_merge_rounds_equal_push_sum_rounds_and_reach_the_average():
    topo = TOPOLOGIES["one_peer_exponential"]()
    x0 = push_x0(16)
    alg = sparse_push(topo, fraction=0.25, gamma=0.3)
    x, state, _ = run_rounds(alg, x0, fold_in_keys(4))
    merged, mstate, info = jax.jit(make_merge(topo, 3))(x, state)
    # the same three rounds by push_sum, starting from the same numerators, weights and round
    ps = push_sum(topo)
    px, pstate = x, ps.init(x)._replace(w=state.w, count=state.count)
    ps_step = jax.jit(ps.step)
    for t in range(3):
        px, pstate, _ = ps_step(px, pstate, jax.random.key(t))
    assert_tree_close(merged, px, RTOL, ATOL)
    np.testing.assert_allclose(np.asarray(mstate.w), np.asarray(pstate.w), rtol=1e-6)
    assert int(mstate.count) == 7
    np.testing.assert_array_equal(np.asarray(info.bits), np.full(N, 3 * (17 * 32 + 32)))
    # three consecutive one-peer exponential rounds on N = 8 average exactly
    target = {k: v / float(jnp.sum(state.w)) for k, v in node_sums(x).items()}
    z = alg.debias(merged, mstate)
    for k in SHAPES:
        np.testing.assert_allclose(np.asarray(z[k]), np.broadcast_to(target[k], (N,) + SHAPES[k]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(mstate.x_hat["a"]), np.asarray(state.x_hat["a"]))


def test_merge_exact_and_on_a_gossip_state():
    topo = TOPOLOGIES["random_directed"]()
    x0 = push_x0(17)
    alg = scsp(topo, fraction=0.25, gamma=0.3)
    x, state, _ = run_rounds(alg, x0, fold_in_keys(5))
    merged, mstate, info = merge(topo, x, state, "exact")
    target = {k: v / float(jnp.sum(state.w)) for k, v in node_sums(x).items()}
    z = alg.debias(merged, mstate)
    for k in SHAPES:
        np.testing.assert_allclose(np.asarray(z[k]), np.broadcast_to(target[k], (N,) + SHAPES[k]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(mstate.w), np.full(N, float(jnp.mean(state.w))), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(info.bits), np.full(N, 17 * 32 + 32))
    assert int(mstate.count) == 6
    # a state without push-sum weights: plain mixing rounds, or the mean
    ring = tp.ring(N)
    g = gossip(ring)
    gx = to_jax(x0)
    merged, gstate, info = merge(ring, gx, g.init(gx), 2)
    expected = {k: ring.matrix(0) @ (ring.matrix(0) @ v.reshape(N, -1)) for k, v in x0.items()}
    assert_tree_close(merged, {k: v.reshape((N,) + SHAPES[k]) for k, v in expected.items()}, RTOL, ATOL)
    np.testing.assert_array_equal(np.asarray(info.bits), np.full(N, 2 * 2 * 17 * 32))
    assert int(gstate.count) == 2
    merged, _, info = merge(ring, gx, g.init(gx), "exact")
    assert_tree_close(
        merged, {k: np.broadcast_to(v, (N,) + SHAPES[k]) for k, v in node_average(x0).items()}, RTOL, ATOL
    )
    np.testing.assert_array_equal(np.asarray(info.bits), np.full(N, 17 * 32))


def test_merge_errors():
    topo = TOPOLOGIES["one_peer_exponential"]()
    with pytest.raises(ValueError, match="num_rounds"):
        make_merge(topo, 0)
    with pytest.raises(ValueError, match="num_rounds"):
        make_merge(topo, "average")
    with pytest.raises(TypeError, match="num_rounds"):
        make_merge(topo, 2.0)
    rd = TOPOLOGIES["random_directed"]()
    x = to_jax(push_x0())
    with pytest.raises(ValueError, match="doubly stochastic"):
        merge(rd, x, gossip(tp.ring(N)).init(x), 2)
    with pytest.raises(ValueError, match="column-stochastic"):
        merge(
            row_stochastic_only(),
            {"a": jnp.ones((3, 2))},
            push_sum(tp.directed_ring(3)).init({"a": jnp.ones((3, 2))}),
            2,
        )


class _Undeclared(typing.NamedTuple):
    """A state whose field happens to be named ``w`` but that declares no push-sum weights."""

    w: jax.Array
    count: jax.Array


def test_push_sum_weights_are_declared_by_the_state_type_not_by_a_field_name():
    x = to_jax(push_x0())
    assert carries_push_sum_weight(push_sum(tp.directed_ring(N)).init(x))
    assert carries_push_sum_weight(sparse_push(tp.directed_ring(N), fraction=0.25).init(x))
    assert not carries_push_sum_weight(gossip(tp.ring(N)).init(x))
    # an undeclared ``w`` is not a weight: the params are mixed alone, the field is left as it is
    ring = tp.ring(N)
    state = _Undeclared(w=jnp.full((N,), 2.0), count=jnp.asarray(3, jnp.int32))
    merged, mstate, info = merge(ring, x, state, 1)
    plain, _, plain_info = merge(ring, x, gossip(ring).init(x), 1)
    assert_tree_close(merged, plain, RTOL, ATOL)
    np.testing.assert_array_equal(np.asarray(mstate.w), np.full(N, 2.0))
    np.testing.assert_array_equal(np.asarray(info.bits), np.asarray(plain_info.bits))
    assert int(mstate.count) == 4 and round_counter(mstate) is mstate.count
