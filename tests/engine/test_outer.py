"""Decentralized DiLoCo (jaxgossip.engine.outer): both message forms against a NumPy per-node loop on a
quadratic, consensus under gossip (``model``) against drift (``pseudo_gradient``), ``sgd`` at lr 1
bitwise the run without an outer optimizer, push-sum and Choco under the outer step, bad CLI input,
and end-to-end runs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny import TINY_FLAGS, tiny_config

from jaxgossip import algorithms, topology
from jaxgossip.cli import main
from jaxgossip.engine import outer
from jaxgossip.run.resolve import check_train_config
from jaxgossip.run.runner import run_training

N, D, H, ROUNDS, INNER_LR = 4, 3, 3, 5, 0.1
MESSAGES = ("model", "pseudo_gradient")


def _problem(seed=0):
    """Targets ``b`` [N, D] of f_i(x) = 0.5 ||x - b_i||^2 and distinct starting models ``x0`` [N, D]."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(N, D)).astype(np.float32), rng.normal(size=(N, D)).astype(np.float32)


def _jax_diloco(alg, tx, message, b, x0, rounds=ROUNDS):
    """``rounds`` rounds of H gradient steps on the quadratic (gradient at the de-biased model, the
    update added to the params, as the trainer does), then :func:`outer.outer_round`. Returns the
    de-biased models after each round, [rounds, N, D]."""
    x, b = jnp.asarray(x0), jnp.asarray(b)
    comm, state = alg.init(x), outer.outer_init(tx, x)
    key, out = jax.random.key(0), []
    for r in range(rounds):
        y = x
        for _ in range(H):
            y = y - INNER_LR * (alg.debias(y, comm) - b)
        x, comm, state, _ = outer.outer_round(alg, tx, message, state, x, comm, y, comm, jax.random.fold_in(key, r))
        out.append(np.asarray(alg.debias(x, comm)))
    return np.stack(out)


def _numpy_diloco(w, b, x0, lr, momentum, nesterov, message, rounds=ROUNDS):
    """The per-node reference: mix the inner results (``model``) or the pseudo-gradients, then each
    node's outer step; returns the models after each round, [rounds, N, D]."""
    x, m = np.array(x0, np.float64), np.zeros_like(x0, np.float64)
    mix = lambda v: np.stack([sum(w[i, j] * v[j] for j in range(N)) for i in range(N)])  # noqa: E731
    out = []
    for _ in range(rounds):
        y = np.zeros_like(x)
        for i in range(N):  # per-node inner loop
            y[i] = x[i]
            for _ in range(H):
                y[i] = y[i] - INNER_LR * (y[i] - b[i])
        delta = x - mix(y) if message == "model" else mix(x - y)
        for i in range(N):
            if nesterov:
                m[i] = momentum * m[i] + delta[i]
                x[i] = x[i] - lr * (delta[i] + momentum * m[i])
            else:
                x[i] = x[i] - lr * delta[i]
        out.append(x.copy())
    return np.stack(out)


def _consensus(x):
    """Mean squared distance to the node average, per round: x [R, N, D] -> [R]."""
    return np.mean(np.sum((x - x.mean(1, keepdims=True)) ** 2, -1), -1)


@pytest.mark.parametrize("message", MESSAGES)
@pytest.mark.parametrize("alg_name", ["gossip", "allreduce"])
@pytest.mark.parametrize("name", ["nesterov", "sgd"])
def test_outer_update_matches_numpy_on_a_quadratic(message, alg_name, name):
    b, x0 = _problem()
    ring = topology.make("ring", N)
    w = np.asarray(ring.matrix(0), np.float64) if alg_name == "gossip" else np.full((N, N), 1.0 / N)
    tx = outer.make_outer_optimizer(name, 0.7, 0.9)
    got = _jax_diloco(algorithms.make(alg_name, ring), tx, message, b, x0)
    want = _numpy_diloco(w, b, x0, 0.7, 0.9, name == "nesterov", message)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_allreduce_gives_both_forms_the_same_iterates_from_equal_models():
    """x_r - mean(y_r) either way: the forms differ only in float rounding."""
    b, x0 = _problem(1)
    x0 = np.broadcast_to(x0[0], (N, D))
    alg = algorithms.make("allreduce", topology.make("ring", N))
    tx = outer.make_outer_optimizer("nesterov", 0.7, 0.9)
    model, pseudo = (_jax_diloco(alg, tx, message, b, x0, rounds=20) for message in MESSAGES)
    np.testing.assert_allclose(model, pseudo, rtol=1e-5, atol=1e-6)
    assert np.all(_consensus(model) == 0.0)  # every node applies the same step to the same average


