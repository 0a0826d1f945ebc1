"""The paper-reproduction configs in experiments/configs: every file and every argument of a family
file (``FILE.py:ARG``) loads, its fields build a valid topology / algorithm / optimizer / model, every
run of the CIFAR-10 families is an argument that gives its recipe, the recipes hold the numbers of
docs/training.md (section training recipes and models), and every distinct communication setup
trains 2 rounds on tiny synthetic data.

The example YAML configs shipped in the package (jaxgossip/configs): found by bare name from any
folder, and the command on each file's first line checks (``--print-config``) from there."""

import glob
import json
import math
import os
import runpy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from jaxgossip import algorithms, configs, data, models, topology
from jaxgossip.run.config_files import read_config_file
from jaxgossip.run.parsing import UsageError
from jaxgossip.run.resolve import make_algorithm, make_optimizer
from jaxgossip.run.runner import load_config, run_training

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments", "configs")
CONFIG_FILES = sorted(glob.glob(os.path.join(CONFIG_DIR, "*.py")))


def _config_specs() -> list[str]:
    """Every Python config as ``--config`` takes it: the file (its default run) and ``FILE.py:ARG``
    for every argument its ``CONFIG_ARGS`` declares."""
    specs = []
    for path in CONFIG_FILES:
        specs.append(path)
        specs += [f"{path}:{arg}" for arg in runpy.run_path(path).get("CONFIG_ARGS", ())]
    return specs


CONFIGS = _config_specs()
IDS = [os.path.basename(p).replace(".py", "") for p in CONFIGS]

# Every run of the two CIFAR-10 families: the argument that selects it and the call of the family's
# recipe function that defines it (``get_config(variant)``, ``grid_config(model, num_nodes, method)``).
POWERGOSSIP_RUNS = {
    v: (v,)
    for v in (
        "allreduce", "gossip", "choco_sign_tuned", "choco_sign_untuned", "choco_topk", "deepsqueeze_sign",
        "pg_i1_warm", "pg_i2_warm", "pg_i1_random", "pg_i2_random",
    )
}
SPARSEPUSH_RUNS = {
    f"{model}_n{n}_{method}": (model, n, method)
    for model in ("resnet20", "vgg11")
    for n in (8, 16)
    for method in ("push_sum", "sparse_push_1pct", "sparse_push_0p1pct", "scsp")
}

# Input shape of each dataset the configs name (synthetic smoke data is 8x8x1).
INPUT_SHAPES = {"cifar10": (32, 32, 3), "fashion_mnist": (28, 28, 1), "auto": (8, 8, 1), "digits": (8, 8, 1)}

# Tiny shapes for the 2-round smoke runs; the model is replaced by a tiny CNN (convolution kernels
# still exercise PowerGossip's flax_kernel matrix view).
SMOKE = {
    "dataset": "synthetic",
    "num_nodes": 4,
    "batch_size": 4,
    "num_rounds": 2,
    "eval_every": 2,
    "evals_per_chunk": 1,
    "model": "cnn",
    "model_options": {"features": [4]},
    "eval_size": 32,
    "eval_chunk": 32,
}


def _base(name):
    return runpy.run_path(os.path.join(CONFIG_DIR, name))


def test_config_directory_is_complete():
    assert len(CONFIGS) >= 30
    pg = _base("powergossip_cifar10.py")
    for variant in pg["VARIANTS"]:
        assert variant in pg["CONFIG_ARGS"], variant
    sp = _base("sparsepush_cifar10.py")
    for model in sp["SCHEDULES"]:
        for n in sp["NUM_NODES"]:
            for method in sp["METHODS"]:
                assert f"{model}_n{n}_{method}" in sp["CONFIG_ARGS"]
    names = [load_config(p).name for p in CONFIGS]
    # a family file without argument repeats its default run's name; every argument has its own
    runs = [n for p, n in zip(CONFIGS, names) if ".py:" in p]
    assert len(set(runs)) == len(runs)


