"""A check of a player that sits at a game without learning (:mod:`marllm.games.players`), marllm's or one's own:
:func:`check_player`.

The training loop treats an opponent as it treats a learner (the :class:`~marllm.algorithms.learner.Learner`
protocol: ``act`` at every turn of its seat, ``finish`` once per ``act`` with that turn's rewards, ``update`` once per
iteration, a checkpoint through ``state_dict`` and ``load_state_dict``), seeds it from the run's seed, and a resumed
run restores it. Played in whole episodes of a batched game env, in the seats given, against random legal moves:

- **protocol**: it has every member of the Learner protocol; ``update`` returns metrics (names to numbers);
- **one legal move per row**: ``act`` answers one string per row, each a legal move's exact name (a player that
  answers in free text, a model's snapshot, is checked for one string per row only: ``legal_answers=False``);
- **deterministic under its seed**: a second player from ``make_player`` answers every turn alike;
- **resumes**: a player restored from another's ``state_dict`` (its meta through JSON) after the first episode
  answers the next one as the other does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from pettingzoo import AECEnv

from marllm.games.env import BatchedGameEnv, keys
from marllm.testing.outcomes import CheckNotApplicable

__all__ = ["check_player"]

PROTOCOL = ("name", "act", "finish", "update", "activate", "reference_model", "state_dict", "load_state_dict", "save")
"""The members of the :class:`~marllm.algorithms.learner.Learner` protocol that a player in a run is called by."""


def check_player(
    make_player: Callable[[], Any],
    make_env: Callable[[], AECEnv],
    seats: Sequence[str] | None = None,
    episodes: int = 2,
    seed: int = 0,
    legal_answers: bool = True,
    resumes: bool = True,
) -> dict[str, str]:
    """Check the player ``make_player`` builds (a zero-argument callable that seeds it alike every time) in
    ``episodes`` episodes of the batched game env ``make_env`` builds (see the module docstring).

    Args:
        make_player: builds the player afresh.
        make_env: builds the game env (a :class:`~marllm.games.env.BatchedGameEnv`, wrapped or not).
        seats: the seats the player plays (the others play random legal moves); None: every seat (self-play).
        episodes: episodes per run; at least 2 where ``resumes``.
        seed: seeds the env's deals, the other seats' moves and the global torch generator, per episode.
        legal_answers: whether every answer must be a legal move's name (False: a player of free text).
        resumes: whether to check the resume (False for a player whose documented state leaves out a generator).

    Returns:
        Each check's name and what it found, or why it did not run.

    Raises:
        AssertionError: naming the rule that failed.
        CheckNotApplicable: the player lacks members of the protocol, or the env is no batched game env.
    """
    first = make_player()
    name = getattr(first, "name", type(first).__name__)
    missing = [member for member in PROTOCOL if not hasattr(first, member)]
    if missing:
        raise CheckNotApplicable(
            f"{name}: a player at a game has the marllm.algorithms.Learner protocol's members; "
            f"{type(first).__name__} lacks {missing}"
        )
    if not isinstance(make_env().unwrapped, BatchedGameEnv):
        raise CheckNotApplicable(f"{name}: a player is checked in a marllm.games.env.BatchedGameEnv")
    run = _Run(make_env, seats, seed, legal_answers)
    answers = [run.episode(first, k) for k in range(episodes)]
    second = make_player()
    again = [run.episode(second, k) for k in range(episodes)]
    if again != answers:
        raise AssertionError(f"{name}: a second player built alike answers otherwise: not deterministic under its seed")
    rows = sum(len(turn[1]) for episode in answers for turn in episode)
    report = {
        "protocol": f"the Learner protocol's members; update returns {run.metrics}",
        "legal_answers": f"{rows} answers, each a legal move" if legal_answers else f"{rows} answers, one per row",
        "deterministic": f"two players built alike answer {rows} rows alike",
        "resumes": "not run (resumes=False)",
    }
    if resumes:
        if episodes < 2:
            raise ValueError("the resume check needs episodes >= 2")
        _check_resumes(make_player, run, episodes, answers)
        report["resumes"] = f"a player restored after episode 1 answers episodes 2..{episodes} alike"
    return report


class _Run:
    """Episodes of the env with the player in ``seats``, the other seats drawing a legal move at random."""

    def __init__(self, make_env: Callable[[], AECEnv], seats: Sequence[str] | None, seed: int, legal: bool):
        self.env, self.seed, self.legal = make_env(), seed, legal
        possible = list(self.env.possible_agents)
        unknown = [seat for seat in seats or () if seat not in possible]
        if unknown:
            raise ValueError(f"seats {unknown} are not seats of the game, {possible}")
        self.seats = list(seats) if seats is not None else possible
        self.metrics: dict[str, float] = {}

    def episode(self, player: Any, k: int) -> list[tuple[str, tuple[str, ...]]]:
        """Play episode ``k`` (reset with ``seed + k``), then reward and update the player; its answers per turn."""
        env, rng = self.env, np.random.default_rng(self.seed + k)
        env.reset(seed=self.seed + k)
        torch.manual_seed(self.seed + k)
        turns: list[tuple[str, tuple[str, ...]]] = []
        for seat in env.agent_iter():
            observation, _, terminated, truncated, _ = env.last()
            if terminated or truncated:
                env.step(None)
                continue
            moves = observation[keys.LEGAL_MOVES]
            if seat in self.seats:
                answers = self._checked(player, seat, observation)
                turns.append((seat, answers))
            else:
                answers = tuple(names[int(rng.integers(len(names)))] for names in moves)
            env.step(answers)
        for _, answered in turns:  # the loop's order: oldest turn first, each with one reward per row
            player.finish([0.0] * len(answered))
        metrics = player.update()
        if not isinstance(metrics, dict) or not all(isinstance(v, int | float) for v in metrics.values()):
            raise AssertionError(f"{player.name}: update() returned {metrics!r}, not a dict of metrics (numbers)")
        self.metrics = metrics
        return turns

    def _checked(self, player: Any, seat: str, observation: Any) -> tuple[str, ...]:
        answers = tuple(player.act(observation, role=seat))
        moves = observation[keys.LEGAL_MOVES]
        if len(answers) != len(moves) or not all(isinstance(answer, str) for answer in answers):
            raise AssertionError(
                f"{player.name} answered {answers!r} in seat {seat!r}: not one string for each of its {len(moves)} rows"
            )
        for answer, names, b in zip(answers, moves, observation[keys.GAMES], strict=True):
            if self.legal and answer not in names:
                raise AssertionError(
                    f"{player.name} answered {answer!r} in seat {seat!r}, game {b}: not one of its legal moves "
                    f"{list(names)}"
                )
        return answers


def _check_resumes(
    make_player: Callable[[], Any], run: _Run, episodes: int, answers: list[list[tuple[str, tuple[str, ...]]]]
) -> None:
    """A player restored after the first episode (``state_dict``, its meta through JSON) answers the rest alike."""
    played = make_player()
    run.episode(played, 0)
    tensors, meta = played.state_dict()
    resumed = make_player()
    resumed.load_state_dict(tensors, json.loads(json.dumps(meta)))
    for k in range(1, episodes):
        if run.episode(resumed, k) != answers[k]:
            raise AssertionError(
                f"{played.name}: a player restored from another's state_dict after episode 1 answers episode {k + 1} "
                "otherwise: the state leaves out what its choices depend on"
            )
