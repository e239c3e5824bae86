"""Answer parsers: which legal move (if any) an answer names, and the registry they are looked up in by name.

A parser is ``parser(answer, moves) -> index or None``: ``moves`` are the legal move names in the order the prompt
lists them, the index is into that list, None means the answer names no legal move (an illegal answer).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

Parser = Callable[[str, Sequence[str]], int | None]
"""``parser(answer, legal_move_names) -> index into legal_move_names, or None for an illegal answer``."""

PARSERS: dict[str, Parser] = {}
"""Parsers by name; :func:`register_parser` adds to it."""


def register_parser(name: str) -> Callable[[Parser], Parser]:
    """Decorator: register ``parser`` under ``name`` (``BatchedGameEnv(parser=name)``)."""

    def register(parser: Parser) -> Parser:
        if name in PARSERS:
            raise ValueError(f"an answer parser named {name!r} is already registered")
        PARSERS[name] = parser
        return parser

    return register


def get_parser(parser: str | Parser) -> Parser:
    """A registered parser by name, or ``parser`` itself if it is callable."""
    if callable(parser):
        return parser
    if parser not in PARSERS:
        raise ValueError(f"unknown answer parser {parser!r}; registered: {sorted(PARSERS)} (or pass a callable)")
    return PARSERS[parser]


def numbered(moves: Sequence[str]) -> bool:
    """Whether moves can be answered by their number in the prompt's list: only if no move name is itself a number."""
    return not any(name.strip().isdigit() for name in moves)


def list_moves(moves: Sequence[str]) -> str:
    """The legal moves as the prompt shows them: ``1: rock, 2: paper`` (names alone if some name is a number)."""
    if numbered(moves):
        return ", ".join(f"{k}: {name}" for k, name in enumerate(moves, 1))
    return ", ".join(moves)


def _mentions(answer: str, moves: Sequence[str]) -> list[tuple[int, int, int]]:
    """(start, -length, index) of every whole-word, case-insensitive mention of a move name in ``answer``."""
    text = answer.lower()
    found = []
    for index, name in enumerate(moves):
        pattern = rf"(?<!\w){re.escape(name.strip().lower())}(?!\w)"
        found += [(m.start(), -len(name), index) for m in re.finditer(pattern, text)]
    return found


def _numbers(answer: str, moves: Sequence[str]) -> list[tuple[int, int]]:
    """(start, index) of every number k in ``answer`` with 1 <= k <= len(moves), if moves are numbered."""
    if not numbered(moves):
        return []
    # A whole number, not part of a word or a decimal ("1." ending a sentence counts; "1.5" does not).
    hits = [(m.start(), int(m.group())) for m in re.finditer(r"(?<![\w.])\d+(?!\w|\.\d)", answer)]
    return [(start, k - 1) for start, k in hits if 1 <= k <= len(moves)]


@register_parser("first")
def first_legal_move(answer: str, moves: Sequence[str]) -> int | None:
    """The legal move named first in the answer (whole words, any case; the longer name where two start together),
    else the first number that is a legal move's position in the prompt's numbered list; None if neither."""
    mentions = _mentions(answer, moves)
    if mentions:
        return min(mentions)[2]
    numbers = _numbers(answer, moves)
    return min(numbers)[1] if numbers else None


@register_parser("last")
def last_legal_move(answer: str, moves: Sequence[str]) -> int | None:
    """The legal move named last in the answer (for answers that reason first), else the last listed number."""
    mentions = _mentions(answer, moves)
    if mentions:
        last = max(start for start, _, _ in mentions)
        return min(m for m in mentions if m[0] == last)[2]
    numbers = _numbers(answer, moves)
    return max(numbers)[1] if numbers else None


@register_parser("exact")
def exact_move(answer: str, moves: Sequence[str]) -> int | None:
    """The legal move whose name is the whole answer (surrounding whitespace and case ignored)."""
    wanted = answer.strip().lower()
    for index, name in enumerate(moves):
        if name.strip().lower() == wanted:
            return index
    return None