def test_model_form_keeps_consensus_where_pseudo_gradients_drift():
    """Ring of 4 (W has eigenvalue -1/3), nesterov 0.7/0.9. From distinct models and a shared
    target the ``model`` form reaches consensus, while with mixed pseudo-gradients the W < 0 mode
    steps uphill and the disagreement grows; with heterogeneous targets from one start the
    ``model`` form's consensus distance settles while the other keeps growing."""
    b, x0 = _problem(2)
    alg = algorithms.make("gossip", topology.make("ring", N))
    tx = outer.make_outer_optimizer("nesterov", 0.7, 0.9)
    shared = np.broadcast_to(b[0], (N, D))
    model, pseudo = (_consensus(_jax_diloco(alg, tx, m, shared, x0, rounds=60)) for m in MESSAGES)
    assert model[-1] < 1e-6 * model[0]
    assert pseudo[-1] > 100 * pseudo[0]
    start = np.broadcast_to(x0[0], (N, D))
    model, pseudo = (_consensus(_jax_diloco(alg, tx, m, b, start, rounds=60)) for m in MESSAGES)
    assert np.max(model) < 2.0 and abs(model[-1] - model[-10]) < 1e-3 * model[-1]  # bounded, settled
    assert pseudo[-1] > 100 * model[-1] and pseudo[-1] > 10 * pseudo[30]


def _leaves(tree):
    """The leaves of ``tree`` as NumPy arrays (PRNG keys as their key data)."""
    keys = lambda a: jax.random.key_data(a) if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key) else a  # noqa: E731
    return [np.asarray(keys(a)) for a in jax.tree_util.tree_leaves(tree)]


def _y(alg, comm, x, b):
    """H inner steps of the quadratic from ``x``."""
    y = x
    for _ in range(H):
        y = y - INNER_LR * (alg.debias(y, comm) - b)
    return y


ALGORITHMS = [
    ("gossip", "ring", {}),
    ("push_sum", "random_directed:0.5", {}),
    ("choco", "ring", {"compressor": "top_k", "compressor_options": {"fraction": 0.34}, "gamma": 0.5}),
    ("power_gossip", "ring", {}),
]


@pytest.mark.parametrize("alg_name, graph, options", ALGORITHMS)
def test_model_form_sgd_lr_one_is_bitwise_the_round_without_outer_optimizer(alg_name, graph, options):
    """``x_{r+1} = z + (Delta - outer_opt(Delta))`` with outer_opt(Delta) = Delta adds an exact 0,
    so every round's models and algorithm state are bitwise those of the plain round."""
    b, x0 = (jnp.asarray(a) for a in _problem(3))
    alg = algorithms.make(alg_name, topology.make(graph, N), **options)
    tx = outer.make_outer_optimizer("sgd", 1.0)
    x, comm, state = x0, alg.init(x0), outer.outer_init(tx, x0)
    plain, plain_comm = x0, alg.init(x0)
    for r in range(4):
        key = jax.random.key(r)
        x, comm, state, _ = outer.outer_round(alg, tx, "model", state, x, comm, _y(alg, comm, x, b), comm, key)
        plain, plain_comm, _ = alg.step(_y(alg, plain_comm, plain, b), plain_comm, key)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(plain))
        for a, c in zip(_leaves(comm), _leaves(plain_comm), strict=True):
            np.testing.assert_array_equal(a, c)


