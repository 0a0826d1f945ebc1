"""Quantised outer gradients (jaxgossip.ops.quantize, ``--outer_message_bits``): the quantiser against a
NumPy (ml_dtypes) reference and its round-to-nearest error bound, the wrapped round against a
per-node loop, the repriced bits, B = 32 bitwise today's run, DiLoCo and Streaming DiLoCo at 4 bits
end to end (training, resume), and the refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tiny import TINY_FLAGS, tiny_config

from jaxgossip import algorithms, topology
from jaxgossip.cli import main
from jaxgossip.engine import outer
from jaxgossip.ops import quantize
from jaxgossip.run.runner import run_training

N = 4
LOW_BITS = (16, 8, 4)


def _tree(seed=0):
    """Two leaves with different per-node magnitudes (a zero node in the second), leaves [N, ...]."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(N, 3, 5)) * np.array([1e-3, 1.0, 30.0, 1e4])[:, None, None]
    b = rng.standard_t(2, size=(N, 7)) * np.array([1.0, 0.0, 2.0, 5.0])[:, None]
    return {"a": jnp.asarray(a, jnp.float32), "b": jnp.asarray(b, jnp.float32)}


def _numpy_scales(x, bits):
    """Per node: s = max|x_i| / FMAX (1 for bfloat16 or a zero node)."""
    fmax = float(jnp.finfo(quantize.FORMATS[bits]).max)
    x = np.asarray(x, np.float32)
    peak = np.max(np.abs(x.reshape(x.shape[0], -1)), axis=1)
    return np.where((peak > 0) & (bits != 16), peak / np.float32(fmax), 1.0).astype(np.float32)


def _numpy_quantize(x, bits, scales):
    """Per node: the values x_i / s_i clipped to [-FMAX, FMAX] and cast by ml_dtypes."""
    fmt = np.dtype(quantize.FORMATS[bits])
    fmax = float(jnp.finfo(fmt).max)
    x = np.asarray(x, np.float32)
    values = np.zeros(x.shape, fmt)
    for i in range(x.shape[0]):
        values[i] = np.clip(x[i] / scales[i], -fmax, fmax).astype(fmt)
    return values


@pytest.mark.parametrize("bits", LOW_BITS)
def test_quantize_matches_numpy_reference(bits):
    for leaf in jax.tree_util.tree_leaves(_tree()):
        q = quantize.quantize(leaf, bits)
        # XLA may divide by the constant FMAX as a product by its reciprocal: the scale within 1 ulp,
        # then the cast of x / s bit for bit.
        np.testing.assert_allclose(np.asarray(q.scale), _numpy_scales(leaf, bits), rtol=2.5e-7)
        scales = np.asarray(q.scale)
        values = _numpy_quantize(leaf, bits, scales)
        assert q.values.dtype == quantize.FORMATS[bits] and jnp.finfo(q.values.dtype).bits == bits
        np.testing.assert_array_equal(np.asarray(q.values).astype(np.float32), values.astype(np.float32))
        deq = np.asarray(quantize.dequantize(q))
        np.testing.assert_array_equal(deq, values.astype(np.float32) * scales.reshape((N,) + (1,) * (leaf.ndim - 1)))


@pytest.mark.parametrize("bits", LOW_BITS)
def test_quantize_error_within_half_ulp(bits):
    """Round to nearest: |x~ - x| <= eps/2 |x| + u/2 s per value (u the smallest subnormal), so also
    <= (eps/2 + u/(2 FMAX)) max|x_i| relative to the node's largest value; the largest is kept."""
    info = jnp.finfo(quantize.FORMATS[bits])
    eps, sub, fmax = float(info.eps), float(info.smallest_subnormal), float(info.max)
    for leaf in jax.tree_util.tree_leaves(_tree(1)):
        x = np.asarray(leaf, np.float64)
        q = quantize.quantize(leaf, bits)
        err = np.abs(np.asarray(quantize.dequantize(q), np.float64) - x)
        s = np.asarray(q.scale, np.float64).reshape((N,) + (1,) * (x.ndim - 1))
        slack = 1e-6 * np.abs(x)  # float32 rounding of x / s and of the product by s
        assert np.all(err <= eps / 2 * np.abs(x) + sub / 2 * s + slack)
        peak = np.max(np.abs(x.reshape(N, -1)), axis=1)
        assert np.all(np.max(err.reshape(N, -1), axis=1) <= (eps / 2 + sub / (2 * fmax)) * peak * (1 + 1e-6))
        if bits != 16:
            np.testing.assert_allclose(np.max(np.abs(np.asarray(quantize.dequantize(q))).reshape(N, -1), 1), peak, 1e-6)
    # A zero node stays zero (scale 1, no division by zero).
    zero = quantize.dequantize(quantize.quantize(jnp.zeros([N, 3]), bits))
    np.testing.assert_array_equal(np.asarray(zero), 0.0)


