"""The primal-dual phase of fastest_mixing (jaxgossip.design.primal_dual): from a strictly feasible
point it drives the duality measure down while every iterate stays strictly feasible, its epigraph
bound s converges to the certified optimum from above, and the whole design needs far fewer steps
than barrier centerings alone."""

import numpy as np
import pytest

import jaxgossip as jg
from jaxgossip.design import fastest_mixing, undirected_edges
from jaxgossip.design.primal_dual import primal_dual
from jaxgossip.design.sdp import feasible_point, iterate_slem, problem_of


@pytest.mark.parametrize("nonnegative", [True, False])
def test_the_measure_falls_and_every_iterate_stays_feasible(nonnegative):
    topo = jg.topology.erdos_renyi(40, 5.0 / 39, seed=3)
    edges = undirected_edges(topo)
    problem = problem_of(edges, 40, nonnegative)
    w0 = np.full(len(edges), 1.0 / (np.bincount(edges.ravel()).max() + 1.0))
    s0 = iterate_slem(problem, w0) + 0.1
    nu = 2 * 40 + (len(edges) + 40 if nonnegative else 0)
    history = []
    point, iterations, mu = primal_dual(problem, feasible_point(problem, w0, s0), nu / s0, 1e-9, history, 80)
    optimum = fastest_mixing(topo, nonnegative=nonnegative).slem
    assert mu <= 1e-9 and 0 < iterations < 80 and len(history) == iterations
    assert feasible_point(problem, point.w, point.s) is not None  # S_1, S_2 (and w, 1 - L_ii) positive
    assert iterate_slem(problem, point.w) <= point.s
    # the epigraph bound closes on the optimum: within nu mu of it
    assert optimum - 1e-8 <= point.s <= optimum + 10 * nu * mu
    if nonnegative:
        assert np.all(point.w > 0)


def test_the_designs_need_few_steps_where_centerings_alone_needed_many():
    # an Erdos-Renyi chain of 128 nodes took 137 Newton steps with barrier centerings alone (the
    # weights on their way to 0); the primal-dual middle of the path takes it in about 35
    design = fastest_mixing(jg.topology.erdos_renyi(128, 5.0 / 127, seed=0))
    assert design.gap_bound <= 1e-8
    assert design.history.size <= 50
