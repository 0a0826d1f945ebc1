"""The typed configuration system of every command (jaxgossip.run.config, jaxgossip.run.parsing):
``--help`` lists every field, overrides at any depth and list forms work, config files (YAML and
Python) are checked against the same types, bad input exits with 2 and one message before any work,
and runs that diverge are reported as such. Most checks run in-process through ``main`` and
``--print-config`` (no JAX compile); one subprocess per command checks the real exit status."""

import dataclasses
import json
import os
import sys

import pytest
import yaml
from _reference import run_main, start_cli
from tiny import TINY_FLAGS

from jaxgossip import algorithms, compress, data, models
from jaxgossip.cli.consensus import ConsensusConfig
from jaxgossip.cli.sweep import SweepOptions
from jaxgossip.cli.topology_sweep import TopologySweepOptions
from jaxgossip.run.config import TrainConfig
from jaxgossip.run.resolve import check_train_config
from jaxgossip.run.runner import config_from_dict, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMANDS = ["train", "sweep", "consensus", "topology-sweep", "demo"]
# The cost options of each command: a training command's --time.* are TrainConfig.time (a field).
COST = {
    command: ["energy.flop", "energy.bit"] if command != "consensus"
    else ["time.bandwidth", "time.latency", "time.mode", "time.allreduce_model", "energy.flop", "energy.bit"]
    for command in COMMANDS
}
FIELDS = {
    "train": [f.name for f in dataclasses.fields(TrainConfig)],
    "sweep": [f.name for f in dataclasses.fields(TrainConfig) + dataclasses.fields(SweepOptions)],
    "consensus": [f.name for f in dataclasses.fields(ConsensusConfig)],
    "topology-sweep": [f.name for f in dataclasses.fields(TrainConfig) + dataclasses.fields(TopologySweepOptions)],
    "demo": [f.name for f in dataclasses.fields(TrainConfig)],
}
# What a command needs besides the field under test (topology-sweep needs its graphs).
REQUIRED = {"topology-sweep": ["--topologies=ring"]}
TINY = TINY_FLAGS  # tests/tiny.py's config as flags


def _resolved(capsys, command, *argv) -> dict:
    code, out, err = run_main(capsys, command, *REQUIRED.get(command, []), *argv, "--print-config")
    assert code == 0, err
    return yaml.safe_load(out)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_lists_every_field_with_type_default_and_allowed_values(command, capsys):
    code, out, _ = run_main(capsys, command, "--help")
    assert code == 0
    for field in FIELDS[command] + COST[command] + ["config", "out", "print-config"]:
        assert f"--{field} " in out or f"--{field}\n" in out, field
    assert out.count("(type:") >= len(FIELDS[command]) and "default:" in out
    if command != "consensus":
        for name in (*data.DATASET_NAMES, *models.REGISTRY, "dirichlet:ALPHA", "shards:K", "skew:S", "atc"):
            assert name in out, name
    if command == "demo":  # the algorithms are fixed per run: the help lists the runs
        assert "choco top-10%: choco on ring" in out and "scsp 10%: scsp on one_peer_exponential" in out
        return
    for name in [*algorithms.REGISTRY, *compress.REGISTRY]:  # and each algorithm's hyperparameters
        assert name in out, name
    assert "power_gossip  rank=1, num_iterations=1" in out


def test_top_level_help_and_unknown_command(capsys):
    code, out, _ = run_main(capsys, "--help")
    assert code == 0 and all(c in out for c in COMMANDS)
    code, _, err = run_main(capsys, "trian")
    assert code == 2 and "unknown command 'trian' (did you mean 'train'?)" in err


YAML_BASE = {
    "algorithm": "choco",
    "algorithm_options": {"gamma": 0.3, "compressor": "top_k", "compressor_options": {"fraction": 0.01, "index_bits": 64}},
}


@pytest.mark.parametrize("command", ["train", "sweep", "topology-sweep"])
def test_nested_override_at_depth_two_merges_into_the_file(command, tmp_path, capsys):
    path = tmp_path / "base.yaml"
    extra = {"sweep": {"lr": [0.1]}} if command == "sweep" else {}
    path.write_text(yaml.safe_dump({**YAML_BASE, **extra}))
    resolved = _resolved(
        capsys, command, "--config", str(path), "--algorithm_options.compressor_options.fraction=0.2"
    )
    assert resolved["algorithm_options"] == {
        "gamma": 0.3,
        "compressor": "top_k",
        "compressor_options": {"fraction": 0.2, "index_bits": 64},
    }


