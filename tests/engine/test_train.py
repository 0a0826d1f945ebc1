"""End-to-end training: every registered algorithm learns, determinism, resume, CLI outputs, errors."""

import json
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tiny import tiny_config

import jaxgossip as jg
from jaxgossip import data, models
from jaxgossip.engine.training import make_train
from jaxgossip.run.checkpoint import CheckpointError
from jaxgossip.run.resolve import resolve
from jaxgossip.run.runner import TrainConfig, run_training

# Small, sensible hyperparameters per algorithm for an 8-node run.
ALG_OPTIONS = {
    "choco": {"compressor": "top_k", "compressor_options": {"fraction": 0.25}, "gamma": 0.5},
    "deepsqueeze": {"compressor": "top_k", "compressor_options": {"fraction": 0.25}, "gamma": 0.2},
    "sparse_push": {"fraction": 0.25, "gamma": 0.5},
    "scsp": {"fraction": 0.25, "gamma": 0.5},
    "power_gossip": {"rank": 1},
    "d2": {"gamma": 0.5},  # the uniform 8-ring's lambda_min = -1/3 is D^2's limit (its docstring)
    "qgm": {"lr": 0.1},  # the optimizer's learning rate
    "demo_momentum": {"lr": 0.01, "k": 8},  # the sign step replaces the optimizer's step
    "moniqua": {"theta": 1.0, "gamma": 0.5},
}
PUSH = ("push_sum", "sparse_push", "scsp")


def _topology(name, n=8):
    if jg.algorithms.info(name).graph.tree:  # RelaySum needs a tree (metadata tree=True)
        return jg.topology.binary_tree(n)
    return jg.topology.one_peer_exponential(n) if name in PUSH else jg.topology.ring(n)


@pytest.fixture(scope="module")
def synthetic():
    return data.make_synthetic(num_train=512, num_test=128, num_classes=4, shape=(4, 4, 1), noise=0.5, seed=0)


def _trainer(alg_name, dataset, num_rounds=60, ordering="atc", partition="iid", **kwargs):
    topo = _topology(alg_name)
    alg = jg.algorithms.make(alg_name, topo, **ALG_OPTIONS.get(alg_name, {}))
    parts = data.partition(dataset.y_train, 8, partition, seed=0)
    shards = data.shard_dataset(dataset, parts)
    model = models.make_model("mlp", num_classes=dataset.num_classes, hidden=(16,))
    return make_train(
        model,
        alg,
        shards,
        (dataset.x_test, dataset.y_test),
        optax.sgd(0.1, momentum=0.9),
        num_rounds=num_rounds,
        batch_size=16,
        eval_every=20,
        ordering=ordering,
        eval_chunk=64,
        **kwargs,
    )


@pytest.mark.parametrize("alg_name", sorted(jg.algorithms.REGISTRY))
def test_every_algorithm_learns(alg_name, synthetic):
    trainer = _trainer(alg_name, synthetic)
    _, metrics = jax.jit(trainer.train)(jax.random.key(0))
    acc = np.asarray(metrics.test_acc)
    assert acc.shape == (3,)
    assert acc[-1] > 0.8, f"{alg_name} reached only {acc[-1]:.3f} (chance 0.25)"
    assert np.asarray(metrics.node_acc_min)[-1] > 0.5
    bits = np.asarray(metrics.bits)
    assert bits.shape == (3, 8) and np.all(np.diff(bits, axis=0) > 0)


def test_same_seed_same_result_and_orderings_differ(synthetic):
    trainer = _trainer("gossip", synthetic, num_rounds=20)
    _, m1 = jax.jit(trainer.train)(jax.random.key(3))
    _, m2 = jax.jit(trainer.train)(jax.random.key(3))
    _, m3 = jax.jit(trainer.train)(jax.random.key(4))
    for a, b in zip(m1, m2):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(m1.train_loss[0]) != float(m3.train_loss[0])
    same = _trainer("gossip", synthetic, num_rounds=20, ordering="same_iterate")
    _, m4 = jax.jit(same.train)(jax.random.key(3))
    assert float(m4.train_loss[0]) != float(m1.train_loss[0])
    assert np.isfinite(np.asarray(m4.test_acc)).all()


