"""Gradient-aware methods (gradient_tracking, d2, qgm) and Moniqua: NumPy per-node references of
their update rules, exact convergence on a heterogeneous quadratic where D-SGD stalls, the gradient
hook contract (default None, one shared code path), bits, and bad input.

The references are written from the docstrings' equations with explicit loops over nodes in
float64, independent of the library's kernels."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxgossip as jg
from jaxgossip import topology as tp
from jaxgossip.algorithms import make
from jaxgossip.algorithms.moniqua import moniqua_bound
from jaxgossip.engine.local_step import local_update
from jaxgossip.types import GossipAlgorithm

N, D = 8, 5
LR = 0.1

# A heterogeneous quadratic f_i(x) = 1/2 sum_d A_id (x_d - C_id)^2: every node has its own
# minimiser C_i and curvature A_i, the global minimiser is sum_i A_i C_i / sum_i A_i (per entry).
_rng = np.random.default_rng(0)
A = _rng.uniform(0.5, 2.0, (N, D)).astype(np.float32)
C = (3.0 * _rng.standard_normal((N, D))).astype(np.float32)
X_STAR = (A.astype(np.float64) * C).sum(0) / A.astype(np.float64).sum(0)
A_J, C_J = jnp.asarray(A), jnp.asarray(C)


def quadratic(x, i, key):
    del key
    return 0.5 * jnp.sum(A_J[i] * (x - C_J[i]) ** 2)


def np_grad(x):
    """[n, D] gradients of the first n nodes, each at its own x_i (float64)."""
    n = len(x)
    return A[:n] * (x - C[:n])


def x0():
    return jnp.asarray(np.random.default_rng(1).standard_normal((N, D)), jnp.float32)


def relative_error(x):
    x = np.asarray(x, np.float64)
    return float(np.max(np.linalg.norm(x - X_STAR, axis=1)) / np.linalg.norm(X_STAR))


@pytest.fixture(scope="module")
def ring():
    return tp.ring(N)


# ---------------------------------------------------------------- NumPy references (per node)


def np_gradient_tracking(w, x, rounds, ordering="atc"):
    """``w``: one [n, n] matrix, or [rounds, n, n], round k's W(k) (a stochastic graph)."""
    n = len(x)
    y, g_prev = np.zeros_like(x), np.zeros_like(x)
    w_all = w
    for k in range(rounds):
        w = w_all[k] if w_all.ndim == 3 else w_all
        g = np_grad(x)
        for i in range(n):
            y[i] = y[i] + g[i] - g_prev[i]
        g_prev = g
        half = x - LR * y
        sent = half if ordering == "atc" else x
        x = np.array([sum(w[i, j] * sent[j] for j in range(n)) for i in range(n)])
        if ordering != "atc":
            x = x - LR * y
        y = np.array([sum(w[i, j] * y[j] for j in range(n)) for i in range(n)])
    return x


def np_d2(w, x, rounds, gamma):
    n = len(x)
    w_g = (1 - gamma) * np.eye(n) + gamma * w
    x_prev_half = x.copy()  # psi: what the previous round communicated (x_0 at the start)
    for _ in range(rounds):
        y = x - LR * np_grad(x)
        corrected = np.array([y[i] + x[i] - x_prev_half[i] for i in range(n)])
        x_prev_half = y
        x = np.array([sum(w_g[i, j] * corrected[j] for j in range(n)) for i in range(n)])
    return x


def np_qgm(w, x, rounds, beta, nesterov=False):
    n = len(x)
    m_hat = np.zeros_like(x)
    x_start = None
    for _ in range(rounds):
        if x_start is not None:
            for i in range(n):
                m_hat[i] = beta * m_hat[i] + (1 - beta) * (x_start[i] - x[i]) / LR
        x_start = x.copy()
        g = np_grad(x)
        m = beta * m_hat + g
        direction = g + beta * m if nesterov else m
        half = x - LR * direction
        x = np.array([sum(w[i, j] * half[j] for j in range(n)) for i in range(n)])
    return x


@functools.cache
def _cached_run(name, topo_n, rounds, ordering, options):
    alg = make(name, tp.ring(topo_n), **dict(options))
    return jg.run_optimization(alg, x0(), quadratic, optax.sgd(LR), rounds, jax.random.key(0), ordering=ordering)


