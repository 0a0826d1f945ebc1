"""Topology spec strings (``"ring"``, ``"torus:4x8"``, ``"erdos_renyi:0.3"``) for configs and the CLI."""

from __future__ import annotations

import math

from jaxgossip.topology import constructors
from jaxgossip.topology.graph import Topology

__all__ = ["FAMILIES", "make"]


# Graph families reachable by name from configs and the CLI (from_adjacency / from_matrix need
# arrays), name -> constructor.
FAMILIES = {
    fn.__name__: fn
    for fn in (
        constructors.ring,
        constructors.directed_ring,
        constructors.torus,
        constructors.hypercube,
        constructors.exponential,
        constructors.one_peer_exponential,
        constructors.complete,
        constructors.star,
        constructors.erdos_renyi,
        constructors.random_directed,
    )
}


def _near_square(n: int) -> tuple[int, int]:
    rows = int(math.isqrt(n))
    while n % rows:
        rows -= 1
    return rows, n // rows


def make(spec: str, num_nodes: int, seed: int = 0) -> Topology:
    """Topology from a name such as ``"ring"``, ``"torus"``, ``"erdos_renyi:0.3"``,
    ``"random_directed:0.2"`` or ``"torus:4x8"`` (used by configs and the CLI).

    ``torus`` without sides picks the most square ``rows x cols = num_nodes``; ``erdos_renyi`` and
    ``random_directed`` take their edge probability after the colon and use ``seed``.
    """
    if not isinstance(spec, str):
        raise TypeError(f"topology spec must be a string, got {spec!r}")
    name, _, arg = spec.partition(":")
    if name not in FAMILIES:
        raise ValueError(f"unknown topology {name!r}; known topologies: {list(FAMILIES)}")
    if name == "torus":
        if arg:
            try:
                rows, cols = (int(v) for v in arg.lower().split("x"))
            except ValueError:
                raise ValueError(f"torus spec {spec!r} must look like 'torus:ROWSxCOLS'") from None
        else:
            rows, cols = _near_square(num_nodes)
        return constructors.torus(rows, cols, num_nodes=num_nodes)
    if name in ("erdos_renyi", "random_directed"):
        try:
            p = float(arg) if arg else 0.3
        except ValueError:
            raise ValueError(f"{name} spec {spec!r} must look like '{name}:P' with P a probability") from None
        return FAMILIES[name](num_nodes, p, seed)
    if arg:
        raise ValueError(f"topology {name!r} takes no argument, got {spec!r}")
    return FAMILIES[name](num_nodes)
