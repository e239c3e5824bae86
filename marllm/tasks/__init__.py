"""Task definitions: where queries come from, default prompt templates, and the task reward.

``task.name`` picks one of :data:`TASKS`, or names a class of one's own by reference (``package.module:Class`` or
``file.py:Class``, see :class:`Task`).
"""

from __future__ import annotations

from marllm.tasks.base import Task, TaskParts, has_binary_reward, load_text_dataset
from marllm.tasks.math import MathTask
from marllm.tasks.sentiment import SentimentTask
from marllm.tasks.text import TextTask

TaskConfig = SentimentTask | MathTask | TextTask | Task
"""The task configurations, selected by ``task.name`` (a user's class satisfies :class:`Task`)."""

TASKS: dict[str, type] = {"sentiment": SentimentTask, "gsm8k": MathTask, "arithmetic": MathTask, "text": TextTask}

__all__ = [
    "TASKS",
    "MathTask",
    "SentimentTask",
    "Task",
    "TaskConfig",
    "TaskParts",
    "TextTask",
    "has_binary_reward",
    "load_text_dataset",
]
