"""EquiTopo (Song et al., NeurIPS 2022): D/U-EquiStatic against a NumPy construction from the
basis graphs, stochasticity and degrees, the paper's ``||W - J||_2 <= eps`` claim at its M; OD/OU
EquiDyn drawn inside the run: every sampled round's stochasticity and degree, the closed-form
greedy matching against the sequential scan, uniform shifts, the exact expected contraction
``E[W^T W]`` (closed form for OD, N-independent for OU), gossip against NumPy on the sampled
sequence; spec parsing and errors."""

import math

import jax
import numpy as np
import pytest

import jaxgossip as jg
from jaxgossip import algorithms
from jaxgossip import topology as T
from jaxgossip.cli import main
from jaxgossip.topology.equitopo import basis_shifts, ou_partners


def _basis(n, u):
    """A(u) = I / N + (N-1)/N P_u, receiver i takes from i + u."""
    a = np.eye(n) / n
    a[np.arange(n), (np.arange(n) + u) % n] += (n - 1) / n
    return a


@pytest.mark.parametrize("n, m", [(2, 1), (7, 3), (16, 4), (30, 6)])
def test_equistatic_matrices_are_the_mean_of_basis_graphs(n, m):
    shifts = basis_shifts(n, m, seed=5)
    assert shifts.shape == (m,) and np.all((shifts >= 1) & (shifts < n))
    assert math.gcd(n, *shifts.tolist()) == 1
    d = T.d_equistatic(n, m, seed=5)
    u = T.u_equistatic(n, m, seed=5)
    ref_d = np.mean([_basis(n, s) for s in shifts], axis=0)
    ref_u = np.mean([(_basis(n, s) + _basis(n, s).T) / 2 for s in shifts], axis=0)
    np.testing.assert_allclose(d.matrix(0), ref_d, atol=1e-12)
    np.testing.assert_allclose(u.matrix(0), ref_u, atol=1e-12)
    for topo, bound in ((d, m), (u, 2 * m)):
        w = topo.matrix(0)
        np.testing.assert_allclose(w.sum(0), 1, atol=1e-12)
        np.testing.assert_allclose(w.sum(1), 1, atol=1e-12)
        assert topo.is_doubly_stochastic and topo.out_degree.max() <= bound and topo.in_degree.max() <= bound
    assert u.is_symmetric and not u.directed
    assert T.make(f"d_equistatic:{m}", n, seed=5).value_key() == d.value_key()
    assert T.make(f"u_equistatic:{m}", n, seed=5).value_key() == u.value_key()


def test_equistatic_default_m_and_seed():
    assert T.make("u_equistatic", 16).name == "u_equistatic(16, M=4, seed=0)"
    assert T.make("d_equistatic", 100, seed=2).name == "d_equistatic(100, M=7, seed=2)"
    assert not np.array_equal(T.d_equistatic(64, 3, seed=0).matrix(0), T.d_equistatic(64, 3, seed=1).matrix(0))


@pytest.mark.parametrize("n", (16, 64, 256))
def test_equistatic_norm_bound_of_the_paper(n):
    # Song et al., Theorem: with M >= 8 ln(2N/p) / (3 eps^2), ||W - J||_2 <= eps with probability >= 1 - p.
    eps, p = 0.5, 0.01
    m = math.ceil(8 * math.log(2 * n / p) / (3 * eps**2))
    j = np.full((n, n), 1 / n)
    for seed in range(2):
        for topo in (T.d_equistatic(n, m, seed), T.u_equistatic(n, m, seed)):
            assert np.linalg.norm(topo.matrix(0) - j, 2) <= eps, (topo.name,)


def _greedy(n, u, s):
    """The authors' scan: from node s on, in increasing order (cyclically), i pairs with i + u if both are free."""
    partner, taken = np.arange(n), np.zeros(n, bool)
    for step in range(n):
        i = (s + step) % n
        j = (i + u) % n
        if not taken[i] and not taken[j]:
            taken[i] = taken[j] = True
            partner[i], partner[j] = j, i
    return partner


def test_closed_form_matching_equals_the_sequential_greedy_scan():
    for n in range(2, 22):
        us, ss = np.meshgrid(np.arange(1, n), np.arange(n), indexing="ij")
        got = np.asarray(jax.jit(jax.vmap(lambda u, s, n=n: ou_partners(n, u, s)))(us.ravel(), ss.ravel()))
        want = np.stack([_greedy(n, u, s) for u, s in zip(us.ravel(), ss.ravel())])
        np.testing.assert_array_equal(got, want, err_msg=f"n={n}")


ROUNDS = 300


def _sample(topo, seed=0, rounds=ROUNDS):
    return T.sample_matrices(topo, jax.random.split(jax.random.key(seed), rounds))


@pytest.mark.parametrize("make", [T.od_equidyn, T.ou_equidyn], ids=["od", "ou"])
@pytest.mark.parametrize("n", (2, 9, 16))
def test_every_sampled_round_is_doubly_stochastic_with_one_peer(make, n):
    topo = make(n)
    w = _sample(topo)
    assert topo.stochastic and topo.is_doubly_stochastic and topo.resolved_kernel == "slots"
    assert np.all(w >= 0)
    np.testing.assert_allclose(w.sum(1), 1, atol=1e-6)
    np.testing.assert_allclose(w.sum(2), 1, atol=1e-6)
    off = w * (1 - np.eye(n))
    assert (off > 0).sum(2).max() <= 1 and (off > 0).sum(1).max() <= 1  # one peer in, one out
    link = 0.5 * (n - 1) / n
    assert set(np.round(np.unique(off), 6)) <= {0.0, round(link, 6)}
    if make is T.ou_equidyn:
        np.testing.assert_array_equal(w, w.transpose(0, 2, 1))
        assert topo.is_symmetric
    np.testing.assert_array_equal(w, _sample(topo))  # same key, same sequence


