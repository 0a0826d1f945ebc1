"""``sharding.mix_ppermute`` (shard_map + ppermute for circulant graphs) equals ``mixing.mix`` and
a plain NumPy ``W(t) @ x`` on 8 CPU devices (tests/conftest.py requests them), for static and
traced rounds, and rejects graphs and meshes it cannot serve."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import jaxgossip as jg
from jaxgossip import topology as T
from jaxgossip.ops.sharding import circulant_shifts, mix_ppermute, node_mesh, replicate

NUM_DEVICES = 8

pytestmark = pytest.mark.skipif(
    jax.device_count() < NUM_DEVICES,
    reason=f"needs {NUM_DEVICES} devices (conftest sets jax_num_cpu_devices=8; got {jax.device_count()})",
)

CIRCULANT = {
    "ring": T.ring,
    "directed_ring": T.directed_ring,
    "exponential": T.exponential,
    "one_peer_exponential": T.one_peer_exponential,
}


def make_x(n, seed=0, bf16=True):
    rng = np.random.default_rng(seed)
    x = {
        "w": jnp.asarray(rng.normal(size=(n, 4, 3)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(n,)), jnp.float32),
        "deep": [jnp.asarray(rng.normal(size=(n, 2, 1, 5)), jnp.float32)],
    }
    if bf16:
        x["half"] = jnp.asarray(rng.normal(size=(n, 7)), jnp.bfloat16)
    return x


def numpy_mix(topo, x, t):
    def one(leaf):
        flat = np.asarray(leaf, np.float64).reshape(leaf.shape[0], -1)
        return (topo.matrix(t) @ flat).reshape(leaf.shape)

    return jax.tree_util.tree_map(one, x)


def assert_matches(got, topo, x, t, want_mix=None):
    """got == mix(topo, x, t) (tight) and == W(t) @ x in float64 (to the leaf's precision)."""
    if want_mix is None:
        want_mix = jg.mix(topo, x, t)
    want_np = numpy_mix(topo, x, t)
    for a, b, c in zip(*(jax.tree_util.tree_leaves(tree) for tree in (got, want_mix, want_np))):
        assert a.dtype == b.dtype and a.shape == b.shape
        a = np.asarray(a, np.float64)
        if b.dtype == jnp.bfloat16:
            # Both round one float32 sum to bfloat16; at most one bfloat16 ulp apart.
            np.testing.assert_allclose(a, np.asarray(b, np.float64), rtol=2**-7, atol=1e-6)
            np.testing.assert_allclose(a, c, rtol=2**-7, atol=2**-7)
        else:
            np.testing.assert_allclose(a, np.asarray(b, np.float64), rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)


# Every N and every device count for each graph by default (the diagonal of the grid: N = 8 on 8
# devices, 16 on 4, 64 on 2); the rest of the 3 x 3 grid with -m slow.
_DIAGONAL = {(8, 8), (16, 4), (64, 2)}
_GRID = [
    pytest.param(n, d, marks=() if (n, d) in _DIAGONAL else pytest.mark.slow, id=f"{n}-{d}")
    for n in (8, 16, 64)
    for d in (2, 4, 8)
]


@pytest.mark.parametrize("n,num_devices", _GRID)
@pytest.mark.parametrize("name", sorted(CIRCULANT))
def test_matches_mix_and_numpy_static_and_traced_rounds(name, n, num_devices):
    """Every round of the period with a static t, and rounds 0 .. 2T (wrapping once) from a traced
    lax.scan counter, all in one jit (one compile per case keeps the 36 cases fast)."""
    topo = CIRCULANT[name](n)
    mesh = node_mesh(n, num_devices)
    x = make_x(n)
    period, rounds = topo.period, 2 * topo.period + 1

    @jax.jit
    def run(x):
        static = [mix_ppermute(topo, x, t, mesh) for t in range(period)]
        # Each scan step mixes the same x, so that every traced round is checked on its own.
        traced = jax.lax.scan(lambda c, t: (c, mix_ppermute(topo, x, t, mesh)), 0, jnp.arange(rounds))[1]
        reference = [jg.mix(topo, x, t) for t in range(period)]
        return static, traced, reference

    static, traced, reference = run(x)
    for t in range(period):
        assert_matches(static[t], topo, x, t, reference[t])
        assert len(static[t]["w"].sharding.device_set) == num_devices
    for t in range(rounds):
        assert_matches(jax.tree_util.tree_map(lambda leaf: leaf[t], traced), topo, x, t, reference[t % period])


def test_eager_calls_match_mix():
    """Outside jit, static and traced-array rounds (the cached jitted shard_map)."""
    topo = T.one_peer_exponential(16)
    mesh = node_mesh(16, 4)
    x = make_x(16, seed=1)
    for t in range(topo.period):
        assert_matches(mix_ppermute(topo, x, t, mesh), topo, x, t)
        assert_matches(mix_ppermute(topo, x, jnp.int32(t), mesh), topo, x, t)
    default_mesh = mix_ppermute(T.ring(16), x, 0)
    assert len(default_mesh["w"].sharding.device_set) == NUM_DEVICES
    assert_matches(default_mesh, T.ring(16), x, 0)


@pytest.mark.parametrize("name", sorted(CIRCULANT))
def test_scan_of_rounds_matches_mix_and_preserves_mean(name):
    """12 consecutive rounds x <- W(t) x in one jitted scan on 8 devices: equals the same scan with
    mix, and the node mean is preserved (all four graphs are doubly stochastic)."""
    n = 16
    topo = CIRCULANT[name](n)
    mesh = node_mesh(n, NUM_DEVICES)
    x = make_x(n, seed=2, bf16=False)

    def run(mixer):
        return jax.jit(lambda x: jax.lax.scan(lambda x, t: (mixer(x, t), None), x, jnp.arange(12))[0])(x)

    got = run(lambda x, t: mix_ppermute(topo, x, t, mesh))
    want = run(lambda x, t: jg.mix(topo, x, t))
    for a, b, leaf in zip(*(jax.tree_util.tree_leaves(tree) for tree in (got, want, x))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.mean(a, axis=0), np.mean(np.asarray(leaf, np.float64), axis=0), atol=1e-5)


def test_per_node_weights_and_mixed_schedule():
    """A circulant graph whose weights differ per node (sliced to each device's rows) and a
    schedule whose rounds have different shift sets (lax.switch branches of different shapes)."""
    n = 16
    rng = np.random.default_rng(3)
    w = np.zeros((n, n))
    for c in (0, 1, 5, 11):
        w[np.arange(n), (np.arange(n) + c) % n] = rng.uniform(0.1, 1.0, size=n)
    w /= w.sum(axis=1, keepdims=True)
    weighted = T.from_matrix(w, name="weighted_circulant(16)")
    mixed = T.schedule([T.ring(n), T.exponential(n), T.one_peer_exponential(n)])
    x = make_x(n, seed=4)
    for topo in (weighted, mixed):
        for num_devices in (2, 8):
            mesh = node_mesh(n, num_devices)
            ts = jnp.arange(topo.period)
            static = jax.jit(lambda x: [mix_ppermute(topo, x, t, mesh) for t in range(topo.period)])(x)
            traced = jax.jit(jax.vmap(lambda t: mix_ppermute(topo, x, t, mesh)))(ts)
            for t in range(topo.period):
                assert_matches(static[t], topo, x, t)
                assert_matches(jax.tree_util.tree_map(lambda leaf: leaf[t], traced), topo, x, t)


@pytest.mark.parametrize(
    "topo",
    [T.ring(12), T.exponential(16), T.one_peer_exponential(16), T.complete(8), T.hypercube(2)],
    ids=lambda topo: topo.name,
)
def test_circulant_shifts_rebuild_the_matrices(topo):
    n = topo.num_nodes
    shifts = circulant_shifts(topo)
    assert len(shifts) == topo.period
    for t, terms in enumerate(shifts):
        cs = [c for c, _ in terms]
        assert len(set(cs)) == len(cs) and all(0 <= c < n for c in cs)
        rebuilt = np.zeros((n, n))
        for c, w in terms:
            rebuilt[np.arange(n), (np.arange(n) + c) % n] += w
        np.testing.assert_allclose(rebuilt, topo.matrix(t), atol=1e-12)


def test_complete_graph_on_the_dense_kernel():
    topo = T.complete(8)
    assert topo.resolved_kernel == "dense"
    x = make_x(8, seed=5)
    assert_matches(mix_ppermute(topo, x, 0, node_mesh(8, 4)), topo, x, 0)


@pytest.mark.parametrize(
    "topo",
    [T.star(8), T.erdos_renyi(16, 0.3, seed=0), T.hypercube(8), T.torus(4, 4)],
    ids=lambda topo: topo.name,
)
def test_non_circulant_graph_is_rejected(topo):
    x = make_x(topo.num_nodes, bf16=False)
    with pytest.raises(ValueError, match=re.escape(f"topology {topo.name} is not circulant")):
        mix_ppermute(topo, x, 0, node_mesh(topo.num_nodes, 2))


def test_indivisible_node_count_is_rejected():
    topo = T.ring(12)
    x = make_x(12, bf16=False)
    mesh = Mesh(np.array(jax.devices()[:8]), ("nodes",))
    with pytest.raises(ValueError, match=r"N=12 nodes cannot be split evenly over 8 devices"):
        mix_ppermute(topo, x, 0, mesh)


def test_mesh_without_node_axis_is_rejected():
    topo = T.ring(8)
    mesh = Mesh(np.array(jax.devices()[:8]), ("batch",))
    with pytest.raises(ValueError, match=r"axis named 'nodes'"):
        mix_ppermute(topo, make_x(8, bf16=False), 0, mesh)


def test_bad_leaves_are_rejected():
    topo = T.ring(8)
    mesh = node_mesh(8, 2)
    with pytest.raises(ValueError, match=r"leading node axis of size N=8"):
        mix_ppermute(topo, {"a": jnp.zeros((4, 3))}, 0, mesh)
    with pytest.raises(TypeError, match=r"mixing needs floating leaves"):
        mix_ppermute(topo, {"a": jnp.zeros((8, 3), jnp.int32)}, 0, mesh)


def test_non_topology_is_rejected():
    with pytest.raises(TypeError, match=r"needs a jaxgossip.topology.Topology"):
        mix_ppermute(T.ring(8).matrix(0), make_x(8, bf16=False), 0, node_mesh(8, 2))



def test_closed_over_sharded_data_with_replicated_arguments_runs_the_traced_rounds():
    """A sweep's shape: the node-sharded array is a constant of the jitted program, its arguments
    (here each run's round counter) are replicated on the mesh (``sharding.replicate``); two runs
    (vmap) of 6 rounds of the one-peer exponential graph on 2 devices equal W(5)...W(0) x in NumPy."""
    n, rounds = 8, 6
    topo = T.one_peer_exponential(n)
    mesh = node_mesh(n, 2)
    x0 = np.random.default_rng(3).normal(size=(n, 5)).astype(np.float32)
    x = jax.device_put(x0, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("nodes")))

    def one(t0):
        def body(carry, _):
            y, t = carry
            return (jg.mix(topo, y, t), t + 1), None

        return jax.lax.scan(body, (x * (1.0 + t0), t0), None, length=rounds)[0][0]

    starts = replicate(jnp.arange(2, dtype=jnp.int32), mesh)
    got = np.asarray(jax.jit(jax.vmap(one))(starts), np.float64)
    for member in range(2):
        want = np.asarray(x0, np.float64) * (1.0 + member)
        for t in range(member, member + rounds):
            want = topo.matrix(t) @ want
        np.testing.assert_allclose(got[member], want, rtol=1e-5, atol=1e-6)
