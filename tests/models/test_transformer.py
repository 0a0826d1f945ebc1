"""The transformer language model: a NumPy forward reference (causal mask included), causality,
training on python_docs split by source with gossip and every registered algorithm, perplexity in
the rows, the cosine schedule, and bad input on the command line (exit 2 before any training)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxgossip as jg
from jaxgossip import data, models
from jaxgossip.cli import main
from jaxgossip.engine import training
from jaxgossip.run import runner
from jaxgossip.run.resolve import check_train_config, load_data, make_schedule, resolve
from jaxgossip.run.runner import TrainConfig, run_training
from jaxgossip.run.validate import with_trainer_options


def np_causal_mask(length):
    return np.array([[s <= t for s in range(length)] for t in range(length)])


def test_causal_mask_is_lower_triangular():
    for length in (1, 2, 7):
        np.testing.assert_array_equal(np.asarray(models.causal_mask(length)), np_causal_mask(length))


def _np_layer_norm(x, p):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * p["scale"] + p["bias"]


def _np_dense(x, p):
    return x @ p["kernel"] + p["bias"]


def _np_rotary(x):
    _, length, _, dim = x.shape
    half = dim // 2
    out = np.empty_like(x)
    for t in range(length):
        for i in range(half):
            angle = t * 10000.0 ** (-2.0 * i / dim)
            a, b = x[:, t, :, i], x[:, t, :, i + half]
            out[:, t, :, i] = a * np.cos(angle) - b * np.sin(angle)
            out[:, t, :, i + half] = a * np.sin(angle) + b * np.cos(angle)
    return out


def np_transformer(params, tokens, heads, positions):
    """The model of jaxgossip.models.transformer in NumPy (float64), one position at a time in the
    attention so that the mask is the explicit rule 'key s <= query t'."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    h = p["embed"]["embedding"][tokens]
    b, t, w = h.shape
    d = w // heads
    if positions == "learned":
        h = h + p["positions"][:t]
    for name in sorted(k for k in p if k.startswith("block")):
        blk = p[name]
        qkv = _np_dense(_np_layer_norm(h, blk["norm1"]), blk["qkv"])
        q, k, v = (qkv[..., i * w : (i + 1) * w].reshape(b, t, heads, d) for i in range(3))
        if positions == "rotary":
            q, k = _np_rotary(q), _np_rotary(k)
        att = np.zeros((b, t, heads, d))
        for query in range(t):
            keys = np.arange(query + 1)  # causal: keys s <= query only
            scores = np.einsum("bhd,bshd->bhs", q[:, query], k[:, keys]) / math.sqrt(d)
            weights = np.exp(scores - scores.max(-1, keepdims=True))
            weights /= weights.sum(-1, keepdims=True)
            att[:, query] = np.einsum("bhs,bshd->bhd", weights, v[:, keys])
        h = h + _np_dense(att.reshape(b, t, w), blk["out"])
        m = _np_dense(_np_layer_norm(h, blk["norm2"]), blk["fc1"])
        m = 0.5 * m * (1 + np.tanh(math.sqrt(2 / math.pi) * (m + 0.044715 * m**3)))  # flax's gelu (tanh form)
        h = h + _np_dense(m, blk["fc2"])
    return _np_dense(_np_layer_norm(h, p["norm_final"]), p["head"])


@pytest.mark.parametrize("positions, length", [("learned", 8), ("rotary", 5), ("learned", 5)])
def test_forward_matches_numpy_reference(positions, length):
    model = models.Transformer(vocab=11, context=8, depth=2, width=16, heads=4, positions=positions)
    tokens = np.random.default_rng(0).integers(0, 11, size=(3, length)).astype(np.int32)
    params = jax.jit(model.init)(jax.random.key(1), jnp.asarray(tokens))["params"]
    # Random (not zero) biases and norm parameters, so that every term of the reference is exercised.
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.key(2), len(leaves))
    params = tree.unflatten([a + 0.1 * jax.random.normal(k, a.shape) for a, k in zip(leaves, keys)])
    got = np.asarray(jax.jit(model.apply)({"params": params}, jnp.asarray(tokens)))
    assert got.shape == (3, length, 11)
    np.testing.assert_allclose(got, np_transformer(params, tokens, 4, positions), rtol=2e-4, atol=2e-4)
    assert ("positions" in params) == (positions == "learned")


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_logits_at_t_depend_on_tokens_up_to_t_only(positions):
    model = models.Transformer(vocab=20, context=12, depth=2, width=16, heads=2, positions=positions)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 20, size=(2, 12)).astype(np.int32)
    variables = jax.jit(model.init)(jax.random.key(0), jnp.asarray(tokens))
    apply = jax.jit(model.apply)
    base = np.asarray(apply(variables, jnp.asarray(tokens)))
    for t in (0, 5, 10):
        changed = tokens.copy()
        changed[:, t + 1 :] = rng.integers(0, 20, size=changed[:, t + 1 :].shape)
        changed[:, t + 1 :] = (changed[:, t + 1 :] + 1) % 20  # surely different
        out = np.asarray(apply(variables, jnp.asarray(changed)))
        np.testing.assert_allclose(out[:, : t + 1], base[:, : t + 1], rtol=1e-5, atol=1e-6)
        assert np.abs(out[:, t + 1 :] - base[:, t + 1 :]).max() > 1e-4