def _run(name, topo, rounds, ordering="atc", **options):
    """run_optimization of ``name`` on the quadratic from x0 with SGD(LR); runs on the uniform
    ring are cached, as several tests read the same run (compiles dominate on 2 CPU cores)."""
    return _cached_run(name, topo.num_nodes, rounds, ordering, tuple(sorted(options.items())))


@pytest.mark.parametrize("ordering", ["atc", "same_iterate"])
def test_gradient_tracking_matches_numpy(ring, ordering):
    got = _run("gradient_tracking", ring, 25, ordering)
    want = np_gradient_tracking(ring.matrix(0), np.asarray(x0(), np.float64), 25, ordering)
    np.testing.assert_allclose(np.asarray(got.x), want, rtol=1e-5, atol=1e-5)


def _comm_keys(key, rounds):
    """The step keys run_optimization hands to ``alg.step`` (module docstring of optimization.py):
    ``split(key)[1]`` split into rounds, each split again, first half."""
    round_keys = jax.random.split(jax.random.split(key)[1], rounds)
    return jax.vmap(lambda k: jax.random.split(k)[0])(round_keys)


def test_gradient_tracking_on_random_matchings_matches_numpy_and_is_exact():
    # W(t) rebuilt densely from the tables each round drew; DIGing on a fresh random matching per
    # round keeps sum_i y_i = sum_i g_i and still reaches the exact minimiser with a constant step.
    topo, rounds = tp.random_matching(N), 300
    got = jg.run_optimization(
        make("gradient_tracking", topo), x0(), quadratic, optax.sgd(LR), rounds, jax.random.key(0)
    )
    w = tp.sample_matrices(topo, _comm_keys(jax.random.key(0), rounds))
    assert len({m.tobytes() for m in w[:10]}) > 1  # the graph changes between rounds
    np.testing.assert_allclose(w.sum(1), 1.0, atol=1e-6)  # column sums: the tracker's invariant
    np.testing.assert_allclose(w.sum(2), 1.0, atol=1e-6)
    want = np_gradient_tracking(w, np.asarray(x0(), np.float64), rounds)
    np.testing.assert_allclose(np.asarray(got.x), want, rtol=1e-4, atol=1e-5)
    assert relative_error(got.x) < 1e-5


def test_gradient_methods_on_stochastic_graphs_where_the_maths_allows():
    failing = tp.with_failures(tp.ring(N), link_drop=0.3)
    for name in ("qgm", "moniqua", "gradient_tracking"):
        assert jg.algorithms.resolve(name).graph.stochastic_graphs == "any", name
    alg = make("moniqua", failing, theta=8.0, gamma=0.5)
    x = x0()
    state, step = alg.init(x), jax.jit(alg.step)
    for k in range(3):  # modulo decoding within theta: gossip on x + rounding error keeps the mean
        x_new, state, info = step(x, state, jax.random.key(k))
        np.testing.assert_allclose(np.asarray(x_new).mean(0), np.asarray(x).mean(0), atol=1e-5)
        x = x_new
    with pytest.raises(ValueError, match="d2 cannot run on the stochastic graph.*previous"):
        jg.algorithms.d2(tp.random_matching(N), gamma=0.5)
    with pytest.raises(ValueError, match="d2 cannot run on the stochastic graph"):
        make("d2", failing, gamma=0.5)
    with pytest.raises(ValueError, match="gradient_tracking needs doubly stochastic"):
        make("gradient_tracking", tp.random_out(N, 2))  # column stochastic only


