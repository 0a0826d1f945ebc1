"""The path a user walks, for every algorithm and every feature: command line -> config check ->
run -> checkpoint -> interrupted -> resumed -> report, through ``jaxgossip.cli.main``.

The axes come from the package, not from this file: the algorithms from the registry
(``jaxgossip.algorithms.INFOS``, plus the README's plug-in registered here), the features and
commands from the catalogue ``jaxgossip.run.features``, the graphs of each algorithm and feature
from its metadata (``features.graphs_of``; ``topology-sweep`` runs all of a feature's graphs in one
program). A new algorithm or feature is enrolled without editing this file.

A train cell runs ``jaxgossip train --out D`` to the end, deletes the newest checkpoint (a process
killed before its last save completed), runs the same command again, and requires the resumed run to
end bit-identical: the SHA-256 of every saved array and every metrics row (wall times aside). A
combination the configuration checks refuse must be refused the documented way: exit 2 with one
line, before anything is written. A command cell (``sweep``, ``plan``, ``topology-sweep --train``)
must finish with exit 0 or be refused that way.

Default tier: every algorithm plain; every feature on one algorithm that accepts it (the algorithm
list rotated per feature, so the features land on different algorithms); every command plain and
with Byzantine nodes. ``-m slow``: the full cross of algorithms with features and with commands,
each train cell also re-running its finished run (which must resume to the same files without
training; tests/run/test_checkpoint.py checks it in the default suite).
"""

import json
import shutil

import pytest
from _reference import readme_plugin

from jaxgossip import algorithms
from jaxgossip.cli import main
from jaxgossip.run import checkpoint, features
from jaxgossip.run.config import TrainConfig

ROUNDS = 4  # two chunks of two rounds: a checkpoint after each
BASE = [
    "--dataset=synthetic",
    "--num_nodes=4",
    "--model=mlp",
    "--model_options.hidden=4",
    "--batch_size=4",
    f"--num_rounds={ROUNDS}",
    "--eval_every=2",
    "--evals_per_chunk=1",
    "--eval_size=16",
    "--eval_chunk=16",
]
PLUGIN = "readme_plugin"  # the README's plug-in, registered under this name for its cells
BUILTINS = list(algorithms.INFOS)
NAMES = [*BUILTINS, PLUGIN]
PLAIN = next(f for f in features.FEATURES if f.name == "plain")
TRAIN_FEATURES = [f for f in features.FEATURES if f.name != "plain"]
OTHER_COMMANDS = [c for c in features.COMMANDS if c != "train"]


@pytest.fixture
def plugin():
    """Registers the README's plug-in (``damped_gossip``) as :data:`PLUGIN` for one test."""
    namespace = {}
    exec(compile(readme_plugin(), "readme_plugin.py", "exec"), namespace)
    algorithms.register(PLUGIN, namespace["damped_gossip"], info=namespace["INFO"])
    yield
    algorithms.unregister(PLUGIN)


def _info(name):
    return algorithms.info(name)


def _call(capsys, argv) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _assert_refused(code, err, out_dir, argv):
    assert code == 2, f"{argv}: exit {code}\n{err[-3000:]}"
    lines = [line for line in err.splitlines() if line.startswith("jaxgossip")]
    assert len(lines) == 1 and ": error: " in lines[0], err[-3000:]
    assert "internal error" not in err
    assert out_dir is None or not out_dir.exists(), "a refused run wrote files"
    return lines[0]


def _rows(out_dir):
    rows = json.loads((out_dir / "metrics.json").read_text())["rows"]
    return [{k: v for k, v in row.items() if k != "wall_time"} for row in rows]


def _example_flags(name):
    """The options the algorithm's metadata says its defaults need (``TrainerHooks.example_options``)."""
    return [f"--algorithm_options.{key}={value}" for key, value in _info(name).hooks.example_options.items()]


def _train_argv(name, flags, graph, out_dir):
    return [
        "train",
        *BASE,
        f"--algorithm={name}",
        f"--topology={graph}",
        *_example_flags(name),
        *flags,
        "--no-progress",
        f"--out={out_dir}",
    ]


def train_cell(capsys, tmp_path, name, flags=(), feature=PLAIN, rerun=False) -> str | None:
    """Runs, interrupts, resumes and compares one train cell of ``feature``'s graph (with ``rerun``,
    also re-runs the finished run); returns the refusal line or None."""
    out_dir = tmp_path / "run"
    argv = _train_argv(name, flags, features.graphs_of(feature, _info(name))[0], out_dir)
    code, _, err = _call(capsys, argv)
    if code == 2:
        return _assert_refused(code, err, out_dir, argv)
    assert code == 0, f"{argv}: exit {code}\n{err[-3000:]}"
    ckpt = out_dir / "checkpoint"
    saved = checkpoint.latest(str(ckpt))
    assert saved is not None and saved.round == ROUNDS and saved.digest
    rows = _rows(out_dir)
    assert rows and rows[-1]["round"] <= ROUNDS
    # A process killed before its last checkpoint completed: only the first chunk's step is left.
    shutil.rmtree(ckpt / str(ROUNDS))
    code, out, err = _call(capsys, argv)
    assert code == 0, f"resume of {argv}: exit {code}\n{err[-3000:]}"
    assert f"resumed from {ckpt} at round {ROUNDS // 2}" in out + err
    again = checkpoint.latest(str(ckpt))
    assert again.round == ROUNDS and again.digest == saved.digest, "the resumed run ended on other arrays"
    assert _rows(out_dir) == rows, "the resumed run wrote other metrics"
    if rerun:  # a finished run re-run resumes to the same files without training
        code, out, err = _call(capsys, argv)
        assert code == 0 and _rows(out_dir) == rows, err[-3000:]
        assert checkpoint.latest(str(ckpt)).digest == saved.digest
    return None


