"""A local dataset file read once before ``datasets`` parses it, so that every error names the file and the line.

``datasets`` reports an empty JSONL file as ``StopIteration`` and a malformed line or a non-UTF-8 byte deep inside a
long traceback; :func:`check_local_file` finds these first. A JSON Lines file (``.jsonl``, or a ``.json`` file not
starting with ``[``) must hold one JSON object per non-blank line; a ``.json`` file starting with ``[`` must be one
JSON list of objects.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["check_local_file", "text_problem"]

_EXPECTED = {
    ".jsonl": "it must hold one JSON object per line, such as {example}",
    ".json": "it must hold one JSON object per line, such as {example}, or one JSON list of such objects",
    ".csv": "it must hold a header line of column names, then one row per line",
    ".txt": "it must hold one text per line",
    ".parquet": "it must be a Parquet table",
}


def text_problem(value: Any) -> str | None:
    """What is wrong with ``value`` as a text (``"is null ..."``), or None for a string with a visible character."""
    if value is None:
        return "is null; it must be a non-empty string"
    if not isinstance(value, str):
        return f"is {type(value).__name__} {_clip(repr(value))}; it must be a non-empty string"
    if not value.strip():
        return f"is {_clip(repr(value))}: empty or only whitespace; it must hold text"
    return None


def check_local_file(path: Path, text_columns: Sequence[str] = ()) -> None:
    """Read ``path`` once and raise ``ValueError`` naming it and the line when it cannot be a dataset.

    Refused: an empty file; a line that is not UTF-8; in JSON files a line (or list item) that is not a JSON
    object, or whose value for one of ``text_columns`` is not a non-blank string (see :func:`text_problem`).
    """
    data = path.read_bytes()
    if not data.strip():
        raise ValueError(f"dataset file {str(path)!r} is empty; {_expected(path.suffix, text_columns)}")
    if path.suffix == ".parquet":
        return
    lines = _decode_lines(path, data)
    if path.suffix == ".json" and data.lstrip().startswith(b"["):
        _check_json_list(path, "\n".join(lines), text_columns)
    elif path.suffix in (".json", ".jsonl"):
        _check_json_lines(path, lines, text_columns)


def _expected(suffix: str, text_columns: Sequence[str]) -> str:
    """What a file of this kind must hold, with an example record made of ``text_columns``."""
    example = "{" + ", ".join(f'"{column}": "..."' for column in text_columns or ["text"]) + "}"
    return _EXPECTED.get(suffix, "it must hold rows").format(example=example)


def _decode_lines(path: Path, data: bytes) -> list[str]:
    lines = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise ValueError(
                f"dataset file {str(path)!r}: line {number} is not UTF-8 text (byte 0x{raw[error.start]:02x} at "
                f"byte {error.start + 1} of the line); save the file as UTF-8"
            ) from error
    if lines and lines[0].startswith("\ufeff"):
        lines[0] = lines[0][1:]  # a UTF-8 byte-order mark
    return lines


def _check_json_lines(path: Path, lines: list[str], text_columns: Sequence[str]) -> None:
    records = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"dataset file {str(path)!r}: line {number} is not valid JSON (column {error.colno}: {error.msg}): "
                f"{_clip(line)!r}; {_expected('.jsonl', text_columns)}"
            ) from error
        _check_record(path, f"line {number}", record, text_columns)
        records += 1
    if records == 0:
        raise ValueError(f"dataset file {str(path)!r} holds only blank lines; {_expected('.jsonl', text_columns)}")


def _check_json_list(path: Path, text: str, text_columns: Sequence[str]) -> None:
    try:
        records = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"dataset file {str(path)!r}: not valid JSON at line {error.lineno}, column {error.colno} ({error.msg}); "
            f"{_expected('.json', text_columns)}"
        ) from error
    if not isinstance(records, list) or not records:
        raise ValueError(f"dataset file {str(path)!r} holds {_clip(text)!r}; {_expected('.json', text_columns)}")
    for index, record in enumerate(records):
        _check_record(path, f"item {index} of the list", record, text_columns)


def _check_record(path: Path, where: str, record: Any, text_columns: Sequence[str]) -> None:
    if not isinstance(record, dict):
        raise ValueError(
            f"dataset file {str(path)!r}: {where} holds a JSON {type(record).__name__}, not an object; "
            f"{_expected('.jsonl', text_columns)}"
        )
    for column in text_columns:
        problem = text_problem(record[column]) if column in record else None
        if problem:
            raise ValueError(f"dataset file {str(path)!r}: {where}: {column!r} {problem}")


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