def test_train_vmaps_over_seeds(synthetic):
    trainer = _trainer("gossip", synthetic, num_rounds=20)
    keys = jax.random.split(jax.random.key(0), 2)
    _, batched = jax.jit(jax.vmap(trainer.train))(keys)
    for i in range(2):
        _, single = jax.jit(trainer.train)(keys[i])
        np.testing.assert_allclose(np.asarray(batched.test_loss[i]), np.asarray(single.test_loss), rtol=2e-5, atol=1e-6)


def test_push_sum_gradients_at_debiased_model(synthetic):
    """On a non-regular digraph push-sum weights drift from 1: training must still work (z = x / w)."""
    topo = jg.topology.random_directed(8, 0.3, seed=1)
    alg = jg.algorithms.make("push_sum", topo) if "push_sum" in jg.algorithms.REGISTRY else None
    if alg is None:
        pytest.skip("push_sum not registered")
    parts = data.partition(synthetic.y_train, 8, "iid", seed=0)
    trainer = make_train(
        models.make_model("mlp", num_classes=4, hidden=(16,)),
        alg,
        data.shard_dataset(synthetic, parts),
        (synthetic.x_test, synthetic.y_test),
        optax.sgd(0.1, momentum=0.9),
        num_rounds=60,
        batch_size=16,
        eval_every=20,
        eval_chunk=64,
    )
    state, metrics = jax.jit(trainer.train)(jax.random.key(0))
    assert float(metrics.test_acc[-1]) > 0.8


def test_batchnorm_statistics_stay_per_node(synthetic):
    topo = jg.topology.ring(4)
    parts = data.partition(synthetic.y_train, 4, "shards:1", seed=0)
    trainer = make_train(
        models.make_model("cnn", num_classes=4, features=(4,), norm="batch", conv_impl="lax"),
        jg.algorithms.make("gossip", topo),
        data.shard_dataset(synthetic, parts),
        (synthetic.x_test, synthetic.y_test),
        optax.sgd(0.05),
        num_rounds=4,
        batch_size=8,
        eval_every=2,
        eval_chunk=64,
    )
    state, _ = jax.jit(trainer.train)(jax.random.key(0))
    means = [leaf for leaf in jax.tree_util.tree_leaves(state.batch_stats)]
    assert means, "the batch-norm model must have batch_stats"
    stats = np.asarray(means[0])
    assert stats.shape[0] == 4
    assert not np.allclose(stats[0], stats[1]), "label-sorted shards must give different node statistics"


_config = tiny_config


