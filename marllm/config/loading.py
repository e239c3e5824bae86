"""A config file read: YAML with each key once, and dotted overrides; built by :mod:`marllm.utils.dataclass_tree`.

Unknown keys, wrong types and values a section's own checks reject are errors that name the dotted key.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from marllm.utils.dataclass_tree import build, convert, to_dict  # noqa: F401 - re-exported for the config
from marllm.utils.errors import ConfigError


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
