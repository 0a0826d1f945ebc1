"""Defaults that train: every registered algorithm, with its default options, trains the default task.

The default task is ``jaxgossip train``'s: digits, 8 nodes, the trainer's optimizer and learning
rate (TrainConfig defaults), here with the MLP and fewer rounds so that the whole file runs in
about a minute on 2 CPU cores. Every algorithm of the registry is enrolled, on the first graph its
metadata accepts among the default topology, ``one_peer_exponential`` (time-varying push-sum) and
a tree (RelaySum). The run goes through the CLI's path (:func:`jaxgossip.run.runner.run_training`:
config checks, trainer defaults from the metadata's ``trainer_options``, divergence check), and
one of two outcomes is required:

* it trains: no divergence, and the averaged model's test accuracy well above chance (10
  classes); Moniqua's former defaults (``gamma = 1`` at 2 bits) fail here by round 30;
* it is refused before training, and the refusal names an option of the algorithm to set
  (``option=``): a top-k budget (``fraction=`` / ``k=``), D^2's ``gamma=`` on a graph at its
  eigenvalue limit, QGM's ``lr=``.

A budget has no default, so the budgeted methods are also trained with the budget a new user
picks first, top-10 %, and their other defaults, on the static exponential graph where Sparse-Push's
former ``gamma = 1`` diverges by round 100.
"""

import inspect
import re

import numpy as np
import pytest

import jaxgossip as jg
from jaxgossip import data
from jaxgossip.run.resolve import check_train_config
from jaxgossip.run.runner import TrainConfig, run_training

NUM_ROUNDS = 40  # Moniqua's former defaults diverge by round 30 on this task
EVAL_EVERY = 10
ACC_FLOOR = 0.8  # chance: 0.1
# The graphs tried in order; the first that an algorithm's metadata accepts is its graph.
GRAPHS = (TrainConfig().topology, "one_peer_exponential", "binary_tree")
BUDGET = {"fraction": 0.1}
BUDGET_GRAPH = "exponential"
BUDGET_ROUNDS = 120  # Sparse-Push's former gamma = 1 at top-10 % diverges by round 100 here


def task(**changes) -> TrainConfig:
    """The default task (TrainConfig defaults) at the test's size."""
    base = TrainConfig(
        dataset="digits",
        model="mlp",
        num_rounds=NUM_ROUNDS,
        eval_every=EVAL_EVERY,
        evals_per_chunk=NUM_ROUNDS // EVAL_EVERY,
    )
    return base.replace(**changes)


def graph_for(name: str) -> str:
    """The first graph of :data:`GRAPHS` that the metadata of ``name`` accepts."""
    info = jg.algorithms.info(name)
    for spec in GRAPHS:
        try:
            jg.algorithms.check_graph(name, info, jg.topology.make(spec, TrainConfig().num_nodes))
        except ValueError:
            continue
        return spec
    raise AssertionError(f"{name}: its metadata accepts none of {GRAPHS}")


def options_of(name: str) -> list[str]:
    return list(inspect.signature(jg.algorithms.info(name).factory).parameters)[1:]


def budgeted() -> list[str]:
    """Algorithms with a top-k budget that has no default (the factory's ``fraction=None``)."""
    names = []
    for name, info in jg.algorithms.INFOS.items():
        fraction = inspect.signature(info.factory).parameters.get("fraction")
        if fraction is not None and fraction.default is None:
            names.append(name)
    return names


@pytest.fixture(scope="module")
def digits():
    return data.load_dataset("digits")


def train(config: TrainConfig, dataset) -> float:
    """Final test accuracy of the averaged model; raises DivergenceError if the run diverged."""
    result = run_training(config, dataset=dataset, progress=False, log=lambda message: None)
    assert result.finished
    metrics = result.metrics
    for field in ("train_loss", "test_acc", "consensus", "model_sq_norm"):
        assert np.all(np.isfinite(np.asarray(getattr(metrics, field)))), field
    return float(np.asarray(metrics.test_acc)[-1])


@pytest.mark.parametrize("name", list(jg.algorithms.INFOS))
def test_default_options_train_the_default_task_or_are_refused_naming_an_option(name, digits):
    config = task(algorithm=name, topology=graph_for(name))
    try:
        check_train_config(config)
    except ValueError as refusal:
        named = set(re.findall(r"\b(\w+)=", str(refusal))) & set(options_of(name))
        assert named, f"{name} on {config.topology} is refused without naming an option to set: {refusal}"
        return
    acc = train(config, digits)
    assert acc > ACC_FLOOR, f"{name} on {config.topology} with its defaults reached {acc:.3f} (chance 0.1)"


@pytest.mark.parametrize("name", budgeted())
def test_a_budget_and_the_other_defaults_train_on_the_exponential_graph(name, digits):
    config = task(
        algorithm=name,
        topology=BUDGET_GRAPH,
        algorithm_options=dict(BUDGET),
        num_rounds=BUDGET_ROUNDS,
        eval_every=20,
        evals_per_chunk=BUDGET_ROUNDS // 20,
    )
    acc = train(config, digits)
    assert acc > ACC_FLOOR, f"{name} at {BUDGET} on {BUDGET_GRAPH} reached {acc:.3f} (chance 0.1)"
