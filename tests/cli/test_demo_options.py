"""``jaxgossip demo --algorithm_options.METHOD.KEY=VALUE``: options per compared method, merged over
a preset's own, refused before any work for a method that is not compared or an option the method
does not take; and the demo's folder read back by ``jaxgossip compare``.

Most checks run through ``main`` with ``--print-config`` (every run's config is checked, nothing is
compiled); one tiny demo trains two runs end to end."""

import json

import pytest
import yaml
from _reference import run_main
from tiny import TINY_FLAGS

from jaxgossip.cli import demo_runs

PLUGIN = "my_file:damped_gossip"
DOTTED = "jaxgossip.algorithms.push_sum:push_sum"


def _preset(algorithm):
    return next(r for r in demo_runs() if r["algorithm"] == algorithm)


def test_options_merge_over_presets_and_name_the_run():
    runs = demo_runs(
        algorithms=["gossip", "power_gossip", "choco"],
        options={"power_gossip": {"rank": 2}, "choco": {"compressor_options": {"fraction": 0.2}}},
    )
    assert runs[0] == _preset("gossip")  # no options given: the preset as it is
    assert runs[1]["name"] == "power_gossip rank=2" and runs[1]["topology"] == "ring"
    assert runs[1]["algorithm_options"] == {"rank": 2, "num_iterations": 1}
    assert runs[2]["name"] == "choco compressor_options.fraction=0.2"
    merged = {"compressor": "top_k", "compressor_options": {"fraction": 0.2}, "gamma": 0.3}
    assert runs[2]["algorithm_options"] == merged
    # another compressor does not inherit the preset compressor's options
    (sign,) = demo_runs(algorithms=["choco"], options={"choco": {"compressor": "sign"}})
    assert sign["algorithm_options"] == {"compressor": "sign", "gamma": 0.3}
    # the default comparison takes options too, keyed by algorithm name
    runs = demo_runs(options={"scsp": {"gamma": 0.1}})
    scsp = next(r for r in runs if r["algorithm"] == "scsp")
    assert scsp["algorithm_options"] == {"fraction": 0.1, "gamma": 0.1} and scsp["final_merge"] == 4
    assert [r for r in runs if r["algorithm"] != "scsp"] == [r for r in demo_runs() if r["algorithm"] != "scsp"]


def test_import_path_split_at_its_dots_by_the_command_line_is_joined_again():
    split = {"jaxgossip": {"algorithms": {"push_sum:push_sum": {"weight_bits": "auto"}}}}
    (run,) = demo_runs(algorithms=[DOTTED], options=split)
    assert run["algorithm"] == DOTTED and run["algorithm_options"] == {"weight_bits": "auto"}
    (same,) = demo_runs(algorithms=[DOTTED], options={DOTTED: {"weight_bits": "auto"}})  # a config file's key
    assert same == run


def test_options_on_the_command_line_and_in_a_config_file(capsys, tmp_path):
    argv = [
        "demo",
        "--algorithms=gossip,power_gossip,choco",
        "--algorithm_options.power_gossip.rank=2",
        "--algorithm_options.choco.compressor_options.fraction=0.2",
        "--print-config",
    ]
    code, out, err = run_main(capsys, *argv)
    assert code == 0, err
    resolved = yaml.safe_load(out)
    given = {"power_gossip": {"rank": 2}, "choco": {"compressor_options": {"fraction": 0.2}}}
    assert resolved["algorithm_options"] == given
    # --print-config writes a valid config file that gives the same comparison
    path = tmp_path / "demo.yaml"
    path.write_text(out)
    code, again, err = run_main(capsys, "demo", "--config", str(path), "--print-config")
    assert code == 0 and yaml.safe_load(again) == resolved, err
    # a command-line option merges into the file's mapping for the same method
    code, out, err = run_main(
        capsys, "demo", "--config", str(path), "--algorithm_options.power_gossip.num_iterations=2", "--print-config"
    )
    assert code == 0, err
    assert yaml.safe_load(out)["algorithm_options"]["power_gossip"] == {"rank": 2, "num_iterations": 2}


