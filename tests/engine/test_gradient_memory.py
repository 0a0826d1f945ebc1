"""Long runs differentiate in bounded memory: chunked rematerialisation (``checkpoint_every``)
gives the same values and gradients, and XLA's compiled memory analysis (deterministic) shows the
gradient's temporaries growing sublinearly in the number of rounds with it, linearly without."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxgossip as jg
from jaxgossip.engine.consensus import consensus_scan
from jaxgossip.engine.optimization import optimization_scan
from jaxgossip.engine.rounds import run_rounds

N, D = 8, 256
KEY = jax.random.key(0)
TARGETS = jnp.asarray(np.random.default_rng(0).normal(size=(N, D)), jnp.float32)


def loss_fn(x, node, key):
    del key
    return 0.5 * jnp.sum((x - TARGETS[node]) ** 2)


def final_objective(lr, num_steps, remat=False, checkpoint_every=None):
    alg = jg.algorithms.make("gossip", jg.topology.ring(N))
    optimizer = optax.inject_hyperparams(optax.sgd)(learning_rate=lr)
    trace = optimization_scan(
        alg, jnp.zeros((N, D)), loss_fn, optimizer, num_steps, KEY, remat=remat, checkpoint_every=checkpoint_every
    )
    return trace.objective[-1]


def gradient_temp_bytes(num_steps, **options):
    grad = jax.jit(jax.grad(lambda lr: final_objective(lr, num_steps, **options)))
    return grad.lower(0.1).compile().memory_analysis().temp_size_in_bytes


def test_chunked_remat_gives_the_same_values_and_gradients():
    with jax.enable_x64(True):
        topo = jg.topology.ring(6)
        x0 = jnp.asarray(np.random.default_rng(1).normal(size=(6, 3)))

        def errors(weights, **options):
            alg = jg.algorithms.make("choco", topo.with_weights(weights), compressor=jg.compress.top_k(k=1))
            return consensus_scan(alg, x0, 12, KEY, **options).error

        w = jnp.asarray(topo.weights)
        plain = jax.jit(errors)(w)
        for options in ({"checkpoint_every": 4}, {"checkpoint_every": 3, "remat": True}):
            np.testing.assert_array_equal(jax.jit(lambda v, o=options: errors(v, **o))(w), plain)
            np.testing.assert_allclose(
                jax.grad(lambda v, o=options: errors(v, **o)[-1])(w), jax.grad(lambda v: errors(v)[-1])(w), rtol=1e-12
            )
        lr = jnp.float64(0.05)
        np.testing.assert_allclose(
            jax.grad(final_objective)(lr, 12, checkpoint_every=4), jax.grad(final_objective)(lr, 12), rtol=1e-12
        )


def test_gradient_memory_grows_sublinearly_with_chunked_remat():
    plain = {s: gradient_temp_bytes(s) for s in (100, 1000)}
    chunked = {100: gradient_temp_bytes(100, remat=True, checkpoint_every=10)}
    chunked[1000] = gradient_temp_bytes(1000, remat=True, checkpoint_every=25)
    assert plain[1000] / plain[100] > 8  # every round's residuals are stored
    assert chunked[1000] / chunked[100] < 4  # S / C + C carries: 20 -> 65
    assert chunked[1000] < plain[1000] / 10


def test_checkpoint_every_is_checked():
    with pytest.raises(ValueError, match="divide"):
        run_rounds(lambda c, x: (c, c), 0.0, 10, checkpoint_every=3)
    with pytest.raises(ValueError, match="every=1"):
        run_rounds(lambda c, x: (c, c), 0.0, 10, every=2, checkpoint_every=2)
    with pytest.raises(ValueError, match="checkpoint_every"):
        run_rounds(lambda c, x: (c, c), 0.0, 10, checkpoint_every=0)
    carry, records = run_rounds(lambda c, x: (c + x, c), 0.0, 6, jnp.arange(6.0), checkpoint_every=2)
    np.testing.assert_array_equal(records, [0, 0, 1, 3, 6, 10])
    assert float(carry) == 15
