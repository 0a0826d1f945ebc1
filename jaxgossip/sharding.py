"""The node axis over several devices with ``jax.sharding``.

Every per-node leaf (leading axis N) is placed with ``NamedSharding(mesh, P("nodes"))``; everything
else is replicated. ``jit`` then partitions the vmapped local work so that each device computes its
own nodes, and the mixing gathers become cross-device collectives inserted by XLA. Results equal the
single-device run (tested on 8 CPU devices).

Multi-host: call ``jax.distributed.initialize()`` on every host first; ``jax.devices()`` then lists
the devices of all hosts and the same mesh spans them. No launcher of our own is needed.

Circulant graphs (ring, directed ring, exponential, one-peer exponential, complete) also have an
explicit path, ``mix_ppermute``: ``shard_map`` over the ``"nodes"`` axis, where each neighbour shift
is at most two ``lax.ppermute`` of contiguous row slices between devices, instead of the gathers XLA
partitions on its own. It computes exactly ``mixing.mix`` (tested on 8 CPU devices). Measured in
``experiments/bench/ppermute.py``: for static circulant graphs XLA already turns ``mix``'s rolls into
the same collective-permutes (same speed); for a time-varying schedule with a traced round (one-peer
exponential inside ``lax.scan``) ``mix``'s gather becomes an all-gather of the whole leaf, and the
explicit path is faster (2-38x per round on 8 CPU devices, more for larger D).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgossip.mixing import check_params
from jaxgossip.topology import Topology
from jaxgossip.types import Array, Params

__all__ = ["node_mesh", "shard_nodes", "NODE_AXIS", "circulant_shifts", "mix_ppermute"]

NODE_AXIS = "nodes"


def node_mesh(num_nodes: int, devices: int | Sequence[Any] | None = None) -> Mesh:
    """A 1-D mesh named ``"nodes"`` over ``devices`` (an int takes the first that many).

    Raises:
      ValueError: N not divisible by the device count (each device must hold whole nodes), or more
        devices requested than exist.
    """
    available = jax.devices()
    if devices is None:
        devices = available
    elif isinstance(devices, (int, np.integer)):
        if devices < 1 or devices > len(available):
            raise ValueError(f"devices={devices} but {len(available)} device(s) are available")
        devices = available[: int(devices)]
    devices = list(devices)
    if num_nodes % len(devices):
        raise ValueError(
            f"N={num_nodes} nodes cannot be split evenly over {len(devices)} devices; choose a device "
            "count that divides N"
        )
    return Mesh(np.array(devices), (NODE_AXIS,))


def shard_nodes(tree: Any, mesh: Mesh, num_nodes: int) -> Any:
    """Places leaves whose leading axis is N on the ``"nodes"`` axis of ``mesh``; replicates the rest."""
    sharded = NamedSharding(mesh, PartitionSpec(NODE_AXIS))
    replicated = NamedSharding(mesh, PartitionSpec())

    def place(leaf):
        if hasattr(leaf, "shape") and len(leaf.shape) > 0 and leaf.shape[0] == num_nodes:
            return jax.device_put(leaf, sharded)
        return jax.device_put(leaf, replicated)

    return jax.tree_util.tree_map(place, tree)


# ---- explicit collectives for circulant graphs ----------------------------------------------------


def circulant_shifts(topology: Topology) -> tuple[tuple[tuple[int, np.ndarray], ...], ...]:
    """Writes every round of a circulant schedule as weighted shifts of the node axis.

    Round t is ``((c_1, w_1), (c_2, w_2), ...)`` with distinct shifts ``c`` in ``[0, N)`` and
    per-node weights ``w`` (numpy [N] float64), such that

    .. math::  (W^{(t)} x)_i = \\sum_c w_c[i] \\, x_{(i + c) \\bmod N}.

    Built from ``Topology.slots``: each in-neighbour slot column must be a single shift over the
    nodes where its weight is non-zero (weight-0 padding may point anywhere). Slots with the same
    shift are merged; shifts keep slot order (self first), so the sum runs in ``mix``'s order.

    Raises:
      ValueError: some round of ``topology`` is not circulant in its node labelling (e.g. star,
        erdos_renyi, torus, hypercube with N >= 4).
    """
    nbr, slot_w = topology.slots
    n = topology.num_nodes
    nodes = np.arange(n)
    rounds = []
    for t in range(topology.period):
        terms: dict[int, np.ndarray] = {}
        for k in range(nbr.shape[2]):
            w = slot_w[t, :, k]
            live = w != 0
            if not live.any():
                continue
            offsets = (nbr[t, live, k].astype(np.int64) - nodes[live]) % n
            if np.any(offsets != offsets[0]):
                raise ValueError(
                    f"topology {topology.name} is not circulant: in round {t} the in-neighbour slot {k} takes "
                    f"from offsets {sorted(set(offsets.tolist()))[:6]} (need one offset c with neighbour "
                    "(i + c) mod N for every node i); mix_ppermute serves circulant graphs only (ring, "
                    "directed_ring, exponential, one_peer_exponential, complete): use mixing.mix on "
                    "inputs placed with shard_nodes instead"
                )
            c = int(offsets[0])
            terms[c] = terms.get(c, np.zeros(n)) + w
        rounds.append(tuple(terms.items()))
    return tuple(rounds)


def _from_device(piece: Array, offset: int, num_devices: int) -> Array:
    """``piece`` as held by device ``d + offset`` (mod P), on every device d."""
    offset %= num_devices
    if offset == 0:
        return piece
    perm = [(src, (src - offset) % num_devices) for src in range(num_devices)]
    return lax.ppermute(piece, NODE_AXIS, perm)


def _shifted_block(block: Array, shift: int, n_local: int, num_devices: int) -> Array:
    """This device's rows of ``roll(x, -shift, axis=0)``, from its block ``[n_local, ...]`` of x.

    Global row ``d n + j`` needs ``x[d n + j + c]`` with ``c = q n + r``: rows ``r..n-1`` of
    device ``d + q`` followed by rows ``0..r-1`` of device ``d + q + 1``, i.e. two ppermutes of
    contiguous slices (one when r = 0), n_local rows received per shift in all.
    """
    q, r = divmod(shift, n_local)
    head = _from_device(block[r:], q, num_devices)
    if r == 0:
        return head
    tail = _from_device(block[:r], q + 1, num_devices)
    return jnp.concatenate([head, tail], axis=0)


def _local_weights(w: np.ndarray, acc: Any, n_local: int) -> Array | float:
    """This device's slice ``[n_local]`` of a per-node weight vector (a scalar when uniform)."""
    if np.all(w == w[0]):
        return float(w[0])
    start = lax.axis_index(NODE_AXIS) * n_local
    return lax.dynamic_slice_in_dim(jnp.asarray(w, acc), start, n_local)