def command_cell(capsys, tmp_path, command, name, flags=(), feature=PLAIN) -> str | None:
    """Runs one non-train command on ``name`` with ``flags`` on ``feature``'s graphs; returns the
    refusal line or None."""
    graphs = features.graphs_of(feature, _info(name))
    out_dir = tmp_path / command
    argv = [command, *BASE, f"--algorithm={name}", *_example_flags(name), *features.COMMANDS[command], *flags]
    if command == "topology-sweep":
        argv += [f"--topologies={','.join(graphs)}", "--num_nodes=4"]
    else:
        argv += [f"--topology={graphs[0]}"]
    if command == "sweep":
        argv += ["--sweep.lr=0.05,0.1", "--no-progress"]
    if command != "plan":
        argv += [f"--out={out_dir}"]
    else:
        argv += ["--max_nodes=8"]
    code, out, err = _call(capsys, argv)
    if code == 2:
        return _assert_refused(code, err, out_dir if command != "plan" else None, argv)
    assert code == 0, f"{argv}: exit {code}\n{err[-3000:]}"
    if command != "plan":
        assert any(out_dir.iterdir()), f"{command} wrote nothing"
    else:
        assert "N=4" in out or "4" in out
    return None


def _first_accepting(capsys, tmp_path, run, offset):
    """Runs ``run(name, folder)`` over the built-in algorithms from ``offset`` on (rotated) until one
    accepts the combination; fails if every algorithm refuses it."""
    refusals = []
    for k in range(len(BUILTINS)):
        name = BUILTINS[(offset + k) % len(BUILTINS)]
        refused = run(name, tmp_path / f"try{k}")
        if refused is None:
            return name
        refusals.append(f"{name}: {refused}")
    pytest.fail("no algorithm accepts it:\n" + "\n".join(refusals))


def test_every_config_field_is_a_feature_or_says_why_not():
    named = {flag[2:].split("=")[0].split(".")[0] for f in features.FEATURES for flag in f.flags}
    fields = set(TrainConfig.__dataclass_fields__)
    missing = sorted(fields - named - set(features.PLAIN_FIELDS))
    assert not missing, f"TrainConfig fields in no feature of jaxgossip.run.features and not in PLAIN_FIELDS: {missing}"
    assert not (set(features.PLAIN_FIELDS) - fields), "PLAIN_FIELDS names fields TrainConfig does not have"


@pytest.mark.parametrize("name", NAMES)
def test_every_algorithm_trains_checkpoints_and_resumes_bitwise(name, capsys, tmp_path, request):
    if name == PLUGIN:
        request.getfixturevalue("plugin")
    refused = train_cell(capsys, tmp_path, name)
    assert refused is None, f"{name} refused on the graph its metadata accepts: {refused}"


@pytest.mark.parametrize("feature", TRAIN_FEATURES, ids=lambda f: f.name)
def test_every_feature_trains_checkpoints_and_resumes_bitwise(feature, capsys, tmp_path):
    offset = 5 * TRAIN_FEATURES.index(feature)
    ran = []

    def run(name, folder):
        cells = features.variants(feature, _info(name))
        if not cells:
            return "no variant of this feature for it"
        for label, flags in cells:
            (folder / label).mkdir(parents=True)
            refused = train_cell(capsys, folder / label, name, flags, feature)
            if refused is not None:
                return refused
            ran.append(label)
        return None

    _first_accepting(capsys, tmp_path, run, offset)
    assert ran


BYZANTINE = next(f for f in features.FEATURES if f.name == "byzantine_nodes")


@pytest.mark.parametrize("command", OTHER_COMMANDS)
@pytest.mark.parametrize("with_byzantine", [False, True], ids=["plain", "byzantine_nodes"])
def test_every_command_runs_plain_and_with_byzantine_nodes(command, with_byzantine, capsys, tmp_path):
    flags = BYZANTINE.flags if with_byzantine else ()
    offset = 3 * OTHER_COMMANDS.index(command)
    _first_accepting(capsys, tmp_path, lambda name, folder: command_cell(capsys, folder, command, name, flags), offset)


# The full cross: every algorithm with every feature (each variant), and through every command.


@pytest.mark.slow
@pytest.mark.parametrize("feature", TRAIN_FEATURES, ids=lambda f: f.name)
@pytest.mark.parametrize("name", NAMES)
def test_full_cross_of_algorithms_and_features(name, feature, capsys, tmp_path, request):
    if name == PLUGIN:
        request.getfixturevalue("plugin")
    for label, flags in features.variants(feature, _info(name)):
        train_cell(capsys, tmp_path / label.replace(":", "_"), name, flags, feature, rerun=True)


@pytest.mark.slow
@pytest.mark.parametrize("feature", features.FEATURES, ids=lambda f: f.name)
@pytest.mark.parametrize("command", OTHER_COMMANDS)
@pytest.mark.parametrize("name", NAMES)
def test_full_cross_of_algorithms_features_and_commands(name, command, feature, capsys, tmp_path, request):
    if name == PLUGIN:
        request.getfixturevalue("plugin")
    for label, flags in features.variants(feature, _info(name)):
        command_cell(capsys, tmp_path / label.replace(":", "_"), command, name, flags, feature)
