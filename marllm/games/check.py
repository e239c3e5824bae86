"""A check of a game env, marllm's or one's own: :func:`check_game_env`.

Any AEC env gets PettingZoo's own tests (``api_test`` and ``seed_test``). A batched game env
(:class:`~marllm.games.env.BatchedGameEnv`, wrapped or not) also keeps its own rules, played here over whole episodes
with a random legal answer in every row (a random message on a free-text turn):

- **rows match the mask**: the observation holds one row per game its seat moves in (``games``, the games its
  ``action_mask`` marks, each key as many rows), every row's legal moves named once each with their action ids, and
  those the game itself allows (its own ``action_mask``, where it has one), except on a free-text turn (none); where
  the env plays one token sequence per seat, every ``delta`` a text, the whole prompt at a seat's first answer;
- **finished games are masked**: a game that is over is in no seat's observation or mask, a game is in one seat's
  mask at a time, and at the end every game is over and every mask empty;
- **same seed, same deals**: two envs reset with the same seed deal the same games: the same prompts, legal moves and
  payoffs, answer for answer;
- **legal moves are playable**: a move the game's mask allows is one its ``step`` takes, and a game that gives an
  ``action_mask`` in both its observation and its info gives the same one in each;
- **every game ends**: every seat of every game terminates (or truncates) by the game's own rules, before the env's
  move cap (``max_moves``) ends the game as a draw; a seat still to move has a legal move.

A rule broken is an ``AssertionError`` naming the rule, the seat and the game, with the game's own error (a ``step``
that refuses a move) as its cause.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from pettingzoo import AECEnv
from pettingzoo.test import api_test, seed_test

from marllm.games.env import BatchedGameEnv, keys

__all__ = ["check_game_env"]

ROWS = (keys.PROMPT, keys.LEGAL_MOVES, keys.LEGAL_ACTIONS, keys.HISTORY, keys.GAMES)
"""The keys of a batched game env's observation, one row per game its seat moves in."""

BATCHED_RULES = (
    "rows_match_mask",
    "finished_games_masked",
    "same_seed_same_deals",
    "legal_moves_playable",
    "every_game_ends",
)
"""The names of a batched game env's own rules in :func:`check_game_env`'s report (see the module docstring)."""

PLAYABLE = "rule: legal moves are playable"
ENDS = "rule: every game ends"


def check_game_env(
    make_env: Callable[[], AECEnv], num_cycles: int = 20, episodes: int = 2, seed: int = 0, max_steps: int = 10_000
) -> dict[str, str]:
    """Check the env ``make_env`` builds (a zero-argument callable): PettingZoo's ``api_test`` and ``seed_test`` over
    ``num_cycles`` cycles, and, for a batched game env, its own rules over ``episodes`` episodes (see the module
    docstring). PettingZoo's advice about spaces (text agents have no Box or Discrete ones, by design) and its
    progress lines are left out.

    Returns:
        Each check's name and what it found, or why it did not run.

    Raises:
        AssertionError: naming the rule that failed, the seat and the game.
    """
    report = _check_batched_rules(make_env, episodes, seed, max_steps)
    for test, run in (("api_test", lambda: api_test(make_env(), num_cycles=num_cycles)),
                      ("seed_test", lambda: seed_test(make_env, num_cycles=num_cycles))):  # fmt: skip
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.filterwarnings("ignore", category=UserWarning, module=r"pettingzoo\.test")
            try:
                run()
            except Exception as error:
                raise AssertionError(f"PettingZoo's {test} fails: {type(error).__name__}: {error}") from error
        report[f"pettingzoo_{test}"] = f"passed ({num_cycles} cycles)"
    return report


def _check_batched_rules(make_env: Callable[[], AECEnv], episodes: int, seed: int, max_steps: int) -> dict[str, str]:
    """The batched game env's own rules over ``episodes`` episodes, each played twice from one seed."""
    env = make_env()
    if not isinstance(env.unwrapped, BatchedGameEnv):
        reason = f"not run: {type(env.unwrapped).__name__} is not a marllm.games.env.BatchedGameEnv"
        return dict.fromkeys(BATCHED_RULES, reason)
    answers = 0
    for episode in range(episodes):
        transcript = _play_checked(env, seed + episode, max_steps)
        answers += len(transcript) - 1  # its turns, then the payoffs
        again = _play_checked(make_env(), seed + episode, max_steps)
        if again != transcript:
            step = next((k for k, (a, b) in enumerate(zip(transcript, again, strict=False)) if a != b), None)
            raise AssertionError(
                f"{_name(env)}: two envs reset with seed {seed + episode} and answered alike deal other games (first "
                f"difference at turn {step if step is not None else min(len(transcript), len(again))})"
            )
    return {
        "rows_match_mask": f"{answers} turns of {episodes} episodes of {env.unwrapped.batch_size} games",
        "finished_games_masked": "no finished game asked to move; every mask empty at the end",
        "same_seed_same_deals": f"{episodes} seeds each dealt alike twice",
        "legal_moves_playable": "every move its mask allows taken by the game's step; its masks agree",
        "every_game_ends": f"every game of {episodes} episodes ended by its own rules",
    }


