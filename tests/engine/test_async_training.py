"""Asynchronous training (jaxgossip.engine.asynchronous.training, --execution=async): the trainer against
run_async_optimization (itself checked against a heapq event-by-event reference in
tests/engine/test_async.py) on a linear model, learning, rows, resume, and the command line's refusals."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree
from tiny import TINY_FLAGS, tiny_config

from jaxgossip import data
from jaxgossip import topology as T
from jaxgossip.cli import main
from jaxgossip.engine import asynchronous
from jaxgossip.engine.asynchronous import training as async_training
from jaxgossip.models.adapters import pure_model_fns
from jaxgossip.run.resolve import check_train_config
from jaxgossip.run.runner import run_training
from jaxgossip.sim import timing
from jaxgossip.sim.compute import availability

N, F, C, B, ROUNDS = 8, 5, 3, 4, 14  # 112 events
STRAGGLERS = "stragglers:1.0,0.25,4"


def _linear():
    def init(key, x):
        return {"w": 0.3 * jax.random.normal(key, (x.shape[-1], C)), "b": jnp.zeros([C])}

    def apply(params, x):
        return x @ params["w"] + params["b"]

    return pure_model_fns(init, apply)


def _shards():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N * 12, F)).astype(np.float32)
    y = (np.argmax(x[:, :C], axis=1)).astype(np.int32)
    parts = [np.arange(i * 12, i * 12 + 6 + i % 3 * 3) for i in range(N)]  # unequal shards: padding
    return data.make_node_shards(x, y, parts), (x[:32], y[:32])


class _Problem:
    """The trainer's loss written by hand as a jaxgossip.engine.problems-style problem on flat vectors:
    event key -> (batch key, augmentation key) -> B positions in the node's shard."""

    def __init__(self, shards, unravel):
        self.shards, self.unravel = shards, unravel

    def _loss(self, flat, x, y):
        p = self.unravel(flat)
        return optax.softmax_cross_entropy_with_integer_labels(x @ p["w"] + p["b"], y).mean()

    def loss_fn(self, flat, node, key):
        key_batch, _ = jax.random.split(key)
        idx = jax.random.randint(key_batch, (B,), 0, self.shards.counts[node])
        return self._loss(flat, self.shards.x[node][idx], self.shards.y[node][idx])

    def full_loss_fn(self, flat, node, key):
        del key
        return self._loss(flat, self.shards.x[node], jnp.maximum(self.shards.y[node], 0))


def _graph(rule):
    if rule != "async_sgp":
        return T.ring(N)
    adjacency = np.zeros((N, N))
    for i in range(N):
        adjacency[i, (i + 1) % N] = adjacency[i, (i + 3) % N] = 1
    return T.from_adjacency(adjacency, weights="column")