def test_model_bad_input():
    with pytest.raises(ValueError, match="heads=3 must divide width=32"):
        models.Transformer(width=32, heads=3)
    with pytest.raises(ValueError, match="even head size"):
        models.Transformer(width=12, heads=4, positions="rotary")
    with pytest.raises(ValueError, match="positions='sinusoidal'"):
        models.Transformer(positions="sinusoidal")
    with pytest.raises(ValueError, match="depth=0"):
        models.make_model("transformer", depth=0)
    with pytest.raises(ValueError, match="vocab=100 is smaller than the data's vocabulary of 256"):
        models.make_model("transformer", num_classes=256, vocab=100)
    with pytest.raises(ValueError, match="dropout=0.1: the trainer"):
        models.make_model("transformer", dropout=0.1)
    model = models.Transformer(context=4, width=8, heads=2)
    with pytest.raises(ValueError, match="longer than context=4"):
        model.init(jax.random.key(0), jnp.zeros((1, 5), jnp.int32))
    with pytest.raises(ValueError, match="integer tokens"):
        model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.float32))
    assert models.is_sequence_model("transformer") and not models.is_sequence_model("cnn")


def lm_config(**changes):
    """4 nodes, python_docs split by source, a 1-block transformer, AdamW with warm-up + cosine."""
    base = TrainConfig(
        dataset="python_docs",
        partition="by_source",
        num_nodes=4,
        topology="ring",
        algorithm="gossip",
        model="transformer",
        model_options={"depth": 1, "width": 32, "heads": 2, "context": 16},
        optimizer="adamw",
        lr=3e-3,
        weight_decay=0.01,
        warmup_rounds=3,
        lr_schedule="cosine",
        final_lr=3e-4,
        grad_clip=1.0,
        batch_size=8,
        num_rounds=20,
        eval_every=10,
        eval_size=128,
        eval_chunk=64,
    )
    return base.replace(**changes)


@pytest.mark.slow
def test_transformer_learns_python_docs_split_by_source_through_the_runner():
    config = lm_config(num_rounds=60, eval_every=20, evals_per_chunk=3)
    result = run_training(config, progress=False, log=lambda message: None)
    rows = result.rows
    assert [r["round"] for r in rows] == [20, 40, 60]
    losses = [r["test_loss"] for r in rows]
    assert losses[-1] < losses[0] < math.log(256), losses  # below the uniform guess, and falling
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    for r in rows:
        assert r["perplexity"] == pytest.approx(math.exp(r["test_loss"]), rel=1e-12)
        assert r["node_perplexity"] == pytest.approx(math.exp(r["node_loss_mean"]), rel=1e-12)
        assert 0.0 < r["test_acc"] < 1.0  # a mean over tokens, not over windows
    assert rows[-1]["perplexity"] < 40  # the uniform guess is 256
    # Every node holds whole topics: the per-node source histogram has one owner per source.
    assert (np.count_nonzero(result.built.histograms, axis=0) == 1).all()
    assert "python_docs" in result.built.dataset.source


def test_eval_loss_and_accuracy_are_per_token_means():
    prep = resolve(lm_config(num_rounds=10, eval_every=10))
    trainer, _ = runner.make_trainer(prep.config, prep)
    state = jax.jit(trainer.init)(jax.random.key(0))
    point = jax.jit(trainer.evaluate)(state, jnp.float32(0.0))
    x, y = prep.dataset.x_test[:128], prep.dataset.y_test[:128]
    params = jax.tree_util.tree_map(lambda a: a[0], state.params)  # identical init: every node alike
    logits = jax.jit(prep.model.apply)({"params": params}, jnp.asarray(x))
    logp = jax.nn.log_softmax(np.asarray(logits, np.float64), -1)
    nll = -np.take_along_axis(np.asarray(logp), y[..., None], -1).mean()
    acc = (np.argmax(np.asarray(logits), -1) == y).mean()
    np.testing.assert_allclose(float(point.test_loss), nll, rtol=1e-5)
    np.testing.assert_allclose(float(point.test_acc), acc, rtol=1e-6)


