"""Checks of what the text env is given: the dataset it draws queries from, its batch and group sizes, and the
actions agents answer with."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any


def check_dataset(dataset: Any, query_column: str) -> tuple[int, list[str]]:
    try:
        num_rows = len(dataset)
    except TypeError as error:
        kind = type(dataset).__name__
        raise TypeError(f"dataset must be a datasets.Dataset or a list of dicts, got {kind}") from error
    if num_rows == 0:
        raise ValueError("dataset is empty: it needs at least one row with a query")
    columns = getattr(dataset, "column_names", None)
    if columns is None:
        first = dataset[0]
        if not isinstance(first, Mapping):
            raise TypeError(f"dataset rows must be dicts, row 0 is {type(first).__name__}")
        columns = list(first)
        missing_rows = [i for i, row in enumerate(dataset) if query_column not in row]
        if missing_rows:
            raise ValueError(f"dataset rows {missing_rows[:10]} have no {query_column!r} field (row 0 has {columns})")
    if query_column not in columns:
        raise ValueError(f"dataset has no query column {query_column!r}; its columns are {list(columns)}")
    return num_rows, list(columns)


def check_batch_sizes(batch_size: int, group_size: int) -> None:
    """``batch_size`` and ``group_size`` must be positive ints, and ``group_size`` must divide ``batch_size``."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if batch_size % group_size:
        raise ValueError(
            f"group_size {group_size} must divide batch_size {batch_size} (a batch holds whole groups of one query)"
        )


def warn_if_queries_repeat(num_rows: int, batch_size: int, group_size: int) -> None:
    """Warn, on behalf of the env's caller, when a batch of ``batch_size`` dialogues (``batch_size / group_size``
    queries) asks for more queries than the dataset's ``num_rows``."""
    queries_per_batch = batch_size // group_size
    if num_rows < queries_per_batch:
        warnings.warn(
            f"the dataset has {num_rows} row(s) but a batch asks for {queries_per_batch} queries "
            f"(batch_size {batch_size} / group_size {group_size}): every batch repeats queries "
            "(a new shuffled pass starts when one runs out)",
            stacklevel=3,  # the caller of the env's __init__
        )


def describe_action(action: Any) -> str:
    if isinstance(action, str):
        return "a single str"
    if isinstance(action, Sequence):
        return f"a {type(action).__name__} of {len(action)} items"
    return repr(type(action).__name__)
