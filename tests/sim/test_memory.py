"""The memory planner (jaxgossip.sim.memory, jaxgossip.run.plan, `jaxgossip plan`): XLA's numbers of the
training chunk against an independent compile, byte counts against hand counts, the largest-N
search against its confirmation rule, and the command line."""

import math

import jax
import numpy as np
import pytest
from tiny import TINY_FLAGS, tiny_config

from jaxgossip import data
from jaxgossip.cli import main
from jaxgossip.run import plan as run_plan
from jaxgossip.run import runner
from jaxgossip.run.resolve import load_data, resolve
from jaxgossip.sim import memory as plan


@pytest.fixture(scope="module")
def dataset():
    return load_data(tiny_config())


@pytest.fixture(scope="module")
def measured(dataset):
    return run_plan.measure(tiny_config(), dataset)


def test_parse_memory_units_and_errors():
    assert plan.parse_memory("16GB") == 16 * 10**9
    assert plan.parse_memory("16GiB") == 16 * 2**30
    assert plan.parse_memory(" 800 mb ") == 800 * 10**6
    assert plan.parse_memory("1.5e9") == 1_500_000_000
    assert plan.parse_memory("2TiB") == 2 * 2**40
    for bad in ("abc", "-1GB", "0GB", "16 parsecs", "GB", "inf"):
        with pytest.raises(ValueError, match=repr(bad).replace("+", r"\+")):
            plan.parse_memory(bad)
    assert plan.GPU_MEMORY[-1] == ("141 GiB", 141 * 2**30) and len(plan.GPU_MEMORY) == 5


def test_tree_bytes_splits_per_node_from_shared_leaves():
    n = 4
    tree = {
        "w": jax.ShapeDtypeStruct((n, 3, 5), np.float32),
        "count": jax.ShapeDtypeStruct((), np.int32),
        "edges": jax.ShapeDtypeStruct((7, 2), np.float16),
        "key": jax.eval_shape(lambda: jax.random.key(0)),
    }
    counted = plan.tree_bytes(tree, n)
    assert counted.total == n * 15 * 4 + 4 + 7 * 2 * 2 + 8
    assert counted.per_node == 15 * 4
    assert counted.shared == 4 + 28 + 8
    assert len(counted.shared_leaves) == 3 and any("edges" in s and "[7, 2]" in s for s in counted.shared_leaves)


def test_tree_bytes_finds_the_node_axis_by_comparing_two_node_counts():
    def state(n, period):
        return {
            "x_hat": jax.ShapeDtypeStruct((period, n, 6), np.float32),  # a copy per period of the graph
            "edges": jax.ShapeDtypeStruct((2 * n, 6), np.float32),  # per edge: not per node
            "count": jax.ShapeDtypeStruct((), np.int32),
        }

    counted = plan.tree_bytes(state(4, 2), 4, like=state(8, 3), like_nodes=8)
    assert counted.per_node == 2 * 6 * 4 and counted.shared == 8 * 6 * 4 + 4
    assert [s.split()[0] for s in counted.shared_leaves] == ["['count']", "['edges']"]
    # without the comparison only a leading node axis counts
    assert plan.tree_bytes(state(4, 2), 4).per_node == 0
    with pytest.raises(ValueError, match="like_nodes"):
        plan.tree_bytes(state(4, 2), 4, like=state(8, 3), like_nodes=4)


def test_sparse_push_copies_per_period_count_per_node(dataset):
    """Sparse-Push on the one-peer exponential graph keeps x_hat and s per distinct graph of its
    schedule, [P, N, ...]: per node 2 P model copies and the push-sum weight (no compile)."""
    config = tiny_config(algorithm="sparse_push", algorithm_options={"fraction": 0.1}, topology="one_peer_exponential")
    runs = [run_plan.abstract_run(config.replace(num_nodes=n), dataset) for n in (4, 8)]
    parts = {p.name: p for p in run_plan.breakdown(*runs)}
    graphs = 2  # ceil(log2 4) distinct graphs at N = 4
    assert parts["algorithm state"].per_node == 2 * graphs * 610 * 4 + 4
    assert parts["algorithm state"].shared_leaves == (".count [] int32",)
    assert parts["evaluation set"].per_node == 0 and len(parts["evaluation set"].shared_leaves) == 2


