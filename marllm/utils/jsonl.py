"""JSON-lines files: one reader with one policy for the lines that are not a JSON object.

Blank lines are skipped. A last line without its newline that does not parse is a line cut short by a killed
writer: it is left out (with a warning, unless ``torn_last_line="skip"``) — what an appending writer leaves when it
dies. Any other line that is not a JSON object is an error naming the file and the line: a run's metrics are never
read with a line silently missing from their middle.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

__all__ = ["read_jsonl", "write_jsonl"]


def read_jsonl(
    path: str | Path, torn_last_line: Literal["warn", "skip", "raise"] = "warn"
) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every non-blank line of ``path`` (see the module docs for bad lines).

    Raises:
        ValueError: a line that is not a JSON object (other than a torn last line, unless ``torn_last_line`` is
            ``"raise"``), naming the file and the line.
    """
    path = Path(path)
    with path.open(encoding="utf-8") as handle:
        lines = handle.readlines()
    records = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as error:
            if number == len(lines) and not text.endswith("\n") and torn_last_line != "raise":
                if torn_last_line == "warn":
                    warnings.warn(f"{path}:{number}: leaving out a last line cut short ({error.msg})", stacklevel=2)
                continue
            raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from error
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        records.append((number, record))
    return records


def write_jsonl(rows: Iterable[dict[str, Any]], path: str | Path) -> None:
    """Write one JSON object per line (UTF-8, non-ASCII kept)."""
    with Path(path).open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
