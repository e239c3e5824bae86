"""The paths a config names, made absolute when it is read: one rule for all of them.

A relative path written in a config file is relative to that file's folder; one given as a command-line override
(``task.dataset=data/mine.jsonl``) is relative to the working directory, where it was typed. Either way it is made
absolute as the config is read (:func:`absolute_config_paths`), so that the run's saved ``config.yaml`` names the same
files from anywhere: ``marllm eval RUN_DIR/config.yaml`` and ``--resume`` work from another working directory.

The paths: ``run_dir``, ``model.name_or_path``, each of ``agents.models``, ``task.dataset``, ``task.eval_dataset``,
``task.reward_model``, and the files that ``task.name``, ``task.reward``, ``agents.algorithm``, ``game.name``,
``game.seats`` and ``game.actions`` name (``file.py:name``, also as the key of a seat's or a mode's settings). A
value that is not a local path is left as it is: a hub id (``imdb``, ``gpt2-large``), a ``marllm:`` asset, an
importable module. A dataset or model counts as a local path when it exists there (or, for a dataset, when it ends in
a data-file suffix).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from marllm.utils.data_formats import DATA_FORMATS
from marllm.utils.imports import absolute_reference

ASSET_PREFIX = "marllm:"


def _join(value: str, base: Path) -> str:
    """``value`` against ``base``, normalised (``..`` removed) but with its links kept as the user named them."""
    return os.path.normpath(base / Path(value).expanduser())


def _always(value: str, base: Path) -> str:
    return _join(value, base)


def _existing(value: str, base: Path) -> str:
    """A model path: made absolute where it exists relative to ``base`` (else a hub id, left as it is)."""
    return _join(value, base) if Path(_join(value, base)).exists() else value


def _data_file(value: str, base: Path) -> str:
    """A dataset: a local file when it ends in a data-file suffix or exists relative to ``base``."""
    path = _join(value, base)
    return path if Path(value).suffix in DATA_FORMATS or Path(path).exists() else value


def _reference(value: Any, base: Path) -> Any:
    if isinstance(value, dict):
        return {role: absolute_reference(each, base) for role, each in value.items()}
    if isinstance(value, list):
        return [_named(each, base) for each in value]
    return absolute_reference(value, base)


def _named(value: Any, base: Path) -> Any:
    """An extension named alone (``file.py:Class``) or with its settings (``{file.py:Class: {...}}``): the
    reference made absolute, the settings kept."""
    if isinstance(value, dict):
        return {absolute_reference(key, base): settings for key, settings in value.items()}
    return absolute_reference(value, base)


# dotted key -> how its relative value is made absolute against a base folder
PATH_KEYS: dict[str, Callable[[Any, Path], Any]] = {
    "run_dir": _always,
    "model.name_or_path": _existing,
    "task.dataset": _data_file,
    "task.eval_dataset": _data_file,
    "task.reward_model": _existing,
    "task.name": _reference,
    "task.reward": _reference,
    "agents.algorithm": absolute_reference,  # a mapping per learner: below, entry by entry
    "game.name": absolute_reference,
    "game.seats": _reference,
    "game.actions": _named,
}


def absolute_config_paths(
    data: dict[str, Any], base: Path, overrides: Sequence[str] = (), cwd: Path | None = None
) -> dict[str, Any]:
    """``data`` (a config as read, ``overrides`` applied) with its relative paths made absolute: against ``base``
    (the config file's folder), or against ``cwd`` (default: the working directory) for the keys an override set
    (``section.key=value``). Nothing else changes; ``data`` itself is not modified."""
    cwd = Path.cwd() if cwd is None else cwd
    overridden = [override.partition("=")[0].strip() for override in overrides]
    data = dict(data)
    for key, absolute in PATH_KEYS.items():
        *sections, name = key.split(".")
        value = _find(data, [*sections, name])
        if _relative(value):
            data = _replaced(data, [*sections, name], absolute(value, cwd if _from_override(key, overridden) else base))
    agents = data.get("agents") if isinstance(data.get("agents"), dict) else {}
    for name, resolve in (("models", _existing), ("algorithm", absolute_reference)):
        per_learner = agents.get(name)
        if isinstance(per_learner, dict):  # each learner's entry against where it was set
            fixed = {
                learner: resolve(value, cwd if _from_override(f"agents.{name}.{learner}", overridden) else base)
                if _relative(value) else value
                for learner, value in per_learner.items()
            }
            agents = {**agents, name: fixed}
            data = {**data, "agents": agents}
    return data


def _find(data: Any, keys: Sequence[str]) -> Any:
    """The value at ``keys`` (nested sections) of ``data``, or None where a section is missing or not a mapping."""
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _replaced(data: dict[str, Any], keys: Sequence[str], value: Any) -> dict[str, Any]:
    """``data`` with ``value`` at ``keys`` (each section copied, ``data`` itself unchanged)."""
    head, *rest = keys
    return {**data, head: _replaced(data[head], rest, value) if rest else value}


def _relative(value: Any) -> bool:
    """Whether ``value`` may be a relative path (or a mapping or list of references): not an absolute path, not an
    asset."""
    if isinstance(value, dict | list):
        return True
    return isinstance(value, str) and bool(value.strip()) and not value.startswith(ASSET_PREFIX) and not (
        Path(value).expanduser().is_absolute()
    )


def _from_override(key: str, overridden: Collection[str]) -> bool:
    """Whether an override set ``key``: the key itself, a key inside it, or the section holding it."""
    return any(key == given or given.startswith(f"{key}.") or key.startswith(f"{given}.") for given in overridden)
