"""The architecture page says in which files a PPO update reads, in order: a tiny update traced from
``PPOLearner.update`` enters the algorithm layer's files in exactly that order (each at its first call), so the page
changes when the code does."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.test_ppo_learner import make_learner

ROOT = Path(__file__).resolve().parents[1]
ALGORITHMS = ROOT / "marllm" / "algorithms"
PAGE = ROOT / "docs" / "design" / "architecture.md"
ROUTE_LINE = "A PPO update, traced from `PPOLearner.update`, reads in"


def documented_route() -> list[str]:
    """The ``*.py`` files the page's route sentence names, in its order (paths under ``marllm/algorithms/``): the
    paragraph that starts with :data:`ROUTE_LINE`, up to its first semicolon."""
    paragraphs = [" ".join(part.split()) for part in PAGE.read_text(encoding="utf-8").split("\n\n")]
    paragraph = next(part for part in paragraphs if part.startswith(ROUTE_LINE))
    return re.findall(r"`([\w/]+\.py)`", paragraph.split(";")[0])


def traced_route(learner) -> list[str]:
    """The algorithm layer's files that ``learner.update()`` calls into, each at its first call, in order."""
    entered: list[str] = []

    def profile(frame, event, _arg):
        filename = frame.f_code.co_filename
        if event == "call" and filename.startswith(str(ALGORITHMS)):
            name = Path(filename).relative_to(ALGORITHMS).as_posix()
            if name not in entered:
                entered.append(name)

    sys.setprofile(profile)
    try:
        learner.update()
    finally:
        sys.setprofile(None)
    return entered


def test_a_ppo_update_reads_in_the_files_the_architecture_page_names_in_its_order(tokenizer):
    learner = make_learner(tokenizer)
    learner.act({"prompt": ["a", "b", "c", "d"] * 2})
    learner.finish([1.0, 0.0, 0.5, 0.0] * 2)
    documented = documented_route()
    assert documented, f"{PAGE.name} has no route sentence starting {ROUTE_LINE!r}"
    assert traced_route(learner) == documented
