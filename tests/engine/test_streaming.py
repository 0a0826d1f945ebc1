"""Streaming DiLoCo (jaxgossip.engine.streaming): fragments synchronised at staggered inner steps
with overlap, against a NumPy per-node loop on a quadratic; one fragment without overlap bitwise
DiLoCo through the trainer; the round plan; the fragments by layer; bad input on the CLI."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import one_line_error
from tiny import TINY_FLAGS, tiny_config

from jaxgossip import algorithms, topology
from jaxgossip.cli import main
from jaxgossip.engine import outer, streaming
from jaxgossip.run import runner

N, LR, MU, INNER_LR = 4, 0.7, 0.9, 0.1
#: a model of three layers (the last with a kernel and a bias), node-stacked: layer -> leaf widths
LAYERS = {"a": {"w": 2}, "b": {"w": 1}, "c": {"bias": 1, "kernel": 3}}


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    params = {k: {n: rng.normal(size=(N, d)).astype(np.float32) for n, d in v.items()} for k, v in LAYERS.items()}
    targets = jax.tree_util.tree_map(lambda a: rng.normal(size=a.shape).astype(np.float32), params)
    return params, targets


def _jax_streaming(alg_name, message, h, spec, rounds, seed=0):
    """``rounds`` rounds of :func:`streaming.stream_round` with H gradient steps on
    f_i(x) = 0.5 ||x - b_i||^2 per round; returns the models after each round as flat [R, N, D]."""
    params, targets = _problem(seed)
    alg = algorithms.make(alg_name, topology.make("ring", N))
    tx = outer.make_outer_optimizer("nesterov", LR, MU)
    fragments = streaming.make_fragments(params, spec.fragments)
    events = streaming.round_events(h, spec)
    view = streaming.fragmented(alg, fragments)
    x = jax.tree_util.tree_map(jnp.asarray, params)
    states, stream = view.init(x), streaming.stream_init(tx, fragments, x)

    def inner(y, start, stop):
        for _ in range(stop - start):
            y = jax.tree_util.tree_map(lambda p, b: p - INNER_LR * (p - b), y, targets)
        return y

    out = []
    for r in range(rounds):
        x, states, stream, _ = streaming.stream_round(
            alg, tx, message, spec, fragments, events, inner, x, lambda c: c, lambda c, y: y, states, stream,
            jax.random.fold_in(jax.random.key(0), r),
        )
        out.append(np.concatenate([np.asarray(a) for a in jax.tree_util.tree_leaves(x)], axis=1))
    return np.stack(out)


def _numpy_streaming(w, message, h, f, tau, alpha, rounds, seed=0):
    """The per-node reference of the module docstring, step by step over the whole run: layers
    dealt into fragments by index mod F, fragment k launched at steps with t = L_k (mod H), its
    outer result merged tau steps later."""
    params, targets = _problem(seed)
    layer_of_leaf, leaves, goals = [], [], []
    for layer, (name, sub) in enumerate(params.items()):
        for leaf in sorted(sub):  # the flatten order of a dict
            layer_of_leaf.append(layer)
            leaves.append(params[name][leaf].astype(np.float64))
            goals.append(targets[name][leaf].astype(np.float64))
    cols = np.cumsum([0] + [a.shape[1] for a in leaves])
    frag_cols = [
        np.concatenate([np.arange(cols[i], cols[i + 1]) for i, lay in enumerate(layer_of_leaf) if lay % f == k])
        for k in range(f)
    ]
    y, b = np.concatenate(leaves, axis=1), np.concatenate(goals, axis=1)
    anchor, momentum, pending = y.copy(), np.zeros_like(y), {}
    launch = [((k + 1) * h) // f for k in range(f)]
    out = []
    for t in range(1, rounds * h + 1):
        for i in range(N):  # one inner step per node
            y[i] = y[i] - INNER_LR * (y[i] - b[i])
        for k in range(f):
            c = frag_cols[k]
            if (t - launch[k]) % h == 0:
                if message == "model":
                    z = w @ y[:, c]
                    delta = anchor[:, c] - z
                else:
                    delta = w @ (anchor[:, c] - y[:, c])
                for i in range(N):
                    momentum[i, c] = MU * momentum[i, c] + delta[i]
                    anchor[i, c] = anchor[i, c] - LR * (delta[i] + MU * momentum[i, c])
                pending[k] = (t + tau, anchor[:, c].copy())
            if k in pending and pending[k][0] == t:
                y[:, c] = alpha * y[:, c] + (1 - alpha) * pending.pop(k)[1]
        if t % h == 0:
            out.append(y.copy())
    return np.stack(out)


@pytest.mark.parametrize("message", outer.OUTER_MESSAGES)
@pytest.mark.parametrize(
    "h, f, tau, alpha", [(1, 1, 0, 0.0), (3, 1, 2, 0.5), (4, 2, 0, 0.0), (4, 2, 1, 0.5), (6, 3, 2, 0.25), (5, 2, 4, 0.5)]
)
def test_fragments_and_overlap_match_numpy_on_a_quadratic(message, h, f, tau, alpha):
    rounds = 5
    w = np.asarray(topology.make("ring", N).matrix(0), np.float64)
    got = _jax_streaming("gossip", message, h, streaming.Streaming(f, tau, alpha), rounds)
    want = _numpy_streaming(w, message, h, f, tau, alpha, rounds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_round_plan_launches_every_fragment_once_and_merges_it_tau_steps_later():
    for h, f, tau in [(1, 1, 0), (4, 2, 1), (6, 3, 2), (5, 2, 4), (8, 4, 7)]:
        events = streaming.round_events(h, streaming.Streaming(f, tau, 0.0))
        assert events.steps[-1] == h and list(events.steps) == sorted(set(events.steps))
        launched = {k: s for s, ks in zip(events.steps, events.launches) for k in ks}
        merged = {k: s for s, ks in zip(events.steps, events.merges) for k in ks}
        assert sorted(launched) == sorted(merged) == list(range(f))
        for k in range(f):
            assert launched[k] == ((k + 1) * h) // f
            assert (merged[k] - launched[k]) % h == tau % h


def test_fragments_deal_layers_strided_and_keep_a_layers_leaves_together():
    params, _ = _problem()
    frags = streaming.make_fragments(params, 2)
    assert frags.of_leaf == (0, 1, 0, 0)  # a.w | b.w | c.bias, c.kernel
    parts = frags.split(params)
    assert [len(p) for p in parts] == [3, 1]
    back = frags.join(params, parts)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(params)
    with pytest.raises(ValueError, match="outer_fragments=4 is more than the model's 3 layers"):
        streaming.make_fragments(params, 4)


def test_one_fragment_without_overlap_runs_diloco_bitwise():
    """outer_fragments=1, outer_overlap=0 spelled out is DiLoCo's run, bit for bit."""
    config = tiny_config(local_steps=2, outer_optimizer="nesterov", outer_lr=0.5, num_rounds=10)
    assert runner.streaming_of(config.replace(outer_fragments=1, outer_overlap=0, outer_mix=0.5)) is None
    plain, _ = runner.build(config).trainer.train(jax.random.key(0))
    spelled, _ = runner.build(config.replace(outer_fragments=1, outer_overlap=0)).trainer.train(jax.random.key(0))
    for a, b in zip(jax.tree_util.tree_leaves(plain.params), jax.tree_util.tree_leaves(spelled.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


TIME = {"compute": "stragglers:0.01,0.25,4", "bandwidth": 1e6, "latency": 1e-3}


@pytest.mark.parametrize(
    "alg_name, h, time",
    [("gossip", 1, None), ("gossip", 3, TIME), ("power_gossip", 3, None), ("push_sum", 1, TIME), ("choco", 3, None)],
)
def test_the_streaming_round_with_one_fragment_is_diloco(alg_name, h, time, monkeypatch):
    """The streaming round with F = 1, tau = 0 (forced through the trainer) against DiLoCo's: the
    same iterates, bits and clock (to float rounding: the two are different compiled programs)."""
    config = tiny_config(algorithm=alg_name, local_steps=h, outer_optimizer="nesterov", outer_lr=0.5, num_rounds=10)
    if time:
        config = config.replace(time=time)
    if alg_name == "choco":
        config = config.replace(algorithm_options={"compressor": "top_k", "compressor_options": {"fraction": 0.3}})
    plain, plain_metrics = runner.build(config).trainer.train(jax.random.key(0))
    monkeypatch.setattr(runner, "streaming_of", lambda c: streaming.Streaming(1, 0, 0.0))
    streamed, streamed_metrics = runner.build(config).trainer.train(jax.random.key(0))
    for a, b in zip(jax.tree_util.tree_leaves(plain.params), jax.tree_util.tree_leaves(streamed.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(plain_metrics.bits), np.asarray(streamed_metrics.bits))
    np.testing.assert_allclose(np.asarray(plain_metrics.test_loss), np.asarray(streamed_metrics.test_loss), rtol=1e-5)
    if time:
        np.testing.assert_allclose(np.asarray(plain_metrics.sim_time), np.asarray(streamed_metrics.sim_time), rtol=1e-6)


def test_overlap_hides_communication_on_a_slow_link():
    """At 1 Mbit/s a round's messages take longer than its inner steps: fragments in flight behind
    the next steps make the run's simulated time shorter than DiLoCo's at the same bits."""
    base = dict(local_steps=4, outer_optimizer="nesterov", outer_lr=0.5, num_rounds=10, time=TIME)
    _, diloco = runner.build(tiny_config(**base)).trainer.train(jax.random.key(0))
    _, streamed = runner.build(tiny_config(**base, outer_fragments=2, outer_overlap=3)).trainer.train(jax.random.key(0))
    np.testing.assert_allclose(np.asarray(streamed.bits), np.asarray(diloco.bits))
    assert float(streamed.sim_time[-1]) < 0.9 * float(diloco.sim_time[-1])


def test_streaming_trains_and_sends_the_model_once_per_round(tmp_path):
    """Two fragments with overlap send as many bits per round as DiLoCo (the model once, in two
    messages) and learn the tiny task."""
    base = dict(local_steps=4, outer_optimizer="nesterov", outer_lr=0.5, num_rounds=20, algorithm="allreduce")
    _, diloco = runner.build(tiny_config(**base)).trainer.train(jax.random.key(0))
    config = tiny_config(**base, outer_fragments=2, outer_overlap=1, outer_mix=0.5)
    _, streamed = runner.build(config).trainer.train(jax.random.key(0))
    np.testing.assert_allclose(np.asarray(streamed.bits), np.asarray(diloco.bits))
    assert float(streamed.test_acc[-1]) > 0.8


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--outer_fragments=0"], "outer_fragments=0 must be an int >= 1"),
        (["--outer_fragments=3"], "outer_fragments=3 must be <= local_steps=2"),
        (["--outer_fragments=2.5"], "outer_fragments"),
        (["--outer_overlap=2"], "outer_overlap=2 must be an int in [0, local_steps) = [0, 2)"),
        (["--outer_overlap=-1"], "outer_overlap=-1 must be an int >= 0"),
        (["--outer_mix=1.5"], "outer_mix=1.5 must be in [0, 1]"),
        (["--local_steps=4", "--outer_fragments=3"], "outer_fragments=3 is more than the model's 2 layers"),
        (["--outer_optimizer=none"], "Streaming DiLoCo synchronises fragments with an outer step"),
    ],
)
def test_cli_bad_streaming_options_exit_2(flags, words, tmp_path, capsys):
    argv = ["train", *TINY_FLAGS, "--local_steps=2", "--outer_optimizer=nesterov", "--outer_fragments=2", *flags]
    if "--outer_optimizer=none" in flags:
        argv.remove("--outer_optimizer=nesterov")
    assert main([*argv, "--out", str(tmp_path / "run")]) == 2
    assert words in one_line_error(capsys)
