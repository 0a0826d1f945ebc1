"""Tests for jaxgossip.ops.mixing: ``mix`` against ``W(t) @ x`` computed in NumPy (float64) for every
topology and every kernel, pytrees of mixed ranks and dtypes, static/traced ``t`` (jit, scan),
vmap over seeds, invariants (mean / mass conservation, exact one-peer averaging), helpers and
validation errors."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import assert_tree_close, node_normal

import jaxgossip as jg
from jaxgossip import topology as T
from jaxgossip.ops import mixing

KERNELS = ("slots", "dense", "segment")


def _adj_metropolis():
    rng = np.random.default_rng(3)
    n = 7
    a = np.triu((rng.random((n, n)) < 0.3).astype(float), 1)
    a = a + a.T
    for i in range(n):  # path keeps it connected
        a[i, (i + 1) % n] = a[(i + 1) % n, i] = 1
    return T.from_adjacency(a, weights="metropolis")


def _adj_column():
    rng = np.random.default_rng(4)
    n = 6
    a = (rng.random((n, n)) < 0.3).astype(float)
    for i in range(n):
        a[(i + 1) % n, i] = 1
    return T.from_adjacency(a, weights="column")


def _matrix_schedule():
    rng = np.random.default_rng(5)
    n = 5
    mats = []
    for _ in range(3):
        coef = rng.dirichlet(np.ones(3))
        m = coef[0] * np.eye(n) + coef[1] * np.roll(np.eye(n), 1, 0) + coef[2] * np.eye(n)[rng.permutation(n)]
        mats.append(m)
    return T.from_matrix(np.stack(mats))


def _no_self_loops():
    # rounds without, with, and partly with self-loops: the slot table must add a weight-0 self slot
    n = 6
    a = 0.5 * np.roll(np.eye(n), 1, 0) + 0.5 * np.roll(np.eye(n), -1, 0)
    c = 0.3 * np.eye(n)[[0, 2, 1, 4, 5, 3]] + 0.7 * np.roll(np.eye(n), 2, 0)
    return T.from_matrix(np.stack([a, T.ring(n).matrix(0), c]))


TOPOLOGIES = {
    "ring5": lambda: T.ring(5),
    "ring8": lambda: T.ring(8),
    "directed_ring6": lambda: T.directed_ring(6),
    "torus2x3": lambda: T.torus(2, 3),
    "torus3x4": lambda: T.torus(3, 4),
    "hypercube8": lambda: T.hypercube(8),
    "exponential6": lambda: T.exponential(6),
    "exponential8": lambda: T.exponential(8),
    "one_peer6": lambda: T.one_peer_exponential(6),
    "one_peer8": lambda: T.one_peer_exponential(8),
    "complete5": lambda: T.complete(5),
    "star7": lambda: T.star(7),
    "erdos_renyi9": lambda: T.erdos_renyi(9, 0.4, 0),
    "random_directed7": lambda: T.random_directed(7, 0.4, 1),
    "adjacency_metropolis7": _adj_metropolis,
    "adjacency_column6": _adj_column,
    "from_matrix_T3": _matrix_schedule,
    "schedule": lambda: T.schedule([T.ring(6), T.one_peer_exponential(6)]),
    "no_self_loops": _no_self_loops,
}
DOUBLY = [k for k in TOPOLOGIES if k not in ("random_directed7", "adjacency_column6")]
TIME_VARYING = ["one_peer6", "one_peer8", "from_matrix_T3", "schedule", "no_self_loops"]

# float32 identities at float32 tolerance; low-precision leaves are mixed in float32 and rounded
# once, so they are compared against the float64 result with their own resolution.
TOL = {
    "float32": dict(rtol=1e-5, atol=1e-6),
    "bfloat16": dict(rtol=1.6e-2, atol=1.6e-2),
    "float16": dict(rtol=2e-3, atol=2e-3),
}


def make_tree(n, seed=0):
    raw = node_normal(n, {"w": (3, 2), "half0": (4,), "half1": ()}, seed, dtype=None)
    return {
        "w": jnp.asarray(raw["w"], jnp.float32),
        "half": [jnp.asarray(raw["half0"], jnp.bfloat16), jnp.asarray(raw["half1"], jnp.float16)],
    }


def ref_mix(w, tree):
    """W @ x per leaf in float64 NumPy, from the leaf's own (possibly low-precision) values."""

    def one(leaf):
        x = np.asarray(leaf, np.float32).astype(np.float64)
        return (w @ x.reshape(x.shape[0], -1)).reshape(x.shape)

    return jax.tree_util.tree_map(one, tree)


