"""Tests for PowerGossip (jaxgossip.algorithms.power_gossip) against a NumPy per-edge loop."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import RESNET20_MATRICES, RESNET20_VECTORS, key_range, resnet20_tree, run_rounds

from jaxgossip import topology as tp
from jaxgossip.algorithms import REGISTRY, make
from jaxgossip.algorithms.gossip import gossip
from jaxgossip.algorithms.matrix_views import as_matrix, from_matrix, matrix_shapes
from jaxgossip.algorithms.power_gossip import MatrixLeaf, power_gossip, view_bases, working_bases, working_view
from jaxgossip.engine.consensus import run_consensus
from jaxgossip.ops.mixing import consensus_distance

RTOL, ATOL = 1e-4, 2e-5


# ---- NumPy reference: a loop over rounds, iterations and edges (docs/algorithms.md, power_gossip) ---


def _np_orth(c):
    """Gram-Schmidt over the columns of c [d, R], each column c / (||c|| + 1e-8)."""
    q = np.zeros_like(c)
    for i in range(c.shape[1]):
        col = c[:, i].copy()
        for j in range(i):
            col -= (q[:, j] @ col) * q[:, j]
        q[:, i] = col / (np.linalg.norm(col) + 1e-8)
    return q


def _np_view(node_leaf, view):
    """One node's leaf -> (m, n) matrix."""
    if view == "leading":
        return node_leaf.reshape(node_leaf.shape[0], -1)
    nd = node_leaf.ndim
    return np.transpose(node_leaf, (nd - 1, nd - 2) + tuple(range(nd - 2))).reshape(node_leaf.shape[-1], -1)


def _np_unview(mat, shape, view):
    if view == "leading":
        return mat.reshape(shape)
    nd = len(shape)
    axes = (nd - 1, nd - 2) + tuple(range(nd - 2))
    return np.transpose(mat.reshape([shape[a] for a in axes]), np.argsort(axes))


def _edge_list(topo):
    """Sorted (a, b), a < b, that are edges in some round (the documented row order of U, V)."""
    edges = set()
    for t in range(topo.period):
        w = topo.matrix(t)
        for a in range(topo.num_nodes):
            for b in range(a + 1, topo.num_nodes):
                if w[a, b] > 0 or w[b, a] > 0:
                    edges.add((a, b))
    return sorted(edges)


@functools.partial(jax.jit, static_argnums=3)
def _normal_row(seed, code, counter, size):
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), code), counter)
    return jax.random.normal(key, (size,), jnp.float32)


def _packed_draw(seed, n, a, b, counter, sizes):
    """The documented shared draw of pair (a, b): N(0, 1) of sum(sizes) from
    fold_in(fold_in(key(seed), a N + b), counter), cut into chunks of ``sizes``."""
    z = _normal_row(seed, a * n + b, counter, int(sum(sizes)))
    return np.split(np.asarray(z, np.float64), np.cumsum(sizes)[:-1])


