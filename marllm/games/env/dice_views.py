"""The view of OpenSpiel's liar's dice: the seat's dice and each bid so far by player, under the rules.

OpenSpiel's information-state string of liar's dice is the seat's dice as digits, then the bids (``"35 1-4 2-3"``),
which alone says nothing to a reader; this view spells it out.
"""

from __future__ import annotations

from collections.abc import Sequence

from pettingzoo import AECEnv

from marllm.games.env.openspiel import OpenSpielView
from marllm.games.env.views import Move, register_view


class LiarsDiceView(OpenSpielView):
    """Liar's dice: the seat's dice and the bids so far; moves are OpenSpiel's (``2-5``: two fives; ``Liar``)."""

    title = "liar's dice"

    @staticmethod
    def _parameters(game: AECEnv) -> tuple[int, int]:
        parameters = OpenSpielView.game_state(game).get_game().get_parameters()
        return int(parameters.get("numdice", 1)), int(parameters.get("dice_sides", 6))

    def rules(self, game: AECEnv) -> str:
        dice, sides = self._parameters(game)
        return (
            f"Each player rolls {dice} {sides}-sided {'die' if dice == 1 else 'dice'} in secret. Bid in turn 'q-f' "
            f"(at least q of all dice show f; {sides} is wild), each above the last, or call 'Liar': if the "
            "last bid holds the caller loses, else the bidder."
        )

    def state(self, game: AECEnv, seat: str, moves: Sequence[Move]) -> str:
        me = self.player_id(game, seat)
        dice, *bids = str(self.game_state(game).information_state_string(me)).split()
        players = len(game.unwrapped.possible_agents)
        said = [f"{'you' if k % players == me else f'player {k % players}'}: {bid}" for k, bid in enumerate(bids)]
        return (
            f"You are player {me}. Your dice: {', '.join(dice)}.\n"
            f"Bids so far: {'; '.join(said) if said else 'none (you bid first)'}."
        )


register_view("liars_dice", LiarsDiceView())