def test_every_recipe_run_is_an_argument_of_its_family():
    """``FILE.py:ARG`` gives exactly the mapping of the family's recipe call for that run, under the
    run's own name, and the family declares exactly its runs as arguments."""
    pg, sp = _base("powergossip_cifar10.py"), _base("sparsepush_cifar10.py")
    assert set(pg["CONFIG_ARGS"]) == set(POWERGOSSIP_RUNS) == set(pg["VARIANTS"])
    assert set(sp["CONFIG_ARGS"]) == set(SPARSEPUSH_RUNS) == set(sp["GRID"])
    for family, base, runs, recipe in [
        ("powergossip_cifar10", pg, POWERGOSSIP_RUNS, "get_config"),
        ("sparsepush_cifar10", sp, SPARSEPUSH_RUNS, "grid_config"),
    ]:
        for arg, call in runs.items():
            spec = os.path.join(CONFIG_DIR, f"{family}.py:{arg}")
            values = read_config_file(spec)
            assert values == base[recipe](*call) == base["get_config"](arg), spec
            assert values["name"] == f"{family}_{arg}"
            assert load_config(spec) == load_config(None, base[recipe](*call))
    for family, full in [("powergossip_cpu", "VARIANTS"), ("sparsepush_cpu", "METHODS")]:
        cpu = _base(f"{family}.py")
        assert set(cpu["CONFIG_ARGS"]) == set(cpu[full])
        for arg in cpu["CONFIG_ARGS"]:
            assert read_config_file(os.path.join(CONFIG_DIR, f"{family}.py:{arg}")) == cpu["get_config"](arg)


@pytest.mark.parametrize("path", CONFIGS, ids=IDS)
def test_config_loads_and_builds(path):
    config = load_config(path)
    assert config.name, "every config names its run"
    assert config.algorithm in algorithms.REGISTRY
    topo = topology.make(config.topology, config.num_nodes, seed=config.seed)
    make_algorithm(config, topo)  # validates the options against the graph
    make_optimizer(config)  # validates lr, decay boundaries, weight-decay mask
    assert 0 <= config.warmup_rounds < min(config.decay_rounds + (config.num_rounds,))
    assert all(b < config.num_rounds for b in config.decay_rounds)
    assert list(config.decay_rounds) == sorted(config.decay_rounds)
    assert config.num_rounds % config.eval_every == 0
    assert config.final_merge in (None, "exact") or int(config.final_merge) >= 1
    # CLI round trip: the overrides the docstrings advertise parse
    again = load_config(path, {"partition": "skew:0.8", "seed": "3"})
    assert again.partition == "skew:0.8" and again.seed == 3


_SHAPES_SEEN = {}


def _num_params(model, options, shape):
    key = (model, json.dumps(options, sort_keys=True), shape)
    if key not in _SHAPES_SEEN:
        module = models.make_model(model, num_classes=10, **options)
        variables = jax.eval_shape(lambda: module.init(jax.random.key(0), jnp.zeros((1, *shape)), train=False))
        _SHAPES_SEEN[key] = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(variables["params"]))
    return _SHAPES_SEEN[key]


def test_models_build_on_their_data():
    """Every (model, options, dataset) of the configs initialises on its dataset's input shape."""
    combos = {}
    for path in CONFIGS:
        c = load_config(path)
        combos[(c.model, json.dumps(c.model_options, sort_keys=True), c.dataset)] = c
    for (model, options, dataset), _ in combos.items():
        count = _num_params(model, json.loads(options), INPUT_SHAPES[dataset])
        if model == "resnet20":
            assert count == 272_474  # docs/training.md, section training recipes and models
        if model == "vgg11":
            assert count == 9_231_114