def test_nested_overrides_of_sweep_consensus_and_demo(capsys):
    resolved = _resolved(capsys, "sweep", "--sweep.algorithm_options.gamma=0.1,0.3", "--sweep.lr=[0.01,0.1]")
    assert resolved["sweep"] == {"algorithm_options.gamma": [0.1, 0.3], "lr": [0.01, 0.1]}
    resolved = _resolved(
        capsys,
        "consensus",
        "--algorithm=choco",
        "--algorithm_options.compressor=top_k",
        "--algorithm_options.compressor_options.fraction=0.2",
    )
    assert resolved["runs"] == [
        {
            "name": "choco",
            "algorithm": "choco",
            "topology": None,
            "options": {"compressor": "top_k", "compressor_options": {"fraction": 0.2}},
        }
    ]
    resolved = _resolved(capsys, "demo", "--model_options.hidden=32", "--time.bandwidth=1e8")
    assert resolved["model_options"] == {"hidden": [32]} and resolved["time"] == {"bandwidth": 1e8}


def test_list_and_null_forms_people_type(capsys):
    for flag, expected in [("--decay_rounds=5", [5]), ("--decay_rounds=100,150", [100, 150]), ("--decay_rounds=[100,150]", [100, 150])]:
        assert _resolved(capsys, "train", "--num_rounds=200", flag)["decay_rounds"] == expected
    resolved = _resolved(capsys, "train", "--model=mlp", "--model_options.hidden=32", "--data_seed=none", "--download")
    assert resolved["model_options"] == {"hidden": [32]} and resolved["data_seed"] is None and resolved["download"]
    assert _resolved(capsys, "consensus", "--shape=1000")["shape"] == [1000]
    assert _resolved(capsys, "sweep", "--sweep.lr=0.1", "--seeds=0,5")["seeds"] == [0, 5]
    assert _resolved(capsys, "sweep", "--sweep.lr=0.1", "--seeds=2")["seeds"] == [0, 1]
    resolved = _resolved(capsys, "topology-sweep", "--topologies=ring,torus:2x4,erdos_renyi:0.5", "--sizes=8")
    assert resolved["topologies"] == ["ring", "torus:2x4", "erdos_renyi:0.5"] and resolved["sizes"] == [8]
    assert _resolved(capsys, "topology-sweep", "--topologies+=torus", "--sizes=8")["topologies"] == ["ring", "torus"]
    # the JSON mapping form of the README keeps working
    resolved = _resolved(capsys, "train", '--algorithm=choco', '--algorithm_options={"compressor": "sign"}')
    assert resolved["algorithm_options"] == {"compressor": "sign"}


PY_CONFIGS = {
    "train": {"algorithm": "choco", "algorithm_options": {"compressor": "sign", "gamma": 0.2}, "lr": 0.1},
    "sweep": {"lr": 0.1, "sweep": {"algorithm_options": {"gamma": [0.5, 1.0]}}, "seeds": 2},
    "consensus": {"num_steps": 7, "shape": [10], "algorithm": "push_sum", "topology": "one_peer_exponential"},
    "topology-sweep": {"topologies": ["ring", "star"], "sizes": [8], "num_steps": 9},
    "demo": {"num_nodes": 8, "partition": "skew:0.5"},
}


def _assert_resolves_to(resolved: dict, values: dict):
    for key, value in values.items():
        if key == "sweep":
            assert resolved["sweep"] == {"algorithm_options.gamma": [0.5, 1.0]}
        elif key == "seeds":
            assert resolved["seeds"] == [0, 1]
        else:
            assert resolved[key] == value, key


@pytest.mark.parametrize("command", COMMANDS)
def test_python_and_yaml_configs_for_every_command(command, tmp_path, capsys):
    values = PY_CONFIGS[command]
    py = tmp_path / "cfg.py"
    py.write_text(f"def get_config():\n    return {values!r}\n")
    yml = tmp_path / "cfg.yaml"
    yml.write_text(yaml.safe_dump(values))
    for path in (py, yml):
        code, out, err = run_main(capsys, command, "--config", str(path), "--print-config")
        assert code == 0, err
        _assert_resolves_to(yaml.safe_load(out), values)