def test_check_message_bits_refuses_other_widths():
    for bad in (3, 2, 64, 32.0, True, "4"):
        with pytest.raises(ValueError, match="outer_message_bits"):
            quantize.check_message_bits(bad)
    assert quantize.quantize_dequantize(_tree(), 32) is not None
    with pytest.raises(ValueError, match="nothing to quantise"):
        quantize.quantize(jnp.ones([N, 2]), 32)


def _graphs():
    return {"gossip": topology.ring(N), "allreduce": topology.ring(N), "push_sum": topology.directed_ring(N)}


@pytest.mark.parametrize("name", ["gossip", "allreduce", "push_sum"])
@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_round_matches_per_node_loop_and_conserves_mass(name, bits):
    """x_i <- sum_j W_ij x~_j (push-sum: the numerators), per node in NumPy; the sum over nodes is
    that of the sent values x~ (W column stochastic)."""
    topo = _graphs()[name]
    alg = algorithms.make(name, topo)
    x = _tree(2)
    new, _, _ = quantize.with_quantized_messages(alg, bits).step(x, alg.init(x), jax.random.key(0))
    w = np.full((N, N), 1.0 / N) if name == "allreduce" else topo.matrix(0)
    for key in x:
        xs = np.asarray(x[key], np.float64)
        sent = np.asarray(quantize.quantize_dequantize(x[key], bits), np.float64)
        ref = np.stack([sum(w[i, j] * sent[j] for j in range(N)) for i in range(N)])
        np.testing.assert_allclose(np.asarray(new[key]), ref, rtol=1e-5, atol=1e-5 * np.abs(xs).max())
        np.testing.assert_allclose(
            np.sum(np.asarray(new[key], np.float64), 0), np.sum(sent, 0), rtol=1e-5, atol=1e-5 * np.abs(xs).max()
        )


@pytest.mark.parametrize("name", ["gossip", "allreduce", "push_sum"])
def test_bits_are_b_per_value_plus_a_scale_per_leaf_and_message(name):
    alg = algorithms.make(name, _graphs()[name])
    x = _tree(3)
    dim, leaves = sum(v[0].size for v in x.values()), len(x)
    _, _, full = alg.step(x, alg.init(x), jax.random.key(0))
    weight = 32.0 if name == "push_sum" else 0.0  # the push-sum weight stays 32 bits per message
    messages = np.asarray(full.bits) / (32 * dim + weight)
    np.testing.assert_array_equal(messages, np.round(messages))
    for bits in LOW_BITS:
        _, _, info = quantize.with_quantized_messages(alg, bits).step(x, alg.init(x), jax.random.key(0))
        scales = 0 if bits == 16 else 32 * leaves
        np.testing.assert_array_equal(np.asarray(info.bits), messages * (bits * dim + scales + weight))


def test_sender_refusals_and_b32_is_the_algorithm():
    alg = algorithms.make("allreduce", topology.ring(N))
    tx = optax.sgd(0.5)
    assert outer.quantized_sender(alg, 32, None, "model") is alg
    with pytest.raises(ValueError, match="outer optimizer"):
        outer.quantized_sender(alg, 4, None, "pseudo_gradient")
    with pytest.raises(ValueError, match="--outer_message=pseudo_gradient"):
        outer.quantized_sender(alg, 4, tx, "model")
    with pytest.raises(ValueError, match="dense"):
        outer.quantized_sender(algorithms.make("choco", topology.ring(N)), 4, tx, "pseudo_gradient")
    with pytest.raises(ValueError, match="dense"):
        outer.quantized_sender(algorithms.byzantine("gossip", topology.ring(N), ids=[0]), 4, tx, "pseudo_gradient")
    with pytest.raises(ValueError, match="dense"):
        outer.quantized_sender(alg._replace(name=""), 4, tx, "pseudo_gradient")
    with pytest.raises(ValueError, match="outer_message_bits=5"):
        outer.quantized_sender(alg, 5, tx, "pseudo_gradient")