def test_d2_matches_numpy():
    topo = tp.ring(7)  # lambda_min = -0.27 > -1/3: the paper's D^2 with W itself (gamma = 1)
    for gamma in (1.0, 0.6):
        alg = make("d2", topo, gamma=gamma)
        x_start = x0()[:7]
        loss = lambda x, i, key: quadratic(x, i, key)  # noqa: E731
        got = jg.run_optimization(alg, x_start, loss, optax.sgd(LR), 25, jax.random.key(0))
        want = np_d2(topo.matrix(0), np.asarray(x_start, np.float64), 25, gamma)
        np.testing.assert_allclose(np.asarray(got.x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("nesterov", [False, True])
def test_qgm_matches_numpy(ring, nesterov):
    got = _run("qgm", ring, 25, lr=LR, beta=0.8, nesterov=nesterov)
    want = np_qgm(ring.matrix(0), np.asarray(x0(), np.float64), 25, 0.8, nesterov)
    np.testing.assert_allclose(np.asarray(got.x), want, rtol=1e-5, atol=1e-5)


def test_qgm_local_steps_average_the_displacement(ring):
    """With H local steps the hook counts them and the buffer sees the mean displacement per local
    step; on a quadratic the run settles at a fixed point, where the buffer vanishes."""
    alg = make("qgm", ring, lr=LR, beta=0.8)
    two = jg.run_optimization(alg, x0(), quadratic, optax.sgd(LR), 200, jax.random.key(0), local_steps=2)
    assert np.all(np.isfinite(np.asarray(two.x)))
    assert float(jnp.max(jnp.abs(two.state.m_hat))) < 1e-3  # the buffer dies out at a fixed point
    assert float(two.state.steps) == 2


# ---------------------------------------------------------------- exactness vs D-SGD's bias


def test_gradient_tracking_and_d2_are_exact_where_dsgd_stalls(ring):
    """Constant step size on heterogeneous data: D-SGD stops at a bias (its fixed point is not the
    minimiser), gradient tracking and D^2 reach the minimiser to float32 precision."""
    dsgd = relative_error(_run("gossip", ring, 400).x)
    assert dsgd > 0.1, f"D-SGD should stall at a clear bias, got relative error {dsgd:.3g}"
    gt = relative_error(_run("gradient_tracking", ring, 400).x)
    d2 = relative_error(_run("d2", ring, 400, gamma=0.5).x)
    assert gt < 1e-6 and d2 < 1e-6, (gt, d2)


def np_gradient_tracking_local_steps(w, x, rounds, lr, local_steps):
    """Gradient tracking with H local steps ("atc", float64): each round node i steps H times along
    c_i + g_i with c_i = y_i - (mean of its previous round's gradients), then sends
    y_i = c_i + (mean of this round's gradients) with its model."""
    x = x.copy()
    y, g_mean = np.zeros_like(x), np.zeros_like(x)
    for _ in range(rounds):
        c, total = y - g_mean, np.zeros_like(x)
        for _ in range(local_steps):
            g = np_grad(x)
            total += g
            x = x - lr * (c + g)
        g_mean = total / local_steps
        x, y = w @ x, w @ (c + g_mean)
    return x


@pytest.mark.parametrize("topology", ["ring", "complete"])
def test_gradient_tracking_local_steps_stable_where_sgd_is(topology):
    """Regression: with H = 2 local steps the correction once used the last local gradient as its
    reference, which multiplies the corrections' disagreement by eta h per round (curvature h) and
    so diverged for eta h in (1, 2), where SGD is stable (training on digits at lr 0.2 blew up).
    Now the reference is the round's mean gradient: it matches the NumPy rule and reaches the
    exact minimiser at eta max(A) = 1.5 (2e-8 on the complete graph, 4e-7 on the ring; the old
    rule reached NaN on both)."""
    topo = tp.ring(N) if topology == "ring" else tp.complete(N)
    alg = make("gradient_tracking", topo)
    w = topo.matrix(0).astype(np.float64)
    got = jg.run_optimization(alg, x0(), quadratic, optax.sgd(LR), 20, jax.random.key(0), local_steps=2)
    want = np_gradient_tracking_local_steps(w, np.asarray(x0(), np.float64), 20, LR, 2)
    np.testing.assert_allclose(np.asarray(got.x), want, rtol=1e-4, atol=1e-4)
    lr = 1.5 / float(A.max())
    res = jg.run_optimization(alg, x0(), quadratic, optax.sgd(lr), 1000, jax.random.key(0), local_steps=2)
    assert relative_error(res.x) < 1e-5, relative_error(res.x)


# ---------------------------------------------------------------- Moniqua


def np_moniqua_round(w, x, u, theta, gamma, bits):
    """One Moniqua round (docstring equations), float64; u [N, ...] the rounding draws."""
    n, levels = len(x), 2**bits - 1
    big_b = moniqua_bound(theta, bits)

    def cmod(a, b):
        return a - b * np.round(a / b)

    q = np.floor(levels * (cmod(x / big_b, 1.0) + 0.5) + u) / levels - 0.5
    new = x.copy()
    for i in range(n):
        own = cmod(big_b * q[i] - x[i], big_b)
        for j in range(n):
            if j != i and w[i, j] != 0:
                new[i] = new[i] + gamma * w[i, j] * (cmod(big_b * q[j] - x[i], big_b) - own)
    return new, levels * (cmod(x / big_b, 1.0) + 0.5) + u


@pytest.mark.parametrize("shared", [True, False])
def test_moniqua_matches_numpy_and_counts_bits(ring, shared):
    theta, gamma, bits = 2.0, 0.5, 3
    alg = make("moniqua", ring, theta=theta, gamma=gamma, bits=bits, shared_randomness=shared)
    x = np.random.default_rng(2).uniform(-0.5, 0.5, (N, 6)).astype(np.float32)
    params = {"v": jnp.asarray(x)}
    state = alg.init(params)
    step = jax.jit(alg.step)
    want = x.astype(np.float64)
    for r in range(4):
        key = jax.random.key(10 + r)
        (leaf_key,) = jax.random.split(key, 1)  # the draw of the one leaf (moniqua's key use)
        shape = (6,) if shared else (N, 6)
        u = np.broadcast_to(np.asarray(jax.random.uniform(leaf_key, shape, jnp.float32), np.float64), (N, 6))
        params, state, info = step(params, state, key)
        want, scaled = np_moniqua_round(ring.matrix(0), want, u, theta, gamma, bits)
        # float32 vs float64 could round differently only next to a rounding boundary
        assert np.min(np.abs(scaled - np.round(scaled))) > 1e-4
        np.testing.assert_allclose(np.asarray(params["v"]), want, rtol=1e-5, atol=1e-5)
        # bits per entry, per out-neighbour: no side information
        np.testing.assert_array_equal(np.asarray(info.bits), 2 * bits * 6)
    # doubly stochastic W and exact recovery (|x_i - x_j| < theta): the node mean is kept
    np.testing.assert_allclose(np.asarray(params["v"]).mean(0), x.mean(0), atol=1e-6)


def test_moniqua_optimizes_like_dsgd_with_fewer_bits(ring):
    dsgd = _run("gossip", ring, 400)
    mq = _run("moniqua", ring, 400, theta=4.0, bits=8, gamma=1.0)
    assert abs(relative_error(mq.x) - relative_error(dsgd.x)) < 0.02
    assert mq.bits[-1] == pytest.approx(dsgd.bits[-1] * 8 / 32)


# ---------------------------------------------------------------- the hook contract


def test_existing_algorithms_have_no_hook_and_new_ones_do(ring):
    for name in ("gossip", "choco", "allreduce", "deepsqueeze", "power_gossip", "moniqua"):
        assert make(name, ring).gradient is None, name
    assert make("d2", ring, gamma=0.5).gradient is None  # D^2 corrects in step, without a hook
    assert make("gradient_tracking", ring).gradient is not None
    assert make("qgm", ring, lr=LR).gradient is not None


def test_identity_hook_is_bitwise_no_hook(ring):
    """Threading the algorithm state through the local steps changes nothing: gossip with a hook
    that returns its inputs gives bitwise the same run, with local steps and both orderings."""
    plain = make("gossip", ring)
    hooked = GossipAlgorithm(plain.init, plain.step, plain.debias, "gossip_hooked", gradient=lambda g, p, s: (g, s))
    for ordering, local_steps in (("same_iterate", 3),):
        opt = optax.sgd(LR, momentum=0.9)
        a = jg.run_optimization(plain, x0(), quadratic, opt, 20, jax.random.key(3), local_steps, ordering)
        b = jg.run_optimization(hooked, x0(), quadratic, opt, 20, jax.random.key(3), local_steps, ordering)
        np.testing.assert_array_equal(np.asarray(a.x), np.asarray(b.x))
        np.testing.assert_array_equal(np.asarray(a.objective), np.asarray(b.objective))


def test_local_update_feeds_the_hooked_gradient_to_the_optimizer(ring):
    alg = make("gradient_tracking", ring)
    params = {"w": x0()}
    grads = {"w": jnp.ones((N, D))}
    opt = optax.sgd(LR)
    out = local_update(alg, opt, grads, params, jax.vmap(opt.init)(params), alg.init(params))
    # first call: y = 0 + g - 0, and SGD steps along it
    np.testing.assert_allclose(np.asarray(out.updates["w"]), -LR * np.ones((N, D)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out.comm_state.g_prev["w"]), 1.0)


def test_gradient_tracking_sends_two_vectors_in_one_exchange(ring):
    gt, gossip = _run("gradient_tracking", ring, 400), _run("gossip", ring, 400)
    np.testing.assert_array_equal(gt.node_bits, 2 * gossip.node_bits)
    info = jg.algorithms.info("gradient_tracking")
    assert info.cost.exchanges_per_round({}) == 1  # x and y share one message per neighbour


# ---------------------------------------------------------------- training and bad input


def test_gradient_methods_train_with_local_steps():
    """make_train with H = 2 local steps: the hook's state crosses the local-step scan."""
    from jaxgossip import data, models
    from jaxgossip.engine.training import make_train

    ds = data.make_synthetic(num_train=256, num_test=64, num_classes=4, shape=(4, 4, 1), noise=0.5, seed=0)
    shards = data.shard_dataset(ds, data.partition(ds.y_train, 4, "shards:1", seed=0))
    model = models.make_model("mlp", num_classes=4, hidden=(8,))
    # one hooked method is enough here: the hook's state crosses train.py's local-step scan the
    # same way for every algorithm (test_train trains every registered one with H = 1)
    for name, options in (("qgm", {"lr": 0.1}),):
        alg = make(name, tp.ring(4), **options)
        trainer = make_train(
            model,
            alg,
            shards,
            (ds.x_test, ds.y_test),
            optax.sgd(0.1),
            num_rounds=20,
            batch_size=8,
            eval_every=10,
            local_steps=2,
            eval_chunk=64,
        )
        _, metrics = jax.jit(trainer.train)(jax.random.key(0))
        assert np.all(np.isfinite(np.asarray(metrics.train_loss))), name
        assert np.asarray(metrics.test_acc)[-1] > 0.5, name


@pytest.mark.slow
def test_gradient_tracking_and_d2_train_like_allreduce_on_the_complete_graph():
    """On W = 11^T / N the exact methods reduce to all-reduce SGD (the tracker is the mean gradient;
    D^2's correction cancels), so the trainer's hook and state plumbing must give all-reduce's
    models; also with (Nesterov) momentum, which is linear in what it is fed, so the node mean of
    the per-node buffers follows all-reduce's buffer."""
    from jaxgossip import data, models
    from jaxgossip.engine.training import make_train

    ds = data.make_synthetic(num_train=256, num_test=64, num_classes=4, shape=(4, 4, 1), noise=0.5, seed=0)
    shards = data.shard_dataset(ds, data.partition(ds.y_train, 4, "shards:1", seed=0))
    model = models.make_model("mlp", num_classes=4, hidden=(8,))
    complete = tp.complete(4)

    def final_mean(name, optimizer):
        trainer = make_train(
            model,
            make(name, complete),
            shards,
            (ds.x_test, ds.y_test),
            optimizer,
            num_rounds=20,
            batch_size=8,
            eval_every=20,
            eval_chunk=64,
        )
        state, _ = jax.jit(trainer.train)(jax.random.key(0))
        return [np.asarray(leaf).mean(0) for leaf in jax.tree_util.tree_leaves(state.params)]

    for opt in (optax.sgd(0.2), optax.sgd(0.05, momentum=0.9, nesterov=True)):
        ref = final_mean("allreduce", opt)
        for name in ("gradient_tracking", "d2"):
            for got, want in zip(final_mean(name, opt), ref, strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_bad_input():
    with pytest.raises(ValueError, match=r"d2 needs a symmetric .* registered with mixing='symmetric'"):
        make("d2", tp.directed_ring(N))
    with pytest.raises(ValueError, match="above -1/3"):
        make("d2", tp.ring(N))  # lambda_min(W) = -1/3 exactly
    alg = make("d2", tp.ring(N), gamma=0.5)
    with pytest.raises(ValueError, match=r"orderings=\('atc',\)"):
        jg.run_optimization(alg, x0(), quadratic, optax.sgd(LR), 5, jax.random.key(0), ordering="same_iterate")
    with pytest.raises(ValueError, match="qgm needs lr="):
        make("qgm", tp.ring(N))
    with pytest.raises(ValueError, match="beta"):
        make("qgm", tp.ring(N), lr=0.1, beta=1.0)
    with pytest.raises(ValueError, match="bits=1 is out of range"):
        make("moniqua", tp.ring(N), bits=1)
    with pytest.raises(ValueError, match="gradient_tracking needs doubly stochastic"):
        make("gradient_tracking", tp.random_directed(N, 0.4, 0))  # column stochastic only
    with pytest.raises(ValueError, match="orderings"):
        jg.Execution(orderings=("atc", "later"))
