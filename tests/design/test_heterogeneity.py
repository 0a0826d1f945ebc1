"""Data-aware topology learning (jaxgossip.design.heterogeneity) against the maths: degree budget,
doubly stochastic weights, exact line search, the exact optimum where it exists, bad input."""

import numpy as np
import pytest

from jaxgossip.design import heterogeneity as het


def one_class_per_node(classes, per_class):
    return np.eye(classes)[np.arange(classes * per_class) % classes]


def test_one_class_per_node_is_mixed_exactly_with_one_neighbour_of_every_other_class():
    pi = one_class_per_node(10, 10)
    learned = het.learn_topology(pi, degree=9, lam=0.1)
    assert learned.heterogeneity < 1e-20
    assert learned.max_in_degree <= 9
    w = learned.weights
    np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-12)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    assert w.min() >= 0
    # every node's neighbourhood holds each class with weight 1/C
    np.testing.assert_allclose(w @ pi, np.full((100, 10), 0.1), atol=1e-12)
    np.testing.assert_allclose(learned.topology.matrix(), w, atol=1e-12)
    assert learned.topology.is_doubly_stochastic


def test_degree_budget_objective_and_line_search():
    pi = np.random.default_rng(0).dirichlet(np.full(10, 0.1), size=60)
    learned = het.learn_topology(pi, degree=4, lam=0.1)
    off = (learned.weights != 0) & ~np.eye(60, dtype=bool)
    assert off.sum(axis=1).max() <= 4 and off.sum(axis=0).max() <= 4
    assert learned.max_in_degree == off.sum(axis=1).max()
    assert len(learned.objective) == 5 and np.all(np.diff(learned.objective) <= 1e-12)
    n, target, mean = 60, pi.mean(axis=0), np.full((60, 60), 1 / 60)

    def g(w):
        return (np.sum((w @ pi - target) ** 2) + 0.1 * np.sum((w - mean) ** 2)) / n

    assert learned.objective[0] == pytest.approx(g(np.eye(n)))
    assert learned.objective[-1] == pytest.approx(g(learned.weights))
    # the first step is exact along I -> P (P the assignment on the gradient at I): no step size
    # on a fine grid does better
    import scipy.optimize

    grad = 2 / n * ((pi - target) @ pi.T + 0.1 * (np.eye(n) - mean))
    rows, cols = scipy.optimize.linear_sum_assignment(grad)
    atom = np.zeros((n, n))
    atom[rows, cols] = 1
    grid = min(g(np.eye(n) + s * (atom - np.eye(n))) for s in np.linspace(0, 1, 2001))
    assert learned.objective[1] <= grid + 1e-12


def test_learned_neighbourhoods_beat_fixed_graphs_of_equal_degree():
    rng = np.random.default_rng(1)
    n, d = 64, 4
    pi = rng.dirichlet(np.full(10, 0.1), size=n)
    learned = het.learn_topology(pi, degree=d, lam=0.1)
    circulant = np.zeros((n, n))  # each node averages itself and d ring neighbours
    for offset in range(-d // 2, d // 2 + 1):
        circulant[np.arange(n), (np.arange(n) + offset) % n] = 1 / (d + 1)
    perm = rng.permutation(n)  # the same graph over a random placement of the nodes
    shuffled = circulant[np.ix_(perm, perm)]
    assert learned.heterogeneity < 0.5 * het.neighbourhood_heterogeneity(circulant, pi)
    assert learned.heterogeneity < 0.5 * het.neighbourhood_heterogeneity(shuffled, pi)


def test_label_proportions_from_a_partition():
    labels = np.array([0, 1, 1, 2, 2, 2])
    node_of = np.array([0, 0, 1, 1, 1, 0])
    pi = het.label_proportions(labels, node_of, num_nodes=2, num_classes=3)
    np.testing.assert_allclose(pi, [[1 / 3, 1 / 3, 1 / 3], [0, 1 / 3, 2 / 3]])
    with pytest.raises(ValueError, match="node 2 holds no examples"):
        het.label_proportions(labels, node_of, num_nodes=3)


@pytest.mark.parametrize(
    "pi, kwargs, message",
    [
        (one_class_per_node(4, 2), {"degree": 0}, "degree"),
        (one_class_per_node(4, 2), {"degree": 8}, "degree"),
        (one_class_per_node(4, 2), {"degree": 2, "lam": -1.0}, "lam=-1.0 must be a finite number >= 0"),
        (np.full((4, 3), 0.5), {"degree": 2}, "node 0 sum to 1.5, not 1"),
        (np.array([[np.nan, 1.0], [0.5, 0.5]]), {"degree": 1}, "NaN or inf"),
        (np.array([[1.5, -0.5], [0.5, 0.5]]), {"degree": 1}, "must be >= 0"),
        (np.ones(4), {"degree": 1}, r"must be \[N, C\]"),
        (one_class_per_node(2, 4), {"degree": 1, "lam": 0.0}, "splits into 4 parts that never exchange: raise lam"),
    ],
)
def test_bad_input_is_named(pi, kwargs, message):
    with pytest.raises(ValueError, match=message):
        het.learn_topology(pi, **kwargs)