@pytest.mark.parametrize("command", COMMANDS)
def test_python_config_argument_for_every_command(command, tmp_path, capsys):
    """``--config FILE.py:ARG`` passes ARG to get_config; without it the default applies; a folder
    or file name with ':' elsewhere in the path stays a path."""
    values = PY_CONFIGS[command]
    folder = tmp_path / "runs:v2"
    folder.mkdir()
    family = folder / "family.py"
    family.write_text(
        "CONFIG_ARGS = ('given', 'empty')\n\n\n"
        f"def get_config(arg='empty'):\n    return {{'given': {values!r}, 'empty': {{}}}}[arg]\n"
    )

    def resolved(*argv):
        code, out, err = run_main(capsys, command, *argv, "--print-config")
        assert code == 0, err
        return yaml.safe_load(out)

    _assert_resolves_to(resolved("--config", f"{family}:given"), values)
    assert resolved(f"--config={family}:given") == resolved("--config", f"{family}:given")
    axis = ["--sweep.lr=0.1"] if command == "sweep" else []  # the empty config needs what the command requires
    assert _resolved(capsys, command, "--config", str(family), *axis) == _resolved(capsys, command, *axis)
    odd = tmp_path / "odd:name.yaml"
    odd.write_text(yaml.safe_dump(values))
    _assert_resolves_to(resolved("--config", str(odd)), values)


@pytest.mark.parametrize("command", COMMANDS)
def test_yaml_with_an_unknown_key_is_refused(command, tmp_path, capsys):
    path = tmp_path / "typo.yaml"
    path.write_text("num_step: 10\nlr: 0.1\n" if command != "consensus" else "num_step: 10\nseed: 1\n")
    code, _, err = run_main(capsys, command, "--config", str(path), *REQUIRED.get(command, []))
    assert code == 2
    assert f"jaxgossip {command}: error: config file '{path}': unknown key 'num_step'" in err, err
    assert "Traceback" not in err


def test_empty_yaml_means_defaults(tmp_path, capsys):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert _resolved(capsys, "consensus", "--config", str(path))["num_steps"] == 500


