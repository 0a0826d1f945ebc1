"""Streaming DiLoCo: the outer step per model fragment, fragments synchronised at staggered times,
their communication overlapped with the next inner steps.

The model's layers are dealt into F fragments (layer l into fragment ``l mod F``: the strided
assignment of the paper, so that every fragment spans the depth of the network). A layer is the
set of leaves under one module path (a Dense layer's kernel and bias); a model without nesting
has one leaf per layer. Each round of H inner steps is cut at the launch steps

    L_f = floor((f + 1) H / F),   f = 0 .. F-1        (L_{F-1} = H),

so fragment f is synchronised once per round, every H inner steps, at offset L_f. At its launch
the fragment's outer round runs (:func:`jaxgossip.engine.outer.outer_round`, either message form:
the algorithm communicates the fragment only, with a state of its own) from its anchor ``a_f``
(its value after its previous synchronisation) and its current inner value ``y_f``, giving the
fragment's new outer value ``g_f``, which becomes its anchor. The result is applied ``tau`` inner
steps later (it is in flight meanwhile, while the node keeps training every leaf), merged with the
fragment's current value by the mixing factor alpha:

    y_f <- alpha * y_f + (1 - alpha) * g_f        at step L_f + tau (the next round's L_f + tau - H
                                                   when that is past H).

With tau = 0 the fragment takes ``g_f`` at its launch (alpha = 0) as DiLoCo does; F = 1, tau = 0
is DiLoCo bit for bit. The paper reports alpha = 0.5 with overlap; alpha = 0 discards the inner
progress made during the overlap, as torchft's implementation does.

Bits per round are the sum over fragments (the whole model once per round, in F messages).
Keys: the inner steps use the keys of the DiLoCo round (step h the h-th of ``split(key, H)``);
fragment f communicates with ``fold_in(key_comm, f)`` (``key_comm`` itself when F = 1).

Shapes: every leaf of the node-stacked pytrees is [N, ...]; the outer optimizer state of each
fragment is node-local, the anchors are one copy of the model, [N, ...].

Reference: Douillard et al., "Streaming DiLoCo with overlapping communication: Towards a
Distributed Free Lunch", 2025, arXiv:2501.18512.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxgossip.engine.outer import OuterState, outer_init, outer_round
from jaxgossip.types import Array, GossipAlgorithm, Params, PRNGKey

__all__ = [
    "Streaming",
    "Fragments",
    "StreamState",
    "RoundEvents",
    "make_fragments",
    "check_streaming",
    "round_events",
    "launch_and_merge_steps",
    "fragmented",
    "stream_init",
    "stream_round",
]


class Streaming(NamedTuple):
    """The streaming options (static).

    Attributes:
      fragments: F >= 1, the number of fragments.
      overlap: tau in [0, H), inner steps a fragment's result is in flight.
      mix: alpha in [0, 1], the weight of the inner value at the merge.
    """

    fragments: int = 1
    overlap: int = 0
    mix: float = 0.0


class Fragments(NamedTuple):
    """Which fragment every leaf belongs to (leaves in ``tree_flatten`` order)."""

    count: int
    of_leaf: tuple[int, ...]

    def split(self, tree: Any) -> list[list[Array]]:
        """The leaves of ``tree`` grouped by fragment (in leaf order within a fragment)."""
        leaves = jax.tree_util.tree_leaves(tree)
        return [[leaf for leaf, f in zip(leaves, self.of_leaf) if f == k] for k in range(self.count)]

    def join(self, like: Any, parts: list[list[Array]]) -> Any:
        """The tree shaped as ``like`` holding the fragments' leaves ``parts``."""
        treedef = jax.tree_util.tree_structure(like)
        taken = [iter(p) for p in parts]
        return jax.tree_util.tree_unflatten(treedef, [next(taken[f]) for f in self.of_leaf])

    def part(self, tree: Any, k: int) -> tuple[Array, ...]:
        """Fragment ``k`` of ``tree`` as the pytree its algorithm state is built on (a tuple of leaves)."""
        return tuple(self.split(tree)[k])

    def replace(self, tree: Any, k: int, leaves: list[Array]) -> Any:
        """``tree`` with fragment ``k``'s leaves replaced by ``leaves``."""
        parts = self.split(tree)
        parts[k] = leaves
        return self.join(tree, parts)


