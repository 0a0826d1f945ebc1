"""Stochastic graphs drawn inside the compiled run (jaxgossip.topology.stochastic): random_matching,
random_out, with_failures.

Every sampled W(t) is checked in NumPy for the stochasticity it promises; gossip and push-sum are
compared with dense NumPy references on the sampled sequence; failures with p = q = 0 reproduce the
wrapped graph bitwise; bits follow the messages actually sent; every algorithm class runs on the
graphs it accepts, and refuses the others with a reason.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny import tiny_config

import jaxgossip as jg
from jaxgossip import algorithms
from jaxgossip import topology as T
from jaxgossip.cli import main
from jaxgossip.engine import sweeps
from jaxgossip.ops import mixing
from jaxgossip.run.runner import run_training

ROUNDS = 200


def _keys(seed, rounds=ROUNDS):
    return jax.random.split(jax.random.key(seed), rounds)


def _graphs():
    return {
        "matching8": T.random_matching(8),
        "matching7": T.random_matching(7),
        "out8s2": T.random_out(8, 2),
        "ring_fail": T.with_failures(T.ring(8), link_drop=0.3, node_drop=0.1),
        "star_fail": T.with_failures(T.star(20), link_drop=0.3),  # segment layout
        "complete_fail": T.with_failures(T.complete(6), link_drop=0.3),  # dense layout
        "onepeer_fail": T.with_failures(T.one_peer_exponential(8), link_drop=0.3, node_drop=0.1),
        "matching_fail": T.with_failures(T.random_matching(8), link_drop=0.5),
        "out_fail": T.with_failures(T.random_out(8, 2), link_drop=0.5, node_drop=0.1),
    }


# The cheap ones run by default; the other layouts and wrappers with -m slow.
_FAST = ("matching7", "out8s2", "ring_fail", "onepeer_fail")


@pytest.mark.parametrize("name", [n if n in _FAST else pytest.param(n, marks=pytest.mark.slow) for n in _graphs()])
def test_every_sampled_round_has_the_promised_stochasticity(name):
    topo = _graphs()[name]
    w = T.sample_matrices(topo, _keys(1))  # [R, N, N]
    n = topo.num_nodes
    assert w.shape == (ROUNDS, n, n) and np.all(w >= 0)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-6)  # column stochastic: every graph here
    if topo.is_doubly_stochastic:
        np.testing.assert_allclose(w.sum(axis=2), 1.0, atol=1e-6)
    if topo.is_symmetric:
        np.testing.assert_array_equal(w, w.transpose(0, 2, 1))
    off = w * (1 - np.eye(n))
    if name.startswith("matching") and name != "matching_fail":
        # (I + P) / 2: each node has at most one partner with weight 1/2; N odd leaves exactly one out.
        partners = (off == 0.5).sum(axis=2)
        assert set(np.unique(off)) <= {0.0, 0.5} and np.all(partners <= 1)
        assert np.all((partners == 0).sum(axis=1) == n % 2)
    if name == "out8s2":  # each sender: 2 distinct other receivers, 1/3 each, and 1/3 kept
        np.testing.assert_allclose(np.diagonal(w, axis1=1, axis2=2), 1 / 3, rtol=1e-6)
        assert np.all((off > 0).sum(axis=1) == 2)
    if topo.support is not None and topo.stochastic:  # failures only remove the support's edges
        base = T.sample_matrices(topo.support, _keys(1))
        assert np.all((off == 0) | np.isclose(off, base * (1 - np.eye(n))))
    # same key, same sequence (drawn again, eagerly, round by round); consecutive rounds differ
    np.testing.assert_array_equal(w, T.sample_matrices(topo, _keys(1)))
    again = topo.draw(_keys(1)[5], 5).graph
    dense = np.zeros((n, n))
    np.add.at(dense, (np.asarray(again.receivers[0]), np.asarray(again.senders[0])), np.asarray(again.weights[0]))
    np.testing.assert_allclose(dense, w[5], atol=1e-7)
    assert np.mean([not np.array_equal(w[r], w[r + 1]) for r in range(ROUNDS - 1)]) > 0.5


def test_random_matching_is_uniform_and_failures_drop_at_rate_p():
    # N = 4 has 3 perfect matchings; each should come up a third of the time.
    w = T.sample_matrices(T.random_matching(4), _keys(2, 600))
    counts = np.bincount(np.argmax(w[:, 0, 1:] > 0, axis=1), minlength=3)
    assert np.all(np.abs(counts / 600 - 1 / 3) < 0.07), counts
    # an undirected pair fails as a whole with probability p, and with either endpoint down (q)
    topo = T.with_failures(T.ring(10), link_drop=0.3, node_drop=0.2)
    keys = _keys(3, 300)
    w = T.sample_matrices(topo, keys)
    up = w[:, np.arange(10), (np.arange(10) + 1) % 10] > 0
    np.testing.assert_array_equal(up, w[:, (np.arange(10) + 1) % 10, np.arange(10)] > 0)  # both directions
    assert abs(up.mean() - 0.7 * 0.8**2) < 0.04
    alive = np.asarray(jax.vmap(lambda k: topo.draw(k, 0).alive)(keys))
    assert abs(alive.mean() - 0.8) < 0.04
    assert np.all(w[~alive] == np.eye(10)[None].repeat(300, 0)[~alive])  # a down node keeps its value


def _gossip_reference(w, x0, gamma):
    x = np.asarray(x0, np.float64)
    for wt in w:
        x = x + gamma * (wt @ x - x)
    return x


@pytest.mark.parametrize(
    "topo",
    [
        T.random_matching(7),
        T.with_failures(T.ring(6), 0.3, 0.1),
        pytest.param(T.with_failures(T.torus(3, 3), 0.3, 0.1), marks=pytest.mark.slow),
    ],
    ids=str,
)
def test_gossip_matches_numpy_on_the_sampled_sequence_and_keeps_the_mean(topo):
    x0 = jax.random.normal(jax.random.key(0), (topo.num_nodes, 5))
    steps, key = 40, jax.random.key(7)
    result = jg.run_consensus(algorithms.make("gossip", topo, gamma=0.9), x0, steps, key)
    w = T.sample_matrices(topo, jg.rounds.round_keys(key, steps))  # the keys run_consensus hands to step
    np.testing.assert_allclose(result.x, _gossip_reference(w, x0, 0.9), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.mean(result.x, 0), np.mean(x0, 0), atol=1e-5)
    assert result.error[-1] < 1e-3 * result.error[0]
    # bits: 32 D per message, one message per non-zero off-diagonal entry (sender = column)
    sent = ((w * (1 - np.eye(topo.num_nodes))) > 0).sum(axis=1)  # [R, N]
    np.testing.assert_array_equal(result.node_bits, sent * 32 * 5)


@pytest.mark.parametrize(
    "topo",
    [T.random_out(8, 2), pytest.param(T.with_failures(T.one_peer_exponential(8), 0.3, 0.1), marks=pytest.mark.slow)],
    ids=str,
)
def test_push_sum_matches_numpy_keeps_the_mass_and_converges(topo):
    x0 = jax.random.normal(jax.random.key(1), (8, 4))
    steps, key = 60, jax.random.key(8)
    result = jg.run_consensus(algorithms.make("push_sum", topo), x0, steps, key)
    w = T.sample_matrices(topo, jg.rounds.round_keys(key, steps))
    x, weight = np.asarray(x0, np.float64), np.ones(8)
    for wt in w:
        x, weight = wt @ x, wt @ weight
    np.testing.assert_allclose(result.x, x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.state.w, weight, rtol=1e-5)
    np.testing.assert_allclose(np.sum(result.x, 0), np.sum(x0, 0), atol=1e-4)
    np.testing.assert_allclose(np.sum(result.state.w), 8.0, rtol=1e-5)
    assert result.error[-1] < 1e-6 * result.error[0]


def _run(name, topo, x, opts, steps=25):
    return jg.run_consensus(algorithms.make(name, topo, **opts), x, steps, jax.random.key(5))


ZERO_DROP_CASES = [
    ("gossip", T.ring(8), {}),
    ("gossip", T.star(20), {}),  # segment layout
    ("gossip", T.complete(6), {}),  # dense layout
    ("push_sum", T.one_peer_exponential(8), {}),
    ("deepsqueeze", T.ring(8), {"gamma": 0.4, "compressor": "sign"}),
    ("choco", T.ring(8), {"gamma": 0.4, "compressor": "top_k", "compressor_options": {"fraction": 0.5}}),
    ("sparse_push", T.one_peer_exponential(8), {"fraction": 0.5, "gamma": 0.5}),
    ("scsp", T.directed_ring(8), {"fraction": 0.3, "gamma": 0.5}),
    ("power_gossip", T.ring(8), {}),
]


@pytest.mark.parametrize(
    "name, base, opts",
    [
        c
        if c[0] in ("gossip", "choco", "power_gossip") and c[1].name == "ring(8)"
        else pytest.param(*c, marks=pytest.mark.slow)
        for c in ZERO_DROP_CASES
    ],
    ids=[f"{c[0]}-{c[1].name}" for c in ZERO_DROP_CASES],
)
def test_failures_with_zero_probabilities_equal_the_wrapped_graph(name, base, opts, monkeypatch):
    # Both runs on the XLA formulation: with failures the top-k algorithms never take the fused CPU
    # round (jaxgossip.compress.fused), which equals the XLA one to float32 round-off only (tests/compress/test_fused.py).
    monkeypatch.setenv("JAXGOSSIP_FUSED", "0")
    shape = (base.num_nodes, 4, 3) if name == "power_gossip" else (base.num_nodes, 6)
    x = jax.random.normal(jax.random.key(0), shape)
    a = _run(name, base, x, opts)
    b = _run(name, T.with_failures(base, link_drop=0.0, node_drop=0.0), x, opts)
    # Every message is sent: the bits are equal exactly. The models come from two programs (the drawn
    # graph's tables are traced), which XLA may fuse and contract differently: under the suite's
    # classic CPU emitters DeepSqueeze's differ in the last bits (bitwise with XLA's default ones).
    np.testing.assert_array_equal(a.node_bits, b.node_bits)
    np.testing.assert_allclose(a.x, b.x, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(a.error, b.error, rtol=1e-6, atol=1e-9)


@pytest.mark.slow
def test_failures_with_zero_probabilities_train_bitwise_like_the_wrapped_graph():
    a = run_training(tiny_config(topology="ring", num_rounds=10))
    b = run_training(tiny_config(topology="ring+drop:0+nodedrop:0", num_rounds=10))
    for field in ("test_acc", "consensus", "bits"):
        np.testing.assert_array_equal(getattr(a.metrics, field), getattr(b.metrics, field))


def test_bits_under_link_drop_on_a_ring_are_about_one_minus_p():
    x = jnp.zeros((8, 3))
    full = _run("gossip", T.ring(8), x, {}, steps=ROUNDS).bits[-1]
    sent = _run("gossip", T.with_failures(T.ring(8), link_drop=0.3), x, {}, steps=ROUNDS).bits[-1]
    assert abs(sent / full - 0.7) < 0.06, sent / full  # 1600 pair coins: 5 standard deviations


@pytest.mark.slow
def test_bits_under_link_drop_are_about_one_minus_p():
    x = jnp.zeros((8, 3))
    for name, base in (("gossip", T.ring(8)), ("push_sum", T.directed_ring(8)), ("power_gossip", T.ring(8))):
        full = _run(name, base, x[:, :, None] if name == "power_gossip" else x, {}, steps=ROUNDS).bits[-1]
        for p in (0.3, 0.6):
            topo = T.with_failures(base, link_drop=p)
            sent = _run(name, topo, x[:, :, None] if name == "power_gossip" else x, {}, steps=ROUNDS).bits[-1]
            assert abs(sent / full - (1 - p)) < 0.06, (name, p, sent / full)
    # a down node sends nothing and receives nothing: an undirected pair survives with (1 - q)^2
    sent = _run("gossip", T.with_failures(T.ring(8), node_drop=0.2), x, {}, steps=ROUNDS).bits[-1]
    full = _run("gossip", T.ring(8), x, {}, steps=ROUNDS).bits[-1]
    assert abs(sent / full - 0.64) < 0.06


# Which of (ring+failures, one_peer_exponential+failures, random_matching, random_out) each algorithm
# accepts: its mixing kind and its stochastic_graphs metadata decide.
ACCEPTS = {
    "gossip": (True, False, True, False),
    "push_sum": (True, True, True, True),
    "deepsqueeze": (True, False, True, False),
    "choco": (True, False, False, False),
    "sparse_push": (True, True, False, False),
    "scsp": (True, True, False, False),
    "power_gossip": (True, False, False, False),
    "allreduce": (True, True, True, True),
    # gradient-aware methods: mean-preserving W(t) drawn per round; d2 needs one fixed W
    "gradient_tracking": (True, False, True, False),
    "qgm": (True, False, True, False),
    "moniqua": (True, False, True, False),
    "d2": (False, False, False, False),
}
OPTIONS = {
    "qgm": {"lr": 0.1},
    "moniqua": {"theta": 8.0, "gamma": 0.5, "bits": 8},  # rounding grid delta B = 0.06 << |x| ~ 1
    "d2": {"gamma": 0.5},
    "deepsqueeze": {"gamma": 0.3},
    "choco": {"gamma": 0.5, "compressor": "top_k", "compressor_options": {"fraction": 0.5}},
    "sparse_push": {"fraction": 0.5, "gamma": 0.5},
    "scsp": {"fraction": 0.5, "gamma": 0.5},
}


def _stochastic_graphs():
    """The four drawn graphs, in the order of the ``ACCEPTS`` rows."""
    return [
        T.with_failures(T.ring(8), 0.3, 0.1),
        T.with_failures(T.one_peer_exponential(8), 0.3, 0.1),
        T.random_matching(8),
        T.random_out(8, 2),
    ]


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) for n in ACCEPTS])
def test_every_algorithm_runs_on_the_stochastic_graphs_it_accepts(name):
    info = algorithms.info(name)
    graphs = _stochastic_graphs()
    x = jax.random.normal(jax.random.key(3), (8, 4, 3))
    for topo, accepted in zip(graphs, ACCEPTS[name]):
        if not accepted:  # the refusal names the algorithm, the graph and the reason
            with pytest.raises(ValueError, match=f"{name} (cannot run on|needs).*{re.escape(topo.name[:10])}"):
                algorithms.make(name, topo, **OPTIONS.get(name, {}))
            continue
        result = jg.run_consensus(algorithms.make(name, topo, **OPTIONS.get(name, {})), x, 20, jax.random.key(4))
        assert np.all(np.isfinite(result.x)) and np.all(np.isfinite(result.error)), topo.name
        assert result.error[-1] < result.error[0], topo.name
        if info.graph.mixing == "column_stochastic":
            np.testing.assert_allclose(np.sum(result.x, 0), np.sum(x, 0), atol=1e-4)
        elif info.graph.mixing != "any":
            np.testing.assert_allclose(np.mean(result.x, 0), np.mean(x, 0), atol=1e-5)


def test_every_algorithm_runs_on_one_stochastic_graph_and_refuses_the_others_with_a_reason():
    graphs = _stochastic_graphs()
    x = jax.random.normal(jax.random.key(3), (8, 4, 3))
    # gossip and push_sum have NumPy references above; scsp shares sparse_push's round (slow test)
    first = {"deepsqueeze": 2, "choco": 0, "sparse_push": 1, "power_gossip": 0}
    for name, accepts in ACCEPTS.items():
        for topo, accepted in zip(graphs, accepts):
            if not accepted:
                with pytest.raises(ValueError, match=f"{name} (cannot run on|needs).*{re.escape(topo.name[:10])}"):
                    algorithms.make(name, topo, **OPTIONS.get(name, {}))
        if name not in first:
            continue
        topo = graphs[first[name]]
        result = jg.run_consensus(algorithms.make(name, topo, **OPTIONS.get(name, {})), x, 10, jax.random.key(4))
        assert np.all(np.isfinite(result.error)) and result.error[-1] < result.error[0], (name, topo.name)


def _top_k(v, k):
    out = np.zeros_like(v)
    idx = np.argsort(-np.abs(v))[:k]
    out[idx] = v[idx]
    return out


def test_choco_public_copies_agree_at_every_holder_under_failures():
    """NumPy reference with one copy of x_hat_j per holder (j's neighbours in the fixed ring and j
    itself), updated only from the messages q_j that j sends; the averaging uses W(t)."""
    n, d, gamma, steps = 6, 8, 0.4, 12
    base = T.ring(n)
    topo = T.with_failures(base, link_drop=0.4, node_drop=0.2)
    alg = algorithms.make("choco", topo, gamma=gamma, compressor="top_k", compressor_options={"k": 3})
    x0 = jax.random.normal(jax.random.key(0), (n, d))
    keys = jax.random.split(jax.random.key(9), steps)
    step = jax.jit(alg.step)
    alive_of = jax.jit(lambda k, t: topo.draw(k, t).alive)
    x, state = x0, alg.init(x0)
    holders = [np.flatnonzero(base.matrix()[:, j]) for j in range(n)]  # j's neighbours and j
    copies = np.zeros((n, n, d))  # copies[h, j]: holder h's copy of x_hat_j
    xr = np.asarray(x0, np.float64)
    for r, key in enumerate(keys):
        x, state, info = step(x, state, key)
        alive = np.asarray(alive_of(key, r))
        w = T.sample_matrices(topo, key[None], start=r)[0]
        q = np.stack([_top_k(xr[j] - copies[j, j], 3) * alive[j] for j in range(n)])
        for j in range(n):
            copies[holders[j], j] += q[j]
        assert np.all(w[np.asarray(base.matrix()) == 0] == 0)  # only holders' copies are ever used
        xr = xr + gamma * (np.einsum("ij,ijd->id", w, copies) - copies[np.arange(n), np.arange(n)])
        for j in range(n):  # every holder has the same copy, and it is the algorithm's x_hat_j
            np.testing.assert_allclose(copies[holders[j], j], np.broadcast_to(copies[j, j], (holders[j].size, d)))
            np.testing.assert_allclose(state.x_hat[j], copies[j, j], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(info.bits, alive * 2 * 3 * (32 + 3), rtol=1e-6)  # top-3 of D = 8
    np.testing.assert_allclose(x, xr, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.mean(x, 0), np.mean(x0, 0), atol=1e-5)


def test_power_gossip_skips_failed_pairs_and_keeps_their_state():
    topo = T.with_failures(T.ring(6), link_drop=0.5)
    alg = algorithms.make("power_gossip", topo)
    x = jax.random.normal(jax.random.key(0), (6, 5, 4))
    state = alg.init(x)
    step = jax.jit(alg.step)
    keep_of = jax.jit(lambda k, t: topo.draw(k, t).pair_keep)
    kept_any = dropped_any = False
    for r, key in enumerate(jax.random.split(jax.random.key(2), 8)):
        new_x, new_state, info = step(x, state, key)
        keep = np.asarray(keep_of(key, r))
        u0, u1 = np.asarray(state.u[0]), np.asarray(new_state.u[0])
        v0, v1 = np.asarray(state.v[0]), np.asarray(new_state.v[0])
        if r > 0:  # round 0 exchanges nothing (skip_first_round)
            np.testing.assert_array_equal(u1[~keep], u0[~keep])
            np.testing.assert_array_equal(v1[~keep], v0[~keep])
            assert not (np.array_equal(u1[keep], u0[keep]) and np.array_equal(v1[keep], v0[keep]))
            # bits: each node pays for its pairs that are up
            a, b = topo.sampler.pair_ends
            degree = np.bincount(np.concatenate([np.asarray(a)[keep], np.asarray(b)[keep]]), minlength=6)
            assert np.array_equal(np.asarray(info.bits) > 0, degree > 0)
            kept_any |= keep.any()
            dropped_any |= (~keep).any()
        np.testing.assert_allclose(np.mean(new_x, 0), np.mean(x, 0), atol=1e-5)
        x, state = new_x, new_state
    assert kept_any and dropped_any


def test_spectral_gap_is_the_expected_gap_estimate():
    gap = T.spectral_gap(T.random_matching(8))
    assert 0 < gap < 1 and gap == T.spectral_gap(T.random_matching(8))  # fixed key: reproducible
    ring = T.spectral_gap(T.ring(8))
    np.testing.assert_allclose(T.spectral_gap(T.with_failures(T.ring(8), 0.0)), ring, rtol=1e-5)
    assert T.spectral_gap(T.with_failures(T.ring(8), 0.5)) < ring
    with pytest.raises(ValueError, match="doubly stochastic"):
        T.spectral_gap(T.random_out(8, 2))


@pytest.mark.slow
def test_sweeps_run_stochastic_graphs_alone_and_equal_consensus_scan():
    graphs = [T.ring(8), T.random_matching(8), T.with_failures(T.ring(8), 0.3)]
    sweep = sweeps.sweep_topologies("gossip", graphs, dim=3, num_steps=10, seeds=[0])
    assert sorted(map(sorted, sweep.groups)) == [[0], [1], [2]]  # stochastic graphs are never stacked
    key_x, key_a = jax.random.split(jax.random.key(0))
    x0 = jax.random.normal(key_x, (8, 3))
    trace = jg.consensus_scan(algorithms.make("gossip", graphs[1]), x0, 10, key_a)
    np.testing.assert_allclose(sweep.error[1][0], trace.error, rtol=1e-5, atol=1e-7)
    rows = sweeps.topology_rows(sweep)
    assert rows[1]["mean_degree"] == pytest.approx(1.0)  # a matching of 8: one message per node


def test_bad_input_is_refused_with_a_reason():
    for p in (1.0, -0.1, float("nan"), 1.5):
        with pytest.raises(ValueError, match="link_drop"):
            T.with_failures(T.ring(8), link_drop=p)
    with pytest.raises(ValueError, match="node_drop"):
        T.with_failures(T.ring(8), node_drop=1.0)
    with pytest.raises(TypeError, match="link_drop"):
        T.with_failures(T.ring(8), link_drop="0.3")
    with pytest.raises(ValueError, match="already has failures"):
        T.with_failures(T.with_failures(T.ring(8), 0.1), 0.1)
    with pytest.raises(ValueError, match="s=8 is out of range"):
        T.random_out(8, 8)
    with pytest.raises(ValueError, match="s=0 is out of range"):
        T.random_out(8, 0)
    with pytest.raises(TypeError, match="s must be an int"):
        T.random_out(8, 1.5)
    with pytest.raises(ValueError, match="n=1 is too small"):
        T.random_matching(1)
    # algorithms that cannot use a graph say why
    with pytest.raises(ValueError, match="choco cannot run on random_matching.*public copies"):
        algorithms.make("choco", T.random_matching(8))
    with pytest.raises(ValueError, match="power_gossip cannot run on random_matching"):
        algorithms.make("power_gossip", T.random_matching(8))
    with pytest.raises(ValueError, match="sparse_push cannot run on random_out"):
        algorithms.make("sparse_push", T.random_out(8, 2))
    with pytest.raises(ValueError, match="gossip needs doubly stochastic.*only column stochastic"):
        algorithms.make("gossip", T.random_out(8, 2))
    with pytest.raises(ValueError, match="choco needs a static topology"):
        algorithms.make("choco", T.with_failures(T.schedule([T.ring(8), T.hypercube(8)]), 0.1))
    algorithms.register(
        "fixed_tables_only", algorithms.gossip, graph=algorithms.GraphNeeds(mixing="doubly_stochastic"), replace=True
    )
    try:
        with pytest.raises(ValueError, match="stochastic_graphs='none'"):
            algorithms.make("fixed_tables_only", T.random_matching(8))
    finally:
        algorithms.unregister("fixed_tables_only")
    with pytest.raises(ValueError, match="topology.draw"):
        mixing.mix(T.random_matching(8), jnp.zeros((8, 2)))
    with pytest.raises(ValueError, match="stochastic graph"):
        T.random_matching(8).matrix(0)
    for spec in ("ring+drop:abc", "ring+drop:1", "ring+drop", "ring+flood:0.1", "random_out:x", "random_out:9"):
        with pytest.raises(ValueError):
            T.make(spec, 8)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("ring+drop:1.2", "link_drop=1.2 must be a probability in [0, 1)"),
        ("random_out:8", "s=8 is out of range"),
        ("ring+drop:x", "failures are written BASE+drop:P"),
    ],
)
def test_cli_spec_errors_exit_2(spec, message, tmp_path, capsys):
    code = main(["consensus", "--num_nodes=8", f"--topology={spec}", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err


def test_cli_help_lists_the_stochastic_graphs(capsys):
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for word in ("random_matching", "random_out:S", "+drop:P", "+nodedrop:Q"):
        assert word in out, word


@pytest.mark.slow
def test_a_resumed_run_draws_the_same_graphs(tmp_path):
    """The graph of round t comes from the step key, which the train state carries: a run stopped at
    round 10 and continued to 20 equals the run done in one go."""
    config = tiny_config(topology="random_matching+drop:0.3+nodedrop:0.1", algorithm="gossip", num_rounds=20)
    quiet = {"progress": False, "log": lambda s: None}
    straight = run_training(config, str(tmp_path / "a"), **quiet)
    run_training(config.replace(num_rounds=10), str(tmp_path / "b"), **quiet)
    resumed = run_training(config, str(tmp_path / "b"), **quiet)
    assert resumed.start_round == 10
    for a, b in zip(jax.tree_util.tree_leaves(straight.state), jax.tree_util.tree_leaves(resumed.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_host_analysis_of_a_drawn_graph_inside_jit():
    # A sweep builds its trainer inside jit, and the time model asks for the mean degree there.
    topo = T.random_matching(6)
    degree, gram = T.mean_out_degree(topo), T.expected_gram(topo, num_samples=64)

    @jax.jit
    def traced(x):
        return x * T.mean_out_degree(topo), x * T.expected_gram(topo, num_samples=64)

    got_degree, got_gram = traced(1.0)
    np.testing.assert_allclose(float(got_degree), degree, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got_gram), gram, rtol=1e-6)


def test_mean_degree_of_a_traced_member_of_a_stack_of_failure_graphs_equals_the_host_estimate():
    # A topology sweep over failure probabilities stacks the graphs and builds each member's time
    # model under vmap, where the probabilities are traced: the degree is counted from the same draws.
    graphs = [T.with_failures(T.ring(8), link_drop=p, node_drop=q) for p, q in ((0.0, 0.0), (0.3, 0.0), (0.5, 0.2))]
    host = [T.mean_out_degree(g, num_samples=64) for g in graphs]
    traced = jax.jit(jax.vmap(lambda g: T.mean_out_degree(g, num_samples=64)))(T.stack(graphs))
    np.testing.assert_allclose(np.asarray(traced), host, rtol=1e-6)
    assert host[0] == 2.0 and host[0] > host[1] > host[2] > 0