def test_push_sum_and_choco_equal_gossip_only_where_they_are_gossip():
    """On a ring push-sum's weights stay 1 and Choco with the identity compressor and gamma 1 is
    ``x <- W x``: the three give the same iterates (to float rounding), which is why their losses
    agree with the tiny run's defaults. Compression, or a graph that is not doubly stochastic,
    makes them differ."""
    b, x0 = _problem(4)
    ring = topology.make("ring", N)
    tx = outer.make_outer_optimizer("nesterov", 0.7, 0.9)

    def run(name, graph=ring, **options):
        return _jax_diloco(algorithms.make(name, graph, **options), tx, "model", b, x0, rounds=10)

    gossip = run("gossip")
    np.testing.assert_allclose(run("push_sum"), gossip, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run("choco"), gossip, rtol=1e-5, atol=1e-6)
    top_k = run("choco", compressor="top_k", compressor_options={"fraction": 0.34}, gamma=0.5)
    directed = run("push_sum", topology.make("random_directed:0.5", N))
    for other in (top_k, directed):
        assert np.max(np.abs(other - gossip)) > 1e-2
    assert np.max(np.abs(top_k - directed)) > 1e-2


def test_push_sum_model_form_reaches_consensus_on_a_directed_graph():
    """Push-sum's weights drift from 1 on this column-stochastic W; the pseudo-gradient is taken
    between de-biased models, so a consensus at the optimum is a fixed point, and from distinct
    models with a shared target the de-biased models meet at it."""
    alg = algorithms.make("push_sum", topology.make("random_directed:0.5", N))
    tx = outer.make_outer_optimizer("nesterov", 0.7, 0.9)
    b, x0 = _problem(5)
    shared = np.broadcast_to(b[0], (N, D))
    at_optimum = _jax_diloco(alg, tx, "model", shared, shared, rounds=10)
    np.testing.assert_allclose(at_optimum, np.broadcast_to(shared, at_optimum.shape), atol=1e-6)
    moving = _jax_diloco(alg, tx, "model", shared, x0, rounds=80)
    np.testing.assert_allclose(moving[-1], shared, atol=1e-4)


@pytest.mark.parametrize("message", MESSAGES)
def test_offline_nodes_keep_their_model_and_outer_state(message):
    b, x0 = (jnp.asarray(a) for a in _problem(6))
    alg = algorithms.make("allreduce", topology.make("ring", N))
    tx = outer.make_outer_optimizer("nesterov", 0.7, 0.9)
    state = outer.outer_init(tx, x0)
    state = state._replace(opt_state=jax.tree_util.tree_map(jnp.ones_like, state.opt_state))  # some momentum
    online = jnp.asarray([True, False, True, True])
    comm = alg.init(x0)
    y = jnp.where(online[:, None], _y(alg, comm, x0, b), x0)
    new = outer.outer_round(alg, tx, message, state, x0, comm, y, comm, jax.random.key(0), online)
    z, _, _ = alg.step(y if message == "model" else x0 - y, comm, jax.random.key(0))
    stay = z[1] if message == "model" else x0[1]
    np.testing.assert_array_equal(np.asarray(new.params[1]), np.asarray(stay))
    for a, c in zip(jax.tree_util.tree_leaves(new.outer), jax.tree_util.tree_leaves(state), strict=True):
        np.testing.assert_array_equal(np.asarray(a[1]), np.asarray(c[1]))
        assert not np.array_equal(np.asarray(a[0]), np.asarray(c[0]))


def test_make_outer_optimizer_rejects_bad_values():
    assert outer.make_outer_optimizer("none", 0.7) is None
    with pytest.raises(ValueError, match="'adam'"):
        outer.make_outer_optimizer("adam", 0.7)
    with pytest.raises(ValueError, match="outer_lr"):
        outer.make_outer_optimizer("sgd", 0.0)
    with pytest.raises(ValueError, match="outer_momentum"):
        outer.make_outer_optimizer("nesterov", 0.7, 1.0)
    with pytest.raises(ValueError, match="outer_message='delta'"):
        outer.check_outer_message("delta")


def _run(tmp_path, name, **changes):
    return run_training(tiny_config(**changes), str(tmp_path / name), progress=False, log=lambda s: None)


