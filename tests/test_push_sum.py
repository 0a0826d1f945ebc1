"""Tests for push_sum (SGP), sparse_push and scsp against NumPy per-node loops written from the
equations of ALGORITHMS.md 3.3 / 4.3, plus invariants, reductions, bit counts and errors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgossip import topology as tp
from jaxgossip.algorithms import REGISTRY, make
from jaxgossip.algorithms.gossip import gossip
from jaxgossip.algorithms.merge import make_merge, merge
from jaxgossip.algorithms.push_sum import push_sum
from jaxgossip.algorithms.scsp import scsp
from jaxgossip.algorithms.sparse_push import graph_copies, sparse_push
from jaxgossip.consensus import run_consensus
from jaxgossip.mixing import consensus_distance

RTOL, ATOL = 1e-4, 1e-5
N = 8
SHAPES = {"a": (3, 4), "b": (5,)}  # two leaves: D = 12 + 5 = 17


def _x0(seed=0, offset=0.0):
    rng = np.random.default_rng(seed)
    return {k: (rng.normal(size=(N,) + s) + offset).astype(np.float32) for k, s in SHAPES.items()}


def _jnp(x):
    return {k: jnp.asarray(v) for k, v in x.items()}


def _weighted_digraph(seed=0):
    """A random strongly connected digraph with random (non-uniform) column-stochastic weights."""
    rng = np.random.default_rng(seed)
    base = tp.random_directed(N, 0.35, seed=seed).matrix(0)
    m = (base > 0) * rng.uniform(0.2, 1.0, size=base.shape)
    return tp.from_matrix(m / m.sum(axis=0, keepdims=True), name=f"weighted_digraph({seed})")


TOPOLOGIES = {
    "one_peer_exponential": lambda: tp.one_peer_exponential(N),
    "random_directed": lambda: tp.random_directed(N, 0.35, seed=3),
    "directed_ring": lambda: tp.directed_ring(N),
    # time-varying with self weights that change from round to round
    "schedule": lambda: tp.schedule([tp.random_directed(N, 0.35, seed=s) for s in (0, 1)]),
}


# ---- NumPy references: loops over rounds, nodes and in-neighbours -------------------------------


def _out_degree(w, j):
    return sum(1 for i in range(w.shape[0]) if i != j and w[i, j] != 0)


def _np_push_sum(topo, x0, rounds):
    x = {k: v.astype(np.float64).copy() for k, v in x0.items()}
    w = np.ones(N)
    bits = []
    for t in range(rounds):
        wt = topo.matrix(t)
        new_x = {k: np.zeros_like(v) for k, v in x.items()}
        new_w = np.zeros(N)
        for i in range(N):
            for j in range(N):
                if wt[i, j] != 0:
                    for k in x:
                        new_x[k][i] += wt[i, j] * x[k][j]
                    new_w[i] += wt[i, j] * w[j]
        x, w = new_x, new_w
        d = sum(math.prod(s) for s in SHAPES.values())
        bits.append([_out_degree(wt, j) * (32 * d + 32) for j in range(N)])
    return x, w, np.array(bits)


def _np_copy_table(topo, mode):
    if mode == "shared":
        return [0] * topo.period
    distinct, table = [], []
    for t in range(topo.period):
        m = topo.matrix(t)
        for p, d in enumerate(distinct):
            if np.array_equal(m, d):
                table.append(p)
                break
        else:
            distinct.append(m)
            table.append(len(distinct) - 1)
    return table


def _np_top(r, kept):
    out = np.zeros_like(r)
    idx = np.argsort(-np.abs(r), kind="stable")[:kept]
    out[idx] = r[idx]
    return out


def _np_sparse_push(topo, x0, rounds, gamma, fraction, mode="per_graph", tau=None, max_boost=1):
    """Per-node loop of the Sparse-Push round (and SCSP's adaptive budget when tau is given)."""
    table = _np_copy_table(topo, mode)
    num_copies = max(table) + 1
    x = {k: v.astype(np.float64).reshape(N, -1).copy() for k, v in x0.items()}
    w = np.ones(N)
    x_hat = {k: np.zeros((num_copies,) + v.shape) for k, v in x.items()}
    s = {k: np.zeros((num_copies,) + v.shape) for k, v in x.items()}
    bits = []
    for t in range(rounds):
        wt = topo.matrix(t)
        p = table[t % topo.period]
        payload = np.zeros(N)
        q = {}
        for k in x:
            size = x[k].shape[1]
            base = max(1, math.floor(fraction * size))
            q[k] = np.zeros_like(x[k])
            for i in range(N):
                r = x[k][i] - x_hat[k][p, i]
                kept = base
                if tau is not None:
                    rho = np.linalg.norm(r) / np.linalg.norm(x[k][i])
                    kept = int(np.clip(math.ceil(base * rho / tau), base, min(size, max_boost * base)))
                q[k][i] = _np_top(r, kept)
                payload[i] += kept * (32 + max(1, math.ceil(math.log2(size))))
            x_hat[k][p] += q[k]
            for i in range(N):
                for j in range(N):
                    if j != i and wt[i, j] != 0:
                        s[k][p, i] += wt[i, j] * q[k][j]
            for i in range(N):
                x[k][i] += gamma * (s[k][p, i] + wt[i, i] * x_hat[k][p, i] - x_hat[k][p, i])
        new_w = w.copy()
        for i in range(N):
            mu = sum(wt[i, j] * w[j] for j in range(N) if j != i)
            new_w[i] = w[i] + gamma * (mu + wt[i, i] * w[i] - w[i])
        w = new_w
        bits.append([_out_degree(wt, j) * (payload[j] + 32) for j in range(N)])
    x = {k: v.reshape((N,) + SHAPES[k]) for k, v in x.items()}
    return x, w, np.array(bits)


def _run(alg, x0, rounds, key=None):
    key = jax.random.key(0) if key is None else key
    step = jax.jit(alg.step)
    x, state = _jnp(x0), alg.init(_jnp(x0))
    bits = []
    for t in range(rounds):
        x, state, info = step(x, state, jax.random.fold_in(key, t))
        bits.append(np.asarray(info.bits))
    return x, state, np.array(bits)


def _assert_tree_close(a, b, rtol=RTOL, atol=ATOL):
    for k in SHAPES:
        np.testing.assert_allclose(np.asarray(a[k]), np.asarray(b[k]), rtol=rtol, atol=atol, err_msg=k)


def _average(x0):
    return {k: v.astype(np.float64).mean(axis=0) for k, v in x0.items()}


def _debias_error(alg, x, state, x0):
    """max |x_i / w_i - mean(x0)| over nodes and entries."""
    z = alg.debias(x, state)
    avg = _average(x0)
    return max(float(np.max(np.abs(np.asarray(z[k]) - avg[k]))) for k in SHAPES)


def _sums(x):
    return {k: np.asarray(v, np.float64).sum(axis=0) for k, v in x.items()}


# ---- push_sum -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["one_peer_exponential", "random_directed", "directed_ring"])
def test_push_sum_matches_numpy_loop(name):
    topo = TOPOLOGIES[name]()
    x0 = _x0(1)
    x, state, bits = _run(push_sum(topo), x0, 7)
    ref_x, ref_w, ref_bits = _np_push_sum(topo, x0, 7)
    _assert_tree_close(x, ref_x)
    np.testing.assert_allclose(np.asarray(state.w), ref_w, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(bits, ref_bits)
    assert int(state.count) == 7
    # debias is x / w, leaf by leaf
    z = push_sum(topo).debias(x, state)
    _assert_tree_close(z, {k: ref_x[k] / ref_w.reshape((N,) + (1,) * len(s)) for k, s in SHAPES.items()})


def test_push_sum_conserves_mass_on_time_varying_digraph():
    topo = TOPOLOGIES["schedule"]()
    x0 = _x0(2)
    x, state, _ = _run(push_sum(topo), x0, 9)
    for k, total in _sums(x0).items():
        np.testing.assert_allclose(_sums(x)[k], total, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(jnp.sum(state.w)), N, rtol=1e-6)


def test_push_sum_on_irregular_digraph_has_weights_but_debias_reaches_average():
    topo = TOPOLOGIES["random_directed"]()
    assert not topo.is_doubly_stochastic
    x0 = _x0(3)
    alg = push_sum(topo)
    res = run_consensus(alg, _jnp(x0), 150, jax.random.key(0))
    assert float(jnp.max(jnp.abs(res.state.w - 1.0))) > 0.05  # the weights really de-bias
    raw_error = float(consensus_distance(res.x, {k: jnp.asarray(v) for k, v in _average(x0).items()}))
    assert raw_error > 1e-2  # the numerators alone are not the average ...
    assert _debias_error(alg, res.x, res.state, x0) < 1e-4  # ... but x / w is


@pytest.mark.parametrize("name", ["schedule", "weighted_digraph"])
def test_push_sum_converges_on_directed_graphs(name):
    topo = TOPOLOGIES["schedule"]() if name == "schedule" else _weighted_digraph(5)
    x0 = _x0(4)
    alg = make("push_sum", topo)
    res = run_consensus(alg, _jnp(x0), 150, jax.random.key(0))
    assert _debias_error(alg, res.x, res.state, x0) < 1e-4
    assert float(res.error[-1]) < 1e-6 * float(res.error[0])


def test_push_sum_weight_bits_option():
    d = 17
    x0 = _jnp(_x0())
    ring = tp.directed_ring(N)  # doubly stochastic: w stays 1, SGP does not send it
    _, _, info = push_sum(ring, weight_bits="auto").step(x0, push_sum(ring).init(x0), jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(info.bits), np.full(N, 32 * d))
    _, _, info = push_sum(ring).step(x0, push_sum(ring).init(x0), jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(info.bits), np.full(N, 32 * d + 32))
    rd = TOPOLOGIES["random_directed"]()  # weights must travel here, "auto" still counts them
    _, _, info = push_sum(rd, weight_bits="auto").step(x0, push_sum(rd).init(x0), jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(info.bits), rd.out_degree[0] * (32 * d + 32))


# ---- sparse_push ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, fraction, gamma, mode",
    [
        ("one_peer_exponential", 0.25, 0.4, "per_graph"),
        ("random_directed", 0.5, 0.3, "per_graph"),
        ("schedule", 0.25, 0.4, "per_graph"),
        ("schedule", 0.25, 0.4, "shared"),
    ],
)
def test_sparse_push_matches_numpy_loop(name, fraction, gamma, mode):
    topo = TOPOLOGIES[name]()
    x0 = _x0(5)
    alg = sparse_push(topo, fraction=fraction, gamma=gamma, public_copies=mode)
    x, state, bits = _run(alg, x0, 6)
    ref_x, ref_w, ref_bits = _np_sparse_push(topo, x0, 6, gamma, fraction, mode)
    _assert_tree_close(x, ref_x)
    np.testing.assert_allclose(np.asarray(state.w), ref_w, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(bits, ref_bits)
    num_copies = 1 if mode == "shared" else topo.period
    assert state.x_hat["a"].shape == (num_copies, N, 3, 4)


@pytest.mark.parametrize("name", ["one_peer_exponential", "random_directed", "schedule"])
def test_sparse_push_lossless_gamma_one_is_push_sum(name):
    topo = TOPOLOGIES[name]()
    x0 = _x0(6)
    x_ref, s_ref, _ = _run(push_sum(topo), x0, 8)
    # k >= D_leaf keeps every entry too (checked on one graph)
    kept = {"k": 100} if name == "random_directed" else {"fraction": 1.0}
    x, state, _ = _run(sparse_push(topo, gamma=1.0, **kept), x0, 8)
    _assert_tree_close(x, x_ref)
    np.testing.assert_allclose(np.asarray(state.w), np.asarray(s_ref.w), rtol=1e-5, atol=1e-6)


def test_sparse_push_conserves_mass_per_graph_but_not_shared_on_time_varying_graph():
    topo = TOPOLOGIES["schedule"]()
    # the self weights change between the two graphs, so the single accumulated s cannot conserve
    assert not np.allclose(topo.self_weights[0], topo.self_weights[1])
    x0 = _x0(7)
    totals = _sums(x0)
    x, state, _ = _run(sparse_push(topo, fraction=0.25, gamma=0.3), x0, 12)
    for k in SHAPES:
        np.testing.assert_allclose(_sums(x)[k], totals[k], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(float(jnp.sum(state.w)), N, rtol=1e-6)
    x, state, _ = _run(sparse_push(topo, fraction=0.25, gamma=0.3, public_copies="shared"), x0, 12)
    drift = max(float(np.max(np.abs(_sums(x)[k] - totals[k]))) for k in SHAPES)
    assert drift > 1e-2  # the literal rule leaks mass (the weights, sent exactly, still sum to N)
    np.testing.assert_allclose(float(jnp.sum(state.w)), N, rtol=1e-6)


def test_shared_copies_stall_away_from_the_average_on_one_peer_exponential():
    """Constant self weights: the literal rule conserves mass but its fixed point is not consensus,
    even without compression; one copy set per graph reaches the average."""
    topo = TOPOLOGIES["one_peer_exponential"]()
    x0 = _x0(8)
    shared = sparse_push(topo, fraction=1.0, gamma=1.0, public_copies="shared")
    res = run_consensus(shared, _jnp(x0), 60, jax.random.key(0))
    for k, total in _sums(x0).items():
        np.testing.assert_allclose(_sums(res.x)[k], total, rtol=1e-5, atol=1e-4)
    assert _debias_error(shared, res.x, res.state, x0) > 0.1
    per_graph = sparse_push(topo, fraction=1.0, gamma=1.0)
    res = run_consensus(per_graph, _jnp(x0), 60, jax.random.key(0))
    assert _debias_error(per_graph, res.x, res.state, x0) < 1e-4


@pytest.mark.parametrize("name", ["one_peer_exponential", "weighted_digraph", "schedule"])
def test_sparse_push_debiased_values_converge_to_average(name):
    topo = _weighted_digraph(2) if name == "weighted_digraph" else TOPOLOGIES[name]()
    x0 = _x0(9, offset=1.0)
    alg = sparse_push(topo, fraction=0.25, gamma=0.3)
    res = run_consensus(alg, _jnp(x0), 300, jax.random.key(0))
    assert _debias_error(alg, res.x, res.state, x0) < 1e-4
    assert float(res.error[-1]) < 1e-7 * float(res.error[0])


def test_sparse_push_bits_hand_computed():
    # leaf a: D = 12, K = floor(0.25 * 12) = 3, index ceil(log2 12) = 4 bits
    # leaf b: D = 5,  K = max(1, floor(1.25)) = 1, index ceil(log2 5) = 3 bits
    log2_message = 3 * (32 + 4) + 1 * (32 + 3) + 32
    wide_message = 3 * (32 + 64) + 1 * (32 + 64) + 32
    assert (log2_message, wide_message) == (175, 416)
    x0 = _jnp(_x0())
    rd = TOPOLOGIES["random_directed"]()
    assert len(set(rd.out_degree[0])) > 1  # irregular: the count must follow each node's out-degree
    for topo, index_bits, message in ((rd, "log2", log2_message), (tp.one_peer_exponential(N), 64, wide_message)):
        alg = sparse_push(topo, fraction=0.25, index_bits=index_bits)
        _, _, info = jax.jit(alg.step)(x0, alg.init(x0), jax.random.key(0))
        np.testing.assert_array_equal(np.asarray(info.bits), topo.out_degree[0] * message)


def test_graph_copies_tables():
    ope = tp.one_peer_exponential(N)
    assert list(graph_copies(ope)) == [0, 1, 2]
    assert list(graph_copies(ope, "shared")) == [0, 0, 0]
    assert list(graph_copies(tp.directed_ring(N))) == [0]
    rd0, rd1 = tp.random_directed(N, 0.35, seed=0), tp.random_directed(N, 0.35, seed=1)
    assert list(graph_copies(tp.schedule([rd0, rd1, rd0]))) == [0, 1, 0]


def test_gamma_and_target_residual_are_sweepable_under_vmap():
    topo = TOPOLOGIES["one_peer_exponential"]()
    x0 = _jnp(_x0(10))

    def one_round(gamma, target):
        alg = scsp(topo, fraction=0.25, gamma=gamma, target_residual=target)
        x, _, info = alg.step(x0, alg.init(x0), jax.random.key(0))
        return x, info.bits

    swept_x, swept_bits = jax.jit(jax.vmap(one_round))(jnp.array([0.2, 0.6]), jnp.array([0.05, 0.5]))
    for i, (g, tau) in enumerate([(0.2, 0.05), (0.6, 0.5)]):
        x, bits = jax.jit(one_round)(g, tau)
        _assert_tree_close({k: v[i] for k, v in swept_x.items()}, x)
        np.testing.assert_array_equal(np.asarray(swept_bits[i]), np.asarray(bits))
    assert not np.array_equal(np.asarray(swept_bits[0]), np.asarray(swept_bits[1]))


# ---- scsp -----------------------------------------------------------------------------------------


def test_scsp_without_compensation_is_sparse_push():
    topo = TOPOLOGIES["one_peer_exponential"]()
    x0 = _x0(11)
    x_sp, s_sp, b_sp = _run(sparse_push(topo, fraction=0.25, gamma=0.3), x0, 3)
    for alg in (
        scsp(topo, fraction=0.25, gamma=0.3, compensation=False),
        scsp(topo, fraction=0.25, gamma=0.3, max_boost=1),
    ):
        x, state, bits = _run(alg, x0, 3)
        _assert_tree_close(x, x_sp, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(bits, b_sp)


@pytest.mark.parametrize("name", ["one_peer_exponential", "schedule"])
def test_scsp_matches_numpy_loop(name):
    topo = TOPOLOGIES[name]()
    x0 = _x0(12, offset=0.5)
    alg = scsp(topo, fraction=0.25, gamma=0.3, target_residual=0.2, max_boost=3)
    x, state, bits = _run(alg, x0, 6)
    ref_x, ref_w, ref_bits = _np_sparse_push(topo, x0, 6, 0.3, 0.25, tau=0.2, max_boost=3)
    _assert_tree_close(x, ref_x)
    np.testing.assert_allclose(np.asarray(state.w), ref_w, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(bits, ref_bits)
    assert bits[0].max() > bits[-1].min()  # the budget moved within the run


def test_scsp_compensation_spends_bits_on_the_lagging_node():
    topo = TOPOLOGIES["one_peer_exponential"]()
    x0 = _x0(13, offset=2.0)
    alg = scsp(topo, fraction=0.25, target_residual=0.05, max_boost=4)
    state = alg.init(_jnp(x0))
    # every public copy is up to date except node 3's, which lags by 30 % of its model
    lag = {k: np.zeros_like(v) for k, v in x0.items()}
    for k in lag:
        lag[k][3] = 0.3 * x0[k][3]
    state = state._replace(x_hat={k: jnp.broadcast_to(x0[k] - lag[k], state.x_hat[k].shape) for k in x0})
    _, _, info = jax.jit(alg.step)(_jnp(x0), state, jax.random.key(0))
    bits = np.asarray(info.bits)
    base = 3 * (32 + 4) + 1 * (32 + 3) + 32  # Sparse-Push's message (see the hand count above)
    # node 3: rho = 0.3 per leaf, k = clip(ceil(K * 0.3 / 0.05), K, 4 K) = 4 K = 12 (leaf a), 4 (leaf b)
    boosted = 12 * (32 + 4) + 4 * (32 + 3) + 32
    np.testing.assert_array_equal(bits, [boosted if i == 3 else base for i in range(N)])
    _, _, info = jax.jit(sparse_push(topo, fraction=0.25).step)(_jnp(x0), state, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(info.bits), np.full(N, base))


def test_scsp_converges_and_its_budget_falls_back():
    topo = _weighted_digraph(4)
    x0 = _x0(14, offset=1.0)
    alg = scsp(topo, fraction=0.25, gamma=0.3)
    res = run_consensus(alg, _jnp(x0), 300, jax.random.key(0))
    assert _debias_error(alg, res.x, res.state, x0) < 1e-4
    per_round = np.diff(res.bits)
    sp = run_consensus(sparse_push(topo, fraction=0.25, gamma=0.3), _jnp(x0), 300, jax.random.key(0))
    sp_round = np.diff(sp.bits)
    assert per_round[0] > sp_round[0]  # rho = 1 at the start: every node boosts
    assert per_round[-1] == sp_round[-1]  # converged copies: back to the Sparse-Push budget


def test_scsp_compensation_reduces_disagreement_under_heterogeneous_drift():
    """Label-skew stand-in: node i is pulled towards its own target c_i every round (a gradient
    step on 1/2 ||z - c_i||^2). Top-1 % of 256 entries cannot keep the public copies up to date;
    the residual-adaptive budget gets close to uncompressed push-sum for a fraction of its bits."""
    topo = TOPOLOGIES["one_peer_exponential"]()
    d, lr, rounds = 256, 0.02, 300
    c = jnp.asarray(np.random.default_rng(15).normal(size=(N, d)) + 3.0, jnp.float32)
    x_start = {"a": jnp.broadcast_to(jnp.mean(c, 0), (N, d))}

    def train(alg):
        def body(carry, key):
            x, st = carry
            z = alg.debias(x, st)
            x = {"a": x["a"] - lr * (z["a"] - c) * st.w[:, None]}
            x, st, info = alg.step(x, st, key)
            return (x, st), (consensus_distance(alg.debias(x, st)), jnp.sum(info.bits))

        init = (x_start, alg.init(x_start))
        _, (dist, bits) = jax.lax.scan(body, init, jax.random.split(jax.random.key(0), rounds))
        return jnp.mean(dist[-50:]), jnp.sum(bits)

    exact, exact_bits = jax.jit(lambda: train(sparse_push(topo, fraction=1.0, gamma=0.2)))()
    plain, plain_bits = jax.jit(lambda: train(sparse_push(topo, fraction=0.01, gamma=0.2)))()
    comp, comp_bits = jax.jit(lambda: train(scsp(topo, fraction=0.01, gamma=0.2, target_residual=0.01, max_boost=8)))()
    assert plain > 10 * exact  # compression is the bottleneck here
    assert comp < 1.2 * exact
    assert plain_bits < comp_bits < 4 * plain_bits
    assert comp_bits < exact_bits / 20


# ---- merge (SCSP part (a)) -------------------------------------------------------------------------


def test_merge_rounds_equal_push_sum_rounds_and_reach_the_average():
    topo = TOPOLOGIES["one_peer_exponential"]()
    x0 = _x0(16)
    alg = sparse_push(topo, fraction=0.25, gamma=0.3)
    x, state, _ = _run(alg, x0, 4)
    merged, mstate, info = jax.jit(make_merge(topo, 3))(x, state)
    # the same three rounds by push_sum, starting from the same numerators, weights and round
    ps = push_sum(topo)
    px, pstate = x, ps.init(x)._replace(w=state.w, count=state.count)
    ps_step = jax.jit(ps.step)
    for t in range(3):
        px, pstate, _ = ps_step(px, pstate, jax.random.key(t))
    _assert_tree_close(merged, px)
    np.testing.assert_allclose(np.asarray(mstate.w), np.asarray(pstate.w), rtol=1e-6)
    assert int(mstate.count) == 7
    np.testing.assert_array_equal(np.asarray(info.bits), np.full(N, 3 * (17 * 32 + 32)))
    # three consecutive one-peer exponential rounds on N = 8 average exactly
    target = {k: v / float(jnp.sum(state.w)) for k, v in _sums(x).items()}
    z = alg.debias(merged, mstate)
    for k in SHAPES:
        np.testing.assert_allclose(np.asarray(z[k]), np.broadcast_to(target[k], (N,) + SHAPES[k]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(mstate.x_hat["a"]), np.asarray(state.x_hat["a"]))


def test_merge_exact_and_on_a_gossip_state():
    topo = TOPOLOGIES["random_directed"]()
    x0 = _x0(17)
    alg = scsp(topo, fraction=0.25, gamma=0.3)
    x, state, _ = _run(alg, x0, 5)
    merged, mstate, info = merge(topo, x, state, "exact")
    target = {k: v / float(jnp.sum(state.w)) for k, v in _sums(x).items()}
    z = alg.debias(merged, mstate)
    for k in SHAPES:
        np.testing.assert_allclose(np.asarray(z[k]), np.broadcast_to(target[k], (N,) + SHAPES[k]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(mstate.w), np.full(N, float(jnp.mean(state.w))), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(info.bits), np.full(N, 17 * 32 + 32))
    assert int(mstate.count) == 6
    # a state without push-sum weights: plain mixing rounds, or the mean
    ring = tp.ring(N)
    g = gossip(ring)
    gx = _jnp(x0)
    merged, gstate, info = merge(ring, gx, g.init(gx), 2)
    expected = {k: ring.matrix(0) @ (ring.matrix(0) @ v.reshape(N, -1)) for k, v in x0.items()}
    _assert_tree_close(merged, {k: v.reshape((N,) + SHAPES[k]) for k, v in expected.items()})
    np.testing.assert_array_equal(np.asarray(info.bits), np.full(N, 2 * 2 * 17 * 32))
    assert int(gstate.count) == 2
    merged, _, info = merge(ring, gx, g.init(gx), "exact")
    _assert_tree_close(merged, {k: np.broadcast_to(v, (N,) + SHAPES[k]) for k, v in _average(x0).items()})
    np.testing.assert_array_equal(np.asarray(info.bits), np.full(N, 17 * 32))


# ---- registry and errors ---------------------------------------------------------------------------


def _row_only():
    """Row stochastic but not column stochastic (strongly connected)."""
    return tp.from_matrix(np.array([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3], [0.0, 0.5, 0.5]]))


def test_registry_entries():
    topo = TOPOLOGIES["one_peer_exponential"]()
    for name in ("push_sum", "sparse_push", "scsp"):
        assert name in REGISTRY
    assert make("push_sum", topo).name == "push_sum"
    assert make("sparse_push", topo, fraction=0.1).name == "sparse_push"
    assert make("scsp", topo, k=2, compensation=False).name == "scsp"


@pytest.mark.parametrize("name", ["push_sum", "sparse_push", "scsp"])
def test_column_stochastic_required(name):
    kw = {} if name == "push_sum" else {"fraction": 0.5}
    with pytest.raises(ValueError, match="column-stochastic"):
        make(name, _row_only(), **kw)


@pytest.mark.parametrize("factory", [sparse_push, scsp])
def test_hyperparameter_errors(factory):
    topo = TOPOLOGIES["one_peer_exponential"]()
    for fraction in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="fraction"):
            factory(topo, fraction=fraction)
    for k in (0, -3):
        with pytest.raises(ValueError, match="k="):
            factory(topo, k=k)
    with pytest.raises(ValueError, match="exactly one of fraction= or k="):
        factory(topo)
    with pytest.raises(ValueError, match="exactly one of fraction= or k="):
        factory(topo, fraction=0.1, k=2)
    for gamma in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="gamma"):
            factory(topo, fraction=0.1, gamma=gamma)
    with pytest.raises(ValueError, match="public_copies"):
        factory(topo, fraction=0.1, public_copies="global")
    with pytest.raises(ValueError, match="index_bits"):
        factory(topo, fraction=0.1, index_bits=0)


def test_push_sum_and_scsp_specific_errors():
    topo = TOPOLOGIES["one_peer_exponential"]()
    with pytest.raises(ValueError, match="weight_bits"):
        push_sum(topo, weight_bits="never")
    with pytest.raises(ValueError, match="target_residual"):
        scsp(topo, fraction=0.1, target_residual=0.0)
    with pytest.raises(ValueError, match="max_boost"):
        scsp(topo, fraction=0.1, max_boost=0)
    with pytest.raises(TypeError, match="max_boost"):
        scsp(topo, fraction=0.1, max_boost=2.5)
    with pytest.raises(TypeError, match="compensation"):
        scsp(topo, fraction=0.1, compensation="yes")
    with pytest.raises(TypeError, match="Topology"):
        push_sum(np.eye(3))


def test_merge_errors():
    topo = TOPOLOGIES["one_peer_exponential"]()
    with pytest.raises(ValueError, match="num_rounds"):
        make_merge(topo, 0)
    with pytest.raises(ValueError, match="num_rounds"):
        make_merge(topo, "average")
    with pytest.raises(TypeError, match="num_rounds"):
        make_merge(topo, 2.0)
    rd = TOPOLOGIES["random_directed"]()
    x = _jnp(_x0())
    with pytest.raises(ValueError, match="doubly stochastic"):
        merge(rd, x, gossip(tp.ring(N)).init(x), 2)
    with pytest.raises(ValueError, match="column-stochastic"):
        merge(_row_only(), {"a": jnp.ones((3, 2))}, push_sum(tp.directed_ring(3)).init({"a": jnp.ones((3, 2))}), 2)