def _mix_round_local(terms, n_local: int, num_devices: int, leaf: Array) -> Array:
    """One round on one device's block ``[n_local, ...]`` of a leaf."""
    acc = jnp.promote_types(leaf.dtype, jnp.float32)
    out = None
    for shift, w in terms:
        # Shift in the leaf's own dtype (bfloat16 sends half the bytes); accumulate in float32.
        shifted = _shifted_block(leaf, shift, n_local, num_devices).astype(acc)
        wl = _local_weights(w, acc, n_local)
        if not isinstance(wl, float):
            wl = jnp.reshape(wl, wl.shape + (1,) * (leaf.ndim - 1))
        term = wl * shifted
        out = term if out is None else out + term
    if out is None:  # a round with no edges at all
        out = jnp.zeros(leaf.shape, acc)
    return out.astype(leaf.dtype)


def mix_ppermute(topology: Topology, x: Params, t: Any = 0, mesh: Mesh | None = None) -> Params:
    """``mixing.mix(topology, x, t)`` for a circulant graph, as ``shard_map`` + ``lax.ppermute``.

    .. math::  X^{t+1} = W^{(t)} X^{t}, \\quad (W^{(t)} X)_i = \\sum_c w_c[i] X_{(i + c) \\bmod N}

    The node axis is split into P blocks of ``n = N / P`` consecutive nodes, one per device of the
    mesh axis ``"nodes"``. Each shift c of round t (``circulant_shifts``) sends two contiguous row
    slices between devices, ``d + c // n -> d`` and ``d + c // n + 1 -> d`` (one ppermute when
    ``c % n == 0``, none when the source is the device itself), so a round moves
    ``(number of shifts) x n x D`` values per device and never an index table. Per-node weights are
    sliced to the local rows. For a time-varying schedule and a traced ``t``, ``lax.switch`` picks
    among the T rounds, each with its own static ppermutes, so it runs inside ``lax.scan``.

    Usage (jit it; inputs may already be placed with ``shard_nodes`` or be on one device)::

      mesh = node_mesh(N)                                    # all devices; N % P == 0
      step = jax.jit(lambda x, t: mix_ppermute(topo, x, t, mesh))
      x = shard_nodes(x, mesh, N)
      x = jax.lax.scan(lambda x, t: (step(x, t), None), x, jnp.arange(R))[0]

    The algorithms call ``mixing.mix`` and take no other mixer; use this function in your own
    step functions (gossip: ``relax(x, mix_ppermute(topo, x, t, mesh), gamma)``).

    Args:
      topology: a circulant graph schedule (every slot column of ``Topology.slots`` is one shift).
      x: pytree whose leaves are floating ``[N, ...]``.
      t: round counter, Python int or traced integer scalar; round ``t mod T`` is used.
      mesh: a mesh with an axis ``"nodes"`` (``node_mesh``); None means ``node_mesh(N)`` over all
        devices.

    Returns:
      A pytree like ``x`` (same shapes and dtypes), sharded over ``"nodes"``.

    Raises:
      TypeError: ``topology`` is not a ``Topology`` (e.g. a traced ``TopologyStack`` member), or a
        leaf is not floating point.
      ValueError: the topology is not circulant, the mesh has no ``"nodes"`` axis, or N is not
        divisible by the number of devices on it.
    """
    if not isinstance(topology, Topology):
        raise TypeError(
            f"mix_ppermute needs a jaxgossip.topology.Topology (its shifts are fixed at trace time), got "
            f"{type(topology).__name__}"
        )
    n = check_params(topology, x)
    if mesh is None:
        mesh = node_mesh(n)
    if NODE_AXIS not in mesh.axis_names:
        raise ValueError(f"mesh has axes {mesh.axis_names}; mix_ppermute needs an axis named {NODE_AXIS!r}")
    num_devices = int(mesh.shape[NODE_AXIS])
    if n % num_devices:
        raise ValueError(
            f"N={n} nodes cannot be split evenly over {num_devices} devices on mesh axis {NODE_AXIS!r}; "
            "choose a device count that divides N"
        )
    if topology.period == 1:
        return _sharded_mixer(topology, mesh, 0)(x)
    if isinstance(t, (int, np.integer)):
        return _sharded_mixer(topology, mesh, int(t) % topology.period)(x)
    return _sharded_mixer(topology, mesh, None)(x, jnp.asarray(t, jnp.int32) % topology.period)


@functools.lru_cache(maxsize=256)
def _sharded_mixer(topology: Topology, mesh: Mesh, round_idx: int | None):
    """The jitted shard_map for round ``round_idx`` (static) or for all rounds (None: ``f(x, idx)``).

    Jitted and cached so that calls outside ``jit`` compile once instead of running the shard_map
    body op by op; under an outer ``jit`` it is inlined. ``circulant_shifts`` raises for a
    non-circulant graph here, and lru_cache does not cache exceptions.
    """
    num_devices = int(mesh.shape[NODE_AXIS])
    n_local = topology.num_nodes // num_devices
    plan = circulant_shifts(topology)
    branches = [
        functools.partial(jax.tree_util.tree_map, functools.partial(_mix_round_local, terms, n_local, num_devices))
        for terms in plan
    ]
    spec = PartitionSpec(NODE_AXIS)
    if round_idx is not None:
        return jax.jit(jax.shard_map(branches[round_idx], mesh=mesh, in_specs=(spec,), out_specs=spec))

    def body(x_local, idx):
        return lax.switch(idx, branches, x_local)

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, PartitionSpec()), out_specs=spec))