def test_reported_total_equals_an_independent_compile_of_the_same_chunk(measured, dataset):
    """The plan's numbers are XLA's of the trainer's chunk with the data as arguments: compile that
    program here on the real state and real shards (resolve, trainer.init) and compare."""
    config = tiny_config()
    prep = resolve(config, dataset, "cuda")
    config = prep.config
    eval_size = min(config.eval_size, dataset.y_test.shape[0])
    x_eval, y_eval = dataset.x_test[:eval_size], dataset.y_test[:eval_size]
    counts = np.asarray(prep.shards.counts)

    def chunk(state, x, y, xt, yt):
        part = prep._replace(dataset=dataset._replace(x_test=xt, y_test=yt), shards=data.NodeShards(x, y, counts))
        return runner.make_trainer(config, part)[0].run_chunk(state, 1)

    state = runner.make_trainer(config, prep)[0].init(jax.random.key(config.seed))
    compiled = jax.jit(chunk).lower(state, prep.shards.x, prep.shards.y, x_eval, y_eval).compile()
    analysis = compiled.memory_analysis()
    stats = measured.stats
    assert stats.arguments == analysis.argument_size_in_bytes
    assert stats.outputs == analysis.output_size_in_bytes
    assert stats.temp == analysis.temp_size_in_bytes
    assert stats.alias == analysis.alias_size_in_bytes == 0  # the trainer donates nothing
    assert stats.total == stats.arguments + stats.outputs + stats.temp - stats.alias
    # the parts are the arguments, byte for byte: the state the run initialises plus the data
    assert sum(p.total for p in measured.parts) == stats.arguments
    state_bytes = sum(plan.leaf_bytes(leaf) for leaf in jax.tree_util.tree_leaves(state))
    data_bytes = sum(a.nbytes for a in (prep.shards.x, prep.shards.y, x_eval, y_eval))
    assert stats.arguments == state_bytes + data_bytes
    assert measured.per_node == stats.total / 4 and measured.rounds == config.eval_every


def test_parameter_bytes_equal_the_hand_count_of_a_small_mlp(measured):
    # MLP(hidden=[8]) on 8x8x1 inputs and 10 classes: Dense(64 -> 8) and Dense(8 -> 10), float32
    per_node = (64 * 8 + 8 + 8 * 10 + 10) * 4
    parts = {p.name: p for p in measured.parts}
    assert parts["parameters"].per_node == per_node and parts["parameters"].total == 4 * per_node
    assert parts["parameters"].shared_leaves == ()
    # SGD with (Nesterov) momentum keeps one trace per parameter; optax's chain adds counters
    assert parts["optimizer state"].per_node >= per_node
    # gossip keeps only its round counter, which is not per-node
    assert parts["algorithm state"].per_node == 0 and parts["algorithm state"].shared_leaves == (".count [] int32",)
    assert parts["data shards"].per_node == measured.samples_per_node * (64 * 4 + 4)


def test_choco_keeps_public_copies_gossip_does_not(dataset):
    """Algorithm state from the state's shapes (no compile): Choco holds x_hat and s, two model
    copies per node, plus a round counter."""
    params = 610 * 4
    sizes = {}
    for name in ("gossip", "choco"):
        run = run_plan.abstract_run(tiny_config(algorithm=name), dataset)
        sizes[name] = {p.name: p for p in run_plan.breakdown(run)}
    assert sizes["gossip"]["algorithm state"].per_node == 0
    assert sizes["choco"]["algorithm state"].per_node == 2 * params
    assert sizes["choco"]["algorithm state"].total == 2 * params * 4 + 4
    assert sizes["choco"]["parameters"].total == sizes["gossip"]["parameters"].total


def test_abstract_run_allocates_nothing_at_16384_nodes():
    """The state of 16,384 nodes of a 1M-parameter MLP (~64 GB of params + momentum) is shapes only."""
    config = tiny_config(num_nodes=16384, model_options={"hidden": [1000, 1000]}, batch_size=1)
    big = data.make_synthetic(num_train=16384, num_test=64, shape=(8, 8, 1))
    run = run_plan.abstract_run(config.replace(eval_size=64), big)
    parts = {p.name: p for p in run_plan.breakdown(run)}
    assert parts["parameters"].total == 16384 * (64 * 1000 + 1000 + 1000 * 1000 + 1000 + 1000 * 10 + 10) * 4
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree_util.tree_leaves(run.state))


