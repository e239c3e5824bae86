"""Math word problems with a rule-based reward: GSM8K (hub or local file) and generated arithmetic.

Query: the question. Pioneer prompt: one worked example, ``Question: <q>``, ``Answer:``. Observer prompt: the same
with ``Reference: <pioneer response>`` before ``Answer:``. Reward: 1 if the last number of the response equals the
ground truth, else 0 (so pass@k applies).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

from transformers import PreTrainedTokenizerBase

from marllm.assets.references import check_dataset_reference
from marllm.rewards.math import ExactMatchReward
from marllm.tasks.arithmetic import arithmetic_dataset
from marllm.tasks.base import TaskParts
from marllm.tasks.gsm8k import OBSERVER_TEMPLATE, PIONEER_TEMPLATE, load_gsm8k
from marllm.utils.data_formats import JSON_SUFFIXES, suffix_list

if TYPE_CHECKING:
    import datasets


@dataclass
class MathTask:
    """Configuration of a math task.

    Attributes:
        name: ``gsm8k`` (``openai/gsm8k`` or a local JSON/JSONL file in its format) or ``arithmetic`` (problems
            generated in-project from a seed, in the same format).
        dataset: for gsm8k, the hub id or local file/directory.
        config: the hub dataset configuration (gsm8k: ``main``).
        split, eval_split: training split and the split pass@k is measured on.
        max_samples: keep at most this many training problems (None: all).
        num_problems, eval_problems: arithmetic only: how many training / evaluation problems to generate.
        train_seed, eval_seed: arithmetic only: generator seeds of the two sets (distinct seeds, distinct problems).
        stop_strings: the reward cuts a response at the first of these before taking its last number (empty by
            default, as in the paper).
    """

    name: Literal["gsm8k", "arithmetic"] = "gsm8k"
    dataset: str = "openai/gsm8k"
    config: str = "main"
    split: str = "train"
    eval_split: str = "test"
    max_samples: int | None = None
    num_problems: int = 2000
    eval_problems: int = 200
    train_seed: int = 1001
    eval_seed: int = 2002
    stop_strings: list[str] = field(default_factory=list)
    binary_reward: ClassVar[bool] = True
    """The reward is 1 for the right answer and 0 otherwise: pass@k applies."""

    def __post_init__(self) -> None:
        for key in ("num_problems", "eval_problems"):
            if getattr(self, key) < 1:
                raise ValueError(f"task.{key} must be >= 1, got {getattr(self, key)}")
        if self.max_samples is not None and self.max_samples < 1:
            raise ValueError(f"task.max_samples must be >= 1 or null, got {self.max_samples}")
        if self.name == "arithmetic" and self.train_seed == self.eval_seed:
            raise ValueError("task.train_seed and task.eval_seed must differ so evaluation problems are new")

    def check_references(self) -> None:
        """For gsm8k, check that ``dataset`` exists, locally or in the cache while the hub is offline."""
        if self.name == "gsm8k":
            local = f"a local {suffix_list(JSON_SUFFIXES)} file, a folder holding <split>.jsonl"
            check_dataset_reference(self.dataset, "task.dataset", local, directory=True)

    def load_split(self, split: str) -> datasets.Dataset:
        """Problems of one split with ``question``, ``answer``, ``query`` and ``ground_truth`` columns."""
        if self.name == "arithmetic":
            if split == self.split:
                return arithmetic_dataset(self.num_problems, self.train_seed)
            if split == self.eval_split:
                return arithmetic_dataset(self.eval_problems, self.eval_seed)
            raise ValueError(f"arithmetic task has splits {[self.split, self.eval_split]}, not {split!r}")
        return load_gsm8k(self.dataset, split=split, config=self.config)

    def build(self, tokenizer: PreTrainedTokenizerBase, seed: int, device: str = "auto") -> TaskParts:
        train = self.load_split(self.split)
        if self.max_samples is not None:
            train = train.select(range(min(self.max_samples, len(train))))
        return TaskParts(
            dataset=train,
            templates=self.default_templates(),
            reward_fn=self.reward(device),
            eval_dataset=self.load_split(self.eval_split),
        )

    def default_templates(self) -> dict[str, str]:
        return {"pioneer": PIONEER_TEMPLATE, "observer": OBSERVER_TEMPLATE}

    def reward(self, device: str = "auto") -> ExactMatchReward:
        """1 if the last number of the response equals the ground truth, else 0."""
        return ExactMatchReward("answer", self.stop_strings)
