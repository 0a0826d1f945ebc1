"""Topology stacks: padded graph tables mix exactly like each member, and topology sweeps (one compile
per group of same-shape graphs) equal the individual runs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny import tiny_config

from jaxgossip import algorithms, experiment_sweeps, mixing, sweeps
from jaxgossip import topology as T
from jaxgossip.consensus import consensus_scan
from jaxgossip.runner import run_training


def _mixed_group():
    """Static N = 16 graphs of different degrees (slots kernel)."""
    return [T.ring(16), T.torus(4, 4), T.hypercube(16), T.exponential(16), T.erdos_renyi(16, 0.3, seed=2)]


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
    topos = _mixed_group()
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


def _individual(name, topo, seed, dim, steps, options):
    key_x, key_a = jax.random.split(jax.random.key(seed))
    x0 = jax.random.normal(key_x, (topo.num_nodes, dim), jnp.float32)
    trace = consensus_scan(algorithms.make(name, topo, **options), x0, steps, key_a)
    return np.asarray(trace.error), np.asarray(trace.round_bits)


@pytest.mark.parametrize(
    "name, topos, options, per_graph",
    [
        ("gossip", _mixed_group() + [T.one_peer_exponential(16), T.ring(8), T.complete(8), T.star(40)], {}, None),
        (
            "choco",
            [T.ring(8), T.torus(2, 4)],
            {"compressor": "random_k", "compressor_options": {"fraction": 0.25}},
            lambda t: {"gamma": 0.1 * t.out_degree.mean()},
        ),
        (
            "push_sum",
            [T.make("random_directed:0.4", 8, seed=3), T.make("random_directed:0.25", 8, seed=4), T.directed_ring(8)],
            {},
            None,
        ),
        ("power_gossip", [T.ring(8), T.torus(2, 4)], {"rank": 1}, None),  # one compile per graph
    ],
)
def test_sweep_topologies_equals_individual_runs(name, topos, options, per_graph):
    seeds, dim, steps = [0, 3], 6, 25
    result = sweeps.sweep_topologies(
        name, topos, dim=dim, num_steps=steps, seeds=seeds, options=options, per_graph=per_graph
    )
    if name in T.STACKABLE:
        assert len(result.groups) < len(topos)  # some graphs shared a compile
    else:
        assert result.groups == [[i] for i in range(len(topos))]
    for g, topo in enumerate(topos):
        extra = dict(per_graph(topo)) if per_graph else {}
        for s, seed in enumerate(seeds):
            errors, bits = _individual(name, topo, seed, dim, steps, {**options, **extra})
            scale = errors[0]
            np.testing.assert_allclose(result.error[g][s], errors, rtol=1e-4, atol=1e-5 * scale)
            np.testing.assert_allclose(result.bits[g][s], bits, rtol=1e-6)
    # stack=False gives the same numbers one graph at a time
    single = sweeps.sweep_topologies(
        name, topos[:2], dim=dim, num_steps=steps, seeds=seeds, options=options, per_graph=per_graph, stack=False
    )
    assert single.groups == [[0], [1]]
    for g in range(2):
        scale = float(result.error[g][:, 0].max())
        np.testing.assert_allclose(single.error[g], result.error[g], rtol=1e-4, atol=1e-5 * scale)


def test_topology_rows_hand_computed():
    dim, steps = 4, 6
    topos = [T.complete(8), T.ring(8)]
    result = sweeps.sweep_topologies("gossip", topos, dim=dim, num_steps=steps, seeds=[0, 1])
    rows = sweeps.topology_rows(result, tol=1e-6)
    complete, ring = rows
    # complete graph with uniform weights averages in one round: 7 messages of 32 D bits per node
    assert complete["rounds_to_tol"] == 1.0
    assert complete["MB_to_tol"] == pytest.approx(7 * 32 * dim / 8e6)
    assert complete["MB_per_node"] == pytest.approx(steps * 7 * 32 * dim / 8e6)
    assert complete["spectral_gap"] == pytest.approx(1.0) and ring["spectral_gap"] == pytest.approx(
        T.spectral_gap(topos[1])
    )
    # ring(8): relative error after R rounds is at most (1 - gap)^(2R)
    assert (
        np.isnan(ring["rounds_to_tol"]) and 0 < ring["final_error"] <= (1 - ring["spectral_gap"]) ** (2 * steps) + 1e-6
    )
    assert ring["MB_per_node"] == pytest.approx(steps * 2 * 32 * dim / 8e6)
    assert complete["group"] != ring["group"] and ring["group_size"] == 1


def test_sweep_topologies_bad_input():
    with pytest.raises(ValueError, match="unknown algorithm 'gosip'"):
        sweeps.sweep_topologies("gosip", [T.ring(8)], dim=2, num_steps=2, seeds=[0])
    with pytest.raises(ValueError, match="at least one topology"):
        sweeps.sweep_topologies("gossip", [], dim=2, num_steps=2, seeds=[0])
    with pytest.raises(TypeError, match="topologies\\[1\\] is a str"):
        sweeps.sweep_topologies("gossip", [T.ring(8), "ring"], dim=2, num_steps=2, seeds=[0])
    with pytest.raises(ValueError, match="dim=0"):
        sweeps.sweep_topologies("gossip", [T.ring(8)], dim=0, num_steps=2, seeds=[0])
    with pytest.raises(ValueError, match="seeds"):
        sweeps.sweep_topologies("gossip", [T.ring(8)], dim=2, num_steps=2, seeds=[])
    with pytest.raises(ValueError, match="per_graph returned keys"):
        sweeps.sweep_topologies(
            "gossip",
            [T.ring(8), T.torus(2, 4)],
            dim=2,
            num_steps=2,
            seeds=[0],
            per_graph=lambda t: {"gamma": 1.0} if t.name == "ring(8)" else {},
        )


def test_training_topology_sweep_equals_individual_runs():
    config = tiny_config(num_rounds=10, evals_per_chunk=2, num_nodes=8)
    topos = [T.ring(8), T.torus(2, 4), T.exponential(8)]
    metrics, groups = experiment_sweeps.sweep_topologies_training(config, topos, seeds=[0, 1])
    assert groups == [[0, 1, 2]]
    for g in (0, 2):
        spec = {0: "ring", 2: "exponential"}[g]
        rows = run_training(
            config.replace(topology=spec, seed=1, data_seed=config.seed), None, progress=False, log=lambda s: None
        ).rows
        np.testing.assert_allclose(metrics[g].test_loss[1], [r["test_loss"] for r in rows], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(metrics[g].bits[1, -1].mean() / 8e6, rows[-1]["MB_per_node"], rtol=1e-5)
    with pytest.raises(ValueError, match="N=16 nodes but config.num_nodes=8"):
        experiment_sweeps.sweep_topologies_training(config, [T.ring(16)], seeds=[0])