def test_resume_equals_uninterrupted(tmp_path):
    config = _config()
    full = run_training(config, str(tmp_path / "a"), progress=False, log=lambda s: None)
    part = run_training(config, str(tmp_path / "b"), progress=False, stop_after_chunks=2, log=lambda s: None)
    assert not part.finished
    rest = run_training(config, str(tmp_path / "b"), progress=False, log=lambda s: None)
    assert rest.finished
    for a, b in zip(jax.tree_util.tree_leaves(full.state), jax.tree_util.tree_leaves(rest.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    timeless = lambda rows: [{k: v for k, v in r.items() if k != "wall_time"} for r in rows]  # noqa: E731
    assert timeless(full.rows) == timeless(rest.rows)
    assert all(r["wall_time"] > 0 for r in full.rows)


def test_mismatched_and_unreadable_checkpoint(tmp_path):
    out = str(tmp_path / "run")
    run_training(_config(), out, progress=False, stop_after_chunks=1, log=lambda s: None)
    with pytest.raises(CheckpointError, match="another configuration.*lr"):
        run_training(_config(lr=0.5), out, progress=False, log=lambda s: None)
    with open(os.path.join(out, "checkpoint", "5", "meta", "metadata"), "w") as f:
        f.write("{not json")
    with pytest.raises(CheckpointError, match="unreadable"):
        run_training(_config(), out, progress=False, log=lambda s: None)


def test_weight_decay_masks():
    from jaxgossip.run.resolve import make_optimizer

    params = {
        "conv": {"kernel": jnp.ones((3, 3, 2, 4)), "bias": jnp.ones(4)},
        "bn1": {"scale": jnp.ones(4), "bias": jnp.ones(4)},
    }
    grads = jax.tree_util.tree_map(jnp.zeros_like, params)
    for mask, decayed in (
        ("all", {"kernel", "conv_bias", "scale", "bn_bias"}),
        ("no_1d", {"kernel"}),
        ("no_norm", {"kernel", "conv_bias"}),
    ):
        opt = make_optimizer(TrainConfig(lr=1.0, momentum=0.0, weight_decay=0.5, weight_decay_mask=mask))
        updates, _ = opt.update(grads, opt.init(params), params)
        moved = {
            "kernel": updates["conv"]["kernel"],
            "conv_bias": updates["conv"]["bias"],
            "scale": updates["bn1"]["scale"],
            "bn_bias": updates["bn1"]["bias"],
        }
        assert {k for k, v in moved.items() if float(jnp.abs(v).max()) > 0} == decayed, mask
    with pytest.raises(ValueError, match="weight_decay_mask"):
        make_optimizer(TrainConfig(weight_decay_mask="some"))


def test_cli_writes_every_promised_file(tmp_path, capsys):
    from jaxgossip.cli import main

    out = str(tmp_path / "cli")
    code = main(
        [
            "train",
            "--out",
            out,
            "--no-progress",
            "--dataset=synthetic",
            "--num_nodes=4",
            "--model=mlp",
            '--model_options={"hidden": [8]}',
            "--batch_size=8",
            "--num_rounds=10",
            "--eval_every=5",
            "--eval_size=128",
            "--eval_chunk=64",
        ]
    )
    assert code == 0
    for name in (
        "metrics.json",
        "metrics.csv",
        "config.json",
        "accuracy_vs_rounds.png",
        "accuracy_vs_bits.png",
        "accuracy_vs_time.png",
        "consensus.png",
        "checkpoint/10/meta",  # the checkpoint of the last round (jaxgossip.run.checkpoint)
    ):
        assert os.path.exists(os.path.join(out, name)), name
    rows = json.load(open(os.path.join(out, "metrics.json")))["rows"]
    assert [r["round"] for r in rows] == [5, 10]
    assert "acc(avg)" in capsys.readouterr().out


def test_consensus_plot_range_is_set_by_training_not_by_the_final_merge(tmp_path):
    """The demo's SCSP run with its exact final merge (distance 0 or ~1e-13) next to gossip: the log
    y range of consensus.png spans the training rows only, and the merge is a marker at its round
    with its value in the legend."""
    from jaxgossip.cli import demo_runs
    from jaxgossip.run import plots

    runs = {}
    for name in ("gossip", "scsp"):
        spec = next(r for r in demo_runs() if r["algorithm"] == name)
        config = tiny_config(
            algorithm=name,
            topology=spec["topology"],
            algorithm_options=spec.get("algorithm_options", {}),
            final_merge=spec.get("final_merge"),
        )
        runs[spec["name"]] = run_training(config, progress=False, log=lambda s: None).rows
    merged = runs["scsp 10%"][-1]
    assert merged["phase"] == "merged" and merged["consensus"] < 1e-12
    trained = [r["consensus"] for rows in runs.values() for r in rows if r["phase"] == "train"]
    assert min(trained) > 1e-4
    fig = plots.training_figure(runs, "consensus")
    (ax,) = fig.axes
    low, high = ax.get_ylim()
    assert min(trained) / 10 < low <= min(trained) and max(trained) <= high < max(trained) * 10
    # the curves end at the last training row; the merge is one marker at the last round, on the edge
    assert [line.get_xdata()[-1] for line in ax.get_lines()] == [20, 20]
    assert [len(line.get_ydata()) for line in ax.get_lines()] == [4, 4]
    (marker,) = ax.collections
    np.testing.assert_allclose(marker.get_offsets(), [[20, low]])
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["gossip", "scsp 10%", f"scsp 10%, final merge: {merged['consensus']:.1e} (off the axis)"]
    import matplotlib.pyplot as plt

    plt.close(fig)
    paths = plots.plot_training(runs, str(tmp_path))
    assert [os.path.basename(p) for p in paths] == ["accuracy_vs_rounds.png", "accuracy_vs_bits.png", "consensus.png"]


def test_nan_loss_stops_with_hint_and_keeps_metrics(tmp_path):
    out = str(tmp_path / "nan")
    with pytest.raises(FloatingPointError, match="smaller learning rate"):
        run_training(_config(lr=1e8, momentum=0.0), out, progress=False, log=lambda s: None)
    assert os.path.exists(os.path.join(out, "metrics.json"))

    def no_nan(name):
        raise AssertionError(f"metrics.json holds {name}, which is not JSON")

    with open(os.path.join(out, "metrics.json")) as f:
        rows = json.load(f, parse_constant=no_nan)["rows"]
    assert rows[-1]["train_loss"] is None  # the non-finite loss, written as null


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"dataset": "imagenet"}, "unknown dataset|known"),
        ({"model": "perceiver"}, "unknown model"),
        ({"algorithm": "telepathy"}, "unknown algorithm"),
        ({"partition": "zipf:2"}, "unknown|scheme"),
        ({"num_nodes": 5000}, "exceeds"),
        ({"batch_size": 1000}, "batch size larger than a shard"),
        ({"topology": "moebius"}, "unknown topology"),
        ({"ordering": "random"}, "ordering"),
        ({"num_rounds": 12}, "multiple of eval_every"),
    ],
)
def test_bad_config_errors(changes, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        run_training(_config(**changes), None, progress=False, log=lambda s: None)


def test_cli_reports_bad_input(tmp_path, capsys):
    from jaxgossip.cli import main

    assert main(["train", "--out", str(tmp_path), "--no-progress", "--dataset=synthetic", "--algorithm=nope"]) == 2
    assert "unknown algorithm" in capsys.readouterr().err


def test_node_batch_equals_full_vmap():
    base = _config(num_nodes=8)
    a = run_training(base, None, progress=False, log=lambda s: None)
    b = run_training(base.replace(node_batch=3), None, progress=False, log=lambda s: None)
    for x, y in zip(jax.tree_util.tree_leaves(a.state.params), jax.tree_util.tree_leaves(b.state.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "alg_name, topo, options",
    [
        ("gossip", "ring", {}),
        ("power_gossip", "ring", {}),
        ("sparse_push", "one_peer_exponential", {"fraction": 0.3, "gamma": 0.5}),
    ],
)
def test_training_sharded_over_8_devices_equals_one_device(alg_name, topo, options):
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py requests 8 CPU devices)")
    config = _config(num_nodes=8, algorithm=alg_name, topology=topo, algorithm_options=options, num_rounds=10)
    a = run_training(config, None, progress=False, log=lambda s: None)
    b = run_training(config.replace(devices=8), None, progress=False, log=lambda s: None)
    leaves = jax.tree_util.tree_leaves(b.state.params)
    assert leaves[0].sharding.spec == jax.sharding.PartitionSpec("nodes")
    for x, y in zip(jax.tree_util.tree_leaves(a.state.params), leaves):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


def test_devices_must_divide_nodes():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices")
    with pytest.raises(ValueError, match="cannot be split evenly"):
        run_training(_config(num_nodes=6, devices=4), None, progress=False, log=lambda s: None)


# Local steps, optimizers, and user models / losses.


def _linear_pair(dim, num_classes):
    """A pure (init, apply) linear classifier (small random init, so the nodes' weights matter)."""

    def init(key, x):
        del x
        return {"w": 0.1 * jax.random.normal(key, (dim, num_classes)), "b": jnp.zeros(num_classes)}

    def apply(params, x):
        return x.reshape(x.shape[0], -1) @ params["w"] + params["b"]

    return init, apply


def _first_samples(shards, key, batch_size):
    """A deterministic sampler: every node's first ``batch_size`` samples, whatever the key."""
    del key
    return shards.x[:, :batch_size], shards.y[:, :batch_size]


def _np_local_sgd(w, b, xs, ys, lr, local_steps, rounds):
    """NumPy local SGD with exact averaging: each node takes H full-batch softmax cross-entropy
    gradient steps from the common model, then all models are averaged (float64)."""
    num_classes = w.shape[1]
    for _ in range(rounds):
        ws, bs = [], []
        for x, y in zip(xs, ys):
            wi, bi = w.copy(), b.copy()
            for _ in range(local_steps):
                logits = x @ wi + bi
                p = np.exp(logits - logits.max(1, keepdims=True))
                p /= p.sum(1, keepdims=True)
                g = (p - np.eye(num_classes)[y]) / x.shape[0]
                wi, bi = wi - lr * x.T @ g, bi - lr * g.sum(0)
            ws.append(wi)
            bs.append(bi)
        w, b = np.mean(ws, 0), np.mean(bs, 0)
    return w, b


def _custom_trainer(dataset, model, optimizer, *, num_nodes=4, algorithm="gossip", **kwargs):
    topo = jg.topology.ring(num_nodes)
    shards = data.shard_dataset(dataset, data.partition(dataset.y_train, num_nodes, "iid", seed=0))
    options = dict(num_rounds=40, batch_size=16, eval_every=20, eval_chunk=64)
    options.update(kwargs)
    return make_train(
        model, jg.algorithms.make(algorithm, topo), shards, (dataset.x_test, dataset.y_test), optimizer, **options
    )


def test_local_sgd_with_allreduce_equals_numpy_reference(synthetic):
    """H local SGD steps, then exact averaging: the NumPy reference of local SGD (Stich, 2019)."""
    lr, local_steps, rounds, batch = 0.5, 3, 4, 32
    trainer = _custom_trainer(
        synthetic,
        _linear_pair(16, 4),
        optax.sgd(lr),
        algorithm="allreduce",
        num_rounds=rounds,
        eval_every=2,
        batch_size=batch,
        local_steps=local_steps,
        sampler=_first_samples,
    )
    key = jax.random.key(0)
    start = trainer.init(key).params
    state, metrics = jax.jit(trainer.train)(key)
    shards = data.shard_dataset(synthetic, data.partition(synthetic.y_train, 4, "iid", seed=0))
    xs = np.asarray(shards.x[:, :batch], np.float64).reshape(4, batch, -1)
    ys = np.asarray(shards.y[:, :batch])
    w, b = _np_local_sgd(
        np.asarray(start["w"][0], np.float64), np.asarray(start["b"][0], np.float64), xs, ys, lr, local_steps, rounds
    )
    for i in range(4):
        np.testing.assert_allclose(np.asarray(state.params["w"][i]), w, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(state.params["b"][i]), b, rtol=1e-4, atol=1e-5)
    assert trainer.local_steps == local_steps
    np.testing.assert_array_equal(np.asarray(metrics.round), [2, 4])


def test_local_steps_keep_bits_per_round_and_report_local_steps(tmp_path):
    one = run_training(_config(num_rounds=10), str(tmp_path / "h1"), progress=False, log=lambda s: None)
    three = run_training(
        _config(num_rounds=10, local_steps=3), str(tmp_path / "h3"), progress=False, log=lambda s: None
    )
    np.testing.assert_array_equal(np.asarray(one.metrics.bits), np.asarray(three.metrics.bits))
    assert [r["local_step"] for r in three.rows] == [5 * 3, 10 * 3]
    assert [r["local_step"] for r in one.rows] == [5, 10]
    with open(tmp_path / "h3" / "metrics.json") as f:
        payload = json.load(f)
    assert payload["local_steps"] == 3 and [r["round"] for r in payload["rows"]] == [5, 10]
    assert float(three.rows[-1]["train_loss"]) < float(three.rows[0]["train_loss"])
    assert not np.allclose(np.asarray(one.metrics.test_loss), np.asarray(three.metrics.test_loss))


def test_schedule_counts_rounds_with_local_steps():
    from jaxgossip.run.resolve import make_schedule

    base = dict(lr=0.1, warmup_rounds=2, warmup_from=0.01, decay_rounds=(4, 6))
    per_round = make_schedule(TrainConfig(**base))
    per_step = make_schedule(TrainConfig(local_steps=3, **base))
    for count in range(24):
        assert float(per_step(count)) == float(per_round(count // 3)), count


def test_local_steps_and_loss_fn_bad_input(synthetic):
    from jaxgossip.run.resolve import check_train_config

    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="local_steps"):
            _custom_trainer(synthetic, _linear_pair(16, 4), optax.sgd(0.1), local_steps=bad)
    with pytest.raises(ValueError, match="local_steps"):
        check_train_config(_config(local_steps=0))

    def per_sample(logits, labels):
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels)  # [B], not reduced

    with pytest.raises(ValueError, match="loss_fn must return a floating scalar.*mean"):
        _custom_trainer(synthetic, _linear_pair(16, 4), optax.sgd(0.1), loss_fn=per_sample)


def test_custom_loss_fn_trains(synthetic):
    def smoothed(logits, labels):
        targets = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1]), 0.1)
        return optax.softmax_cross_entropy(logits, targets).mean()

    trainer = _custom_trainer(synthetic, _linear_pair(16, 4), optax.sgd(0.1, momentum=0.9), loss_fn=smoothed)
    _, metrics = jax.jit(trainer.train)(jax.random.key(0))
    assert float(metrics.test_acc[-1]) > 0.8
    assert np.isfinite(np.asarray(metrics.test_loss)).all()