def with_kernel(topo, kernel):
    return dataclasses.replace(topo, kernel=kernel)


# ---------------------------------------------------------------- mix == W(t) @ x


@functools.cache
def _mixed(name):
    """Every kernel of topology ``name`` in ONE jit (compiles dominate on a shared 2-core CPU):
    static t for each round of the period plus a wrap-around round, and for time-varying graphs
    the same rounds with a traced scalar t (a static graph ignores t).
    Returns (topology, x, {kernel: (static list, traced tree or None)}) as NumPy."""
    base = TOPOLOGIES[name]()
    topos = {k: with_kernel(base, k) for k in KERNELS}
    rounds = base.period + 1
    x = make_tree(base.num_nodes)

    @jax.jit
    def run_static(x):
        return {kernel: [jg.mix(topo, x, t) for t in range(rounds)] for kernel, topo in topos.items()}

    @jax.jit
    def run_traced(x, t):
        return {kernel: jg.mix(topo, x, t) for kernel, topo in topos.items()}

    static = jax.device_get(run_static(x))
    traced = [jax.device_get(run_traced(x, jnp.int32(t))) for t in range(rounds)] if base.period > 1 else None
    out = {k: (static[k], None if traced is None else [tr[k] for tr in traced]) for k in KERNELS}
    return base, jax.device_get(x), out


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_mix_matches_dense_reference(name):
    base, x, out = _mixed(name)
    for kernel in KERNELS:
        assert with_kernel(base, kernel).resolved_kernel == kernel
        static, traced = out[kernel]
        for t in range(base.period + 1):  # the whole period plus wrap-around
            want = ref_mix(base.matrix(t), x)
            assert_tree_close(static[t], want, by_dtype=TOL)
            if traced is not None:
                assert_tree_close(traced[t], want, by_dtype=TOL)
            for g, leaf in zip(jax.tree_util.tree_leaves(static[t]), jax.tree_util.tree_leaves(x)):
                assert g.dtype == leaf.dtype and g.shape == leaf.shape


@pytest.mark.parametrize("name", DOUBLY)
def test_doubly_stochastic_mixing_preserves_mean(name):
    base, x, out = _mixed(name)
    assert base.is_doubly_stochastic
    for kernel in KERNELS:
        static, _ = out[kernel]
        for y in static:
            for got, leaf in zip(jax.tree_util.tree_leaves(y), jax.tree_util.tree_leaves(x)):
                tol = TOL[np.dtype(got.dtype).name]
                mean = np.asarray(leaf, np.float32).astype(np.float64).mean(0)
                np.testing.assert_allclose(np.asarray(got, np.float32).mean(0), mean, **tol)


@pytest.mark.parametrize("name", ["random_directed7", "adjacency_column6", "directed_ring6"])
def test_column_stochastic_mixing_preserves_total(name):
    base, x, out = _mixed(name)
    assert base.is_column_stochastic
    for kernel in KERNELS:
        static, _ = out[kernel]
        for y in static:
            for got, leaf in zip(jax.tree_util.tree_leaves(y), jax.tree_util.tree_leaves(x)):
                tol = TOL[np.dtype(got.dtype).name]
                total = np.asarray(leaf, np.float32).astype(np.float64).sum(0)
                np.testing.assert_allclose(
                    np.asarray(got, np.float32).sum(0), total, rtol=tol["rtol"], atol=tol["atol"] * 4
                )


def test_column_stochastic_mixing_does_not_preserve_mean_of_rows():
    # the total test above is not vacuous: rows of random_directed do not sum to 1
    topo = TOPOLOGIES["random_directed7"]()
    assert not topo.is_row_stochastic
    assert not np.allclose(jg.mix(topo, jnp.ones((7, 1))), 1.0)