def _layers(params: Any) -> list[int]:
    """The layer of every leaf: leaves under the same parent path (module) share one."""
    paths = [path[:-1] if len(path) > 1 else path for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    index: dict[Any, int] = {}
    return [index.setdefault(tuple(str(p) for p in path), len(index)) for path in paths]


def make_fragments(params: Params, count: int) -> Fragments:
    """Layer l of ``params`` into fragment ``l mod count`` (module docstring).

    Raises:
      ValueError: ``count`` < 1 or more than the model has layers.
    """
    layers = _layers(params)
    num_layers = max(layers) + 1 if layers else 0
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"outer_fragments={count!r} must be an int >= 1")
    if count > num_layers:
        raise ValueError(f"outer_fragments={count} is more than the model's {num_layers} layers (at most {num_layers})")
    return Fragments(count, tuple(layer % count for layer in layers))


def check_streaming(streaming: Streaming, local_steps: int) -> Streaming:
    """``streaming`` if its options fit H = ``local_steps``; else ValueError naming the option."""
    f, tau, alpha = streaming
    if isinstance(f, bool) or not isinstance(f, int) or f < 1:
        raise ValueError(f"outer_fragments={f!r} must be an int >= 1")
    if f > local_steps:
        raise ValueError(
            f"outer_fragments={f} must be <= local_steps={local_steps} (each fragment is synchronised at an inner "
            "step of its own)"
        )
    if isinstance(tau, bool) or not isinstance(tau, int) or not 0 <= tau < local_steps:
        raise ValueError(
            f"outer_overlap={tau!r} must be an int in [0, local_steps) = [0, {local_steps}) (a fragment's result "
            "arrives before its next synchronisation)"
        )
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"outer_mix={alpha!r} must be in [0, 1]")
    return streaming


class RoundEvents(NamedTuple):
    """The static plan of one round: ``steps`` the cut points (inner steps done, increasing, the
    last H) and, at each, the fragments launched and then the fragments merged."""

    steps: tuple[int, ...]
    launches: tuple[tuple[int, ...], ...]
    merges: tuple[tuple[int, ...], ...]


def launch_and_merge_steps(local_steps: int, streaming: Streaming) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(L_f, M_f)`` per fragment: its launch step ``floor((f + 1) H / F)`` and its merge step
    ``L_f + tau``, or ``L_f + tau - H`` in the next round when that is past H (then >= 1 and
    before ``L_f``, as tau < H)."""
    h, f, tau = local_steps, streaming.fragments, streaming.overlap
    launch = tuple(((k + 1) * h) // f for k in range(f))
    return launch, tuple(m - h if m > h else m for m in (launch[k] + tau for k in range(f)))


def round_events(local_steps: int, streaming: Streaming) -> RoundEvents:
    """The launch and merge steps of one round in order (:func:`launch_and_merge_steps`)."""
    f = streaming.fragments
    launch, merge = launch_and_merge_steps(local_steps, streaming)
    steps = tuple(sorted({*launch, *merge}))
    return RoundEvents(
        steps,
        tuple(tuple(k for k in range(f) if launch[k] == s) for s in steps),
        tuple(tuple(k for k in range(f) if merge[k] == s) for s in steps),
    )


def fragmented(algorithm: GossipAlgorithm, fragments: Fragments) -> GossipAlgorithm:
    """``algorithm`` as the inner steps see it when every fragment has a state of its own: the state
    is the tuple of the fragments' states; the debiasing, the gradient hook and the honest mask act
    per fragment. Its ``step`` runs every fragment's round (the communication of
    :func:`stream_round` runs one fragment at a time)."""

    def init(params):
        return tuple(algorithm.init(fragments.part(params, k)) for k in range(fragments.count))

    def debias(params, states):
        parts = fragments.split(params)
        return fragments.join(params, [_leaves(algorithm.debias(_tree(p), s)) for p, s in zip(parts, states)])

    def step(params, states, key):
        parts, new_states, bits = fragments.split(params), [], 0.0
        for k, (part, state) in enumerate(zip(parts, states)):
            new, state, info = algorithm.step(_tree(part), state, _fragment_key(key, k, fragments.count))
            parts[k], bits = _leaves(new), bits + info.bits
            new_states.append(state)
        return fragments.join(params, parts), tuple(new_states), info._replace(bits=bits)

    gradient = None
    if algorithm.gradient is not None:

        def gradient(grads, params, states):
            g_parts, p_parts, new_states = fragments.split(grads), fragments.split(params), []
            for k, state in enumerate(states):
                g, state = algorithm.gradient(_tree(g_parts[k]), _tree(p_parts[k]), state)
                g_parts[k] = _leaves(g)
                new_states.append(state)
            return fragments.join(grads, g_parts), tuple(new_states)

    honest = None
    if algorithm.honest is not None:

        def honest(states):
            return algorithm.honest(states[0])  # the attackers are the same nodes in every fragment

    return algorithm._replace(init=init, step=step, debias=debias, gradient=gradient, honest=honest)


def _tree(leaves: list[Array]) -> tuple[Array, ...]:
    """A fragment's leaves as the pytree its algorithm state is built on."""
    return tuple(leaves)


