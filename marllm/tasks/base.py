"""What a task gives the environment (queries, default prompt templates, a reward function), and loading its data.

:func:`require_texts` is the one check of text values, for data from any source: a hub dataset, a local file (its
errors name the line, see :func:`load_local_file`) or rows built in memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from marllm.envs.text_env import RewardFn
from marllm.tasks.local_files import RowNames, check_local_file, text_problem
from marllm.utils.data_formats import DATA_FORMATS, suffix_list

if TYPE_CHECKING:
    import datasets


@dataclass
class TaskParts:
    """A built task.

    Attributes:
        dataset: training rows, each with a ``query`` field.
        templates: default prompt template per role name (used when the config gives none).
        reward_fn: ``reward_fn(samples, responses) -> one float per sample``, a role-aware reward (a parameter named
            ``context``) or a mapping role -> reward (see :mod:`marllm.envs.reward_context`).
        eval_dataset: rows for evaluating agents (held out from training); None: they are evaluated on ``dataset``.
    """

    dataset: Any
    templates: dict[str, str]
    reward_fn: RewardFn | Mapping[str, RewardFn]
    eval_dataset: Any = None


@runtime_checkable
class Task(Protocol):
    """What a task configuration (the ``task`` section, built into a dataclass) must offer; the tasks of
    :data:`marllm.tasks.TASK_REGISTRY` do, and so may a user's own class, named in a config as
    ``task.name: module:Class`` or ``task.name: file.py:Class``.

    Attributes:
        name: the ``task.name`` it was built from (a custom class needs a ``name: str`` field, which receives the
            reference, so that the config is written back as it was read).

    A task may also say ``binary_reward = True`` (its reward is 0 or 1, so pass@k applies: on the built task's
    ``eval_dataset``, else its ``dataset``, scored by its ``reward_fn``).
    """

    name: str

    def build(self, tokenizer: Any, seed: int, device: str = "auto") -> TaskParts:
        """The training rows (each with a ``query``), default templates, the reward and the evaluation rows."""
        ...

    def default_templates(self) -> dict[str, str]:
        """A prompt template per role name, used where the config's ``env.templates`` gives none."""
        ...

    def check_references(self) -> None:
        """Raise ``ConfigError`` if a file or hub id it names is missing (called before anything loads)."""
        ...


def has_binary_reward(task: Any) -> bool:
    """Whether the task declares a 0/1 reward (``binary_reward``), so that pass@k applies."""
    return getattr(task, "binary_reward", False) is True


def local_file(source: str) -> Path | None:
    """The local path ``source`` names (a data-file suffix, or anything that exists), or None for a hub id."""
    path = Path(source).expanduser()
    return path if path.suffix in DATA_FORMATS or path.exists() else None


def load_text_dataset(
    source: str, split: str, text_columns: Sequence[str] = (), name: str | None = None
) -> datasets.Dataset:
    """A local file (.csv/.json/.jsonl/.parquet/.txt) or a hub dataset id, as one ``datasets.Dataset`` split.

    A local file is checked before ``datasets`` parses it (:func:`load_local_file`); ``split`` applies to a hub
    dataset only. Each of ``text_columns`` must be present (:func:`require_columns`) and hold non-blank strings
    (:func:`require_texts`): a ``ValueError`` names a bad value's line in a local JSON file, else its row in the
    dataset called ``name`` (default ``source``).
    """
    path = local_file(source)
    rows = None
    if path is not None:
        dataset, rows = load_local_file(path, text_columns)
    else:
        import datasets  # 1.2 s to import; the config imports the tasks to check them

        dataset = datasets.load_dataset(source, split=split)
    if text_columns:
        name = name or source
        require_columns(dataset, text_columns, name)
        require_texts(dataset, text_columns, rows or numbered_rows(name))
    return dataset


def load_local_file(path: Path, columns: Sequence[str] = ()) -> tuple[datasets.Dataset, RowNames | None]:
    """A local data file as a dataset, and where its rows are in the file (a JSON file; None for the others).

    ``columns``, the columns the caller needs, only make the example record in messages.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        IsADirectoryError: ``path`` is a directory.
        ValueError: a file :func:`~marllm.tasks.local_files.check_local_file` refuses (the message names the
            file and the line) or ``datasets`` cannot parse.
    """
    if path.is_dir():
        raise IsADirectoryError(f"dataset {str(path)!r} is a directory, not a data file; give a {suffix_list()} file")
    if not path.is_file():
        raise FileNotFoundError(f"dataset file {str(path)!r} does not exist")
    rows = check_local_file(path, columns)
    return read_local_file(path), rows


def read_local_file(path: Path) -> datasets.Dataset:
    """A checked local file as a dataset; one ``datasets`` cannot parse raises ``ValueError`` naming it."""
    import datasets  # 1.2 s to import; the config imports the tasks to check them
    from datasets.exceptions import DatasetGenerationError

    kind = DATA_FORMATS[path.suffix].builder
    try:
        return datasets.load_dataset(kind, data_files=str(path), split="train")
    except DatasetGenerationError as error:
        cause = error.__cause__ or error
        raise ValueError(
            f"dataset file {str(path)!r} could not be read as {kind}: {type(cause).__name__}: {cause}"
        ) from error


def numbered_rows(source: str) -> RowNames:
    """Names row ``i`` of the dataset ``source`` as ``dataset '<source>': row i (counting from 0)``."""
    return lambda row: f"dataset {source!r}: row {row} (counting from 0)"


def require_texts(dataset: datasets.Dataset, columns: Sequence[str], rows: RowNames) -> None:
    """Raise ``ValueError`` ``"<row>: '<column>' <problem>"`` for the first value in ``columns`` that is null, not a
    string, or blank (see :func:`text_problem`); ``rows`` names the row (:func:`numbered_rows`, or a local file's
    lines from :func:`load_local_file`)."""
    for column in columns:
        for row, value in enumerate(dataset[column]):
            problem = text_problem(value)
            if problem:
                raise ValueError(f"{rows(row)}: {column!r} {problem}")


def require_columns(dataset: datasets.Dataset, columns: Sequence[str], source: str) -> None:
    """Raise if ``dataset`` is empty or lacks a column."""
    if len(dataset) == 0:
        raise ValueError(f"dataset {source!r} is empty")
    missing = [c for c in columns if c not in dataset.column_names]
    if missing:
        raise ValueError(f"dataset {source!r} has no column(s) {missing}; its columns are {dataset.column_names}")
