"""GSM8K: loading, validation and the CORY prompt templates.

Rows are ``{"question": str, "answer": str}`` where ``answer`` is a worked solution ending in
``#### <number>``. :func:`load_gsm8k` reads the hub dataset or a local JSON/JSONL file, checks every row, and
adds the columns the rest of marllm uses: ``query`` (the text a prompt template puts after ``Question:``) and
``ground_truth`` (the final number as text, e.g. ``"1018"``).

The templates use ``str.format`` fields ``{query}`` and, for the observer, ``{pioneer}`` (the pioneer's
response).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from marllm.rewards.math import parse_gsm8k_answer
from marllm.tasks.base import load_local_file, require_texts
from marllm.tasks.local_files import RowNames
from marllm.utils.data_formats import JSON_SUFFIXES, suffix_list

__all__ = [
    "GSM8K_FEW_SHOT",
    "OBSERVER_TEMPLATE",
    "PIONEER_TEMPLATE",
    "load_gsm8k",
    "prepare_math_dataset",
]

GSM8K_FEW_SHOT = (
    "Question: A gardener plants 4 rows of 7 tulips. Rabbits eat 5 of the tulips and the gardener picks 9 "
    "more for a vase. How many tulips are still growing?\n"
    "Answer: The gardener plants 4 * 7 = 28 tulips. After the rabbits, 28 - 5 = 23 tulips are left. "
    "After picking, 23 - 9 = 14 tulips are still growing. The answer is 14.\n\n"
)

if TYPE_CHECKING:
    import datasets
"""One worked example shown before every question (written for marllm, not taken from GSM8K)."""

PIONEER_TEMPLATE = GSM8K_FEW_SHOT + "Question: {query}\nAnswer:"
"""Prompt of the agent that answers from the query alone."""

OBSERVER_TEMPLATE = GSM8K_FEW_SHOT + "Question: {query}\nReference: {pioneer}\nAnswer:"
"""Prompt of the agent that answers after reading the pioneer's response."""

_REQUIRED_COLUMNS = ("question", "answer")
_ADDED_COLUMNS = ("query", "ground_truth")
_FOLDER_SUFFIXES = tuple(sorted(JSON_SUFFIXES, key=lambda suffix: suffix != ".jsonl"))  # GSM8K's .jsonl first


def prepare_math_dataset(
    dataset: datasets.Dataset, source: str = "dataset", rows: RowNames | None = None
) -> datasets.Dataset:
    """Validate a GSM8K-format dataset and add its ``query`` and ``ground_truth`` columns.

    Existing ``query`` / ``ground_truth`` columns (e.g. in a file saved from an earlier prepared dataset) are
    recomputed from ``question`` / ``answer``. ``rows`` names a row whose question is not text (default
    ``<source>: row i has no question text``; for a local file, its line: see
    :func:`~marllm.tasks.base.load_local_file`).

    Raises:
        ValueError: the dataset is empty, lacks ``question`` or ``answer``, has a question that is not
            a non-empty string, or has an answer that does not end in ``#### <number>``; the message names
            ``source`` and the offending column or row (index, or line of a local file).
    """
    import datasets  # 1.2 s to import; the config imports the tasks to check them

    if not isinstance(dataset, datasets.Dataset):
        raise TypeError(f"{source}: expected a datasets.Dataset, got {type(dataset).__name__}")
    missing = [column for column in _REQUIRED_COLUMNS if column not in dataset.column_names]
    if missing:
        raise ValueError(
            f"{source}: missing column(s) {missing}; GSM8K-format data needs {list(_REQUIRED_COLUMNS)}, "
            f"the columns present are {dataset.column_names}"
        )
    if len(dataset) == 0:
        raise ValueError(f"{source}: the dataset is empty")
    require_texts(dataset, ["question"], rows or (lambda row: f"{source}: row {row} has no question text"))
    ground_truths = []
    for index, answer in enumerate(dataset["answer"]):
        try:
            ground_truths.append(parse_gsm8k_answer(answer))
        except (TypeError, ValueError) as error:
            raise ValueError(f"{source}: row {index}: {error}") from error
    stale = [column for column in _ADDED_COLUMNS if column in dataset.column_names]
    if stale:
        dataset = dataset.remove_columns(stale)
    dataset = dataset.add_column("query", list(dataset["question"]))
    return dataset.add_column("ground_truth", ground_truths)


def _resolve_local(source: str, split: str) -> Path | None:
    """The local JSON/JSONL file ``source`` names, or ``None`` when ``source`` is a hub id."""
    path = Path(source).expanduser()
    if path.is_dir():
        candidates = [path / f"{split}{suffix}" for suffix in _FOLDER_SUFFIXES]
        for candidate in candidates:
            if candidate.is_file():
                return candidate
        present = sorted(child.name for child in path.iterdir())
        raise FileNotFoundError(
            f"GSM8K folder {str(path)!r} has no {' or '.join(c.name for c in candidates)} for split {split!r}; "
            f"it contains {present}"
        )
    if path.suffix in JSON_SUFFIXES:
        if not path.is_file():
            raise FileNotFoundError(f"GSM8K file not found: {str(path)!r}")
        return path
    if path.exists():
        raise ValueError(
            f"GSM8K source {str(path)!r} is a local file but not {'/'.join(JSON_SUFFIXES)}; "
            f"give a {suffix_list(JSON_SUFFIXES)} file, a folder holding <split>.jsonl, or a hub dataset id"
        )
    return None


def load_gsm8k(source: str = "openai/gsm8k", split: str = "train", config: str = "main") -> datasets.Dataset:
    """Load GSM8K-format problems, validate them and add ``query`` and ``ground_truth`` columns.

    Args:
        source: a local ``.json`` / ``.jsonl`` file, a folder holding ``<split>.jsonl`` (or ``<split>.json``),
            or a dataset id for ``datasets.load_dataset`` (default: the hub's ``openai/gsm8k``).
        split: the split to load (``"train"`` or ``"test"`` for GSM8K; the 1,319-question test split is the
            paper's pass@k benchmark). Ignored for a single local file, which is all one split.
        config: the hub dataset configuration (``"main"`` or ``"socratic"`` for GSM8K); unused for local
            files.

    Raises:
        FileNotFoundError: a local path that does not exist, or a folder without the split's file.
        ValueError: a local file that is empty, not UTF-8 or holds a line that is not a JSON object (the message
            names the line), or data that fails :func:`prepare_math_dataset`'s checks.
    """
    local = _resolve_local(source, split)
    if local is None:
        import datasets  # 1.2 s to import; the config imports the tasks to check them

        dataset = datasets.load_dataset(source, config, split=split)
        return prepare_math_dataset(dataset, source=f"{source} ({config}, {split})")
    dataset, rows = load_local_file(local, _REQUIRED_COLUMNS)
    return prepare_math_dataset(dataset, source=str(local), rows=rows)
