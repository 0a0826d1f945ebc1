"""Stochastic graphs at scale: a round drawn inside the compiled program stays O(E) (no [N, N]
value in its program, temporary memory proportional to E), and the drawn round is a valid W(t)
whose mixing equals the sparse product of its own edge list. The small-N semantics of every draw
are tested in test_stochastic.py; here the same draws run at N = 2^14 (default suite) and
N = 2^20 (slow)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse

import jaxgossip as jg
from jaxgossip import topology
from jaxgossip.topology import edges

SPECS = ("random_matching", "random_out:2", "ring+drop:0.1", "torus+drop:0.1+nodedrop:0.05")
D = 4
# Temporary bytes of one drawn and mixed round, per edge and per value of x: measured 4 to 28
# bytes per edge at N = 2^16; an [N, N] intermediate would be N / E times E itself.
TEMP_BYTES_PER_EDGE = 64


def _round(graph):
    def one(key, x):
        drawn = graph.draw(key, 0).graph
        return jg.mix(drawn, x, 0), drawn.senders[0], drawn.receivers[0], drawn.weights[0]

    return one


def _check_draw_at(spec: str, n: int) -> None:
    graph = topology.make(spec, n)
    e = graph.num_edges
    x = jax.random.normal(jax.random.key(1), (n, D), jnp.float32)
    key = jax.random.key(7)
    one = _round(graph)

    # The program: every intermediate is O(E + N D) (no [N, N] mixing matrix, no [N, E] table).
    jaxpr = jax.make_jaxpr(one)(key, x).jaxpr
    sizes = [int(np.prod(v.aval.shape)) for eqn in jaxpr.eqns for v in eqn.outvars if hasattr(v.aval, "shape")]
    assert max(sizes) <= 4 * max(e, n) * D, (spec, max(sizes), e)
    compiled = jax.jit(one).lower(key, x).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    assert temp <= TEMP_BYTES_PER_EDGE * e + 4 * n * D * 4, (spec, temp, e)

    mixed, s, r, w = (np.asarray(a) for a in compiled(key, x))
    s, r, w = s.astype(np.int64), r.astype(np.int64), w.astype(np.float64)
    assert s.shape == (e,) and s.min() >= 0 and s.max() < n and r.min() >= 0 and r.max() < n
    assert np.all(w >= 0)
    # The round's promised stochasticity and symmetry, on its own edge list.
    if graph.is_row_stochastic:
        np.testing.assert_allclose(np.bincount(r, weights=w, minlength=n), 1.0, atol=1e-6)
    if graph.is_column_stochastic:
        np.testing.assert_allclose(np.bincount(s, weights=w, minlength=n), 1.0, atol=1e-6)
    if graph.is_symmetric:
        assert all(edges.transpose_check(s, r, w, n))
    # Mixing equals the sparse product of the drawn edges, W(t) x with W[r, s] += w.
    want = scipy.sparse.csr_matrix((w, (r, s)), shape=(n, n)) @ np.asarray(x, np.float64)
    np.testing.assert_allclose(mixed, want, rtol=1e-5, atol=1e-5)
    if spec == "random_matching":
        # W = (I + P) / 2 with P an involution: every node's partner has it as partner.
        other = r != s
        partner = np.arange(n)
        partner[r[other]] = s[other]
        np.testing.assert_array_equal(partner[partner], np.arange(n))
        assert np.count_nonzero(partner != np.arange(n)) == n  # N even: a perfect matching


@pytest.mark.parametrize("spec", SPECS)
def test_drawn_round_is_o_of_e_and_mixes_as_its_edges(spec):
    _check_draw_at(spec, 2**14)


@pytest.mark.slow
@pytest.mark.parametrize("spec", SPECS)
def test_drawn_round_at_a_million_nodes(spec):
    _check_draw_at(spec, 2**20)