def _bad_inputs(tmp, make=False):
    """(command, argv, message) of bad input; with ``make`` the files they need are written to ``tmp``."""
    files = {
        "syntax.yaml": "lr: [0.1\n",
        "list.yaml": "- lr\n",
        "noconfig.py": "X = 1\n",
        "broken.py": "def get_config():\n    return 1 / 0\n",
        "afile": "",
        "mistyped.yaml": "num_nodes: many\n",
        "badrun.yaml": "runs:\n  - {name: a, algorithm: gossip, optoins: {}}\n",
        "family.py": "CONFIG_ARGS = ('small', 'large')\n\n\ndef get_config(size='small'):\n    return {}\n",
        "noarg.py": "def get_config():\n    return {}\n",
        "plain.yaml": "lr: 0.1\n",
        "plain.json": '{"lr": 0.1}\n',
    }
    if make:
        os.makedirs(tmp, exist_ok=True)
        for name, text in files.items():
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
    f = lambda name: os.path.join(tmp, name)  # noqa: E731
    return [
        ("train", ["--num_round=3"], "unknown option --num_round (did you mean 'num_rounds'?)"),
        ("train", ["--ou=x"], "unknown option --ou (did you mean 'out'?)"),
        ("train", ["positional"], "unexpected argument 'positional'"),
        ("train", ["--lr=abc"], "--lr='abc' is not valid: expected float"),
        ("train", ["--final_merge=abc"], "final_merge='abc' must be null (no merge), a number of merge rounds"),
        ("train", ["--num_rounds=30", "--eval_every=20"], "num_rounds=30 must be a multiple of eval_every=20"),
        ("train", ["--partition=dirichlet:0"], "partition='dirichlet:0': dirichlet needs ALPHA > 0"),
        ("train", ["--partition=zipf:2"], "unknown partition 'zipf'"),
        ("train", ["--topology=hypercube", "--num_nodes=6"], "hypercube needs n to be a power of two"),
        ("train", ["--topology=rnig"], "unknown topology 'rnig' (did you mean 'ring'?)"),
        ("train", ["--dataset=mnsit"], "unknown dataset 'mnsit' (did you mean 'mnist'?)"),
        ("train", ["--algorithm=gossip", "--algorithm_options.gama=0.5"], "has no option 'gama' (did you mean 'gamma'?)"),
        ("train", ["--model=mlp", "--model_options.hiden=3"], "has no attribute 'hiden' (did you mean 'hidden'?)"),
        ("train", ["--momentum=1.5"], "momentum=1.5 must be a number >= 0 and < 1"),
        ("train", ["--decay_rounds=10,5"], "decay_rounds=[10, 5] must be increasing"),
        ("train", ["--num_nodes=6", "--devices=4"], "devices=4 must divide num_nodes=6"),
        ("train", ["--algorithm=gossip", "--topology=random_directed:0.5"], "algorithm='gossip' on"),
        ("train", ["--config", f("syntax.yaml")], "is not valid YAML"),
        ("train", ["--config", f("list.yaml")], "must hold a mapping"),
        ("train", ["--config", f("noconfig.py")], "must define get_config()"),
        ("train", ["--config", f("broken.py")], "failed: ZeroDivisionError"),
        ("train", ["--config", f("missing.yaml")], "does not exist"),
        ("train", ["--config", f("mistyped.yaml")], "mistyped.yaml': --num_nodes='many' is not valid: expected int"),
        ("train", ["--config", f("family.py:medium")], "family.py' has no argument 'medium'; valid arguments: small, large"),
        ("train", ["--config", f("family.py:smal")], "no argument 'smal' (did you mean 'small'?); valid arguments: small, large"),
        ("train", ["--config", f("family.py:")], "family.py' has no argument ''; valid arguments: small, large"),
        ("train", ["--config", f("noarg.py:small")], "noarg.py' takes no argument (got 'small'): its get_config() has no"),
        ("train", ["--config", f("plain.yaml:small")], "plain.yaml' takes no argument (got 'small'): only a Python config"),
        ("train", ["--config", f("plain.json:small")], "plain.json' takes no argument (got 'small'): only a Python config"),
        ("train", ["--config", f("missing.py:small")], "missing.py' does not exist"),
        ("train", ["--config", os.path.join(ROOT, "experiments", "configs", "powergossip_cifar10.py:moniqua")],
         "powergossip_cifar10.py' has no argument 'moniqua'; valid arguments: allreduce, gossip, choco_sign_tuned,"),
        ("train", ["--config", os.path.join(ROOT, "experiments", "configs", "sparsepush_cifar10.py:resnet20_n8")],
         "valid arguments: resnet20_n8_push_sum, resnet20_n8_sparse_push_1pct, resnet20_n8_sparse_push_0p1pct,"),
        ("sweep", ["--config", f("family.py:medium")], "family.py' has no argument 'medium'; valid arguments: small, large"),
        ("consensus", ["--config", f("plain.yaml:small")], "plain.yaml' takes no argument (got 'small')"),
        ("topology-sweep", ["--config", f("family.py:medium")], "has no argument 'medium'; valid arguments: small, large"),
        ("demo", ["--config", f("noarg.py:small")], "noarg.py' takes no argument (got 'small')"),
        ("train", ["--out", f("afile")], "is a file; give a folder"),
        ("train", ["--out", os.path.join(f("afile"), "sub")], "cannot be created"),
        ("train", ["--time.mode=fast"], "--time.mode='fast' is unknown"),
        ("train", ["--no-progress=1"], "--no-progress is a switch and takes no value"),
        ("sweep", ["--sweep.lr=abc"], "--sweep.lr=['abc'] must be a list of finite numbers"),
        ("sweep", ["--sweep.batch_size=4,8"], "--sweep.batch_size: sweep axis 'batch_size' would change array shapes"),
        ("sweep", ["--sweep.lrr=0.1"], "--sweep.lrr: unknown sweep axis 'lrr' (did you mean 'lr'?)"),
        ("sweep", ["--lr=0.1"], "a sweep needs at least one axis"),
        ("sweep", ["--sweep.lr=0.1,-1"], "--sweep.lr: lr=-1.0 must be a number > 0"),
        ("sweep", ["--sweep.lr=0.1", "--seeds=0"], "--seeds=0 must be a count >= 1"),
        ("consensus", ["--num_nodes=-3"], "num_nodes=-3 must be an int >= 1"),
        ("consensus", ["--shape=0"], "shape=[0] must be one or more sizes >= 1"),
        ("consensus", ["--algorithm=gosip"], "unknown algorithm 'gosip' (did you mean 'gossip'?)"),
        ("consensus", ["--algorithm_options.gamma=0.5"], "algorithm_options needs --algorithm"),
        ("consensus", ["--config", f("badrun.yaml")], "runs[0]: unknown key 'optoins' (did you mean 'options'?)"),
        ("consensus", ["--dataset=digits"], "unknown option --dataset"),
        ("topology-sweep", [], "--topologies is required"),
        ("topology-sweep", ["--topologies=ring", "--dataset=digits"], "--dataset is not an option of the consensus mode"),
        ("topology-sweep", ["--topologies=ring", "--train", "--sizes=8"], "--sizes is an option of the consensus mode"),
        ("demo", ["--algorithm=choco"], "--algorithm is set per run by the demo"),
        ("demo", ["--num_nodes=0"], "num_nodes=0 must be an int >= 1"),
    ]


