"""Graphs whose rounds are convolutions on an abelian group, and their eigenvalues.

A round is a convolution on a group G of order N, its nodes labelled by G's elements, when
``W[i, j] = c[j - i]`` (the difference taken in G) for one kernel c of N values: node 0's row. The
characters of G are then the eigenvectors of every such round at once, and the eigenvalues are the
Fourier transform of c on G, O(N log N) for a graph of millions of nodes where a Lanczos method
needs thousands of products. Three groups cover the families that are: Z_N (circulant: ring,
exponential, one-peer exponential, EquiTopo), Z_a x Z_b on the row-major index (the torus) and
Z_2^d, whose difference is ``i XOR j`` and whose transform is the Walsh-Hadamard transform (the
hypercube). A failure law that treats every edge alike keeps the expected Gram matrix of such a graph
a convolution too (:meth:`jaxgossip.topology.random_spectra.SparseGram.second_eigenvalue`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["group_modes", "group_kernel"]

# Grid sides of a torus tried per graph (from node 0's offsets), each an O(E) test.
_MAX_GRID_SIDES = 8


def group_kernel(senders, receivers, weights, num_nodes: int, difference: Callable) -> np.ndarray | None:
    """[T, N] kernels c with ``W(t)[i, j] = c[t, difference(j, i)]`` when every round of the tables
    is a convolution on the group that ``difference`` names, else None. O(E) per round, no sort.

    Args:
      senders, receivers, weights: [T, E] host tables (weight-0 edges are padding).
      num_nodes: N.
      difference: ``(j, i) -> d`` on int64 arrays, values in [0, N), with ``difference(j, 0) = j``
        (so c is node 0's row): ``(j - i) % N`` for Z_N, ``j ^ i`` for Z_2^d.
    """
    n = num_nodes
    period = np.shape(senders)[0]
    rows = np.zeros((period, n))
    for t in range(period):
        s, r, w = np.asarray(senders[t]), np.asarray(receivers[t]), np.asarray(weights[t])
        keep = w != 0
        receiver, weight = r[keep].astype(np.int64), w[keep].astype(np.float64)
        offset = difference(s[keep].astype(np.int64), receiver)
        # Node 0's row, copied rather than averaged over the N rows: a sum of N weights rounds
        # about N times, and at N = 2^20 that moved a ring's gap of 1.2e-11 by half.
        first = receiver == 0
        rows[t, offset[first]] = weight[first]
        # A convolution iff every node has each of node 0's M offsets once, with node 0's weight:
        # the E = N M codes (receiver, offset's place among the M) then cover [0, N M).
        support = np.flatnonzero(rows[t])
        if offset.size != n * support.size:
            return None
        place = np.full(n, -1, np.int64)
        place[support] = np.arange(support.size)
        where = place[offset]
        if (where < 0).any():
            return None
        seen = np.zeros(offset.size, bool)
        seen[receiver * support.size + where] = True
        if not seen.all() or not np.allclose(weight, rows[t][offset], atol=1e-12):
            return None
    return rows


def group_modes(senders, receivers, weights, num_nodes: int) -> np.ndarray | None:
    """[T, N] complex eigenvalues of every round (index 0: the all-ones vector's) when every round
    is a convolution on one of Z_N, Z_a x Z_b (a b = N, b a side found among node 0's offsets) or
    Z_2^d, else None.

    Args:
      senders, receivers, weights: [T, E] host tables (weight-0 edges are padding).
      num_nodes: N.
    """
    n = num_nodes
    period = np.shape(senders)[0]
    tables = (senders, receivers, weights, n)
    rows = group_kernel(*tables, lambda j, i: (j - i) % n)
    if rows is not None:
        return np.fft.fft(rows, axis=1)
    if n >= 4 and n & (n - 1) == 0:
        rows = group_kernel(*tables, np.bitwise_xor)
        if rows is not None:
            # The d-dimensional transform of axes of size 2 is the Walsh-Hadamard transform.
            shape = (period,) + (2,) * (n.bit_length() - 1)
            return np.fft.fftn(rows.reshape(shape), axes=range(1, len(shape))).reshape(period, n)
    w0 = np.asarray(weights[0])
    first = (w0 != 0) & (np.asarray(receivers[0]) == 0)
    offsets = np.unique(np.asarray(senders[0])[first].astype(np.int64))
    for b in [int(b) for b in offsets if 2 <= b <= n // 2 and n % b == 0][:_MAX_GRID_SIDES]:
        a = n // b

        def grid(j, i, a=a, b=b):
            return (j // b - i // b) % a * b + (j % b - i % b) % b

        rows = group_kernel(*tables, grid)
        if rows is not None:
            return np.fft.fft2(rows.reshape(period, a, b)).reshape(period, n)
    return None