def _leaves(tree: Any) -> list[Array]:
    return list(jax.tree_util.tree_leaves(tree))


def _fragment_key(key: PRNGKey, k: int, count: int) -> PRNGKey:
    return key if count == 1 else jax.random.fold_in(key, k)


class StreamState(NamedTuple):
    """What streaming carries between rounds.

    Attributes:
      opt_states: the outer optax state of every fragment (leaves [N, ...]).
      anchors: every fragment's value after its last synchronisation, leaves [N, ...]: its
        outer result ``g_f``, which is also what a merge applies (a fragment's anchor changes only
        at its launch, and its merge comes before its next launch, as tau < H).
      in_flight: [F] bool, fragments whose result has not been merged yet.
      arrivals: [F, N] float32, for the simulated clock: when the messages still in flight at the
        end of the round arrive, in seconds after the next round's start
        (:mod:`jaxgossip.sim.fragment_clock`).
    """

    opt_states: tuple
    anchors: Params
    in_flight: Array
    arrivals: Array


def stream_init(tx: optax.GradientTransformation, fragments: Fragments, params: Params) -> StreamState:
    """The streaming state at round 0 for models ``params`` [N, ...]."""
    opt_states = tuple(outer_init(tx, _tree(p)).opt_state for p in fragments.split(params))
    num_nodes = jax.tree_util.tree_leaves(params)[0].shape[0]
    arrivals = jnp.zeros([fragments.count, num_nodes], jnp.float32)
    return StreamState(opt_states, params, jnp.zeros([fragments.count], bool), arrivals)


def stream_round(
    algorithm: GossipAlgorithm,
    tx: optax.GradientTransformation,
    message: str,
    streaming: Streaming,
    fragments: Fragments,
    events: RoundEvents,
    inner: Callable[[Any, int, int], Any],
    carry: Any,
    params_of: Callable[[Any], Params],
    with_params: Callable[[Any, Params], Any],
    comm_states: tuple,
    stream: StreamState,
    key_comm: PRNGKey,
    online: Array | None = None,
) -> tuple[Any, tuple, StreamState, Array]:
    """One round of H inner steps with every fragment's synchronisation (module docstring).

    Args:
      algorithm: the communication algorithm (run on one fragment at a time).
      tx, message: the outer optax transformation and message form (:mod:`jaxgossip.engine.outer`).
      streaming, fragments, events: the options, the fragments and :func:`round_events`.
      inner: ``inner(carry, start, stop)`` runs inner steps ``start .. stop - 1`` of the round.
      carry: what the inner steps carry; ``params_of(carry)`` / ``with_params(carry, y)`` read and
        replace its models (leaves [N, ...]).
      comm_states: the tuple of the fragments' algorithm states.
      stream: the :class:`StreamState`.
      key_comm: the round's communication key.
      online: optional [N] bool, the nodes online this round (:func:`outer_round`).

    Returns:
      ``(carry, comm_states, stream, bits)``, ``bits`` a tuple of the [N] bits each fragment's
      message sent this round (``stream.arrivals`` is left for the clock).
    """
    comm_states, opt_states = list(comm_states), list(stream.opt_states)
    anchors, in_flight = stream.anchors, stream.in_flight
    bits, start = [None] * fragments.count, 0
    alpha = float(streaming.mix)
    for step, launches, merges in zip(events.steps, events.launches, events.merges):
        if step > start:
            carry = inner(carry, start, step)
            start = step
        for k in launches:
            result = outer_round(
                algorithm,
                tx,
                message,
                OuterState(opt_state=opt_states[k]),
                fragments.part(anchors, k),
                comm_states[k],
                fragments.part(params_of(carry), k),
                comm_states[k],
                _fragment_key(key_comm, k, fragments.count),
                online,
            )
            comm_states[k], opt_states[k] = result.comm_state, result.outer.opt_state
            new = _leaves(result.params)
            anchors = fragments.replace(anchors, k, new)
            in_flight = in_flight.at[k].set(True)
            bits[k] = result.info.bits
        for k in merges:
            local, result = fragments.split(params_of(carry))[k], fragments.split(anchors)[k]
            if alpha != 0.0:
                result = [(alpha * a + (1.0 - alpha) * b).astype(a.dtype) for a, b in zip(local, result)]
            # In the first round a wrapped merge has nothing in flight yet.
            merged = [jnp.where(in_flight[k], m, a) for m, a in zip(result, local)]
            carry = with_params(carry, fragments.replace(params_of(carry), k, merged))
            in_flight = in_flight.at[k].set(False)
    state = StreamState(tuple(opt_states), anchors, in_flight, stream.arrivals)
    return carry, tuple(comm_states), state, tuple(bits)
