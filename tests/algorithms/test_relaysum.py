"""RelaySum on trees: relaysgd (relayed models) and relaysum_grad (relayed updates).

Checked against (1) a NumPy port of the rules of epfml/relaysgd's reference simulator
(``paper-figures/algorithms.py``, ``relaysum_model`` and ``relaysum_grad``: dictionaries of
messages per directed edge, sums over "the other neighbours", written here from the rule), on a
heterogeneous quadratic (each node its own centre and curvature), and (2) the unrolled form, a
uniform average of models or updates delayed by the tree distance, written from the history.
Then RelaySum's defining property (exact averages after D rounds, D the diameter), the mean
behaviour, bits, graph refusals and the command line.
"""

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np
import optax
import pytest
from _reference import node_normal, to_jax

import jaxgossip as jg
from jaxgossip.topology.constructors import from_edges

N = 8
DIM = 3
LR = 0.1
STEPS = 40


# ---------------------------------------------------------------- references


def epfml_neighbors(kind, n):
    """Neighbour lists of epfml/relaysgd's ChainTopology and BinaryTreeTopology (node 0 hangs
    under 1, node i >= 2 under i // 2)."""
    if kind == "chain":
        return [[j for j in (i - 1, i + 1) if 0 <= j < n] for i in range(n)]
    out = []
    for i in range(n):
        if i == 0:
            out.append([1])
        else:
            out.append([i // 2] + [c for c in (2 * i, 2 * i + 1) if c < n])
    return out


def topology_of(kind, n=N):
    return jg.topology.chain(n) if kind == "chain" else jg.topology.binary_tree(n)


def tree_distances(kind, n=N):
    g = nx.Graph()
    g.add_nodes_from(range(n))
    for i, nbrs in enumerate(epfml_neighbors(kind, n)):
        g.add_edges_from((i, j) for j in nbrs)
    d = dict(nx.all_pairs_shortest_path_length(g))
    return np.array([[d[i][j] for j in range(n)] for i in range(n)])


def quadratic(n=N, dim=DIM, seed=0):
    """f_i(x) = (a_i / 2) ||x - c_i||^2: its own centre c_i and curvature a_i per node."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n, dim)) * 3.0
    curv = (np.arange(n) + 1.0) / n
    return centres, curv


def ref_relaysum_model(neighbors, centres, curv, x0, lr, steps):
    """relaysum_model: x <- x - lr g; m_{w->v} = x_w + sum_{u in N(w), u != v} m_{u->w} (last
    round's), c likewise with 1; x_w <- (x_w + sum_u m_{u->w} + (N - 1 - sum_u c_{u->w}) x0) / N."""
    n = len(neighbors)
    x = np.array(x0, np.float64)
    init = x[0].copy()
    messages, counts = {}, {}
    out = [x.copy()]
    for _ in range(steps):
        x = x - lr * curv[:, None] * (x - centres)
        new_m, new_c = {}, {}
        for w in range(n):
            for v in neighbors[w]:
                new_m[w, v] = x[w] + sum(
                    (messages.get((u, w), 0.0) for u in neighbors[w] if u != v), np.zeros_like(x[w])
                )
                new_c[w, v] = 1 + sum(counts.get((u, w), 0) for u in neighbors[w] if u != v)
        nxt = np.empty_like(x)
        for w in range(n):
            heard = 1 + sum(new_c[u, w] for u in neighbors[w])
            nxt[w] = (x[w] + sum(new_m[u, w] for u in neighbors[w]) + init * (n - heard)) / n
        x, messages, counts = nxt, new_m, new_c
        out.append(x.copy())
    return np.stack(out)


def ref_relaysum_grad(neighbors, centres, curv, x0, lr, steps):
    """relaysum_grad: g at x; m_{w->v} = g_w + sum_{u != v} m_{u->w} (last round's);
    x_w <- x_w - lr (g_w + sum_u m_{u->w}) / N with this round's messages."""
    n = len(neighbors)
    x = np.array(x0, np.float64)
    messages = {}
    out = [x.copy()]
    for _ in range(steps):
        g = curv[:, None] * (x - centres)
        new_m = {}
        for w in range(n):
            for v in neighbors[w]:
                new_m[w, v] = g[w] + sum(
                    (messages.get((u, w), 0.0) for u in neighbors[w] if u != v), np.zeros_like(g[w])
                )
        nxt = x.copy()
        for w in range(n):
            nxt[w] -= lr * (g[w] + sum(new_m[u, w] for u in neighbors[w])) / n
        x, messages = nxt, new_m
        out.append(x.copy())
    return np.stack(out)


def run_ours(name, kind, centres, curv, x0, lr, steps):
    """Our algorithm with the local SGD step taken by hand (atc): every iterate [S + 1, N, D]."""
    alg = jg.algorithms.make(name, topology_of(kind, len(centres)))
    c, a = jnp.asarray(centres, jnp.float32), jnp.asarray(curv, jnp.float32)[:, None]

    @jax.jit
    def round_fn(x, state):
        half = {"x": x["x"] - lr * a * (x["x"] - c)}
        x, state, _ = alg.step(half, state, jax.random.key(0))
        return x, state

    x = {"x": jnp.asarray(x0, jnp.float32)}
    state = alg.init(x)
    out = [np.asarray(x["x"])]
    for _ in range(steps):
        x, state = round_fn(x, state)
        out.append(np.asarray(x["x"]))
    return np.stack(out)


# ---------------------------------------------------------------- equal to the reference simulator


@pytest.mark.parametrize("kind", ["chain", "binary_tree"])
@pytest.mark.parametrize("name, reference", [("relaysgd", ref_relaysum_model), ("relaysum_grad", ref_relaysum_grad)])
def test_iterates_equal_the_epfml_reference_on_a_heterogeneous_quadratic(name, reference, kind):
    centres, curv = quadratic()
    x0 = np.ones((N, DIM))  # the simulator's common start
    want = reference(epfml_neighbors(kind, N), centres, curv, x0, LR, STEPS)
    got = run_ours(name, kind, centres, curv, x0, LR, STEPS)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    # the run is not trivial: the nodes disagree early and move far from the start
    assert np.abs(want - want.mean(1, keepdims=True)).max() > 0.05 and np.abs(want[-1] - x0).max() > 0.5


@pytest.mark.parametrize("name", ["relaysgd", "relaysum_grad"])
def test_run_optimization_is_the_same_method(name):
    """``jg.run_optimization`` with SGD (atc) runs the iterates of the reference simulator."""
    kind = "binary_tree"
    centres, curv = quadratic(seed=1)
    x0 = np.ones((N, DIM))
    c, a = jnp.asarray(centres, jnp.float32), jnp.asarray(curv, jnp.float32)

    def loss_fn(params, i, key):
        del key
        return 0.5 * a[i] * jnp.sum((params["x"] - c[i]) ** 2)

    alg = jg.algorithms.make(name, topology_of(kind))
    result = jg.run_optimization(
        alg, {"x": jnp.asarray(x0, jnp.float32)}, loss_fn, optax.sgd(LR), STEPS, jax.random.key(0)
    )
    reference = ref_relaysum_model if name == "relaysgd" else ref_relaysum_grad
    want = reference(epfml_neighbors(kind, N), centres, curv, x0, LR, STEPS)[-1]
    np.testing.assert_allclose(np.asarray(result.x["x"]), want, rtol=2e-6, atol=2e-6)
    with pytest.raises(ValueError, match="same_iterate"):
        jg.run_optimization(
            alg,
            {"x": jnp.asarray(x0, jnp.float32)},
            loss_fn,
            optax.sgd(LR),
            2,
            jax.random.key(0),
            ordering="same_iterate",
        )


# ---------------------------------------------------------------- the unrolled form: delayed uniform averages


def _random_rounds(kind, steps, seed, same_start):
    rng = np.random.default_rng(seed)
    x0 = np.broadcast_to(rng.standard_normal(DIM), (N, DIM)).copy() if same_start else rng.standard_normal((N, DIM))
    deltas = rng.standard_normal((steps, N, DIM)) * 0.5
    return x0, deltas


def _drive(name, kind, x0, deltas):
    """Feeds params = x + Delta^t to step each round; returns the models [S + 1, N, D] and the states."""
    alg = jg.algorithms.make(name, topology_of(kind))
    step = jax.jit(alg.step)
    x = {"x": jnp.asarray(x0, jnp.float32)}
    state = alg.init(x)
    out, states = [np.asarray(x["x"])], [state]
    for delta in deltas:
        x, state, _ = step({"x": x["x"] + jnp.asarray(delta, jnp.float32)}, state, jax.random.key(0))
        out.append(np.asarray(x["x"]))
        states.append(state)
    return np.stack(out), states


@pytest.mark.parametrize("same_start", [True, False])
@pytest.mark.parametrize("kind", ["chain", "binary_tree"])
def test_relaysgd_is_a_uniform_average_of_models_delayed_by_tree_distance(kind, same_start):
    """x_i^{t+1} = (1/N) sum_k y_k^{t + 1 - max(1, d_ik)}, y = x + Delta the half-step models,
    and node i's own initial model for every y from before round 0."""
    steps = 12
    x0, deltas = _random_rounds(kind, steps, 3, same_start)
    got, _ = _drive("relaysgd", kind, x0, deltas)
    delay = np.maximum(1, tree_distances(kind))
    ys = []
    x = x0.astype(np.float64)
    for t in range(steps):
        ys.append(x + deltas[t])
        new = np.empty_like(x)
        for i in range(N):
            terms = [ys[t + 1 - delay[i, k]][k] if t + 1 - delay[i, k] >= 0 else x0[i] for k in range(N)]
            new[i] = np.mean(terms, axis=0)
        x = new
        np.testing.assert_allclose(got[t + 1], x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("same_start", [True, False])
@pytest.mark.parametrize("kind", ["chain", "binary_tree"])
def test_relaysum_grad_adds_every_update_once_delayed_by_tree_distance(kind, same_start):
    """x_i^{t+1} = (1/N)(sum of heard x_k^0 + (N - heard) x_i^0) + (1/N) sum_k sum_{s <= t + 1 -
    max(1, d_ik)} Delta_k^s; node k is heard at i from round d_ik - 1 on."""
    steps = 12
    x0, deltas = _random_rounds(kind, steps, 4, same_start)
    got, _ = _drive("relaysum_grad", kind, x0, deltas)
    dist = tree_distances(kind)
    delay = np.maximum(1, dist)
    for t in range(steps):
        want = np.empty((N, DIM))
        for i in range(N):
            heard = dist[i] <= t + 1
            start = (x0[heard].sum(0) + (N - heard.sum()) * x0[i]) / N
            moved = sum(deltas[: max(0, t + 2 - delay[i, k]), k].sum(0) for k in range(N)) / N
            want[i] = start + moved
        np.testing.assert_allclose(got[t + 1], want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- exact averages after D rounds


@pytest.mark.parametrize("kind", ["chain", "binary_tree"])
def test_relaysum_grad_reaches_the_exact_average_in_D_rounds_without_gradients(kind):
    topo = topology_of(kind)
    diameter = int(tree_distances(kind).max())
    x0 = to_jax(node_normal(N, {"w": (4, 3), "b": (5,)}, seed=7))
    alg = jg.algorithms.make("relaysum_grad", topo)
    result = jg.run_consensus(alg, x0, diameter + 2, jax.random.key(0))
    error = np.asarray(result.error)
    assert error[diameter - 1] > 1e-3 * error[0]  # not one round early: the farthest pair is D apart
    assert np.all(error[diameter:] < 1e-10 * error[0]), error
    mean = jg.node_mean(x0)
    for leaf, m in zip(jax.tree_util.tree_leaves(result.x), jax.tree_util.tree_leaves(mean)):
        np.testing.assert_allclose(leaf, np.broadcast_to(m, leaf.shape), atol=1e-5)


@pytest.mark.parametrize("kind", ["chain", "binary_tree"])
def test_relaysgd_relays_the_exact_average_of_held_models_in_D_rounds(kind):
    """The relay itself: with every node holding its model fixed (different models), the average a
    node forms is the exact mean after D rounds and not before; every count is then N."""
    topo = topology_of(kind)
    diameter = int(tree_distances(kind).max())
    x = {"x": jnp.asarray(np.random.default_rng(2).standard_normal((N, DIM)), jnp.float32)}
    alg = jg.algorithms.make("relaysgd", topo)
    state = alg.init(x)
    mean = np.asarray(x["x"]).mean(0)
    for t in range(diameter + 1):
        out, state, _ = alg.step(x, state, jax.random.key(0))
        heard = 1 + np.asarray(jax.ops.segment_sum(state.counts, _dst(topo), num_segments=N))
        exact = np.abs(np.asarray(out["x"]) - mean).max() < 1e-5
        assert exact == (t >= diameter - 1), (t, exact)
        assert np.all(heard == N) == (t >= diameter - 1)


def _dst(topo):
    from jaxgossip.algorithms import tree_tables

    return tree_tables(topo, "test").dst


# ---------------------------------------------------------------- the mean behaviour


@pytest.mark.parametrize("kind", ["chain", "binary_tree"])
def test_relaysgd_delay_weighted_sum_moves_by_the_updates_and_damps_the_step(kind):
    """With a common start, V^t = (1/N) sum_k sum_{d>=1} #{i: max(1, d_ik) >= d} y_k^{t+1-d} (y the
    half-step models, x^0 before round 0) moves by exactly sum_k Delta_k^t each round; once the
    updates stop the nodes agree on x^0 + mean(sum Delta) / dbar, dbar = mean_ik max(1, d_ik), the
    learning-rate correction of RelaySum/Model (epfml/relaysgd, appendix figure 6)."""
    burst, quiet = 4, 400
    x0, deltas = _random_rounds(kind, burst, 5, same_start=True)
    deltas = np.concatenate([deltas, np.zeros((quiet, N, DIM))])
    got, _ = _drive("relaysgd", kind, x0, deltas)
    delay = np.maximum(1, tree_distances(kind))
    longest = int(delay.max())
    tail = np.array([[np.sum(delay[:, k] >= d) for d in range(1, longest + 1)] for k in range(N)])  # [N, D]
    ys = got[:-1] + deltas  # y^t = x^t + Delta^t, [S, N, DIM]

    def v(t):
        hist = [ys[t + 1 - d] if t + 1 - d >= 0 else x0 for d in range(1, longest + 1)]  # [D][N, DIM]
        return sum(tail[:, d, None] * hist[d] for d in range(longest)).sum(0) / N

    for t in range(burst + 3):
        np.testing.assert_allclose(v(t) - (v(t - 1) if t else x0[0] * delay.sum() / N), deltas[t].sum(0), atol=2e-5)
    dbar = delay.mean()
    limit = x0[0] + deltas.sum(0).mean(0) / dbar
    np.testing.assert_allclose(got[-1], np.broadcast_to(limit, (N, DIM)), atol=1e-4)
    assert dbar > 1.5 and np.abs(limit - (x0[0] + deltas.sum(0).mean(0))).max() > 0.05  # damped, measurably


@pytest.mark.parametrize("kind", ["chain", "binary_tree"])
def test_relaysum_grad_moves_like_allreduce_sgd_after_D_rounds(kind):
    """Constant updates per node: from round D on every model moves by exactly mean(Delta) per
    round, the all-reduce step; once updates stop all models sit at x^0 + mean(sum Delta)."""
    diameter = int(tree_distances(kind).max())
    rng = np.random.default_rng(6)
    x0 = np.broadcast_to(rng.standard_normal(DIM), (N, DIM)).copy()
    step = rng.standard_normal((N, DIM))
    deltas = np.concatenate([np.broadcast_to(step, (10, N, DIM)), np.zeros((diameter, N, DIM))])
    got, _ = _drive("relaysum_grad", kind, x0, deltas)
    moves = np.diff(got, axis=0)  # [S, N, DIM]
    np.testing.assert_allclose(moves[diameter:10], np.broadcast_to(step.mean(0), (10 - diameter, N, DIM)), atol=1e-5)
    assert np.abs(moves[0] - step.mean(0)).max() > 0.05  # before D rounds the far updates are missing
    np.testing.assert_allclose(got[-1], np.broadcast_to(x0[0] + 10 * step.mean(0), (N, DIM)), atol=1e-4)


def test_relaysgd_from_different_models_agrees_but_not_on_their_mean():
    """What the docstring says: a consensus, not the mean of different initial models."""
    x0 = to_jax(node_normal(N, {"w": (4, 3)}, seed=3))
    result = jg.run_consensus(jg.algorithms.make("relaysgd", jg.topology.binary_tree(N)), x0, 300, jax.random.key(0))
    assert float(jg.consensus_distance(result.x)) < 1e-8 * float(jg.consensus_distance(x0))
    offset = np.abs(np.asarray(result.x["w"][0]) - np.asarray(jg.node_mean(x0)["w"])).max()
    assert offset > 1e-2


# ---------------------------------------------------------------- bits, state, graphs, command line


@pytest.mark.parametrize("name", ["relaysgd", "relaysum_grad"])
def test_bits_are_one_model_and_one_count_per_tree_neighbour(name):
    topo = jg.topology.binary_tree(N)
    x = to_jax(node_normal(N, {"w": (4, 3), "b": (5,)}))
    alg = jg.algorithms.make(name, topo)
    state = alg.init(x)
    assert jax.tree_util.tree_leaves(state.messages)[0].shape[0] == 2 * (N - 1) and state.counts.shape == (2 * (N - 1),)
    _, _, info = alg.step(x, state, jax.random.key(0))
    degree = np.array([len(v) for v in epfml_neighbors("binary_tree", N)])
    np.testing.assert_array_equal(np.asarray(info.bits), degree * (17 * 32 + 32))


@pytest.mark.parametrize("name", ["relaysgd", "relaysum_grad"])
def test_non_trees_are_refused_naming_the_cycle_or_the_disconnection(name):
    with pytest.raises(ValueError, match=r"ring\(8\) has 8 links and the cycle 0-1-2-3-4-5-6-7-0"):
        jg.algorithms.make(name, jg.topology.ring(8))
    with pytest.raises(ValueError, match=r"the cycle 0-1-5-4-0|the cycle"):
        jg.algorithms.make(name, jg.topology.torus(4, 4))
    forest = from_edges("forest", 5, [(np.array([0, 1, 3, 4]), np.array([1, 0, 4, 3]), np.full(4, 0.5))])
    with pytest.raises(ValueError, match=r"not connected: it falls into 3 components, \{0, 1\}; \{2\}; \{3, 4\}"):
        jg.algorithms.make(name, forest)
    with pytest.raises(ValueError, match="directed: the link 0 -> 1 has no reverse"):
        jg.algorithms.make(name, jg.topology.directed_ring(8))
    with pytest.raises(ValueError, match="static topology"):
        jg.algorithms.make(name, jg.topology.schedule([jg.topology.chain(8), jg.topology.binary_tree(8)]))
    with pytest.raises(ValueError, match="stochastic graph"):
        jg.algorithms.make(name, jg.topology.with_failures(jg.topology.chain(8), 0.1))
    # every tree the topology package builds is accepted, whatever its weights
    for topo in (jg.topology.chain(2), jg.topology.star(6), jg.topology.make("spanning_tree:torus", 16)):
        jg.algorithms.make(name, topo)


def test_command_line_refuses_a_non_tree_and_trains_on_a_chain(tmp_path, capsys):
    from tiny import TINY_FLAGS

    from jaxgossip.cli import main

    code = main(
        [
            "train",
            "--out",
            str(tmp_path / "ring"),
            "--no-progress",
            *TINY_FLAGS,
            "--algorithm=relaysgd",
            "--topology=ring",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "cycle 0-1-2-3-0" in err and "Traceback" not in err
    assert not (tmp_path / "ring" / "metrics.json").exists()
    out = tmp_path / "chain"  # relaysum_grad trains through the same runner in the resume test below
    code = main(["train", "--out", str(out), "--no-progress", *TINY_FLAGS, "--algorithm=relaysgd", "--topology=chain"])
    assert code == 0, capsys.readouterr().err
    assert (out / "metrics.json").exists()


# In the default suite the end-to-end matrix interrupts and resumes both through the command line
# (tests/project/test_e2e_matrix.py::test_every_algorithm_trains_checkpoints_and_resumes_bitwise).
@pytest.mark.slow
@pytest.mark.parametrize("name", ["relaysgd", "relaysum_grad"])
def test_resumed_run_equals_uninterrupted(name, tmp_path):
    """The edge-axis state [E, ...] goes through checkpoints: interrupted + resumed == one run."""
    from tiny import tiny_config

    from jaxgossip.run.runner import run_training

    config = tiny_config(algorithm=name, topology="binary_tree")
    full = run_training(config, str(tmp_path / "a"), progress=False, log=lambda s: None)
    part = run_training(config, str(tmp_path / "b"), progress=False, stop_after_chunks=2, log=lambda s: None)
    assert not part.finished
    rest = run_training(config, str(tmp_path / "b"), progress=False, log=lambda s: None)
    assert rest.finished
    for a, b in zip(jax.tree_util.tree_leaves(full.state), jax.tree_util.tree_leaves(rest.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert [r["test_acc"] for r in full.rows] == [r["test_acc"] for r in rest.rows]
