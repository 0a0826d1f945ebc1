"""PyTorch per-worker-loop baseline: how a researcher simulates N gossip workers in one process.

Every worker is its own tensor (consensus) or its own ``nn.Module`` + optimizer (training), kept in
a Python list, and a round is a Python loop over the workers and their neighbours. The arithmetic
is that of jaxgossip's algorithms (the runner ``compare.py`` checks it against them):

* gossip:       ``x_i <- x_i + gamma (sum_j W_ij x_j - x_i)``; ``gamma = 1`` is ``x_i <- sum_j W_ij x_j``
  (``jaxgossip.algorithms.gossip``).
* PowerGossip:  rank R, one power-iteration half-step per round, warm start, as in
  ``jaxgossip.algorithms.power_gossip`` (the published PowerGossip code's semantics): oriented
  edges ``e = (a, b)``, ``a < b``, ``D_e = X_b - X_a``; round 0 exchanges nothing; odd rounds
  ``V_hat = orth(V_e)``, ``U_e <- D_e V_hat``, ``Delta_e = U_e V_hat^T``; even rounds
  ``U_hat = orth(U_e)``, ``V_e <- D_e^T U_hat``, ``Delta_e = U_hat V_e^T``; then
  ``X_a += gamma W_ab Delta_e`` and ``X_b -= gamma W_ba Delta_e``, all from the same X. As in a
  multi-process code, each worker keeps its own copy of the shared per-edge state (U_e, V_e),
  orthogonalises it itself and sends only ``X_i V_hat`` (or ``X_i^T U_hat``); the difference of the
  two endpoints' messages is ``D_e V_hat``. Orth = column-wise Gram-Schmidt, ``c / (||c|| + 1e-8)``.
  The initial bases are N(0, 1) per edge from a per-edge seed (both endpoints agree), or given.
* Choco top-k:  public copies ``x_hat_i``; ``q_i = topk(x_i - x_hat_i)``, ``x_hat_i += q_i``,
  ``x_i += gamma sum_j W_ij (x_hat_j - x_hat_i)`` (``jaxgossip.algorithms.choco`` with
  ``compressor="top_k"``; jaxgossip keeps ``s_i = sum_j W_ij x_hat_j`` incrementally, this loop
  recomputes it from the neighbours' copies, which is equal up to float32 round-off).
* gamma sweep:  Choco top-k for each gamma in turn (a Python loop over runs).
* ResNet-20 round: N ``ResNet20`` models (same architecture and parameter count as
  ``jaxgossip.models.resnet20``: 272,474), each an SGD step on its own batch, then plain gossip
  (gamma 1) of the parameters over the graph (batch-norm running statistics stay local, as in
  jaxgossip's trainer).

The graph is given as ``neighbors[i] = [(j, W_ij), ...]`` including ``j = i`` (see
:func:`neighbors_from_matrix`). Threads are the caller's business (``torch.set_num_threads``).
This module needs only torch and numpy (no JAX).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "neighbors_from_matrix",
    "gossip_round",
    "PowerGossipLoop",
    "ChocoTopKLoop",
    "consensus_error",
    "choco_gamma_sweep",
    "ResNet20",
    "num_params",
    "ResNetRound",
]


def neighbors_from_matrix(w: np.ndarray) -> list[list[tuple[int, float]]]:
    """``neighbors[i] = [(j, W_ij)]`` for every ``W_ij != 0`` (self included), in increasing j."""
    w = np.asarray(w, dtype=np.float64)
    return [[(int(j), float(w[i, j])) for j in np.flatnonzero(w[i])] for i in range(w.shape[0])]


# ---- consensus workloads ------------------------------------------------------------------------


@torch.no_grad()
def gossip_round(xs: list[torch.Tensor], neighbors, gamma: float = 1.0) -> list[torch.Tensor]:
    """One round of (relaxed) gossip over a list of per-worker tensors; returns a new list."""
    out = []
    for i, nbrs in enumerate(neighbors):
        mixed = torch.zeros_like(xs[i])
        for j, w in nbrs:
            mixed.add_(xs[j], alpha=w)  # "receive" x_j
        if gamma != 1.0:
            mixed = xs[i] + gamma * (mixed - xs[i])
        out.append(mixed)
    return out


def _orth(c: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Column-wise Gram-Schmidt of ``c [d, R]``, each column scaled ``c / (||c|| + eps)``."""
    cols = [c[:, r].clone() for r in range(c.shape[1])]
    for r in range(len(cols)):
        cols[r] = cols[r] / (torch.linalg.norm(cols[r]) + eps)
        for s in range(r + 1, len(cols)):
            cols[s] = cols[s] - torch.dot(cols[r], cols[s]) * cols[r]
    return torch.stack(cols, dim=1)


