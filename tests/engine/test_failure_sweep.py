"""Failure probabilities are traced: a sweep over link_drop is one compiled program.

``with_failures`` keeps p and q as pytree leaves (``Topology.draw_args``), so failures of one graph
at several p stack (``topology.stack``) and ``jax.vmap`` runs them all in one trace. Each check
counts traces with a Python counter in the traced function (it runs once per trace, never per
compiled call) and compares the vmapped runs with runs of each graph on its own.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgossip import algorithms
from jaxgossip import topology as T
from jaxgossip.engine import sweeps
from jaxgossip.engine.consensus import consensus_scan

PS = (0.0, 0.1, 0.3, 0.5)
ROUNDS, DIM = 15, 3


def _alone(name, graph, x0, key):
    trace = jax.jit(lambda x, k: consensus_scan(algorithms.make(name, graph), x, ROUNDS, k))(x0, key)
    return trace.error, trace.round_bits


@pytest.mark.parametrize(
    "name, base",
    [
        ("gossip", T.ring(8)),
        ("push_sum", T.one_peer_exponential(8)),
        pytest.param("power_gossip", T.ring(8), marks=pytest.mark.slow),  # a non-stackable method
    ],
)
def test_a_sweep_over_link_drop_compiles_once_and_equals_the_single_runs(name, base):
    graphs = [T.with_failures(base, link_drop=p) for p in PS]
    keys = jax.random.split(jax.random.key(3), 1)
    traces = []

    def one(topo, point, key):
        del point
        traces.append(topo.name)  # runs at trace time only
        key_x, key_a = jax.random.split(key)
        x0 = jax.random.normal(key_x, (8, DIM))
        trace = consensus_scan(algorithms.make(name, topo), x0, ROUNDS, key_a)
        return trace.error, trace.round_bits

    outs, groups, _ = sweeps.map_topologies(one, graphs, keys, algorithm=name)
    assert groups == [[0, 1, 2, 3]] and len(traces) == 1, (groups, traces)
    for graph, out in zip(graphs, outs):
        for s, key in enumerate(keys):
            key_x, key_a = jax.random.split(key)
            error, bits = _alone(name, graph, jax.random.normal(key_x, (8, DIM)), key_a)
            np.testing.assert_allclose(out[0][s], error, rtol=1e-6, atol=1e-7)
            np.testing.assert_array_equal(out[1][s], bits)
    # fewer links, fewer bits (p = 0 equal to the wrapped graph: test_stochastic.py)
    totals = [out[1].sum() for out in outs]
    assert totals[0] > totals[1] > totals[2] > totals[3]


def test_traced_probabilities_under_a_users_vmap_and_separately_built_graphs_share_a_group():
    x0 = jax.random.normal(jax.random.key(0), (8, DIM))
    key = jax.random.key(1)
    traces = []

    def run(p):
        traces.append(1)
        return consensus_scan(algorithms.make("gossip", T.with_failures(T.ring(8), link_drop=p)), x0, ROUNDS, key)

    errors = jax.jit(jax.vmap(run))(jnp.asarray(PS, jnp.float32)).error
    assert len(traces) == 1
    alone = _alone("gossip", T.with_failures(T.ring(8), PS[-1]), x0, key)[0]  # one compile suffices here
    np.testing.assert_allclose(errors[-1], alone, rtol=1e-6)
    assert np.all(np.diff(errors[:, -1]) > 0)  # more failures, slower averaging
    # two ring(8) built apart wrap into one sampler: one group; another graph is another group
    graphs = [
        T.with_failures(T.ring(8), 0.1),
        T.with_failures(T.ring(8), 0.3, node_drop=0.1),
        T.with_failures(T.torus(2, 4), 0.1),
    ]
    assert T.group(graphs) == [[0, 1], [2]]
    stacked = T.stack(graphs[:2])
    assert stacked.num_graphs == 2 and stacked.stochastic
    np.testing.assert_array_equal(stacked.draw_args["node_drop"], np.float32([0.0, 0.1]))


def test_bad_probabilities_and_bad_stacks_are_refused_with_a_reason():
    for p in (1.0, -0.1, float("nan"), np.float32(1.5), jnp.asarray(2.0)):
        with pytest.raises(ValueError, match="link_drop.*must be a probability in \\[0, 1\\)"):
            T.with_failures(T.ring(8), link_drop=p)
    with pytest.raises(TypeError, match="node_drop"):
        jax.vmap(lambda q: T.with_failures(T.ring(8), node_drop=q).draw_args)(jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match="same sampler"):
        T.stack([T.with_failures(T.ring(8), 0.1), T.with_failures(T.torus(2, 4), 0.1)])
    with pytest.raises(ValueError, match="cannot stack random_matching"):
        T.stack([T.random_matching(8), T.random_matching(8)])
    with pytest.raises(ValueError, match="stack of 2 stochastic graphs: jax.vmap"):
        T.stack([T.with_failures(T.ring(8), 0.1), T.with_failures(T.ring(8), 0.3)]).draw(jax.random.key(0), 0)
    with pytest.raises(ValueError, match="cannot stack ring"):
        T.stack([T.with_failures(T.ring(8), 0.1), T.ring(8)])


def test_a_training_sweep_over_link_drop_is_one_program_whose_clock_equals_the_single_runs():
    # Each member's time model needs the graph's mean degree, estimated from draws; under the
    # sweep's vmap the probabilities are traced and the estimate is too.
    from tiny import tiny_config

    from jaxgossip.run import training_sweeps
    from jaxgossip.run.runner import run_training

    config = tiny_config(num_nodes=8, num_rounds=10, evals_per_chunk=2)
    graphs = [T.with_failures(T.ring(8), link_drop=p) for p in (0.1, 0.5)]
    metrics, groups = training_sweeps.sweep_topologies_training(config, graphs, seeds=[0])
    assert groups == [[0, 1]]
    for p, got in zip((0.1, 0.5), metrics):
        single = config.replace(topology=f"ring+drop:{p}", data_seed=config.seed)
        rows = run_training(single, None, progress=False, log=lambda s: None).rows
        np.testing.assert_allclose(got.test_loss[0], [r["test_loss"] for r in rows], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got.sim_time[0], [r["sim_time"] for r in rows], rtol=1e-6)
    assert metrics[0].sim_time[0, -1] != metrics[1].sim_time[0, -1]
