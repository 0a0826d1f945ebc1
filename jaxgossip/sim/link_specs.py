"""Heterogeneous links from a spec: the ``--time.latency`` / ``--time.bandwidth`` /
``--time.downlink`` grammar.

Besides a number (every link alike), each option takes a per-node spec; node i's latency and
bandwidth price its uplink, the messages it sends, and its downlink the messages it receives
(:mod:`jaxgossip.sim.network`):

* ``constant:V``: every node V (the number V, bit for bit);
* ``stragglers:F,S``: ``round(F N)`` nodes, drawn once from the run's seed, have S times lower
  bandwidth (``b / S``) or S times higher latency (``S l``) than the default link
  (:data:`~jaxgossip.sim.network.DEFAULT_BANDWIDTH`, :data:`~jaxgossip.sim.network.DEFAULT_LATENCY`;
  a downlink's base is the default bandwidth too);
* ``lognormal:MEDIAN,SIGMA``: ``v_i = MEDIAN exp(SIGMA z_i)``, ``z_i ~ N(0, 1)`` drawn once per
  node from the run's seed;
* ``trace:PATH``: a ``.npy`` / ``.csv`` of per-node values ``[N]`` (or one row), or ``[R, N]``:
  round r uses row ``r mod R``; or a device trace (:mod:`jaxgossip.sim.traces`: ``.npz`` or a
  ``.csv`` with a header), whose ``uplink_bps`` (bandwidth), ``downlink_bps`` (downlink) or
  ``latency_s`` (latency) it reads;
* ``edge_trace:PATH`` (latency and bandwidth only): a value per directed edge of the graph, cycled
  over rounds (:mod:`jaxgossip.sim.edge_traces`; laid out on the graph by
  :meth:`jaxgossip.sim.network.Network.links`).

The draws are on the host (NumPy, from the seed and a stream per option), so the clock inside a
compiled run, :func:`jaxgossip.sim.cost.simulate` and the asynchronous planner all see the same
links. Host-side, not jittable.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from jaxgossip.checks import check_number
from jaxgossip.sim.compute import load_trace
from jaxgossip.sim.edge_traces import load_edge_trace

__all__ = ["LINK_KINDS", "LinkSpec", "PerRound", "NodeLinks", "parse_link", "link_values", "join_link_tokens"]

LINK_KINDS = ("constant", "stragglers", "lognormal", "trace", "edge_trace")
# Per-option streams of the seed, so that latency and bandwidth draws are independent.
_STREAMS = {"latency": 0x1A7, "bandwidth": 0xBA2, "downlink": 0xD0E}
# How many comma-separated numbers a kind takes (a list of values split at every comma is joined back).
_ARITY = {"constant": 1, "stragglers": 2, "lognormal": 2}
_GRAMMAR = "constant:V, stragglers:F,S, lognormal:MEDIAN,SIGMA, trace:PATH or edge_trace:PATH"


class LinkSpec(NamedTuple):
    """A parsed per-node link spec (:func:`parse_link`).

    Attributes:
      field: ``"latency"``, ``"bandwidth"`` or ``"downlink"``.
      text: the spec as given (error messages).
      kind: one of :data:`LINK_KINDS` but ``constant`` (which parses to a number).
      numbers: (F, S) for stragglers, (MEDIAN, SIGMA) for lognormal, () for a trace.
      trace: ``[R, N]`` float32 values (trace), an
        :class:`~jaxgossip.sim.edge_traces.EdgeTrace` (edge_trace), else None.
    """

    field: str
    text: str
    kind: str
    numbers: tuple
    trace: Any = None

    @property
    def seeded(self) -> bool:
        """Whether the values are drawn from the run's seed."""
        return self.kind in ("stragglers", "lognormal")

    @property
    def name(self) -> str:
        """``--time.FIELD='SPEC'``, how errors call it."""
        return f"--time.{self.field}={self.text!r}"


class PerRound(NamedTuple):
    """Per-node link values that change with the round: ``values`` ``[R, N]``, round r uses row
    ``r mod R`` (:func:`jaxgossip.sim.network.make_links` takes it for latency or bandwidth)."""

    values: Any


class NodeLinks(NamedTuple):
    """A network's links as :func:`jaxgossip.sim.network.make_links` takes them: each a number, an
    ``[N]`` / ``[T, E]`` array or a :class:`PerRound` ``[R, N]``."""

    latency: Any
    bandwidth: Any


def _numbers(name: str, args: str, count: int, rule: str) -> list[float]:
    parts = args.split(",") if args else []
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != count or not all(np.isfinite(values)):
        raise ValueError(f"{name}: expected {rule}")
    return values