@pytest.mark.parametrize("name", TIME_VARYING + ["ring8", "adjacency_column6"])
def test_mix_in_scan_with_traced_round(name):
    base = TOPOLOGIES[name]()
    topos = [with_kernel(base, k) for k in KERNELS]
    n = base.num_nodes
    num_rounds = 2 * base.period + 1
    rng = np.random.default_rng(2)
    # float32 only: low-precision rounding would accumulate over rounds
    x0 = {
        "w": jnp.asarray(rng.normal(size=(n, 3, 2)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(n,)), jnp.float32),
    }

    @jax.jit
    def run(x, t0):
        def body(carry, _):
            xs, t = carry
            xs = [jg.mix(topo, x, t) for topo, x in zip(topos, xs)]
            return (xs, t + 1), [x["b"] for x in xs]

        (xs, _), history = jax.lax.scan(body, ([x] * len(topos), t0), None, length=num_rounds)
        return xs, history

    mean0 = np.asarray(x0["b"], np.float64).mean()
    total_w0 = np.asarray(x0["w"], np.float64).sum(0)
    for t0 in (0, 1):
        got, history = jax.device_get(run(x0, jnp.int32(t0)))
        want = jax.tree_util.tree_map(lambda leaf: np.asarray(leaf, np.float64), x0)
        for r in range(num_rounds):
            want = ref_mix(base.matrix(t0 + r), want)
            for k in range(len(KERNELS)):
                np.testing.assert_allclose(history[k][r], want["b"], rtol=1e-5, atol=1e-5)
        for k in range(len(KERNELS)):
            assert_tree_close(got[k], want, by_dtype=TOL, atol_scale=10)
            # multi-round invariants: mean (doubly stochastic) or total (column stochastic)
            np.testing.assert_allclose(np.asarray(got[k]["w"]).sum(0), total_w0, rtol=1e-5, atol=1e-4)
            if base.is_doubly_stochastic:
                assert float(np.mean(got[k]["b"])) == pytest.approx(mean0, abs=1e-5)


@pytest.mark.parametrize("name", ["ring5", "one_peer6", "star7", "schedule"])
def test_mix_under_vmap_over_seeds(name):
    base = TOPOLOGIES[name]()
    topos = [with_kernel(base, k) for k in KERNELS]
    n = base.num_nodes
    seeds = 3
    rng = np.random.default_rng(7)
    xs = {
        "a": jnp.asarray(rng.normal(size=(seeds, n, 2, 3)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(seeds, n)), jnp.bfloat16),
    }
    ts = jnp.arange(seeds, dtype=jnp.int32) + 1

    @jax.jit
    def run(xs, ts):
        # the same static t for every seed, and a different traced t per seed
        same = [jax.vmap(lambda x: jg.mix(topo, x, 1))(xs) for topo in topos]
        per_seed = [jax.vmap(lambda x, t: jg.mix(topo, x, t))(xs, ts) for topo in topos]
        return same, per_seed

    same, per_seed = jax.device_get(run(xs, ts))
    xs = jax.device_get(xs)
    for k in range(len(KERNELS)):
        for s in range(seeds):
            x_s = jax.tree_util.tree_map(lambda leaf: leaf[s], xs)
            pick = lambda tree: jax.tree_util.tree_map(lambda leaf: leaf[s], tree)  # noqa: E731
            assert_tree_close(pick(same[k]), ref_mix(base.matrix(1), x_s), by_dtype=TOL)
            assert_tree_close(pick(per_seed[k]), ref_mix(base.matrix(s + 1), x_s), by_dtype=TOL)


def test_mix_gradient_is_transpose():
    # mix is linear: d/dx sum(c * W(t) x) = W(t)^T c, for every kernel and a traced t
    topos = [with_kernel(T.one_peer_exponential(6), k) for k in KERNELS] + [with_kernel(T.star(5), "slots")]
    rng = np.random.default_rng(9)
    xs = [jnp.asarray(rng.normal(size=(tp.num_nodes, 3)), jnp.float32) for tp in topos]
    cs = [rng.normal(size=(tp.num_nodes, 3)).astype(np.float32) for tp in topos]
    grads = jax.jit(
        lambda xs, t: [jax.grad(lambda x: jnp.sum(jg.mix(tp, x, t) * c))(x) for tp, x, c in zip(topos, xs, cs)]
    )(xs, jnp.int32(1))
    for tp, c, g in zip(topos, cs, grads):
        np.testing.assert_allclose(g, tp.matrix(1).T @ c, rtol=1e-5, atol=1e-6)


