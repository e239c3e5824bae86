"""Views of OpenSpiel's Kuhn and Leduc poker: the seat's hand, the board and the betting so far."""

from __future__ import annotations

import re
from collections.abc import Sequence

from pettingzoo import AECEnv

from marllm.games.env.openspiel import OpenSpielView
from marllm.games.env.views import Move, register_view

RANKS = ("Jack", "Queen", "King", "Ace")


def _rank(card: int, ranks: int) -> str:
    return RANKS[card] if ranks <= len(RANKS) else str(card + 1)


class KuhnPokerView(OpenSpielView):
    """Kuhn poker: the seat's card and each earlier action by player; moves Pass / Bet."""

    title = "Kuhn poker"

    def rules(self, game: AECEnv) -> str:
        players = len(game.unwrapped.possible_agents)
        cards = ", ".join(_rank(c, players + 1) for c in range(players + 1))
        return (
            f"Each player antes 1 chip and is dealt one card from {cards} (ranked in that order). Players act in turn: "
            "Pass (check, or fold facing a bet) or Bet (bet 1 chip, or call a bet). If nobody bets, or once a bet is "
            "called, the highest card among the players still in wins the pot."
        )

    def state(self, game: AECEnv, seat: str, moves: Sequence[Move]) -> str:
        state, me = self.game_state(game), self.player_id(game, seat)
        players = state.get_game().num_players()
        history = state.history()  # one card per player (chance), then the actions
        card = _rank(history[me], players + 1)
        actions = history[players:]
        said = [
            f"{'you' if (k % players) == me else f'player {k % players}'}: {'Bet' if a else 'Pass'}"
            for k, a in enumerate(actions)
        ]
        betting = "; ".join(said) if said else "nothing yet (you act first)"
        return f"You are player {me}. Your card: {card}.\nBetting so far: {betting}."


_LEDUC_FIELDS = re.compile(r"\[(\w+): ?([^\]]*)\]")
_LEDUC_ROUND = re.compile(r"\[Round (\d+)\]")
_LEDUC_ACTIONS = {"0": "Fold", "1": "Call", "2": "Raise"}


class LeducPokerView(OpenSpielView):
    """Leduc poker: the seat's private card, the public card, pot, chips and each round's betting."""

    title = "Leduc poker"

    def rules(self, game: AECEnv) -> str:
        return (
            "Cards: two each of Jack, Queen, King; ante 1, one private card each. Two betting rounds (raises of 2, "
            "then 4 chips; two a round at most), a public card after the first. A pair with it wins, else the higher "
            "card."
        )

    def state(self, game: AECEnv, seat: str, moves: Sequence[Move]) -> str:
        raw = str(self.game_state(game).information_state_string(self.player_id(game, seat)))
        fields = dict(_LEDUC_FIELDS.findall(raw))
        round_number = _LEDUC_ROUND.search(raw)
        if "Private" not in fields:
            return raw
        suits = int(self.game_state(game).get_game().get_parameters().get("suits", 2))

        def card(text: str) -> str:
            return _rank(int(text) // suits, 3) if text.strip().lstrip("-").isdigit() and int(text) >= 0 else "none"

        def betting(text: str) -> str:
            return ", ".join(_LEDUC_ACTIONS.get(a, a) for a in text.split()) or "-"

        lines = [
            f"You are player {fields.get('Player', '?')}. Your card: {card(fields['Private'])}.",
            f"Public card: {card(fields['Public']) if 'Public' in fields else 'not revealed yet'}.",
            f"Round {round_number.group(1) if round_number else '?'}; pot {fields.get('Pot', '?')}; "
            f"chips (player 0, player 1): {fields.get('Money', '?')}.",
            f"Round 1 betting: {betting(fields.get('Round1', ''))}. "
            f"Round 2 betting: {betting(fields.get('Round2', ''))}.",
        ]
        return "\n".join(lines)


register_view("kuhn_poker", KuhnPokerView())
register_view("leduc_poker", LeducPokerView())
