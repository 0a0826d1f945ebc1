"""PowerGossip's pair tables: every graph edge as one oriented node pair per round.

Moved here unchanged from the former ``Topology.pairs``; it belongs next to PowerGossip
(``jaxgossip/algorithms/power_gossip.py``), where it moves once that module is restructured.
Host-side NumPy, not jittable.
"""

from __future__ import annotations

import numpy as np

__all__ = ["pair_table"]


def pair_table(
    senders: np.ndarray, receivers: np.ndarray, weights: np.ndarray, num_nodes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Oriented node pairs for edge-wise algorithms (PowerGossip).

    Returns ``(a, b, w_ab, w_ba)``, each [T, P]: every unordered pair ``{a, b}`` with ``a < b``
    and ``W_t[a, b] > 0`` or ``W_t[b, a] > 0``; ``w_ab = W_t[a, b]`` is what ``a`` takes from
    ``b``. Padding pairs are ``(0, 0)`` with weights 0. Pairs are sorted by ``(a, b)``.

    Args:
      senders, receivers: [T, E] int; weights: [T, E] float (weight-0 edges are padding).
      num_nodes: N.
    """
    n, period = num_nodes, senders.shape[0]
    per_t = []
    for t in range(period):
        keep = (weights[t] != 0) & (senders[t] != receivers[t])
        s, r, w = senders[t][keep], receivers[t][keep], weights[t][keep]
        lo, hi = np.minimum(s, r), np.maximum(s, r)
        code = lo.astype(np.int64) * n + hi
        uniq, inv = np.unique(code, return_inverse=True)
        w_ab = np.zeros(uniq.size)
        w_ba = np.zeros(uniq.size)
        # Edge (s -> r): receiver r takes weight w from s.  If r = lo, it is w_ab.
        np.add.at(w_ab, inv[r == lo], w[r == lo])
        np.add.at(w_ba, inv[r == hi], w[r == hi])
        per_t.append((uniq // n, uniq % n, w_ab, w_ba))
    p = max(1, max(x[0].size for x in per_t))
    out = [np.zeros((period, p), dtype=np.int32) for _ in range(2)] + [np.zeros((period, p)) for _ in range(2)]
    for t, arrays in enumerate(per_t):
        for o, arr in zip(out, arrays):
            o[t, : arr.size] = arr
    return tuple(out)
