"""Config files and hand-typed values onto plain mappings (edge module).

- :func:`read_config_file`: a YAML, JSON or Python (``get_config()``) file as a mapping of option
  -> value, every error naming the file; ``file.py:ARG`` calls ``get_config(ARG)`` (the
  ml_collections convention), checked against the file's ``CONFIG_ARGS``; a bare name that is not
  a file names a config shipped with jaxgossip (:mod:`jaxgossip.configs`).
- :func:`parse_value`: a value typed by hand into a free-form mapping (``--algorithm_options.KEY``).

The command line that checks these mappings against the typed fields is :mod:`jaxgossip.run.parsing`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import os
import re
import types
from typing import Any

import yaml

from jaxgossip import configs
from jaxgossip.checks import did_you_mean
from jaxgossip.run.errors import UsageError

__all__ = ["read_config_file", "parse_value"]


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads ``1e-3`` as a string; read it as the float a user means."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def parse_value(text: str) -> Any:
    """A value typed by hand into a free-form mapping: YAML/JSON (``0.2``, ``[1, 2]``, ``true``,
    ``null``, ``{a: 1}``), ``none`` for null, ``a,b`` for a list, else the string itself."""
    if text.strip().lower() == "none":
        return None
    if "," in text and not text.strip().startswith(("[", "{", "(")):
        return [parse_value(part) for part in text.split(",")]
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError:
        return text


_CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".py")


def _split_config_spec(spec: str) -> tuple[str, str | None]:
    """``file.py:ARG`` -> (``file.py``, ``ARG``); anything else -> (``spec``, None).

    The split is at the last ``:`` whose left side ends in a config suffix and whose right side holds
    no path separator, so a path that contains ``:`` elsewhere stays a path; a file that exists under
    the whole name is read as that file.
    """
    if os.path.exists(spec):
        return spec, None
    head, colon, arg = spec.rpartition(":")
    if colon and head.endswith(_CONFIG_SUFFIXES) and "/" not in arg and os.sep not in arg:
        return head, arg
    return spec, None


def _takes_argument(get_config: Any) -> bool:
    try:
        inspect.signature(get_config).bind("arg")
    except TypeError:
        return False
    except ValueError:  # no signature to inspect (a builtin): let the call decide
        return True
    return True


def _call_get_config(module: types.ModuleType, path: str, arg: str | None) -> Any:
    """``get_config()``, or ``get_config(arg)`` checked against the module's ``CONFIG_ARGS`` (the
    arguments the family declares: a tuple of names, or a mapping whose keys are the names)."""
    if not hasattr(module, "get_config"):
        raise UsageError(f"config file {path!r} must define get_config() returning a mapping")
    if arg is None:
        return module.get_config()
    valid = getattr(module, "CONFIG_ARGS", None)
    valid = None if valid is None else [str(name) for name in valid]
    listing = f"; valid arguments: {', '.join(valid)}" if valid else ""
    if not _takes_argument(module.get_config):
        raise UsageError(f"config file {path!r} takes no argument (got {arg!r}): its get_config() has no parameter")
    if valid is not None and arg not in valid:
        raise UsageError(f"config file {path!r} has no argument {arg!r}{did_you_mean(arg, valid)}{listing}")
    return module.get_config(arg)


def read_config_file(spec: str) -> dict:
    """The mapping of a YAML, JSON or Python (``get_config()``) config file.

    ``spec`` is a path, or ``file.py:ARG`` for a Python config whose ``get_config(ARG)`` takes an
    argument (one family of runs in one file; the module-level ``CONFIG_ARGS`` lists the valid
    arguments). A bare file name that is not in the current folder names a config shipped with the
    package (:mod:`jaxgossip.configs`: ``digits_choco.yaml``, ...), so the documented examples run
    from an installed wheel.

    Raises:
      UsageError: the file is missing (the message lists the shipped configs) or unreadable, has a
        syntax error, is not a mapping, or its ``get_config()`` is missing or fails; ``:ARG`` on a
        YAML or JSON file, on a ``get_config()`` without a parameter, or not in ``CONFIG_ARGS``. The
        message names the file (and lists the valid arguments).
    """
    path, arg = _split_config_spec(spec)
    if not os.path.exists(path):
        shipped = configs.path(path)
        if shipped is None:
            names = configs.names()
            raise UsageError(
                f"config file {path!r} does not exist{did_you_mean(os.path.basename(path), names)}; the configs "
                f"shipped with jaxgossip, usable by bare name from any folder: {', '.join(names)}"
            )
        path = shipped
    if os.path.isdir(path):
        raise UsageError(f"config file {path!r} is a folder")
    if arg is not None and not path.endswith(".py"):
        raise UsageError(
            f"config file {path!r} takes no argument (got {arg!r}): only a Python config's get_config(ARG) does"
        )
    try:
        if path.endswith((".yaml", ".yml")):
            with open(path) as f:
                values = yaml.load(f, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
            values = {} if values is None else values
        elif path.endswith(".json"):
            with open(path) as f:
                values = json.load(f)
        elif path.endswith(".py"):
            module_spec = importlib.util.spec_from_file_location("_jaxgossip_config", path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
            values = _call_get_config(module, path, arg)
            if dataclasses.is_dataclass(values):
                values = dataclasses.asdict(values)
            elif hasattr(values, "to_dict"):  # ml_collections.ConfigDict
                values = values.to_dict()
        else:
            raise UsageError(f"config file {path!r} must end in .yaml, .yml, .json or .py")
    except UsageError:
        raise
    except yaml.YAMLError as err:
        raise UsageError(f"config file {path!r} is not valid YAML: {err}") from None
    except json.JSONDecodeError as err:
        raise UsageError(f"config file {path!r} is not valid JSON: {err}") from None
    except OSError as err:
        raise UsageError(f"config file {path!r} cannot be read: {err}") from None
    except Exception as err:  # a Python config is user code: report its error, not ours
        raise UsageError(f"config file {path!r} failed: {type(err).__name__}: {err}") from None
    if not isinstance(values, dict):
        raise UsageError(f"config file {path!r} must hold a mapping of option -> value, got {type(values).__name__}")
    return values