class PowerGossipLoop:
    """PowerGossip (rank R, one iteration per round, warm start) on per-worker matrices ``[m, n]``.

    ``state[i][j] = [U, V]`` is worker i's copy of the shared state of edge {i, j}, oriented as
    ``(a, b) = (min, max)`` (both copies stay equal because both endpoints compute the same thing).

    Args:
      xs: per-worker tensors ``[m, n]`` (only used for shapes).
      neighbors: ``neighbors[i] = [(j, W_ij)]``, symmetric, self included.
      rank: R.
      gamma: relaxation.
      init_bases: optional ``{(a, b): (U [m, R], V [n, R])}`` (e.g. jaxgossip's initial state, to
        compare both on the same random vectors); by default N(0, 1) from ``seed * 1_000_003 + a * N + b``.
    """

    def __init__(self, xs, neighbors, rank: int = 1, gamma: float = 1.0, init_bases=None, seed: int = 0):
        self.neighbors = [[(j, w) for j, w in nbrs if j != i] for i, nbrs in enumerate(neighbors)]
        self.gamma = gamma
        self.round = 0
        n_workers = len(xs)
        m, n = xs[0].shape
        r = min(m, n, rank)
        self.state = []
        for i, nbrs in enumerate(self.neighbors):
            mine = {}
            for j, _ in nbrs:
                a, b = min(i, j), max(i, j)
                if init_bases is not None:
                    u, v = (torch.tensor(np.array(z), dtype=xs[0].dtype) for z in init_bases[(a, b)])
                else:
                    g = torch.Generator().manual_seed(seed * 1_000_003 + a * n_workers + b)  # shared per edge
                    u = torch.randn(m, r, generator=g, dtype=xs[0].dtype)
                    v = torch.randn(n, r, generator=g, dtype=xs[0].dtype)
                mine[j] = [u.clone(), v.clone()]
            self.state.append(mine)

    @torch.no_grad()
    def step(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        t = self.round
        self.round += 1
        if t == 0:  # the reference breaks out of the first round: no exchange
            return xs
        right = t % 2 == 1
        # 1) every worker orthogonalises its copy of each edge basis and "sends" its projection
        sent = []
        for i, nbrs in enumerate(self.neighbors):
            msgs = {}
            for j, _ in nbrs:
                st = self.state[i][j]
                if right:
                    st[1] = _orth(st[1])
                    msgs[j] = xs[i] @ st[1]  # X_i V_hat  [m, R]
                else:
                    st[0] = _orth(st[0])
                    msgs[j] = xs[i].T @ st[0]  # X_i^T U_hat  [n, R]
            sent.append(msgs)
        # 2) every worker receives its neighbours' messages and updates its model and edge state
        out = []
        for i, nbrs in enumerate(self.neighbors):
            x = xs[i].clone()
            for j, w in nbrs:
                st = self.state[i][j]
                prod = sent[j][i] - sent[i][j]  # D_ij = X_j - X_i projected
                if i > j:  # the edge is stored as (a, b) = (j, i): D_e = X_i - X_j
                    prod = -prod
                    sign = -1.0
                else:
                    sign = 1.0
                if right:
                    st[0] = prod  # U_e <- D_e V_hat (unnormalised warm start)
                    delta = prod @ st[1].T
                else:
                    st[1] = prod  # V_e <- D_e^T U_hat
                    delta = st[0] @ prod.T
                x.add_(delta, alpha=sign * self.gamma * w)
            out.append(x)
        return out


class ChocoTopKLoop:
    """Choco-Gossip with top-k compression on per-worker tensors (public copies start at 0)."""

    def __init__(self, xs, neighbors, k: int, gamma: float):
        self.neighbors = neighbors
        self.k = k
        self.gamma = gamma
        self.x_hat = [torch.zeros_like(x) for x in xs]

    @torch.no_grad()
    def step(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        for i in range(len(xs)):  # compress and "send" q_i; everyone moves its copy of x_hat_i
            diff = (xs[i] - self.x_hat[i]).flatten()
            _, idx = torch.topk(diff.abs(), self.k, sorted=False)
            q = torch.zeros_like(diff)
            q[idx] = diff[idx]
            self.x_hat[i] += q.view_as(xs[i])
        out = []
        for i, nbrs in enumerate(self.neighbors):
            corr = torch.zeros_like(xs[i])
            for j, w in nbrs:
                if j != i:
                    corr.add_(self.x_hat[j] - self.x_hat[i], alpha=w)
            out.append(xs[i] + self.gamma * corr)
        return out


def consensus_error(xs: list[torch.Tensor], target: torch.Tensor) -> float:
    """``(1/N) sum_i ||x_i - target||^2``, as ``jaxgossip.run_consensus``'s error."""
    return float(sum(torch.sum((x - target) ** 2) for x in xs) / len(xs))


@torch.no_grad()
def choco_gamma_sweep(x0: list[torch.Tensor], neighbors, gammas, rounds: int, k: int) -> list[float]:
    """Choco top-k for every gamma, one run after the other; returns the final consensus errors."""
    target = torch.stack(x0).mean(0)
    finals = []
    for gamma in gammas:
        xs = [x.clone() for x in x0]
        alg = ChocoTopKLoop(xs, neighbors, k, float(gamma))
        for _ in range(rounds):
            xs = alg.step(xs)
        finals.append(consensus_error(xs, target))
    return finals


# ---- ResNet-20 training round ---------------------------------------------------------------------


class _Block(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:  # projection shortcut, as jaxgossip (Choco/PowerGossip variant)
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, 0, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class ResNet20(nn.Module):
    """CIFAR ResNet-20 (16/32/64 channels, 3 blocks per stage, BN, 1x1-conv shortcut); NCHW input."""

    def __init__(self, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        layers, c_in = [], width
        for stage in range(3):
            c_out = width * 2**stage
            for block in range(3):
                layers.append(_Block(c_in, c_out, 2 if stage > 0 and block == 0 else 1))
                c_in = c_out
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layers(x)
        return self.fc(x.mean(dim=(2, 3)))


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class ResNetRound:
    """N ResNet-20 workers: one SGD step each on its own batch, then gossip of the parameters.

    Args:
      neighbors: ``neighbors[i] = [(j, W_ij)]``, self included.
      batches: per worker ``(x [B, 3, 32, 32], y [B])``, reused every round (data loading is not timed).
      lr, momentum: ``torch.optim.SGD`` (same rule as ``optax.sgd(lr, momentum)``).
    """

    def __init__(self, neighbors, batches, lr: float = 0.1, momentum: float = 0.9, seed: int = 0):
        torch.manual_seed(seed)
        self.neighbors = neighbors
        self.batches = batches
        self.models = [ResNet20() for _ in neighbors]
        for m in self.models:
            m.train()
        self.opts = [torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum) for m in self.models]

    def step(self) -> float:
        losses = []
        for model, opt, (x, y) in zip(self.models, self.opts, self.batches):  # local steps
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        with torch.no_grad():  # gossip of the parameters (x_i <- sum_j W_ij x_j), tensor by tensor
            params = [list(m.parameters()) for m in self.models]
            mixed = []
            for i, nbrs in enumerate(self.neighbors):
                new = []
                for t in range(len(params[i])):
                    acc = torch.zeros_like(params[i][t])
                    for j, w in nbrs:
                        acc.add_(params[j][t], alpha=w)
                    new.append(acc)
                mixed.append(new)
            for i in range(len(self.models)):
                for p, new in zip(params[i], mixed[i]):
                    p.copy_(new)
        return float(torch.stack(losses).mean())
