"""The shared suite: every algorithm in ``jaxgossip.algorithms.REGISTRY`` (adding a factory to the
registry enrolls it here) is checked for stable state structure, no retrace, jit == no-jit,
determinism, vmap over seeds and inputs, consensus convergence and the consensus fixed point.

Each algorithm is built with small hyperparameters from ``KWARGS`` (unknown names get ``{}``) on a
graph it accepts: the column-stochastic digraph ``one_peer_exponential(8)`` for push-sum methods
(registered with ``mixing="column_stochastic"``), ``binary_tree(8)`` for tree algorithms (``tree=True``:
RelaySum), ``ring(8)`` otherwise. The ring and the one-peer graph are node-symmetric (circulant).
"""

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import node_normal, to_jax

import jaxgossip as jg
from jaxgossip import algorithms
from jaxgossip import topology as T

N = 8
NAMES = sorted(algorithms.REGISTRY)

# Small, deterministic settings (top-k is deterministic; keys only matter for random compressors
# and PowerGossip's shared randomness). Keys an algorithm does not take are dropped, so a renamed
# hyperparameter elsewhere does not break the suite.
KWARGS = {
    "gossip": {"gamma": 1.0},
    "allreduce": {},
    "choco": {"compressor": "top_k", "compressor_options": {"fraction": 0.5}, "gamma": 0.5},
    "deepsqueeze": {"compressor": "top_k", "compressor_options": {"fraction": 0.5}, "gamma": 0.2},
    "power_gossip": {"rank": 1, "num_iterations": 1, "gamma": 1.0},
    "push_sum": {},
    "sparse_push": {"fraction": 0.5, "gamma": 0.5},
    "scsp": {"fraction": 0.5, "gamma": 0.5},
    # lambda_min of the uniform 8-ring is -1/3, D^2's limit: gamma = 0.5 is Exact Diffusion.
    "d2": {"gamma": 0.5},
    "qgm": {"lr": 0.1},
    # theta bounds the spread of the suite's N(0, 1) models (max |x_i - x_j| about 6).
    "moniqua": {"theta": 8.0, "bits": 8, "gamma": 0.5},
    # The suite's N(0, 1) models lie within 100 of each other: nothing is clipped, ClippedGossip is
    # gossip here (its clipping is checked in tests/algorithms/test_clipped_gossip.py); trim=0 is the neighbourhood mean.
    "clipped_gossip": {"tau": 100.0},
    "trimmed_mean": {"trim": 0},
    # half the coordinates per round: the default p = 0.005 needs thousands of rounds to converge.
    "sparta": {"fraction": 0.5},
    "demo_momentum": {"lr": 0.1, "k": 2, "chunk": 4},
}
# Consensus after CONVERGE_STEPS rounds must fall below this fraction of the initial error.
# DeepSqueeze with a biased compressor provably stops in a neighbourhood of the average (its
# docstring), so it only has to decrease substantially; so does Moniqua, whose rounding of the
# differences to the grid delta * B leaves a floor of order (gamma delta B)^2 (its docstring).
CONVERGE_STEPS = 200
# Rules whose fixed points include states that are not a consensus: a coordinate-wise median over a
# ring's neighbourhoods keeps every locally monotone sequence (a root signal of the median filter);
# DeMo never sends models, so in a consensus run (no gradients) every state is a fixed point.
NO_CONSENSUS = {
    "median": "a median over neighbourhoods keeps locally monotone models (root signals)",
    "demo_momentum": "it exchanges components of the local momenta, not models; without gradients no model moves",
}
# Rules whose consensus from different models is not their mean: RelaySum over models averages
# models delayed by the tree distance, and each node stands in its own initial model for the nodes
# not heard from yet (its docstring); the nodes must still agree.
NOT_THE_MEAN = {"relaysgd": "a delay-weighted consensus, not the mean of different initial models"}
CONVERGE_FACTOR = {"deepsqueeze": 1e-2, "moniqua": 1e-3}
DEFAULT_CONVERGE_FACTOR = 1e-6


def is_push(name):
    """Push-sum methods (debias is x / w) need column-stochastic weights: read from the metadata."""
    return jg.algorithms.info(name).graph.mixing == "column_stochastic"