BAD = _bad_inputs("FILES")  # for the ids; every test writes the files to its own folder


@pytest.mark.parametrize("index", range(len(BAD)), ids=[f"{c}:{' '.join(a)[:40]}" for c, a, _ in BAD])
def test_bad_input_exits_2_with_one_message_before_any_work(index, tmp_path, capsys):
    command, argv, message = _bad_inputs(str(tmp_path / "files"), make=True)[index]
    out = tmp_path / "out"
    if "--out" not in argv:
        argv = [*argv, "--out", str(out)]
    code, _, err = run_main(capsys, command, *argv)
    assert code == 2, err
    assert err.startswith(f"jaxgossip {command}: error: ") and message in err, err
    assert "Traceback" not in err and err.count("\n") <= 4
    assert not out.exists()  # refused before anything ran or was written


def test_corrupt_data_files_exit_2(tmp_path, capsys):
    import gzip

    raw = tmp_path / "raw"
    raw.mkdir()
    payload = gzip.compress(b"\x00\x00\x08\x03" + b"\x00\x00\x00\x0a" * 3 + bytes(1000))
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (raw / f"{stem}.gz").write_bytes(payload[: len(payload) // 2])  # truncated
    (raw / "cifar-10-python.tar.gz").write_bytes(b"not a tarball" * 10)
    for dataset in ("mnist", "cifar10"):
        code, _, err = run_main(capsys, "train", f"--dataset={dataset}", f"--raw_dir={raw}", "--model=mlp", "--out",
                             str(tmp_path / dataset), "--no-progress")
        assert code == 2 and err.startswith("jaxgossip train: error: ") and "Traceback" not in err, err


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_out_exits_2(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    code, _, err = run_main(capsys, "consensus", "--out", str(locked / "x"))
    assert code == 2 and "is not writable" in err


def test_out_that_cannot_be_written_exits_2_even_as_root(tmp_path, capsys, monkeypatch):
    """The same checks as above where the tests run as root (CI): permissions denied by os.access,
    and an --out below a file."""
    import jaxgossip.cli.common as common

    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(common.os, "access", lambda path, mode: False if str(path) == str(locked) else real_access(path, mode))
    code, _, err = run_main(capsys, "consensus", "--out", str(locked / "x"))
    assert code == 2 and "is not writable" in err and "Traceback" not in err
    assert not (locked / "x").exists()
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, _, err = run_main(capsys, "train", "--out", str(afile / "sub"))
    assert code == 2 and "cannot be created" in err and "is a file" in err


def test_python_api_keeps_the_messages_as_exceptions(tmp_path):
    with pytest.raises(ValueError, match=r"unknown key 'num_round' \(did you mean 'num_rounds'\?\)"):
        config_from_dict({"num_round": 3})
    config = config_from_dict({"algorithm_options.compressor_options.fraction": "0.2", "seed": "3"})
    assert config.algorithm_options == {"compressor_options": {"fraction": 0.2}} and config.seed == 3
    path = tmp_path / "bad.yaml"
    path.write_text("lrr: 0.1\n")
    with pytest.raises(ValueError, match=r"config file '.*bad.yaml': unknown key 'lrr' \(did you mean 'lr'\?\)"):
        load_config(str(path))
    with pytest.raises(ValueError, match="final_merge='abc' must be null"):
        check_train_config(TrainConfig(final_merge="abc"))
    assert check_train_config(TrainConfig(final_merge="3", decay_rounds=[50])).final_merge == 3


def test_gamma_outside_the_stable_range_is_warned(capsys):
    code, _, err = run_main(capsys, "train", "--algorithm_options.gamma=1.9", "--print-config")
    assert code == 0 and "algorithm_options.gamma=1.9 is outside the stable range (0, 1.5) of gossip on ring(8)" in err
    code, _, err = run_main(capsys, "train", "--algorithm_options.gamma=1.3", "--print-config")
    assert code == 0 and "stable range" not in err


def test_consensus_marks_a_diverged_run_and_keeps_the_others(tmp_path, capsys):
    out = tmp_path / "cons"
    runs = [
        {"name": "stable", "algorithm": "gossip"},
        {"name": "wild", "algorithm": "gossip", "options": {"gamma": 5.0}},
    ]
    code, printed, err = run_main(
        capsys, "consensus", f"--runs={json.dumps(runs)}", "--shape=4", "--num_steps=80", "--out", str(out), "--no-progress"
    )
    assert code == 0, err
    assert "wild: algorithm_options.gamma=5.0 is outside the stable range" in err
    assert "wild diverged at round" in err
    rows = {r["name"]: r for r in json.loads((out / "consensus.json").read_text())["rows"]}
    assert rows["stable"]["status"] == "ok" and rows["stable"]["final_error"] < 1e-3
    assert rows["wild"]["final_error"] is None and rows["wild"]["status"].startswith("diverged at round ")
    assert "diverged at round" in printed and "nan" not in printed.lower()
    assert "| wild " in (out / "consensus.md").read_text()


def test_topology_sweep_marks_a_diverged_graph(tmp_path, capsys):
    out = tmp_path / "topo"
    code, printed, err = run_main(
        capsys, "topology-sweep", "--topologies=ring,complete", "--sizes=8", "--num_steps=300", "--dim=2",
        "--seeds=1", "--algorithm_options.gamma=1.9", "--out", str(out),
    )
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert rows["ring(8)"]["status"].startswith("diverged at round") and rows["ring(8)"]["final_error"] is None
    assert rows["complete(8)"]["status"] == "ok" and rows["complete(8)"]["final_error"] < 1e-6
    assert "ring(8) diverged at round" in err
    assert "| ring(8)" in (out / "table.md").read_text()


def test_sweep_reports_a_diverged_point_and_keeps_the_others(tmp_path, capsys):
    out = tmp_path / "sweep"
    code, printed, err = run_main(
        capsys, "sweep", *TINY, "--num_rounds=10", "--momentum=0", "--sweep.lr=0.05,1e8", "--seeds=2", "--out", str(out),
        "--no-progress",
    )
    assert code == 0, err
    saved = json.loads((out / "sweep.json").read_text())
    ok, wild = saved["rows"]
    assert ok["status"] == "ok" and 0.0 <= ok["test_acc"] <= 1.0 and ok["MB_per_node"] > 0
    assert wild["status"].startswith("diverged at round") and wild["test_acc"] is None
    assert "diverged at round" in err and "the others are kept" in err
    md = (out / "sweep.md").read_text()
    assert md.startswith("Command: `jaxgossip sweep") and "| lr " in md and "diverged at round" in md
    assert "nan" not in printed.split("\n", 2)[2].lower()
    assert (out / "sweep.png").exists()


def test_train_divergence_exits_3(tmp_path, capsys):
    out = tmp_path / "nan"
    code, _, err = run_main(
        capsys, "train", *TINY, "--num_rounds=5", "--momentum=0", "--lr=1e8", "--out", str(out), "--no-progress"
    )
    assert code == 3 and "stopped" in err and (out / "metrics.json").exists()


SUBPROCESS_BAD = {
    "train": ["--final_merge=abc"],
    "sweep": ["--sweep.lr=0.1,0.2", "--num_round=3"],
    "consensus": ["--num_nodes=-3"],
    "topology-sweep": ["--topologies=ring,ringg"],
    "demo": ["--ou=x"],
}


def test_every_command_exits_2_without_traceback_as_a_subprocess(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))] + sys.path))
    procs = {command: start_cli(command, argv, tmp_path / command, env) for command, argv in SUBPROCESS_BAD.items()}
    for command, proc in procs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, (command, err)
        assert err.startswith(f"jaxgossip {command}: error: ") and "Traceback" not in err, err
        assert not (tmp_path / command).exists()