def test_nnx_model_trains(synthetic):
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.hidden = nnx.Linear(16, 16, rngs=rngs)
            self.out = nnx.Linear(16, 4, rngs=rngs)

        def __call__(self, x):
            return self.out(nnx.relu(self.hidden(x.reshape(x.shape[0], -1))))

    trainer = _custom_trainer(synthetic, Net(nnx.Rngs(0)), optax.sgd(0.1, momentum=0.9))
    _, metrics = jax.jit(trainer.train)(jax.random.key(0))
    assert float(metrics.test_acc[-1]) > 0.8


@pytest.mark.parametrize(
    "changes", [{"optimizer": "adam", "lr": 0.01}, {"optimizer": "adamw", "lr": 0.01}, {"grad_clip": 0.5}]
)
def test_optimizers_and_grad_clip_train_end_to_end(changes):
    result = run_training(_config(**changes), None, progress=False, log=lambda s: None)
    accs = [r["test_acc"] for r in result.rows]
    assert accs[-1] > 0.3, (changes, accs)  # 10 classes: chance 0.1
    assert result.rows[-1]["train_loss"] < result.rows[0]["train_loss"]


def test_grad_clip_is_per_node_and_adamw_decay_is_decoupled():
    from jaxgossip.run.resolve import make_optimizer

    opt = make_optimizer(TrainConfig(lr=1.0, momentum=0.0, weight_decay=0.0, grad_clip=1.0))
    grads = {"w": jnp.array([[6.0, 8.0], [0.3, 0.4]])}  # node norms 10 and 0.5
    params = {"w": jnp.zeros((2, 2))}
    updates, _ = jax.vmap(opt.update)(grads, jax.vmap(opt.init)(params), params)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(updates["w"]), axis=1), [1.0, 0.5], rtol=1e-6)
    adamw = make_optimizer(TrainConfig(optimizer="adamw", lr=0.1, weight_decay=0.5))
    p = {"w": jnp.array([2.0, -4.0])}
    updates, _ = adamw.update({"w": jnp.zeros(2)}, adamw.init(p), p)
    np.testing.assert_allclose(np.asarray(updates["w"]), -0.1 * 0.5 * np.asarray(p["w"]), rtol=1e-6)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"optimizer": "lamb"}, "unknown optimizer"),
        ({"optimizer": "adam", "optimizer_options": {"beta1": 0.9}}, "no option 'beta1'.*it takes: b1, b2, eps"),
        ({"optimizer": "adam", "optimizer_options": {"b2": 1.5}}, r"b2=1.5 must be in \[0, 1\)"),
        ({"optimizer_options": {"b1": 0.9}}, "sgd uses the fields momentum"),
        ({"grad_clip": 0.0}, "grad_clip"),
    ],
)
def test_optimizer_config_errors(changes, match):
    from jaxgossip.run.resolve import check_train_config

    with pytest.raises(ValueError, match=match):
        check_train_config(_config(**changes))


