"""The ``jaxgossip`` console script (edge package): ``train``, ``sweep``, ``consensus``,
``topology-sweep``, ``tune-gamma``, ``demo``, ``plan``, ``compare`` and ``design``, one module each, on one
typed configuration system
(:mod:`jaxgossip.run.parsing`, jsonargparse).

Every command takes ``--config FILE`` (YAML, JSON or Python ``get_config()``; ``FILE.py:ARG`` for
``get_config(ARG)``) and ``--field=value`` overrides of its typed fields (``jaxgossip <command>
--help`` lists them all), checks everything before any work, writes its results under ``--out`` and
prints a summary table. Exit status: 0 done; 2 bad input, found before any work (one message naming
the option or file); 3 a training run diverged; 1 a full disk (one line naming the folder and the
space needed) or a bug (one line, the traceback written to ``traceback.txt`` under ``--out`` or a
temporary file; ``JAXGOSSIP_TRACEBACK=1`` prints it instead); 130 interrupted. See
:mod:`jaxgossip.run.errors`.
"""

from __future__ import annotations

import importlib
import os
import sys

from jaxgossip.checks import did_you_mean
from jaxgossip.cli.demo import demo_runs
from jaxgossip.run import errors

__all__ = ["main", "demo_runs", "COMMANDS", "MULTI_PROCESS_COMMANDS"]

# command -> (module, one-line help)
COMMANDS = {
    "train": ("jaxgossip.cli.train", "train N workers with one algorithm and topology"),
    "sweep": ("jaxgossip.cli.sweep", "vmap a training run over seeds x --sweep.AXIS=values in one compile"),
    "consensus": ("jaxgossip.cli.consensus", "communication-only consensus comparison of algorithms"),
    "topology-sweep": ("jaxgossip.cli.topology_sweep", "one algorithm on many graphs x sizes x seeds"),
    "tune-gamma": ("jaxgossip.cli.tune_gamma", "largest consensus step size at which compressed gossip contracts"),
    "demo": ("jaxgossip.cli.demo", "compare gossip, Choco, PowerGossip, push-sum, Sparse-Push, SCSP, or --algorithms"),
    "plan": ("jaxgossip.cli.plan", "memory of a run's compiled chunk per node, and the largest N that fits a GPU"),
    "compare": ("jaxgossip.cli.compare", "finished runs (train --out folders, demo folders) in one table and plots"),
    "design": ("jaxgossip.cli.design", "mixing weights of least SLEM on a graph, vs Metropolis, max-degree, constant"),
}

# commands that run over several processes (the node axis sharded over all of them)
MULTI_PROCESS_COMMANDS = ("train",)


def _overview() -> str:
    lines = ["usage: jaxgossip COMMAND [--config FILE] [--field=value ...]", "", "commands:"]
    lines += [f"  {name:<16}{help_text}" for name, (_, help_text) in COMMANDS.items()]
    lines += ["", "jaxgossip COMMAND --help lists every option with its type, default and meaning."]
    lines += [
        "exit status: 0 done, 2 bad input (one line), 3 a run diverged, 1 a full disk or an internal error",
        f"(its traceback written to a file the message names; {errors.TRACEBACK_ENV}=1 prints it instead)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``jaxgossip`` console script; returns the exit status (0 ok, 1 a full disk
    or an internal error, 2 bad input, 3 a training run diverged, 130 interrupted)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_overview(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name = argv[0]
    if name not in COMMANDS:
        print(
            f"jaxgossip: error: unknown command {name!r}{did_you_mean(name, COMMANDS)}; "
            f"commands: {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    try:
        # Joins a multi-process run when the environment asks for one (python -m jaxgossip.run.launch,
        # or JAXGOSSIP_* set by hand on every host); before any command touches a device.
        from jaxgossip.run.distributed import initialize_from_env

        if initialize_from_env() and name not in MULTI_PROCESS_COMMANDS:
            # These commands would run whole in every process and all write the same files.
            raise ValueError(
                f"{name} runs in one process; of the commands, only {', '.join(MULTI_PROCESS_COMMANDS)} spreads "
                "over several (in Python, run_consensus takes node-sharded params on any mesh)"
            )
        return module.run(argv[1:])
    except KeyboardInterrupt:
        print(f"jaxgossip {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - every failure ends in one line, classified below
        if os.environ.get(errors.TRACEBACK_ENV):  # for debugging: the full traceback
            raise
        return _report(name, err)
    finally:
        errors.set_output_folder(None)


def _report(name: str, err: Exception) -> int:
    """Prints one line for a failed command and returns its exit status (see
    :mod:`jaxgossip.run.errors`): 2 for bad input, 1 for a full disk or a bug (whose traceback is
    written to a file the line names)."""
    message = (str(err).strip() or type(err).__name__) if not isinstance(err, OSError) else _os_message(err)
    if errors.is_user_error(err):
        print(f"jaxgossip {name}: error: {message}", file=sys.stderr)
        return 2
    if errors.is_disk_full(err):
        text = message if isinstance(err, errors.DiskFullError) else f"no space left on device: {_first_line(message)}"
        print(f"jaxgossip {name}: error: {text}", file=sys.stderr)
        return 1
    path = errors.write_traceback(name, err)
    print(
        f"jaxgossip {name}: internal error (a bug in jaxgossip, not in your input): {type(err).__name__}: "
        f"{_first_line(message)}; full traceback in {path} (or set {errors.TRACEBACK_ENV}=1 to print it)",
        file=sys.stderr,
    )
    return 1


def _os_message(err: OSError) -> str:
    message = str(err) or type(err).__name__
    if err.filename and str(err.filename) not in message:
        message = f"{message}: {err.filename}"
    return message


def _first_line(text: str, limit: int = 300) -> str:
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[:limit] + "..."
