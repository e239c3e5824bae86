"""A local dataset file read once before ``datasets`` parses it, so that every error names the file and the line.

``datasets`` reports an empty JSONL file as ``StopIteration`` and a malformed line or a non-UTF-8 byte deep inside a
long traceback; :func:`check_local_file` finds these first. A JSON Lines file (``.jsonl``, or a ``.json`` file not
starting with ``[``) must hold one JSON object per non-blank line; a ``.json`` file starting with ``[`` must be one
JSON list of objects.

Only the file is checked here. The values in it are checked once the dataset is loaded
(:func:`marllm.tasks.base.require_texts`); :func:`check_local_file` returns where each record of a JSON file
is, so that such an error names the line too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from marllm.utils.data_formats import DATA_FORMATS

__all__ = ["RowNames", "check_local_file", "clip", "text_problem"]

RowNames = Callable[[int], str]
"""Names row ``i`` (counted from 0) of a dataset in an error message, e.g. ``"dataset file 'a.jsonl': line 3"``."""


def check_local_file(path: Path, columns: Sequence[str] = ()) -> RowNames | None:
    """Read ``path`` once and raise ``ValueError`` naming it and the line when it cannot be a dataset.

    Refused: a suffix not in :data:`~marllm.utils.data_formats.DATA_FORMATS`; an empty file; bytes that are not UTF-8;
    in a JSON file a line (or list item) that is not a JSON object, or whose value in one of ``columns`` (the text
    columns the caller needs, which also make the example record that messages show) is neither a string nor null.

    Returns:
        For a JSON file, the names of its rows as ``datasets`` reads them (``dataset file '…': line 3``, or
        ``…: item 2 of the list``); None for the other formats.
    """
    if path.suffix not in DATA_FORMATS:
        raise ValueError(f"{_file(path)}: unsupported format; use one of {sorted(DATA_FORMATS)}")
    if path.suffix == ".parquet":  # binary: only an empty file is refused here
        if path.stat().st_size == 0:
            raise ValueError(f"{_file(path)} is empty; {_expected(path.suffix, columns)}")
        return None
    data = path.read_bytes()
    if not data.strip():
        raise ValueError(f"{_file(path)} is empty; {_expected(path.suffix, columns)}")
    text = _decode(path, data)
    if DATA_FORMATS[path.suffix].builder != "json":
        return None
    if path.suffix == ".json" and text.lstrip().startswith("["):
        _check_json_list(path, text, columns)
        return lambda row: f"{_file(path)}: item {row} of the list"
    lines = _check_json_lines(path, text.split("\n"), columns)
    return lambda row: f"{_file(path)}: line {lines[row]}"


def clip(text: str, limit: int = 80) -> str:
    """``text`` cut to at most ``limit`` characters (ending in ``…`` when cut), for an error message."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _file(path: Path) -> str:
    return f"dataset file {str(path)!r}"


def _expected(suffix: str, columns: Sequence[str]) -> str:
    """What a file of this kind must hold, with an example record made of ``columns``."""
    example = "{" + ", ".join(f'"{column}": "..."' for column in columns or ["text"]) + "}"
    return DATA_FORMATS[suffix].holds.format(example=example)


def _decode(path: Path, data: bytes) -> str:
    """``data`` as text (without a UTF-8 byte-order mark); the line of a non-UTF-8 byte is found only on failure."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line_start = data.rfind(b"\n", 0, error.start) + 1
        number = data.count(b"\n", 0, error.start) + 1
        raise ValueError(
            f"{_file(path)}: line {number} is not UTF-8 text (byte 0x{data[error.start]:02x} at "
            f"byte {error.start - line_start + 1} of the line); save the file as UTF-8"
        ) from error
    return text.removeprefix("\ufeff")


def _check_json_lines(path: Path, lines: list[str], columns: Sequence[str]) -> list[int]:
    """The line number of each record (blank lines hold none, as for ``datasets``)."""
    numbers = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{_file(path)}: line {number} is not valid JSON (column {error.colno}: {error.msg}): "
                f"{clip(line)!r}; {_expected('.jsonl', columns)}"
            ) from error
        _check_record(path, f"line {number}", record, columns)
        numbers.append(number)
    if not numbers:
        raise ValueError(f"{_file(path)} holds only blank lines; {_expected('.jsonl', columns)}")
    return numbers


def _check_json_list(path: Path, text: str, columns: Sequence[str]) -> None:
    try:
        records = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{_file(path)}: not valid JSON at line {error.lineno}, column {error.colno} ({error.msg}); "
            f"{_expected('.json', columns)}"
        ) from error
    if not isinstance(records, list) or not records:
        raise ValueError(f"{_file(path)} holds {clip(text)!r}; {_expected('.json', columns)}")
    for index, record in enumerate(records):
        _check_record(path, f"item {index} of the list", record, columns)


def _check_record(path: Path, where: str, record: Any, columns: Sequence[str]) -> None:
    if not isinstance(record, dict):
        raise ValueError(
            f"{_file(path)}: {where} holds a JSON {type(record).__name__}, not an object; "
            f"{_expected('.jsonl', columns)}"
        )
    for column in columns:
        value = record.get(column)
        # A number or a list among strings makes datasets' (Arrow's) type inference fail with its own error, or not,
        # depending on its version: named here, before it parses. Null and blank texts are require_texts' to name.
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{_file(path)}: {where}: {column!r} {text_problem(value)}")


def text_problem(value: Any) -> str | None:
    """What is wrong with ``value`` as a text (``"is null ..."``), or None for a string with a visible character."""
    if value is None:
        return "is null; it must be a non-empty string"
    if not isinstance(value, str):
        return f"is {type(value).__name__} {clip(repr(value))}; it must be a non-empty string"
    if not value.strip():
        return f"is {clip(repr(value))}: empty or only whitespace; it must hold text"
    return None
