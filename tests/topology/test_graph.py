"""One graph type for single graphs, stacks and traced tables: ``Topology`` is a pytree whose tables
are leaves, and ``mix`` gives bitwise the same result for a graph with host tables, the same graph
as a stack of one under ``vmap``, and its tables passed as traced ``jit`` arguments, for every
layout; stacks of graphs with different slot counts K equal the graphs' own runs; with the node
axis on 8 CPU devices ``mix`` takes the ``ppermute`` path for circulant graphs."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import assert_tree_close, node_normal
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxgossip as jg
from jaxgossip import topology as T
from jaxgossip.ops.sharding import node_mesh

LAYOUTS = ("slots", "dense", "segment")
GRAPHS = {
    "ring8": lambda: T.ring(8),  # circulant: static slots take jnp.roll
    "star8": lambda: T.star(8),  # hub degree 7, leaves 1: padded slots
    "one_peer8": lambda: T.one_peer_exponential(8),  # time-varying, T = 3
    "random_directed8": lambda: T.random_directed(8, 0.4, 1),  # column stochastic only
}


def make_x(n, seed=0):
    raw = node_normal(n, {"w": (3, 2), "half": (5,)}, seed, dtype=None)
    return {"w": jnp.asarray(raw["w"], jnp.float32), "half": jnp.asarray(raw["half"], jnp.bfloat16)}


def assert_trees_equal(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert u.dtype == v.dtype and u.shape == v.shape
        np.testing.assert_array_equal(np.asarray(u, np.float32), np.asarray(v, np.float32))


def test_topology_is_a_pytree_with_tables_as_leaves():
    topo = T.torus(3, 4)
    leaves, treedef = jax.tree_util.tree_flatten(topo)
    assert [leaf.shape for leaf in leaves] == [(1, 60), (1, 60), (1, 60), (1, 12, 5), (1, 12, 5)]
    again = jax.tree_util.tree_unflatten(treedef, leaves)
    assert isinstance(again, T.Topology) and again.name == topo.name and again.num_nodes == 12
    assert again.resolved_kernel == "slots" and again.is_doubly_stochastic and again.max_slots == 5
    np.testing.assert_array_equal(again.out_degree, topo.out_degree)
    # a stack of a dense layout carries no slot table
    dense = T.stack([T.complete(8), T.complete(8)])
    assert dense.num_graphs == 2 and dense.neighbors is None and len(jax.tree_util.tree_leaves(dense)) == 3
    assert topo.num_graphs is None and topo.host_tables and not dense.host_tables


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_single_graph_stack_of_one_and_traced_tables_mix_bitwise_equal(name, layout):
    topo = dataclasses.replace(GRAPHS[name](), kernel=layout)
    assert topo.resolved_kernel == layout
    x = make_x(topo.num_nodes)
    rounds = topo.period + 1  # the whole period and one wrap-around
    stack = T.stack([topo])

    @jax.jit
    def run(stack, tables, x, t_traced):
        host_static = [jg.mix(topo, x, t) for t in range(rounds)]
        host_traced = jax.vmap(lambda t: jg.mix(topo, x, t))(t_traced)
        stacked = [jax.vmap(lambda s, t=t: jg.mix(s, x, t))(stack) for t in range(rounds)]
        stacked_traced = jax.vmap(lambda t: jax.vmap(lambda s: jg.mix(s, x, t))(stack))(t_traced)
        traced = [jg.mix(tables, x, t) for t in range(rounds)]  # the graph's own tables, traced
        return host_static, host_traced, stacked, stacked_traced, traced

    tables = jax.tree_util.tree_map(jnp.asarray, topo)
    assert not tables.host_tables and tables.resolved_kernel == layout
    out = run(stack, tables, x, jnp.arange(rounds, dtype=jnp.int32))
    host_static, host_traced, stacked, stacked_traced, traced = jax.device_get(out)
    for t in range(rounds):
        pick = lambda tree, i: jax.tree_util.tree_map(lambda leaf: leaf[i], tree)  # noqa: E731
        assert_trees_equal(host_static[t], pick(host_traced, t))
        assert_trees_equal(host_static[t], pick(stacked[t], 0))
        assert_trees_equal(host_static[t], pick(pick(stacked_traced, t), 0))
        assert_trees_equal(host_static[t], traced[t])
        want = topo.matrix(t) @ np.asarray(x["w"], np.float64).reshape(topo.num_nodes, -1)
        np.testing.assert_allclose(host_static[t]["w"].reshape(topo.num_nodes, -1), want, rtol=1e-5, atol=1e-6)


def test_stack_with_mixed_slot_counts_equals_per_graph_runs():
    topos = [T.ring(16), T.star(16), T.torus(4, 4), T.exponential(16), T.ring(16)]
    assert {t.resolved_kernel for t in topos} == {"slots"}
    assert [t.max_slots for t in topos] == [3, 16, 5, 5, 3]
    assert T.group(topos) == [[0, 1, 2, 3, 4]]  # one compile ...
    assert T.buckets(topos) == [[0, 4], [1], [2, 3]]  # ... in which no graph pays for the star's K
    x = make_x(16, seed=1)
    padded = T.stack(topos)
    assert padded.max_slots == 16
    per_graph = jax.jit(lambda x: [jg.mix(t, x) for t in topos])(x)
    whole = jax.jit(jax.vmap(lambda s: jg.mix(s, x)))(padded)
    for bucket in T.buckets(topos):
        members = T.stack([topos[i] for i in bucket])
        assert members.max_slots == topos[bucket[0]].max_slots
        mixed = jax.jit(jax.vmap(lambda s: jg.mix(s, x)))(members)
        for j, i in enumerate(bucket):
            assert_trees_equal(jax.tree_util.tree_map(lambda leaf: leaf[j], mixed), per_graph[i])
    for i in range(len(topos)):
        assert_trees_equal(jax.tree_util.tree_map(lambda leaf: leaf[i], whole), per_graph[i])


# Equal up to float32 rounding: XLA:CPU contracts ``a * b + c`` into fused multiply-adds by its own
# choice, which differs between the partitioned and the single-device program.
ROUNDING = {"float32": {"rtol": 1e-6, "atol": 1e-6}, "bfloat16": {"rtol": 2**-7, "atol": 2**-7}}


def _sharded_x(n, num_devices=8):
    mesh = node_mesh(n, num_devices)
    x = make_x(n, seed=2)
    return x, jax.tree_util.tree_map(lambda leaf: jax.device_put(leaf, NamedSharding(mesh, P("nodes"))), x)


def _uses_shard_map(topo, x):
    jaxpr = jax.make_jaxpr(lambda x, t: jg.mix(topo, x, t))(x, jnp.int32(1))
    return "shard_map" in str(jaxpr)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (conftest sets jax_num_cpu_devices=8)")
@pytest.mark.parametrize("name", ["ring16", "one_peer16", "exponential16", "torus4x4", "star16"])
def test_mix_with_sharded_node_axis_picks_ppermute_for_circulant_graphs(name):
    topo = {
        "ring16": lambda: T.ring(16),
        "one_peer16": lambda: T.one_peer_exponential(16),
        "exponential16": lambda: T.exponential(16),
        "torus4x4": lambda: T.torus(4, 4),
        "star16": lambda: T.star(16),
    }[name]()
    x, xs = _sharded_x(16)
    circulant = name in ("ring16", "one_peer16", "exponential16")
    assert _uses_shard_map(topo, xs) == circulant
    assert not _uses_shard_map(topo, x)  # one device: the plain slot kernel
    mix = jax.jit(lambda x, t: jg.mix(topo, x, t))
    for t in range(topo.period + 1):
        single, sharded = mix(x, jnp.int32(t)), mix(xs, jnp.int32(t))
        if circulant:
            assert len(sharded["w"].sharding.device_set) == 8
        assert_tree_close(sharded, single, by_dtype=ROUNDING, same_dtype=True)
        assert_tree_close(
            jax.jit(lambda x, t=t: jg.mix(topo, x, t))(xs), single, by_dtype=ROUNDING, same_dtype=True
        )  # static round


def test_value_key_is_equal_for_graphs_built_apart_and_facts_are_plain_values():
    a, b = T.ring(8), T.ring(8)
    assert a is not b and a.value_key() == b.value_key()
    assert T.TopologyKey.of(a) == T.TopologyKey.of(b) and hash(T.TopologyKey.of(a)) == hash(T.TopologyKey.of(b))
    assert a.value_key() != dataclasses.replace(a, kernel="segment").value_key()
    assert a.value_key() != T.directed_ring(8).value_key()
    # The host facts are computed at construction; a graph rebuilt from its leaves derives them anew.
    rebuilt = jax.tree_util.tree_map(lambda x: x, a)
    for fact in ("out_degree", "in_degree", "self_weights"):
        np.testing.assert_array_equal(getattr(rebuilt, fact), getattr(a, fact))
    assert rebuilt.is_symmetric and a.is_symmetric and not T.directed_ring(8).is_symmetric
    failing = T.with_failures(T.ring(8), link_drop=0.25)
    again = T.with_failures(T.ring(8), link_drop=0.25)
    assert failing.value_key() == again.value_key()
    assert failing.value_key() != T.with_failures(T.ring(8), link_drop=0.5).value_key()
    with pytest.raises(TypeError, match="concrete"):
        jax.jit(lambda t: t.value_key())(T.stack([a]))


@pytest.mark.parametrize(
    "make", [lambda: T.ring(8), lambda: T.one_peer_exponential(8), lambda: T.complete(5), lambda: T.star(40)]
)
def test_with_weights_mixes_with_the_new_weights(make):
    """with_weights(v) mixes with W(v) on every layout: the dense reference of the new table."""
    topo = make()
    rng = np.random.default_rng(0)
    new = np.where(topo.weights != 0, rng.uniform(0.1, 1.0, size=topo.weights.shape), 0.0)
    graph = topo.with_weights(new)
    assert graph.resolved_kernel == topo.resolved_kernel and graph.period == topo.period
    x = rng.normal(size=(topo.num_nodes, 3)).astype(np.float32)
    for t in range(topo.period):
        dense = np.zeros((topo.num_nodes, topo.num_nodes))
        np.add.at(dense, (topo.receivers[t], topo.senders[t]), new[t])
        np.testing.assert_allclose(np.asarray(jg.mix(graph, x, t)), dense @ x, rtol=1e-5, atol=1e-6)
    # the same weights mix as the graph itself
    np.testing.assert_allclose(
        np.asarray(jg.mix(topo.with_weights(topo.weights), x)), np.asarray(jg.mix(topo, x)), atol=1e-6
    )


def test_with_weights_refuses_another_shape_and_stochastic_graphs():
    topo = T.ring(6)
    with pytest.raises(ValueError, match=r"shape \(1, 18\)"):
        topo.with_weights(np.ones((1, 17)))
    with pytest.raises(ValueError, match="stochastic"):
        jg.topology.random_matching(6).with_weights(np.ones((1, 6)))
    with pytest.raises(ValueError, match="traced"):
        topo.with_weights(topo.weights).with_weights(topo.weights)


def test_a_hub_graph_keeps_tables_of_order_e_and_makes_its_slot_table_on_demand():
    """A star's slot table is N x N: the graph holds only its edge list (memory proportional to E),
    ``slots`` makes the table on first use (equal to a kernel='slots' build), ``max_slots`` is K
    without it, the algorithms that read slots get it, and a table beyond 2^24 entries is refused
    by its size."""
    star = T.star(4096)
    assert star.neighbors is None and star.slot_weights is None
    held = sum(np.asarray(leaf).nbytes for leaf in jax.tree_util.tree_leaves(star))
    assert held <= 16 * star.num_edges  # senders, receivers int32 and weights float64
    assert star.max_slots == 4096 and "_late_slot_table" not in star.__dict__
    small = T.star(64)
    own = T.Topology(small.name, 64, small.senders, small.receivers, small.weights, False, kernel="slots")
    for got, want in zip(small.slots, own.slots):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    assert small.slots[0] is small.slots[0]  # made once
    from jaxgossip.algorithms._shared import messages

    assert messages.check_fixed_graph(small, "clipped_gossip") is small
    received = messages.received_models(small, {"w": jnp.ones((64, 2))}, 0)
    assert received.neighbors.shape == (64, 64)
    x = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(jg.mix(small, x)), np.asarray(jg.mix(own, x)), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"1 x 8192 x 8192 entries"):
        _ = T.star(8192).slots
