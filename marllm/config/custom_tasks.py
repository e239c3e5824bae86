"""Tasks and rewards a config names by reference: ``task.name: module:Class`` / ``file.py:Class`` (a task class of
one's own) and ``task.reward: module:function`` / ``file.py:function`` (the text task's reward, or one per role).

A file path is relative to the config file's folder: :func:`absolute_task_references` rewrites it as an absolute
path when the file is read, so that the run's saved ``config.yaml`` (read back by ``marllm eval`` and ``--resume``
from the run directory) names the same file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from marllm.tasks import TASKS
from marllm.utils.errors import ConfigError
from marllm.utils.imports import absolute_reference, load_reference

REFERENCE_KEYS = ("name", "reward")
"""The keys of the ``task`` section that may name Python objects by reference."""


def absolute_task_references(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """``data`` (a config as read) with the relative file paths of ``task.name`` and ``task.reward`` (or of each
    role's reward) made absolute against ``base``."""
    task = data.get("task")
    if not isinstance(task, dict):
        return data
    task = dict(task)
    for key in REFERENCE_KEYS:
        value = task.get(key)
        if isinstance(value, dict):
            task[key] = {role: absolute_reference(each, base) for role, each in value.items()}
        elif value is not None:
            task[key] = absolute_reference(value, base)
    return {**data, "task": task}


def task_class(name: Any) -> type:
    """The task configuration class ``task.name`` names: one of :data:`~marllm.tasks.TASKS`, or a class imported
    from ``module:Class`` / ``file.py:Class`` that is a dataclass with a ``name`` field and the methods of
    :class:`~marllm.tasks.Task`.

    Raises:
        ConfigError: an unknown name, a reference that cannot be imported, or a class that is not a task.
    """
    if isinstance(name, str) and name in TASKS:
        return TASKS[name]
    if not isinstance(name, str) or ":" not in name:
        raise ConfigError(
            f"task.name must be one of {sorted(TASKS)} or a task class of your own as package.module:Class or "
            f"file.py:Class, got {name!r}"
        )
    try:
        cls = load_reference(name)
    except ValueError as error:
        raise ConfigError(f"task.name: {error}") from None
    if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
        raise ConfigError(f"task.name: {name!r} is {cls!r}, not a dataclass (a task class is a @dataclass)")
    if "name" not in {f.name for f in dataclasses.fields(cls) if f.init}:
        raise ConfigError(
            f"task.name: task class {cls.__name__} has no 'name' field; give it one (name: str), which holds the "
            "reference it was named by"
        )
    missing = [method for method in ("build", "default_templates", "check_references") if not callable(
        getattr(cls, method, None)
    )]
    if missing:
        raise ConfigError(
            f"task.name: task class {cls.__name__} lacks the method(s) {missing} of a task (see marllm.tasks.Task)"
        )
    return cls

