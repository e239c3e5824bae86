"""Task definitions: where queries come from, default prompt templates, and the task reward."""

from __future__ import annotations

from marllm.envs.tasks.base import TaskParts, load_text_dataset
from marllm.envs.tasks.sentiment import SentimentTask

TaskConfig = SentimentTask
"""The union of task configurations (selected by ``task.name``)."""

TASKS: dict[str, type] = {"sentiment": SentimentTask}

__all__ = ["TASKS", "SentimentTask", "TaskConfig", "TaskParts", "load_text_dataset"]
