"""The Byzantine wrapper: every attack's messages against a NumPy reference (through each rule that
can be attacked), gossip against robust rules under attack, metrics over honest nodes, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from _reference import flat, in_neighbours, irregular_graph, ref_clipped, ref_gossip, ref_median, ref_trimmed

import jaxgossip as jg
from jaxgossip import algorithms
from jaxgossip import topology as T

IDS = [3, 6]  # attackers of irregular_graph(): degrees 5 and 4; the honest graph stays connected


def np_messages(w, x, byz, attack, **opt):
    """{(j, i): message} for every edge from an attacker j to an honest receiver i (NumPy).

    H_i = i and its honest in-neighbours; alie's z from Baruch et al.'s rule unless given."""
    n = x.shape[0]
    byz = set(byz)
    msgs = {}
    for i in range(n):
        if i in byz:
            continue
        honest_nbrs = [j for j in in_neighbours(w, i) if j not in byz]
        h = x[[i] + honest_nbrs]
        for j in in_neighbours(w, i):
            if j not in byz:
                continue
            if attack == "signflip":
                msgs[(j, i)] = -x[j]
            elif attack == "ipm":
                msgs[(j, i)] = -opt.get("epsilon", 0.1) * h.mean(0)
            elif attack == "alie":
                k = len(byz)
                s = np.floor(n / 2 + 1) - k
                z = opt.get("z", scipy.stats.norm.ppf((n - k - s) / (n - k)))
                msgs[(j, i)] = h.mean(0) - z * h.std(0, ddof=1)
            elif attack == "dissensus":
                pull = sum(w[i, q] * (x[q] - x[i]) for q in honest_nbrs)
                byz_weight = sum(w[i, b] for b in in_neighbours(w, i) if b in byz)
                msgs[(j, i)] = x[i] - opt.get("epsilon", 1.0) * pull / byz_weight
    return msgs


def models(n, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "w": jnp.asarray(rng.standard_normal((n, 2, 3)), jnp.float32),
        "b": jnp.asarray(rng.standard_normal((n, 2)), jnp.float32),
    }


def step_once(alg, x, key=0):
    state = alg.init(x)
    y, state, info = jax.jit(alg.step)(x, state, jax.random.key(key))
    return y, state, info


RULES = {
    "gossip": ({}, lambda w, x, m: ref_gossip(w, x, m)),
    "clipped_gossip": ({}, lambda w, x, m: ref_clipped(w, x, m)),
    "clipped_gossip_tau": ({"tau": 0.8}, lambda w, x, m: ref_clipped(w, x, m, tau=0.8)),
    "trimmed_mean": ({}, lambda w, x, m: ref_trimmed(w, x, m, trim=1)),
    "median": ({}, lambda w, x, m: ref_median(w, x, m)),
}
ATTACKS = [
    ("signflip", {}),
    ("ipm", {}),
    ("ipm", {"epsilon": 2.0}),
    ("alie", {}),
    ("alie", {"z": 1.5}),
    ("dissensus", {}),
    ("dissensus", {"epsilon": 3.0}),
]


@pytest.mark.parametrize("attack,opt", ATTACKS, ids=[f"{a}-{o}" for a, o in ATTACKS])
@pytest.mark.parametrize("rule", list(RULES))
def test_each_attack_matches_the_numpy_reference_through_each_rule(rule, attack, opt):
    topo = irregular_graph()
    x = models(10)
    options, ref = RULES[rule]
    name = rule.removesuffix("_tau")
    alg = algorithms.byzantine(name, topo, attack, ids=IDS, options=options, **opt)
    y, state, info = step_once(alg, x)
    w, xf = topo.matrix(), flat(x)
    msgs = np_messages(w, xf, IDS, attack, **opt)
    assert len(msgs) == sum(1 for i in range(10) if i not in IDS for j in in_neighbours(w, i) if j in IDS)
    # honest receivers read the attack, attackers run the rule on honest messages
    np.testing.assert_allclose(flat(y), ref(w, xf, msgs), rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(np.asarray(state.honest), [i not in IDS for i in range(10)])
    # the trainer reads the mask through the algorithm's honest hook
    np.testing.assert_array_equal(np.asarray(alg.honest(state)), [i not in IDS for i in range(10)])
    # attackers send one model per directed edge, as everybody
    np.testing.assert_array_equal(np.asarray(info.bits), topo.out_degree[0] * 32 * 8)


def test_gaussian_sends_one_n0_sigma2_draw_per_attacker_and_round():
    topo = T.torus(4, 4)  # uniform weights 1/5: the message is recovered from the gossip round
    n, d, sigma = 16, 4000, 100.0
    x = jnp.asarray(np.random.default_rng(0).standard_normal((n, d)), jnp.float32)
    alg = algorithms.byzantine("gossip", topo, "gaussian", ids=[0, 10])
    state = alg.init(x)
    w, xf = topo.matrix(), np.asarray(x, np.float64)
    recovered = []
    for key in (1, 2):
        y, _, _ = jax.jit(alg.step)(x, state, jax.random.key(key))
        honest_part = ref_gossip(w, xf)  # what an honest sender's model contributes ...
        per_edge = {}
        for j in (0, 10):
            for i in in_neighbours(w, j):
                if i in (0, 10):
                    continue
                # ... y_i = (W x)_i - W_ij x_j + W_ij m_ji
                per_edge[(j, i)] = (np.asarray(y, np.float64)[i] - honest_part[i]) / w[i, j] + xf[j]
        for j in (0, 10):
            sent = [m for (s, _), m in per_edge.items() if s == j]
            for m in sent[1:]:
                np.testing.assert_allclose(m, sent[0], rtol=1e-3, atol=1e-2)  # the same draw to all neighbours
            assert abs(np.mean(sent[0])) < 5 * sigma / np.sqrt(d)
            assert abs(np.std(sent[0]) / sigma - 1) < 0.05
        recovered.append(per_edge[(0, 1)])
    assert np.corrcoef(recovered[0], recovered[1])[0, 1] < 0.1  # a new draw every round
    # the sigma option
    small = algorithms.byzantine("gossip", topo, "gaussian", ids=[0, 10], sigma=1.0)
    y, _, _ = step_once(small, x, key=1)
    m = (np.asarray(y, np.float64)[1] - ref_gossip(w, xf)[1]) / w[1, 0] + xf[0]
    assert abs(np.std(m) - 1.0) < 0.05


def test_no_attacker_is_the_algorithm_itself():
    topo = irregular_graph()
    x = models(10, seed=3)
    for name in ("gossip", "clipped_gossip", "trimmed_mean", "median"):
        plain, _, plain_info = step_once(algorithms.make(name, topo), x)
        wrapped, state, info = step_once(algorithms.byzantine(name, topo, "signflip", ids=[]), x)
        np.testing.assert_allclose(flat(wrapped), flat(plain), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(info.bits), np.asarray(plain_info.bits))
        assert bool(np.all(state.honest))


def test_a_wrapper_around_an_algorithm_already_built_equals_one_that_builds_it():
    topo = irregular_graph()
    x = models(10, seed=4)
    for name, options in (("gossip", {"gamma": 0.8}), ("clipped_gossip", {"tau": 0.5})):
        built = algorithms.make(name, topo, **options)
        own = algorithms.byzantine(name, topo, "gaussian", ids=[2], options=options, sigma=3.0)
        reused = algorithms.byzantine(name, topo, "gaussian", ids=[2], options=options, built=built, sigma=3.0)
        a, _, info_a = step_once(own, x)
        b, _, info_b = step_once(reused, x)
        np.testing.assert_array_equal(flat(a), flat(b))
        np.testing.assert_array_equal(np.asarray(info_a.bits), np.asarray(info_b.bits))


def test_time_varying_graph_attacks_the_edges_of_round_t():
    topo = T.schedule([T.ring(8), T.hypercube(8)])
    x = models(8, seed=4)
    alg = algorithms.byzantine("clipped_gossip", topo, "dissensus", ids=[2], epsilon=2.0)
    state = alg.init(x)
    step = jax.jit(alg.step)
    current = flat(x)
    for t in range(3):
        x, state, _ = step(x, state, jax.random.key(t))
        w = topo.matrix(t)
        current = ref_clipped(w, current, np_messages(w, current, [2], "dissensus", epsilon=2.0))
        np.testing.assert_allclose(flat(x), current, rtol=1e-4, atol=1e-5)


def _consensus_under_attack(name, attack, rounds=100):
    """Distance of the honest nodes to the honest initial mean after ``rounds`` rounds on the 4x4
    torus with 2 attackers, relative to the honest initial spread."""
    topo, ids = T.torus(4, 4), [0, 10]
    x0 = jnp.asarray(np.random.default_rng(0).standard_normal((16, 6)), jnp.float32)
    honest = algorithms.honest_mask(16, ids)
    target = algorithms.honest_mean(x0, honest)
    alg = algorithms.byzantine(name, topo, attack, ids=ids)

    @jax.jit
    def run(x, key):
        def body(r, carry):
            x, s = carry
            x, s, _ = alg.step(x, s, jax.random.fold_in(key, r))
            return x, s

        x, _ = jax.lax.fori_loop(0, rounds, body, (x, alg.init(x)))
        return algorithms.honest_consensus_distance(x, honest, target)

    start = algorithms.honest_consensus_distance(x0, honest, target)
    return float(run(x0, jax.random.key(0)) / start)


def _check_divergence(attacks):
    rel = {(name, a): _consensus_under_attack(name, a) for name in ("gossip", *ROBUST) for a in attacks}
    if "gaussian" in attacks:
        assert rel[("gossip", "gaussian")] > 100, rel  # N(0, 100^2) messages: gossip leaves the honest mean
    if "dissensus" in attacks:
        assert rel[("gossip", "dissensus")] > 0.5, rel  # the honest nodes are kept apart
    for name, bound in ROBUST.items():
        for a in attacks:
            assert rel[(name, a)] < bound, (name, a, rel[(name, a)])


# Measured (100 rounds, relative to the start): clipped_gossip <= 0.045, trimmed_mean <= 0.075, median
# <= 0.24 over the five attacks; gossip 490 (gaussian) and 0.63 (dissensus).
ROBUST = {"clipped_gossip": 0.1, "trimmed_mean": 0.15, "median": 0.35}


def test_gossip_leaves_the_honest_mean_under_attack_robust_rules_stay_close():
    _check_divergence(list(algorithms.ATTACKS))


def test_honest_metrics_match_numpy():
    x = models(10, seed=5)
    honest = algorithms.honest_mask(10, IDS)
    assert honest.tolist() == [i not in IDS for i in range(10)]
    xf = flat(x)
    mean = xf[honest].mean(0)
    np.testing.assert_allclose(
        flat(jax.tree_util.tree_map(lambda m: m[None], algorithms.honest_mean(x, honest)))[0], mean, rtol=1e-6
    )
    want = np.mean(np.sum((xf[honest] - mean) ** 2, axis=1))
    np.testing.assert_allclose(float(algorithms.honest_consensus_distance(x, honest)), want, rtol=1e-5)
    # with every node honest it is jg.consensus_distance
    np.testing.assert_allclose(
        float(algorithms.honest_consensus_distance(x, np.ones(10, bool))), float(jg.consensus_distance(x)), rtol=1e-6
    )


def test_attackers_drawn_from_a_key_are_reproducible():
    a = algorithms.attackers(16, num=3, key=jax.random.key(7))
    b = algorithms.attackers(16, num=3, key=7)
    assert a.tolist() == b.tolist() and len(set(a.tolist())) == 3 and a.tolist() == sorted(a.tolist())
    c = algorithms.attackers(16, num=3, key=8)
    assert c.tolist() != a.tolist() or algorithms.attackers(16, num=3, key=9).tolist() != a.tolist()
    alg = algorithms.byzantine("gossip", T.torus(4, 4), "signflip", num=3, key=7)
    assert np.flatnonzero(~np.asarray(alg.init(jnp.zeros((16, 2))).honest)).tolist() == a.tolist()
    assert algorithms.attackers(16, ids=(5, 0)).tolist() == [0, 5]


def test_bad_input_raises_a_clear_value_error():
    torus = T.torus(4, 4)
    with pytest.raises(
        ValueError, match="unknown attack 'bitflip'; known attacks: gaussian, signflip, alie, ipm, dissensus"
    ):
        algorithms.byzantine("gossip", torus, "bitflip", ids=[0])
    with pytest.raises(ValueError, match="attack 'gaussian' has no option \\['epsilon'\\]; its options: sigma"):
        algorithms.byzantine("gossip", torus, "gaussian", ids=[0], epsilon=1.0)
    with pytest.raises(ValueError, match="attack 'signflip' has no option \\['sigma'\\]; its options: none"):
        algorithms.byzantine("gossip", torus, "signflip", ids=[0], sigma=1.0)
    with pytest.raises(ValueError, match="sigma=-1.0 must be > 0"):
        algorithms.byzantine("gossip", torus, "gaussian", ids=[0], sigma=-1.0)
    with pytest.raises(ValueError, match="num=16 attackers out of range: need 0 <= K < N = 16"):
        algorithms.byzantine("gossip", torus, "gaussian", num=16, key=0)
    with pytest.raises(ValueError, match="16 attackers of N = 16 nodes leave no honest node"):
        algorithms.byzantine("gossip", torus, "gaussian", ids=list(range(16)))
    with pytest.raises(ValueError, match="node 16 is out of range 0..15"):
        algorithms.byzantine("gossip", torus, "gaussian", ids=[16])
    with pytest.raises(ValueError, match="repeats a node"):
        algorithms.byzantine("gossip", torus, "gaussian", ids=[1, 1])
    with pytest.raises(ValueError, match="either as ids"):
        algorithms.byzantine("gossip", torus, "gaussian", ids=[1], num=1, key=0)
    with pytest.raises(ValueError, match="give key="):
        algorithms.byzantine("gossip", torus, "gaussian", num=2)
    with pytest.raises(ValueError, match="give attack option z explicitly"):
        algorithms.byzantine("gossip", torus, "alie", ids=list(range(9)))
    # attackers that cut the honest graph: the bridge node 0 of a dumbbell (cliques 0..4 and 5..9
    # joined by the edge 0 - 5), or two opposite nodes of a ring
    with pytest.raises(
        ValueError, match=r"the attackers \[0\] disconnect the honest nodes of dumbbell\(10\) into 2 parts"
    ):
        algorithms.byzantine("clipped_gossip", T.dumbbell(10), "dissensus", ids=[0])
    with pytest.raises(ValueError, match="disconnect the honest nodes of ring"):
        algorithms.byzantine("gossip", T.ring(8), "signflip", ids=[0, 4])
    algorithms.byzantine("gossip", T.dumbbell(10), "dissensus", ids=[1])  # a clique member is fine
    # algorithms whose messages are not models are refused with the reason
    with pytest.raises(
        ValueError, match="choco cannot be attacked: .*messages are not plain models.*Algorithms that can: gossip"
    ):
        algorithms.byzantine("choco", torus, "signflip", ids=[0])
    with pytest.raises(ValueError, match="stochastic"):
        algorithms.byzantine("gossip", T.random_matching(16), "signflip", ids=[0])
    with pytest.raises(ValueError, match="unknown algorithm"):
        algorithms.byzantine("nope", torus, "signflip", ids=[0])
    with pytest.raises(TypeError, match="does not take"):
        algorithms.byzantine("clipped_gossip", torus, "signflip", ids=[0], options={"gamma": 1.0})
