"""Prompt templates of a batched game: the fields a template may use, the default template, and their checks."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from marllm.envs.templates import PromptTemplate
from marllm.games.env.parsers import list_moves

if TYPE_CHECKING:
    from pettingzoo import AECEnv

    from marllm.games.env.records import GameRecord
    from marllm.games.env.views import GameView, Move

GameTemplate = str | Callable[[Mapping[str, Any]], str]
"""A ``str.format`` template over :data:`FIELDS`, or a callable ``template(fields) -> prompt``."""

FIELDS = ("game", "rules", "role", "player", "state", "moves", "move_names", "move_number")
"""What a template may use: the game's name and rules, the seat's agent id (``role``) and name in the game
(``player``: X, O, player 0), the view's ``state`` text, the legal ``moves`` as listed (numbered unless a move name
is a number), the bare ``move_names`` (comma-separated) and the seat's ``move_number`` in this game (from 1)."""


def prompt_fields(
    view: GameView, game: AECEnv, seat: str, moves: Sequence[Move], names: Sequence[str], move_number: int
) -> dict[str, Any]:
    """The :data:`FIELDS` of the seat's prompt in ``game``: what the view shows of it after ``moves`` (the moves
    applied so far), with the legal move ``names`` and the seat's ``move_number`` (its answers so far + 1)."""
    return {
        "game": view.name(game),
        "rules": view.rules(game),
        "role": seat,
        "player": view.player(game, seat),
        "state": view.state(game, seat, moves),
        "moves": list_moves(names),
        "move_names": ", ".join(names),
        "move_number": move_number,
    }


HISTORIES = ("prompt", "sequence")
"""How a seat reads a game: a prompt rendered from the whole game at each answer, or one token sequence per seat and
game, each answer followed only by what is new (``delta`` observations)."""


def check_history(history: str) -> str:
    """``history``, one of :data:`HISTORIES`, or a ValueError naming them."""
    if history not in HISTORIES:
        raise ValueError(f"history must be one of {list(HISTORIES)}, got {history!r}")
    return history


def delta_text(
    view: GameView, game: AECEnv, record: GameRecord, seat: str, legal: Sequence[tuple[int, str]], prompt: str
) -> str:
    """What the seat reads next in its sequence of ``game``: its ``prompt`` at its first answer, else what the view
    says is new since its last (:meth:`~marllm.games.env.GameView.delta` of the other seats' moves since)."""
    if record.answers[seat] == 0:
        return prompt
    new_moves = [move for move in record.moves[record.seen[seat] :] if move.seat != seat]
    try:
        delta = view.delta(game, seat, new_moves, list_moves([name for _, name in legal]))
    except Exception as error:
        raise ValueError(f"rendering the delta of seat {seat!r} failed: {error!r}") from error
    if not isinstance(delta, str):
        raise TypeError(f"the view's delta for seat {seat!r} returned {type(delta).__name__}, not str")
    return delta


def render_prompt(
    view: GameView,
    game: AECEnv,
    record: GameRecord,
    seat: str,
    legal: Sequence[tuple[int, str]],
    template: Callable[[Mapping[str, Any]], str],
    index: int,
) -> str:
    """The seat's prompt in game ``index`` of a batch, its ``template`` over the game's :data:`FIELDS` now.

    Raises:
        ValueError: the view or the template failed; TypeError: the template returned no str.
    """
    names = [name for _, name in legal]
    try:
        prompt = template(prompt_fields(view, game, seat, record.moves, names, record.answers[seat] + 1))
    except Exception as error:
        raise ValueError(f"rendering the prompt of seat {seat!r} in game {index} failed: {error!r}") from error
    if not isinstance(prompt, str):
        raise TypeError(f"the template of seat {seat!r} returned {type(prompt).__name__}, not str")
    return prompt


def default_template(fields: Mapping[str, Any]) -> str:
    """The default prompt: the game and its rules, the state, the legal moves and the request for one move."""
    intro = f"You are playing {fields['game']}." + (f" {fields['rules']}" if fields["rules"] else "")
    return f"{intro}\n{fields['state']}\nLegal moves: {fields['moves']}\nAnswer with one legal move.\nYour move:"


def check_game_templates(
    templates: GameTemplate | Mapping[str, GameTemplate] | None, seats: Sequence[str]
) -> dict[str, Callable[[Mapping[str, Any]], str]]:
    """One prompt function per seat: one template for all, a mapping seat -> template, or None (the default).

    Raises:
        ValueError: a mapping misses a seat or names an unknown one, or a str template uses an unknown field.
    """
    if templates is None:
        templates = default_template
    if isinstance(templates, Mapping):
        missing = [s for s in seats if s not in templates]
        unknown = sorted(set(templates) - set(seats), key=str)
        if missing or unknown:
            raise ValueError(
                f"templates must have one entry per seat {list(seats)}; missing {missing}, unknown {unknown}"
            )
        by_seat = dict(templates)
    else:
        by_seat = dict.fromkeys(seats, templates)
    return {seat: _prompt_fn(template, seat) for seat, template in by_seat.items()}


def _prompt_fn(template: GameTemplate, seat: str) -> Callable[[Mapping[str, Any]], str]:
    if isinstance(template, str):
        checked = PromptTemplate(template)
        checked.check(f"seat {seat!r}", FIELDS, [])
        return lambda fields: checked(fields, {})
    if callable(template):
        return template
    raise TypeError(f"the template of seat {seat!r} must be a str or a callable (fields) -> str, got {template!r}")