def _name(env: AECEnv) -> str:
    inner = env.unwrapped
    return f"{type(inner).__name__} of {inner.view.name(inner.games[0])}"


def _play_checked(env: AECEnv, seed: int, max_steps: int) -> list[Any]:
    """One episode from ``reset(seed=seed)``, each row answered with a legal move drawn from a generator of ``seed``,
    every rule checked at every turn; the transcript (each turn's seat and rows, then the payoffs)."""
    inner: BatchedGameEnv = env.unwrapped
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    transcript: list[Any] = []
    for steps, seat in enumerate(env.agent_iter()):
        if steps > max_steps:
            raise AssertionError(f"{_name(env)}: the episode did not end in {max_steps} steps")
        observation, _, terminated, truncated, info = env.last()
        if terminated or truncated:
            _check_ended(env, seat, info)
            env.step(None)
            continue
        _check_rows(env, seat, observation, info)
        transcript.append((seat, *(tuple(observation[key]) for key in (*ROWS, keys.DELTA) if key in observation)))
        answers = tuple(_random_answer(names, rng) for names in observation[keys.LEGAL_MOVES])
        before = [record.answers[seat] for record in inner.records]
        try:
            with warnings.catch_warnings():  # a game ended at the move cap is this check's to report, below
                warnings.filterwarnings("ignore", message=r".*reached max_moves", category=UserWarning)
                env.step(answers)
        except Exception as error:
            raise AssertionError(_refused(env, seat, observation, answers, before, error)) from error
    _check_all_ended(env)
    transcript.append(
        tuple(tuple(record.payoffs.get(seat) for seat in inner.possible_agents) for record in inner.records)
    )
    return transcript


def _refused(
    env: AECEnv,
    seat: str,
    observation: Mapping[str, Sequence[Any]],
    answers: Sequence[str],
    before: Sequence[int],
    error: Exception,
) -> str:
    """What a step that raised on legal answers says: the game and move it raised on (the last of the rows whose
    answer the env counted before it raised), the error and the rule."""
    inner: BatchedGameEnv = env.unwrapped
    games = [int(b) for b in observation[keys.GAMES]]
    tried = [k for k, b in enumerate(games) if inner.records[b].answers[seat] > before[b]]
    k = tried[-1] if tried else 0
    names, actions = observation[keys.LEGAL_MOVES][k], observation[keys.LEGAL_ACTIONS][k]
    if names:
        move = f"the move {answers[k]!r} (action {actions[list(names).index(answers[k])]}), which its mask allows"
    else:
        move = f"the message {answers[k]!r} (a free-text turn)"
    return (
        f"{_name(env)}: seat {seat!r}, game {games[k]}: the game's step raised {type(error).__name__}: {error} on "
        f"{move} ({PLAYABLE}: a move the game's action_mask allows must be one its step takes)"
    )


def _check_all_ended(env: AECEnv) -> None:
    """After an episode: no game was ended at the env's move cap (a seat that never terminates)."""
    inner: BatchedGameEnv = env.unwrapped
    capped = [b for b, record in enumerate(inner.records) if record.capped]
    if not capped:
        return
    game = inner.games[capped[0]]
    agents = list(getattr(game, "agents", ()))
    pending = [a for a in agents if not (game.terminations.get(a) or game.truncations.get(a))]
    raise AssertionError(
        f"{_name(env)}: games {capped} were still on after {inner.max_moves} answers (the env's max_moves) and were "
        f"ended as draws; in game {capped[0]} the seats {pending} never terminated ({ENDS}: every seat of a game "
        "terminates or truncates by the game's own rules; pass a larger max_moves if its games are this long)"
    )


