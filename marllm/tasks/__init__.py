"""Task definitions: where queries come from, default prompt templates, and the task reward.

``task.name`` picks one of :data:`TASK_REGISTRY` (the one registry mechanism of every extension kind,
:mod:`marllm.utils.registry`), or names a class of one's own by reference (``package.module:Class`` or
``file.py:Class``, see :class:`Task`). A task class is its own settings: the ``task`` section's keys are its fields.
"""

from __future__ import annotations

from marllm.tasks.base import Task, TaskParts, has_binary_reward, load_text_dataset
from marllm.tasks.math import MathTask
from marllm.tasks.sentiment import SentimentTask
from marllm.tasks.text import TextTask
from marllm.utils.registry import Extension, Registry

TaskConfig = SentimentTask | MathTask | TextTask | Task
"""The task configurations, selected by ``task.name`` (a user's class satisfies :class:`Task`)."""

TASK_REGISTRY: Registry[type[Extension]] = Registry("task", Extension, "my_task.py:MyTask")
"""Task name -> its entry, whose ``implementation`` is the task class (the names ``task.name`` takes)."""

for _name, _task in {"sentiment": SentimentTask, "gsm8k": MathTask, "arithmetic": MathTask, "text": TextTask}.items():
    TASK_REGISTRY.register(_name)(
        type(f"{_name.capitalize()}Entry", (Extension,), {"implementation": f"{_task.__module__}:{_task.__name__}"})
    )

TASKS: dict[str, type] = {name: TASK_REGISTRY.implementation(name, "task.name") for name in TASK_REGISTRY}
"""Task name -> its task class, each built-in's (:data:`TASK_REGISTRY`)."""

__all__ = [
    "TASKS",
    "TASK_REGISTRY",
    "MathTask",
    "SentimentTask",
    "Task",
    "TaskConfig",
    "TaskParts",
    "TextTask",
    "has_binary_reward",
    "load_text_dataset",
]