def suite_topology(name):
    if jg.algorithms.info(name).graph.tree:  # RelaySum relays along a tree (metadata tree=True)
        return T.binary_tree(N)
    return T.one_peer_exponential(N) if is_push(name) else T.ring(N)


def build(name, topology=None):
    factory = algorithms.REGISTRY[name]
    accepted = set(inspect.signature(factory).parameters)
    kwargs = {k: v for k, v in KWARGS.get(name, {}).items() if k in accepted}
    return algorithms.make(name, topology if topology is not None else suite_topology(name), **kwargs)


def make_x0(seed=0):
    # a matrix leaf (PowerGossip compresses it) and a vector leaf (gossiped exactly)
    return to_jax(node_normal(N, {"w": (4, 3), "b": (5,)}, seed))


def run_steps(alg, x0, key, num_steps):
    """num_steps rounds as a Python loop; returns (x, state, bits [S, N]). Round k uses the k-th
    key of the driver's schedule (``jg.rounds.round_keys``), as ``run_consensus`` does."""
    state = alg.init(x0)
    x = x0
    bits = []
    for step_key in jg.rounds.round_keys(key, num_steps):
        x, state, info = alg.step(x, state, step_key)
        bits.append(info.bits)
    return x, state, jnp.stack(bits)


class Harness:
    """Per-algorithm compiled functions shared by the tests (compiles dominate on a 2-core CPU)."""

    def __init__(self, name):
        self.name = name
        self.alg = build(name)
        self.traces = 0

        def step(x, state, key):
            self.traces += 1  # Python side effect: runs once per trace
            return self.alg.step(x, state, key)

        self.step = jax.jit(step)
        self.run3 = jax.jit(functools.partial(run_steps, self.alg, num_steps=3))
        self.debias = jax.jit(self.alg.debias)


@functools.cache
def harness(name):
    return Harness(name)


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=rtol, atol=atol)


def assert_trees_equal(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def signature(tree):
    leaves = jax.tree_util.tree_leaves(tree)
    return jax.tree_util.tree_structure(tree), [(jnp.shape(x), jnp.result_type(x)) for x in leaves]


@pytest.fixture(params=NAMES)
def name(request):
    return request.param


# ---------------------------------------------------------------- the suite


def test_registry_entries_build_and_are_named(name):
    alg = harness(name).alg
    assert isinstance(alg, jg.GossipAlgorithm)
    assert alg.name == name
    assert callable(alg.init) and callable(alg.step) and callable(alg.debias)


def test_state_structure_stable_over_two_jitted_steps(name):
    h = harness(name)
    x0 = make_x0()
    state0 = h.alg.init(x0)
    x1, state1, info1 = h.step(x0, state0, jax.random.key(1))
    x2, state2, info2 = h.step(x1, state1, jax.random.key(2))
    assert signature(state1) == signature(state0)
    assert signature(state2) == signature(state0)
    assert signature(x1) == signature(x0) and signature(x2) == signature(x0)
    for info in (info1, info2):
        assert info.bits.shape == (N,)
        assert np.all(np.isfinite(info.bits)) and np.all(np.asarray(info.bits) >= 0)
    # the state carries the round counter
    assert int(state0.count) == 0 and int(state1.count) == 1 and int(state2.count) == 2
    z = h.debias(x2, state2)
    assert signature(z) == signature(x0)


def test_no_retrace_on_later_calls(name):
    h = harness(name)
    x = make_x0()
    state = h.alg.init(x)
    for i in range(3):
        x, state, _ = h.step(x, state, jax.random.key(i))
    jax.block_until_ready(x)
    assert h.traces == 1, f"{name}.step was traced {h.traces} times for identically shaped inputs"


def test_jit_matches_no_jit(name):
    h = harness(name)
    x0 = make_x0(seed=1)
    x_jit, state_jit = x0, h.alg.init(x0)
    x_eager, state_eager = x0, h.alg.init(x0)
    for i in range(2):
        key = jax.random.key(30 + i)
        x_jit, state_jit, info_jit = h.step(x_jit, state_jit, key)
        x_eager, state_eager, info_eager = h.alg.step(x_eager, state_eager, key)
        assert_trees_close(x_jit, x_eager)
        np.testing.assert_allclose(info_jit.bits, info_eager.bits)
    assert_trees_close(h.debias(x_jit, state_jit), h.alg.debias(x_eager, state_eager))


def test_deterministic_for_a_key(name):
    h = harness(name)
    x0 = make_x0(seed=2)
    key = jax.random.key(4)
    a = h.run3(x0, key)
    b = h.run3(x0, key)
    assert_trees_equal(a, b)


def test_vmap_over_seeds_and_inputs(name):
    h = harness(name)
    x0s = [make_x0(seed=10), make_x0(seed=11)]
    keys = [jax.random.key(5), jax.random.key(6)]
    stacked_x = jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), *x0s)
    stacked_k = jnp.stack(keys)
    xs, states, bits = jax.jit(jax.vmap(functools.partial(run_steps, h.alg, num_steps=3)))(stacked_x, stacked_k)
    for i in range(2):
        x_i, state_i, bits_i = h.run3(x0s[i], keys[i])
        pick = functools.partial(jax.tree_util.tree_map, lambda leaf: leaf[i])
        assert_trees_close(pick(xs), x_i)
        assert_trees_close(h.debias(*pick((xs, states))), h.debias(x_i, state_i))
        np.testing.assert_allclose(bits[i], bits_i)