def test_powergossip_recipe_numbers():
    base = _base("powergossip_cifar10.py")
    expected = {  # variant -> (algorithm, F, gamma)
        "allreduce": ("allreduce", 11.3, None),
        "gossip": ("gossip", 11.3, 1.308),
        "choco_sign_tuned": ("choco", 16.0, 0.45),
        "choco_sign_untuned": ("choco", 11.3, 1.308),
        "choco_topk": ("choco", 11.3, 0.0375),
        "deepsqueeze_sign": ("deepsqueeze", 4.8, 0.01),
        "pg_i1_warm": ("power_gossip", 11.3, 1.308),
        "pg_i2_warm": ("power_gossip", 11.3, 1.308),
        "pg_i1_random": ("power_gossip", 11.3, 1.308),
        "pg_i2_random": ("power_gossip", 11.3, 1.308),
    }
    assert set(base["VARIANTS"]) == set(expected)
    for variant, (alg, factor, gamma) in expected.items():
        c = load_config(os.path.join(CONFIG_DIR, f"powergossip_cifar10.py:{variant}"))
        assert c == load_config(None, base["get_config"](variant))
        assert (c.algorithm, c.dataset, c.model, c.num_nodes, c.topology) == (alg, "cifar10", "resnet20", 8, "ring")
        assert math.ceil(50_000 / 8 / 128) == 49
        assert c.num_rounds == 300 * 49 and c.warmup_rounds == 5 * 49
        assert c.decay_rounds == (150 * 49, 225 * 49) and c.decay_factor == 0.1
        assert c.lr == pytest.approx(0.1 * factor) and c.warmup_from == 0.1
        assert (c.batch_size, c.momentum, c.nesterov, c.weight_decay) == (128, 0.9, True, 1e-4)
        assert (c.weight_decay_mask, c.ordering, c.augment, c.identical_init) == ("no_norm", "same_iterate", True, True)
        assert c.algorithm_options.get("gamma") == gamma
    opts = base["get_config"]("choco_topk")["algorithm_options"]
    assert opts["compressor"] == "top_k" and opts["compressor_options"] == {"fraction": 0.01, "index_bits": 64}
    assert base["get_config"]("choco_sign_tuned")["algorithm_options"]["compressor"] == "sign"
    assert base["get_config"]("deepsqueeze_sign")["algorithm_options"]["compressor"] == "sign"
    for variant, iters, warm in [
        ("pg_i1_warm", 1, True),
        ("pg_i2_warm", 2, True),
        ("pg_i1_random", 1, False),
        ("pg_i2_random", 2, False),
    ]:
        opts = base["get_config"](variant)["algorithm_options"]
        assert (opts["rank"], opts["num_iterations"], opts["warm_start"]) == (1, iters, warm)
    with pytest.raises(ValueError, match="unknown variant"):
        base["get_config"]("moniqua")


def test_sparsepush_recipe_numbers():
    base = _base("sparsepush_cifar10.py")
    for model, decays, factor in [("resnet20", (100, 150), 0.1), ("vgg11", (30, 60, 90, 120, 150, 180), 0.5)]:
        for n, spe in [(8, 196), (16, 98)]:
            for method in base["METHODS"]:
                c = load_config(os.path.join(CONFIG_DIR, f"sparsepush_cifar10.py:{model}_n{n}_{method}"))
                assert c == load_config(None, base["grid_config"](model, n, method))
                assert (c.dataset, c.model, c.num_nodes, c.topology) == ("cifar10", model, n, "one_peer_exponential")
                assert c.num_rounds == 200 * spe and c.warmup_rounds == spe
                assert c.decay_rounds == tuple(e * spe for e in decays) and c.decay_factor == factor
                assert (c.lr, c.warmup_from, c.batch_size, c.momentum, c.nesterov) == (
                    0.1,
                    pytest.approx(0.01),
                    32,
                    0.9,
                    True,
                )
                assert (c.weight_decay, c.ordering) == (1e-4, "atc")
                assert c.final_merge == (int(math.log2(n)) if method == "scsp" else None)
    assert base["grid_config"](method="sparse_push_1pct")["algorithm_options"] == {"fraction": 0.01, "gamma": 0.01}
    assert base["grid_config"](method="sparse_push_0p1pct")["algorithm_options"]["fraction"] == 0.001
    assert base["get_config"]() == base["grid_config"]()
    with pytest.raises(ValueError, match="unknown model"):
        base["grid_config"]("resnet110")
    with pytest.raises(ValueError, match="num_nodes"):
        base["grid_config"]("resnet20", 32)
    with pytest.raises(ValueError, match="unknown method"):
        base["grid_config"]("resnet20", 8, "choco")
    with pytest.raises(ValueError, match="unknown grid point 'resnet20_n32_scsp'"):
        base["get_config"]("resnet20_n32_scsp")


