"""The local update both runners share (jaxgossip.engine.local_step): without a gradient hook the
per-node optimizer steps on the raw gradients and the algorithm state is left as it was; with one,
the optimizer sees the hook's gradient and the caller gets the hook's state; the ordering check
reads the algorithm's own orderings. Gradient tracking's hook through local_update:
tests/algorithms/test_gradient_methods.py."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxgossip import algorithms, topology
from jaxgossip.engine.local_step import check_ordering, local_update
from jaxgossip.types import ORDERINGS

N, D = 4, 3


def _params():
    return {"w": jnp.arange(N * D, dtype=jnp.float32).reshape(N, D) / 10}


def _grads(seed):
    return {"w": jax.random.normal(jax.random.key(seed), (N, D))}


def test_without_a_hook_each_node_steps_on_its_raw_gradient_with_its_own_momentum():
    alg = algorithms.make("gossip", topology.ring(N))
    params, opt = _params(), optax.sgd(0.1, momentum=0.9)
    comm_state = alg.init(params)
    first = local_update(alg, opt, _grads(0), params, jax.vmap(opt.init)(params), comm_state)
    assert first.comm_state is comm_state
    np.testing.assert_allclose(first.updates["w"], -0.1 * _grads(0)["w"], rtol=1e-6)
    second = local_update(alg, opt, _grads(1), params, first.opt_state, comm_state)
    # heavy ball per node: u = -lr (g_2 + 0.9 g_1), each node with its own trace
    want = -0.1 * (_grads(1)["w"] + 0.9 * _grads(0)["w"])
    np.testing.assert_allclose(second.updates["w"], want, rtol=1e-5, atol=1e-7)


def test_the_optimizer_sees_the_hooks_gradient_and_the_caller_gets_the_hooks_state():
    plain = algorithms.make("gossip", topology.ring(N))

    def hook(grads, params, state):  # 2 g + x, and one more call counted in the state
        doubled = jax.tree_util.tree_map(lambda g, x: 2 * g + x, grads, params)
        return doubled, {"calls": state["calls"] + 1}

    alg = plain._replace(gradient=hook)
    params, opt = _params(), optax.sgd(0.5)
    run = jax.jit(lambda g, o, s: local_update(alg, opt, g, params, o, s))
    out = run(_grads(2), jax.vmap(opt.init)(params), {"calls": jnp.int32(0)})
    np.testing.assert_allclose(out.updates["w"], -0.5 * (2 * _grads(2)["w"] + params["w"]), rtol=1e-6)
    assert int(out.comm_state["calls"]) == 1


def test_check_ordering_reads_the_algorithms_own_orderings():
    atc_only = types.SimpleNamespace(name="my_method", orderings=("atc",))
    check_ordering(atc_only, "atc")
    with pytest.raises(ValueError) as err:
        check_ordering(atc_only, "same_iterate")
    assert str(err.value).startswith("my_method is registered with orderings=('atc',): ordering='same_iterate'")
    assert str(err.value).endswith("use ordering='atc'")
    nameless = types.SimpleNamespace(orderings=("atc",))
    with pytest.raises(ValueError, match=r"^the algorithm is registered with orderings"):
        check_ordering(nameless, "same_iterate")
    duck = types.SimpleNamespace()  # no orderings attribute: every ordering runs
    for ordering in ORDERINGS:
        check_ordering(duck, ordering)
    with pytest.raises(ValueError, match=r"ordering='adapt' is unknown; known orderings: \('atc', 'same_iterate'\)"):
        check_ordering(duck, "adapt")
