"""Decentralized DiLoCo (jaxgossip.outer): the outer update against a NumPy per-node loop on a
quadratic, ``outer_optimizer=none`` bitwise equal to the default run, bad CLI input, and a tiny
end-to-end run with Nesterov."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny import TINY_FLAGS, tiny_config

from jaxgossip import algorithms, outer, topology
from jaxgossip.cli import main
from jaxgossip.run.runner import run_training

N, D, H, ROUNDS, INNER_LR = 4, 3, 3, 5, 0.1


def _jax_diloco(alg_name, tx, b, x0):
    """R rounds of H gradient steps on f_i(x) = 0.5 ||x - b_i||^2, then the outer step."""
    alg = algorithms.make(alg_name, topology.make("ring", N))
    x, comm, state = x0, alg.init(x0), outer.outer_init(tx, x0)
    key = jax.random.key(0)
    for _ in range(ROUNDS):
        y = x
        for _ in range(H):
            y = y - INNER_LR * (y - b)
        mixed, comm, _ = alg.step(outer.pseudo_gradient(x, y), comm, key)
        x, state = outer.outer_step(tx, state, x, mixed)
    return np.asarray(x)


def _numpy_diloco(w, b, x0, lr, momentum, nesterov):
    x, m = np.array(x0, np.float64), np.zeros_like(x0, np.float64)
    for _ in range(ROUNDS):
        delta = np.zeros_like(x)
        for i in range(N):  # per-node inner loop
            y = x[i].copy()
            for _ in range(H):
                y = y - INNER_LR * (y - b[i])
            delta[i] = x[i] - y
        mixed = np.stack([sum(w[i, j] * delta[j] for j in range(N)) for i in range(N)])
        for i in range(N):
            if nesterov:
                m[i] = momentum * m[i] + mixed[i]
                x[i] = x[i] - lr * (mixed[i] + momentum * m[i])
            else:
                x[i] = x[i] - lr * mixed[i]
    return x


@pytest.mark.parametrize("alg_name", ["gossip", "allreduce"])
@pytest.mark.parametrize("name", ["nesterov", "sgd"])
def test_outer_update_matches_numpy_on_a_quadratic(alg_name, name):
    rng = np.random.default_rng(0)
    b = rng.normal(size=(N, D)).astype(np.float32)
    x0 = rng.normal(size=(N, D)).astype(np.float32)
    if alg_name == "gossip":
        w = np.asarray(topology.make("ring", N).matrix(0), np.float64)
    else:
        w = np.full((N, N), 1.0 / N)
    tx = outer.make_outer_optimizer(name, 0.7, 0.9)
    got = _jax_diloco(alg_name, tx, jnp.asarray(b), jnp.asarray(x0))
    want = _numpy_diloco(w, b, x0, 0.7, 0.9, nesterov=name == "nesterov")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_outer_sgd_lr_one_with_allreduce_is_model_averaging():
    """sgd with lr 1 and the exact average: x_{r+1} = x_r - mean(x_r - y) = mean(y) from equal x_r."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(np.broadcast_to(rng.normal(size=D), (N, D)).astype(np.float32))
    y = jnp.asarray(rng.normal(size=(N, D)).astype(np.float32))
    tx = outer.make_outer_optimizer("sgd", 1.0)
    alg = algorithms.make("allreduce", topology.make("ring", N))
    mixed, _, _ = alg.step(outer.pseudo_gradient(x, y), alg.init(x), jax.random.key(0))
    new, _ = outer.outer_step(tx, outer.outer_init(tx, x), x, mixed)
    np.testing.assert_allclose(np.asarray(new), np.broadcast_to(np.asarray(y).mean(0), (N, D)), atol=1e-6)


def test_make_outer_optimizer_rejects_bad_values():
    assert outer.make_outer_optimizer("none", 0.7) is None
    with pytest.raises(ValueError, match="'adam'"):
        outer.make_outer_optimizer("adam", 0.7)
    with pytest.raises(ValueError, match="outer_lr"):
        outer.make_outer_optimizer("sgd", 0.0)
    with pytest.raises(ValueError, match="outer_momentum"):
        outer.make_outer_optimizer("nesterov", 0.7, 1.0)


def _run(tmp_path, name, **changes):
    return run_training(tiny_config(**changes), str(tmp_path / name), progress=False, log=lambda s: None)


def test_outer_none_is_bitwise_the_default_run(tmp_path):
    default = _run(tmp_path, "a", num_rounds=10)
    none = _run(tmp_path, "b", num_rounds=10, outer_optimizer="none", outer_lr=0.3, outer_momentum=0.5)
    assert none.state.outer is None
    for a, b in zip(jax.tree_util.tree_leaves(default.state), jax.tree_util.tree_leaves(none.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert [r["train_loss"] for r in default.rows] == [r["train_loss"] for r in none.rows]


def test_nesterov_end_to_end_learns_and_resumes(tmp_path):
    config = dict(algorithm="allreduce", outer_optimizer="nesterov", outer_lr=0.7, outer_momentum=0.9, local_steps=2)
    full = _run(tmp_path, "a", **config)
    assert full.state.outer is not None
    losses = [r["train_loss"] for r in full.rows]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    plain = _run(tmp_path, "c", algorithm="allreduce", local_steps=2)
    first = lambda result: np.asarray(jax.tree_util.tree_leaves(result.state.params)[0])  # noqa: E731
    assert not np.array_equal(first(full), first(plain))
    part = run_training(
        tiny_config(**config), str(tmp_path / "b"), progress=False, stop_after_chunks=2, log=lambda s: None
    )
    assert not part.finished
    rest = _run(tmp_path, "b", **config)
    for a, b in zip(jax.tree_util.tree_leaves(full.state), jax.tree_util.tree_leaves(rest.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
    "flag, words",
    [
        ("--outer_optimizer=unknown", ["outer_optimizer", "'unknown'"]),
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


def test_cli_outer_with_same_iterate_exits_2(tmp_path, capsys):
    code = main(
        ["train", *TINY_FLAGS, "--outer_optimizer=nesterov", "--ordering=same_iterate", f"--out={tmp_path / 'run'}"]
    )
    assert code == 2
    assert "ordering" in capsys.readouterr().err