def test_one_table_formatter():
    from jaxgossip.run.plots import format_table, table_legend

    rows = [{"name": "a", "acc": 0.5, "min": None}, {"name": "bb", "acc": float("nan"), "min": 0.25}]
    columns = [("name", "run", ""), ("acc", "acc(avg)", ".3f"), ("min", "min", ".2f")]
    md = format_table(rows, columns, markdown=True).splitlines()
    assert md[0] == "| run | acc(avg) | min  |"
    assert md[1] == "|-----|---------:|-----:|"
    assert md[2] == "| a   |    0.500 |    - |" and md[3] == "| bb  |        - | 0.25 |"
    text = format_table(rows, columns).splitlines()
    assert text[0].split() == ["run", "acc(avg)", "min"] and text[2].split() == ["a", "0.500", "-"]
    legend = table_legend(columns + [("consensus", "consensus", ".3g"), ("reduction", "vs gossip", ".1f")])
    assert "`min`" in legend and "`consensus`" in legend and "`vs gossip`" in legend


def _documented_command_lines() -> list[tuple[str, list[str]]]:
    """Every ``jaxgossip COMMAND ...`` line of README.md, docs/*.md, experiments/README.md, the study
    pages experiments/studies/*.md, the example configs' docstrings and the notebook, as argv (line
    continuations joined, DIR placeholders kept)."""
    import glob
    import re
    import shlex

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sources = [os.path.join(root, "README.md"), os.path.join(root, "experiments", "README.md")]
    sources += sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    sources += sorted(glob.glob(os.path.join(root, "experiments", "studies", "*.md")))
    sources += sorted(p for p in glob.glob(os.path.join(root, "experiments", "configs", "*")) if os.path.isfile(p))
    sources.append(os.path.join(root, "experiments", "colab_demo.ipynb"))
    lines = []
    for path in sources:
        text = open(path).read()
        if path.endswith(".ipynb"):
            text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"])
        text = re.sub(r"\\+\s*\n\s*", " ", text)  # continuation lines (one backslash, or two in docstrings)
        for match in re.finditer(r"jaxgossip (train|sweep|consensus|topology-sweep|demo)\b([^`\n#]*)", text):
            args = shlex.split(match.group(2).strip().rstrip("."))
            if not args or "--help" in args or "..." in match.group(2):  # prose mentions, placeholders
                continue
            lines.append((os.path.relpath(path, root), [match.group(1), *args]))
    return lines