def reference(
    topo,
    x0,
    state0,
    num_rounds,
    *,
    num_iterations=1,
    gamma=1.0,
    warm_start=True,
    skip_first_round=True,
    vector_gamma=1.0,
    matrix_view="leading",
    seed=0,
):
    """PowerGossip by the equations, per edge, in float64. x0: list of [N, ...] leaves."""
    n = topo.num_nodes
    edges = _edge_list(topo)
    x = [np.asarray(leaf, np.float64) for leaf in x0]
    mat_ids = [i for i, leaf in enumerate(x) if leaf.ndim >= 3]
    u = {i: {e: np.asarray(state0.u[k][p], np.float64) for p, e in enumerate(edges)} for k, i in enumerate(mat_ids)}
    v = {i: {e: np.asarray(state0.v[k][p], np.float64) for p, e in enumerate(edges)} for k, i in enumerate(mat_ids)}
    bits = []
    for rnd in range(num_rounds):
        w = topo.matrix(rnd)
        live = [(a, b) for (a, b) in edges if w[a, b] > 0]
        degree = np.zeros(n)
        for a, b in live:
            degree[a] += 1
            degree[b] += 1
        sent = 0.0  # floats to each neighbour this round
        for i, leaf in enumerate(x):
            if leaf.ndim <= 2:  # exact gossip, relaxation vector_gamma
                new = leaf.copy()
                for node in range(n):
                    avg = sum(w[node, j] * leaf[j] for j in range(n))
                    new[node] = leaf[node] + vector_gamma * (avg - leaf[node])
                x[i] = new
                sent += leaf[0].size
        for j in range(num_iterations):
            t = rnd * num_iterations + j
            if skip_first_round and rnd == 0:  # the reference's loop breaks at t = 0: no exchange in round 0
                continue
            if not warm_start:  # one packed draw per pair: all V's (odd t) or all U's (even t)
                dims = [(state0.v if t % 2 == 1 else state0.u)[k].shape[1:] for k in range(len(mat_ids))]
                fresh = {}
                for a, b in live:
                    chunks = _packed_draw(seed, n, a, b, t + 1, [d * r for d, r in dims])
                    for i, chunk, (d, r) in zip(mat_ids, chunks, dims):
                        fresh[i, a, b] = chunk.reshape(d, r)
            for i in mat_ids:
                shape = x[i].shape[1:]
                mats = [_np_view(x[i][node], matrix_view) for node in range(n)]
                m_, n_ = mats[0].shape
                r = min(m_, n_, state0.u[mat_ids.index(i)].shape[-1])
                new = [mat.copy() for mat in mats]
                for a, b in live:
                    d = mats[b] - mats[a]
                    if t % 2 == 1:
                        basis = v[i][(a, b)] if warm_start else fresh[i, a, b]
                        v_hat = _np_orth(basis)
                        p = d @ v_hat
                        u[i][(a, b)], v[i][(a, b)] = p, v_hat
                        delta = p @ v_hat.T
                    else:
                        basis = u[i][(a, b)] if warm_start else fresh[i, a, b]
                        u_hat = _np_orth(basis)
                        q = d.T @ u_hat
                        u[i][(a, b)], v[i][(a, b)] = u_hat, q
                        delta = u_hat @ q.T
                    new[a] += gamma * w[a, b] * delta
                    new[b] -= gamma * w[b, a] * delta
                x[i] = np.stack([_np_unview(mat, shape, matrix_view) for mat in new])
                sent += r * (m_ if t % 2 == 1 else n_)
        bits.append(degree * sent * 32)
    return x, u, v, np.array(bits)


def _tree(rng, n, conv_shape=(3, 2, 2, 4)):
    """A conv-like 4-D leaf, a matrix leaf, a 1-D leaf and a per-node scalar."""
    return {
        "conv": jnp.asarray(rng.normal(size=(n,) + conv_shape), jnp.float32),
        "dense": jnp.asarray(rng.normal(size=(n, 5, 4)), jnp.float32),
        "bias": jnp.asarray(rng.normal(size=(n, 6)), jnp.float32),
        "scale": jnp.asarray(rng.normal(size=(n,)), jnp.float32),
    }


def _topologies():
    return {
        "ring8": tp.ring(8),
        "star5": tp.star(5),  # Metropolis weights, a hub with 4 pairs
        "time_varying": tp.schedule([tp.ring(8), tp.torus(2, 4)]),  # padded pair tables
    }


CASES = [
    # (topology, rank, I, warm, extra options)
    ("ring8", 1, 1, True, {}),
    ("ring8", 2, 2, True, {"matrix_view": "flax_kernel"}),
    ("ring8", 1, 2, False, {}),
    ("star5", 2, 1, False, {"skip_first_round": False}),
    ("time_varying", 2, 1, True, {}),
    ("time_varying", 2, 2, False, {"seed": 3}),
]


