"""Tests for jaxgossip.models: sizes, shapes, conv formulations, node-local BN, NNX path."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference import RESNET20_MATRICES, assert_refused, call_cli
from flax import linen as nn
from flax import nnx
from tiny import TINY_FLAGS

from jaxgossip import models
from jaxgossip.algorithms.matrix_views import matrix_shapes

RTOL = ATOL = 1e-5


def _params_shape(model, x_shape):
    return jax.eval_shape(model.init, jax.random.key(0), jnp.zeros(x_shape))


def _numpy_variables(model, x, seed=0):
    """Random variables of the right structure without compiling `init` (threefry compiles slowly)."""
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        name = jax.tree_util.keystr(path)
        if leaf.ndim >= 2:
            fan_in = int(np.prod(leaf.shape[:-1]))
            return jnp.asarray(rng.normal(size=leaf.shape) / np.sqrt(fan_in), leaf.dtype)
        return jnp.full(leaf.shape, 1.0 if ("scale" in name or "var" in name) else 0.0, leaf.dtype)

    return jax.tree_util.tree_map_with_path(fill, jax.eval_shape(model.init, jax.random.key(0), x))


# ---------------------------------------------------------------- sizes and shapes


def test_resnet20_has_exactly_272474_parameters():
    variables = _params_shape(models.make_model("resnet20"), (1, 32, 32, 3))
    params = variables["params"]
    assert models.count_params(params) == 272_474
    leaves = jax.tree.leaves(params)
    assert len(leaves) == 65
    assert sum(leaf.size for leaf in leaves if leaf.ndim <= 1) == 1_578


def test_resnet20_matrix_shapes_match_powergossip_view():
    params = _params_shape(models.resnet20(), (1, 32, 32, 3))["params"]
    shapes = matrix_shapes(params)
    assert collections.Counter(shapes) == collections.Counter(RESNET20_MATRICES)
    assert sum(m for m, _ in shapes) == 794
    assert sum(n for _, n in shapes) == 5_755
    assert sum(m * n for m, n in shapes) == 270_896


def _resnet_param_formula(blocks_per_stage, num_classes=10):
    """Independent count: convs without bias, BN (2 per channel), projection shortcuts, fc."""
    total = 3 * 16 * 9 + 2 * 16
    c_in = 16
    for c in (16, 32, 64):
        for _ in range(blocks_per_stage):
            total += c_in * c * 9 + 2 * c + c * c * 9 + 2 * c
            if c_in != c:
                total += c_in * c + 2 * c
            c_in = c
    return total + 64 * num_classes + num_classes


@pytest.mark.parametrize(
    "name, expected",
    [
        ("resnet110", _resnet_param_formula(18)),
        ("vgg11", 9_231_114),
        ("vgg16", 14_728_266),
        ("cnn", 104_202),
        ("mlp", 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10),
    ],
)
def test_parameter_counts(name, expected):
    x_shape = (1, 28, 28, 1) if name in ("cnn", "mlp") else (1, 32, 32, 3)
    params = _params_shape(models.make_model(name), x_shape)["params"]
    assert models.count_params(params) == expected
    assert _resnet_param_formula(3) == 272_474


@pytest.mark.parametrize("name", ["resnet110", "vgg16"])
def test_large_models_shapes_only(name):
    model = models.make_model(name, num_classes=7)
    x = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
    variables = jax.eval_shape(model.init, jax.random.key(0), x)
    out = jax.eval_shape(lambda v, x: model.apply(v, x), variables, x)
    assert out.shape == (2, 7)


@pytest.mark.parametrize(
    "name, x_shape, options",
    [
        ("mlp", (3, 28, 28, 1), {"hidden": (32,)}),
        ("cnn", (3, 28, 28, 1), {}),
        ("resnet20", (2, 8, 8, 3), {}),
        ("vgg11", (2, 32, 32, 3), {}),
    ],
)
def test_forward_shapes(name, x_shape, options):
    model = models.make_model(name, num_classes=7, **options)
    x = jax.random.normal(jax.random.key(0), x_shape)
    logits = jax.jit(model.apply)(_numpy_variables(model, x), x)
    assert logits.shape == (x_shape[0], 7)
    assert bool(jnp.all(jnp.isfinite(logits)))


def test_unknown_model_name_lists_known_ones():
    with pytest.raises(ValueError, match="resnet20"):
        models.make_model("resnet21")


# ---------------------------------------------------------------- conv formulations


def test_resolve_conv_impl():
    assert models.resolve_conv_impl("auto", "cpu") == "matmul"
    assert models.resolve_conv_impl("auto", "cpu", node_batch=None) == "matmul"
    assert models.resolve_conv_impl("auto", "cpu", node_batch=4) == "matmul"
    assert models.resolve_conv_impl("auto", "cpu", node_batch=1) == "explicit"
    assert models.resolve_conv_impl("auto", "gpu") == "lax"
    assert models.resolve_conv_impl("auto", "gpu", node_batch=1) == "lax"
    assert models.resolve_conv_impl("auto", "tpu") == "lax"
    assert models.resolve_conv_impl("lax", "cpu") == "lax"
    assert models.resolve_conv_impl("explicit", "gpu") == "explicit"
    with pytest.raises(ValueError, match="conv_impl"):
        models.resolve_conv_impl("fft")


@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("strides", [1, 2])
@pytest.mark.parametrize("padding", ["SAME", "VALID", 1])
def test_conv_impls_agree_forward_and_gradient(kernel, strides, padding):
    x = jax.random.normal(jax.random.key(0), (2, 7, 9, 3))
    convs = {
        impl: models.Conv(4, kernel, strides, padding, use_bias=True, impl=impl)
        for impl in ("lax", "matmul", "explicit")
    }
    params = convs["lax"].init(jax.random.key(1), x)
    for impl in ("matmul", "explicit"):
        assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, convs[impl].init(jax.random.key(1), x))

    def loss(params, x, impl):
        y = convs[impl].apply(params, x)
        return jnp.sum(jnp.sin(y)), y

    results = {
        impl: jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True), static_argnums=2)(params, x, impl)
        for impl in convs
    }
    (_, y_lax), g_lax = results["lax"]
    for impl in ("matmul", "explicit"):
        (_, y), g = results[impl]
        assert y.shape == y_lax.shape
        np.testing.assert_allclose(y, y_lax, rtol=RTOL, atol=ATOL)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL), g, g_lax)
    # "explicit" is the same forward convolution, and its gradients are the same sums
    (_, y_ex), g_ex = results["explicit"]
    np.testing.assert_array_equal(y_ex, y_lax)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), g_ex, g_lax)


@pytest.mark.parametrize(
    "shape,kernel,strides,padding",
    [
        ((2, 15, 13, 3), 3, 2, "SAME"),
        ((2, 9, 11, 2), 5, 3, ((2, 1), (0, 3))),
        ((2, 7, 7, 3), 2, 2, "SAME"),
        ((2, 16, 16, 3), 1, 2, "VALID"),
        ((2, 6, 6, 3), 3, 1, 3),  # padding beyond kernel - 1: negative padding in the input gradient
    ],
)
def test_explicit_conv_gradients_inside_a_loop_equal_lax(shape, kernel, strides, padding):
    x = jax.random.normal(jax.random.key(0), (3,) + shape)
    convs = {impl: models.Conv(4, kernel, strides, padding, use_bias=False, impl=impl) for impl in ("lax", "explicit")}
    params = convs["lax"].init(jax.random.key(1), x[0])

    def grads(impl):
        loss = lambda p, x: jnp.sum(jnp.sin(convs[impl].apply(p, x)))
        # lax.map: the convolutions sit in a loop body, as in the trainer on CPU
        return jax.jit(lambda p, xs: jax.lax.map(lambda x: jax.grad(loss, argnums=(0, 1))(p, x), xs))(params, x)

    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), grads("explicit"), grads("lax"))


def test_conv_matches_flax_conv_and_checkpoint_layout():
    x = jax.random.normal(jax.random.key(0), (2, 6, 6, 3))
    reference = nn.Conv(5, (3, 3), strides=(2, 2), padding="SAME")
    params = reference.init(jax.random.key(1), x)
    for impl in ("lax", "matmul"):
        ours = models.Conv(5, 3, 2, "SAME", impl=impl)
        assert jax.tree.map(jnp.shape, ours.init(jax.random.key(1), x)) == jax.tree.map(jnp.shape, params)
        np.testing.assert_allclose(ours.apply(params, x), reference.apply(params, x), rtol=RTOL, atol=ATOL)


def test_conv_impls_agree_under_vmap_over_nodes():
    xs = jax.random.normal(jax.random.key(0), (3, 2, 8, 8, 4))
    keys = jax.random.split(jax.random.key(1), 3)
    conv = {impl: models.Conv(6, 3, 2, 1, use_bias=False, impl=impl) for impl in ("lax", "matmul")}
    params = jax.vmap(conv["lax"].init)(keys, xs)

    def grads(impl):
        loss = lambda p, x: jnp.sum(conv[impl].apply(p, x) ** 2)
        return jax.jit(jax.vmap(jax.grad(loss)))(params, xs)

    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=RTOL, atol=1e-4), grads("matmul"), grads("lax"))


def test_resnet_lax_and_matmul_share_checkpoints():
    # ResNet-8 (one block per stage, both projection shortcuts) keeps compilation short.
    x = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))
    lax_model = models.ResNet(depth=8, conv_impl="lax")
    variables = _numpy_variables(lax_model, x)

    def forward(model):
        return jax.jit(lambda v: model.apply(v, x, train=True, mutable=["batch_stats"])[0])(variables)

    out_lax = forward(lax_model)
    for impl in ("matmul", "explicit"):
        model = models.ResNet(depth=8, conv_impl=impl)
        assert jax.tree.map(jnp.shape, jax.eval_shape(model.init, jax.random.key(1), x)) == jax.tree.map(
            jnp.shape, variables
        )
        np.testing.assert_allclose(forward(model), out_lax, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- normalization


def test_batch_stats_are_node_local():
    model = models.CNN(num_classes=3, features=(4, 8), norm="batch")
    x = jnp.zeros((4, 8, 8, 1))
    keys = jnp.stack([jax.random.key(0)] * 2)
    variables = jax.jit(lambda k: models.init_stacked(model, k, x))(keys)  # identical models
    assert jax.tree.leaves(variables["batch_stats"])[0].shape[0] == 2

    @jax.jit
    def train_forward(variables, xs):
        def one(v, x):
            return model.apply(v, x, train=True, mutable=["batch_stats"])[1]["batch_stats"]

        return jax.vmap(one)(variables, xs)

    data = jax.random.normal(jax.random.key(1), (3, 4, 8, 8, 1))
    xs = jnp.stack([data[0], 3.0 + 2.0 * data[1]])
    stats = train_forward(variables, xs)
    mean = stats["norm1"]["mean"]
    assert mean.shape == (2, 4)
    assert not np.allclose(mean[0], mean[1])  # different data -> different statistics
    # Changing node 1's data leaves node 0's statistics untouched (bitwise).
    stats2 = train_forward(variables, jnp.stack([data[0], data[2]]))
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a[0], b[0]), stats, stats2)
    assert not np.allclose(stats["norm1"]["mean"][1], stats2["norm1"]["mean"][1])


@pytest.mark.parametrize("norm", ["group", "none"])
def test_group_and_no_norm_have_no_batch_stats(norm):
    variables = _params_shape(models.resnet20(norm=norm), (1, 32, 32, 3))
    assert set(variables) == {"params"}
    model = models.CNN(num_classes=3, features=(4, 8), norm=norm)
    x = jax.random.normal(jax.random.key(0), (2, 8, 8, 1))
    variables = jax.jit(model.init)(jax.random.key(1), x)
    assert set(variables) == {"params"}
    assert jax.jit(lambda v: model.apply(v, x, train=True))(variables).shape == (2, 3)


def test_bad_norm_raises():
    with pytest.raises(ValueError, match="norm"):
        models.CNN(norm="layer").init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))


# ---------------------------------------------------------------- NNX


class _NNXMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(6, 16, rngs=rngs)
        self.fc2 = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        return self.fc2(jax.nn.relu(self.fc1(x)))


def test_nnx_model_as_pure_vmappable_function():
    keys = jax.random.split(jax.random.key(0), 3)
    apply_fn, stacked = models.nnx_init_stacked(lambda rngs: _NNXMLP(rngs), keys)
    assert models.count_params(stacked) == 3 * (6 * 16 + 16 + 16 * 3 + 3)
    xs = jax.random.normal(jax.random.key(1), (3, 5, 6))
    logits = jax.jit(jax.vmap(apply_fn))(stacked, xs)
    assert logits.shape == (3, 5, 3)
    for i in range(3):
        model = _NNXMLP(nnx.Rngs(keys[i]))
        _, params, single_apply = models.nnx_apply_fn(model)
        np.testing.assert_allclose(logits[i], model(xs[i]), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(single_apply(params, xs[i]), model(xs[i]), rtol=RTOL, atol=ATOL)
    loss = lambda p, x: jnp.mean(apply_fn(p, x) ** 2)
    grads = jax.vmap(jax.grad(loss))(stacked, xs)
    assert jax.tree.structure(grads) == jax.tree.structure(stacked)


# ---- layer sizes: refused naming the option, in make_model and on the command line --------------


NO_HIDDEN = [f for f in TINY_FLAGS if not f.startswith("--model_options.hidden")]


@pytest.mark.parametrize(
    "model, options",
    [
        ("mlp", {"hidden": (0,)}),
        ("mlp", {"hidden": (8, -5)}),
        ("mlp", {"hidden": (1.5,)}),
        ("mlp", {"hidden": "abc"}),
        ("cnn", {"features": (0, 8)}),
        ("transformer", {"heads": 0}),
        ("resnet20", {"width": True}),
    ],
)
def test_make_model_refuses_non_positive_and_non_integer_sizes(model, options):
    (key,) = options
    with pytest.raises(ValueError, match=rf"^{key}=.* must be a positive integer"):
        models.make_model(model, num_classes=10, **options)


def test_group_count_and_fixed_resnet_depth_are_refused_naming_the_option():
    import jax
    import jax.numpy as jnp

    cnn = models.make_model("cnn", features=(6,), norm="group", norm_groups=4)
    with pytest.raises(ValueError, match=r"norm_groups=4 must divide the 6 channels"):
        cnn.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    ok = models.make_model("cnn", features=(6,), norm="group", norm_groups=3)
    norm = ok.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))["params"]["norm1"]  # the path stays
    assert norm["scale"].shape == norm["bias"].shape == (6,)
    with pytest.raises(ValueError, match=r"depth=21: resnet20's depth is fixed"):
        models.make_model("resnet20", depth=21)


def test_make_model_keeps_valid_sizes():
    assert models.make_model("mlp", hidden=(8, 4)).hidden == (8, 4)
    assert models.make_model("cnn", features=(4,), hidden=()).hidden == ()
    assert models.make_model("mlp", hidden=(np.int64(3),)).hidden == (3,)


@pytest.mark.parametrize("value", ["0", "abc", "-5", "1.5", "[8,0]"])
def test_bad_hidden_exits_2_in_print_config(capsys, value):
    rc, out, err = call_cli(capsys, "train", *NO_HIDDEN, f"--model_options.hidden={value}", "--print-config")
    assert_refused(rc, err, "model_options=", "hidden=", "must be a positive integer or a list of positive integers")
    assert out == ""


def test_hidden_0_in_a_run_exits_2_before_anything_is_written(tmp_path, capsys):
    rc, _, err = call_cli(capsys, "train", *NO_HIDDEN, "--model_options.hidden=0", "--out", str(tmp_path / "run"))
    assert_refused(rc, err, "hidden=(0,) must be a positive integer")
    assert not (tmp_path / "run").exists()