def test_mix_default_kernel():
    for name in ("ring8", "star7", "one_peer6", "random_directed7"):
        topo = TOPOLOGIES[name]()
        assert topo.kernel == "auto" and topo.resolved_kernel in KERNELS
        x = jnp.asarray(np.random.default_rng(1).normal(size=(topo.num_nodes, 3)), jnp.float32)
        f = jax.jit(lambda x: (jg.mix(topo, x), jg.mix(topo, x, t=topo.period + 1)))
        a, b = f(x)
        np.testing.assert_allclose(a, topo.matrix(0) @ np.asarray(x, np.float64), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b, topo.matrix(1) @ np.asarray(x, np.float64), rtol=1e-5, atol=1e-6)


def test_mix_single_leaf_and_tuple_trees():
    topo = T.ring(6)
    x = jnp.arange(12.0).reshape(6, 2)
    single, tup = jax.jit(lambda x: (jg.mix(topo, x), jg.mix(topo, (x, (x[:, 0],)))))(x)
    np.testing.assert_allclose(single, topo.matrix(0) @ np.asarray(x), rtol=1e-6)
    assert isinstance(tup, tuple) and isinstance(tup[1], tuple)
    np.testing.assert_allclose(tup[1][0], topo.matrix(0) @ np.asarray(x[:, 0]), rtol=1e-6)