@pytest.mark.parametrize("name,rank,num_iterations,warm_start,extra", CASES)
def test_matches_numpy_per_edge_reference(rng, name, rank, num_iterations, warm_start, extra):
    topo = _topologies()[name]
    x0 = _tree(rng, topo.num_nodes)
    opts = dict(num_iterations=num_iterations, gamma=1.3, warm_start=warm_start, vector_gamma=0.7, **extra)
    alg = power_gossip(topo, rank=rank, **opts)
    state0 = alg.init(x0)
    num_rounds = 5
    x, state, bits = run_rounds(alg, x0, key_range(num_rounds))
    leaves, treedef = jax.tree_util.tree_flatten(x0)
    ref_x, ref_u, ref_v, ref_bits = reference(topo, leaves, state0, num_rounds, **opts)
    for got, want in zip(jax.tree_util.tree_leaves(x), ref_x):
        np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL, atol=ATOL)
    mat_ids = [i for i, leaf in enumerate(leaves) if leaf.ndim >= 3]
    for k, i in enumerate(mat_ids):
        for p, e in enumerate(_edge_list(topo)):
            np.testing.assert_allclose(np.asarray(state.u[k][p]), ref_u[i][e], rtol=RTOL, atol=ATOL)
            np.testing.assert_allclose(np.asarray(state.v[k][p]), ref_v[i][e], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(bits, ref_bits, rtol=1e-6)
    assert int(state.count) == num_rounds


def test_state_shapes_and_initial_draws(rng):
    topo = tp.ring(8)
    x0 = _tree(rng, 8)
    state = power_gossip(topo, rank=2, matrix_view="flax_kernel", seed=5).init(x0)
    # leaves in tree order: bias, conv, dense, scale; matrix views: conv (4, 12), dense (4, 5).
    assert [u.shape for u in state.u] == [(8, 4, 2), (8, 4, 2)]
    assert [v.shape for v in state.v] == [(8, 12, 2), (8, 5, 2)]
    # pair (0, 1) is row 0; one packed draw from fold_in(k_e, 0), cut into U_conv, V_conv, U_dense, V_dense.
    chunks = _packed_draw(5, 8, 0, 1, 0, [8, 24, 8, 10])
    # Equal to float32 round-off (another key or order would give other numbers entirely): the draw
    # is compiled inside init's vmapped program, whose arithmetic for the normal's inverse error
    # function may round a few ulps differently from the reference's own program.
    for got, want in zip([state.u[0], state.v[0], state.u[1], state.v[1]], chunks):
        np.testing.assert_allclose(np.asarray(got[0]).ravel(), want, rtol=1e-6, atol=1e-6)


def test_rank_clipped_to_matrix_size(rng):
    x0 = {"w": jnp.asarray(rng.normal(size=(8, 3, 2)), jnp.float32)}
    state = power_gossip(tp.ring(8), rank=5).init(x0)
    assert state.u[0].shape == (8, 3, 2) and state.v[0].shape == (8, 2, 2)


# ---- invariants and reductions ------------------------------------------------------------------


def test_mean_preserved(rng):
    topo = tp.star(6)
    x0 = _tree(rng, 6)
    alg = power_gossip(topo, rank=2, num_iterations=2, gamma=1.4, vector_gamma=1.2)
    x, _, _ = run_rounds(alg, x0, key_range(12))
    for got, start in zip(jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(x0)):
        np.testing.assert_allclose(np.asarray(got).mean(0), np.asarray(start).mean(0), atol=2e-6)


@pytest.mark.parametrize("skip_first_round", [True, False])
def test_full_rank_square_leaves_equal_exact_gossip(rng, skip_first_round):
    topo = tp.ring(6)
    x0 = {
        "w": jnp.asarray(rng.normal(size=(6, 4, 4)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(6, 3)), jnp.float32),
    }
    gamma = 1.2
    alg = power_gossip(topo, rank=4, gamma=gamma, vector_gamma=gamma, skip_first_round=skip_first_round)
    exact = gossip(topo, gamma=gamma)
    step, exact_step = jax.jit(alg.step), jax.jit(exact.step)
    x, state = x0, alg.init(x0)
    y, gstate = x0, exact.init(x0)
    x, state, _ = step(x, state, jax.random.key(0))
    if skip_first_round:  # t = 0: matrices untouched, vectors gossiped
        np.testing.assert_array_equal(np.asarray(x["w"]), np.asarray(x0["w"]))
        y = {"w": y["w"], "b": exact_step(y, gstate, jax.random.key(0))[0]["b"]}
    else:
        y, gstate, _ = exact_step(y, gstate, jax.random.key(0))
    np.testing.assert_allclose(np.asarray(x["b"]), np.asarray(y["b"]), rtol=1e-5, atol=1e-6)
    for k in range(1, 5):  # from the first exchange on, each round is one exact gossip step
        x, state, _ = step(x, state, jax.random.key(k))
        y, gstate, _ = exact_step(y, gstate, jax.random.key(k))
        np.testing.assert_allclose(np.asarray(x["w"]), np.asarray(y["w"]), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(x["b"]), np.asarray(y["b"]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("topo", [tp.ring(8), tp.torus(2, 4)], ids=["ring8", "torus2x4"])
def test_converges_to_mean(rng, topo):
    x0 = {
        "w": jnp.asarray(rng.normal(size=(8, 6, 5)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(8, 4)), jnp.float32),
    }
    alg = make("power_gossip", topo, rank=1, gamma=1.0)
    result = run_consensus(alg, x0, 300, jax.random.key(0))
    error = np.asarray(result.error)
    assert error[-1] < 1e-6 * error[0]
    assert np.all(np.diff(result.bits) > 0)


# ---- bit accounting: ResNet-20 shapes on the 8-ring (docs/training.md, training recipes) -------


def test_resnet20_shapes():
    assert sum(m for m, _ in RESNET20_MATRICES) == 794 and sum(n for _, n in RESNET20_MATRICES) == 5755
    assert sum(m * n for m, n in RESNET20_MATRICES) == 270_896 and sum(RESNET20_VECTORS) == 1_578


@pytest.mark.parametrize("num_iterations,megabytes", [(1, 1.90), (2, 3.19)])
def test_resnet20_bits_per_epoch(num_iterations, megabytes):
    steps_per_epoch = 49
    topo = tp.ring(8)
    x0 = resnet20_tree(8)
    alg = power_gossip(topo, rank=1, num_iterations=num_iterations, gamma=1.308)
    state = alg.init(x0)

    @jax.jit
    def epoch_bits(x, state):
        def body(carry, _):
            x, state = carry
            x, state, info = alg.step(x, state, jax.random.key(0))
            return (x, state), info.bits

        return jax.lax.scan(body, (x, state), None, length=steps_per_epoch)

    per_epoch = []
    x = x0
    for _ in range(3):
        (x, state), bits = epoch_bits(x, state)
        assert bits.shape == (steps_per_epoch, 8)
        np.testing.assert_array_equal(bits, np.broadcast_to(bits[:, :1], bits.shape))  # every ring node sends the same
        per_epoch.append(float(np.sum(np.asarray(bits), dtype=np.float64)) / 8 / 8 / 1e6)  # MB per worker
    # Steady state: epochs 2 and 3 contain equally many right and left steps on average.
    np.testing.assert_allclose(np.mean(per_epoch[1:]), megabytes, rtol=0.01)
    # Epoch 1 lacks the compressed exchanges of round 0 (t = 0 .. I-1): for I = 1 one left step of
    # 5,755 floats; for I = 2 also the right step t = 1 (794 floats).
    floats_per_neighbour = {1: 24 * 794 + 24 * 5755 + 49 * 1578, 2: 48 * 794 + 48 * 5755 + 49 * 1578}
    np.testing.assert_allclose(per_epoch[0], floats_per_neighbour[num_iterations] * 4 * 2 / 1e6, rtol=1e-6)


# ---- API behaviour -------------------------------------------------------------------------------


def test_registered():
    assert REGISTRY["power_gossip"] is power_gossip
    alg = make("power_gossip", tp.ring(8), rank=2, num_iterations=2, gamma=1.308)
    assert alg.name == "power_gossip"


def test_debias_is_identity(rng):
    x0 = _tree(rng, 8)
    alg = power_gossip(tp.ring(8))
    assert alg.debias(x0, alg.init(x0)) is x0


_STAR4 = np.array([[0, 1, 1, 1], [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]])  # irregular: column != row sums


@pytest.mark.parametrize(
    "topo,kwargs,error,match",
    [
        (tp.directed_ring(4), {}, ValueError, "symmetric"),
        (tp.from_adjacency(_STAR4, weights="column"), {}, ValueError, "doubly stochastic"),
        (tp.ring(8), {"rank": 0}, ValueError, "rank"),
        (tp.ring(8), {"rank": 1.5}, TypeError, "rank"),
        (tp.ring(8), {"num_iterations": 0}, ValueError, "num_iterations"),
        (tp.ring(8), {"gamma": 0.0}, ValueError, "gamma"),
        (tp.ring(8), {"gamma": -1.0}, ValueError, "gamma"),
        (tp.ring(8), {"gamma": float("nan")}, ValueError, "gamma"),
        (tp.ring(8), {"vector_gamma": 0.0}, ValueError, "vector_gamma"),
        (tp.ring(8), {"matrix_view": "torch"}, ValueError, "matrix_view"),
        (tp.ring(8), {"warm_start": "yes"}, TypeError, "warm_start"),
        (tp.ring(8), {"skip_first_round": 1}, TypeError, "skip_first_round"),
        (tp.ring(8), {"seed": "abc"}, TypeError, "seed"),
    ],
)
def test_validation_errors(topo, kwargs, error, match):
    with pytest.raises(error, match=match):
        power_gossip(topo, **kwargs)


def test_wrong_params_rejected(rng):
    alg = power_gossip(tp.ring(8))
    with pytest.raises(ValueError, match="leading node axis"):
        alg.init({"w": jnp.zeros((7, 3, 3))})
    state = alg.init({"w": jnp.zeros((8, 3, 3))})
    with pytest.raises(ValueError, match="matrix leaves"):
        alg.step({"w": jnp.zeros((8, 3, 3)), "u": jnp.zeros((8, 2, 2))}, state, jax.random.key(0))


def test_no_retrace_on_second_call(rng):
    x0 = _tree(rng, 8)
    alg = power_gossip(tp.ring(8), rank=2, num_iterations=2)
    traces = []

    def step(x, state, key):
        traces.append(1)
        return alg.step(x, state, key)

    step = jax.jit(step)
    state = alg.init(x0)
    x, state, _ = step(x0, state, jax.random.key(0))
    x, state, _ = step(x, state, jax.random.key(1))
    assert len(traces) == 1


def test_same_seed_same_result(rng):
    x0 = _tree(rng, 8)
    runs = [run_rounds(power_gossip(tp.ring(8), rank=2, seed=4), x0, key_range(3))[0] for _ in range(2)]
    for a, b in zip(jax.tree_util.tree_leaves(runs[0]), jax.tree_util.tree_leaves(runs[1])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    other = power_gossip(tp.ring(8), rank=2, seed=5).init(x0)
    assert not np.allclose(np.asarray(other.u[0]), np.asarray(power_gossip(tp.ring(8), rank=2, seed=4).init(x0).u[0]))


def test_gamma_sweepable_under_vmap(rng):
    topo = tp.ring(8)
    x0 = _tree(rng, 8)
    gammas = jnp.array([0.8, 1.3])

    def two_rounds(gamma):
        alg = power_gossip(topo, rank=1, gamma=gamma, vector_gamma=gamma)
        x, state = x0, alg.init(x0)
        for k in range(2):
            x, state, _ = alg.step(x, state, jax.random.key(k))
        return x

    swept = jax.jit(jax.vmap(two_rounds))(gammas)
    single_run = jax.jit(two_rounds)
    for i, g in enumerate([0.8, 1.3]):
        single = single_run(jnp.float32(g))
        for a, b in zip(jax.tree_util.tree_leaves(swept), jax.tree_util.tree_leaves(single)):
            np.testing.assert_allclose(np.asarray(a[i]), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_as_matrix_matches_pytorch_layout_and_inverts():
    kernel = jax.random.normal(jax.random.key(1), (3, 2, 4, 5))  # (kh, kw, C_in, F)
    matrix = as_matrix(kernel)
    assert matrix.shape == (5, 4 * 3 * 2)
    torch_weight = np.transpose(np.asarray(kernel), (3, 2, 0, 1))  # (F, C_in, kh, kw)
    np.testing.assert_array_equal(matrix, torch_weight.reshape(5, -1))
    np.testing.assert_array_equal(from_matrix(matrix, kernel.shape), kernel)
    dense = jnp.arange(6.0).reshape(2, 3)  # (C_in, F)
    np.testing.assert_array_equal(as_matrix(dense), dense.T)
    assert matrix_shapes({"k": kernel, "b": jnp.zeros(5)}, view="leading") == [(3, 40)]
    leading = as_matrix(kernel, "leading")  # (shape[0], -1) of the leaf as stored
    np.testing.assert_array_equal(leading, np.asarray(kernel).reshape(3, -1))
    np.testing.assert_array_equal(from_matrix(leading, kernel.shape, "leading"), kernel)
    with pytest.raises(ValueError, match="view='raw' is unknown"):
        matrix_shapes({"k": kernel}, view="raw")


def test_flax_kernel_view_matches_pytorch_matrix(rng):
    kernel = jnp.asarray(rng.normal(size=(2, 3, 3, 4, 5)), jnp.float32)  # [N, kh, kw, C_in, F]
    mats = jax.vmap(as_matrix)(kernel)  # the PyTorch matrices M [N, F, C_in * kh * kw]
    assert mats.shape == (2, 5, 36)
    for node in range(2):
        np.testing.assert_array_equal(np.asarray(from_matrix(mats[node], kernel.shape[1:])), np.asarray(kernel[node]))
    # The half-steps run on the free reshape M' = Pi M^T: the rows of M^T permuted as the
    # working bases are (working_bases maps a right basis of M to one of M').
    working = working_view(kernel, "flax_kernel")
    leaf = MatrixLeaf(0, kernel.shape[1:], 5, 36, 5)
    for node in range(2):
        v = jnp.transpose(mats[node])[None]  # [1, 36, 5]
        u_work, v_work = working_bases((v[:, :5],), (v,), (leaf,), "flax_kernel")
        np.testing.assert_array_equal(np.asarray(u_work[0][0]), np.asarray(working[node]))
        u_back, v_back = view_bases(u_work, v_work, (leaf,), "flax_kernel")
        np.testing.assert_array_equal(np.asarray(v_back[0]), np.asarray(v))
        np.testing.assert_array_equal(np.asarray(u_back[0]), np.asarray(v[:, :5]))
    assert working_view(kernel, "leading").shape == (2, 3, 60)


def _to_torch(leaf):
    """[N, kh, kw, C_in, F] -> [N, F, C_in, kh, kw] (explicit transpose; 1-D node leaves as they are)."""
    if leaf.ndim < 3:
        return leaf
    nd = leaf.ndim - 1
    return jnp.transpose(leaf, (0,) + tuple(1 + a for a in (nd - 1, nd - 2) + tuple(range(nd - 2))))


@pytest.mark.parametrize(
    "name,rank,num_iterations,warm_start",
    [("ring8", 1, 1, True), ("time_varying", 2, 2, False)],  # I = 1, 2; rank 1, 2; warm and fresh bases
)
def test_flax_kernel_view_matches_transpose_formulation(rng, name, rank, num_iterations, warm_start):
    """The reshape-only flax_kernel path equals transposing every kernel to its PyTorch matrix
    (F, C_in * kh * kw) and running the "leading" view on it: params, U and V over several rounds."""
    topo = _topologies()[name]
    n = topo.num_nodes
    x0 = {  # 4-D, 3-D and 2-D kernels with distinct axis sizes, plus a 1-D leaf
        "conv": jnp.asarray(rng.normal(size=(n, 3, 2, 5, 4)), jnp.float32),
        "conv1d": jnp.asarray(rng.normal(size=(n, 3, 4, 6)), jnp.float32),
        "dense": jnp.asarray(rng.normal(size=(n, 7, 3)), jnp.float32),
        "bias": jnp.asarray(rng.normal(size=(n, 4)), jnp.float32),
    }
    opts = dict(rank=rank, num_iterations=num_iterations, gamma=1.3, warm_start=warm_start, seed=2)
    x, state, bits = run_rounds(power_gossip(topo, matrix_view="flax_kernel", **opts), x0, key_range(4))
    y, ref_state, ref_bits = run_rounds(
        power_gossip(topo, matrix_view="leading", **opts), jax.tree_util.tree_map(_to_torch, x0), key_range(4)
    )
    for key in x0:
        np.testing.assert_allclose(np.asarray(_to_torch(x[key])), np.asarray(y[key]), rtol=RTOL, atol=ATOL)
    for got, want in zip(state.u + state.v, ref_state.u + ref_state.v):
        assert got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(bits, ref_bits)


@pytest.mark.parametrize("num_iterations", [1, 2, 3])
def test_identical_first_round_does_not_kill_warm_start(rng, num_iterations):
    """Training starts from identical models: round 0 must not store a zero product as the
    warm-start basis (which would silence the edges for good); later differences still converge."""
    topo = tp.ring(8)
    alg = power_gossip(topo, rank=1, num_iterations=num_iterations, gamma=1.308)
    same = {"w": jnp.broadcast_to(jnp.asarray(rng.normal(size=(6, 5)), jnp.float32), (8, 6, 5))}
    step = jax.jit(alg.step)
    x, state, _ = step(same, alg.init(same), jax.random.key(0))
    x = {"w": jnp.asarray(rng.normal(size=(8, 6, 5)), jnp.float32)}  # the nodes drift apart
    start = float(consensus_distance(x))
    for _ in range(300):
        x, state, _ = step(x, state, jax.random.key(0))
    assert float(consensus_distance(x)) < 1e-4 * start
