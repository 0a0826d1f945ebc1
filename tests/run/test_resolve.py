"""jaxgossip.run.resolve: one construction of every object of a run, and its errors are the checks."""

from __future__ import annotations

import collections

import pytest

from jaxgossip import algorithms, models, topology
from jaxgossip.cli import main
from jaxgossip.run.config import TrainConfig
from jaxgossip.run.resolve import check_train_config, resolve
from jaxgossip.run.runner import make_trainer
from jaxgossip.sim import timing
from jaxgossip.sim.network import Network

TINY = dict(dataset="synthetic", model="mlp", model_options={"hidden": (8,)}, num_nodes=4, batch_size=8,
            num_rounds=4, eval_every=2, eval_size=64)


@pytest.fixture
def built(monkeypatch):
    """Counts the constructions of the objects of a run: graph, algorithm, merge, model, clock."""
    counts = collections.Counter()
    for module, name in ((topology, "make"), (algorithms, "make"), (algorithms, "make_merge"),
                         (algorithms, "byzantine"), (models, "make_model"), (models, "check_options"),
                         (timing, "time_model")):
        original = getattr(module, name)

        def counted(*args, _original=original, _key=f"{module.__name__}.{name}", **kwargs):
            counts[_key] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    check = Network.__post_init__  # every Network, however made, passes through its check

    def counted_network(self):
        counts["jaxgossip.sim.network.Network"] += 1
        check(self)

    monkeypatch.setattr(Network, "__post_init__", counted_network)
    return counts


def test_one_train_command_builds_every_object_once(built, tmp_path, capsys):
    """Graph, algorithm, merge, network, clock and model are built once; the model options are checked once
    before the data is read (a flax module description at the registry's class count, no
    parameters) and the run's model is built once at the data's class count."""
    argv = ["train", "--dataset=synthetic", "--model=mlp", "--model_options.hidden=8", "--num_nodes=4",
            "--batch_size=8", "--num_rounds=4", "--eval_every=2", "--eval_size=64", "--algorithm=choco",
            "--algorithm_options.gamma=0.3", "--algorithm_options.compressor=top_k",
            "--algorithm_options.compressor_options.fraction=0.5", "--final_merge=exact", "--time.compute=0.01",
            "--no-progress", "--out", str(tmp_path / "run")]
    assert main(argv) == 0
    assert "choco" in capsys.readouterr().out
    assert dict(built) == {
        "jaxgossip.topology.make": 1,
        "jaxgossip.algorithms.make": 1,
        "jaxgossip.algorithms.make_merge": 1,
        "jaxgossip.models.make_model": 1,
        "jaxgossip.models.check_options": 1,
        "jaxgossip.sim.network.Network": 1,
        "jaxgossip.sim.timing.time_model": 1,
    }


def test_attackers_wrap_the_checked_algorithm_and_the_run_uses_the_wrapper(built):
    config = TrainConfig(**TINY, algorithm="gossip", byzantine={"ids": [0], "attack": "gaussian"})
    resolved = resolve(config)
    # the algorithm is built once, with the trainer's options, and the wrapper runs that one
    assert built["jaxgossip.algorithms.byzantine"] == built["jaxgossip.algorithms.make"] == 1
    assert built["jaxgossip.topology.make"] == built["jaxgossip.models.make_model"] == 1
    trainer, alg = make_trainer(resolved.config, resolved)
    assert alg is resolved.algorithm
    assert built["jaxgossip.algorithms.byzantine"] == 1


def test_the_resolved_config_reuses_its_objects_and_a_sweep_point_builds_its_own(built):
    resolved = resolve(TrainConfig(**TINY, algorithm="choco", algorithm_options={"gamma": 0.5}))
    before = dict(built)
    _, alg = make_trainer(resolved.config, resolved)
    assert alg is resolved.algorithm and dict(built) == before
    point = resolved.config.replace(algorithm_options={"gamma": 0.25})
    _, other = make_trainer(point, resolved)
    assert other is not resolved.algorithm
    assert built["jaxgossip.algorithms.make"] == before["jaxgossip.algorithms.make"] + 1
    assert built["jaxgossip.sim.timing.time_model"] == before["jaxgossip.sim.timing.time_model"] + 1
    assert built["jaxgossip.models.make_model"] == before["jaxgossip.models.make_model"]  # shapes are shared


@pytest.mark.parametrize(
    "change, message",
    [
        ({"topology": "rnig"}, "unknown topology 'rnig' (did you mean 'ring'?)"),
        ({"algorithm": "choco", "algorithm_options": {"gama": 0.1}}, "algorithm_options.gama: choco has no option"),
        ({"final_merge": "sometimes"}, "final_merge='sometimes' must be null"),
        ({"model_options": {"hiden": 3}}, "model_options.hiden: model 'mlp' has no attribute 'hiden'"),
        ({"time": {"bandwidth": "fast"}}, "--time.bandwidth='fast' must be a number"),
    ],
)
def test_resolve_refuses_what_check_train_config_refuses_with_the_same_message(change, message):
    config = TrainConfig(**{**TINY, **change})
    with pytest.raises(ValueError) as checked:
        check_train_config(config)
    with pytest.raises(ValueError) as resolved:
        resolve(config)
    assert message in str(checked.value)
    assert str(resolved.value) == str(checked.value)


def test_the_data_classes_are_checked_when_the_run_model_is_built(tmp_path):
    import numpy as np

    path = tmp_path / "tokens.txt"
    path.write_text("".join(chr(32 + i % 90) for i in range(4000)))
    config = TrainConfig(**{**TINY, "dataset": f"text:{path}", "model": "transformer",
                            "model_options": {"vocab": 16, "context": 8, "width": 8, "heads": 2, "depth": 1}})
    assert check_train_config(config).model_options["vocab"] == 16  # no data read: 16 may be enough
    with pytest.raises(ValueError, match=r"model='transformer' with model_options=.*vocab=16 is smaller than"):
        resolve(config)
    assert np.isfinite(resolve(config.replace(model_options={**config.model_options, "vocab": 256})).dataset.num_classes)


def test_resolved_objects_are_those_of_the_config():
    resolved = resolve(TrainConfig(**TINY, algorithm="choco", algorithm_options={"gamma": 0.5}, final_merge=2))
    assert resolved.topology.name == "ring(4)" and resolved.topology.num_nodes == 4
    assert resolved.model.num_classes == resolved.dataset.num_classes
    assert resolved.merge is not None and resolved.async_form is None
    assert resolved.shards.x.shape[0] == 4 and len(resolved.parts) == 4
    asynchronous = resolve(TrainConfig(**TINY, execution="async", time={"compute": 0.01}))
    assert asynchronous.algorithm is None and asynchronous.async_form == "async_gossip"
