"""What a task gives the environment: queries, default prompt templates and a reward function."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from marllm.envs.text_env import RewardFn

_LOCAL_FORMATS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text"}


@dataclass
class TaskParts:
    """A built task.

    Attributes:
        dataset: training rows, each with a ``query`` field.
        templates: default prompt template per role name (used when the config gives none).
        reward_fn: ``reward_fn(samples, responses) -> one float per sample``.
        eval_dataset: rows for evaluating agents deployed alone (defaults to ``dataset``).
    """

    dataset: Any
    templates: dict[str, str]
    reward_fn: RewardFn
    eval_dataset: Any = None


def load_text_dataset(source: str, split: str) -> datasets.Dataset:
    """A local file (.csv/.json/.jsonl/.parquet/.txt) or a hub dataset id, as one ``datasets.Dataset`` split."""
    path = Path(source)
    if path.suffix in _LOCAL_FORMATS or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"dataset file {source!r} does not exist")
        if path.suffix not in _LOCAL_FORMATS:
            raise ValueError(f"dataset file {source!r}: unsupported format; use one of {sorted(_LOCAL_FORMATS)}")
        return datasets.load_dataset(_LOCAL_FORMATS[path.suffix], data_files=str(path), split="train")
    return datasets.load_dataset(source, split=split)


def require_columns(dataset: datasets.Dataset, columns: list[str], source: str) -> None:
    """Raise if ``dataset`` is empty or lacks a column."""
    if len(dataset) == 0:
        raise ValueError(f"dataset {source!r} is empty")
    missing = [c for c in columns if c not in dataset.column_names]
    if missing:
        raise ValueError(f"dataset {source!r} has no column(s) {missing}; its columns are {dataset.column_names}")
