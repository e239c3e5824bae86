"""Synthetic arithmetic word problems in GSM8K format: an offline stand-in for GSM8K.

Each problem is a short plain-English story (shopping, sharing, ages, distances, baking, savings, giving away)
solved in one to three integer steps. A problem is a dict in GSM8K format plus the arithmetic behind it::

    {"question": "Mia has 14 stickers and gives 5 of them to a friend. How many ...?",
     "answer": "Mia has 14 - 5 = 9 stickers left.\\n#### 9",
     "steps": [{"a": 14, "op": "-", "b": 5, "result": 9}]}

``steps`` lists every operation in order; its operands are numbers from the question or results of earlier
steps, and the last result is the answer. Generation is deterministic for a seed, so disjoint seeds give
train and held-out sets.

``pretraining_documents`` renders the same problems as "Question: ...\\nAnswer: ... The answer is N." text for
pre-training a tiny model before RL (:mod:`marllm.assets.offline.base_model`); the arithmetic task
(:func:`marllm.tasks.arithmetic.arithmetic_dataset`) gives them as a ``datasets.Dataset`` with the columns of
:func:`marllm.tasks.gsm8k.load_gsm8k`, so one task definition, reward and pass@k serve both.

The generator needs only the standard library and :func:`~marllm.rewards.math.parse_gsm8k_answer` (no
``datasets``) and imports nothing from :mod:`marllm.tasks`, so the offline pretraining corpus and the arithmetic task
both import it at module level. Changing what it generates for a seed
changes the offline base model: bump :data:`marllm.assets.offline.recipe.RECIPE_VERSION` when it does.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from marllm.rewards.math import parse_gsm8k_answer

__all__ = [
    "OPERATIONS",
    "format_document",
    "generate_problems",
    "pretraining_documents",
    "write_jsonl",
]

OPERATIONS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a // b,  # templates only divide exactly; see _step
}

_NAMES = (
    "Mia", "Liam", "Ava", "Noah", "Zara", "Omar", "Lena", "Kenji", "Priya", "Tomas",
    "Nora", "Felix", "Amara", "Diego", "Hana", "Ivan", "Sofia", "Rahul", "Elsa", "Kofi",
)
_COUNTABLES = (
    "stickers", "marbles", "pencils", "apples", "cards", "shells", "stamps", "beads", "coins", "books",
)
_SHOP_ITEMS = ("notebooks", "pens", "mugs", "tickets", "plants", "scarves", "puzzles", "candles")
_BAKED = ("muffins", "cookies", "rolls", "bagels", "cupcakes", "scones")
_VEHICLES = ("train", "bus", "truck", "car", "ferry", "van")
_GIFTS = ("book", "game", "jacket", "lamp", "backpack", "watch")


class _Story:
    """A question under construction: its sentences of solution and the steps behind them."""

    def __init__(self) -> None:
        self.sentences: list[str] = []
        self.steps: list[dict[str, Any]] = []

    def step(self, a: int, op: str, b: int) -> int:
        result = OPERATIONS[op](a, b)
        if op == "/" and a % b:
            raise AssertionError(f"template divides inexactly: {a} / {b}")
        if result < 0:
            raise AssertionError(f"template produced a negative intermediate: {a} {op} {b}")
        self.steps.append({"a": a, "op": op, "b": b, "result": result})
        return result


def _leftover(rng: random.Random, story: _Story) -> str:
    name, things = rng.choice(_NAMES), rng.choice(_COUNTABLES)
    have = rng.randint(6, 25)
    give = rng.randint(1, have - 1)
    left = story.step(have, "-", give)
    story.sentences.append(f"{name} has {have} - {give} = {left} {things} left.")
    return (
        f"{name} has {have} {things} and gives {give} of them to a friend. "
        f"How many {things} does {name} have left?"
    )


def _shopping(rng: random.Random, story: _Story) -> str:
    name, item = rng.choice(_NAMES), rng.choice(_SHOP_ITEMS)
    count, price = rng.randint(2, 5), rng.randint(2, 9)
    cost = story.step(count, "*", price)
    bill = rng.choice([b for b in (10, 20, 50) if b > cost][:2])
    change = story.step(bill, "-", cost)
    story.sentences.append(f"The {item} cost {count} * {price} = ${cost}.")
    story.sentences.append(f"The change is {bill} - {cost} = ${change}.")
    return (
        f"{name} buys {count} {item} that cost ${price} each and pays with a ${bill} bill. "
        f"How many dollars of change does {name} get back?"
    )


def _sharing(rng: random.Random, story: _Story) -> str:
    name, things = rng.choice(_NAMES), rng.choice(_COUNTABLES)
    friends, each = rng.randint(2, 5), rng.randint(2, 6)
    have = rng.randint(1, friends * each - 1)
    more = friends * each - have
    total = story.step(have, "+", more)
    share = story.step(total, "/", friends)
    story.sentences.append(f"{name} has {have} + {more} = {total} {things}.")
    story.sentences.append(f"Each friend gets {total} / {friends} = {share} {things}.")
    return (
        f"{name} has {have} {things} and buys {more} more. {name} shares all of them equally among "
        f"{friends} friends. How many {things} does each friend get?"
    )


def _ages(rng: random.Random, story: _Story) -> str:
    older, younger = rng.sample(_NAMES, 2)
    age, gap, years = rng.randint(3, 25), rng.randint(2, 12), rng.randint(1, 9)
    now = story.step(age, "+", gap)
    later = story.step(now, "+", years)
    story.sentences.append(f"{older} is {age} + {gap} = {now} years old now.")
    story.sentences.append(f"In {years} years {older} will be {now} + {years} = {later} years old.")
    return (
        f"{younger} is {age} years old. {older} is {gap} years older than {younger}. "
        f"How old will {older} be in {years} years?"
    )


def _distance(rng: random.Random, story: _Story) -> str:
    vehicle = rng.choice(_VEHICLES)
    speed, hours, extra = 10 * rng.randint(1, 6), rng.randint(2, 5), rng.randint(1, 9)
    first = story.step(speed, "*", hours)
    total = story.step(first, "+", extra)
    story.sentences.append(f"In {hours} hours the {vehicle} goes {speed} * {hours} = {first} miles.")
    story.sentences.append(f"In total it goes {first} + {extra} = {total} miles.")
    return (
        f"A {vehicle} travels at {speed} miles per hour for {hours} hours and then goes another "
        f"{extra} miles. How many miles does the {vehicle} travel in total?"
    )


def _bakery(rng: random.Random, story: _Story) -> str:
    goods = rng.choice(_BAKED)
    trays, per_tray = rng.randint(2, 5), rng.randint(3, 9)
    made = story.step(trays, "*", per_tray)
    morning = rng.randint(1, made - 2)
    afternoon = rng.randint(1, made - morning - 1)
    after_morning = story.step(made, "-", morning)
    left = story.step(after_morning, "-", afternoon)
    story.sentences.append(f"The baker makes {trays} * {per_tray} = {made} {goods}.")
    story.sentences.append(f"After the morning, {made} - {morning} = {after_morning} {goods} are left.")
    story.sentences.append(f"After the afternoon, {after_morning} - {afternoon} = {left} {goods} are left.")
    return (
        f"A baker makes {trays} trays with {per_tray} {goods} on each tray. {morning} {goods} are sold "
        f"in the morning and {afternoon} in the afternoon. How many {goods} are left?"
    )


def _savings(rng: random.Random, story: _Story) -> str:
    name, gift = rng.choice(_NAMES), rng.choice(_GIFTS)
    weekly, weeks = rng.randint(2, 9), rng.randint(2, 5)
    saved_total = weekly * weeks
    # keep what is left after the purchase even, so that half of it is a whole number of dollars
    spent = 2 * rng.randint(1, (saved_total - 2) // 2) + saved_total % 2
    saved = story.step(weekly, "*", weeks)
    rest = story.step(saved, "-", spent)
    kept = story.step(rest, "/", 2)
    story.sentences.append(f"{name} saves {weekly} * {weeks} = ${saved}.")
    story.sentences.append(f"After buying the {gift}, {name} has {saved} - {spent} = ${rest}.")
    story.sentences.append(f"{name} keeps {rest} / 2 = ${kept}.")
    return (
        f"{name} saves ${weekly} every week for {weeks} weeks, then spends ${spent} on a {gift} and "
        f"gives half of the money left to a sister. How many dollars does {name} keep?"
    )


_TEMPLATES: tuple[Callable[[random.Random, _Story], str], ...] = (
    _leftover, _shopping, _sharing, _ages, _distance, _bakery, _savings,
)


def _check_count(n: int, name: str = "n") -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{name} must be a non-negative int, got {n!r}")


def generate_problems(n: int, seed: int) -> list[dict[str, Any]]:
    """Generate ``n`` arithmetic word problems in GSM8K format, deterministically for ``seed``.

    Returns dicts with ``question``, ``answer`` (worked steps, one per line, then ``#### N``) and ``steps``
    (``[{"a", "op", "b", "result"}, ...]``, one to three of them; ``op`` is a key of :data:`OPERATIONS`).
    All numbers, intermediate and final, are non-negative integers.
    """
    _check_count(n)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    rng = random.Random(seed)
    problems = []
    for _ in range(n):
        story = _Story()
        question = rng.choice(_TEMPLATES)(rng, story)
        answer = "\n".join(story.sentences) + f"\n#### {story.steps[-1]['result']}"
        problems.append({"question": question, "answer": answer, "steps": story.steps})
    return problems


def format_document(problem: dict[str, Any]) -> str:
    """Render a GSM8K-format problem as ``"Question: <q>\\nAnswer: <worked solution> The answer is <N>."``.

    The worked solution is the answer text before ``####`` on one line; ``N`` is
    :func:`~marllm.rewards.math.parse_gsm8k_answer` of the answer, so the document and the reward agree.
    """
    for key in ("question", "answer"):
        if key not in problem:
            raise KeyError(f"problem has no {key!r} field; its keys are {sorted(problem)}")
    final = parse_gsm8k_answer(problem["answer"])
    solution = " ".join(problem["answer"].rpartition("####")[0].split())
    return f"Question: {problem['question']}\nAnswer: {solution} The answer is {final}."


def pretraining_documents(n: int, seed: int) -> list[str]:
    """``n`` worked arithmetic word problems as plain-text documents, deterministic for ``seed``.

    Each is ``"Question: <question>\\nAnswer: <worked solution> The answer is <N>."`` for the problem that
    :func:`generate_problems` gives with the same ``n`` and ``seed``.
    """
    return [format_document(problem) for problem in generate_problems(n, seed)]


def write_jsonl(problems: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write problems one JSON object per line to ``path`` (parent folders are created); returns the path.

    The file loads with ``load_gsm8k(path)``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for index, problem in enumerate(problems):
            if not isinstance(problem, dict):
                raise TypeError(f"problem {index} must be a dict, got {type(problem).__name__}")
            handle.write(json.dumps(problem, ensure_ascii=False) + "\n")
    return path
