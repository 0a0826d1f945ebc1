"""Gradients through a synchronous training run (:func:`jaxgossip.engine.training.make_train`):
``jax.grad`` of the final test loss of the averaged model (and of the training loss) equals central finite differences in
float64, with respect to the graph's weights, gamma, the learning rate (optax
``inject_hyperparams``) and the nodes' initial models (``Trainer.train(key, params)``). Batches are
drawn by integer indices from the run's key: a fixed key fixes them, so the loss is a smooth
function of the continuous inputs."""

import functools

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _gradcheck import check_against_fd

import jaxgossip as jg
from jaxgossip.data.node_shards import make_node_shards
from jaxgossip.engine.training import make_train

N, DIM, HIDDEN, CLASSES = 4, 3, 5, 3


@pytest.fixture(autouse=True)
def float64():
    with jax.enable_x64(True):
        yield


def tiny_mlp():
    """A pure (init, apply) MLP in float64: tanh hidden layer, softmax logits."""

    def init(key, x):
        del x
        k1, k2 = jax.random.split(key)
        return {
            "w1": 0.7 * jax.random.normal(k1, (DIM, HIDDEN), jnp.float64),
            "b1": jnp.zeros([HIDDEN], jnp.float64),
            "w2": 0.7 * jax.random.normal(k2, (HIDDEN, CLASSES), jnp.float64),
        }

    def apply(params, x):
        return jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"]

    return init, apply


@functools.cache
def synthetic_data(seed=0, per_node=6):
    """Node shards and evaluation data in float64 (built on the host, outside any trace)."""
    rng = np.random.default_rng(seed)
    m = N * per_node
    x = rng.normal(size=(m, DIM))
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0.5)  # 3 classes, non-IID across the shards
    order = np.argsort(x[:, 0])  # sorted by feature 0: every node sees a different slice
    shards = make_node_shards(x, y, [order[i * per_node : (i + 1) * per_node] for i in range(N)])
    return shards, (jnp.asarray(x), jnp.asarray(y))


@pytest.fixture(autouse=True, scope="module")
def data():
    with jax.enable_x64(True):
        synthetic_data()


def trainer(algorithm, lr=0.3, num_rounds=4):
    shards, eval_data = synthetic_data()
    optimizer = optax.inject_hyperparams(optax.sgd)(learning_rate=lr)
    return make_train(
        tiny_mlp(), algorithm, shards, eval_data, optimizer, num_rounds=num_rounds, batch_size=3, eval_every=2
    )


TOPO = jg.topology.ring(N)
KEY = jax.random.key(0)


def final_test_loss(weights=TOPO.weights, gamma=1.0, lr=0.3, params=None, name="gossip", metric="test_loss"):
    options = {"gamma": gamma}
    if name == "choco":
        options["compressor"] = jg.compress.identity()
    alg = jg.algorithms.make(name, TOPO.with_weights(weights), **options)
    _, metrics = trainer(alg, lr=lr).train(KEY, params)
    return getattr(metrics, metric)[-1]


def test_training_loss_gradient_wrt_mixing_weights():
    real = (np.asarray(TOPO.weights) != 0).astype(np.float64)
    grad = check_against_fd(lambda w: final_test_loss(weights=w), TOPO.weights, num_directions=2, mask=real)
    np.testing.assert_array_equal(np.asarray(grad)[real == 0], 0.0)


def test_training_loss_gradient_wrt_learning_rate_and_gamma():
    check_against_fd(lambda lr: final_test_loss(lr=lr), 0.3, num_directions=1)
    check_against_fd(lambda lr: final_test_loss(lr=lr, metric="train_loss"), 0.3, num_directions=1)
    check_against_fd(lambda g: final_test_loss(gamma=g, name="choco"), 0.7, num_directions=1)


def test_training_loss_gradient_wrt_initial_models():
    init, _ = tiny_mlp()
    keys = jax.random.split(jax.random.key(5), N)
    params0 = jax.vmap(lambda k: init(k, None))(keys)  # different initial models per node
    flat, unravel = jax.flatten_util.ravel_pytree(params0)
    check_against_fd(lambda v: final_test_loss(params=unravel(v)), flat, num_directions=2)


def test_given_initial_models_start_the_run_and_are_checked():
    init, _ = tiny_mlp()
    alg = jg.algorithms.make("gossip", TOPO)
    run = trainer(alg)
    params0 = jax.vmap(lambda k: init(k, None))(jax.random.split(jax.random.key(5), N))
    state = run.init(KEY, params0)
    for got, want in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(params0), strict=True):
        np.testing.assert_array_equal(got, want)
    # the default start is the same run as giving its own initial models
    default = run.init(KEY)
    np.testing.assert_array_equal(run.train(KEY)[1].test_loss, run.train(KEY, default.params)[1].test_loss)
    with pytest.raises(ValueError, match="leading node axis"):
        run.init(KEY, jax.tree_util.tree_map(lambda a: a[:2], params0))
