"""Views of matrix games: the payoff table from the seat's side and the rounds played so far.

PettingZoo's rock-paper-scissors (``rps_v2``, any odd number of moves, ``max_cycles`` rounds) and OpenSpiel's
two-player matrix games (``matrix_pd``, ``matrix_sh``, ``matrix_rps``, ...) and their repetitions
(``repeated_game(stage_game=...)``). The table is computed by the game itself: PettingZoo's by playing each pair of
moves on a scratch copy, OpenSpiel's from the stage game's utilities. A round is shown only once every player has
moved in it, so the second player to move never sees the first one's choice.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from pettingzoo import AECEnv

from marllm.games.env.openspiel import OpenSpielView, require_openspiel
from marllm.games.env.views import GameView, Move, register_view

PayoffFn = Callable[[int, int], tuple[float, float]]
"""``payoff(own move, other move) -> (own payoff, other's payoff)``."""


def payoff_table(own: Sequence[str], other: Sequence[str], payoff: PayoffFn) -> str:
    """The table with the seat's moves as rows, the opponent's as columns, cells ``yours, theirs``."""
    cells = [[f"{a:g}, {b:g}" for a, b in (payoff(i, j) for j in range(len(other)))] for i in range(len(own))]
    width = max(len(text) for text in [*own, *other, *(c for row in cells for c in row)]) + 2
    header = " " * width + "".join(name.ljust(width) for name in other)
    lines = [name.ljust(width) + "".join(c.ljust(width) for c in row) for name, row in zip(own, cells, strict=True)]
    return "Payoffs (yours, opponent's); your move is the row, the opponent's the column:\n" + "\n".join(
        [header.rstrip(), *(line.rstrip() for line in lines)]
    )


def rounds_text(rounds: Sequence[tuple[str, str]], total: int | None) -> str:
    """``Round 1 of 5: you rock, opponent paper`` lines, or a note that none was played."""
    of = f" of {total}" if total else ""
    if not rounds:
        return f"No round played yet (this is round 1{of})."
    lines = [f"Round {k}{of}: you {mine}, opponent {theirs}" for k, (mine, theirs) in enumerate(rounds, 1)]
    return "\n".join([*lines, f"This is round {len(rounds) + 1}{of}."])


def compact_rounds_text(rounds: Sequence[tuple[str, str]], total: int | None) -> str:
    """The rounds played on one line, ``Rounds so far (you-opponent): rock-paper, paper-paper.``, then which round
    this is: a long game's history (rock-paper-scissors runs 15 rounds) in a third of :func:`rounds_text`'s tokens."""
    of = f" of {total}" if total else ""
    if not rounds:
        return f"No round played yet (this is round 1{of})."
    played = ", ".join(f"{mine}-{theirs}" for mine, theirs in rounds)
    return f"Rounds so far (you-opponent): {played}.\nThis is round {len(rounds) + 1}{of}."


@functools.cache
def _rps_payoffs(num_actions: int) -> tuple[tuple[tuple[float, float], ...], ...]:
    """PettingZoo's own rule, read off a scratch env: table[a][b] = rewards of (player_0 plays a, player_1 b)."""
    from pettingzoo.classic import rps_v2  # it imports pygame, which marllm does not depend on

    scratch = rps_v2.raw_env(num_actions=num_actions, max_cycles=1)
    table = []
    for a in range(num_actions):
        row = []
        for b in range(num_actions):
            scratch.reset()
            scratch.step(a)
            scratch.step(b)
            row.append((float(scratch.rewards["player_0"]), float(scratch.rewards["player_1"])))
        table.append(tuple(row))
    return tuple(table)


class RockPaperScissorsView(GameView):
    """PettingZoo's rock-paper-scissors(-lizard-spock): payoff table and the completed rounds."""

    title = "rock-paper-scissors"

    def zero_sum(self, game: AECEnv) -> bool:
        return True  # a win is the other seat's loss

    def rules(self, game: AECEnv) -> str:
        return "Both players choose a move at the same time, without seeing the other's choice."

    def names(self, game: AECEnv) -> list[str]:
        """The move names, lower-case (``rock``, ``paper``, ``scissors``, ``spock``, ``lizard``, ...)."""
        inner = game.unwrapped
        return [name.lower() for name in inner._moves[: inner._none]]

    def state(self, game: AECEnv, seat: str, moves: Sequence[Move]) -> str:
        inner, names = game.unwrapped, self.names(game)
        me = inner.possible_agents.index(seat)
        table = _rps_payoffs(len(names))

        def payoff(own: int, other: int) -> tuple[float, float]:
            pair = table[own][other] if me == 0 else table[other][own]
            return (pair[0], pair[1]) if me == 0 else (pair[1], pair[0])

        rounds = [(moves[k + me].name, moves[k + 1 - me].name) for k in range(0, len(moves) - 1, 2)]
        return payoff_table(names, names, payoff) + "\n" + compact_rounds_text(rounds, inner.max_cycles)

    def move_name(self, game: AECEnv, seat: str, action: int) -> str:
        return self.names(game)[action]

    def history(self, game: AECEnv, moves: Sequence[Move]) -> tuple[int, ...]:
        complete = len(moves) - len(moves) % 2  # the current round's first move stays hidden
        return tuple(move.action for move in moves[:complete])


class MatrixGameView(OpenSpielView):
    """OpenSpiel's two-player matrix games and their repetitions: payoff table and the completed rounds."""

    def stage_game(self, game: AECEnv):  # -> pyspiel.MatrixGame
        """The one-shot game: the game itself, or a repeated game's ``stage_game``."""
        pyspiel, _ = require_openspiel()
        loaded = self.game_state(game).get_game()
        if loaded.get_type().short_name != "repeated_game":
            return loaded
        stage = dict(loaded.get_parameters()["stage_game"])
        return pyspiel.load_game(stage.pop("name"), stage)

    def rules(self, game: AECEnv) -> str:
        return "Both players choose a move at the same time, without seeing the other's choice."

    def name(self, game: AECEnv) -> str:
        return self.title or str(self.stage_game(game).get_type().long_name)

    def state(self, game: AECEnv, seat: str, moves: Sequence[Move]) -> str:
        stage, me = self.stage_game(game), self.player_id(game, seat)
        if me not in (0, 1) or not hasattr(stage, "row_utility"):
            return super().state(game, seat, moves)
        names = [
            [stage.row_action_name(a) for a in range(stage.num_rows())],
            [stage.col_action_name(a) for a in range(stage.num_cols())],
        ]

        def payoff(own: int, other: int) -> tuple[float, float]:
            row, col = (own, other) if me == 0 else (other, own)
            mine, theirs = stage.player_utility(me, row, col), stage.player_utility(1 - me, row, col)
            return float(mine), float(theirs)

        history = self.game_state(game).history()  # complete joint actions only
        rounds = [(names[me][history[k + me]], names[1 - me][history[k + 1 - me]]) for k in range(0, len(history), 2)]
        total = self.game_state(game).get_game().get_parameters().get("num_repetitions")
        table = payoff_table(names[me], names[1 - me], payoff)
        return table + ("\n" + rounds_text(rounds, total) if total else "")

    def delta(self, game: AECEnv, seat: str, new_moves: Sequence[Move], moves: str) -> str:
        """A repetition's rounds completed since the seat's last answer (the other's move of a round shown once the
        round is complete, as :meth:`state` shows it), then which round this is and the request."""
        stage, me = self.stage_game(game), self.player_id(game, seat)
        total = self.game_state(game).get_game().get_parameters().get("num_repetitions")
        if me not in (0, 1) or not hasattr(stage, "row_utility") or not total:
            return super().delta(game, seat, new_moves, moves)
        history = self.game_state(game).history()
        names = [stage.row_action_name, stage.col_action_name]
        done = len(history) // 2
        mine, theirs = names[me](history[2 * (done - 1) + me]), names[1 - me](history[2 * (done - 1) + 1 - me])
        return (
            f"\nRound {done} of {total}: you {mine}, opponent {theirs}\nThis is round {done + 1} of {total}.\n"
            f"Legal moves: {moves}\nYour move:"
        )

    def cooperative_move(self, game: AECEnv, seat: str) -> int | None:
        """In a symmetric stage game, the move that pays the players most in total when both play it, if exactly one
        does (prisoner's dilemma: Cooperate; stag hunt: Stag; chicken: Chicken); None otherwise (a zero-sum game, a
        pure coordination game, an asymmetric one)."""
        stage = self.stage_game(game)
        if not hasattr(stage, "row_utility") or stage.num_rows() != stage.num_cols():
            return None
        moves = range(stage.num_rows())
        symmetric = all(stage.row_utility(a, b) == stage.col_utility(b, a) for a in moves for b in moves)
        if not symmetric:
            return None
        welfare = [stage.row_utility(a, a) + stage.col_utility(a, a) for a in moves]
        best = [a for a in moves if welfare[a] == max(welfare)]
        return best[0] if len(best) == 1 else None


register_view("rps_v2", RockPaperScissorsView())
register_view(lambda name: name.startswith("matrix_") or name == "repeated_game", MatrixGameView())
