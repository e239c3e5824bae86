"""The arithmetic task's data: generated word problems as a ``datasets.Dataset`` in GSM8K's columns.

The problems themselves come from :mod:`marllm.assets.offline.arithmetic_problems`, the generator that the offline base
model's pretraining corpus uses too; this module only turns them into the dataset that
:class:`~marllm.tasks.math.MathTask` draws queries from, with the columns of :func:`marllm.tasks.gsm8k.load_gsm8k`, so
one task definition, reward and pass@k serve both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from marllm.assets.offline.arithmetic_problems import generate_problems
from marllm.tasks.gsm8k import prepare_math_dataset

if TYPE_CHECKING:
    import datasets

__all__ = ["arithmetic_dataset"]


def arithmetic_dataset(n: int, seed: int) -> datasets.Dataset:
    """``n`` generated problems as a ``datasets.Dataset`` with the columns of ``load_gsm8k`` output.

    Columns: ``question``, ``answer``, ``query`` (= question) and ``ground_truth`` (the final number as text).
    The problems are :func:`~marllm.assets.offline.arithmetic_problems.generate_problems` ``(n, seed)``.
    """
    problems = generate_problems(n, seed)  # checks n and seed
    if not problems:
        raise ValueError("arithmetic_dataset needs n >= 1 problems, got 0")
    rows = {key: [problem[key] for problem in problems] for key in ("question", "answer")}
    import datasets  # 1.2 s to import; the config imports the tasks to check them

    return prepare_math_dataset(datasets.Dataset.from_dict(rows), source=f"arithmetic(n={n}, seed={seed})")