def test_od_shift_is_uniform_and_ou_pairs_along_one_shift():
    n = 7
    w = _sample(T.od_equidyn(n), seed=1, rounds=1200)
    shift = np.argmax(w[:, 0, 1:] > 0, axis=1) + 1  # node 0 takes from node u
    np.testing.assert_array_equal(
        w[np.arange(w.shape[0]), np.arange(n)[:, None], (np.arange(n)[:, None] + shift) % n] > 0, True
    )
    counts = np.bincount(shift, minlength=n)[1:]
    assert np.all(np.abs(counts / w.shape[0] - 1 / (n - 1)) < 0.04), counts
    w = _sample(T.ou_equidyn(n), seed=2)
    for wt in w:  # every pair of a round is {i, i + u} for one u (or, seen from j, j - u)
        i, j = np.nonzero(np.triu(wt * (1 - np.eye(n))))
        diffs = {int(d) for d in (j - i) % n}
        assert len({min(d, n - d) for d in diffs}) <= 1


def _expected_gram_exact(n, undirected, eta=0.5):
    """E[W^T W] by enumerating every shift (and start node) the sampler draws uniformly."""
    gram, count = np.zeros((n, n)), 0
    for u in range(1, n):
        for s in range(n) if undirected else [0]:
            partner = _greedy(n, u, s) if undirected else (np.arange(n) + u) % n
            w = np.eye(n)
            paired = partner != np.arange(n)
            w[paired, paired] = 1 - eta * (n - 1) / n
            w[np.flatnonzero(paired), partner[paired]] = eta * (n - 1) / n
            gram += w.T @ w
            count += 1
    return gram / count


@pytest.mark.parametrize("n", (8, 16, 32))
def test_expected_contraction_is_independent_of_n(n):
    # OD-EquiDyn: E[W^T W] = a^2 + b^2 - 2ab/(N-1) on the vectors orthogonal to 1, = (N-1)/(2N) at eta = 1/2
    lam_od = np.sort(np.linalg.eigvalsh(_expected_gram_exact(n, False)))[::-1]
    np.testing.assert_allclose(lam_od[0], 1.0, atol=1e-12)
    np.testing.assert_allclose(lam_od[1:], (n - 1) / (2 * n), atol=1e-12)
    # OU-EquiDyn: no closed form; its contraction stays bounded away from 1 as N grows
    lam_ou = np.sort(np.linalg.eigvalsh(_expected_gram_exact(n, True)))[::-1]
    assert 0.5 < lam_ou[1] < 0.6, lam_ou[1]


def test_gossip_matches_numpy_on_the_sampled_sequence():
    for topo in (T.od_equidyn(9), T.ou_equidyn(10, eta=0.8)):
        x0 = jax.random.normal(jax.random.key(0), (topo.num_nodes, 3))
        steps, key = 30, jax.random.key(4)
        result = jg.run_consensus(algorithms.make("gossip", topo, gamma=1.0), x0, steps, key)
        w = T.sample_matrices(topo, jg.rounds.round_keys(key, steps))
        x = np.asarray(x0, np.float64)
        for wt in w:
            x = wt @ x
        np.testing.assert_allclose(result.x, x, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.mean(result.x, 0), np.mean(x0, 0), atol=1e-5)
        assert result.error[-1] < 1e-3 * result.error[0]


def test_spec_parsing():
    assert T.make("od_equidyn", 8).name == "od_equidyn(8, eta=0.5)"
    assert T.make("ou_equidyn:0.25", 8).name == "ou_equidyn(8, eta=0.25)"
    for name in ("d_equistatic", "u_equistatic", "od_equidyn", "ou_equidyn"):
        assert name in T.FAMILIES


@pytest.mark.parametrize(
    "spec, message",
    [
        ("u_equistatic:0", r"u_equistatic spec 'u_equistatic:0': M \(the number of basis graphs\) must be an int >= 1"),
        ("d_equistatic:-2", r"d_equistatic spec 'd_equistatic:-2': M .* must be an int >= 1, got '-2'"),
        ("d_equistatic:two", r"M .* must be an int >= 1, got 'two'"),
        ("od_equidyn:0", r"eta=0.0 must lie in \(0, 1\]"),
        ("ou_equidyn:1.5", r"eta=1.5 must lie in \(0, 1\]"),
        ("ou_equidyn:x", r"must look like 'ou_equidyn:ETA'"),
    ],
)
def test_bad_specs_are_clear_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        T.make(spec, 8)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="M=0 is too small"):
        T.u_equistatic(8, 0)
    with pytest.raises(TypeError, match="M must be an int"):
        T.d_equistatic(8, 2.5)
    with pytest.raises(TypeError, match="eta"):
        T.od_equidyn(8, eta="half")


@pytest.mark.parametrize("spec", ["u_equistatic:0", "d_equistatic:0"])
def test_command_line_refuses_m_below_1_with_exit_2(spec, capsys):
    code = main(["train", f"--topology={spec}", "--num_nodes=8", "--print-config"])
    err = capsys.readouterr().err
    assert code == 2 and spec in err and "must be an int >= 1" in err and "Traceback" not in err
