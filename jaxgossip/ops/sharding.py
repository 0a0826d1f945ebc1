"""The node axis over several devices with ``jax.sharding``.

Every per-node leaf (leading axis N) is placed with ``NamedSharding(mesh, P("nodes"))``; everything
else is replicated. ``jit`` then partitions the vmapped local work so that each device computes its
own nodes, and the mixing gathers become cross-device collectives inserted by XLA. Results equal the
single-device run (tested on 8 CPU devices).

Multi-host: call ``jax.distributed.initialize()`` on every host first (``jaxgossip.run.distributed``
does it from the environment, ``python -m jaxgossip.run.launch`` starts P processes on one machine);
``jax.devices()`` then lists the devices of all hosts and the same mesh spans them.

Circulant graphs (ring, directed ring, exponential, one-peer exponential, complete) mix by
``shard_map`` over the ``"nodes"`` axis, where each neighbour shift is at most two ``lax.ppermute``
of contiguous row slices between devices, instead of the gathers XLA partitions on its own.
``mixing.mix`` picks this path by itself for slot-layout graphs whose leaves sit on a mesh with a
``"nodes"`` axis; ``mix_ppermute`` here forces it with an explicit mesh. Measured in
``experiments/bench/ppermute.py``: for static circulant graphs XLA already turns the rolls into the
same collective-permutes (same speed); for a time-varying schedule with a traced round (one-peer
exponential inside ``lax.scan``) the gather becomes an all-gather of the whole leaf, and the
explicit path is faster (2-38x per round on 8 CPU devices, more for larger D).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgossip.ops import mixing
from jaxgossip.ops.mixing import NODE_AXIS, check_params
from jaxgossip.topology import Topology
from jaxgossip.topology.moves import circulant_shifts
from jaxgossip.types import Params

__all__ = ["node_mesh", "shard_nodes", "replicate", "NODE_AXIS", "circulant_shifts", "mix_ppermute", "to_host"]


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


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Places every leaf whole on every device of ``mesh``.

    Why: a jitted program whose node-sharded arrays are all closed over (constants) and whose
    arguments live elsewhere is compiled for one device, and its ``shard_map`` mixing (circulant
    graphs, :func:`mix_ppermute`) then fails at run time (XLA:CPU: no implementation of
    ``xla.sdy.GlobalToLocalShape``). Arguments replicated on the mesh give the program the mesh's
    devices; the sweeps pass their keys and grid values this way.
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.tree_util.tree_map(lambda leaf: jax.device_put(leaf, replicated), tree)


# ---- explicit collectives for circulant graphs ----------------------------------------------------


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

    ``mixing.mix`` takes this path by itself when the leaves are placed on a ``"nodes"`` mesh; this
    function forces it (any layout, explicit mesh) and checks its inputs.

    Args:
      topology: a circulant graph schedule (every slot column of ``Topology.slots`` is one shift).
      x: pytree whose leaves are floating ``[N, ...]``.
      t: round counter, Python int or traced integer scalar; round ``t mod T`` is used.
      mesh: a mesh with an axis ``"nodes"`` (``node_mesh``); None means ``node_mesh(N)`` over all
        devices.

    Returns:
      A pytree like ``x`` (same shapes and dtypes), sharded over ``"nodes"``.

    Raises:
      TypeError: ``topology`` is not a ``Topology`` with host tables (e.g. a traced stack member), or a
        leaf is not floating point.
      ValueError: the topology is not circulant, the mesh has no ``"nodes"`` axis, or N is not
        divisible by the number of devices on it.
    """
    if not isinstance(topology, Topology) or not topology.host_tables:
        raise TypeError(
            "mix_ppermute needs a jaxgossip.topology.Topology with host tables (its shifts are fixed at "
            f"trace time), got {type(topology).__name__}"
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
    return mixing.mix_on_mesh(topology, x, t, mesh)


def to_host(tree: Any) -> Any:
    """A NumPy copy of every leaf of ``tree``, global arrays included.

    A leaf sharded over devices of several processes is gathered with
    ``multihost_utils.process_allgather`` (a collective: call this on every process at the same
    point); other leaves are copied as ``jax.device_get`` does. In one process this is
    ``jax.device_get``.
    """
    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    def one(leaf):
        if isinstance(leaf, jax.Array) and not (leaf.is_fully_addressable or leaf.is_fully_replicated):
            return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        return jax.device_get(leaf)

    return jax.tree_util.tree_map(one, tree)
