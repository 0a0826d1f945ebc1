"""GPU readiness checked on the CPU: every registered algorithm's round, the trainer's chunk for the
CNN, ResNet-20 and the transformer, and a training sweep lower for ``cuda``, ``rocm`` and ``tpu``
with ``jax.export``; the build-time platform choices (jaxgossip.ops.platforms) are the documented ones,
and no CPU-only custom call leaks into an accelerator's program."""

import re

import jax
import jax.numpy as jnp
import pytest
from jax import export
from tiny import tiny_config

from jaxgossip import algorithms
from jaxgossip import topology as T
from jaxgossip.compress import native
from jaxgossip.ops import platforms
from jaxgossip.run import training_sweeps
from jaxgossip.run.runner import build

ACCELERATORS = ("cuda", "rocm", "tpu")
# Options an algorithm needs to be built (no defaults for them); top-k where it has a native kernel.
OPTIONS = {
    "qgm": {"lr": 0.1},
    "demo_momentum": {"lr": 0.01},
    "sparse_push": {"fraction": 0.25},
    "scsp": {"fraction": 0.25},
    "choco": {"compressor": "top_k", "compressor_options": {"fraction": 0.25}},
}
# The first graph each algorithm accepts: a ring, a tree (RelaySGD), a directed one-peer graph.
GRAPHS = (T.ring(8), T.binary_tree(8), T.one_peer_exponential(8))


def _algorithm(name):
    errors = []
    for graph in GRAPHS:
        try:
            return algorithms.make(name, graph, **OPTIONS.get(name, {}))
        except ValueError as err:
            errors.append(str(err))
    raise AssertionError(f"{name} accepts none of the test graphs: {errors}")


def _custom_calls(exported) -> set[str]:
    return set(re.findall(r"custom_call @(\w+)", exported.mlir_module()))


def _no_cpu_kernels(exported):
    calls = _custom_calls(exported)
    assert not [c for c in calls if c.startswith("jaxgossip_")], calls


@pytest.mark.parametrize("name", sorted(algorithms.REGISTRY))
def test_every_algorithm_round_lowers_for_every_accelerator(name):
    alg = _algorithm(name)
    x = jnp.ones((8, 4, 3), jnp.float32)
    exported = export.export(jax.jit(alg.step), platforms=ACCELERATORS)(x, alg.init(x), jax.random.key(0))
    assert exported.platforms == ACCELERATORS
    _no_cpu_kernels(exported)


@pytest.mark.skipif(not native.load().available, reason="native CPU kernels not built here")
def test_the_cpu_program_keeps_the_native_top_k_kernel():
    """The same round exported for the CPU does call the native kernel: the accelerator programs
    above lack it because the platform choice works, not because the kernel is never used."""
    alg = _algorithm("sparse_push")
    x = jnp.ones((8, 64), jnp.float32)
    text = jax.jit(alg.step).lower(x, alg.init(x), jax.random.key(0)).as_text()
    assert re.search(r"custom_call @jaxgossip_\w+", text)


def test_build_choices_per_platform():
    assert platforms.resolve("resnet20", "auto", "cpu") == platforms.BuildChoices("cpu", 1, "explicit")
    assert platforms.resolve("cnn", 0, "cpu") == platforms.BuildChoices("cpu", None, "matmul")
    assert platforms.resolve("mlp", "auto", "cpu") == platforms.BuildChoices("cpu", None, None)
    for platform in ACCELERATORS:
        assert platforms.resolve("resnet20", "auto", platform) == platforms.BuildChoices(platform, None, "lax")
        assert platforms.resolve("transformer", "auto", platform).node_batch is None
    # An explicit node batch is the user's, on every platform.
    assert platforms.resolve("cnn", 4, "cuda") == platforms.BuildChoices("cuda", 4, "lax")
    with pytest.raises(ValueError, match="platform='metal' is unknown"):
        platforms.resolve("cnn", "auto", "metal")


def _chunk_lowers(config, platform_names):
    built = build(config, platform="cuda")
    state = jax.eval_shape(built.trainer.init, jax.random.key(0))  # shapes only: nothing runs on the CPU
    exported = export.export(built.trainer.run_chunk, platforms=platform_names)(state, 1)
    _no_cpu_kernels(exported)
    return exported


TRAIN_MODELS = {
    "cnn": {"dataset": "digits", "model": "cnn", "model_options": {}},
    "resnet20": {"dataset": "digits", "model": "resnet20", "model_options": {}},
    "transformer": {
        "dataset": "python_docs",
        "model": "transformer",
        "model_options": {"depth": 1, "width": 32, "heads": 2, "context": 16},
        "partition": "by_source",
    },
}


@pytest.mark.parametrize("model", sorted(TRAIN_MODELS))
def test_trainer_chunk_lowers_for_every_accelerator(model):
    config = tiny_config(num_rounds=2, eval_every=1, batch_size=4, eval_size=16, eval_chunk=16, **TRAIN_MODELS[model])
    exported = _chunk_lowers(
        config.replace(
            algorithm="choco", algorithm_options={"compressor": "top_k", "compressor_options": {"fraction": 0.1}}
        ),
        ACCELERATORS,
    )
    assert exported.platforms == ACCELERATORS
    if model != "transformer":  # the accelerator build uses the native convolution, not im2col matmuls
        assert "stablehlo.convolution" in exported.mlir_module()


def test_training_sweep_lowers_for_every_accelerator():
    config = tiny_config(num_rounds=2, eval_every=1)
    program = training_sweeps.sweep_program(config, {"lr": [0.05, 0.1]}, seeds=[0, 1], platform="cuda")
    exported = export.export(program.run, platforms=ACCELERATORS)(*program.args)
    assert exported.platforms == ACCELERATORS
    _no_cpu_kernels(exported)