def test_model_sgd_lr_one_is_bitwise_the_run_without_outer_optimizer(tmp_path):
    """``sgd`` at lr 1 in the ``model`` form adds an exact 0 to every round of the run without an
    outer optimizer (module docstring of jaxgossip.engine.outer): bitwise equal states and losses."""
    default = _run(tmp_path, "a", num_rounds=10, local_steps=2, outer_lr=0.3)  # ignored: outer_optimizer=none
    sgd = _run(tmp_path, "b", num_rounds=10, local_steps=2, outer_optimizer="sgd", outer_lr=1.0)
    assert default.state.outer is None and sgd.state.outer is not None
    for a, b in zip(_leaves(default.state), _leaves(sgd.state._replace(outer=None)), strict=True):
        np.testing.assert_array_equal(a, b)
    assert [r["train_loss"] for r in default.rows] == [r["train_loss"] for r in sgd.rows]


@pytest.mark.slow
def test_nesterov_end_to_end_learns_and_resumes(tmp_path):
    config = dict(algorithm="allreduce", outer_optimizer="nesterov", outer_lr=0.7, outer_momentum=0.9, local_steps=2)
    full = _run(tmp_path, "a", **config)
    assert full.state.outer is not None
    losses = [r["train_loss"] for r in full.rows]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    plain = _run(tmp_path, "c", algorithm="allreduce", local_steps=2)
    assert not np.array_equal(_leaves(full.state.params)[0], _leaves(plain.state.params)[0])
    part = run_training(
        tiny_config(**config), str(tmp_path / "b"), progress=False, stop_after_chunks=2, log=lambda s: None
    )
    assert not part.finished
    rest = _run(tmp_path, "b", **config)
    for a, b in zip(_leaves(full.state), _leaves(rest.state), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_gossip_end_to_end_model_form_keeps_consensus(tmp_path):
    config = dict(outer_optimizer="nesterov", local_steps=2)
    model = _run(tmp_path, "a", **config)
    pseudo = _run(tmp_path, "b", outer_message="pseudo_gradient", **config)
    consensus = [r["consensus"] for r in model.rows]
    assert np.all(np.isfinite([r["train_loss"] for r in model.rows]))
    assert max(consensus) < 10 * consensus[0]
    assert pseudo.rows[-1]["consensus"] > 10 * consensus[-1]


@pytest.mark.parametrize(
    "flag, words",
    [
        ("--outer_optimizer=unknown", ["outer_optimizer", "'unknown'"]),
        ("--outer_message=delta", ["outer_message", "'delta'", "pseudo_gradient"]),
        ("--outer_lr=0", ["outer_lr=0"]),
        ("--outer_momentum=1.5", ["outer_momentum=1.5"]),
    ],
)
def test_cli_bad_outer_options_exit_2(flag, words, tmp_path, capsys):
    code = main(["train", *TINY_FLAGS, flag, f"--out={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2
    for word in words:
        assert word in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "flags, word",
    [
        (["--outer_optimizer=nesterov", "--ordering=same_iterate"], "ordering"),
        (
            [
                "--outer_optimizer=nesterov",
                "--outer_message=pseudo_gradient",
                "--algorithm=push_sum",
                "--topology=random_directed:0.5",
            ],
            "--outer_message=model",
        ),
    ],
)
def test_cli_refused_outer_combinations_exit_2(flags, word, tmp_path, capsys):
    code = main(["train", *TINY_FLAGS, *flags, f"--out={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2
    assert word in err and "Traceback" not in err


def test_outer_allowed_values_and_local_steps_one():
    config = tiny_config(outer_optimizer="sgd", local_steps=1, outer_message="pseudo_gradient", algorithm="push_sum")
    assert check_train_config(config).local_steps == 1  # a doubly stochastic ring: push-sum's weights stay 1
    from jaxgossip.run.config import allowed_values

    values = allowed_values()
    assert values["outer_optimizer"] == list(outer.OUTER_OPTIMIZERS)
    assert values["outer_message"] == list(outer.OUTER_MESSAGES)
