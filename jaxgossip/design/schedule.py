"""Mixing weights that minimize the consensus error after a number of rounds, on given supports:
a T-periodic schedule (one weighting per round of a time-varying graph) or one static weighting.

Given the supports ``S(0), ..., S(P-1)`` (the pairs j -> i a round may use, self-loops always
allowed) and a horizon of R rounds with ``W(t) = W(t mod P)``, the design minimizes the squared
consensus error of the whole run

.. math::  e(W) = \\| W(R-1) \\cdots W(1) W(0) - J \\|_F^2, \\qquad J = 11^T / N

over non-negative doubly stochastic ``W(t)`` supported on ``S(t mod P)``: ``e = 0`` is exact
averaging after R rounds (the one-peer exponential graph for N = 2^k, the Base-(k+1) graph), and
``e / (N - 1)`` is the mean over random starts of the squared consensus error relative to its start.

* **Parametrization.** Each round's weights are the Sinkhorn scaling ``W = D_u exp(theta) D_v`` of
  a positive matrix on the support (Sinkhorn 1964: a pattern with a positive diagonal, here the
  self-loops, has a doubly stochastic scaling), with one logit ``theta`` per edge, shared by
  ``i -> j`` and ``j -> i`` in an undirected round so that its W is symmetric. Every iterate is
  therefore a mixing matrix of the library; the optimizer sees unconstrained logits. A finite
  number of Sinkhorn sweeps leaves rows off 1 where the weights spread over many decades (as
  designs drive some logits towards -inf), and an objective evaluated on such a matrix can be
  lowered by the defect itself; so each undirected round is then made exactly doubly stochastic,
  ``W = I - L(a / c)`` with ``a`` the symmetrized pair weights and ``c_l = max(1, s_u, s_v)`` the
  excess of the rows' off-diagonal sums, inside the objective and in the returned weights alike
  (the weights returned are those whose error was minimized). Directed rounds keep the Sinkhorn
  scaling, swept to ``1e-13`` at the end. Weights that must vanish (e.g. links no
  doubly stochastic matrix can use) go to 0 only in the limit ``theta -> -inf``.
* **Objective.** The rounds act on ``X_0 = I`` [N, N] with the library's mixing kernels
  (:func:`jaxgossip.ops.mixing.mix` on :meth:`Topology.with_weights`), so ``X_R = W(R-1) ... W(0)``
  and ``e = ||X_R - J||_F^2``: exact, O(R E N) per evaluation and no dense matrix product. With
  ``probes=D`` the rounds act on D fixed Gaussian columns instead, ``e ~ (1/D) ||(X_R - J) Z||_F^2``
  (Hutchinson's estimator, unbiased), O(R E D): matrix-free, for large N. Unbiased for fixed
  weights, not at the weights fitted to it: with few probes the optimizer lowers the estimate by
  fitting the probes while the true error rises. So D more probes, drawn independently, are held
  out: the design returns the iterate of least held-out error and stops once it has not fallen for
  25 steps (early stopping).
* **Optimizer.** L-BFGS (``optax.lbfgs``, zoom line search) on ``log e`` as a function of the
  logits (the error falls like ``rate^(2R)``: in the logarithm every decade costs the same), with
  gradients by JAX through the unrolled Sinkhorn iterations and the R rounds, in float64.
* **A static weighting** (P = 1, R rounds) minimizes ``||W^R - J||_F^2 = sum_k lambda_k^{2R}`` over
  the non-unit eigenvalues of a symmetric W: a smooth surrogate of the SLEM, the ``2R``-norm of the
  spectrum instead of its max, which tends to ``SLEM^{2R}`` as R grows. It is a surrogate, not the
  SLEM: :func:`jaxgossip.design.fastest_mixing` solves the SLEM problem exactly (certified gap) where
  its dense ``O(N^3)`` steps fit; this design scales to thousands of nodes with probes.
* **What the error after R rounds does not constrain.** The sum weighs every mode alike, so while R
  is short of the mixing time ``1 / (1 - SLEM)`` the bulk of the spectrum dominates it, and with D
  probes the slow modes are seen through D random projections only: the design lowers the error
  after R rounds but need not lower the SLEM. Measured on the 1,024-node torus (R = 30, mixing
  time ~130 rounds): with 32 probes the exact error after 30 rounds fell 10% below the uniform
  start's while the SLEM (0.99225) stayed at Metropolis's (0.99231); the exact objective (no
  probes) gave 0.99076 (optimum 0.99044). On a vertex-transitive graph the exact
  design keeps the uniform weights' symmetry; probes break it. For the least SLEM use
  ``fastest_mixing``; use this design for its objective, the error after R rounds.

The problem is not convex for P > 1 or R > 1 (products of the weights); L-BFGS finds a local
minimum, and ``seed`` restarts from random logits.

References:
  Sinkhorn, "A relationship between arbitrary positive matrices and doubly stochastic matrices",
  Annals of Mathematical Statistics 35(2), 1964.
  Ying, Yuan, Chen, Hu, Pan, Yin, "Exponential graph is provably efficient for decentralized deep
  training", NeurIPS 2021 (exact averaging of the one-peer exponential graph).
  Takezawa, Sato, Bao, Niwa, Yamada, "Beyond Exponential Graph", NeurIPS 2023 (Base-(k+1) graphs).
  Hutchinson, "A stochastic estimator of the trace of the influence matrix", 1989.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxgossip.checks import check_int
from jaxgossip.ops.mixing import mix
from jaxgossip.topology import Topology
from jaxgossip.topology.edges import count_components

__all__ = ["ScheduleDesign", "schedule_supports", "consensus_weights", "schedule_error"]

# Sinkhorn sweeps inside the objective (differentiated through): the logits start and stay near a
# doubly stochastic scaling, so a few sweeps keep rows and columns within ~1e-10 of 1.
_INNER_SWEEPS = 30
# Sinkhorn sweeps at most for the returned weights, and the row / column tolerance they aim at.
_FINAL_SWEEPS, _FINAL_TOL = 20000, 1e-13
# L-BFGS stops when the objective fell by less than a relative 1e-6 over this many steps.
_STALL = 25


class ScheduleDesign(NamedTuple):
    """Weights of least consensus error after ``rounds`` rounds (:func:`consensus_weights`).

    Attributes:
      topology: the designed graph, an ordinary :class:`~jaxgossip.topology.Topology` of period P
        (P = 1: static), non-negative and doubly stochastic, on the given supports.
      error: ``||W(R-1) ... W(0) - J||_F^2`` of the designed weights (exact, dense, whatever
        ``probes`` was).
      start_error: the same for the starting weights (the Sinkhorn scaling of the all-ones pattern
        with ``seed=None``: uniform weights on a regular support).
      history: [steps + 1] float64, the objective (relative: divided by N - 1) at the start and after
        every L-BFGS step up to the returned one (with probes, the step of least held-out error).
      rounds: R, the horizon the error is taken at.
      probes: D, the Gaussian columns of the matrix-free objective (None: exact, ``X_0 = I``).
    """

    topology: Topology
    error: float
    start_error: float
    history: np.ndarray
    rounds: int
    probes: int | None


class _Support(NamedTuple):
    """Edges of all rounds, padded to [P, E]; ``param`` maps every edge to its logit."""

    senders: np.ndarray  # [P, E] int32
    receivers: np.ndarray  # [P, E] int32
    live: np.ndarray  # [P, E] bool, False on padding
    param: np.ndarray  # [P, E] int64, the logit of each edge (0 on padding; masked out)
    num_params: int
    symmetric: np.ndarray  # [P] bool, rounds whose support is undirected
    num_nodes: int


def _round_pairs(graph: Any, n: int | None, what: str) -> tuple[list[np.ndarray], int]:
    """The boolean patterns [N, N] (``pattern[i, j]``: j -> i) of each round of ``graph``."""
    if isinstance(graph, Topology):
        if graph.stochastic or not graph.host_tables or graph.num_graphs is not None:
            raise ValueError(f"{what} needs fixed graphs built on the host; {graph.name} is not one")
        m = graph.num_nodes
        out = []
        for t in range(graph.period):
            s, r, w = graph.senders[t], graph.receivers[t], np.asarray(graph.weights[t], np.float64)
            if not np.all(np.isfinite(w)):
                raise ValueError(f"{graph.name} has NaN or inf weights; its support is undefined")
            pattern = np.zeros((m, m), dtype=bool)
            pattern[r[w != 0], s[w != 0]] = True
            out.append(pattern)
    else:
        a = np.asarray(graph)
        if a.ndim != 2 or a.shape[0] != a.shape[1]:
            raise ValueError(f"{what}: a round's support must be a Topology or an [N, N] array, got shape {a.shape}")
        if not np.all(np.isfinite(a.astype(np.float64))):
            raise ValueError(f"{what}: a round's support has NaN or inf entries")
        m, out = a.shape[0], [a != 0]
    if n is not None and m != n:
        raise ValueError(f"{what}: the supports mix node counts ({n} and {m})")
    return out, m


def schedule_supports(supports: Any, what: str = "consensus_weights") -> _Support:
    """The rounds' edge lists from a Topology (each round of its period) or a sequence of Topologies
    and [N, N] adjacency arrays (``A[i, j] != 0``: j -> i), self-loops added.

    Raises:
      ValueError: no rounds, fewer than 2 nodes, differing node counts, NaN supports, stochastic or
        traced graphs, or a union of the supports that is not strongly connected (no schedule on it
        can reach consensus).
    """
    if isinstance(supports, Topology):
        graphs = [supports]
    else:
        graphs = list(supports) if isinstance(supports, (Sequence, np.ndarray)) else None
    if not graphs:
        raise ValueError(f"{what} needs a Topology or a non-empty sequence of graphs, got {type(supports).__name__}")
    patterns, n = [], None
    for graph in graphs:
        rounds, n = _round_pairs(graph, n, what)
        patterns += rounds
    if n < 2:
        raise ValueError(f"{what} needs at least 2 nodes, got {n}")
    union = np.any(patterns, axis=0)
    r, s = np.nonzero(union & ~np.eye(n, dtype=bool))
    parts = count_components(s, r, n, strong=True)
    if parts > 1:
        raise ValueError(
            f"{what} needs supports whose union is strongly connected; it has {parts} strongly connected "
            "components, so no weighting can reach consensus"
        )
    rounds, keys, symmetric = [], {}, []
    for t, pattern in enumerate(patterns):
        pattern = pattern | np.eye(n, dtype=bool)
        sym = bool(np.array_equal(pattern, pattern.T))
        r, s = np.nonzero(pattern)
        # undirected rounds share one logit per pair
        pair = (np.minimum(r, s), np.maximum(r, s)) if sym else (r, s)
        ids = [keys.setdefault((t, int(a), int(b)), len(keys)) for a, b in zip(*pair)]
        rounds.append((s, r, np.asarray(ids, np.int64)))
        symmetric.append(sym)
    width = max(len(x[0]) for x in rounds)
    period = len(rounds)
    senders, receivers = np.zeros((period, width), np.int32), np.zeros((period, width), np.int32)
    param, live = np.zeros((period, width), np.int64), np.zeros((period, width), bool)
    for t, (s, r, ids) in enumerate(rounds):
        senders[t, : s.size], receivers[t, : s.size], param[t, : s.size], live[t, : s.size] = s, r, ids, True
    return _Support(senders, receivers, live, param, len(keys), np.asarray(symmetric), n)


def _sinkhorn(support: _Support, theta, sweeps: int, xp=jnp):
    """[P, E] weights ``u[r] exp(theta) v[s]`` after ``sweeps`` Sinkhorn sweeps (rows, then columns),
    0 on padding. ``xp`` is jax.numpy (traced) or numpy (host, float64)."""
    p, n = support.senders.shape[0], support.num_nodes
    rows = (support.receivers + n * np.arange(p)[:, None]).ravel()
    cols = (support.senders + n * np.arange(p)[:, None]).ravel()
    a = xp.where(support.live, xp.exp(theta[support.param]), 0.0).ravel()

    def sums(values, index):
        if xp is np:
            return np.bincount(index, values, p * n)
        return jax.ops.segment_sum(values, index, p * n)

    def sweep(v, _=None):
        u = 1.0 / sums(a * v[cols], rows)
        return 1.0 / sums(a * u[rows], cols), u

    v = xp.ones(p * n)
    if xp is np:
        for _ in range(sweeps):
            v, u = sweep(v)
    else:  # one traced sweep, not `sweeps` copies of it
        v, us = jax.lax.scan(sweep, v, length=sweeps)
        u = us[-1]
    return (u[rows] * a * v[cols]).reshape(support.senders.shape)


def _exact_symmetric(support: _Support, w, xp=jnp):
    """[P, E] weights of the undirected rounds made exactly doubly stochastic, whatever the Sinkhorn
    sweeps left: each pair's weight ``a_l`` is the mean of its two directed entries, scaled down by
    ``c_l = max(1, s_u, s_v)`` (``s_i`` the off-diagonal sum of row i), and the self-loops take the
    rest, ``W = I - L(a / c)``. Every row's off-diagonal sum is then at most 1, so W is
    non-negative, symmetric and doubly stochastic to rounding; where Sinkhorn converged it changes
    W by its defect. Directed rounds are returned as they are."""
    p, n = support.senders.shape[0], support.num_nodes
    off = support.live & (support.senders != support.receivers)
    loop = support.live & (support.senders == support.receivers)
    sym = np.broadcast_to(support.symmetric[:, None], off.shape)
    rows = (support.receivers + n * np.arange(p)[:, None]).ravel()
    cols = (support.senders + n * np.arange(p)[:, None]).ravel()

    def sums(values, index, size):
        if xp is np:
            return np.bincount(index, values, size)
        return jax.ops.segment_sum(values, index, size)

    # both directions of an undirected pair share one logit, hence one parameter id
    pair = sums(xp.where(off & sym, w, 0.0).ravel(), support.param.ravel(), support.num_params)
    a = xp.where(off & sym, 0.5 * pair[support.param], 0.0).ravel()
    s = sums(a, rows, p * n)
    a = a / xp.maximum(1.0, xp.maximum(s[rows], s[cols]))
    diag = xp.maximum(1.0 - sums(a, rows, p * n), 0.0)  # >= 0 in exact arithmetic; clip the rounding
    exact = xp.where(loop.ravel(), diag[rows], a).reshape(w.shape)
    return xp.where(sym, xp.where(support.live, exact, 0.0), w)


def _template(support: _Support, weights: np.ndarray, name: str, kernel: str = "auto") -> Topology:
    directed = not bool(np.all(support.symmetric))
    return Topology(name, support.num_nodes, support.senders, support.receivers, weights, directed, kernel=kernel)


def _run_error(template: Topology, weights, start, rounds: int):
    """``||X_R - J X_0||_F^2`` with ``X_{t+1} = W(t) X_t`` (mixing kernels; differentiable)."""
    graph = template.with_weights(weights)

    def body(x, t):
        return mix(graph, x, t), None

    x, _ = jax.lax.scan(jax.checkpoint(body), start, jnp.arange(rounds))
    gap = x - jnp.mean(start, axis=0, keepdims=True)
    return jnp.sum(gap * gap)


def schedule_error(topology: Topology, rounds: int | None = None) -> float:
    """``||W(R-1) ... W(0) - J||_F^2`` of a fixed graph's weights (R defaults to its period), by
    dense NumPy products (the reference the design is checked against)."""
    rounds = topology.period if rounds is None else check_int("rounds", rounds, 1)
    n = topology.num_nodes
    product = np.eye(n)
    for t in range(rounds):
        product = topology.matrix(t % topology.period) @ product
    return float(np.sum((product - 1.0 / n) ** 2))


def consensus_weights(
    supports: Any,
    rounds: int | None = None,
    probes: int | None = None,
    max_steps: int = 500,
    tol: float = 1e-12,
    seed: int | None = None,
    name: str | None = None,
    progress: Callable[[int, float], None] | None = None,
) -> ScheduleDesign:
    """Non-negative doubly stochastic weights on the given supports minimizing the consensus error
    after ``rounds`` rounds (module docstring).

    .. math::  \\min_{W(t) \\in \\mathcal{B}(S(t))} \\| W(R-1) \\cdots W(0) - J \\|_F^2,
       \\qquad W(t) = W(t \\bmod P)

    Args:
      supports: a fixed :class:`Topology` (its P rounds; P = 1 for a static graph) or a sequence of
        Topologies and [N, N] adjacency arrays (``A[i, j] != 0`` when i may receive from j); only
        the support is used, self-loops are always allowed. Undirected rounds get symmetric W.
      rounds: R >= 1, the horizon; default P (one period).
      probes: None for the exact error (X_0 = I [N, N]); D >= 1 Gaussian probe columns for the
        matrix-free estimate (large N).
      max_steps: L-BFGS steps at most (>= 1).
      tol: stop when the relative error ``e / (N - 1)`` falls below it (0: run until the
        objective stalls or ``max_steps``; for a static SLEM surrogate, whose error after R rounds
        may start below any fixed tolerance).
      seed: None starts from the Sinkhorn scaling of the all-ones pattern; an int from random
        logits (standard normal) drawn from it. Also seeds the probes.
      name: display name of the returned topology.
      progress: called as ``progress(step, relative_error)`` after every step (a progress bar).

    Returns:
      A :class:`ScheduleDesign`.

    Raises:
      ValueError: bad supports (:func:`schedule_supports`), rounds, probes or max_steps below 1,
        tol not a number >= 0.
    """
    support = schedule_supports(supports)
    period, n = support.senders.shape[0], support.num_nodes
    rounds = period if rounds is None else check_int("rounds", rounds, 1)
    probes = None if probes is None else check_int("probes", probes, 1)
    max_steps = check_int("max_steps", max_steps, 1)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not (np.isfinite(tol) and tol >= 0):
        raise ValueError(f"tol={tol!r} must be a finite number >= 0")
    if seed is not None:
        seed = check_int("seed", seed, 0)
    rng = np.random.default_rng(0 if seed is None else seed)
    theta0 = np.zeros(support.num_params) if seed is None else rng.normal(size=support.num_params)
    label = name or f"consensus_weights(N={n}, P={period}, R={rounds})"
    start_weights = _final_weights(support, theta0)
    # Logits of the balanced start (its own Sinkhorn fixed point): the sweeps inside the objective
    # then only follow the steps' drift, and the first objective is the start's exact error.
    theta0 = np.zeros(support.num_params)
    theta0[support.param[support.live]] = np.log(start_weights[support.live])
    template = _template(support, start_weights, label)
    with jax.enable_x64(True):
        if probes is None:
            start = jnp.eye(n)
        else:
            z = rng.normal(size=(n, probes))
            # not centred: the target J Z is then non-zero, so a W that loses mass (rows of an
            # unfinished Sinkhorn scaling summing below 1) is penalized instead of rewarded
            start = jnp.asarray(z) / np.sqrt(probes)
            # an independent draw: the fitted probes' error keeps falling where the weights overfit
            # them (measured: a 256-node torus with 8 probes ended at 2.6x its start's exact error)
            held_out = jnp.asarray(rng.normal(size=(n, probes))) / np.sqrt(probes)
        scale = 1.0 / (n - 1)

        def weights_of(theta):
            return _exact_symmetric(support, _sinkhorn(support, theta, _INNER_SWEEPS))

        def objective(theta):
            # the logarithm: the error spans many decades (it falls like rate^(2R)), and L-BFGS
            # then takes steps of the same quality at 1e-2 and at 1e-10
            return jnp.log(scale * _run_error(template, weights_of(theta), start, rounds))

        @jax.jit
        def validation(theta):
            return _run_error(template, weights_of(theta), held_out, rounds) if probes is not None else 0.0

        solver = optax.lbfgs()
        value_and_grad = optax.value_and_grad_from_state(objective)

        @jax.jit
        def step(theta, state):
            value, grad = value_and_grad(theta, state=state)
            updates, state = solver.update(grad, state, theta, value=value, grad=grad, value_fn=objective)
            return optax.apply_updates(theta, updates), state

        theta = jnp.asarray(theta0)
        state = solver.init(theta)
        history = [float(np.exp(jax.jit(objective)(theta)))]
        best = (float(validation(theta)), 0, theta)  # held-out error, step, logits
        for k in range(max_steps):
            if history[-1] < tol:
                break
            theta, state = step(theta, state)
            history.append(float(np.exp(optax.tree.get(state, "value"))))
            if progress is not None:
                progress(k + 1, history[-1])
            if not np.isfinite(history[-1]):
                raise ValueError("the design diverged (non-finite objective); try another seed")
            if probes is not None:
                held = float(validation(theta))
                if held < best[0]:
                    best = (held, k + 1, theta)
                elif k + 1 - best[1] >= _STALL:
                    break  # the held-out error stopped falling: further steps fit the probes
            # a plateau at the Sinkhorn tolerance or a local minimum: more steps buy nothing
            if k >= _STALL and history[-1] > (1.0 - 1e-6) * history[-1 - _STALL]:
                break
        if probes is not None:
            _, last, theta = best
            history = history[: last + 1]
        theta = np.asarray(theta)
    weights = _final_weights(support, theta)
    designed = _template(support, weights, label)
    return ScheduleDesign(
        topology=designed,
        error=schedule_error(designed, rounds),
        start_error=schedule_error(template, rounds),
        history=np.asarray(history),
        rounds=rounds,
        probes=probes,
    )


def _final_weights(support: _Support, theta: np.ndarray) -> np.ndarray:
    """The weights of logits ``theta`` [num_params]. Undirected rounds: the map the objective
    differentiates, ``_INNER_SWEEPS`` Sinkhorn sweeps then :func:`_exact_symmetric` (so the returned
    weights are those whose error was minimized, doubly stochastic to rounding). Directed rounds:
    host Sinkhorn sweeps until rows and columns are within ``_FINAL_TOL`` of 1 (or
    ``_FINAL_SWEEPS``)."""
    exact = _exact_symmetric(support, _sinkhorn(support, theta, _INNER_SWEEPS, xp=np), xp=np)
    if np.all(support.symmetric):
        return exact
    w = _sinkhorn(support, theta, 1, xp=np)
    flat = support._replace(param=np.arange(w.size).reshape(w.shape))
    for _ in range(_FINAL_SWEEPS // 50):
        if _max_defect(support, w) < _FINAL_TOL:
            break
        w = _sinkhorn(flat, np.log(np.where(support.live, np.maximum(w, 1e-300), 1.0)).ravel(), 50, xp=np)
    w = np.where(support.live, w, 0.0)
    return np.where(support.symmetric[:, None], exact, w)


def _max_defect(support: _Support, w: np.ndarray) -> float:
    p, n = w.shape[0], support.num_nodes
    offset = n * np.arange(p)[:, None]
    rows = np.bincount((support.receivers + offset).ravel(), w.ravel(), p * n)
    cols = np.bincount((support.senders + offset).ravel(), w.ravel(), p * n)
    return float(max(np.abs(rows - 1).max(), np.abs(cols - 1).max()))