def parse_link(field: str, spec: str, default: float) -> float | np.ndarray | LinkSpec:
    """A number (a number or ``constant:V``), an ``[N]`` array (a list ``[V1,V2,...]``, as the
    command line writes one) or a checked :class:`LinkSpec` from a ``--time.FIELD`` string (a
    trace file is read here, once).

    Args:
      field: ``"latency"`` (values >= 0 s), ``"bandwidth"`` or ``"downlink"`` (values > 0 bit/s).
      spec: the option's text.
      default: the default link of ``field`` (the base of ``stragglers``).

    Raises:
      ValueError: naming ``--time.FIELD`` and the rule the spec breaks.
    """
    unit = "s" if field == "latency" else "bit/s"
    strict = field != "latency"
    name = f"--time.{field}={spec!r}"
    text = spec.strip()
    if text.startswith("[") and text.endswith("]"):
        parts = text[1:-1].split(",")
        return np.asarray(_numbers(name, text[1:-1], len(parts), f"a list of numbers ({unit})"), np.float64)
    kind, colon, args = text.partition(":")
    if not colon:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{name} must be a number ({unit}) or a per-node spec: {_GRAMMAR}") from None
    if kind == "constant":
        (value,) = _numbers(name, args, 1, f"constant:V, V {'>' if strict else '>='} 0 {unit}")
        check_number(f"{name}: V", value, minimum=0.0, strict=strict)
        return value
    if kind == "stragglers":
        fraction, slowdown = _numbers(name, args, 2, "stragglers:F,S with F in [0, 1] and S >= 1")
        if not (0 <= fraction <= 1 and slowdown >= 1):
            raise ValueError(f"{name}: expected stragglers:F,S with F in [0, 1] and S >= 1")
        return LinkSpec(field, spec, kind, (fraction, slowdown), None)
    if kind == "lognormal":
        median, sigma = _numbers(name, args, 2, "lognormal:MEDIAN,SIGMA with MEDIAN > 0 and SIGMA > 0")
        if not (median > 0 and sigma > 0):
            raise ValueError(f"{name}: expected lognormal:MEDIAN,SIGMA with MEDIAN > 0 and SIGMA > 0")
        return LinkSpec(field, spec, kind, (median, sigma), None)
    if kind == "trace":
        column = {"bandwidth": "uplink_bps", "downlink": "downlink_bps", "latency": "latency_s"}[field]
        trace = load_trace(name, args, vector=True, shape="[N] or [rounds, N]", column=column)
        check_number(f"{name}: the trace", trace, minimum=0.0, strict=strict)
        return LinkSpec(field, spec, kind, (), trace)
    if kind == "edge_trace":
        if field == "downlink":
            raise ValueError(f"{name}: a downlink is a node's (what it receives): give a number or a per-node spec")
        trace = load_edge_trace(name, args)
        given = trace.values[~np.isnan(trace.values)]  # NaN: an edge a CSV row leaves out
        check_number(f"{name}: the trace", given, minimum=0.0, strict=strict)
        return LinkSpec(field, spec, kind, (), trace)
    raise ValueError(f"{name}: unknown kind {kind!r}; expected a number or {_GRAMMAR}")


def link_values(spec: LinkSpec, num_nodes: int, seed: int | None, default: float) -> np.ndarray | PerRound:
    """Node i's value of ``spec``: ``[N]`` float64, or a :class:`PerRound` ``[R, N]`` (a trace
    of R > 1 rows).

    Args:
      spec: from :func:`parse_link`.
      num_nodes: N.
      seed: the run's seed (stragglers and lognormal draw from it); None only for a trace.
      default: the default link of the field (the base of ``stragglers``).

    Raises:
      ValueError: a drawn spec without a seed; a trace that does not fit N.
    """
    n = int(num_nodes)
    if spec.kind == "edge_trace":
        raise ValueError(f"{spec.name} gives values per edge: lay it out on the graph (Network.links)")
    if spec.kind == "trace":
        if spec.trace.shape[1] != n:
            raise ValueError(
                f"{spec.name}: a trace of shape {spec.trace.shape} does not fit N = {n} nodes: it must be "
                f"[{n}] or [rounds, {n}]"
            )
        values = spec.trace.astype(np.float64)
        return values[0] if values.shape[0] == 1 else PerRound(values)
    if seed is None:
        raise ValueError(f"{spec.name} draws per-node values from the run's seed; pass seed=")
    rng = np.random.default_rng([int(seed), _STREAMS[spec.field]])
    if spec.kind == "stragglers":
        fraction, slowdown = spec.numbers
        slow = np.zeros(n, bool)
        slow[rng.permutation(n)[: int(round(fraction * n))]] = True
        factor = slowdown if spec.field == "latency" else 1.0 / slowdown
        return np.where(slow, default * factor, default)
    median, sigma = spec.numbers
    return median * np.exp(sigma * rng.standard_normal(n))


def join_link_tokens(tokens: list) -> list:
    """A list of link values split at every comma (``1e9,stragglers:0.25,10`` on the command line
    gives ``[1e9, "stragglers:0.25", 10.0]``) joined back by the grammar: a ``stragglers`` or
    ``lognormal`` spec takes the numbers it still lacks from the tokens after it
    (``[1e9, "stragglers:0.25,10"]``). Other tokens are kept as they are."""
    out, rest = [], list(tokens)
    while rest:
        token = rest.pop(0)
        if isinstance(token, str):
            kind, colon, args = token.strip().partition(":")
            missing = _ARITY.get(kind, 0) - len([a for a in args.split(",") if a.strip()]) if colon else 0
            while missing > 0 and rest and isinstance(rest[0], (int, float)) and not isinstance(rest[0], bool):
                number = repr(float(rest.pop(0)))
                token += "," + (number[:-2] if number.endswith(".0") else number)
                missing -= 1
        out.append(token)
    return out
