"""A plain text task: prompts from a dataset, used as written, scored by a reward function named by import path.

Query: a dataset column (``query_column``), as written: not cut, not filtered (a prompt too long for the model's
context is the generation's error, naming it). Prompts: the config's ``env.templates`` (``"{query}"`` uses the
query as written; any column of the row is a field). Reward: ``task.reward``, a function named as
``package.module:name`` or ``file.py:name`` (relative to the config's folder), or one per role; it may be
role-aware (a parameter named ``context``: see :mod:`marllm.envs.reward_context`). It is imported and its signature
checked when the config is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from marllm.assets.references import check_dataset_reference
from marllm.envs.reward_context import check_reward, rewards_by_role
from marllm.tasks.base import TaskParts, load_text_dataset, local_file
from marllm.utils.data_formats import suffix_list
from marllm.utils.errors import ConfigError
from marllm.utils.imports import load_reference

if TYPE_CHECKING:
    import datasets

QUERY = "query"


@dataclass(kw_only=True)
class TextTask:
    """Configuration of the plain text task (``task.name: text``).

    Attributes:
        dataset: a local ``.jsonl``/``.json``/``.csv``/``.parquet``/``.txt`` file or a hub dataset id.
        reward: the task reward: ``package.module:name`` or ``path/file.py:name`` (a relative path is relative to
            the config file's folder), or a mapping role -> such a reference (every role named once). The function
            is ``reward(samples, responses) -> one float per sample`` or, to know the role and see the dialogue,
            ``reward(samples, responses, context)``.
        split: training split (hub datasets; a local file is one split).
        eval_dataset: where the evaluation prompts come from, when not from ``dataset`` (a second local file, or
            another hub dataset).
        eval_split: split of the evaluation prompts (a hub dataset's; default ``split``). With neither
            ``eval_dataset`` nor ``eval_split`` the agents are evaluated (``marllm eval``, the end-of-run samples)
            on the training prompts, and the report and ``marllm eval`` say so.
        query_column: the column holding each prompt's query, used as written (copied to ``query`` if named
            otherwise).
        max_samples: keep at most the first this many training rows (null: all).
        binary_reward: the reward is 0 or 1 (success or failure), so that pass@k applies
            (``logging.pass_at_k``, ``marllm eval --pass-k``).
    """

    name: Literal["text"] = "text"
    dataset: str
    reward: str | dict[str, str]
    split: str = "train"
    eval_dataset: str | None = None
    eval_split: str | None = None
    query_column: str = QUERY
    max_samples: int | None = None
    binary_reward: bool = False
    reward_fn: Any = field(init=False, repr=False, compare=False, default=None)
    """The imported reward (a function, or a dict role -> function), checked."""

    def __post_init__(self) -> None:
        if not self.dataset.strip():
            raise ConfigError("task.dataset must name a local data file or a hub dataset")
        if self.max_samples is not None and self.max_samples < 1:
            raise ConfigError(f"task.max_samples must be >= 1 or null, got {self.max_samples}")
        self.reward_fn = load_reward(self.reward)

    def check_roles(self, roles: list[str]) -> None:
        """A reward per role must name exactly ``roles`` (``env.roles``)."""
        if isinstance(self.reward, dict):
            try:
                rewards_by_role(self.reward_fn, roles, "task.reward")
            except (TypeError, ValueError) as error:
                raise ConfigError(str(error)) from None

    def check_references(self) -> None:
        """Check that ``dataset`` exists, locally or in the cache while the hub is offline."""
        check_dataset_reference(self.dataset, "task.dataset", f"a local {suffix_list()} file")
        if self.eval_dataset is not None:
            check_dataset_reference(self.eval_dataset, "task.eval_dataset", f"a local {suffix_list()} file")

    def default_templates(self) -> dict[str, str]:
        """None: the config's ``env.templates`` says how each role's prompt is made."""
        return {}

    @property
    def held_out(self) -> bool:
        """Whether the evaluation prompts are other than the training prompts."""
        return self.eval_dataset is not None or (self.eval_split is not None and self.eval_split != self.split)

    def load_split(self, split: str | None, source: str | None = None) -> datasets.Dataset:
        """The rows of ``split`` (None: the training split) of ``source`` (None: ``dataset``) with a ``query``
        column of non-blank text."""
        split = self.split if split is None else split
        source = self.dataset if source is None else source
        rows = load_text_dataset(source, split, [self.query_column], name=f"{source}:{split}")
        if self.query_column != QUERY:
            if QUERY in rows.column_names:
                raise ValueError(
                    f"dataset {source!r} has a {QUERY!r} column besides task.query_column "
                    f"{self.query_column!r}: rename one of them"
                )
            rows = rows.add_column(QUERY, list(rows[self.query_column]))
        return rows

    def build(self, tokenizer: Any, seed: int, device: str = "auto") -> TaskParts:
        """The training rows (the first ``max_samples``), the evaluation rows (None without ``eval_split``) and the
        reward. ``tokenizer``, ``seed`` and ``device`` are not used: the prompts are used as written."""
        train = self.load_split(self.split)
        if self.max_samples is not None:
            train = train.select(range(min(self.max_samples, len(train))))
        evaluation = None
        if self.held_out:
            if self.eval_dataset is None and local_file(self.dataset) is not None:
                raise ValueError(
                    f"task.eval_split {self.eval_split!r}: a local file is one split; name the evaluation prompts' "
                    "file as task.eval_dataset, or leave eval_split null to evaluate on the training prompts"
                )
            evaluation = self.load_split(self.eval_split, self.eval_dataset)
        return TaskParts(dataset=train, templates={}, reward_fn=self.reward_fn, eval_dataset=evaluation)

    def reward(self, device: str = "auto") -> Any:
        """The imported reward function (or the mapping role -> function)."""
        return self.reward_fn


def load_reward(reference: Any, key: str = "task.reward") -> Any:
    """The reward function ``reference`` names (or a dict role -> function for a mapping of references), imported
    and checked: a missing module, a missing name or a callable that is not a reward is a ``ConfigError``."""
    if isinstance(reference, dict):
        if not reference:
            raise ConfigError(f"{key} maps no role to a reward; name one reward, or one per role")
        return {role: load_reward(each, f"{key}.{role}") for role, each in reference.items()}
    try:
        reward = load_reference(reference)
    except ValueError as error:
        raise ConfigError(f"{key}: {error}") from None
    try:
        check_reward(reward, key)
    except TypeError as error:
        raise ConfigError(str(error)) from None
    return reward
