"""Link specs as sweep values: the values of a ``--sweep.time.latency|bandwidth|downlink`` axis
(numbers and per-node or per-edge specs, :mod:`jaxgossip.sim.link_specs`) drawn on the host into
one table.

A spec's links are host arrays drawn from the run's seed, constants of a compiled run. To sweep
them in one compile, every value v of an axis and every seed s is drawn into row ``[v, s]`` of one
float64 array in a layout all values share:

* ``"node"``: ``[V, S, N]`` (numbers, ``constant``, ``stragglers``, ``lognormal``, a one-row trace);
* ``"node_rounds"``: ``[V, S, R, N]``, round r uses row ``r mod R`` (a trace of R rows; the other
  values repeat their row R times);
* ``"edge"``: ``[V, S, T, E]`` aligned with ``topology.senders`` (an edge trace; a per-node value
  becomes its sender's, as :func:`jaxgossip.sim.network.make_links` lays it out);
* ``"edge_rounds"``: ``[V, S, R, E]`` (an edge trace of R rows on a static graph).

Grid point g then takes row ``[v_g, s]`` inside the vmapped program (:meth:`LinkTable.links`):
the same numbers as a run given the value directly, so a sweep point equals the single run bit for
bit. Values whose row counts differ (two traces of 3 and 5 rows), or a per-round node trace next to
an edge trace, cannot share a layout and are refused naming both. Host-side NumPy, not jittable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxgossip.sim.edge_traces import PerRoundEdge
from jaxgossip.sim.link_specs import PerRound
from jaxgossip.sim.network import Network

__all__ = ["LINK_FIELDS", "LinkTable", "link_table", "needs_table"]

LINK_FIELDS = ("latency", "bandwidth", "downlink")


class LinkTable(NamedTuple):
    """One link field's values for every sweep value and seed (module docstring).

    Attributes:
      field: ``"latency"``, ``"bandwidth"`` or ``"downlink"``.
      values: ``[V, S, ...]`` float64 in ``layout``.
      layout: ``"node"``, ``"node_rounds"``, ``"edge"`` or ``"edge_rounds"``.
      labels: the V values as given (numbers or spec texts), for tables and plots.
    """

    field: str
    values: np.ndarray
    layout: str
    labels: tuple

    def links(self, row: Any) -> Any:
        """``row`` (``values[v, s]``, traced) as :class:`~jaxgossip.sim.network.Network` takes it."""
        if self.layout == "node_rounds":
            return PerRound(row)
        if self.layout == "edge_rounds":
            return PerRoundEdge(row)
        return row


def needs_table(field: str, value: Any, swept: Sequence[Any] | None) -> bool:
    """Whether link ``field`` needs a :class:`LinkTable` in a sweep: its axis has a spec among its
    values, or (not swept) its one value is drawn from the seed (``stragglers``, ``lognormal``),
    whose draw differs from seed to seed."""
    if swept is not None:
        return any(isinstance(v, str) for v in swept)
    spec = Network(**{field: value}).link_specs.get(field) if isinstance(value, str) else None
    return spec is not None and spec.seeded


def _draw(field: str, value: Any, topology: Any, num_nodes: int, seed: int) -> Any:
    """One value's links, as a run with ``--time.FIELD=value`` and this seed lays them out
    (:meth:`~jaxgossip.sim.network.Network.field_values`): ``[N]``, :class:`PerRound` ``[R, N]``,
    ``[T, E]`` or :class:`PerRoundEdge`."""
    network = Network(**{field: value})  # parsed and checked as --time.FIELD is
    if field in network.link_specs:
        return network.field_values(field, num_nodes, seed, (topology,))
    given = getattr(network, field)
    if given is None or np.ndim(given) > 1 or np.size(given) not in (1, num_nodes):
        raise ValueError(f"--time.{field}={value!r}: a sweep value is a number, [N] = [{num_nodes}] values or a spec")
    return np.broadcast_to(np.asarray(given, np.float64), (num_nodes,)).copy()


def _kind(drawn: Any) -> tuple[str, int]:
    """(layout, rows) of one drawn value."""
    if isinstance(drawn, PerRound):
        return "node_rounds", drawn.values.shape[0]
    if isinstance(drawn, PerRoundEdge):
        return "edge_rounds", drawn.values.shape[0]
    return ("edge", drawn.shape[0]) if drawn.ndim == 2 else ("node", 1)


def link_table(
    field: str,
    values: Sequence[Any],
    *,
    topology: Any,
    num_nodes: int,
    seeds: Sequence[int],
) -> LinkTable:
    """The :class:`LinkTable` of link ``field`` over ``values`` x ``seeds``.

    Args:
      field: ``"latency"``, ``"bandwidth"`` or ``"downlink"``.
      values: V numbers or spec strings (``--time.FIELD`` grammar).
      topology: the run's graph (lays out edge traces and per-node values next to them); None for
        an all-reduce, which has no edges.
      num_nodes: N.
      seeds: the S seeds (``stragglers`` and ``lognormal`` draw from each, as a run of that seed).

    Raises:
      ValueError: naming ``--time.FIELD`` and the value: a bad spec, a trace that does not fit,
        values that cannot share a layout (module docstring).
    """
    if field not in LINK_FIELDS:
        raise ValueError(f"link field {field!r} is unknown; known: {', '.join(LINK_FIELDS)}")
    drawn = [[_draw(field, v, topology, num_nodes, int(s)) for s in seeds] for v in values]
    kinds = {v: _kind(d[0]) for v, d in zip(values, drawn)}
    edge = any(k[0].startswith("edge") for k in kinds.values())
    rows = {v: r for v, (k, r) in kinds.items() if k.endswith("rounds")}
    if len(set(rows.values())) > 1:
        (a, ra), (b, rb) = list(rows.items())[:2]
        raise ValueError(
            f"--time.{field}: sweep values {a!r} ({ra} rows) and {b!r} ({rb} rows) change with the round at "
            "different periods; give traces of the same number of rows"
        )
    if edge and any(k == "node_rounds" for k, _ in kinds.values()):
        node = next(v for v, (k, _) in kinds.items() if k == "node_rounds")
        per_edge = next(v for v, (k, _) in kinds.items() if k.startswith("edge"))
        raise ValueError(
            f"--time.{field}: sweep values {node!r} (per node, per round) and {per_edge!r} (per edge) have no "
            "common layout; give a per-edge trace of rounds instead"
        )
    period = next(iter(rows.values()), None)
    if edge:
        senders = np.asarray(topology.senders)
        layout = "edge_rounds" if period is not None else "edge"

        def shaped(d):
            d = d.values if isinstance(d, PerRoundEdge) else d
            d = d[senders] if d.ndim == 1 else d  # a node's value prices its sender's edges
            return np.broadcast_to(d, (period, d.shape[1])) if period is not None else d

    else:
        layout = "node_rounds" if period is not None else "node"

        def shaped(d):
            d = d.values if isinstance(d, PerRound) else d
            return np.broadcast_to(d, (period, num_nodes)) if period is not None else d

    table = np.stack([np.stack([shaped(d) for d in per_seed]) for per_seed in drawn]).astype(np.float64)
    labels = tuple(v if isinstance(v, str) else float(v) for v in values)
    return LinkTable(field, table, layout, labels)
