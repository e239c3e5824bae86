"""Markdown tables whose cells survive arbitrary model output."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

MISSING = "–"

# Backslash first, so the escapes added for the other characters are not escaped again.
_SPECIAL = re.compile(r"([\\|`*_<>\[\]])")


def escape_cell(text: str) -> str:
    """Text safe inside one markdown table cell.

    Pipes and backslashes would break the row; ``* _ ` < > [ ]`` would turn model output into emphasis, code,
    HTML or links. Line breaks become ``<br>`` so a multi-line response stays in its cell.
    """
    text = _SPECIAL.sub(r"\\\1", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", " ")
    return text.replace("\n", "<br>")


def fmt(value: float | None, digits: int = 4) -> str:
    """A number with ``digits`` significant digits, or a dash for a missing / NaN value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    return f"{value:.{digits}g}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, escape: bool = True) -> str:
    """A GitHub-flavoured markdown table; the header is escaped, the body too unless ``escape`` is False."""
    if any(len(row) != len(header) for row in rows):
        raise ValueError(f"every row must have {len(header)} cells, like the header {list(header)}")

    def line(cells: Sequence[str], escaped: bool) -> str:
        return "| " + " | ".join(escape_cell(c) if escaped else c for c in cells) + " |"

    body = [line(row, escape) for row in rows]
    return "\n".join([line(header, True), "|" + "---|" * len(header), *body])
