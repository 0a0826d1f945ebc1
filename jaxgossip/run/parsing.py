"""Command lines and config files onto typed dataclasses, with jsonargparse (edge module).

Every command is described by a :class:`Command`: the dataclasses whose fields are its options, a
few on/off flags and the defaults it changes. jsonargparse builds the ``--help`` (type, default and
meaning of every field) and checks and converts every value against the field's type. This module
adds only what the library leaves out, as a thin layer over its parser:

- config files (YAML, JSON, Python ``get_config()``; read by :mod:`jaxgossip.run.config_files`),
  with unknown keys refused with a "did you mean" and every error naming the file;
- ``--key=100,150`` for list fields (next to ``[100,150]``), bare ``--flag`` for booleans,
  ``none`` for null;
- option groups (``--time.compute``, ``--byzantine.nodes``): a config field marked with
  :func:`jaxgossip.run.config.option_group` holds the options given, typed by the fields of its
  schema dataclass, which jsonargparse checks like any field;
- overrides inside free-form mappings at any depth
  (``--algorithm_options.compressor_options.fraction=0.2``), merged into the mapping from the file;
  a mapping marked with :func:`jaxgossip.run.config.typed_options` has its keys typed by a function
  of the other fields (the chosen algorithm's and compressor's factory signatures, the sweep axes as
  lists of numbers) and checked by jsonargparse like any field;
- "did you mean" for unknown options, and no prefix abbreviation (``--ou`` is not ``--out``).

Errors are :class:`UsageError` (a ValueError); the dispatcher prints them and exits with 2.
jsonargparse is imported when a parser is first built (the command line, :func:`from_dict`), not
with this module.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import math
import re
import textwrap
import types
import typing
from typing import TYPE_CHECKING, Any

from jaxgossip import configs
from jaxgossip.checks import did_you_mean
from jaxgossip.run.config_files import parse_value, read_config_file
from jaxgossip.run.errors import UsageError

if TYPE_CHECKING:
    from jsonargparse import ArgumentParser

__all__ = ["Command", "Parsed", "UsageError", "build_parser", "parse", "from_dict", "parse_argv"]


@dataclasses.dataclass
class Command:
    """What a subcommand accepts.

    Attributes:
      name: the subcommand (``train``, ...).
      description: help text above the options.
      classes: (dataclass, group title) pairs; every field becomes ``--field``.
      defaults: field -> default replacing the dataclass default (e.g. the demo's data set).
      flags: ``--flag`` -> help of on/off switches that are not config fields (``--no-progress``).
      extra: group title -> (option, type, default, help) of further options that are not config
        fields (``--out``, the cost model's ``--time.*``).
      field_help: field (or ``group.option``) -> one-line meaning.
      epilog: text after the options (per-algorithm hyperparameters, examples).
    """

    name: str
    description: str
    classes: list[tuple[type, str]]
    defaults: dict[str, Any] = dataclasses.field(default_factory=dict)
    flags: dict[str, str] = dataclasses.field(default_factory=dict)
    extra: dict[str, list[tuple[str, Any, Any, str]]] = dataclasses.field(default_factory=dict)
    field_help: dict[str, str] = dataclasses.field(default_factory=dict)
    epilog: str = ""


@dataclasses.dataclass
class Parsed:
    """A parsed command line: ``values`` (field or option -> value, nested for dotted options),
    ``flags`` (flag dest -> bool), ``given`` (top-level keys set by the file or the command line)
    and the config file."""

    values: dict[str, Any]
    flags: dict[str, bool]
    given: set[str]
    config_path: str | None

    def build(self, cls: type):
        """The ``cls`` dataclass of the parsed values (its fields only)."""
        return cls(**{f.name: self.values[f.name] for f in dataclasses.fields(cls) if f.name in self.values})


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_list(hint: Any) -> str | None:
    """ "list" for list/tuple types, "maybe" for unions with a list (``int | list[int]``)."""
    origin = typing.get_origin(hint)
    if origin in (list, tuple):
        return "list"
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if all(typing.get_origin(a) in (list, tuple) for a in args):
            return "list"  # an optional list: a single item is still a list
        if any(typing.get_origin(a) in (list, tuple) for a in args):
            return "maybe"
    return None


def _appendable(hint: Any) -> bool:
    """Whether jsonargparse takes ``--name+=item`` (list types, not tuples)."""
    return typing.get_origin(hint) is list or any(typing.get_origin(a) is list for a in typing.get_args(hint))


def _is_dict(hint: Any) -> bool:
    """Whether ``hint`` is a mapping type (or an optional one)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return len(args) == 1 and _is_dict(args[0])
    return typing.get_origin(hint) is dict or hint is dict


def _group_of(field: dataclasses.Field) -> tuple[type, str] | None:
    """(schema, what) of a field made by :func:`jaxgossip.run.config.option_group`, else None."""
    schema = field.metadata.get("group")
    return None if schema is None else (schema, field.metadata.get("what", "option"))


@functools.cache
def _given_schema(schema: type) -> type:
    """The options of ``schema`` as jsonargparse parses a group: every field optional with default
    None, so that the parsed group holds what was given (the defaults stay with ``schema``)."""
    hints = _hints(schema)
    optional = typing.Optional  # jsonargparse's spelling of an optional hint
    fields = [(f.name, optional[hints[f.name]], dataclasses.field(default=None)) for f in dataclasses.fields(schema)]
    given = dataclasses.make_dataclass(f"{schema.__name__}Given", fields)
    given.__doc__ = f"The given options of {schema.__name__}."
    return given


def _is_bool(hint: Any) -> bool:
    return hint is bool


def _optional(hint: Any) -> bool:
    return type(None) in typing.get_args(hint)


def _jsonargparse():
    """jsonargparse, imported when a parser is built, so that importing this module (to read a
    config file, say) needs nothing beyond PyYAML."""
    try:
        import jsonargparse
    except ImportError as err:
        raise ImportError(
            f"the jaxgossip command line and typed config mappings need jsonargparse, which is not installed "
            f"({err}): pip install jsonargparse"
        ) from None
    return jsonargparse


#: The last lines of every command's --help.
EXIT_STATUS = (
    "exit status: 0 done; 2 bad input, before any work (one line naming the option or file); 3 a training run "
    "diverged;\n1 a full disk (one line: the folder and the space needed) or an internal error (one line naming "
    "the file\nthat holds the traceback, traceback.txt under --out; JAXGOSSIP_TRACEBACK=1 prints it instead)"
)


def build_parser(command: Command) -> ArgumentParser:
    """The jsonargparse parser of ``command`` (prog ``jaxgossip <name>``)."""
    jsonargparse = _jsonargparse()

    class _Formatter(jsonargparse.DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
        pass

    parser = jsonargparse.ArgumentParser(
        prog=f"jaxgossip {command.name}",
        description=textwrap.fill(command.description, 100),
        epilog=(command.epilog.rstrip("\n") + "\n\n" if command.epilog else "") + EXIT_STATUS,
        formatter_class=_Formatter,
        exit_on_error=False,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--config",
        type=str | None,
        default=None,
        help=(
            "config file: YAML, JSON or Python with get_config(); FILE.py:ARG calls get_config(ARG) "
            "(fields as below; command-line options override it). A bare name not in the current folder "
            f"names a config shipped with jaxgossip: {', '.join(configs.names())}"
        ),
    )
    for flag, help_text in command.flags.items():
        parser.add_argument(f"--{flag}", action="store_true", help=help_text)
    for cls, title in command.classes:
        group = parser.add_argument_group(title)
        hints = _hints(cls)
        for field in dataclasses.fields(cls):
            help_text = command.field_help.get(field.name, "")
            if _group_of(field):  # --time.compute, ... in a group of their own, titled by the field's help
                schema, _ = _group_of(field)
                parser.add_argument(f"--{field.name}", type=_given_schema(schema), default=None, help=help_text)
                continue
            if field.default is not dataclasses.MISSING:
                default = field.default
            else:
                default = field.default_factory()
            default = command.defaults.get(field.name, default)
            group.add_argument(f"--{field.name}", type=hints[field.name], default=default, help=help_text)
    for title, options in command.extra.items():
        group = parser.add_argument_group(title)
        for option, hint, default, help_text in options:
            group.add_argument(f"--{option}", type=hint, default=default, help=help_text)
    for action in parser._actions:  # the options of a group get their meaning (argparse keeps it per action)
        if "." in action.dest and action.dest in command.field_help:
            action.help = command.field_help[action.dest]
    return parser


@dataclasses.dataclass
class _Layout:
    """The options of a command by kind (names without ``--``)."""

    types: dict[str, Any]
    flags: dict[str, str]  # --no-progress -> dest no_progress
    groups: dict[str, tuple[list[str], str]]  # group field -> (its options, what an option is called)
    typed: dict[str, tuple[Any, str | None]]  # typed mapping field -> (hints_of, invalid)

    @classmethod
    def of(cls, command: Command) -> _Layout:
        hints: dict[str, Any] = {"config": str | None}
        groups, typed = {}, {}
        for klass, _ in command.classes:
            hints.update(_hints(klass))
            for field in dataclasses.fields(klass):
                if "typed_by" in field.metadata:
                    typed[field.name] = (field.metadata["typed_by"], field.metadata.get("invalid"))
                if _group_of(field):
                    schema, what = _group_of(field)
                    given = _hints(_given_schema(schema))
                    hints.update({f"{field.name}.{name}": hint for name, hint in given.items()})
                    groups[field.name] = (list(given), what)
        for options in command.extra.values():
            for option, hint, _, _ in options:
                hints[option] = hint
        return cls(hints, {flag: flag.replace("-", "_") for flag in command.flags}, groups, typed)

    def known(self) -> list[str]:
        return list(self.types) + list(self.flags)

    def mapping_of(self, name: str) -> str | None:
        """The free-form mapping option that a dotted ``name`` sets a key in (the longest prefix of
        mapping type that is not a group: ``algorithm_options``, ``byzantine.attack_options``)."""
        parts = name.split(".")
        for k in range(len(parts) - 1, 0, -1):
            prefix = ".".join(parts[:k])
            if prefix in self.groups:
                return None
            if _is_dict(self.types.get(prefix)):
                return prefix
        return None

    def unknown_in_group(self, name: str, source: str | None = None) -> UsageError | None:
        """The error of ``group.key`` with a key the group does not have, else None."""
        head, dot, key = name.partition(".")
        if not dot or head not in self.groups:
            return None
        known, what = self.groups[head]
        key = key.split(".")[0]
        prefix = f"{source}: " if source else ""
        return UsageError(f"{prefix}{head}.{key}: unknown {what}{did_you_mean(key, known)}; known: {', '.join(known)}")


# ---- values ---------------------------------------------------------------------------------


def _merge(base: dict, path: list[str], value: Any) -> dict:
    out = copy.deepcopy(base) if isinstance(base, dict) else {}
    node = out
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value
    return out


def _flatten_keys(values: dict, layout: _Layout, source: str) -> dict:
    """Checks the keys of a mapping (from a file or Python) against the command's options and
    returns it with dotted keys (``algorithm_options.gamma: 0.5``, ``time.bandwidth``) nested."""
    out: dict = {}
    known = [k for k in layout.types if k != "config"]
    for key, value in values.items():
        key = str(key).replace("-", "_") if str(key) not in layout.types else str(key)
        if key in layout.groups and isinstance(value, dict):  # time: {bandwidth: ...} -> time.bandwidth
            for sub, sub_value in value.items():
                if f"{key}.{sub}" not in layout.types:
                    raise layout.unknown_in_group(f"{key}.{sub}", source)
                out[f"{key}.{sub}"] = sub_value
            continue
        if key in layout.types:
            if _is_dict(layout.types[key]) and isinstance(out.get(key), dict) and isinstance(value, dict):
                value = {**out[key], **value}
            out[key] = value
            continue
        mapping = layout.mapping_of(key)
        if mapping:
            out[mapping] = _merge(out.get(mapping, {}), key[len(mapping) + 1:].split("."), value)
            continue
        error = layout.unknown_in_group(key, source)
        if error:
            raise error
        # "energy: {bit: ...}" for the dotted options energy.bit, ...
        nested = [t for t in layout.types if t.startswith(key + ".")]
        if nested and isinstance(value, dict):
            for sub, sub_value in value.items():
                if f"{key}.{sub}" not in layout.types:
                    raise UsageError(
                        f"{source}: unknown key {key}.{sub}{did_you_mean(f'{key}.{sub}', nested)}; known: "
                        f"{', '.join(nested)}"
                    )
                out[f"{key}.{sub}"] = sub_value
            continue
        hint = did_you_mean(key, known)
        raise UsageError(f"{source}: unknown key {key!r}" + (hint or f"; known keys: {', '.join(known)}"))
    return out


def _to_namespace_dict(values: dict) -> dict:
    """``{"energy.bit": 1}`` -> ``{"energy": {"bit": 1}}`` (jsonargparse's nesting)."""
    out: dict = {}
    for key, value in values.items():
        if "." in key:
            head, _, sub = key.partition(".")
            out.setdefault(head, {})[sub] = value
        else:
            out[key] = value
    return out


def _non_finite(text: str) -> bool:
    """Whether ``text`` spells inf or nan (which Python's float() reads, but no option takes)."""
    try:
        return not math.isfinite(float(text))
    except ValueError:
        return False


def _explain(err: Exception, source: str | None = None) -> UsageError:
    """A jsonargparse error as one line naming the option and the expected type."""
    text = str(err)
    match = re.search(r'Parser key "([^"]+)":', text)
    prefix = f"{source}: " if source else ""
    if match:
        key = match.group(1)
        given = re.findall(r"(?:Given value|Got value):\s*(.*)", text)
        expected = re.findall(r"Expected a (?:<class '(\w+)'>|([^.\n]+))", text)
        kinds = [a or b for a, b in expected] if expected else []
        value = given[-1].strip() if given else "?"
        what = " or ".join(dict.fromkeys(kinds)) if kinds else "a valid value"
        if "float" in kinds and _non_finite(value):
            return UsageError(f"{prefix}--{key}={value!r} is not valid: it must be finite (a number, not inf or nan)")
        return UsageError(f"{prefix}--{key}={value!r} is not valid: expected {what}".replace("NoneType", "null"))
    return UsageError(prefix + text.strip().splitlines()[0])


# ---- the command line -----------------------------------------------------------------------


def _split(argv: list[str], layout: _Layout) -> tuple[list[str], list[tuple[str, list[str], str]], str | None, set]:
    """Rewrites ``argv`` for jsonargparse: returns (tokens, mapping overrides, config path, given)."""
    tokens, overrides, config, given = [], [], None, set()
    known = layout.known()
    i = 0
    while i < len(argv):
        item = argv[i]
        i += 1
        if not item.startswith("--"):
            raise UsageError(f"unexpected argument {item!r}; options look like --key=value (see --help)")
        key, eq, value = item[2:].partition("=")
        if key in layout.flags:
            if eq:
                raise UsageError(f"--{key} is a switch and takes no value")
            tokens.append(f"--{key}")
            continue
        append = key.endswith("+") and _appendable(layout.types.get(key[:-1]))  # jsonargparse's --list+=item
        name = key[:-1] if append else key
        head = name.partition(".")[0]
        hint = layout.types.get(name)
        mapping = layout.mapping_of(name) if hint is None else None
        error = layout.unknown_in_group(name) if hint is None and not mapping else None
        if error:
            raise error
        if append:
            if not eq and i < len(argv):
                value, i = argv[i], i + 1
            given.add(head)
            tokens.append(f"--{key}={value}")
            continue
        if hint is None and not mapping:
            raise UsageError(f"unknown option --{key}{did_you_mean(key, known) or ''}; see --help for the options")
        if not eq:
            if hint is not None and _is_bool(hint) and (i >= len(argv) or argv[i].startswith("--")):
                value = "true"
            elif i < len(argv):
                value = argv[i]
                i += 1
            else:
                raise UsageError(f"--{key} needs a value: --{key}=VALUE")
        if key == "config":
            config = value
            continue
        given.add(head)
        if mapping:
            overrides.append((mapping, name[len(mapping) + 1:].split("."), value))
            continue
        if value.strip().lower() == "none" and _optional(hint):
            value = "null"
        kind, stripped = _is_list(hint), value.strip()
        if stripped == "null" or stripped.startswith("["):
            pass
        elif kind == "list" or (kind == "maybe" and "," in stripped):
            value = f"[{stripped}]"  # 100,150 -> [100,150]; a bare count stays a count for int | list
        tokens.append(f"--{key}={value}")
    return tokens, overrides, config, given


@functools.cache
def _value_parser(hint: Any) -> ArgumentParser:
    parser = _jsonargparse().ArgumentParser(exit_on_error=False)
    parser.add_argument("--value", type=hint)
    return parser


def _typed(name: str, hint: Any, value: Any, text: str | None, source: str | None, invalid: str | None) -> Any:
    """``value`` of option ``name`` checked and converted by jsonargparse against ``hint``; ``text``
    is the value as typed on the command line (None: from a file or Python, already typed)."""
    if hint is Any:
        return value  # nothing to check: the factory reads it (a YAML value, as typed)
    parser = _value_parser(hint)
    kind = _is_list(hint)
    try:
        if text is None:
            if kind == "list" and not isinstance(value, (list, tuple)):
                value = [value]  # one value of a list option, as on the command line
            return parser.parse_object({"value": value}).value
        stripped = text.strip()
        if stripped.lower() == "none":
            stripped = "null"
        elif not stripped.startswith("[") and (kind == "list" or (kind == "maybe" and "," in stripped)):
            stripped = f"[{stripped}]"
        return parser.parse_args([f"--value={stripped}"]).value
    except argparse.ArgumentError as err:
        if invalid:
            shown = parse_value(text) if text is not None else value
            if kind == "list" and not isinstance(shown, (list, tuple)):
                shown = [shown]
            prefix = f"{source}: " if source else ""
            raise UsageError(f"{prefix}--{name}={shown!r} {invalid}") from None
        error = _explain(err, source)
        raise UsageError(str(error).replace("--value=", f"--{name}=", 1)) from None


def _type_options(values: dict, texts: dict[str, str], layout: _Layout, source: str | None = None) -> None:
    """Types in place the keys of each :func:`jaxgossip.run.config.typed_options` mapping that its
    ``hints_of`` names (``algorithm_options.rank`` by the chosen algorithm's factory, every
    ``sweep.*`` axis as a list of numbers); the other keys are left for the config checks. ``texts``:
    the keys typed on the command line, as typed; the others came from ``source`` (a file)."""
    for field, (hints_of, invalid) in layout.typed.items():
        mapping = values.get(field)
        if not isinstance(mapping, dict):
            continue
        for key, hint in hints_of(values).items():
            *outer, last = key.split(".")
            node = mapping
            for part in outer:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict) and last in node:
                label, text = f"{field}.{key}", texts.get(f"{field}.{key}")
                node[last] = _typed(label, hint, node[last], text, None if text else source, invalid)


def _given_groups(values: dict, layout: _Layout) -> dict:
    """``values`` with each group holding only the options given (jsonargparse fills in None)."""
    for group in layout.groups:
        given = values.get(group) or {}
        values[group] = {key: value for key, value in given.items() if value is not None}
    return values


def parse(command: Command, argv: list[str], parser: ArgumentParser | None = None) -> Parsed:
    """Parses ``argv`` (and the ``--config`` file) for ``command``.

    Raises:
      UsageError: unknown option or key (with a suggestion), a value of the wrong type, a bad file.
    """
    parser = parser or build_parser(command)
    layout = _Layout.of(command)
    tokens, overrides, config_path, given = _split(list(argv), layout)
    namespace = None
    if config_path:
        source = f"config file {config_path!r}"
        values = _flatten_keys(read_config_file(config_path), layout, source)
        given |= {k.partition(".")[0] for k in values}
        try:
            namespace = parser.parse_object(_to_namespace_dict(values))
        except argparse.ArgumentError as err:
            raise _explain(err, source) from None
    try:
        namespace = parser.parse_args(tokens, namespace=namespace)
    except argparse.ArgumentError as err:
        raise _explain(err) from None
    values = _given_groups(namespace.as_dict(), layout)
    texts = {}
    for mapping, path, raw in overrides:
        *outer, last = mapping.split(".")
        node = values
        for part in outer:  # byzantine.attack_options: the mapping inside the group
            node = node.setdefault(part, {})
        node[last] = _merge(node.get(last) or {}, path, parse_value(raw))
        texts[".".join([mapping, *path])] = raw
    _type_options(values, texts, layout, f"config file {config_path!r}" if config_path else None)
    flags = {dest: bool(values.pop(dest, False)) for dest in layout.flags.values()}
    values.pop("config", None)
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict) and key not in layout.types:  # link: {bandwidth: ...}
            flat.update({f"{key}.{sub}": v for sub, v in value.items()})
        else:
            flat[key] = value
    return Parsed(flat, flags, given, config_path)


def from_dict(cls: type, values: dict, base: Any = None, source: str = "config") -> Any:
    """A ``cls`` dataclass from a mapping of field values (dotted keys into mapping fields allowed),
    type-checked as the command line is; ``base`` supplies the other fields."""
    command = Command(name="config", description="", classes=[(cls, "fields")])
    layout = _Layout.of(command)
    start = {}
    for key, value in (dataclasses.asdict(base) if base is not None else {}).items():
        if key in layout.groups and isinstance(value, dict):  # a group as its dotted options
            start.update({f"{key}.{sub}": sub_value for sub, sub_value in value.items()})
        else:
            start[key] = value
    plain = {}
    for key, value in values.items():
        mapping = layout.mapping_of(str(key))
        if mapping:  # algorithm_options.gamma=0.5: merged into the mapping
            value = parse_value(value) if isinstance(value, str) else value
            start[mapping] = _merge(start.get(mapping) or {}, str(key)[len(mapping) + 1:].split("."), value)
        else:
            plain[key] = value
    start.update(_flatten_keys(plain, layout, source))
    start.pop("config", None)
    try:
        namespace = build_parser(command).parse_object(_to_namespace_dict(start))
    except argparse.ArgumentError as err:
        raise _explain(err, source) from None
    values = _given_groups(namespace.as_dict(), layout)
    _type_options(values, {}, layout, source)
    return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)})


def on_help(argv: list[str]) -> bool:
    return any(a in ("-h", "--help") for a in argv)


def parse_argv(command: Command, argv: list[str]) -> Parsed | None:
    """Parses ``argv`` for ``command``; prints the help and returns None for ``-h`` / ``--help``."""
    parser = build_parser(command)
    if on_help(argv):
        parser.print_help()
        return None
    return parse(command, argv, parser)
