"""Strict construction of nested dataclasses from plain data (a config's YAML, a component's settings): unknown keys,
wrong types and values a dataclass's own checks reject are errors that name the dotted key.

A type may read its own shape from the data with a ``from_config(value, path)`` classmethod (a tagged union such as
``game.actions: {score: {normalization: word}}``), and give it back with a ``to_config()`` method.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import Any, Literal, TypeVar, Union

from marllm.utils.errors import ConfigError

T = TypeVar("T")

_ROOT: ContextVar[type | None] = ContextVar("config_root", default=None)
"""The dataclass a top-level :func:`build` builds, whose tree an unknown key is looked up in."""


def build(cls: type[T], data: Any, path: str = "") -> T:
    """Construct dataclass ``cls`` from a mapping, recursively and strictly.

    An unknown key that is a key of another section (``ppo.mini_batch_size``, ``game.every``) is answered with its
    places.
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
    from_config = getattr(annotation, "from_config", None)
    if isinstance(annotation, type) and from_config is not None:  # a type that reads its own shape
        try:
            return from_config(value, path)
        except ValueError as error:
            raise error if isinstance(error, ConfigError) else ConfigError(str(error)) from None
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
        if field.init and _is_section(annotation):
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
            if _is_section(section):
                places += _places(section, key, dotted)
    return places


def _is_section(annotation: Any) -> bool:
    """Whether ``annotation`` is a section of keys (a dataclass that does not read its own shape)."""
    return dataclasses.is_dataclass(annotation) and isinstance(annotation, type) and not hasattr(
        annotation, "from_config"
    )


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
    if hasattr(obj, "to_config") and not isinstance(obj, type):
        return obj.to_config()
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
