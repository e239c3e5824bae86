"""Board views of PettingZoo's classic tic-tac-toe (``tictactoe_v3``) and connect four (``connect_four_v3``)."""

from __future__ import annotations

from collections.abc import Sequence

from pettingzoo import AECEnv

from marllm.games.env.views import GameView, Move, register_view

MARKS = ("X", "O")


class TicTacToeView(GameView):
    """Tic-tac-toe: the board with X, O and the numbers 1-9 of the empty cells (in reading order), moves named by
    cell number. PettingZoo numbers its squares down the columns (action = 3·column + row); the view converts."""

    title = "tic-tac-toe"

    def zero_sum(self, game: AECEnv) -> bool:
        return True  # a win is the other seat's loss

    def rules(self, game: AECEnv) -> str:
        return (
            "Players take turns marking an empty cell; the first with three in a row (across, down or diagonally) wins."
        )

    def player(self, game: AECEnv, seat: str) -> str:
        return MARKS[game.unwrapped.possible_agents.index(seat)]

    @staticmethod
    def cell(action: int) -> int:
        """The cell number (1-9, reading order) of a PettingZoo action (3·column + row)."""
        column, row = divmod(action, 3)
        return 3 * row + column + 1

    def state(self, game: AECEnv, seat: str, moves: Sequence[Move]) -> str:
        squares = game.unwrapped.board.squares  # 0 empty, 1 first player, 2 second player
        shown = [" "] * 9
        for action, mark in enumerate(squares):
            shown[self.cell(action) - 1] = MARKS[mark - 1] if mark else str(self.cell(action))
        rows = [" " + " | ".join(shown[3 * r : 3 * r + 3]) for r in range(3)]
        board = "\n---+---+---\n".join(rows)
        return f"You play {self.player(game, seat)}. The board (empty cells show their number):\n{board}"

    def move_name(self, game: AECEnv, seat: str, action: int) -> str:
        return str(self.cell(action))

    def legal_moves(self, game: AECEnv, seat: str) -> list[tuple[int, str]]:
        return sorted(super().legal_moves(game, seat), key=lambda move: int(move[1]))


class ConnectFourView(GameView):
    """Connect four: the 6×7 grid (top row first) with columns numbered 1-7, moves named by column number."""

    title = "connect four"

    def zero_sum(self, game: AECEnv) -> bool:
        return True  # a win is the other seat's loss

    def rules(self, game: AECEnv) -> str:
        return (
            "Players take turns dropping a piece into a column that is not full; it falls to the lowest empty row. "
            "The first with four in a row (across, down or diagonally) wins."
        )

    def player(self, game: AECEnv, seat: str) -> str:
        return MARKS[game.unwrapped.possible_agents.index(seat)]

    def state(self, game: AECEnv, seat: str, moves: Sequence[Move]) -> str:
        board = game.unwrapped.board  # 42 cells, row-major, top row first; 0 empty, 1 first player, 2 second
        rows = [" ".join(MARKS[v - 1] if v else "." for v in board[7 * r : 7 * r + 7]) for r in range(6)]
        grid = "\n".join([" ".join(str(c) for c in range(1, 8)), *rows])
        return f"You play {self.player(game, seat)}. The board (columns 1-7, '.' is empty):\n{grid}"

    def move_name(self, game: AECEnv, seat: str, action: int) -> str:
        return str(action + 1)


register_view("tictactoe_v3", TicTacToeView())
register_view("connect_four_v3", ConnectFourView())
