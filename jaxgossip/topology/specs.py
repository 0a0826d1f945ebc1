"""Topology spec strings (``"ring"``, ``"torus:4x8"``, ``"erdos_renyi:0.3"``, ``"random_out:2"``,
``"base:2"``, ``"u_equistatic:4"``, ``"spanning_tree:torus"``, ``"ring+drop:0.3"``,
``"torus+drop:0.1+nodedrop:0.05"``) for configs and the CLI."""

from __future__ import annotations

import math

from jaxgossip.topology import constructors, equitopo, failures, finite_time, stochastic, trees
from jaxgossip.topology.graph import Topology

__all__ = ["FAMILIES", "SUFFIXES", "make", "check_spec"]


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
        stochastic.random_matching,
        stochastic.random_out,
        trees.chain,
        trees.binary_tree,
        trees.dumbbell,
        trees.spanning_tree,
        equitopo.d_equistatic,
        equitopo.u_equistatic,
        equitopo.od_equidyn,
        equitopo.ou_equidyn,
    )
}
# The Base-(k+1) graph is written "base:K" (K = the maximum degree k).
FAMILIES["base"] = finite_time.base_graph

# Spec suffixes that wrap a graph in with_failures, ``BASE+drop:P+nodedrop:Q`` -> their argument.
SUFFIXES = {
    "drop": "link_drop",
    "nodedrop": "node_drop",
}


def _failures(spec: str, suffixes: list[str]) -> dict:
    """``["drop:0.3", "nodedrop:0.1"]`` -> with_failures keyword arguments."""
    usage = f"topology spec {spec!r}: failures are written BASE+drop:P and/or BASE+nodedrop:Q with P, Q in [0, 1)"
    out = {}
    for suffix in suffixes:
        kind, _, arg = suffix.partition(":")
        if kind == "coins":  # +coins:hash, the cheaper draw of with_failures
            if "coins" in out or arg not in ("threefry", "hash"):
                raise ValueError(f"topology spec {spec!r}: the coins are written +coins:hash or +coins:threefry")
            out["coins"] = arg
            continue
        if kind not in SUFFIXES:
            raise ValueError(
                f"unknown topology suffix {'+' + kind!r} in {spec!r}; known: +drop:P, +nodedrop:Q, +coins:hash"
            )
        if SUFFIXES[kind] in out or not arg:
            raise ValueError(usage)
        try:
            out[SUFFIXES[kind]] = float(arg)
        except ValueError:
            raise ValueError(usage) from None
    return out


def _near_square(n: int) -> tuple[int, int]:
    rows = int(math.isqrt(n))
    while n % rows:
        rows -= 1
    return rows, n // rows


def _int_arg(spec: str, arg: str, what: str, default: int | None = None) -> int:
    """The integer after the colon of ``spec`` (>= 1), else a ValueError naming the spec."""
    name = spec.partition(":")[0]
    if not arg and default is not None:
        return default
    try:
        value = int(arg)
    except ValueError:
        value = None
    if value is None or value < 1:
        raise ValueError(f"{name} spec {spec!r}: {what} must be an int >= 1, got {arg!r}")
    return value