@pytest.mark.parametrize("ordering", ["atc", "same_iterate"])
def test_one_local_step_is_the_one_step_trainer_bitwise(synthetic, ordering):
    """local_steps=1 is the trainer before local steps existed: this reference round (one batch,
    one optimizer step, one communication round, keys split 4 ways) reproduces it bit for bit."""
    from jaxgossip.engine.training import cross_entropy_loss
    from jaxgossip.models.adapters import linen_model_fns

    model = models.make_model("mlp", num_classes=4, hidden=(16,))
    fns = linen_model_fns(model)
    alg = jg.algorithms.make("push_sum", jg.topology.one_peer_exponential(8))
    opt = optax.sgd(0.1, momentum=0.9, nesterov=True)
    shards = data.shard_dataset(synthetic, data.partition(synthetic.y_train, 8, "iid", seed=0))
    trainer = make_train(
        model, alg, shards, (synthetic.x_test, synthetic.y_test), opt,
        num_rounds=10, batch_size=16, eval_every=10, ordering=ordering, eval_chunk=64,
    )  # fmt: skip
    grad = jax.vmap(jax.value_and_grad(cross_entropy_loss(fns), has_aux=True))

    def reference_round(state, _):
        key, key_batch, _, key_comm = jax.random.split(jax.random.wrap_key_data(state.key), 4)
        x, y = data.sample_batch(shards, key_batch, 16)
        z = alg.debias(state.params, state.comm_state)
        (loss, stats), grads = grad(z, state.batch_stats, x, y)
        updates, opt_state = jax.vmap(opt.update)(grads, state.opt_state, z)
        if ordering == "atc":
            params, comm_state, info = alg.step(optax.apply_updates(state.params, updates), state.comm_state, key_comm)
        else:
            params, comm_state, info = alg.step(state.params, state.comm_state, key_comm)
            params = optax.apply_updates(params, updates)
        new = state._replace(
            params=params, batch_stats=stats, opt_state=opt_state, comm_state=comm_state,
            key=jax.random.key_data(key), round=state.round + 1, bits=state.bits + info.bits,
        )  # fmt: skip
        return new, jnp.mean(loss)

    start = trainer.init(jax.random.key(5))
    want, losses = jax.jit(lambda s: jax.lax.scan(reference_round, s, None, length=10))(start)
    got, metrics = trainer.run_chunk(start, 1)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(metrics.train_loss)[0], np.asarray(losses.mean()))


