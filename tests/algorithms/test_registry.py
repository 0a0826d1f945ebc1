"""The algorithm registry (jaxgossip.algorithms.registry): names to metadata, the read-only
factory view, registering and unregistering, metadata checks, and plug-ins by import path whose
errors name the user's file and line (in ``make`` and on the command line, exit 2). How a plug-in
runs everywhere a built-in does: test_plugins.py."""

import importlib
import os
import sys

import pytest
from _reference import assert_refused, run_cli
from tiny import TINY_FLAGS

from jaxgossip import algorithms, topology

PLUGINS = {
    "plug_syntax": "def broken(topology):\n    return (\n",
    "plug_import": "SETTINGS = {}\nBETA = SETTINGS['beta']\n",
    "plug_factory": "def broken(topology, beta=0.5):\n    scale = 0\n    return beta / scale\n",
}


@pytest.fixture()
def plugin_dir(tmp_path):
    for module, source in PLUGINS.items():
        (tmp_path / f"{module}.py").write_text(source)
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for module in PLUGINS:
        sys.modules.pop(module, None)


def test_plugin_errors_name_the_users_file_and_line(plugin_dir):
    ring = topology.ring(4)
    with pytest.raises(ValueError, match="syntax error at") as err:
        algorithms.make("plug_syntax:broken", ring)
    assert f"{plugin_dir / 'plug_syntax.py'}:2" in str(err.value)
    with pytest.raises(ValueError, match="raised KeyError: 'beta'") as err:
        algorithms.make("plug_import:broken", ring)
    assert f"{plugin_dir / 'plug_import.py'}:2" in str(err.value)
    with pytest.raises(ValueError, match="its factory raised ZeroDivisionError") as err:
        algorithms.make("plug_factory:broken", ring)
    assert f"{plugin_dir / 'plug_factory.py'}:3" in str(err.value)


@pytest.mark.parametrize(
    "module, line, words",
    [("plug_syntax", 2, "syntax error"), ("plug_import", 2, "KeyError"), ("plug_factory", 3, "ZeroDivisionError")],
)
def test_broken_plugin_on_the_command_line_exits_2_with_its_file_and_line(plugin_dir, module, line, words):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")])}
    out = plugin_dir / "run"
    rc, _, err = run_cli("train", *TINY_FLAGS, f"--algorithm={module}:broken", "--out", str(out), env=env)
    message = assert_refused(rc, err, f"{plugin_dir / module}.py:{line}", words, "fix")
    assert "jaxgossip/" not in message.replace(str(plugin_dir), "")  # no frame of jaxgossip's own
    assert not out.exists()


def test_resolve_and_info_give_a_builtins_metadata_and_refuse_unknown_names():
    entry = algorithms.resolve("gossip")
    assert entry is algorithms.INFOS["gossip"] is algorithms.info("gossip")
    assert entry.factory is algorithms.gossip is algorithms.REGISTRY["gossip"]
    with pytest.raises(ValueError, match=r"unknown algorithm 'gosip'; known algorithms: \[.*'gossip'.*import path"):
        algorithms.resolve("gosip")
    with pytest.raises(ValueError, match="algorithm='' must be a registered name"):
        algorithms.resolve("")


def test_register_refuses_taken_names_and_non_factories_and_replaces_when_asked():
    with pytest.raises(ValueError, match="'gossip' is a built-in algorithm; pass replace=True"):
        algorithms.register("gossip", algorithms.gossip)
    with pytest.raises(ValueError, match="must be a non-empty string"):
        algorithms.register("", algorithms.gossip)
    with pytest.raises(TypeError, match="its first argument must be the topology"):
        algorithms.register("no_topology_test", lambda: None)
    assert "no_topology_test" not in algorithms.INFOS
    try:
        first = algorithms.register(
            "twice_test", algorithms.gossip, graph=algorithms.GraphNeeds(mixing="doubly_stochastic")
        )
        assert first.graph.time_varying
        with pytest.raises(ValueError, match="'twice_test' is already registered; pass replace=True"):
            algorithms.register("twice_test", algorithms.gossip)
        assert algorithms.INFOS["twice_test"] is first
        second = algorithms.register(
            "twice_test", algorithms.gossip, replace=True, graph=algorithms.GraphNeeds(time_varying=False)
        )
        assert algorithms.INFOS["twice_test"] is second and not second.graph.time_varying
    finally:
        removed = algorithms.unregister("twice_test")
    assert removed is second and "twice_test" not in algorithms.REGISTRY


def test_make_names_a_hyperparameter_the_algorithm_does_not_take():
    ring = topology.ring(4)
    assert algorithms.make("gossip", ring, gamma=0.5).name == "gossip"
    with pytest.raises(TypeError, match=r"algorithm 'gossip' does not take \['gama'\]; it takes \['gamma'\]"):
        algorithms.make("gossip", ring, gama=0.5)


def test_check_execution_names_the_mode_the_reason_and_who_has_it():
    algorithms.check_execution("gossip", algorithms.info("gossip"), "sync")
    algorithms.check_execution("gossip", algorithms.info("gossip"), "async")
    with pytest.raises(ValueError) as err:
        algorithms.check_execution("choco", algorithms.info("choco"), "async")
    message = str(err.value)
    assert message.startswith("choco cannot run with execution='async': it is registered with execution=('sync',)")
    have = message.split("Algorithms with execution='async': ", 1)[1].split(", ")
    assert {"gossip", "push_sum"} <= set(have) and "choco" not in have
    with pytest.raises(ValueError, match="execution='threads' is unknown; known modes: sync, async"):
        algorithms.check_execution("gossip", algorithms.info("gossip"), "threads")
