"""DeMo against a NumPy per-node, per-chunk loop of the paper's algorithm (all-reduce and graphs),
its reductions (k = C with beta = 0 is averaged sign-SGD; the complete graph keeps replicas equal),
the error feedback, the bit rule, training and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.fft
from _reference import read_json, run_main, to_jax

from jaxgossip import algorithms
from jaxgossip import topology as T

SHAPES = {"w": (5, 3), "b": (7,)}  # 15 and 7 entries: both leaves end in a padded chunk at C = 8


def models(n, seed=0):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal((n,) + shape) for name, shape in SHAPES.items()}


def gradients(n, rounds, seed=1):
    return [models(n, seed + 100 * t) for t in range(rounds)]


def np_demo(mats, x, grads, lr, k, chunk, beta, aggregate):
    """The paper's algorithm per node and chunk (float64): m <- beta m + g; X = DCT(m); q = top-k(X);
    m <- m - IDCT(q); Q_i = weighted mean over the in-neighbours (self included) of q_j, over all of
    them ("all") or over those that sent the coefficient ("selected"); x_i <- x_i - lr sign(IDCT(Q_i)).
    Returns the final models and momenta (chunked, per leaf)."""
    x = {name: v.copy() for name, v in x.items()}
    n = next(iter(x.values())).shape[0]
    m = {}
    for name, v in x.items():
        size = v[0].size
        m[name] = np.zeros((n, -(-size // chunk), chunk))
    for t, g in enumerate(grads):
        w = mats[t % len(mats)]
        for name in x:
            size = x[name][0].size
            num_chunks = m[name].shape[1]
            q = np.zeros_like(m[name])
            s = np.zeros_like(m[name])
            for i in range(n):
                padded = np.zeros(num_chunks * chunk)
                padded[:size] = g[name][i].reshape(-1)
                m[name][i] = beta * m[name][i] + padded.reshape(num_chunks, chunk)
                for c in range(num_chunks):
                    coef = scipy.fft.dct(m[name][i, c], norm="ortho")
                    keep = np.argsort(-np.abs(coef), kind="stable")[:k]
                    q[i, c, keep] = coef[keep]
                    s[i, c, keep] = 1.0
                    m[name][i, c] -= scipy.fft.idct(q[i, c], norm="ortho")
            for i in range(n):
                total = sum(w[i, j] * q[j] for j in range(n) if w[i, j] != 0)
                if aggregate == "selected":
                    den = sum(w[i, j] * s[j] for j in range(n) if w[i, j] != 0)
                    total = np.where(den > 0, total / np.where(den > 0, den, 1.0), 0.0)
                u = np.concatenate([scipy.fft.idct(total[c], norm="ortho") for c in range(total.shape[0])])[:size]
                x[name][i] = x[name][i] - lr * np.sign(u).reshape(x[name][i].shape)
    return x, m


def run(alg, x, grads, key=0):
    """The library: the gradient hook on every round's gradients, then the round."""
    x = to_jax(x)
    state = alg.init(x)
    hook, step = jax.jit(alg.gradient), jax.jit(alg.step)
    infos = []
    for t, g in enumerate(grads):
        zeros, state = hook(to_jax(g), x, state)
        assert all(np.all(np.asarray(z) == 0) for z in jax.tree_util.tree_leaves(zeros))  # the optimizer sees 0
        x, state, info = step(x, state, jax.random.fold_in(jax.random.key(key), t))
        infos.append(np.asarray(info.bits))
    return x, state, np.array(infos)


CASES = [
    ("allreduce_2", T.complete(2), "selected"),
    ("allreduce_4", T.complete(4), "selected"),
    ("allreduce_4_all", T.complete(4), "all"),
    ("ring_6", T.ring(6), "selected"),
    ("ring_8_all", T.ring(8), "all"),
    ("one_peer_exponential_8", T.one_peer_exponential(8), "selected"),
]