class _StateWithHonestField(NamedTuple):
    """A state that has an ``honest`` field but belongs to an algorithm without the hook."""

    inner: Any
    honest: Any


def test_metrics_skip_exactly_the_nodes_the_honest_hook_marks(synthetic):
    """The evaluation metrics are over the nodes ``GossipAlgorithm.honest(state)`` marks True, and
    nothing else decides it: a state with an ``honest`` field but no hook is averaged over all."""
    from jaxgossip.engine.training import batched_eval
    from jaxgossip.models.adapters import linen_model_fns

    n, attackers = 8, [2, 5]
    mask = np.array([i not in attackers for i in range(n)])
    model = models.make_model("mlp", num_classes=4, hidden=(16,))
    shards = data.shard_dataset(synthetic, data.partition(synthetic.y_train, n, "iid", seed=0))
    gossip = jg.algorithms.make("gossip", jg.topology.ring(n))
    hooked = gossip._replace(honest=lambda state: jnp.asarray(mask))  # the state is gossip's own

    def step_with_field(params, state, key):
        params, inner, info = gossip.step(params, state.inner, key)
        return params, state._replace(inner=inner), info

    field_only = gossip._replace(
        init=lambda params: _StateWithHonestField(gossip.init(params), jnp.asarray(mask)),
        step=step_with_field,
        debias=lambda params, state: gossip.debias(params, state.inner),
    )

    def trainer(alg):
        return make_train(
            model, alg, shards, (synthetic.x_test, synthetic.y_test), optax.sgd(0.1),
            num_rounds=10, batch_size=16, eval_every=10, eval_chunk=64,
        )  # fmt: skip

    honest_trainer, all_trainer = trainer(hooked), trainer(field_only)
    state, _ = honest_trainer.run_chunk(honest_trainer.init(jax.random.key(0)), 1)
    # The attackers hold flipped models, so counting them would change every metric.
    flip = jnp.where(jnp.asarray(mask), 1.0, -3.0)
    params = jax.tree_util.tree_map(lambda a: a * flip.reshape((n,) + (1,) * (a.ndim - 1)), state.params)
    state = state._replace(params=params)
    got = honest_trainer.evaluate(state, jnp.zeros(()))

    fns = linen_model_fns(model)
    x, y = jnp.asarray(synthetic.x_test), jnp.asarray(synthetic.y_test)
    per_node = [batched_eval(fns.apply, jax.tree_util.tree_map(lambda a: a[i], params), {}, x, y, 64) for i in range(n)]
    node_loss = np.array([float(loss) for loss, _ in per_node])
    node_acc = np.array([float(acc) for _, acc in per_node])
    honest_model = jg.algorithms.honest_mean(params, mask)
    test_loss, test_acc = batched_eval(fns.apply, honest_model, {}, x, y, 64)
    np.testing.assert_allclose(float(got.test_loss), float(test_loss), rtol=1e-6)
    np.testing.assert_allclose(float(got.test_acc), float(test_acc), rtol=1e-6)
    np.testing.assert_allclose(float(got.node_acc_mean), node_acc[mask].mean(), rtol=1e-6)
    assert float(got.node_acc_min) == pytest.approx(node_acc[mask].min(), rel=1e-6)
    assert float(got.node_acc_max) == pytest.approx(node_acc[mask].max(), rel=1e-6)
    np.testing.assert_allclose(float(got.node_loss_mean), node_loss[mask].mean(), rtol=1e-5)
    want_consensus = float(jg.algorithms.honest_consensus_distance(params, mask))
    np.testing.assert_allclose(float(got.consensus), want_consensus, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(got.bits), np.asarray(state.bits))  # bits: every node

    # Without the hook the same models are averaged over every node, whatever the state holds.
    everyone = all_trainer.evaluate(
        state._replace(comm_state=_StateWithHonestField(state.comm_state, jnp.asarray(mask))), jnp.zeros(())
    )
    np.testing.assert_allclose(float(everyone.node_acc_mean), node_acc.mean(), rtol=1e-6)
    np.testing.assert_allclose(float(everyone.consensus), float(jg.consensus_distance(params)), rtol=1e-5)
    assert float(everyone.consensus) != pytest.approx(want_consensus, rel=1e-3)
    assert float(everyone.node_loss_mean) != pytest.approx(float(got.node_loss_mean), rel=1e-3)


