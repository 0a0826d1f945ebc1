"""The README's quickstart block runs as written and prints the numbers the README claims.

The block is read from README.md (first ```python fence after "## Quickstart") and executed; the
test then checks its ``result`` against NumPy:

* ``error[0]`` is ``(1/N) sum_i ||x0_i - mean(x0)||^2`` (squared distances summed over entries,
  averaged over nodes).
* Spectral bound. Relaxed gossip applies ``W_g = I + gamma (W - I)`` (symmetric, doubly stochastic
  for the ring). Write ``X0`` as an [N, D] matrix and ``W_g = sum_l lam_l u_l u_l^T``, with
  ``lam_1 = 1`` and ``u_1 = 1 / sqrt(N)``. Then ``X_k - mean = sum_{l >= 2} lam_l^k u_l u_l^T X0``, so

      error_k = (1/N) sum_{l >= 2} lam_l^(2k) c_l,   c_l = ||u_l^T X0||^2,
              <= rho^(2k) error_0,                    rho = max_{l >= 2} |lam_l|.

  The exact sum is computed in float64 term by term (no cancellation), so it is reliable far below
  float32 round-off. The bound is not loose: the slowest modes keep a fixed share of ``sum c_l``
  (for i.i.d. data about 3 of the 7 non-constant modes on the 8-ring at the optimal gamma).
* float32 round-off: the simulated error stops falling at a floor of a few ulps per entry (about
  5e-9 here), which the checks allow for.
* ``bits[-1]`` follows the gossip bit rule (``algorithms/gossip.py``: every node sends its whole
  fp32 model to each out-neighbour each round): N x 2 x steps x 100 * 100 x 32.
"""

import os
import re

import numpy as np

README = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "README.md")


def _quickstart_block() -> str:
    text = open(README).read()
    section = text.split("## Quickstart", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_quickstart_numbers(capsys):
    namespace: dict = {}
    exec(compile(_quickstart_block(), "README quickstart", "exec"), namespace)
    out = capsys.readouterr().out
    assert "->" in out and "MB" in out

    topo, gamma, result = namespace["topo"], float(namespace["gamma"]), namespace["result"]
    x0 = np.asarray(namespace["x0"]["w"], dtype=np.float64)
    num_nodes, num_steps = x0.shape[0], len(result.error) - 1
    assert (num_nodes, num_steps) == (8, 200)
    flat = x0.reshape(num_nodes, -1)  # [N, D]
    dim = flat.shape[1]
    error = np.asarray(result.error, dtype=np.float64)

    # error[0]: squared distance summed over entries, averaged over nodes.
    error0 = np.sum((flat - flat.mean(axis=0)) ** 2) / num_nodes
    np.testing.assert_allclose(error[0], error0, rtol=1e-5)
    assert 8_000 < error0 < 9_600  # ~ (1 - 1/N) * D for N(0, 1) entries, as the README says

    # Exact error of W_g^k X0 in float64, mode by mode.
    relaxed = np.eye(num_nodes) + gamma * (topo.matrix() - np.eye(num_nodes))
    lam, u = np.linalg.eigh(relaxed)
    order = np.argsort(-np.abs(lam))
    lam, u = lam[order], u[:, order]
    np.testing.assert_allclose(lam[0], 1.0, atol=1e-12)
    rho = np.abs(lam[1])
    np.testing.assert_allclose(rho, 0.744, atol=1e-3)  # README: rho = 0.744, rho^2 = 0.554
    c = np.sum((u.T @ flat) ** 2, axis=1)  # [N] energy of X0 in each mode
    steps = np.arange(num_steps + 1)
    exact = (lam[1:, None] ** (2 * steps[None, :]) * c[1:, None]).sum(axis=0) / num_nodes  # [S + 1]
    bound = error0 * rho ** (2 * steps)
    np.testing.assert_allclose(exact[0], error0, rtol=1e-9)
    assert np.all(exact <= bound * (1 + 1e-9))
    # Not trivially loose: the slowest modes hold a large share of the energy at every step.
    assert np.all(exact >= 0.2 * bound)

    # The simulation follows the float64 prediction until float32 round-off takes over.
    floor = dim * (16 * np.finfo(np.float32).eps) ** 2  # 16 ulps of O(1) entries, ~3.6e-8
    assert np.all(error <= bound * (1 + 1e-3) + floor)
    above = exact > 1e3 * floor
    assert above[:30].all()  # the comparison covers the first 30 rounds at least
    np.testing.assert_allclose(error[above], exact[above], rtol=2e-3)
    assert error[-1] <= error0 * rho ** (2 * num_steps) * (1 + 1e-3) + floor
    assert error[-1] < 1e-12 * error0  # converged to round-off after 200 rounds

    # Bits: every node sends its whole fp32 model to each of its 2 ring neighbours every round.
    np.testing.assert_array_equal(result.bits[-1], num_nodes * 2 * num_steps * dim * 32)
    np.testing.assert_array_equal(np.diff(result.bits), num_nodes * 2 * dim * 32)
    assert f"{result.bits[-1] / 8e6:g}" == "128"


def test_readme_optimization_block_runs_and_descends():
    """The "Decentralized optimization" block runs as written (after the quickstart's imports) and
    its gossip run on heterogeneous least squares lowers the objective gap by at least 10x."""
    text = open(README).read()
    section = text.split("### Decentralized optimization", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile("import jax\nimport jaxgossip as jg\n" + code, "README optimization", "exec"), namespace)
    result, problem = namespace["result"], namespace["problem"]
    gap = np.asarray(result.objective, np.float64) - float(problem.f_star)
    assert np.all(np.isfinite(gap)) and gap[-1] < 0.1 * gap[0]
    assert result.bits[-1] == 16 * 2 * 300 * 20 * 32  # gossip bit rule: every node, both neighbours


def test_readme_bring_your_own_model_loss_optimizer_and_data(capsys):
    section = open(README).read().split("## Your own model, loss, optimizer and data", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(block, "README bring your own", "exec"), namespace)
    assert "accuracy of the averaged model" in capsys.readouterr().out
    assert namespace["trainer"].local_steps == 4
    assert float(namespace["metrics"].test_acc[-1]) > 0.9  # well-separated blobs