@pytest.mark.parametrize("name,topo,aggregate", CASES, ids=[c[0] for c in CASES])
def test_rounds_match_the_numpy_reference_of_the_paper(name, topo, aggregate):
    n, lr, k, chunk, beta = topo.num_nodes, 0.1, 3, 8, 0.9
    x0, grads = models(n), gradients(n, 4)
    alg = algorithms.make("demo_momentum", topo, lr=lr, k=k, chunk=chunk, beta=beta, aggregate=aggregate)
    x, state, bits = run(alg, x0, grads)
    mats = [topo.matrix(t) for t in range(topo.period)]
    want_x, want_m = np_demo(mats, x0, grads, lr, k, chunk, beta, aggregate)
    for leaf in SHAPES:
        np.testing.assert_allclose(np.asarray(x[leaf]), want_x[leaf], rtol=0, atol=1e-5)
        np.testing.assert_allclose(np.asarray(state.m[leaf]), want_m[leaf], rtol=1e-4, atol=1e-5)
    # k values + k indices of ceil(log2 8) = 3 bits per chunk, 2 + 1 chunks, per out-neighbour
    out_degree = np.array([[np.sum(mats[t % len(mats)][:, j] != 0) - 1 for j in range(n)] for t in range(4)])
    np.testing.assert_array_equal(bits, out_degree * 3 * k * (32 + 3))
    assert int(state.count) == 4


@pytest.mark.parametrize("aggregate", ["selected", "all"])
def test_all_components_and_no_momentum_is_averaged_sign_sgd(aggregate):
    topo = T.ring(6)
    x0, grads = models(6), gradients(6, 3)
    alg = algorithms.make("demo_momentum", topo, lr=0.05, k=8, chunk=8, beta=0.0, aggregate=aggregate)
    x, state, _ = run(alg, x0, grads)
    w = topo.matrix()
    want = {name: v.copy() for name, v in x0.items()}
    for g in grads:
        for name in want:
            want[name] = want[name] - 0.05 * np.sign(np.einsum("ij,j...->i...", w, g[name]))
    for leaf in SHAPES:
        np.testing.assert_allclose(np.asarray(x[leaf]), want[leaf], rtol=0, atol=1e-6)
        # everything was sent: no error feedback left
        np.testing.assert_allclose(np.asarray(state.m[leaf]), 0.0, atol=1e-5)


def test_the_complete_graph_keeps_identical_replicas_identical():
    n = 4
    one = models(1)
    x0 = {name: np.repeat(v, n, axis=0) for name, v in one.items()}
    alg = algorithms.make("demo_momentum", T.complete(n), lr=0.1, k=2, chunk=8)
    x, state, _ = run(alg, x0, gradients(n, 5))  # different gradients on every node
    for leaf in SHAPES:
        v = np.asarray(x[leaf])
        np.testing.assert_allclose(v, np.broadcast_to(v[:1], v.shape), rtol=0, atol=1e-6)
        assert not np.allclose(v, x0[leaf])
        # the momenta stay node-local (decoupled): they differ
        assert not np.allclose(np.asarray(state.m[leaf])[0], np.asarray(state.m[leaf])[1])


def test_transmitted_and_kept_momentum_split_it_orthogonally():
    topo = T.ring(4)
    alg = algorithms.make("demo_momentum", topo, lr=0.1, k=2, chunk=8, beta=0.5)
    x = to_jax(models(4))
    state = alg.init(x)
    _, state = alg.gradient(to_jax(models(4, seed=7)), x, state)
    before = state.m
    _, state, _ = alg.step(x, state, jax.random.key(0))
    for leaf in SHAPES:
        b, a = np.asarray(before[leaf], np.float64), np.asarray(state.m[leaf], np.float64)
        sent = b - a
        # ||m||^2 = ||sent||^2 + ||kept||^2 per chunk, and exactly k DCT components were sent
        np.testing.assert_allclose((b**2).sum(-1), (sent**2).sum(-1) + (a**2).sum(-1), rtol=1e-5)
        coef = scipy.fft.dct(sent, norm="ortho", axis=-1)
        assert np.all((np.abs(coef) > 1e-5).sum(-1) == 2)
        kept = scipy.fft.dct(a, norm="ortho", axis=-1)
        # the sent components are the largest: none kept is larger than the smallest sent
        smallest_sent = np.where(np.abs(coef) > 1e-5, np.abs(coef), np.inf).min(-1)
        assert np.all(np.abs(kept).max(-1) <= smallest_sent + 1e-6)