def test_plugin_options(plugin_dir, capsys):
    code, out, err = run_main(
        capsys, "demo", f"--algorithms=gossip,{PLUGIN}", f"--algorithm_options.{PLUGIN}.beta=0.25", "--print-config"
    )
    assert code == 0, err
    assert yaml.safe_load(out)["algorithm_options"] == {PLUGIN: {"beta": 0.25}}
    # the factory's own check runs on the demo's graph before any work
    code, _, err = run_main(
        capsys, "demo", f"--algorithms=gossip,{PLUGIN}", f"--algorithm_options.{PLUGIN}.beta=2", "--print-config"
    )
    assert code == 2 and f"--algorithm_options.{PLUGIN}: " in err and "beta=2 must be in (0, 1]" in err, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--algorithms=gossip,choco", "--algorithm_options.power_gossip.rank=2"],
            "--algorithm_options.power_gossip: 'power_gossip' is not a compared method; add it to --algorithms to "
            "compare it (the compared methods are gossip, choco)",
        ),
        (
            ["--algorithm_options.power_gosip.rank=2"],
            "'power_gosip' is not a compared method (did you mean 'power_gossip'?)",
        ),
        (["--algorithm_options.rank=2"], "--algorithm_options.rank: 'rank' is not a compared method"),
        (
            ["--algorithm_options.power_gossip.rnk=2"],
            "--algorithm_options.power_gossip.rnk: power_gossip has no option 'rnk' (did you mean 'rank'?)",
        ),
        (
            ["--algorithm_options.choco.compressor_options.fraktion=0.2"],
            "--algorithm_options.choco.compressor_options.fraktion: compressor 'top_k' has no option 'fraktion'",
        ),
        (["--algorithm_options.power_gossip.rank=0"], "--algorithm_options.power_gossip: algorithm='power_gossip'"),
        (["--algorithm_options.gossip=3"], "--algorithm_options.gossip=3 must be a mapping of option -> value"),
        (["--algorithm=choco"], "--algorithm is set per run by the demo"),
    ],
)
def test_bad_options_are_refused_before_any_work(argv, message, capsys, tmp_path):
    out = tmp_path / "never"
    code, _, err = run_main(capsys, "demo", *argv, "--out", str(out))
    assert code == 2 and message in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_tiny_demo_with_options_runs_and_compares(capsys, tmp_path):
    out = tmp_path / "demo"
    argv = [
        "demo",
        *TINY_FLAGS,
        "--algorithms=gossip,power_gossip",
        "--algorithm_options.power_gossip.rank=2",
        "--no-progress",
        "--out",
        str(out),
    ]
    code, stdout, err = run_main(capsys, *argv)
    assert code == 0, err
    config = json.loads((out / "power_gossip_rank_2" / "config.json").read_text())
    assert config["algorithm"] == "power_gossip" and config["algorithm_options"] == {"rank": 2, "num_iterations": 1}
    assert config["num_nodes"] == 4 and config["name"] == "power_gossip rank=2"
    rows = json.loads((out / "comparison.json").read_text())["rows"]
    assert [(r["name"], r["dir"]) for r in rows] == [
        ("gossip (ring(4))", "gossip"),
        ("power_gossip rank=2 (ring(4))", "power_gossip_rank_2"),
    ]
    # the demo's folder stands for its runs, in the demo's order
    code, stdout, err = run_main(capsys, "compare", str(out), "--out", str(tmp_path / "compare"))
    assert code == 0, err
    names = [r["name"] for r in json.loads((tmp_path / "compare" / "comparison.json").read_text())["rows"]]
    assert names == ["gossip (ring(4))", "power_gossip rank=2 (ring(4))"]
