"""Task definitions: where queries come from, default prompt templates, and the task reward."""

from __future__ import annotations

from marllm.tasks.base import TaskParts, load_text_dataset
from marllm.tasks.math import MathTask
from marllm.tasks.sentiment import SentimentTask

TaskConfig = SentimentTask | MathTask
"""The task configurations, selected by ``task.name``."""

TASKS: dict[str, type] = {"sentiment": SentimentTask, "gsm8k": MathTask, "arithmetic": MathTask}

__all__ = ["TASKS", "MathTask", "SentimentTask", "TaskConfig", "TaskParts", "load_text_dataset"]
