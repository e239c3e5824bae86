"""Checks of what the text env is given: the dataset it draws queries from, and the actions agents answer with."""

from __future__ import annotations

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


def describe_action(action: Any) -> str:
    if isinstance(action, str):
        return "a single str"
    if isinstance(action, Sequence):
        return f"a {type(action).__name__} of {len(action)} items"
    return repr(type(action).__name__)