@pytest.mark.parametrize(
    "rule",
    [  # the training glue is shared; async_sgp also checks the gradient at x / w
        pytest.param("ad_psgd", marks=pytest.mark.slow),
        pytest.param("async_gossip", marks=pytest.mark.slow),
        "async_sgp",
    ],
)
def test_trainer_equals_run_async_optimization(rule):
    shards, eval_data = _shards()
    topology = _graph(rule)
    tm = timing.time_model(topology, compute=STRAGGLERS, latency=np.linspace(0.1, 0.6, N), bandwidth=500.0)
    key = jax.random.key(3)
    trainer = async_training.make_async_train(
        _linear(),
        topology,
        shards,
        eval_data,
        optax.sgd(0.2),
        algorithm=rule,
        time=tm,
        key=key,
        num_rounds=ROUNDS,
        batch_size=B,
        eval_every=ROUNDS // 2,
        eval_chunk=16,
    )
    state = trainer.init(key)
    state, first = trainer.run_chunk(state, 1)  # two chunks: the second starts mid-run
    state, second = trainer.run_chunk(state, 1)
    x0, unravel = ravel_pytree(jax.tree_util.tree_map(lambda a: a[0], trainer.init(key).params))
    res = asynchronous.run_async_optimization(
        _Problem(shards, unravel),
        topology,
        jnp.broadcast_to(x0, (N, x0.size)),
        lr=0.2,
        time=tm,
        num_rounds=ROUNDS,
        key=jax.random.split(key)[1],
        algorithm=rule,
    )
    counts = np.bincount(res.schedule.node, minlength=N)
    assert counts.max() >= 2 * counts.min()  # the stragglers straggle
    if rule != "ad_psgd":
        assert res.waves.slots >= 2  # some reads are stale or some messages wait
    flat = jax.vmap(lambda p: ravel_pytree(p)[0])(state.params)
    np.testing.assert_allclose(np.asarray(flat), np.asarray(res.x), rtol=1e-5, atol=1e-6)
    sim_time = np.r_[np.asarray(first.sim_time), np.asarray(second.sim_time)]
    np.testing.assert_array_equal(sim_time, np.asarray(res.sim_time)[[ROUNDS // 2, ROUNDS]])
    consensus = np.r_[np.asarray(first.consensus), np.asarray(second.consensus)]
    np.testing.assert_allclose(consensus, np.asarray(res.consensus)[[ROUNDS // 2, ROUNDS]], rtol=1e-4, atol=1e-7)
    # bits: one model per out-neighbour and event (AD-PSGD: both nodes of the pair send one)
    sends = np.bincount(res.schedule.node, minlength=N).astype(float)
    if rule == "ad_psgd":
        expected = 32.0 * x0.size * (sends + np.bincount(res.schedule.partner, minlength=N))
    else:
        degree = np.array(
            [len(set(np.asarray(topology.receivers)[0][np.asarray(topology.senders)[0] == i]) - {i}) for i in range(N)]
        )
        expected = (32.0 * x0.size + (32.0 if rule == "async_sgp" else 0.0)) * degree * sends
    np.testing.assert_allclose(np.asarray(second.bits)[-1], expected, rtol=1e-6)


def test_trainer_under_churn_with_rate_compensation_equals_run_async_optimization():
    """The trainer plans churn and weights the steps as run_async_optimization does (AD-PSGD,
    priced exchanges, a Markov mask, stragglers)."""
    shards, eval_data = _shards()
    topology = _graph("ad_psgd")
    mask = availability("markov:0.3,0.5", ROUNDS, N, 1)
    tm = timing.time_model(topology, compute=STRAGGLERS, latency=0.05, bandwidth=500.0, available=mask)
    key = jax.random.key(3)
    trainer = async_training.make_async_train(
        _linear(),
        topology,
        shards,
        eval_data,
        optax.sgd(0.2),
        algorithm="ad_psgd",
        time=tm,
        key=key,
        num_rounds=ROUNDS,
        batch_size=B,
        eval_every=ROUNDS,
        eval_chunk=16,
        rate_compensation=True,
    )
    state, metrics = trainer.run_chunk(trainer.init(key), 1)
    x0, unravel = ravel_pytree(jax.tree_util.tree_map(lambda a: a[0], trainer.init(key).params))
    run = functools.partial(
        asynchronous.run_async_optimization,
        _Problem(shards, unravel),
        topology,
        jnp.broadcast_to(x0, (N, x0.size)),
        lr=0.2,
        time=tm,
        num_rounds=ROUNDS,
        key=jax.random.split(key)[1],
        algorithm="ad_psgd",
    )
    res, plain = run(rate_compensation=True), run()
    flat = jax.vmap(lambda p: ravel_pytree(p)[0])(state.params)
    np.testing.assert_allclose(np.asarray(flat), np.asarray(res.x), rtol=1e-5, atol=1e-6)
    assert np.abs(np.asarray(res.x) - np.asarray(plain.x)).max() > 1e-3  # the weights matter
    np.testing.assert_array_equal(np.asarray(metrics.sim_time)[-1], np.asarray(res.sim_time)[-1])
    always = timing.time_model(topology, compute=STRAGGLERS, latency=0.05, bandwidth=500.0)
    no_churn = asynchronous.plan_async(topology, always, ROUNDS, jax.random.split(key)[1], "ad_psgd", x0.size)
    assert res.schedule.time[-1] > no_churn.schedule.time[-1]  # offline nodes slow the run down


def test_refuses_batch_norm_and_a_traced_key():
    import flax.linen as nn

    class Normed(nn.Module):
        @nn.compact
        def __call__(self, x, train=False):
            return nn.Dense(C)(nn.BatchNorm(use_running_average=not train)(x))

    shards, eval_data = _shards()
    args = (shards, eval_data, optax.sgd(0.1))
    kw = dict(algorithm="gossip", time=1.0, num_rounds=2, batch_size=B, eval_every=1)
    with pytest.raises(ValueError, match="normalization statistics"):
        async_training.make_async_train(Normed(), T.ring(N), *args, key=jax.random.key(0), **kw)
    with pytest.raises(ValueError, match="choco cannot run with execution='async'"):
        async_training.make_async_train(
            _linear(), T.ring(N), *args, key=jax.random.key(0), **{**kw, "algorithm": "choco"}
        )


ASYNC = dict(execution="async", time={"compute": STRAGGLERS, "latency": 0.3}, momentum=0.0, weight_decay=0.0)


@pytest.mark.parametrize("algorithm, form", [("gossip", "ad_psgd"), ("push_sum", "async_sgp")])
def test_resume_equals_uninterrupted_and_learns(tmp_path, algorithm, form):
    # async_sgp also carries messages in flight across the interruption.
    config = tiny_config(**ASYNC, algorithm=algorithm, async_form=form, lr=0.1)
    quiet = dict(progress=False, log=lambda s: None)
    full = run_training(config, str(tmp_path / "a"), **quiet)
    part = run_training(config, str(tmp_path / "b"), stop_after_chunks=2, **quiet)
    assert not part.finished
    rest = run_training(config, str(tmp_path / "b"), **quiet)
    assert rest.finished and rest.start_round == 10
    for a, b in zip(jax.tree_util.tree_leaves(full.state), jax.tree_util.tree_leaves(rest.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    timeless = lambda rows: [{k: v for k, v in r.items() if k != "wall_time"} for r in rows]  # noqa: E731
    assert timeless(full.rows) == timeless(rest.rows)
    sim = [r["sim_time"] for r in full.rows]
    assert all(b > a > 0 for a, b in zip(sim, sim[1:]))
    assert all(r["comm_time"] == 0.0 for r in full.rows)
    assert full.rows[-1]["test_acc"] > 0.3  # 10 classes: chance is 0.1
    assert full.rows[-1]["bits_mean"] > full.rows[0]["bits_mean"] > 0


def test_same_seed_same_schedule_other_seed_other():
    topology = T.ring(4)
    plans = [asynchronous.plan_async(topology, STRAGGLERS, 5, jax.random.key(s), "gossip", 10) for s in (0, 0, 1)]
    np.testing.assert_array_equal(plans[0].schedule.time, plans[1].schedule.time)
    np.testing.assert_array_equal(plans[0].tables.event, plans[1].tables.event)
    assert not np.array_equal(plans[0].schedule.node, plans[2].schedule.node)


def test_sync_is_the_default():
    assert check_train_config(tiny_config(execution="sync")) == check_train_config(tiny_config())
    assert tiny_config().execution == "sync"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--execution=asnc"], r"unknown execution 'asnc' \(did you mean 'async'\?\); known: sync, async"),
        (["--execution=async", "--algorithm=choco", "--time.compute=1"], "choco cannot run with execution='async'"),
        (["--execution=async", "--local_steps=2", "--time.compute=1"], "local_steps=2 with --execution=async"),
        (["--execution=async"], "needs --time.compute > 0"),
        (
            ["--execution=async", "--time.compute=1", "--algorithm=push_sum", "--async_form=ad_psgd"],
            "async_form='ad_psgd'.*forms of push_sum are async_sgp",
        ),
        (["--async_form=ad_psgd"], "async_form='ad_psgd' applies to --execution=async only"),
        (["--execution=async", "--time.compute=1", "--topology=random_matching"], "is drawn every round"),
        (["--execution=async", "--time.compute=1", "--algorithm_options.gamma=0.5"], "take no options"),
        (["--execution=async", "--time.compute=1", "--outer_optimizer=nesterov"], "outer_optimizer='nesterov'"),
        (["--execution=async", "--time.compute=1", "--time.availability=markov:0.1"], "markov:P_OFF,P_ON"),
        (["--async_rate_compensation=true"], "async_rate_compensation=True applies to --execution=async only"),
        (
            ["--execution=async", "--time.compute=1", "--async_rate_compensation=true"],
            "async_rate_compensation=True with --async_form=async_gossip: .*weights every node equally",
        ),
        (["--time.exchange=free"], "--time.exchange=free applies to --execution=async --async_form=ad_psgd only"),
        (["--execution=async", "--time.compute=1", "--time.exchange=free"], "messages always take their link time"),
        (["--execution=async", "--time.compute=1", "--time.exchange=cheap"], "--time.exchange='cheap' is unknown"),
    ],
)
def test_cli_refuses_bad_async_input(tmp_path, capsys, flags, message):
    import re

    out = tmp_path / "run"
    assert main(["train", *TINY_FLAGS, *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("form", ["async_gossip", "ad_psgd"])
def test_cli_trains_asynchronously_under_churn(tmp_path, form):
    """``--time.availability`` with ``--execution=async``: nodes go off line, the run takes more
    simulated time than with every node online, and it still learns."""

    def last(*flags):
        out = tmp_path / "_".join(f.split("=")[1] for f in flags)
        argv = ["train", *TINY_FLAGS, "--execution=async", f"--async_form={form}", "--time.compute=1", *flags]
        assert main([*argv, "--out", str(out)]) == 0
        rows = json.loads((out / "metrics.json").read_text())["rows"]
        assert all(np.isfinite(r["train_loss"]) for r in rows)
        return rows[-1]

    churn = last("--time.availability=markov:0.1,0.5")
    always = last("--time.availability=always")
    assert churn["sim_time"] > always["sim_time"]
    assert churn["test_acc"] > 0.3


def test_sweep_refuses_async(tmp_path, capsys):
    assert (
        main(
            [
                "sweep",
                *TINY_FLAGS,
                "--execution=async",
                "--time.compute=1",
                "--sweep.lr=0.1,0.2",
                "--out",
                str(tmp_path / "s"),
            ]
        )
        == 2
    )
    assert "runs synchronous rounds only" in capsys.readouterr().err


# The compute models of docs/usage.md's asynchronous examples. Exponential step times let a fast
# node fire many times before any message reaches it (its push-sum weight shrinks as p_ii^k):
# the step on the numerator must be scaled by w (jaxgossip/engine/asynchronous/rules.py).
DOC_COMPUTE = ["0.01", "exponential:0.01", "stragglers:0.01,0.125,10", "lognormal:0.01,0.5"]


@pytest.mark.parametrize("compute", DOC_COMPUTE)
def test_async_sgp_trains_on_every_documented_compute_model(tmp_path, compute):
    """docs/usage.md's asynchronous SGP command, with a smaller MLP."""
    config = tiny_config(
        dataset="digits",
        num_nodes=8,
        model_options={"hidden": [16]},
        num_rounds=40,
        eval_every=10,
        evals_per_chunk=4,
        lr=0.1,
        eval_size=360,
        batch_size=32,
        execution="async",
        algorithm="push_sum",
        time={"compute": compute},
    )
    rows = run_training(config, str(tmp_path), progress=False, log=lambda s: None).rows
    assert all(np.isfinite(r["train_loss"]) for r in rows)
    assert rows[-1]["test_acc"] > 0.75, rows[-1]  # 10 classes: chance is 0.1


@pytest.mark.slow
def test_documented_async_sgp_command_trains(tmp_path):
    out = tmp_path / "async_sgp"
    argv = "--dataset=digits --model=mlp --num_rounds=40 --eval_every=10 --execution=async --algorithm=push_sum"
    assert main(["train", *argv.split(), "--time.compute=exponential:0.01", "--out", str(out)]) == 0
    rows = json.loads((out / "metrics.json").read_text())["rows"]
    assert rows[-1]["test_acc"] > 0.85