@pytest.mark.slow  # one compile at 16,384 nodes (~20 s)
def test_planning_16384_nodes_allocates_nothing():
    """The chunk of 16,384 nodes of an MLP(256, 256) with Choco needs ~50 GiB; planning it takes a
    few hundred MiB of host memory (the process's peak grows by far less than the plan)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    big = data.make_synthetic(num_train=32768, num_test=128, shape=(8, 8, 1))
    config = tiny_config(num_nodes=16384, batch_size=2, model_options={"hidden": [256, 256]}, algorithm="choco")
    measured = run_plan.measure(config.replace(topology="exponential"), big)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert measured.total > 40 * 2**30 and grown < 2 * 2**30, (measured.total, grown)
    params = {p.name: p for p in measured.parts}["parameters"]
    assert params.per_node == (64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10) * 4


def test_fit_affine_and_format_bytes():
    a, b = plan.fit_affine([(4, 1000), (8, 1800), (2, 0)])  # the two largest counts
    assert (a, b) == (200.0, 200.0) and plan.predict_nodes(2200, a, b) == 10.0
    assert math.isinf(plan.predict_nodes(1, 5.0, 0.0))
    with pytest.raises(ValueError, match="two node counts"):
        plan.fit_affine([(4, 1), (4, 2)])
    assert plan.format_bytes(3 * 2**30 / 2) == "1.50 GiB" and plan.format_bytes(512) == "512 B"


def _affine(a, b, bump=0):
    return lambda n: int(a + b * n + (bump if n % 3 == 0 else 0))


@pytest.mark.parametrize("valid_name", ["all", "powers_of_two", "even"])
@pytest.mark.parametrize("limit", [10_000, 123_456, 1_000_000])
def test_largest_fitting_is_confirmed_on_valid_counts(valid_name, limit):
    valid = {"all": lambda n: True, "powers_of_two": lambda n: n & (n - 1) == 0, "even": lambda n: n % 2 == 0}
    valid = valid[valid_name]
    calls = []
    measure = _affine(3000, 97.5, bump=500)

    def counted(n):
        calls.append(n)
        return measure(n)

    fit = plan.largest_fitting(counted, limit, valid, start=(2, 4), max_nodes=100_000)
    assert valid(fit.num_nodes) and measure(fit.num_nodes) <= limit == fit.limit
    assert fit.next_nodes == min(m for m in range(fit.num_nodes + 1, 100_001) if valid(m))
    assert measure(fit.next_nodes) > limit and fit.limited_by == "memory"
    assert len(calls) <= 2 + 8, calls


def test_largest_fitting_edges():
    # memory that grows with N but the sizes run out first
    fit = plan.largest_fitting(_affine(0, 1), 10**9, lambda n: True, start=(2, 4), max_nodes=50)
    assert (fit.num_nodes, fit.next_nodes, fit.limited_by) == (50, None, "no larger valid N")
    # nothing fits
    fit = plan.largest_fitting(_affine(10**6, 10), 1000, lambda n: True, start=(2, 4), max_nodes=50)
    assert fit.num_nodes is None and fit.limited_by == "none fits"
    # memory that does not grow: the cap
    fit = plan.largest_fitting(lambda n: 5, 10, lambda n: n % 7 == 0, start=(7, 14), max_nodes=100)
    assert fit.num_nodes == 98 and math.isinf(fit.predicted)
    # out of compiles: the best count known to fit, marked unconfirmed
    fit = plan.largest_fitting(_affine(0, 1), 10_000, lambda n: True, start=(2, 4), max_nodes=10**6, max_compiles=0)
    assert fit.limited_by == "unconfirmed" and fit.num_nodes == 4


@pytest.mark.slow  # ~6 compiles of the tiny chunk (~50 s on 2 busy cores)
def test_largest_n_of_the_plan_is_confirmed_by_compiles(dataset):
    config = tiny_config(topology="hypercube", num_nodes=4)
    # a limit just above the compile at 16 nodes, so memory (not the data set) binds before 32
    limit = run_plan.measure(config.replace(num_nodes=16), dataset).total + 1000
    result = run_plan.plan_memory(config, (("limit", limit),), dataset=dataset)
    (fit,) = result.fits
    assert fit.limited_by == "memory" and fit.num_nodes == 16 and fit.next_nodes == 32
    assert run_plan.measure(config.replace(num_nodes=16), dataset).total == fit.bytes <= limit
    assert run_plan.measure(config.replace(num_nodes=32), dataset).total == fit.next_bytes > limit
    assert "power of two" in result.rule


def test_cli_plan_prints_the_breakdown_and_the_gpu_table(capsys):
    # a fixed 2x2 torus exists at N = 4 only, so the table needs one compile
    code = main(["plan", *TINY_FLAGS, "--topology=torus:2x2", "--algorithm=choco", "--memory=1GB"])
    out, err = capsys.readouterr()
    assert code == 0, err
    for text in ("parameters", "algorithm state", "temporaries (XLA", "total (XLA", "--memory=1GB", "16 GiB",
                 "141 GiB", "1 GiB = 2^30 bytes", "CPU compile", "largest N"):  # fmt: skip
        assert text in out, text
    assert out.count("no larger valid N") == 6


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--model=mlpx"], "'mlpx'"),
        (["--memory=abc"], "'abc'"),
        (["--memory=-1GB"], "'-1GB'"),
        (["--memory=16parsecs"], "'16parsecs'"),
        (["--platform=gpu"], "'gpu'"),
        (["--max_nodes=2"], "--max_nodes=2"),
    ],
)
def test_cli_plan_bad_input_exits_2_naming_the_value(capsys, flags, named):
    code = main(["plan", *TINY_FLAGS, *flags])
    err = capsys.readouterr().err
    assert code == 2 and named in err and "Traceback" not in err, err
    assert err.count("\n") == 1, err