def test_consensus_converges(name):
    if name in NO_CONSENSUS:
        pytest.skip(f"{name} does not reach consensus from every start: {NO_CONSENSUS[name]}")
    h = harness(name)
    x0 = make_x0(seed=3)
    result = jg.run_consensus(h.alg, x0, CONVERGE_STEPS, jax.random.key(7))
    error = np.asarray(result.error)
    assert np.all(np.isfinite(error))
    factor = CONVERGE_FACTOR.get(name, DEFAULT_CONVERGE_FACTOR)
    if name in NOT_THE_MEAN:
        spread = float(jg.consensus_distance(h.debias(result.x, result.state)))
        assert spread < factor * float(jg.consensus_distance(x0)), f"{name} ({NOT_THE_MEAN[name]}): no consensus"
        assert result.bits[0] == 0 and np.all(np.diff(result.bits) > 0)
        return
    assert error[-1] < factor * error[0], f"{name}: error {error[0]:.3g} -> {error[-1]:.3g}"
    # the bits are cumulative and grow every round
    assert result.bits[0] == 0 and np.all(np.diff(result.bits) > 0)
    # the models every node evaluates agree with the initial average
    mean0 = jg.node_mean(x0)
    z = h.debias(result.x, result.state)
    for leaf, m in zip(jax.tree_util.tree_leaves(z), jax.tree_util.tree_leaves(mean0)):
        np.testing.assert_allclose(leaf, np.broadcast_to(m, leaf.shape), atol=np.sqrt(factor) * 10)


def test_consensus_is_a_fixed_point(name):
    """Identical models on all nodes stay identical and equal.

    On the suite's node-symmetric (circulant) graphs with deterministic compressors every node
    does the same thing, so the nodes stay identical; doubly stochastic methods and mass-preserving
    push-sum methods then keep them at the common value c. This holds from the first round even
    for compressed methods whose public copies start at 0 (x_hat lags x, but identically on every
    node, so the differences the nodes exchange cancel).
    """
    h = harness(name)
    c = make_x0(seed=4)
    x0 = jax.tree_util.tree_map(lambda leaf: jnp.broadcast_to(leaf[:1], leaf.shape), c)
    x, state = x0, h.alg.init(x0)
    for i in range(4):
        x, state, _ = h.step(x, state, jax.random.key(100 + i))
        assert_trees_close(h.debias(x, state), x0, rtol=1e-5, atol=1e-5)


