"""A sender–receiver game (a Lewis signalling game with a biased sender, after Crawford & Sobel 1982): the message is
the only channel between the two.

A prize lies under one of :data:`ITEMS`, drawn per game. The sender sees where, and a favourite item of its own,
drawn per game among the others; it writes one free-text message. The receiver sees only the message and picks an item
(a legal move). The receiver is paid 1 when it picks the prize's item; the sender is paid :data:`BIAS` when the
receiver picks the sender's favourite. With ``agents.reward_coefficients: λ`` (learner i trained on r_i + λ·r_j):

- λ = 1, common interest: the sender is paid r_sender + r_receiver, so sending the receiver to the prize (1) beats
  sending it to the favourite (:data:`BIAS` < 1): telling the truth is the sender's best message, following it the
  receiver's best move;
- λ = 0, a conflict: the sender wants its favourite picked, the receiver the prize; a message the sender would bend
  toward its favourite is one the receiver should ignore, and in equilibrium talk babbles;
- λ = −1, opposed interests: the sender is paid for the receiver missing the prize.

The AEC env :class:`SignallingGame` keeps the numbers; :class:`SignallingView` renders each seat's prompt (the
receiver's shows the message and the items, never the prize nor the favourite), marks the sender's turn as free text
and reports what was said (:data:`MEASURES`), per game and over the batch (the mutual information between the prize's
item and the receiver's pick, and the item the message names, each beside its shuffled baseline:
:mod:`marllm.utils.information`). ``game.name: signalling.py:env`` plays it in a config; importing this file
registers the view.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Box, Discrete
from gymnasium.spaces import Dict as DictSpace
from pettingzoo import AECEnv

from marllm.games.env import GameView, Move, register_view
from marllm.utils.information import mutual_information, shuffled_mutual_information

ITEMS = ("apple", "book", "cup", "drum")
"""The items a prize can lie under; an item's action id is its index."""
MESSAGE = len(ITEMS)
"""The sender's action (its text is given to :meth:`SignallingGame.step` as a string)."""
BIAS = 0.5
"""The sender's payoff when the receiver picks the sender's favourite: below the prize's 1, so that at λ = 1 the
truth pays the sender more than its favourite."""
AGENTS = ("sender", "receiver")
NONE = "none"
"""The item a message names when it names none of :data:`ITEMS`."""
MEASURES = (
    "accuracy", "favourite_rate", "names_prize_rate", "names_favourite_rate", "names_an_item_rate", "message_words",
    "mi_prize_pick", "mi_prize_pick_shuffled", "mi_prize_message", "mi_prize_message_shuffled",
)  # fmt: skip
"""What :class:`SignallingView` reports of each seat's games (per game, and the mutual informations over the batch)."""


class SignallingGame(AECEnv):
    """The game as a PettingZoo AEC env (see the module docstring); ``prize`` and ``favourite`` (item indices) fix
    every reset's draw (a scripted game), else each reset draws them from its seed."""

    metadata = {"name": "signalling_v0", "render_modes": [], "is_parallelizable": False}
    possible_agents = list(AGENTS)

    def __init__(self, prize: int | None = None, favourite: int | None = None):
        super().__init__()
        if (prize is None) != (favourite is None) or (prize is not None and prize == favourite):
            raise ValueError(f"give both prize and favourite (two different items), or neither: {prize}, {favourite}")
        self.fixed = None if prize is None else (int(prize), int(favourite))
        self._action_space = Discrete(MESSAGE + 1)
        self._observation_space = DictSpace(
            {
                "observation": Box(-1, MESSAGE, shape=(3,), dtype=np.int64),
                "action_mask": Box(0, 1, shape=(MESSAGE + 1,), dtype=np.int8),
            }
        )
        self._rng = np.random.default_rng()

    def action_space(self, agent: str) -> Discrete:
        return self._action_space

    def observation_space(self, agent: str) -> DictSpace:
        return self._observation_space

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        if self.fixed is not None:
            self.prize, self.favourite = self.fixed
        else:
            self.prize = int(self._rng.integers(len(ITEMS)))
            others = [item for item in range(len(ITEMS)) if item != self.prize]
            self.favourite = int(others[int(self._rng.integers(len(others)))])
        self.message: str | None = None
        self.pick: int | None = None
        self.agents = list(self.possible_agents)
        self.agent_selection = AGENTS[0]
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {agent: {} for agent in self.agents}

    def legal_actions(self) -> list[int]:
        """The sender's message action, or the receiver's items."""
        return [MESSAGE] if self.agent_selection == AGENTS[0] else list(range(len(ITEMS)))

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        mask = np.zeros(MESSAGE + 1, dtype=np.int8)
        if agent == self.agent_selection and not self.terminations[agent]:
            mask[self.legal_actions()] = 1
        private = [self.prize, self.favourite] if agent == AGENTS[0] else [-1, -1]
        turn = 0 if self.message is None else 1
        return {"observation": np.array([*private, turn], dtype=np.int64), "action_mask": mask}

    def step(self, action: int | str | None) -> None:
        """The sender's turn takes the message's text (an int there is a message left blank); the receiver's an
        item's action id."""
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        if agent == AGENTS[0]:
            self.message = " ".join(action.split()) if isinstance(action, str) else ""
            self.agent_selection = AGENTS[1]
        else:
            if action not in self.legal_actions():
                raise ValueError(f"{action!r} is not an item's action id (0 to {len(ITEMS) - 1})")
            self.pick = int(action)
            self.rewards = {
                AGENTS[0]: BIAS * float(self.pick == self.favourite),
                AGENTS[1]: float(self.pick == self.prize),
            }
            self.terminations = dict.fromkeys(self.agents, True)
        self._accumulate_rewards()


