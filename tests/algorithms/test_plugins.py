"""A method defined outside jaxgossip runs everywhere a built-in does, with no edit to jaxgossip.

The plug-in is the README's example ("### Adding an algorithm", its ```python block), written to a
temporary folder as ``my_file.py`` and named by import path ``my_file:damped_gossip`` (or registered
under a name). It runs through the public API (``make``, ``run_consensus``, ``run_optimization``,
``run_training``, the topology sweep, the cost functions) and through the CLI in subprocesses
(``train``, ``sweep``, ``topology-sweep``, ``consensus``, ``demo --algorithms``, each with cost columns).

Reference: the damped step is ``X <- (1 - beta) X + beta W X`` on the [N, D] matrix of node values.
"""

import ast
import json
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _reference import fast_compile_env, start_cli
from tiny import TINY_FLAGS, tiny_config

import jaxgossip as jg
from jaxgossip import algorithms
from jaxgossip.cli import main
from jaxgossip.engine import sweeps
from jaxgossip.run import cost_report
from jaxgossip.sim.network import Network

ROOT = pathlib.Path(__file__).resolve().parents[2]
PATH = "my_file:damped_gossip"
TINY = TINY_FLAGS  # tests/tiny.py's config as flags
COST = ["--time.bandwidth=1e9", "--time.latency=1e-3"]


def _damped_reference(w: np.ndarray, x0: np.ndarray, beta: float, steps: int) -> np.ndarray:
    x = x0.astype(np.float64)
    for _ in range(steps):
        x = (1 - beta) * x + beta * (w @ x)
    return x


def test_import_path_metadata_consensus_and_bits(plugin_dir):
    info = algorithms.info(PATH)
    assert (info.graph.mixing, info.graph.stackable, info.graph.time_varying) == ("doubly_stochastic", True, True)
    assert cost_report.exchanges_per_round(PATH, {}) == 1 and not cost_report.priced_as_allreduce(PATH)

    topo, steps, beta = jg.topology.ring(8), 30, 0.7
    x0 = {"w": jax.random.normal(jax.random.key(0), (8, 5))}
    result = jg.run_consensus(algorithms.make(PATH, topo, beta=beta), x0, steps, jax.random.key(1))
    want = _damped_reference(topo.matrix(), np.asarray(x0["w"]), beta, steps)
    np.testing.assert_allclose(np.asarray(result.x["w"]), want, rtol=1e-5, atol=1e-6)
    assert float(result.error[-1]) < 1e-3 * float(result.error[0])
    # every node sends its 5 fp32 values to each of its 2 ring neighbours, every round
    assert float(result.bits[-1]) == 8 * 2 * 5 * 32 * steps


def test_register_by_name(plugin_dir):
    from my_file import damped_gossip

    try:
        algorithms.register("damped_test", damped_gossip, graph=jg.GraphNeeds(mixing="doubly_stochastic"))
        assert "damped_test" in algorithms.REGISTRY
        topo, x0 = jg.topology.ring(8), {"w": jnp.arange(16.0).reshape(8, 2)}
        by_name = jg.run_consensus(algorithms.make("damped_test", topo), x0, 5, jax.random.key(0))
        by_path = jg.run_consensus(algorithms.make(PATH, topo), x0, 5, jax.random.key(0))
        np.testing.assert_array_equal(np.asarray(by_name.x["w"]), np.asarray(by_path.x["w"]))
        with pytest.raises(ValueError, match="already registered; pass replace=True"):
            algorithms.register("damped_test", damped_gossip)
        algorithms.register("damped_test", damped_gossip, replace=True, graph=jg.GraphNeeds(stackable=True))
        assert algorithms.info("damped_test").graph.stackable
    finally:
        if "damped_test" in algorithms.INFOS:
            algorithms.unregister("damped_test")
    with pytest.raises(ValueError, match="'gossip' is a built-in algorithm; pass replace=True"):
        algorithms.register("gossip", damped_gossip)


def test_run_optimization(plugin_dir):
    targets = jnp.arange(8.0)[:, None] * jnp.ones((8, 3))  # f_i(x) = 1/2 ||x - c_i||^2

    def loss_fn(x, i, key):
        del key
        return 0.5 * jnp.sum((x["w"] - targets[i]) ** 2)

    alg = algorithms.make(PATH, jg.topology.ring(8), beta=0.9)
    x0 = {"w": jnp.zeros((8, 3))}
    result = jg.run_optimization(alg, x0, loss_fn, optax.sgd(0.1), 300, jax.random.key(0))
    # a constant step size leaves an O(lr) consensus bias; the mean reaches mean(c) = 3.5
    np.testing.assert_allclose(np.asarray(result.x["w"]).mean(axis=0), 3.5, rtol=1e-3)
    assert float(result.objective[-1]) < float(result.objective[0])


