"""Who sits where in a game run: each seat's slot (the env's agent id), the learner of each learner's slot, and the
player of every slot, the opponents built by their entries of :mod:`marllm.games.opponents`, as evaluation builds
them.

A slot's id is its player's: the learner id, or ``random``, ``minimax``, ``mcts``, ``pool-<learner>``, a referenced
class's name; a player named
in several seats has its later slots numbered, ``llm#2``. One learner in several slots (self-play) is one learner.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from marllm.games.opponents import NAMED, ONLY, SeatArguments, build_opponent
from marllm.games.settings import GameConfig, Seat
from marllm.games.strategy import learner_policy

OPPONENT_SEED_OFFSET = 10_000
"""A fixed opponent in seat i draws its moves from ``seed + OPPONENT_SEED_OFFSET + i``."""


def seat_slots(seats: Sequence[Seat]) -> list[str]:
    """The agent id of each seat's slot: its player's id, numbered ``#2``, ``#3`` from its second seat on."""
    counts: Counter[str] = Counter()
    slots = []
    for seat in seats:
        counts[seat.player_id] += 1
        n = counts[seat.player_id]
        slots.append(seat.player_id if n == 1 else f"{seat.player_id}#{n}")
    return slots


def learner_slots(game: GameConfig) -> dict[str, str]:
    """slot -> learner id, for the slots of ``game.seats`` that a learner plays."""
    seats = game.seats
    return {slot: seat.learner for slot, seat in zip(seat_slots(seats), seats, strict=True) if seat.is_learner}


def opponent_slots(game: GameConfig) -> dict[str, str]:
    """slot -> the opponent's id (its player's: ``random``, ``pool-<learner>``, a referenced class's name), for the
    slots of ``game.seats`` that a fixed opponent plays; an opponent in several seats is one id."""
    seats = game.seats
    return {slot: seat.player_id for slot, seat in zip(seat_slots(seats), seats, strict=True) if not seat.is_learner}


def make_opponent(
    game: GameConfig, seat: Seat, index: int, learners: Mapping[str, Any], seed: int, generation: Any
) -> Any:
    """The player of a seat that is not a learner (``index``: the seat's position, which seeds it, from the run's
    ``seed``), built by its opponent's entry (:func:`~marllm.games.opponents.build_opponent`), with the learner it
    watches (the one its seat names, or the run's only one) and, for an opponent that reads it, that learner's
    tabulated policy (its answers sampled with ``generation``)."""
    entry = seat.opponent
    if entry is None:
        raise ValueError(f"seat {seat.spec!r} is a learner, not a fixed opponent")
    learner_id = {NAMED: seat.learner, ONLY: game.learner_ids[0]}.get(entry.learner)  # type: ignore[arg-type]
    learner = learners[learner_id] if learner_id is not None else None
    policy = learner_policy(game, generation, learner_id, learner) if entry.tabulates and learner_id else None
    seed = seed + OPPONENT_SEED_OFFSET + index
    arguments = SeatArguments(game, seat.player_id, seed, learner, learner_id, policy, seat.settings)
    return build_opponent(seat.kind, arguments, f"game.seats[{index}]")


def seat_players(
    game: GameConfig, learners: Mapping[str, Any], seed: int, generation: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(players by slot, fixed opponents by id)``: the loop's mapping (the learners' slots first, so that a
    snapshot pool, updated after its learner, snapshots the updated weights) and the opponents, one per id, seeded
    from the run's ``seed`` (a best response's target sampled with ``generation``)."""
    seats = game.seats
    slots = seat_slots(seats)
    opponents: dict[str, Any] = {}
    for index, seat in enumerate(seats):
        if not seat.is_learner and seat.player_id not in opponents:
            opponents[seat.player_id] = make_opponent(game, seat, index, learners, seed, generation)
    players: dict[str, Any] = {}
    for learner_id in game.learner_ids:
        own = [slot for slot, seat in zip(slots, seats, strict=True) if seat.is_learner and seat.learner == learner_id]
        players.update(dict.fromkeys(own, learners[learner_id]))
    for slot, seat in zip(slots, seats, strict=True):
        if not seat.is_learner:
            players[slot] = opponents[seat.player_id]
    return players, opponents