DOCUMENTED = _documented_command_lines()


@pytest.mark.parametrize("where, argv", DOCUMENTED, ids=[f"{w}:{' '.join(a)[:50]}" for w, a in DOCUMENTED])
def test_documented_command_lines_parse_and_check(where, argv, capsys, monkeypatch):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    argv = [a.replace("DIR", "/tmp") for a in argv]
    code, _, err = run_main(capsys, *argv, "--print-config")
    assert code == 0, (where, err)


def test_train_on_an_npz_dataset_local_steps_and_adam(tmp_path, capsys):
    import numpy as np

    blobs = data.make_synthetic(num_train=256, num_test=64, num_classes=4, shape=(4, 4, 1), seed=0)
    path = tmp_path / "blobs.npz"
    np.savez(path, x_train=blobs.x_train, y_train=blobs.y_train, x_test=blobs.x_test, y_test=blobs.y_test)
    out = tmp_path / "run"
    tiny = [a for a in TINY if not a.startswith("--dataset")]
    flags = ["--local_steps=2", "--optimizer=adam", "--optimizer_options.b2=0.99", "--grad_clip=1.0", "--lr=0.01"]
    code, _, err = run_main(capsys, "train", "--out", str(out), "--no-progress", f"--dataset=npz:{path}", *tiny, *flags)
    assert code == 0, err
    with open(out / "metrics.json") as f:
        payload = json.load(f)
    assert payload["data_source"].startswith(f"npz: {path}") and payload["local_steps"] == 2
    assert [r["local_step"] for r in payload["rows"]] == [10, 20, 30, 40]
    with open(out / "config.json") as f:
        saved = json.load(f)
    assert saved["optimizer_options"] == {"b2": 0.99} and saved["grad_clip"] == 1.0
    missing = f"--dataset=npz:{tmp_path / 'nope.npz'}"
    code, _, err = run_main(capsys, "train", "--out", str(tmp_path / "bad"), "--no-progress", missing, *tiny)
    assert code == 2 and "no file" in err and "Traceback" not in err