def test_training_topology_sweep_and_cost_api(plugin_dir):
    from jaxgossip.run.runner import run_training

    run = run_training(tiny_config(algorithm=PATH), progress=False, log=lambda s: None)
    bits = np.asarray(run.metrics.bits)  # [M, N] cumulative bits per node
    assert np.all(bits[-1] > 0)

    graphs = [jg.topology.ring(8), jg.topology.ring(8), jg.topology.torus(2, 4)]
    result = sweeps.sweep_topologies(PATH, graphs, dim=3, num_steps=10, seeds=[0, 1], options={"beta": 0.5})
    assert len(result.groups) < len(graphs)  # stackable: same-shape graphs shared one compile
    single = algorithms.make(PATH, graphs[0], beta=0.5)
    key_x, key_a = jax.random.split(jax.random.key(1))
    x0 = jax.random.normal(key_x, (8, 3))
    direct = jg.run_consensus(single, x0, 10, key_a)
    np.testing.assert_allclose(np.asarray(result.error[0][1]), np.asarray(direct.error), rtol=1e-5, atol=1e-7)

    model = cost_report.CostModel(Network(bandwidth=1e9, latency=1e-3))
    node_bits = np.full((1, 10, 8), 2 * 3 * 32.0)
    error = np.linspace(1.0, 0.01, 11)[None]
    row = cost_report.consensus_graph_cost(model, PATH, {}, graphs[0], node_bits, error, 0.1)
    assert row["comm_s"] == pytest.approx(10 * 2 * (1e-3 + 3 * 32 / 1e9), rel=1e-9)


def test_every_command_runs_the_plugin_by_import_path(plugin_dir, tmp_path):
    env = fast_compile_env(dict(os.environ, PYTHONPATH=os.pathsep.join([str(plugin_dir), str(ROOT)] + sys.path)))
    commands = {
        "train": [*TINY, f"--algorithm={PATH}", "--algorithm_options.beta=0.8", "--no-progress", *COST],
        "sweep": [*TINY, f"--algorithm={PATH}", "--sweep.lr=0.05,0.1", "--no-progress", *COST],
        "topology-sweep": [
            f"--algorithm={PATH}",
            "--topologies=ring,torus",
            "--sizes=8",
            "--num_steps=5",
            "--dim=2",
            "--seeds=1",
            *COST,
        ],
        "consensus": [f"--algorithm={PATH}", "--shape=[4]", "--num_steps=5", "--no-progress", *COST],
        "demo": [*TINY, f"--algorithms={PATH}", "--no-progress", *COST],
    }
    procs = {command: start_cli(command, argv, tmp_path / command, env) for command, argv in commands.items()}
    for command, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (command, out[-2000:], err[-2000:])
        assert "comm s" in out, (command, out[-2000:])  # the cost columns
    rows = json.loads((tmp_path / "consensus" / "consensus.json").read_text())["rows"]
    assert rows[0]["comm_s"] > 0 and rows[0]["final_error"] < 1.0
    # the demo runs the plug-in on the graph its metadata asks for (built-ins next to it: test_demo_algorithms_list)
    rows = json.loads((tmp_path / "demo" / "comparison.json").read_text())["rows"]
    assert [(r["name"], r["status"]) for r in rows] == [(f"{PATH} (ring(4))", "ok")]
    assert rows[0]["MB_per_node"] > 0 and rows[0]["comm_s"] > 0 and rows[0]["test_acc"] > 0.1
    assert (tmp_path / "demo" / "my_file_damped_gossip" / "metrics.json").exists()


def test_demo_algorithms_list(plugin_dir, capsys, tmp_path):
    """``jaxgossip demo --algorithms``: presets keep their settings, other methods get the graph their
    metadata asks for, and a bad entry exits 2 naming it before any work."""
    from jaxgossip.cli import demo_runs

    assert demo_runs(algorithms=None) == demo_runs()
    runs = demo_runs(algorithms=["power_gossip", PATH, "allreduce", "jaxgossip.algorithms.push_sum:push_sum"])
    assert runs[0] == next(r for r in demo_runs() if r["algorithm"] == "power_gossip")
    assert [(r["name"], r["topology"]) for r in runs[1:]] == [
        (PATH, "ring"),
        ("allreduce", "ring"),
        ("jaxgossip.algorithms.push_sum:push_sum", "one_peer_exponential"),  # column stochastic
    ]
    out = tmp_path / "never"
    for argv, message in [
        (
            ["--algorithms=gossip,my_file:nope"],
            "--algorithms: entry 'my_file:nope': algorithm='my_file:nope': module 'my_file' has no attribute 'nope'",
        ),
        (["--algorithms=gossip,nope"], "--algorithms: entry 'nope': unknown algorithm 'nope'; known algorithms:"),
        (["--algorithms=gossip,gossip"], "--algorithms: 'gossip' is listed twice"),
        (["--algorithms="], "--algorithms is empty"),
        (
            ["--algorithms=gossip", "--topology=ring"],
            "--topology is set per run by the demo; choose the methods with --algorithms",
        ),
        # each run is built on its graph before any work: the demo runs factories with their defaults
        (
            ["--algorithms=gossip,needs_rate_test"],
            "--algorithms: entry 'needs_rate_test': algorithm='needs_rate_test' "
            "on ring(16) with algorithm_options={}: ",
        ),
    ]:
        algorithms.register("needs_rate_test", lambda topology, rate: None)
        try:
            code = main(["demo", *argv, "--out", str(out)])
        finally:
            algorithms.unregister("needs_rate_test")
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err, (argv, err)
    assert not out.exists()