def make(spec: str, num_nodes: int, seed: int = 0) -> Topology:
    """Topology from a name such as ``"ring"``, ``"torus"``, ``"erdos_renyi:0.3"``,
    ``"random_directed:0.2"`` or ``"torus:4x8"`` (used by configs and the CLI).

    ``torus`` without sides picks the most square ``rows x cols = num_nodes``; ``erdos_renyi`` and
    ``random_directed`` take their edge probability after the colon and use ``seed``;
    ``random_out:S`` takes the out-degree s (default 1); ``random_matching`` takes nothing (a uniform
    draw) or ``random_matching:feistel`` (the O(N) pseudo-random draw of
    :func:`~jaxgossip.topology.random_matching`);
    ``base:K`` is the Base-(K+1) graph of maximum degree K >= 1 (default 1);
    ``d_equistatic:M`` / ``u_equistatic:M`` take M >= 1 basis graphs (default ``ceil(log2 N)``) and
    use ``seed``; ``od_equidyn`` / ``ou_equidyn`` take an optional eta in (0, 1] (default 0.5);
    ``spanning_tree:SPEC`` is the BFS tree (root 0) of the graph SPEC. A
    suffix ``+drop:P`` (link failures) and/or ``+nodedrop:Q`` (node failures) wraps the graph in
    :func:`~jaxgossip.topology.with_failures` (e.g. ``"torus:4x4+drop:0.3"``, ``"ring+nodedrop:0.1"``);
    ``+coins:hash`` draws its coins by the cheaper hash (``with_failures(..., coins="hash")``).
    """
    if not isinstance(spec, str):
        raise TypeError(f"topology spec must be a string, got {spec!r}")
    base, *suffixes = spec.split("+")
    if suffixes:
        options = _failures(spec, suffixes)
        return failures.with_failures(make(base, num_nodes, seed), **options)
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
    if name == "random_out":
        try:
            s = int(arg) if arg else 1
        except ValueError:
            raise ValueError(f"random_out spec {spec!r} must look like 'random_out:S' with S an int") from None
        return FAMILIES[name](num_nodes, s)
    if name == "random_matching" and arg:
        if arg != "feistel":
            raise ValueError(f"random_matching spec {spec!r}: the only argument is 'feistel' (random_matching:feistel)")
        return FAMILIES[name](num_nodes, draw="feistel")
    if name == "base":
        return FAMILIES[name](num_nodes, _int_arg(spec, arg, "K (the maximum degree)", default=1))
    if name in ("d_equistatic", "u_equistatic"):
        m = _int_arg(spec, arg, "M (the number of basis graphs)") if arg else None
        return FAMILIES[name](num_nodes, m, seed)
    if name in ("od_equidyn", "ou_equidyn"):
        if not arg:
            return FAMILIES[name](num_nodes)
        try:
            eta = float(arg)
        except ValueError:
            raise ValueError(f"{name} spec {spec!r} must look like '{name}:ETA' with ETA in (0, 1]") from None
        return FAMILIES[name](num_nodes, eta)
    if name == "spanning_tree":
        if not arg:
            raise ValueError(f"spanning_tree spec {spec!r} must name the graph to span, e.g. 'spanning_tree:torus'")
        inner = arg.partition(":")[0]
        if inner not in FAMILIES:
            raise ValueError(
                f"spanning_tree spec {spec!r}: unknown topology {inner!r}; known topologies: {list(FAMILIES)}"
            )
        return FAMILIES[name](make(arg, num_nodes, seed))
    if arg:
        raise ValueError(f"topology {name!r} takes no argument, got {spec!r}")
    return FAMILIES[name](num_nodes)


def _check_range(spec: str, arg: str, kind: type, low: float, high: float, closed_high: bool, what: str) -> None:
    name = spec.partition(":")[0]
    try:
        value = kind(arg)
    except ValueError:
        value = None
    ok = value is not None and low <= value and (value <= high if closed_high else value < high)
    if not ok:
        raise ValueError(f"{name} spec {spec!r}: {what}, got {arg!r}")


def check_spec(spec: str) -> None:
    """Checks a spec's family names and arguments without building a graph (no N needed), so a
    command line can refuse ``base:0`` or ``u_equistatic:0`` before any work even when other sizes
    or specs are fine. What depends on N (a hypercube's power of two, a torus's sides) is left to
    :func:`make`.

    Raises:
      ValueError: naming the spec, for an unknown family or suffix, or a malformed or out-of-range
        argument.
    """
    if not isinstance(spec, str):
        raise TypeError(f"topology spec must be a string, got {spec!r}")
    base, *suffixes = spec.split("+")
    for kind, value in _failures(spec, suffixes).items():
        if kind != "coins" and not 0.0 <= value < 1.0:
            raise ValueError(f"topology spec {spec!r}: {kind}={value!r} must be a probability in [0, 1)")
    name, _, arg = base.partition(":")
    if name not in FAMILIES:
        raise ValueError(f"unknown topology {name!r}; known topologies: {list(FAMILIES)}")
    if name == "spanning_tree":
        if not arg:
            raise ValueError(f"spanning_tree spec {spec!r} must name the graph to span, e.g. 'spanning_tree:torus'")
        return check_spec(arg)
    if not arg:
        return
    if name == "torus":
        try:
            sides = [int(v) for v in arg.lower().split("x")]
        except ValueError:
            sides = []
        if len(sides) != 2 or min(sides) < 2:
            raise ValueError(f"torus spec {spec!r} must look like 'torus:ROWSxCOLS' with sides >= 2")
    elif name in ("erdos_renyi", "random_directed"):
        _check_range(base, arg, float, 0.0, 1.0, True, "P must be a probability in (0, 1]")
        if float(arg) == 0.0:
            raise ValueError(f"{name} spec {spec!r}: P must be a probability in (0, 1], got {arg!r}")
    elif name in ("random_out", "base", "d_equistatic", "u_equistatic"):
        what = {"random_out": "S (the out-degree)", "base": "K (the maximum degree)"}.get(
            name, "M (the number of basis graphs)"
        )
        _int_arg(base, arg, what)
    elif name == "random_matching":
        if arg != "feistel":
            raise ValueError(f"random_matching spec {spec!r}: the only argument is 'feistel' (random_matching:feistel)")
    elif name in ("od_equidyn", "ou_equidyn"):
        _check_range(base, arg, float, 0.0, 1.0, True, "ETA must lie in (0, 1]")
        if float(arg) == 0.0:
            raise ValueError(f"{name} spec {spec!r}: ETA must lie in (0, 1], got {arg!r}")
    else:
        raise ValueError(f"topology {name!r} takes no argument, got {spec!r}")