def _leaves(tree):
    keys = lambda a: jax.random.key_data(a) if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key) else a  # noqa: E731
    return [np.asarray(keys(a)) for a in jax.tree_util.tree_leaves(tree)]


DILOCO = dict(algorithm="allreduce", outer_optimizer="nesterov", outer_message="pseudo_gradient", local_steps=2)


def _run(tmp_path, name, **changes):
    return run_training(tiny_config(**changes), str(tmp_path / name), progress=False, log=lambda s: None)


def test_diloco_b32_is_bitwise_the_float32_run_and_b4_trains_at_an_eighth_of_the_bits(tmp_path):
    """B = 32 changes nothing (bitwise); B = 4 sends (4 D + 32 L) / (32 D) of the bits per message and
    still learns the tiny task."""
    plain = _run(tmp_path, "plain", **DILOCO)
    b32 = _run(tmp_path, "b32", outer_message_bits=32, **DILOCO)
    b4 = _run(tmp_path, "b4", outer_message_bits=4, **DILOCO)
    for a, b in zip(_leaves(plain.state), _leaves(b32.state), strict=True):
        np.testing.assert_array_equal(a, b)
    assert [r["train_loss"] for r in plain.rows] == [r["train_loss"] for r in b32.rows]
    leaves = jax.tree_util.tree_leaves(b4.state.params)
    dim = sum(leaf[0].size for leaf in leaves)
    ratio = (4 * dim + 32 * len(leaves)) / (32 * dim)
    np.testing.assert_allclose(np.asarray(b4.state.bits), np.asarray(plain.state.bits) * ratio, rtol=1e-6)
    np.testing.assert_allclose(b4.rows[-1]["bits_mean"], plain.rows[-1]["bits_mean"] * ratio, rtol=1e-6)
    losses = [r["train_loss"] for r in b4.rows]
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.5 * losses[0]
    assert b4.rows[-1]["test_acc"] >= 0.9 and plain.rows[-1]["test_acc"] >= 0.9


def test_streaming_diloco_at_4_bits_runs_and_resumes_bitwise(tmp_path):
    config = dict(DILOCO, outer_fragments=2, outer_overlap=1, outer_mix=0.5, outer_message_bits=4, num_rounds=10)
    full = _run(tmp_path, "a", **config)
    assert np.all(np.isfinite([r["train_loss"] for r in full.rows]))
    part = run_training(
        tiny_config(**config), str(tmp_path / "b"), progress=False, stop_after_chunks=1, log=lambda s: None
    )
    assert not part.finished
    rest = _run(tmp_path, "b", **config)
    for a, b in zip(_leaves(full.state), _leaves(rest.state), strict=True):
        np.testing.assert_array_equal(a, b)
    # The two fragments together send the whole model once per round, each leaf with its scale.
    leaves = jax.tree_util.tree_leaves(full.state.params)
    dim = sum(leaf[0].size for leaf in leaves)
    np.testing.assert_allclose(np.asarray(full.state.bits), 10 * (4 * dim + 32 * len(leaves)), rtol=1e-6)


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--outer_message_bits=3"], ["outer_message_bits=3", "4, 8, 16, 32"]),
        (["--outer_message_bits=4"], ["outer_message_bits=4", "--outer_optimizer"]),
        (["--outer_optimizer=sgd", "--outer_message_bits=8"], ["--outer_message=pseudo_gradient", "model"]),
        (
            [
                "--outer_optimizer=sgd",
                "--outer_message=pseudo_gradient",
                "--outer_message_bits=4",
                "--message_dtype=bf16",
            ],
            ["message_dtype", "--message_dtype=fp32"],
        ),
        (
            ["--outer_optimizer=sgd", "--outer_message=pseudo_gradient", "--outer_message_bits=4", "--algorithm=choco"],
            ["outer_message_bits=4", "choco", "dense"],
        ),
        (
            [
                "--outer_optimizer=sgd",
                "--outer_message=pseudo_gradient",
                "--outer_message_bits=4",
                "--byzantine.nodes=1",
            ],
            ["outer_message_bits=4", "dense", "without a wrapper"],
        ),
    ],
)
def test_cli_bad_outer_message_bits_exit_2(flags, words, tmp_path, capsys):
    code = main(["train", *TINY_FLAGS, *flags, f"--out={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2, err
    for word in words:
        assert word in err, err
    assert "Traceback" not in err