def _smoke_groups():
    """One representative config per distinct communication setup (the 30 runs of the files and
    arguments, CPU arguments aside, share 13 setups once shrunk to 4 nodes; every file's schedule and options were validated above). The default
    run trains one file per (algorithm, compressor, graph, ordering, merge, decay mask): 9 of the
    13; the other 4 differ from one of those in algorithm options only (PowerGossip's iterations
    and warm start, Sparse-Push's fraction, each tested on its own in the algorithm's tests) and
    run with -m slow."""
    groups, coarse = {}, set()
    for path in CONFIGS:
        c = load_config(path)
        # gamma is a traced value and the merge length a loop count: neither changes the code path
        options = {k: v for k, v in c.algorithm_options.items() if k != "gamma"}
        setup = (c.algorithm, c.topology, c.ordering, c.final_merge is None, c.weight_decay_mask)
        groups.setdefault((setup, json.dumps(options, sort_keys=True)), (setup, str(options.get("compressor")), path))
    params = []
    for setup, compressor, path in sorted(groups.values(), key=lambda g: g[2]):
        first = (setup, compressor) not in coarse
        coarse.add((setup, compressor))
        name = os.path.basename(path).replace(".py", "")
        params.append(pytest.param(path, id=name, marks=() if first else pytest.mark.slow))
    return params


SMOKE_FILES = _smoke_groups()


@pytest.fixture(scope="module")
def synthetic():
    return data.make_synthetic(num_train=64, num_test=32)


@pytest.mark.parametrize("path", SMOKE_FILES)
def test_config_trains_two_rounds(path, synthetic):
    config = load_config(path, SMOKE)
    result = run_training(config, None, progress=False, dataset=synthetic, log=lambda s: None)
    assert result.finished
    rows = result.rows
    assert [r["phase"] for r in rows] == ["train"] + (["merged"] if config.final_merge else [])
    assert rows[0]["round"] == 2
    for row in rows:
        assert np.isfinite(row["train_loss"]) and 0.0 <= row["test_acc"] <= 1.0
    assert rows[-1]["MB_per_node"] > 0


# ---- the example configs shipped in the package --------------------------------------------------

SHIPPED = ["consensus_ring.yaml", "demo_mild.yaml", "digits_choco.yaml", "digits_sweep.yaml", "topology_sweep.yaml"]


def test_shipped_configs_are_the_examples_and_live_only_in_the_package():
    assert configs.names() == SHIPPED
    assert all(os.path.isfile(configs.path(name)) for name in SHIPPED)
    assert glob.glob(os.path.join(CONFIG_DIR, "*.yaml")) == []  # one copy of each file
    assert configs.path("powergossip_cpu.py") is None and configs.path("configs/digits_choco.yaml") is None


def test_a_bare_name_reads_the_shipped_config_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in SHIPPED:
        with open(configs.path(name)) as f:
            assert read_config_file(name) == yaml.safe_load(f), name
    # a file of that name in the current folder comes first
    (tmp_path / "digits_choco.yaml").write_text("lr: 0.5\n")
    assert read_config_file("digits_choco.yaml") == {"lr": 0.5}
    with pytest.raises(UsageError, match=r"digits_sweep.yaml' takes no argument"):
        read_config_file("digits_sweep.yaml:small")


@pytest.mark.parametrize("spec", ["digits_choko.yaml", "experiments/configs/digits_choco.yaml"])
def test_a_missing_config_lists_the_shipped_ones(tmp_path, monkeypatch, spec):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as info:
        read_config_file(spec)
    message = str(info.value)
    assert f"config file {spec!r} does not exist (did you mean 'digits_choco.yaml'?)" in message
    assert ", ".join(SHIPPED) in message


@pytest.mark.parametrize("name", SHIPPED)
def test_the_command_on_a_shipped_configs_first_line_checks_from_any_folder(name, tmp_path, monkeypatch, capsys):
    from jaxgossip.cli import main

    with open(configs.path(name)) as f:
        first = f.readline()
    assert first.startswith("# jaxgossip "), first
    argv = first.partition("[")[0].split()[2:]  # without the "[--field=value ...]" placeholder
    assert argv[1:] == ["--config", name], first  # by bare name: it runs from a wheel too
    monkeypatch.chdir(tmp_path)
    code = main([*argv, "--print-config"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert yaml.safe_load(out), out