def test_recorded_time_counts_local_steps_as_compute():
    time = {"compute": 1e-3, "latency": 0.0, "bandwidth": 1e18}
    results = {
        h: run_training(tiny_config(local_steps=h, time=time), progress=False, log=lambda m: None) for h in (1, 3)
    }
    rounds = np.asarray(results[1].metrics.round)
    for h, result in results.items():
        np.testing.assert_allclose(result.metrics.sim_time, h * 1e-3 * rounds, rtol=1e-6)
        assert result.rows[-1]["sim_time"] == pytest.approx(h * 1e-3 * 20, rel=1e-6)
    np.testing.assert_array_equal(results[3].metrics.comm_time, results[1].metrics.comm_time)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU choices")
@pytest.mark.parametrize(
    "node_batch,options,expected",
    [
        ("auto", {}, "explicit"),  # conv net on CPU: one node at a time, loop-friendly gradients
        (0, {}, "matmul"),  # one vmap over all nodes: im2col
        (2, {}, "matmul"),
        ("auto", {"conv_impl": "lax"}, "lax"),  # the user's choice is kept
        ("auto", {"conv_impl": "auto"}, "explicit"),
    ],
)
def test_runner_resolves_conv_impl_with_the_node_batching(node_batch, options, expected):
    config = tiny_config(model="cnn", model_options={"features": [4], **options}, node_batch=node_batch)
    assert resolve(config).model.conv_impl == expected
    assert config.model_options.get("conv_impl", "auto") == options.get("conv_impl", "auto")  # config untouched