def env(**options: Any) -> SignallingGame:
    """A new game (``game.name: signalling.py:env``; ``game.options`` are :class:`SignallingGame`'s)."""
    return SignallingGame(**options)


def item_named(message: str) -> str:
    """The first of :data:`ITEMS` a message names (``the cup``, ``Cups!``), or :data:`NONE`."""
    for word in re.findall(r"[a-z]+", message.lower()):
        for item in ITEMS:
            if word in (item, item + "s"):
                return item
    return NONE


class SignallingView(GameView):
    """How a seat sees a game of :class:`SignallingGame`: the sender its prize and favourite and a request for a
    message; the receiver the message and the items, and nothing else."""

    title = "Find the prize"

    def rules(self, game: AECEnv) -> str:
        items = ", ".join(ITEMS)
        return (
            f"A prize lies under one of these items: {items}. The sender knows which and writes one message; the "
            "receiver reads it and picks an item, and wins the prize if it picks the right one."
        )

    def player(self, game: AECEnv, seat: str) -> str:
        return seat

    def state(self, game: AECEnv, seat: str, moves: Sequence[Move]) -> str:
        inner = game.unwrapped
        if seat == AGENTS[0]:
            return (
                f"You are the sender. The prize is under the {ITEMS[inner.prize]}. You would like the receiver to "
                f"pick the {ITEMS[inner.favourite]}.\nYour message:"
            )
        return f'You are the receiver. The sender wrote: "{inner.message}"\nYour pick:'

    def move_name(self, game: AECEnv, seat: str, action: int) -> str:
        return ITEMS[action]

    def free_text(self, game: AECEnv, seat: str) -> bool:
        inner = game.unwrapped
        return seat == AGENTS[0] and inner.message is None and not inner.terminations[seat]

    def loss_payoff(self, game: AECEnv) -> float:
        """A forfeit pays the seat that forfeits nothing."""
        return 0.0

    def max_moves(self, game: AECEnv) -> int:
        return len(AGENTS)

    def metrics(self, game: AECEnv, seat: str) -> dict[str, float]:
        """One game's measures, the same for both seats: whether the receiver found the prize, whether it picked the
        sender's favourite, whether the message named the prize, the favourite or any item, and its length in
        words."""
        inner = game.unwrapped
        if inner.pick is None:  # a forfeited game: nothing was picked
            return {}
        named = item_named(inner.message or "")
        return {
            "accuracy": float(inner.pick == inner.prize),
            "favourite_rate": float(inner.pick == inner.favourite),
            "names_prize_rate": float(named == ITEMS[inner.prize]),
            "names_favourite_rate": float(named == ITEMS[inner.favourite]),
            "names_an_item_rate": float(named != NONE),
            "message_words": float(len((inner.message or "").split())),
        }

    def batch_metrics(self, games: Sequence[AECEnv], seat: str) -> dict[str, float]:
        """Over the batch's finished games: the mutual information (bits, plug-in) between the prize's item and the
        receiver's pick, and between the prize's item and the item the message names, each beside its shuffled
        baseline (the estimate's bias at this batch size: :mod:`marllm.utils.information`)."""
        played = [game.unwrapped for game in games if game.unwrapped.pick is not None]
        prizes = [inner.prize for inner in played]
        picks = [inner.pick for inner in played]
        named = [item_named(inner.message or "") for inner in played]
        return {
            "mi_prize_pick": mutual_information(prizes, picks),
            "mi_prize_pick_shuffled": shuffled_mutual_information(prizes, picks),
            "mi_prize_message": mutual_information(prizes, named),
            "mi_prize_message_shuffled": shuffled_mutual_information(prizes, named),
        }


VIEW = register_view(SignallingGame.metadata["name"], SignallingView())
"""The view every batched game of :class:`SignallingGame` is shown through."""
