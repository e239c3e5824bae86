"""Strict construction of nested dataclasses from YAML data, with dotted overrides.

Unknown keys, wrong types and values a section's own checks reject are errors that name the dotted key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

from marllm.utils.errors import ConfigError

T = TypeVar("T")


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A YAML mapping gives the same key twice (plain PyYAML silently keeps the last value)."""

    def __init__(self, key: Any, first: yaml.Mark, again: yaml.Mark):
        super().__init__(None, None, f"duplicate key {key!r}", again)
        self.key = key
        self.first_line = first.line + 1
        self.line = again.line + 1


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping holding the same key twice (merge keys ``<<`` may be overridden)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if first is not key_node.start_mark:
                raise DuplicateKeyError(key, first, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load`` that raises :class:`DuplicateKeyError` on a key given twice in one mapping."""
    return yaml.load(text, Loader=UniqueKeyLoader)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML file that holds a non-empty mapping, each key given once."""
    path = Path(path)
    if path.is_dir():
        raise directory_given(path, "config file", "examples/cory_offline.yaml")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = parse_yaml(path.read_text(encoding="utf-8"))
    except DuplicateKeyError as error:
        raise ConfigError(
            f"config file {str(path)!r}: key {error.key!r} appears twice in one mapping (lines {error.first_line} "
            f"and {error.line}); give each key once"
        ) from error
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {error}") from error
    except UnicodeDecodeError as error:
        raise ConfigError(f"config file {str(path)!r} is not UTF-8 text: {error}") from error
    if data is None:
        raise ConfigError(
            f"config file {str(path)!r} is empty; it must hold a mapping of config keys such as name, model, task "
            "(see examples/cory_offline.yaml)"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of keys, got {type(data).__name__}")
    return data


def directory_given(path: Path, what: str, example: str) -> ConfigError:
    """The error for a directory given where the YAML file ``what`` (``config file``) is expected: it says so and
    names an ``example`` file and the YAML files in the directory, if any."""
    found = sorted(str(entry) for entry in path.glob("*.y*ml") if entry.is_file())
    inside = f" (in it: {', '.join(found[:3])}{', …' if len(found) > 3 else ''})" if found else ""
    return ConfigError(f"{what} {str(path)!r} is a directory; give a YAML {what}, e.g. {example}{inside}")


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML: ``1e-5``, ``[1, 2]``, ``null``, ``true``)."""
    for override in overrides:
        key, sep, raw = override.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {override!r} must look like section.key=value")
        try:
            value = parse_yaml(raw)
        except yaml.YAMLError as error:
            raise ConfigError(
                f"override {override!r}: value is not valid YAML ({_yaml_problem(error)}); to give it as text, quote "
                f"it for YAML inside the shell's quotes: {_quoted_override(key, raw)}"
            ) from error
        parts = key.split(".")
        node = data
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {override!r}: {'.'.join(parts[: depth + 1])} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def _yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's complaint in one line: the problem and its column (the override's value is one line)."""
    problem = getattr(error, "problem", None)
    mark = getattr(error, "problem_mark", None)
    if not problem:
        return str(error).splitlines()[0] if str(error) else type(error).__name__
    return f"{problem} at column {mark.column + 1}" if mark is not None else str(problem)


def _quoted_override(key: str, raw: str) -> str:
    """``key=raw`` as a shell word whose value YAML reads as the text ``raw``: a YAML double-quoted string inside
    single shell quotes (``game.templates='"{board} Move:"'``), or, when ``raw`` holds a single quote, a YAML
    single-quoted string inside double shell quotes."""
    if "'" not in raw:
        yaml_text = '"' + raw.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return f"{key}='{yaml_text}'"
    yaml_text = "'" + raw.replace("'", "''") + "'"
    for special in ("\\", '"', "$", "`"):
        yaml_text = yaml_text.replace(special, "\\" + special)
    return f'{key}="{yaml_text}"'


_ROOT: ContextVar[type | None] = ContextVar("config_root", default=None)
"""The dataclass a top-level :func:`build` builds, whose tree an unknown key is looked up in."""


def build(cls: type[T], data: Any, path: str = "") -> T:
    """Construct dataclass ``cls`` from a mapping, recursively and strictly.

    A dataclass may name the field a scalar given for the whole section was meant for (``SCALAR_FIELD``: ``game.actions:
    score`` is answered with ``game.actions.mode``). An unknown key that is a key of another section
    (``ppo.mini_batch_size``, ``game.mode``) is answered with its places.
    """
    if path:
        return _build(cls, data, path)
    root = _ROOT.set(cls)
    try:
        return _build(cls, data, path)
    finally:
        _ROOT.reset(root)


def _build(cls: type[T], data: Any, path: str) -> T:
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        scalar_field = getattr(cls, "SCALAR_FIELD", None)
        if scalar_field is not None and not isinstance(data, list):
            raise ConfigError(
                f"{path} is a section; write {_join(path, scalar_field)}: {data} (keys of {path}: "
                f"{[f.name for f in dataclasses.fields(cls) if f.init]})"
            )
        raise ConfigError(f"{path or 'config'} must be a mapping, got {type(data).__name__} {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [key for key in data if key not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(str(key), list(fields), n=1)
        hint = f" (did you mean {_join(path, close[0])!r}?)" if close else _near_miss_elsewhere(str(key), cls, path)
        elsewhere = _places(_ROOT.get() or cls, str(key))
        if elsewhere:
            hint = f" ({key!r} is {' or '.join(repr(place) for place in elsewhere)}: write it there)"
        raise ConfigError(f"unknown config key {_join(path, key)!r}{hint}; valid keys here: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, value in data.items():
        values[name] = convert(hints[name], value, _join(path, name))
    missing = [
        name
        for name, f in fields.items()
        if name not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"missing config key(s) {[_join(path, m) for m in missing]}")
    try:
        return cls(**values)
    except (ValueError, TypeError) as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(f"{path or 'config'}: {error}") from error


def convert(annotation: Any, value: Any, path: str) -> Any:
    """Check ``value`` against a type annotation, converting YAML lists/mappings to dataclasses where asked."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin in (Union, types.UnionType):
        return _convert_union(annotation, args, value, path)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path} must be one of {list(args)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(annotation):  # an empty section (``actions:``, or null) is its defaults
        return build(annotation, {} if value is None else value, path)
    if origin in (list, Sequence, tuple):
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise ConfigError(f"{path} must be a list, got {type(value).__name__} {value!r}")
        item = args[0] if args else Any
        return [convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path} must be a mapping, got {type(value).__name__} {value!r}")
        key_type, value_type = args if args else (Any, Any)
        return {convert(key_type, k, f"{path}.{k}"): convert(value_type, v, f"{path}.{k}") for k, v in value.items()}
    return _convert_scalar(annotation, value, path)


def _near_miss_elsewhere(key: str, cls: type, path: str) -> str:
    """`` (did you mean 'a.b.c'?)`` for the nearest spelling of ``key`` among the keys of ``cls``'s sections (the
    key written one section too high, and misspelt), or ``""``."""
    names = {name: place for name, place in _all_places(cls, path)}
    close = difflib.get_close_matches(key, list(names), n=1)
    return f" (did you mean {names[close[0]]!r}?)" if close else ""


def _all_places(root: type, prefix: str) -> list[tuple[str, str]]:
    """Every (key name, dotted place) in the sections under ``root`` (not its own keys)."""
    found = []
    hints = typing.get_type_hints(root)
    for field in dataclasses.fields(root):
        annotation = hints.get(field.name)
        if field.init and dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
            dotted = _join(prefix, field.name)
            found += [(f.name, _join(dotted, f.name)) for f in dataclasses.fields(annotation) if f.init]
    return found


def _places(root: type, key: str, prefix: str = "") -> list[str]:
    """The dotted places of the config keys named ``key`` in the dataclass tree under ``root``."""
    places = []
    hints = typing.get_type_hints(root)
    for field in dataclasses.fields(root):
        if not field.init:
            continue
        dotted = _join(prefix, field.name)
        if field.name == key:
            places.append(dotted)
        annotation = hints[field.name]
        members = typing.get_args(annotation) if typing.get_origin(annotation) in (Union, types.UnionType) else ()
        for section in [annotation, *members]:
            if dataclasses.is_dataclass(section) and isinstance(section, type):
                places += _places(section, key, dotted)
    return places


def _convert_union(annotation: Any, args: tuple[Any, ...], value: Any, path: str) -> Any:
    """:func:`convert` for a union (``args``: its members): ``None`` where it allows null, else the first member that
    accepts ``value``; failing all, the error of the member of the value's own shape, or one naming every member."""
    if value is None and type(None) in args:
        return None
    options = [a for a in args if a is not type(None)]
    if len(options) == 1:
        return convert(options[0], value, path)
    errors = {}
    for option in options:
        try:
            return convert(option, value, path)
        except ConfigError as error:
            errors[option] = error
    # Report the option of the value's own shape (a mapping for a section, a list for a list) when there is one.
    for option, error in errors.items():
        container = typing.get_origin(option) or option
        if (isinstance(value, Mapping) and dataclasses.is_dataclass(option)) or (
            isinstance(value, list) and container in (list, Sequence, tuple)
        ):
            raise error
    raise ConfigError(f"{path}: {value!r} matches none of {_describe(annotation)}")


def _convert_scalar(annotation: Any, value: Any, path: str) -> Any:
    """:func:`convert` for a bool, int, float, str or other plain type (a YAML ``1e-5`` text read as a float)."""
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path} must be true or false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path} must be an integer, got {type(value).__name__} {value!r}")
        return value
    if annotation is float:
        if isinstance(value, str):
            # PyYAML reads "1e-5" (no dot) as a string; accept any text float() reads as a number.
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path} must be a number, got {type(value).__name__} {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path} must be a string, got {type(value).__name__} {value!r}")
        return value
    if isinstance(annotation, type) and isinstance(value, annotation):
        return value
    raise ConfigError(f"{path}: cannot read {value!r} as {_describe(annotation)}")


def to_dict(obj: Any) -> Any:
    """A dataclass tree as plain YAML-able data."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _describe(annotation: Any) -> str:
    """A type as the error says what is valid: ``int or 'auto' or null``, not ``Union``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in args)
    if origin is typing.Literal:
        return " or ".join(repr(arg) for arg in args)
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
