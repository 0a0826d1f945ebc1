"""Mixed precision (jaxgossip.ops.precision): the bf16 compute policy over float32 master weights, and
bf16 messages, against NumPy references and the invariants (float32 gradients and optimizer state,
mean / mass kept to bfloat16 rounding, 16 bits per value)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxgossip as jg
from jaxgossip import algorithms, models
from jaxgossip import topology as T
from jaxgossip.models.adapters import linen_model_fns
from jaxgossip.ops import precision

N = 8


def _mlp():
    fns = linen_model_fns(models.make_model("mlp", hidden=(16,), num_classes=3))
    x = jax.random.normal(jax.random.key(0), (5, 4, 4, 1))
    params, stats = fns.init(jax.random.key(1), x)
    return fns, params, stats, x


def test_fp32_is_the_model_itself_and_unknown_precisions_are_refused():
    fns, *_ = _mlp()
    assert precision.mixed_precision(fns, "fp32") is fns
    with pytest.raises(ValueError, match="precision='fp8' is unknown; known: fp32, bf16"):
        precision.mixed_precision(fns, "fp8")
    with pytest.raises(ValueError, match="message_dtype='fp16' is unknown"):
        precision.with_message_dtype(algorithms.make("gossip", T.ring(N)), "fp16")


def test_bf16_policy_computes_in_bf16_and_returns_float32():
    fns, params, stats, x = _mlp()
    bf = precision.mixed_precision(fns, "bf16")
    out, _ = bf.apply(params, stats, x, True)
    assert out.dtype == jnp.float32
    # The matmuls of the pass take bfloat16 operands.
    jaxpr = str(jax.make_jaxpr(lambda p: bf.apply(p, stats, x, True))(params))
    assert "dot_general" in jaxpr and "bf16[5,16]" in jaxpr
    # A NumPy forward pass on bfloat16-rounded weights and inputs, float32 arithmetic, gives the
    # same logits to bfloat16 rounding of the hidden layer.
    p = jax.tree_util.tree_map(lambda a: np.asarray(a.astype(jnp.bfloat16)).astype(np.float32), params)
    leaves = p["params"] if "params" in p else p
    (dense0, dense1) = (leaves[k] for k in sorted(leaves))
    h = np.asarray(x.astype(jnp.bfloat16)).astype(np.float32).reshape(5, -1) @ dense0["kernel"] + dense0["bias"]
    h = np.maximum(h, 0).astype(ml_dtypes.bfloat16).astype(np.float32)
    want = h @ dense1["kernel"] + dense1["bias"]
    np.testing.assert_allclose(np.asarray(out), want, rtol=2e-2, atol=2e-2)
    ref, _ = fns.apply(params, stats, x, True)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=5e-2, atol=5e-2)


def test_bf16_gradients_reach_the_float32_master_weights():
    fns, params, stats, x = _mlp()
    bf = precision.mixed_precision(fns, "bf16")
    y = jnp.array([0, 1, 2, 0, 1])

    def loss(model, p):
        out, _ = model.apply(p, stats, x, True)
        return jnp.mean(jax.nn.logsumexp(out, -1) - jnp.take_along_axis(out, y[:, None], 1)[:, 0])

    g_bf = jax.grad(lambda p: loss(bf, p))(params)
    g_32 = jax.grad(lambda p: loss(fns, p))(params)
    for a, b in zip(jax.tree_util.tree_leaves(g_bf), jax.tree_util.tree_leaves(g_32)):
        assert a.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0.1, atol=2e-2)


def test_batch_norm_statistics_stay_float32():
    fns = linen_model_fns(models.make_model("resnet20", width=4, conv_impl="lax"))
    x = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))
    params, stats = fns.init(jax.random.key(1), x)
    out, new_stats = precision.mixed_precision(fns, "bf16").apply(params, stats, x, True)
    assert out.dtype == jnp.float32
    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(new_stats)} == {jnp.dtype(jnp.float32)}
    assert jax.tree_util.tree_structure(new_stats) == jax.tree_util.tree_structure(stats)


MODEL_CASES = {
    "mlp": ({"hidden": (8,)}, (2, 8, 8, 1)),
    "cnn": ({"conv_impl": "lax"}, (2, 8, 8, 1)),
    "resnet20": ({"width": 4, "conv_impl": "lax"}, (2, 8, 8, 3)),
    "resnet110": ({"width": 2, "conv_impl": "lax"}, (2, 8, 8, 3)),
    "vgg11": ({"conv_impl": "lax"}, (2, 32, 32, 3)),
    "vgg16": ({"conv_impl": "lax"}, (2, 32, 32, 3)),
    "transformer": ({"depth": 1, "width": 32, "heads": 2, "context": 16}, (2, 16)),
}
SLOW_MODELS = ("resnet110", "vgg16")


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_MODELS else n for n in sorted(models.REGISTRY)]
)
def test_the_bf16_policy_holds_for_every_registered_model(name):
    options, shape = MODEL_CASES[name]
    fns = linen_model_fns(models.make_model(name, **options))
    x = jnp.zeros(shape, jnp.int32) if len(shape) == 2 else jax.random.normal(jax.random.key(0), shape)
    params, stats = fns.init(jax.random.key(1), x)
    bf = precision.mixed_precision(fns, "bf16")
    got, new_stats = bf.apply(params, stats, x, True)
    assert got.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(got)))
    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(new_stats)} <= {jnp.dtype(jnp.float32)}
    # bfloat16 keeps 8 significant bits: logits agree to a few per cent of their scale. (Compared
    # in evaluation mode: batch statistics of 2 samples in an untrained 110-layer net amplify any
    # rounding differences.)
    want, _ = fns.apply(params, stats, x, False)
    got, _ = bf.apply(params, stats, x, False)
    assert float(jnp.max(jnp.abs(got - want))) <= 0.05 * float(jnp.max(jnp.abs(want))) + 1e-3


def _bf16(a):
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def test_bf16_gossip_matches_numpy_and_sends_half_the_bits():
    topo = T.ring(N)
    w = np.asarray(topo.matrix(0), np.float32)
    x = np.asarray(jax.random.normal(jax.random.key(2), (N, 6)), np.float32)
    base = algorithms.make("gossip", topo)
    alg = precision.with_message_dtype(base, "bf16")
    new, _, info = alg.step(jnp.asarray(x), alg.init(jnp.asarray(x)), jax.random.key(0))
    _, _, info32 = base.step(jnp.asarray(x), base.init(jnp.asarray(x)), jax.random.key(0))
    q = _bf16(x)
    want = x + (w @ q - q)  # the round on the bfloat16 messages, in exact arithmetic
    assert new.dtype == jnp.float32
    # The round's own arithmetic is bfloat16 (as a bf16 all-reduce or gossip sum is): the mixed sum
    # and the relaxation x + gamma (mixed - x) are each rounded to 8 significant bits, so every
    # entry is within two bfloat16 units in the last place of the mixed value.
    scale = np.maximum(np.abs(w @ q), np.abs(q))  # the difference x_j - x_i can cancel
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(scale, 1e-30))) - 7)
    assert np.all(np.abs(np.asarray(new) - want) <= 2 * ulp + 1e-7)
    # One round keeps the mean to that rounding.
    assert np.all(np.abs(np.asarray(new).mean(0) - x.mean(0)) <= 2 * ulp.max(0))
    # ... and the messages are rounded: the float32 round differs by more than float32 rounding.
    exact32, _, _ = base.step(jnp.asarray(x), base.init(jnp.asarray(x)), jax.random.key(0))
    assert np.max(np.abs(np.asarray(new) - np.asarray(exact32))) > 1e-4
    np.testing.assert_array_equal(np.asarray(info.bits) * 2, np.asarray(info32.bits))


@pytest.mark.parametrize(
    "name, options, graph",
    [
        ("gossip", {}, T.ring(N)),
        ("push_sum", {}, T.one_peer_exponential(N)),
        ("choco", {"compressor": "top_k", "compressor_options": {"fraction": 0.5}, "gamma": 0.5}, T.ring(N)),
        ("power_gossip", {}, T.ring(N)),
        ("sparse_push", {"fraction": 0.5, "gamma": 1.0}, T.one_peer_exponential(N)),
        ("gradient_tracking", {}, T.ring(N)),
        ("d2", {"gamma": 0.5}, T.ring(N)),
    ],
)
def test_bf16_messages_reach_consensus_keep_the_mean_and_cost_less(name, options, graph):
    x = jax.random.normal(jax.random.key(3), (N, 4, 8))
    base = algorithms.make(name, graph, **options)
    alg = precision.with_message_dtype(base, "bf16")
    res = jg.run_consensus(alg, x, 30, jax.random.key(4))
    ref = jg.run_consensus(base, x, 30, jax.random.key(4))
    assert np.all(np.isfinite(res.x)) and res.error[-1] < 0.05 * res.error[0]
    if algorithms.info(name).graph.mixing == "column_stochastic":
        kept = np.sum(np.asarray(res.x), 0), np.sum(np.asarray(x), 0)
    else:
        kept = np.mean(np.asarray(res.x), 0), np.mean(np.asarray(x), 0)
    # bfloat16 has 8 significant bits: the mean (mass) is kept to that rounding, not exactly; its
    # drift is at most one rounding (2^-8 of the largest value, per node for a sum) per round.
    bound = 30 * 2.0**-8 * float(np.abs(x).max()) * (N if algorithms.info(name).graph.mixing == "column_stochastic" else 1)
    assert np.abs(kept[0] - kept[1]).max() <= bound
    # 16 bits per value: half the bits of a float32 message, a little more where indices or the
    # push-sum weight are part of it.
    assert 0.5 <= float(res.bits[-1] / ref.bits[-1]) < 0.6


def test_bf16_training_keeps_float32_state_halves_the_bits_and_learns(tmp_path):
    from tiny import tiny_config

    from jaxgossip.run.runner import run_training

    runs = {}
    for prec in ("fp32", "bf16"):
        config = tiny_config(precision=prec, message_dtype=prec, num_rounds=40, eval_every=20)
        runs[prec] = run_training(config, progress=False, log=lambda m: None)
    bf, fp = runs["bf16"], runs["fp32"]
    for tree in (bf.state.params, bf.state.opt_state):
        floats = {leaf.dtype for leaf in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(leaf.dtype, jnp.floating)}
        assert floats == {jnp.dtype(jnp.float32)}
    np.testing.assert_allclose(np.asarray(bf.state.bits) * 2, np.asarray(fp.state.bits), rtol=1e-6)
    acc_bf, acc_fp = bf.rows[-1]["test_acc"], fp.rows[-1]["test_acc"]
    assert acc_bf > 0.5 and abs(acc_bf - acc_fp) < 0.15, (acc_bf, acc_fp)
    # ... and it is a different run: the pass and the messages were rounded.
    assert bf.rows[-1]["train_loss"] != fp.rows[-1]["train_loss"]


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--precision=fp8", "unknown precision 'fp8'"),
        ("--message_dtype=int8", "unknown message_dtype 'int8'"),
    ],
)
def test_cli_refuses_unknown_precisions_before_training(flag, message, capsys, tmp_path):
    from tiny import TINY_FLAGS

    from jaxgossip.cli import main

    code = main(["train", "--no-progress", *TINY_FLAGS, flag, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "run" / "metrics.json").exists()