def _check_rows(env: AECEnv, seat: str, observation: Mapping[str, Sequence[Any]], info: Mapping[str, Any]) -> None:
    """The rules of one turn: the rows are the games the mask marks, unfinished, each with its legal moves."""
    inner: BatchedGameEnv = env.unwrapped
    games = [int(b) for b in observation[keys.GAMES]]
    marked = np.flatnonzero(info[keys.ACTION_MASK]).tolist()
    where = f"{_name(env)}: seat {seat!r}"
    if not games or games != marked:
        raise AssertionError(f"{where} moves in games {games} but its action_mask marks {marked}")
    for key in ROWS:
        if len(observation[key]) != len(games):
            raise AssertionError(f"{where}: {key!r} has {len(observation[key])} rows for {len(games)} games")
    for other in inner.possible_agents:
        shared = set(games) & set(np.flatnonzero(inner.infos[other][keys.ACTION_MASK]).tolist())
        if other != seat and shared:
            raise AssertionError(f"{where}: games {sorted(shared)} are in the masks of {seat!r} and {other!r} at once")
    if keys.DELTA in observation:  # one token sequence per seat: what the seat reads next, a str, its prompt at first
        for b, delta, prompt in zip(games, observation[keys.DELTA], observation[keys.PROMPT], strict=True):
            if not isinstance(delta, str) or not delta.strip():
                raise AssertionError(f"{where}, game {b}: the view's delta is {delta!r}, not a text to read")
            if inner.records[b].answers[seat] == 0 and delta != prompt:
                raise AssertionError(f"{where}, game {b}: the first delta of a seat in a game must be its whole prompt")
    rows = zip(games, observation[keys.LEGAL_MOVES], observation[keys.LEGAL_ACTIONS], strict=True)
    for b, names, actions in rows:
        if inner.records[b].over:
            raise AssertionError(f"{where} is asked to move in game {b}, which is over: a finished game is masked")
        if inner.view.free_text(inner.games[b], seat):  # a message: no move named, the answer is the move
            continue
        if not names and not actions:
            raise AssertionError(
                f"{where}, game {b}: the seat is to move and the game allows it no move (an empty action_mask) "
                f"({ENDS}: a seat with no move left terminates, and the game ends when every seat has)"
            )
        if not names or len(names) != len(actions) or len(set(names)) != len(names):
            raise AssertionError(f"{where}, game {b}: legal moves {list(names)} do not name the actions {actions}")
        own = _own_legal_actions(inner.games[b], seat, f"{where}, game {b}")
        if own is not None and sorted(own) != sorted(int(a) for a in actions):
            raise AssertionError(f"{where}, game {b}: the row's legal actions {list(actions)} are not the game's {own}")


def _random_answer(names: Sequence[str], rng: np.random.Generator) -> str:
    """A random legal move's name, or on a free-text turn (no move named) a random message."""
    if not names:
        return " ".join(str(word) for word in rng.integers(100, size=int(rng.integers(1, 6))))
    return names[int(rng.integers(len(names)))]


def _own_legal_actions(game: AECEnv, seat: str, where: str) -> list[int] | None:
    """The actions the game itself marks legal for the seat (its observation's or info's ``action_mask``, which
    must agree where it gives both); None where it marks none."""
    observation = game.observe(seat)
    seen = observation.get("action_mask") if isinstance(observation, Mapping) else None
    given = game.infos.get(seat, {}).get("action_mask")
    marked = [None if mask is None else [int(a) for a in np.flatnonzero(mask)] for mask in (seen, given)]
    if None not in marked and marked[0] != marked[1]:
        raise AssertionError(
            f"{where}: the game's observation action_mask allows actions {marked[0]} and its info's action_mask "
            f"{marked[1]} ({PLAYABLE}: a game that gives both masks gives the same legal actions in each)"
        )
    return marked[0] if marked[0] is not None else marked[1]


def _check_ended(env: AECEnv, seat: str, info: Mapping[str, Any]) -> None:
    """At the end: every game over, the seat's mask empty."""
    inner: BatchedGameEnv = env.unwrapped
    unfinished = [b for b, record in enumerate(inner.records) if not record.over]
    if unfinished:
        raise AssertionError(f"{_name(env)}: seat {seat!r} terminated while games {unfinished} are not over")
    if np.asarray(info.get(keys.ACTION_MASK, ())).any():
        raise AssertionError(f"{_name(env)}: seat {seat!r}'s action_mask marks games after the episode ended")
