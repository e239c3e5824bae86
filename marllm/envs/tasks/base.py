"""What a task gives the environment: queries, default prompt templates and a reward function."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
from datasets.exceptions import DatasetGenerationError

from marllm.envs.tasks.local_files import check_local_file, text_problem
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


def load_text_dataset(source: str, split: str, text_columns: Sequence[str] = ()) -> datasets.Dataset:
    """A local file (.csv/.json/.jsonl/.parquet/.txt) or a hub dataset id, as one ``datasets.Dataset`` split.

    A local file is read once before ``datasets`` parses it (see :func:`~marllm.envs.tasks.local_files.
    check_local_file`): an empty file, a line that is not UTF-8 or not a JSON object, or a ``text_columns`` value
    that is not a non-blank string raises ``ValueError`` naming the file and the line.
    """
    path = Path(source).expanduser()
    if path.suffix in _LOCAL_FORMATS or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"dataset file {source!r} does not exist")
        if path.suffix not in _LOCAL_FORMATS:
            raise ValueError(f"dataset file {source!r}: unsupported format; use one of {sorted(_LOCAL_FORMATS)}")
        check_local_file(path, text_columns)
        return read_local_file(path)
    return datasets.load_dataset(source, split=split)


def read_local_file(path: Path) -> datasets.Dataset:
    """A checked local file as a dataset; one ``datasets`` cannot parse raises ``ValueError`` naming it."""
    kind = _LOCAL_FORMATS[path.suffix]
    try:
        return datasets.load_dataset(kind, data_files=str(path), split="train")
    except DatasetGenerationError as error:
        cause = error.__cause__ or error
        raise ValueError(
            f"dataset file {str(path)!r} could not be read as {kind}: {type(cause).__name__}: {cause}"
        ) from error


def require_texts(dataset: datasets.Dataset, columns: Sequence[str], source: str) -> None:
    """Raise ``ValueError`` naming the row (counted from 0) whose value in one of ``columns`` is null, not a string,
    or blank."""
    for column in columns:
        for row, value in enumerate(dataset[column]):
            problem = text_problem(value)
            if problem:
                raise ValueError(f"dataset {source!r}: row {row} (counting from 0): {column!r} {problem}")


def require_columns(dataset: datasets.Dataset, columns: list[str], source: str) -> None:
    """Raise if ``dataset`` is empty or lacks a column."""
    if len(dataset) == 0:
        raise ValueError(f"dataset {source!r} is empty")
    missing = [c for c in columns if c not in dataset.column_names]
    if missing:
        raise ValueError(f"dataset {source!r} has no column(s) {missing}; its columns are {dataset.column_names}")