def test_mix_t_accepts_numpy_and_negative_ints():
    topo = T.one_peer_exponential(8)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 3)), jnp.float32)
    ts = (np.int64(4), np.int32(2), -1, 7)
    outs = jax.jit(lambda x, tt: ([jg.mix(topo, x, t) for t in ts], jg.mix(topo, x, tt)))(x, jnp.int32(-1))
    for t, got in zip(ts, outs[0]):
        np.testing.assert_allclose(got, topo.matrix(int(t) % 3) @ np.asarray(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[1], topo.matrix(2) @ np.asarray(x), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- invariants


@pytest.mark.parametrize("n", (2, 4, 8, 16, 32))
def test_one_peer_exponential_exact_average_after_log2n_rounds(n):
    base = T.one_peer_exponential(n)
    topos = [with_kernel(base, k) for k in KERNELS]
    tau = int(np.log2(n))
    assert base.period == tau
    x0 = jnp.asarray(np.random.default_rng(n).normal(size=(n, 3)), jnp.float32)
    mean = np.asarray(x0, np.float64).mean(0)

    @jax.jit
    def run(x0, start):  # tau rounds from round `start`, every kernel; history of all rounds
        def body(xs, t):
            xs = [jg.mix(topo, x, t) for topo, x in zip(topos, xs)]
            return xs, xs

        return jax.lax.scan(body, [x0] * len(topos), start + jnp.arange(tau, dtype=jnp.int32))

    # any tau consecutive rounds average exactly (the round matrices are circulant and commute)
    for start in range(tau):
        final, history = jax.device_get(run(x0, jnp.int32(start)))
        for k in range(len(KERNELS)):
            np.testing.assert_allclose(final[k], np.broadcast_to(mean, (n, 3)), rtol=1e-5, atol=1e-5)
            for r in range(tau - 1):  # and not before
                assert not np.allclose(history[k][r], mean[None], atol=1e-3)
    prod = np.eye(n)
    for t in range(tau):
        prod = base.matrix(t) @ prod
    np.testing.assert_allclose(prod, np.full((n, n), 1 / n), atol=1e-12)


@pytest.mark.parametrize("n", (3, 6, 12))
def test_one_peer_exponential_non_power_of_two_converges_but_not_exactly(n):
    topo = T.one_peer_exponential(n)
    tau = topo.period
    x0 = jnp.asarray(np.random.default_rng(0).normal(size=(n, 4)), jnp.float32)
    mean = np.asarray(x0, np.float64).mean(0)

    @jax.jit
    def run(x):
        def body(x, t):
            x = jg.mix(topo, x, t)
            return x, mixing.consensus_distance(x)

        return jax.lax.scan(body, x, jnp.arange(40 * tau))

    x, dist = run(x0)
    dist0 = float(mixing.consensus_distance(x0))
    assert float(dist[tau - 1]) > 1e-4 * dist0  # one period is not exact averaging
    assert float(dist[-1]) < 1e-8 * dist0  # but it converges
    np.testing.assert_allclose(np.asarray(x).mean(0), mean, rtol=1e-5, atol=1e-5)


def test_complete_averages_in_one_round():
    topos = [with_kernel(T.complete(6), k) for k in KERNELS]
    x = jnp.asarray(np.random.default_rng(0).normal(size=(6, 3)), jnp.float32)
    for got in jax.jit(lambda x: [jg.mix(topo, x) for topo in topos])(x):
        np.testing.assert_allclose(got, np.broadcast_to(np.asarray(x).mean(0), (6, 3)), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- helpers


def test_node_mean_consensus_distance_and_sizes():
    x = make_tree(5, seed=3)
    np_leaves = [np.asarray(leaf, np.float32).astype(np.float64) for leaf in jax.tree_util.tree_leaves(x)]
    target = jax.tree_util.tree_map(lambda leaf: jnp.ones(leaf.shape[1:], jnp.float32), x)
    means, dist, dist_t = jax.jit(
        lambda x, target: (mixing.node_mean(x), mixing.consensus_distance(x), mixing.consensus_distance(x, target))
    )(x, target)
    for got, leaf in zip(jax.tree_util.tree_leaves(means), np_leaves):
        assert got.dtype == jnp.float32  # low-precision leaves are averaged in float32
        np.testing.assert_allclose(got, leaf.mean(0), rtol=1e-5, atol=1e-6)
    want = sum(((leaf - leaf.mean(0)) ** 2).sum() for leaf in np_leaves) / 5
    assert float(dist) == pytest.approx(want, rel=1e-5)
    want_t = sum(((leaf - 1.0) ** 2).sum() for leaf in np_leaves) / 5
    assert float(dist_t) == pytest.approx(want_t, rel=1e-5)
    assert mixing.num_params_per_node(x) == 6 + 4 + 1
    assert mixing.leaf_bits(x) == 32 * 6 + 16 * 4 + 16 * 1
    assert float(mixing.consensus_distance(jnp.ones((4, 3)))) == 0.0


# ---------------------------------------------------------------- validation errors


def test_mix_rejects_wrong_node_axis():
    topo = T.ring(8)
    with pytest.raises(ValueError, match=r"leaf \['b'\] has shape \(7, 2\).*N=8"):
        jg.mix(topo, {"a": jnp.ones((8, 2)), "b": jnp.ones((7, 2))})
    with pytest.raises(ValueError, match="leading node axis of size N=8"):
        jg.mix(topo, jnp.ones((2, 8)))
    with pytest.raises(ValueError, match=r"has shape \(\)"):
        jg.mix(topo, jnp.float32(1.0))
    with pytest.raises(ValueError, match="empty pytree"):
        jg.mix(topo, {})


def test_mix_rejects_integer_and_bool_leaves():
    topo = T.ring(8)
    with pytest.raises(TypeError, match="int32.*floating"):
        jg.mix(topo, {"a": jnp.ones((8, 2), jnp.int32)})
    with pytest.raises(TypeError, match="floating"):
        jg.mix(topo, jnp.ones((8,), bool))
    with pytest.raises(TypeError, match="floating"):
        jax.jit(lambda x: jg.mix(topo, x))(jnp.ones((8, 2), jnp.int32))


# ---------------------------------------------------------------- kernel choice (performance contract)


def _num_gathers(topo, shape):
    jaxpr = jax.make_jaxpr(lambda x: jg.mix(topo, x))(jnp.ones(shape, jnp.float32))
    return sum(eqn.primitive.name == "gather" for eqn in jaxpr.jaxpr.eqns)


def test_static_shift_graphs_use_roll():
    # a directed ring and a static round of one-peer exponential are pure shifts: no gather
    assert _num_gathers(T.directed_ring(8), (8, 4)) == 0
    assert _num_gathers(T.from_matrix(T.one_peer_exponential(5).matrix(1)), (5, 4)) == 0


@pytest.mark.parametrize("name", ["ring8", "exponential8"])
def test_circulant_graphs_use_roll(name):
    assert _num_gathers(TOPOLOGIES[name](), (8, 4)) == 0