@pytest.mark.parametrize(
    "options,named",
    [
        ({"lr": 0.1, "k": 0}, "k=0"),
        ({"lr": 0.1, "k": 65}, "k=65"),
        ({"lr": 0.1, "k": 9, "chunk": 8}, "k=9"),
        ({"lr": 0.1, "chunk": 0}, "chunk=0"),
        ({"lr": 0.1, "beta": 1.0}, "beta=1.0"),
        ({"lr": 0.1, "beta": float("nan")}, "beta=nan"),
        ({"lr": 0.1, "aggregate": "sum"}, "aggregate='sum'"),
        ({"lr": -1.0}, "lr=-1.0"),
        ({}, "lr="),
    ],
)
def test_bad_options_are_refused_naming_them(options, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        algorithms.make("demo_momentum", T.ring(4), **options)


def test_a_graph_that_is_not_doubly_stochastic_is_refused():
    column = T.from_adjacency(np.array([[0, 1, 1], [1, 0, 0], [1, 0, 0]]), weights="column")
    with pytest.raises(ValueError, match="demo_momentum needs doubly stochastic"):
        algorithms.make("demo_momentum", column, lr=0.1)


def test_cli_refuses_k_beyond_the_chunk_with_exit_2_naming_k(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--algorithm=demo_momentum", "--algorithm_options.lr=0.01", "--algorithm_options.k=100"]
    code, _, err = run_main(capsys, "train", *argv, "--out", str(out))
    assert code == 2 and "Traceback" not in err, err
    assert "k=100" in err and err.strip().count("\n") == 0, err
    assert not out.exists()


def test_cli_trains_digits_over_all_reduce(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--dataset=digits", "--model=mlp", "--topology=complete", "--num_nodes=8", "--num_rounds=40"]
    options = ["--algorithm_options.lr=0.003", "--algorithm_options.k=8", "--algorithm_options.chunk=64"]
    code, _, err = run_main(
        capsys, "train", "--algorithm=demo_momentum", *options, *argv, "--eval_every=20", "--no-progress", "--out", str(out)
    )
    assert code == 0, err
    payload = read_json(out / "metrics.json")
    assert payload["rows"][-1]["test_acc"] > 0.8
    assert payload["rows"][-1]["consensus"] < 1e-10  # all-reduce DeMo: the replicas stay equal
    # 8 of 64 components with 6-bit indices: (32 + 6) / 8 = 4.75 bits per parameter per message
    gossip_bits = 40 * 7 * 32 * payload["num_params"]
    assert 0.14 < payload["rows"][-1]["bits_mean"] / gossip_bits < 0.16


def test_jit_of_a_traced_lr_and_beta_sweeps_in_one_compile():
    topo = T.ring(4)
    x0, grads = to_jax(models(4)), [to_jax(g) for g in gradients(4, 2)]

    def final(lr, beta):
        alg = algorithms.make("demo_momentum", topo, lr=lr, k=2, chunk=8, beta=beta)
        x, state = x0, alg.init(x0)
        for t, g in enumerate(grads):
            _, state = alg.gradient(g, x, state)
            x, state, _ = alg.step(x, state, jax.random.key(t))
        return x

    swept = jax.jit(jax.vmap(final))(jnp.asarray([0.1, 0.2]), jnp.asarray([0.5, 0.9]))
    for i, (lr, beta) in enumerate([(0.1, 0.5), (0.2, 0.9)]):
        one = final(lr, beta)
        for leaf in SHAPES:
            np.testing.assert_allclose(np.asarray(swept[leaf][i]), np.asarray(one[leaf]), rtol=0, atol=1e-6)


def test_bf16_messages_keep_the_state_dtype_and_count_16_bit_values():
    from jaxgossip.ops.precision import with_message_dtype

    topo = T.ring(4)
    alg = with_message_dtype(algorithms.make("demo_momentum", topo, lr=0.1, k=2, chunk=8), "bf16")
    x = to_jax(models(4))
    state = alg.init(x)
    hook, step = jax.jit(alg.gradient), jax.jit(alg.step)
    for t, g in enumerate(gradients(4, 2)):
        _, state = hook(to_jax(g), x, state)
        x, state, info = step(x, state, jax.random.key(t))
    assert all(leaf.dtype == jnp.bfloat16 for leaf in jax.tree_util.tree_leaves(state.m))
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(x))
    np.testing.assert_array_equal(np.asarray(info.bits), 2 * 3 * 2 * (16 + 3))
    # the models moved by about lr per entry (rounded to the bfloat16 grid of the model)
    moved = np.abs(np.asarray(x["w"]) - np.asarray(models(4)["w"], np.float32))
    assert np.all(moved < 2 * 0.1 + 0.05) and np.mean(moved) > 0.05