PUSH = ("push_sum", "sparse_push", "scsp")
OPTIONS = {
    "choco": {"compressor": "top_k", "compressor_options": {"fraction": 0.01}, "gamma": 0.5},
    "deepsqueeze": {"compressor": "top_k", "compressor_options": {"fraction": 0.1}, "gamma": 0.2},
    "sparse_push": {"fraction": 0.1, "gamma": 0.5},
    "scsp": {"fraction": 0.1, "gamma": 0.5},
    "power_gossip": {"rank": 1},
    "d2": {"gamma": 0.5},
    "qgm": {"lr": 3e-3},
    "demo_momentum": {"lr": 3e-3},
    "moniqua": {"theta": 1.0, "gamma": 0.5},
}
FAST = ("gossip", "power_gossip")  # the others (choco's fused top-k, push-sum, ...) with --slow


@pytest.mark.parametrize(
    "alg_name",
    [a if a in FAST else pytest.param(a, marks=pytest.mark.slow) for a in sorted(jg.algorithms.REGISTRY)],
)
def test_every_algorithm_trains_the_transformer_on_python_docs_by_source(alg_name):
    topo = jg.topology.one_peer_exponential(4) if alg_name in PUSH else jg.topology.ring(4)
    if jg.algorithms.info(alg_name).graph.tree:  # RelaySum needs a tree (metadata tree=True)
        topo = jg.topology.chain(4)
    alg = jg.algorithms.make(alg_name, topo, **with_trainer_options(alg_name, OPTIONS.get(alg_name, {})))
    ds = data.load_dataset("python_docs", context=16)
    parts = data.partition(data.partition_labels(ds)[0], 4, "by_source")
    model = models.make_model("transformer", num_classes=ds.num_classes, depth=1, width=16, heads=2, context=16)

    trainer = training.make_train(
        model,
        alg,
        data.shard_dataset(ds, parts),
        (ds.x_test[:64], ds.y_test[:64]),
        optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(3e-3)),
        num_rounds=20,
        batch_size=8,
        eval_every=10,
        eval_chunk=64,
    )
    _, metrics = jax.jit(trainer.train)(jax.random.key(0))
    loss = np.asarray(metrics.test_loss)
    assert np.all(np.isfinite(loss)) and loss[-1] < loss[0] < math.log(256), (alg_name, loss)
    assert np.asarray(metrics.train_loss)[-1] < np.asarray(metrics.train_loss)[0]
    assert np.all(np.diff(np.asarray(metrics.bits), axis=0) > 0)


def test_rows_and_plots_carry_perplexities_of_next_token_models_only(tmp_path):
    metrics = training.Metrics(
        *[np.array([v, v / 2]) for v in (10.0, 3.0, 2.0, 0.3, 0.3, 0.2, 0.4, 2.5, 1e-3)],
        bits=np.ones((2, 4)),
        model_sq_norm=np.ones(2),
    )
    rows = runner.metrics_to_rows(metrics, perplexity=True)
    assert [r["perplexity"] for r in rows] == [math.exp(2.0), math.exp(1.0)]
    assert [r["node_perplexity"] for r in rows] == [math.exp(2.5), math.exp(1.25)]
    assert "perplexity" not in runner.metrics_to_rows(metrics)[0]
    from jaxgossip.run import plots

    written = [p.rsplit("/", 1)[1] for p in plots.plot_training({"lm": rows}, str(tmp_path / "lm"))]
    assert {"perplexity_vs_rounds.png", "perplexity_vs_bits.png"} <= set(written)
    written = [p.rsplit("/", 1)[1] for p in plots.plot_training({"cnn": runner.metrics_to_rows(metrics)}, str(tmp_path))]
    assert not any(name.startswith("perplexity") for name in written)


def test_cosine_schedule_follows_the_formula():
    config = lm_config(num_rounds=30, warmup_rounds=5, warmup_from=0.0, lr=1e-2, final_lr=1e-3)
    schedule = make_schedule(config)
    for r in (0, 2, 5, 10, 20, 29, 30, 40):
        if r < 5:
            want = 1e-2 * r / 5
        else:
            progress = min(r - 5, 25) / 25
            want = 1e-3 + (1e-2 - 1e-3) * 0.5 * (1 + math.cos(math.pi * progress))
        assert float(schedule(r)) == pytest.approx(want, rel=1e-5, abs=1e-9), r
    # With H local steps the schedule still counts rounds.
    per_round = make_schedule(config.replace(local_steps=4))
    assert float(per_round(4 * 12 + 3)) == pytest.approx(float(schedule(12)), rel=1e-6)


