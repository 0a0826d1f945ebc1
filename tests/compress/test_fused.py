"""jaxgossip.compress.fused: the fused top-k round with public copies against a NumPy per-node loop, under
vmap, with bad input; and Choco / Sparse-Push / SCSP on it against their XLA formulation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgossip import topology as T
from jaxgossip.algorithms import choco, scsp, sparse_push
from jaxgossip.algorithms.scsp import budget_steps, leaf_budget, ratio_budget
from jaxgossip.compress import fused, native

pytestmark = pytest.mark.skipif(not native.load().available, reason="native CPU kernels unavailable")

# Leaf shapes: the heap path (< 1,024 entries), the sampled path (>= 1,024), one entry per node,
# a conv kernel; 2,000 entries also cross the serial / threaded boundary with N = 8.
SHAPES = [(37,), (3, 3, 4, 5), (2000,), (1,), (3, 3, 16, 16)]


def _magnitude_keys(r: np.ndarray) -> np.ndarray:
    """|r| in the float total order (NaN above inf), as integers."""
    return (r.astype(np.float32).view(np.int32) & 0x7FFFFFFF).astype(np.int64)


def _reference(x, h_all, s_all, copy, edges, gamma, kept, self_in_s):
    """One leaf, flattened: x [N, D], h_all, s_all [P, N, D], kept [N]. The kept set and the
    copies in float32 (as the kernel: bitwise), s and x in float64."""
    x32, h_all = np.asarray(x, np.float32), np.array(h_all, np.float32)
    s_all = np.array(s_all, np.float64)
    h, r = h_all[copy], s_all[copy]
    n, d = x32.shape
    q = np.zeros((n, d), np.float32)
    for i in range(n):
        resid = x32[i] - h[i]
        order = np.lexsort((np.arange(d), -_magnitude_keys(resid)))[: int(kept[i])]  # ties: lower index
        q[i, order] = resid[order]
    h += q  # float32, only the kept entries change
    self_w = np.zeros(n)
    for j, i, w in zip(*(np.asarray(a) for a in edges)):
        if j == i:
            self_w[i] += w
        if w != 0 and (j != i or self_in_s):
            r[i] += np.float64(w) * q[j]
    h64 = h.astype(np.float64)
    coef = 0.0 if self_in_s else 1.0
    new_x = x32.astype(np.float64) + gamma * (r + coef * self_w[:, None] * h64 - h64)
    return new_x, h_all, s_all


def _case(seed, n, p, shapes, per_node_k):
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal((n,) + sh).astype(np.float32) for sh in shapes]
    x_hat = [rng.standard_normal((p, n) + sh).astype(np.float32) for sh in shapes]
    s = [rng.standard_normal((p, n) + sh).astype(np.float32) for sh in shapes]
    # Exact ties in |x - x_hat| (the lower index must win) and entries with no change at all.
    params[0][:, :6] = x_hat[0][:, :, :6][p - 1] + np.float32(0.5) * np.array([1, -1, 1, -1, 0, 0], np.float32)
    kept = []
    for sh in shapes:
        d = int(np.prod(sh))
        k = rng.integers(1, d + 1, n) if per_node_k else np.full(n, max(1, d // 100))
        kept.append(k.astype(np.int32))
    kept[0][0] = int(np.prod(shapes[0]))  # one node sends its whole leaf (k = D)
    return params, x_hat, s, kept


def _edges(topology, t):
    e = fused.round_edges(topology, t)
    return tuple(np.asarray(a) for a in e)


@pytest.mark.parametrize("self_in_s", [True, False])
@pytest.mark.parametrize(
    "graph,p,copy,per_node_k",
    [("ring", 1, 0, False), ("exponential", 3, 1, True), ("exponential", 3, 2, False), ("directed", 1, 0, True)],
)
def test_kernel_matches_numpy_loop(self_in_s, graph, p, copy, per_node_k):
    n = 8
    topology = {
        "ring": T.ring(n),
        "exponential": T.one_peer_exponential(n),
        "directed": T.directed_ring(n),
    }[graph]
    params, x_hat, s, kept = _case(0, n, p, SHAPES, per_node_k)
    t = copy  # one_peer_exponential(8) has 3 distinct rounds: round t uses graph t
    edges = fused.round_edges(topology, t)
    step = jax.jit(
        lambda a, b, c: fused.top_k_round(a, b, c, jnp.int32(copy), edges, 0.3, kept, self_in_s=self_in_s),
        donate_argnums=(1, 2),
    )
    out = step(params, [jnp.asarray(a) for a in x_hat], [jnp.asarray(a) for a in s])
    for leaf in range(len(SHAPES)):
        d = int(np.prod(SHAPES[leaf]))
        want_x, want_h, want_s = _reference(
            params[leaf].reshape(n, d),
            x_hat[leaf].reshape(p, n, d),
            s[leaf].reshape(p, n, d),
            copy,
            _edges(topology, t),
            0.3,
            kept[leaf],
            self_in_s,
        )
        np.testing.assert_array_equal(np.asarray(out.x_hat[leaf]).reshape(p, n, d), want_h)
        np.testing.assert_allclose(np.asarray(out.s[leaf]).reshape(p, n, d), want_s, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(out.params[leaf]).reshape(n, d), want_x, rtol=1e-6, atol=1e-6)
        for other in set(range(p)) - {copy}:  # the other copy sets are untouched
            np.testing.assert_array_equal(np.asarray(out.x_hat[leaf])[other], x_hat[leaf][other])
            np.testing.assert_array_equal(np.asarray(out.s[leaf])[other], s[leaf][other])


@pytest.mark.parametrize("graph", ["complete", "erdos_renyi", "star"])
def test_kernel_on_graphs_with_many_in_neighbours_matches_numpy_loop(graph):
    """A receiver's messages are added by whichever thread completes the last of its own and its
    in-neighbours' selections (fused_top_k.cc); on graphs where most nodes wait on many senders
    (complete, a random graph, a star's hub) and over the threaded path (N = 12, 4,522 entries a
    node), repeated rounds must all equal the NumPy loop."""
    n = 12
    topology = {
        "complete": T.complete(n),
        "erdos_renyi": T.erdos_renyi(n, 0.4, seed=3),
        "star": T.star(n),
    }[graph]
    for seed in range(4):
        params, x_hat, s, kept = _case(seed, n, 1, SHAPES, per_node_k=True)
        edges = fused.round_edges(topology, 0)
        out = jax.jit(lambda a, b, c: fused.top_k_round(a, b, c, 0, edges, 0.3, kept, self_in_s=False))(
            params, [jnp.asarray(a[0]) for a in x_hat], [jnp.asarray(a[0]) for a in s]
        )
        for leaf in range(len(SHAPES)):
            d = int(np.prod(SHAPES[leaf]))
            want_x, want_h, want_s = _reference(
                params[leaf].reshape(n, d),
                x_hat[leaf].reshape(1, n, d),
                s[leaf].reshape(1, n, d),
                0,
                _edges(topology, 0),
                0.3,
                kept[leaf],
                False,
            )
            np.testing.assert_array_equal(np.asarray(out.x_hat[leaf]).reshape(n, d), want_h[0])
            np.testing.assert_allclose(np.asarray(out.s[leaf]).reshape(n, d), want_s[0], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(np.asarray(out.params[leaf]).reshape(n, d), want_x, rtol=1e-5, atol=1e-5)


def test_lossless_round_is_exact_gossip_on_the_copies():
    """k = D everywhere, copies at 0: x_hat becomes x, s becomes W x, x becomes x + gamma (W x - x)."""
    n = 6
    topology = T.ring(n)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, 50)).astype(np.float32)
    zeros = jnp.zeros((n, 50), jnp.float32)
    out = jax.jit(
        lambda a, b, c: fused.top_k_round(a, b, c, 0, fused.round_edges(topology, 0), 1.0, [50], self_in_s=True)
    )(x, zeros, zeros + 0)
    w = topology.matrices()[0]
    np.testing.assert_array_equal(np.asarray(out.x_hat), x)
    np.testing.assert_allclose(np.asarray(out.s), w @ x, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out.params), w @ x, rtol=1e-6, atol=1e-6)


def test_vmap_over_gamma_and_states_equals_one_call_per_member():
    n, p = 8, 3
    topology = T.one_peer_exponential(n)
    members = [_case(seed, n, p, SHAPES[:3], per_node_k=False) for seed in range(3)]
    kept = members[0][3]
    gammas = jnp.asarray([0.1, 0.5, 1.0], jnp.float32)
    stack = lambda i: [jnp.stack([m[i][leaf] for m in members]) for leaf in range(3)]  # noqa: E731

    def one(x, h, s, gamma, t):
        return fused.top_k_round(x, h, s, t % p, fused.round_edges(topology, t), gamma, kept, self_in_s=False)

    ts = jnp.asarray([0, 1, 2], jnp.int32)
    batched = jax.jit(jax.vmap(one))(stack(0), stack(1), stack(2), gammas, ts)
    for b, (x, h, s, _) in enumerate(members):
        single = jax.jit(one)(x, h, s, gammas[b], ts[b])
        for got, want in zip(jax.tree_util.tree_leaves(batched), jax.tree_util.tree_leaves(single)):
            np.testing.assert_array_equal(np.asarray(got)[b], np.asarray(want))


def test_bad_input_is_refused_with_the_reason():
    n = 4
    topology = T.ring(n)
    x = jnp.ones((n, 10))
    edges = fused.round_edges(topology, 0)
    with pytest.raises(ValueError, match="one x_hat, s and kept count per params leaf"):
        fused.top_k_round([x], [x], [x], 0, edges, 0.5, [1, 1], self_in_s=True)
    with pytest.raises(ValueError, match=r"x_hat, s \[P, N, \.\.\.\]"):
        fused.top_k_round([x], [jnp.ones((n, 9))], [x], 0, edges, 0.5, [1], self_in_s=True)
    with pytest.raises(Exception, match=r"kept count 11 out of range \[1, 10\]"):
        jax.block_until_ready(fused.top_k_round([x], [x + 0], [x + 0], 0, edges, 0.5, [11], self_in_s=True))
    with pytest.raises(Exception, match=r"copy index out of range"):
        jax.block_until_ready(fused.top_k_round([x], [x + 0], [x + 0], 1, edges, 0.5, [1], self_in_s=True))
    with pytest.raises(ValueError, match=r"growth must be \[L, M\] with L = 1 leaves, got shape \(2, 3\)"):
        fused.top_k_round([x], [x], [x], 0, edges, 0.5, [1], self_in_s=True, growth=jnp.zeros((2, 3)))
    with pytest.raises(Exception, match=r"kept count 8 plus 3 budget steps exceeds the leaf's 10 entries"):
        jax.block_until_ready(
            fused.top_k_round([x], [x + 0], [x + 0], 0, edges, 0.5, [8], self_in_s=True, growth=jnp.ones((1, 3)))
        )


def test_fusable_only_for_float32_trees_on_fixed_graphs_with_the_switch_on(monkeypatch):
    x = jnp.ones((4, 3))
    ring = T.ring(4)
    assert fused.fusable(ring, {"a": x}, [x])
    assert not fused.fusable(ring, {"a": x.astype(jnp.bfloat16)})
    assert not fused.fusable(T.with_failures(ring, link_drop=0.1), {"a": x})
    monkeypatch.setenv("JAXGOSSIP_FUSED", "0")
    assert not fused.fusable(ring, {"a": x})


# ---- the algorithms on the fused round against their XLA formulation --------------------------------

TREE_SHAPES = {"conv": (3, 3, 8, 16), "bias": (16,), "dense": (40, 30)}


def _params(n, seed=0):
    rng = np.random.default_rng(seed)
    return {k: jnp.asarray(rng.standard_normal((n,) + v).astype(np.float32)) for k, v in TREE_SHAPES.items()}


ALGORITHMS = {
    "choco": lambda n: choco(T.ring(n), gamma=0.4, compressor="top_k", compressor_options={"fraction": 0.05}),
    "choco_k": lambda n: choco(T.ring(n), gamma=0.4, compressor={"name": "top_k", "k": 7, "index_bits": 64}),
    "sparse_push": lambda n: sparse_push(T.one_peer_exponential(n), fraction=0.05, gamma=0.3),
    "sparse_push_model_init": lambda n: sparse_push(
        T.one_peer_exponential(n), fraction=0.05, gamma=0.3, public_init="model"
    ),
    "scsp": lambda n: scsp(T.one_peer_exponential(n), fraction=0.02, gamma=0.3, target_residual=0.1),
    "scsp_plain": lambda n: scsp(T.one_peer_exponential(n), fraction=0.02, gamma=0.3, compensation=False),
}


def _run(make, n, rounds, fused_on, monkeypatch):
    monkeypatch.setenv("JAXGOSSIP_FUSED", "1" if fused_on else "0")
    alg = make(n)
    params = _params(n)
    state = alg.init(params)
    step = jax.jit(alg.step)  # a fresh trace: the switch is read at trace time
    bits = []
    for t in range(rounds):
        params, state, info = step(params, state, jax.random.key(t))
        bits.append(np.asarray(info.bits))
    text = step.lower(params, state, jax.random.key(0)).as_text()
    return params, state, np.stack(bits), text


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_algorithm_on_the_fused_round_equals_its_xla_formulation(name, monkeypatch):
    n, rounds = 8, 4
    got_p, got_s, got_bits, got_text = _run(ALGORITHMS[name], n, rounds, True, monkeypatch)
    want_p, want_s, want_bits, want_text = _run(ALGORITHMS[name], n, rounds, False, monkeypatch)
    assert "jaxgossip_fused_top_k_f32" in got_text and "jaxgossip_fused_top_k_f32" not in want_text
    np.testing.assert_array_equal(got_bits, want_bits)
    for got, want in zip(jax.tree_util.tree_leaves((got_p, got_s)), jax.tree_util.tree_leaves((want_p, want_s))):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)


def test_scsp_nan_model_takes_the_base_budget_on_both_rounds(monkeypatch):
    """A NaN residual norm gives k_i = K on the fused round (the kernel's budget) and on the XLA
    round (scsp.adaptive_budget) alike."""
    n = 8
    sent = {}
    for fused_on in (True, False):
        monkeypatch.setenv("JAXGOSSIP_FUSED", "1" if fused_on else "0")
        alg = ALGORITHMS["scsp"](n)
        params = _params(n)
        params["dense"] = params["dense"].at[3, 0, 0].set(jnp.nan)
        step = jax.jit(alg.step)
        _, _, info = step(params, alg.init(params), jax.random.key(0))
        assert (
            "jaxgossip_fused_top_k_f32" in step.lower(params, alg.init(params), jax.random.key(0)).as_text()
        ) == fused_on
        sent[fused_on] = np.asarray(info.bits)
    np.testing.assert_array_equal(sent[True], sent[False])
    # round 1: x_hat = 0, rho = 1 > tau, every leaf at K_max except node 3's NaN leaf at K
    d = 40 * 30
    base = max(1, int(0.02 * d))
    per_entry = 32 + int(np.ceil(np.log2(d)))
    out_degree = 1  # one-peer exponential graph
    np.testing.assert_allclose(sent[True][0] - sent[True][3], out_degree * (4 * base - base) * per_entry)


def test_stochastic_graphs_and_other_compressors_keep_the_xla_round():
    n = 8
    params = _params(n)
    for alg in (
        choco(
            T.with_failures(T.ring(n), link_drop=0.2),
            gamma=0.4,
            compressor="top_k",
            compressor_options={"fraction": 0.05},
        ),
        choco(T.ring(n), gamma=0.4, compressor="sign"),
        sparse_push(T.with_failures(T.one_peer_exponential(n), link_drop=0.2), fraction=0.05, gamma=0.3),
    ):
        text = jax.jit(alg.step).lower(params, alg.init(params), jax.random.key(0)).as_text()
        assert "jaxgossip_fused_top_k_f32" not in text


def test_fused_choco_step_copies_no_model_buffer():
    """The copies are updated in place: the compiled round holds no copy of a leaf-sized buffer."""
    n = 8
    alg = ALGORITHMS["choco"](n)
    params = _params(n)
    state = jax.tree_util.tree_map(lambda a: a + 0, alg.init(params))

    def rounds(p, st):
        return jax.lax.fori_loop(0, 3, lambda i, c: alg.step(c[0], c[1], jax.random.key(0))[:2], (p, st))

    hlo = jax.jit(rounds, donate_argnums=(0, 1)).lower(params, state).compile().as_text()
    leaf_shapes = {f"f32[{','.join(map(str, (n,) + v))}]" for v in TREE_SHAPES.values()}
    copies = [line for line in hlo.splitlines() if " copy(" in line and any(s in line for s in leaf_shapes)]
    assert not copies, copies[:3]


def test_scsp_budget_in_the_kernel_matches_numpy():
    """SCSP's steps in the kernel: k_i = clip(ceil(K rho_i / tau), K, min(D, max_boost K)) per leaf and node."""
    n, base, boost, tau = 8, 5, 4, 0.3
    rng = np.random.default_rng(3)
    shapes = [(300,), (2000,)]
    x = [rng.standard_normal((n,) + sh).astype(np.float32) for sh in shapes]
    # Residuals of every relative size: some nodes at K, some at the cap, some in between.
    scale = np.geomspace(0.01, 3.0, n).astype(np.float32)[:, None]
    h = [(xi - scale * rng.standard_normal(xi.shape).astype(np.float32))[None] for xi in x]
    s = [np.zeros_like(hi) for hi in h]
    topology = T.directed_ring(n)
    edges = fused.round_edges(topology, 0)
    out = jax.jit(
        lambda a, b, c: fused.top_k_round(
            a,
            b,
            c,
            0,
            edges,
            0.5,
            [base, base],
            self_in_s=False,
            growth=budget_steps([(base, min(d, boost * base)) for d in (300, 2000)], tau),
        )
    )(x, [jnp.asarray(a) for a in h], [jnp.asarray(a) for a in s])
    for leaf, (xi, hi) in enumerate(zip(x, h)):
        rho = np.linalg.norm((xi - hi[0]).astype(np.float64), axis=1) / np.linalg.norm(xi.astype(np.float64), axis=1)
        want = np.clip(np.ceil(base * rho / tau), base, min(xi.shape[1], boost * base)).astype(np.int32)
        np.testing.assert_array_equal(np.asarray(out.kept[leaf]), want)
        rule = leaf_budget(jnp.asarray(xi - hi[0]), jnp.asarray(xi), base, min(xi.shape[1], boost * base), tau)
        np.testing.assert_array_equal(np.asarray(rule), want)  # the XLA round's rule: the same counts
        assert len(set(want.tolist())) > 2  # the case exercises the floor, the cap and values between
        want_x, want_h, want_s = _reference(xi, hi, s[leaf], 0, _edges(topology, 0), 0.5, want, False)
        np.testing.assert_array_equal(np.asarray(out.x_hat[leaf]), want_h)
        np.testing.assert_allclose(np.asarray(out.s[leaf]), want_s, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(out.params[leaf]), want_x, rtol=1e-6, atol=1e-6)


def test_budget_steps_reproduce_the_rule_at_every_float32_ratio():
    """K + #{steps <= rho} equals ratio_budget(rho) on a dense grid of ratios, on both sides of
    every step (the step itself and the float32 just below it) and for NaN and inf."""
    bounds = [(3, 12), (1, 1), (7, 9)]
    for tau in (0.05, 0.3, 1.0 / 3.0):
        steps = np.asarray(budget_steps(bounds, tau))
        assert steps.shape == (3, 9)
        for row, (base, k_max) in zip(steps, bounds):
            finite = row[~np.isnan(row)]
            assert finite.size == k_max - base and np.all(np.diff(finite) >= 0)
            below = np.nextafter(finite, np.float32(0))
            grid = np.concatenate([np.geomspace(1e-6, 10, 2001).astype(np.float32), finite, below, [0, np.inf, np.nan]])
            grid = grid.astype(np.float32)
            want = np.asarray(ratio_budget(jnp.asarray(grid), base, k_max, tau))
            got = base + (finite[None, :] <= grid[:, None]).sum(axis=1)
            np.testing.assert_array_equal(got, want)


def test_scsp_budget_row_whose_sampled_threshold_keeps_too_few_falls_back_exactly():
    """A leaf of 65,536 entries takes the one-read path (threshold for K_max, norms in the same
    pass). Its 1,024 sampled entries (64 runs of 16 at a stride of 1,024) are made the largest, so
    the threshold keeps only them, fewer than the k_i = K_max = 2,000 the budget asks for: the row
    must fall back to the full selection and still send exactly the k_i best."""
    n, d, base, boost = 2, 65536, 500, 4
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, size=(n, d)).astype(np.float32)
    runs = (np.arange(64)[:, None] * 1024 + np.arange(16)[None, :]).reshape(-1)
    x[:, runs] = 2.0
    h = np.zeros((1, n, d), np.float32)  # rho = 1 > tau: every node at the cap
    s = np.zeros_like(h)
    topology = T.directed_ring(n)
    out = jax.jit(
        lambda a, b, c: fused.top_k_round(
            a,
            b,
            c,
            0,
            fused.round_edges(topology, 0),
            0.5,
            [base],
            self_in_s=False,
            growth=budget_steps([(base, boost * base)], 0.05),
        )
    )([x], [jnp.asarray(h)], [jnp.asarray(s)])
    np.testing.assert_array_equal(np.asarray(out.kept[0]), [boost * base] * n)
    want_x, want_h, want_s = _reference(x, h, s, 0, _edges(topology, 0), 0.5, [boost * base] * n, False)
    np.testing.assert_array_equal(np.asarray(out.x_hat[0]), want_h)
    np.testing.assert_allclose(np.asarray(out.s[0]), want_s, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out.params[0]), want_x, rtol=1e-6, atol=1e-6)


def test_portable_loops_without_avx2_pass_the_kernel_tests(tmp_path):
    """JAXGOSSIP_NATIVE_AVX2=0 keeps the portable (non-AVX2) passes, norms and dense update that
    a machine without AVX2 takes; the kernel and selection tests must pass on them too. They run
    in a subprocess (the switch is read once per process)."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    tests = [
        f"{here}/test_fused.py::test_kernel_matches_numpy_loop",
        f"{here}/test_fused.py::test_scsp_budget_in_the_kernel_matches_numpy",
        f"{here}/test_fused.py::test_scsp_budget_row_whose_sampled_threshold_keeps_too_few_falls_back_exactly",
        f"{here}/test_selection.py::test_histogram_selection_on_extreme_rows_is_exact",
        f"{here}/test_selection.py::test_sampled_threshold_that_keeps_too_few_falls_back_exactly",
    ]
    env = dict(os.environ, JAXGOSSIP_NATIVE_AVX2="0")
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "--durations=0", *tests]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1], proc.stdout[-500:]