def test_bad_import_paths_and_metadata(plugin_dir, capsys, tmp_path):
    ring = jg.topology.ring(8)
    with pytest.raises(ValueError, match="cannot import module 'no_such_module_xyz'"):
        algorithms.make("no_such_module_xyz:make", ring)
    with pytest.raises(ValueError, match="module 'my_file' has no attribute 'nope'"):
        algorithms.make("my_file:nope", ring)
    with pytest.raises(TypeError, match="is not an algorithm factory"):
        algorithms.make("my_file:DampedState", ring)  # a class, not a factory
    with pytest.raises(TypeError, match="is not an algorithm factory"):
        algorithms.make("jaxgossip.types:MIXINGS", ring)
    with pytest.raises(TypeError, match="returned a int, not a GossipAlgorithm"):
        algorithms.register("bad_return", lambda topology: 3)
        try:
            algorithms.make("bad_return", ring)
        finally:
            algorithms.unregister("bad_return")
    # metadata that contradicts the graph: a doubly stochastic method on a column-stochastic graph
    directed = jg.topology.make("random_directed:0.5", 8, seed=0)
    with pytest.raises(ValueError, match="my_file:damped_gossip needs doubly stochastic mixing weights"):
        algorithms.make(PATH, directed)
    from my_file import damped_gossip

    with pytest.raises(ValueError, match="mixing='rowwise' is unknown; known: doubly_stochastic"):
        algorithms.register("x", damped_gossip, graph=jg.GraphNeeds(mixing="rowwise"))
    with pytest.raises(TypeError, match=r"unknown metadata \['colour'\]"):
        algorithms.register("x", damped_gossip, colour="red")
    # a flat field is refused naming its group
    with pytest.raises(TypeError, match=r"unknown metadata \['mixing'\].*mixing belongs to graph=GraphNeeds"):
        algorithms.register("x", damped_gossip, mixing="doubly_stochastic")
    with pytest.raises(TypeError, match=r"graph=.* must be a GraphNeeds"):
        algorithms.register("x", damped_gossip, graph={"mixing": "doubly_stochastic"})
    with pytest.raises(TypeError, match="is not an algorithm factory"):
        algorithms.register("x", 3)
    with pytest.raises(ValueError, match="without ':'"):
        algorithms.register("a:b", damped_gossip)
    assert "x" not in algorithms.REGISTRY
    static_only = jg.AlgorithmInfo(damped_gossip, graph=jg.GraphNeeds(time_varying=False))
    with pytest.raises(ValueError, match="needs a static topology .* time_varying=False"):
        algorithms.check_graph("static_damped", static_only, jg.topology.one_peer_exponential(8))
    # the command line answers a bad import path with exit 2 and the reason, no traceback
    code = main(["consensus", "--algorithm=no_such_module_xyz:make", "--num_steps=2", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "cannot import module 'no_such_module_xyz'" in err and "Traceback" not in err


def test_infos_is_the_one_table_and_registry_a_read_only_view_of_it(plugin_dir):
    from my_file import damped_gossip

    assert list(algorithms.REGISTRY) == list(algorithms.INFOS)
    assert all(algorithms.REGISTRY[n] is entry.factory for n, entry in algorithms.INFOS.items())
    with pytest.raises(TypeError):
        algorithms.REGISTRY["view_test"] = damped_gossip  # read-only: register() adds
    try:
        entry = algorithms.register("view_test", damped_gossip, graph=jg.GraphNeeds(mixing="doubly_stochastic"))
        # one registration shows under both names at once
        assert algorithms.INFOS["view_test"] is entry and algorithms.REGISTRY["view_test"] is damped_gossip
        assert "view_test" in algorithms.REGISTRY and "view_test" in sorted(algorithms.REGISTRY)
        assert len(algorithms.REGISTRY) == len(algorithms.INFOS)
    finally:
        algorithms.unregister("view_test")
    assert "view_test" not in algorithms.REGISTRY and "view_test" not in algorithms.INFOS
    with pytest.raises(ValueError, match="'view_test' is not registered"):
        algorithms.unregister("view_test")


def test_graph_requirement_reasons_are_metadata(plugin_dir):
    from my_file import damped_gossip

    try:
        algorithms.register(
            "reasoned_test",
            damped_gossip,
            graph=jg.GraphNeeds(
                mixing="doubly_stochastic", time_varying=False, reasons={"time_varying": "its memory assumes one W"}
            ),
        )
        with pytest.raises(ValueError, match=r"reasoned_test needs a static topology .* \(its memory assumes one W\)"):
            algorithms.make("reasoned_test", jg.topology.one_peer_exponential(8))
    finally:
        algorithms.unregister("reasoned_test")
    with pytest.raises(ValueError, match=r"reasons=.*unknown: \['colour'\]"):
        jg.GraphNeeds(reasons={"colour": "red"})
    with pytest.raises(ValueError, match="non-empty strings"):
        jg.GraphNeeds(reasons={"mixing": ""})


def test_the_ordering_rule_is_read_from_the_algorithm_not_its_name(plugin_dir):
    from my_file import damped_gossip

    from jaxgossip.engine.local_step import check_ordering

    ring = jg.topology.ring(8)
    x0 = {"w": jnp.zeros((8, 3))}

    def run(alg, ordering):
        def loss_fn(x, i, key):
            del i, key
            return 0.5 * jnp.sum(x["w"] ** 2)

        return jg.run_optimization(alg, x0, loss_fn, optax.sgd(0.1), 2, jax.random.key(0), ordering=ordering)

    plain = algorithms.make(PATH, ring)
    assert plain.orderings == jg.types.ORDERINGS
    # an unregistered plug-in that carries its orderings: refused under the others, by no name lookup
    atc_only = plain._replace(name="my_unregistered_method", orderings=("atc",))
    run(atc_only, "atc")
    with pytest.raises(ValueError, match=r"my_unregistered_method is registered with orderings=\('atc',\).*use ordering='atc'"):
        run(atc_only, "same_iterate")
    # a registered name changes nothing: the algorithm's own orderings decide
    check_ordering(plain._replace(name="d2"), "same_iterate")
    with pytest.raises(ValueError, match="orderings"):
        check_ordering(plain._replace(name="gossip", orderings=("atc",)), "same_iterate")
    # make signs a plug-in with its registered name and its metadata's orderings; the algorithm keeps
    # them after unregistering
    try:
        algorithms.register(
            "atc_test",
            damped_gossip,
            graph=jg.GraphNeeds(mixing="doubly_stochastic"),
            execution=jg.Execution(orderings=("atc",)),
        )
        alg = algorithms.make("atc_test", ring)
    finally:
        algorithms.unregister("atc_test")
    assert alg.orderings == ("atc",) and alg.name == "atc_test"
    with pytest.raises(ValueError, match=r"orderings=\('atc',\)"):
        run(alg, "same_iterate")
    # a built-in's factory sets them from its INFO, called directly or through make
    assert algorithms.d2(ring, gamma=0.5).orderings == algorithms.make("d2", ring, gamma=0.5).orderings == ("atc",)


# String constants equal to an algorithm name that are data, not logic: which runs a command shows
# by default, and the default of a config field.
DATA_NAMES = {
    "jaxgossip/cli/consensus.py": "default runs of the consensus comparison",
    "jaxgossip/cli/demo.py": "the demo's list of runs",
    "jaxgossip/run/config.py": "TrainConfig.algorithm's default",
    "jaxgossip/compress/compressors.py": "resolve_compressor's default label for error messages (algorithm=)",
}


def test_no_algorithm_names_outside_their_files():
    """Facts about an algorithm live in its file and its metadata: no other module in jaxgossip/
    compares with, looks up or tests for substrings of an algorithm's name."""
    names = set(algorithms.REGISTRY)
    found = []
    for path in sorted((ROOT / "jaxgossip").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("jaxgossip/algorithms/") and path.stem in names | {"__init__", "registry"}:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value in names and rel not in DATA_NAMES:
                    found.append(f"{rel}:{node.lineno}: {node.value!r}")
                # "push" in name: a substring test of algorithm names
                if len(node.value) >= 4 and node.value not in names and any(node.value in n for n in names):
                    parent_tests = [
                        p
                        for p in ast.walk(tree)
                        if isinstance(p, ast.Compare) and p.left is node and isinstance(p.ops[0], (ast.In, ast.NotIn))
                    ]
                    if parent_tests:
                        found.append(f"{rel}:{node.lineno}: {node.value!r} in ...")
    assert not found, "algorithm names used outside their files:\n" + "\n".join(found)
