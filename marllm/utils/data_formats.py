"""The local data-file formats marllm reads, by suffix: the one list that references, loaders and messages use.

It imports nothing from marllm, so :mod:`marllm.utils.references` and :mod:`marllm.tasks` can both import it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DATA_FORMATS", "DATA_SUFFIXES", "DataFormat", "JSON_SUFFIXES", "suffix_list"]


@dataclass(frozen=True)
class DataFormat:
    """One local data-file format.

    Attributes:
        builder: the ``datasets`` builder that reads it (``datasets.load_dataset(builder, data_files=...)``).
        holds: what such a file must hold, for error messages; ``{example}`` stands for an example JSON record.
    """

    builder: str
    holds: str


DATA_FORMATS: dict[str, DataFormat] = {
    ".csv": DataFormat("csv", "it must hold a header line of column names, then one row per line"),
    ".json": DataFormat(
        "json", "it must hold one JSON object per line, such as {example}, or one JSON list of such objects"
    ),
    ".jsonl": DataFormat("json", "it must hold one JSON object per line, such as {example}"),
    ".parquet": DataFormat("parquet", "it must be a Parquet table"),
    ".txt": DataFormat("text", "it must hold one text per line"),
}
"""Suffix -> format, for every local data file marllm reads."""

DATA_SUFFIXES = tuple(DATA_FORMATS)
"""The suffixes of :data:`DATA_FORMATS`: ``(".csv", ".json", ".jsonl", ".parquet", ".txt")``."""

JSON_SUFFIXES = tuple(suffix for suffix, form in DATA_FORMATS.items() if form.builder == "json")
"""The JSON suffixes: ``(".json", ".jsonl")``."""


def suffix_list(suffixes: tuple[str, ...] = DATA_SUFFIXES) -> str:
    """``suffixes`` as prose: ``".csv, .json, .jsonl, .parquet or .txt"``."""
    return suffixes[0] if len(suffixes) == 1 else f"{', '.join(suffixes[:-1])} or {suffixes[-1]}"