def _cli(capsys, *argv):
    code = main(["train", "--no-progress", *argv])
    return code, capsys.readouterr().err


LM_FLAGS = ["--dataset=python_docs", "--model=transformer", "--num_nodes=4", "--num_rounds=10", "--eval_every=10"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--model_options.depht=2"], "model_options.depht: model 'transformer' has no attribute 'depht'"),
        (["--model_options.width=30", "--model_options.heads=4"], "heads=4 must divide width=30"),
        (["--model_options.context=40000"], "context=40000 is larger than python_docs allows"),
        (["--model_options.positions=alibi"], "positions='alibi'"),
        (["--lr_schedule=linear"], "unknown lr_schedule 'linear'"),
        (["--lr_schedule=cosine", "--final_lr=1.0", "--lr=0.1"], "final_lr=1.0 must be <= lr=0.1"),
        (["--lr_schedule=cosine", "--decay_rounds=5"], "decay_rounds"),
        (["--final_lr=0.01"], "final_lr=0.01 applies to lr_schedule=cosine only"),
        (["--partition=by_source:3"], "by_source takes no parameter"),
        (["--num_nodes=100", "--partition=by_source", "--topology=complete"], "79 sources cannot give each"),
        (["--model=cnn"], "model='cnn' with dataset='python_docs'"),
        (["--dataset=digits"], "model='transformer' with dataset='digits'"),
        (["--dataset=text:/no/such/folder"], "no file or folder '/no/such/folder'"),
    ],
)
def test_cli_bad_input_exits_2_before_training(flags, message, capsys, tmp_path):
    code, err = _cli(capsys, *LM_FLAGS, *flags, "--out", str(tmp_path / "run"))
    assert code == 2, err
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "metrics.json").exists()  # nothing trained


@pytest.mark.slow
def test_documented_language_model_command_trains(capsys, tmp_path):
    import json
    import os
    import re
    import shlex

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    text = open(os.path.join(root, "docs", "usage.md")).read()
    line = re.search(r"^jaxgossip (train --dataset=python_docs .*)$", text, re.M).group(1)
    argv = [a for a in shlex.split(line) if not a.startswith("runs/")]
    argv = argv[: argv.index("--out")] + ["--out", str(tmp_path / "lm"), "--no-progress"]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "ppl(avg)" in out
    rows = json.load(open(tmp_path / "lm" / "metrics.json"))["rows"]
    assert rows[-1]["test_loss"] < rows[0]["test_loss"] and rows[-1]["perplexity"] < rows[0]["perplexity"]


def test_every_command_loads_text_in_the_models_context():
    config = check_train_config(lm_config())  # context 16
    for dataset in (load_data(config), resolve(config).dataset):
        assert dataset.x_train.shape[1:] == dataset.x_test.shape[1:] == (16,)


@pytest.mark.slow
def test_language_model_resumes_bitwise(tmp_path):
    from pydoc_data import topics

    folder = tmp_path / "text"
    folder.mkdir()
    for name in ("compound", "specialnames", "types"):
        (folder / f"{name}.txt").write_text(topics.topics[name], encoding="utf-8")
    config = lm_config(
        dataset=f"text:{folder}",
        num_nodes=3,
        topology="complete",
        algorithm="power_gossip",
        algorithm_options={"rank": 2},
        model_options={"depth": 1, "width": 32, "heads": 2, "context": 32, "positions": "rotary"},
        num_rounds=40,
        eval_every=10,
    )
    quiet = {"progress": False, "log": lambda message: None}
    whole = run_training(config, str(tmp_path / "a"), **quiet)
    run_training(config, str(tmp_path / "b"), stop_after_chunks=2, **quiet)
    resumed = run_training(config, str(tmp_path / "b"), **quiet)
    assert resumed.start_round == 20
    keys = ("round", "test_loss", "perplexity", "node_perplexity", "consensus", "bits_mean")
    assert [[r[k] for k in keys] for r in resumed.rows] == [[r[k] for k in keys] for r in whole.rows]
    for a, b in zip(jax.tree_util.tree_leaves(whole.state.params), jax.tree_util.tree_leaves(resumed.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