def test_consensus_fixed_point_on_irregular_graphs(name):
    """The same start on graphs that are not node-symmetric: the star (doubly stochastic methods)
    and a random column-stochastic digraph (push-sum methods).

    Doubly stochastic methods stay exactly at c: every W(t) has rows summing to 1, so whatever is
    mixed (x, or public copies that are identical across nodes) is unchanged. Compressed push-sum
    with public copies starting at 0 is NOT a fixed point there: the first messages carry only part
    of c, the row sums of W differ from 1, so x_i / w_i leaves c (by ~0.2 for Sparse-Push at
    top-50 %) and only returns once the public copies have caught up. Exact push-sum stays at c.
    What holds for all: the debiased models settle back on c.
    """
    topo = T.random_directed(N, 0.4, 0) if is_push(name) else T.star(N)
    try:
        alg = build(name, topo)
    except ValueError as err:  # an algorithm added later may not accept this graph
        pytest.skip(f"{name} does not accept {topo.name}: {err}")
    c = make_x0(seed=5)
    x0 = jax.tree_util.tree_map(lambda leaf: jnp.broadcast_to(leaf[:1], leaf.shape), c)
    scale = sum(float(jnp.sum(leaf[0] ** 2)) for leaf in jax.tree_util.tree_leaves(c))
    error = np.asarray(jg.run_consensus(alg, x0, 150, jax.random.key(8)).error) / scale
    assert np.all(np.isfinite(error))
    if is_push(name):
        assert error[-1] < 1e-10, f"{name}: relative error at the end {error[-1]:.3g}"
    else:
        assert np.all(error < 1e-12), f"{name}: relative errors {error[:5]}"


def test_init_validates_params(name):
    alg = harness(name).alg
    with pytest.raises(ValueError, match=f"N={N}"):
        alg.init({"w": jnp.ones((N, 4, 3)), "b": jnp.ones((N - 1, 5))})
    with pytest.raises(TypeError, match="floating"):
        alg.init({"w": jnp.ones((N, 4, 3), jnp.int32)})


# ---------------------------------------------------------------- graph checks: one function, one message


def _outcome(fn):
    """``("ok", None)`` or the (type, message) of what ``fn()`` raises."""
    try:
        fn()
    except (TypeError, ValueError) as err:
        return type(err).__name__, str(err)
    return "ok", None


def _bad_graphs():
    """Graphs some algorithm refuses: weights, direction, period, stochasticity, stacks, no graph."""
    from _reference import column_stochastic_only, row_stochastic_only

    return {
        "random_directed": T.random_directed(N, 0.4, 0),
        "row_stochastic_only": row_stochastic_only(),
        "column_stochastic_only": column_stochastic_only(),
        "directed_ring": T.directed_ring(N),
        "exponential": T.exponential(N),
        "one_peer_exponential": T.one_peer_exponential(N),
        "schedule": T.schedule([T.ring(N), T.hypercube(N)]),
        "random_matching": T.random_matching(N),
        "random_out": T.random_out(N, 2),
        "directed_failures": T.with_failures(T.directed_ring(N), 0.2),
        "ring_failures": T.with_failures(T.ring(N), 0.2),
        "stack": T.stack([T.ring(N), T.torus(2, 4)]),
        "directed_stack": T.stack([T.directed_ring(N)]),
        "not_a_topology": np.eye(3),
    }


def test_factory_called_directly_and_make_refuse_a_graph_with_check_graphs_message(name):
    """A factory called directly refuses a graph exactly as ``make`` does: with the message of
    ``check_graph`` on the algorithm's registered metadata (built on a stack member under vmap)."""
    factory = algorithms.REGISTRY[name]
    entry = algorithms.info(name)
    accepted = set(inspect.signature(factory).parameters)
    kwargs = {k: v for k, v in KWARGS.get(name, {}).items() if k in accepted}
    refused = []
    for label, graph in _bad_graphs().items():
        if label.endswith("stack"):

            def on_member(build_one, graph=graph):
                return lambda: jax.vmap(lambda m: (build_one(m), jnp.zeros(()))[1])(graph)

            want = _outcome(on_member(lambda m: algorithms.check_graph(name, entry, m)))
            direct = _outcome(on_member(lambda m: factory(m, **kwargs)))
            made = _outcome(on_member(lambda m: algorithms.make(name, m, **kwargs)))
        else:
            want = _outcome(lambda graph=graph: algorithms.check_graph(name, entry, graph))
            direct = _outcome(lambda graph=graph: factory(graph, **kwargs))
            made = _outcome(lambda graph=graph: algorithms.make(name, graph, **kwargs))
        assert direct == made, (label, direct, made)
        if want[0] != "ok":
            assert direct == want, (label, direct, want)
            assert name in want[1], (label, want)  # the message names the algorithm
            refused.append(label)
    # Every algorithm that asks something of the weights refuses some graph here.
    assert refused or entry.graph.mixing == "any", name
