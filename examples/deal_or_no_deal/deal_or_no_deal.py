"""Deal or no deal (after Lewis et al. 2017): two agents divide a pool of books, hats and balls, each valuing the items
its own way, by talking and then proposing divisions.

A pool holds 1 to 4 of each item type, 5 to 7 items in all. Each agent's values are integers, drawn per game, that
make the whole pool worth :data:`TOTAL` to it; some type is worth 0 to one of them, each type is worth something to
one of them, and the division that gives the pair the most is worth more to the pair than any even one. A game has
``rounds`` rounds (:data:`ROUNDS` unless ``game.options`` say); in each, first each agent writes a message the other
reads (free text), then each proposes a division (what it takes; the other gets the rest) or, once the other has
proposed, accepts the other's latest proposal (:data:`ACCEPT`; a proposal that gives each agent what the other's
latest gave it accepts it too): the game ends in agreement and pays each agent its value of its share. No agreement
after the last proposal pays both 0.

The AEC env :class:`DealOrNoDeal` keeps the numbers (its observation: the pool, the agent's own values, the turn, and
the legal actions' mask); :class:`DealView` turns them into a prompt that shows an agent the pool, its own values and
the dialogue so far, names the proposals (``I take 2 books 0 hats 1 ball``, ``I accept your proposal``), marks
message turns as free text and reports the measures of a finished game (:data:`MEASURES`).
``game.name: deal_or_no_deal.py:env`` plays it in a config; importing this file registers the view.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium.spaces import Box, Discrete
from gymnasium.spaces import Dict as DictSpace
from pettingzoo import AECEnv

from marllm.games.env import GameView, Move, register_view

ITEMS = ("book", "hat", "ball")
"""The item types, in the order of every count and value."""
MOST = 4
"""The most items of one type in a pool (the fewest: 1)."""
POOL_SIZES = range(5, 8)
"""How many items a pool holds in all (the paper's 5 to 7)."""
TOTAL = 10
"""What the whole pool is worth to each agent."""
ROUNDS = 2
"""Rounds of a game: each a message from each agent, then a proposal from each."""
AGENTS = ("alice", "bob")
DIVISIONS = tuple(itertools.product(range(MOST + 1), repeat=len(ITEMS)))
"""Every division's action id is its index here: the items the proposer takes, of each type."""
MESSAGE = len(DIVISIONS)
"""The action of a message turn (its text is given to :meth:`DealOrNoDeal.step` as a string)."""
ACCEPT = MESSAGE + 1
"""The action that accepts the other agent's latest proposal, legal on a proposal turn once the other has proposed:
one move beside the divisions, so that agreeing is one choice rather than naming the exact complement."""
ACCEPT_NAME = "I accept your proposal"
PHASES = ("message", "message", "proposal", "proposal")
"""A round's turns: alice's and bob's message, then alice's and bob's proposal."""
MEASURES = (
    "agreement_rate", "welfare_of_best", "pareto_optimal_rate", "share_of_max", "own_values_named_rate",
    "proposal_accepted_rate", "message_words",
)  # fmt: skip
"""What :meth:`DealView.metrics` reports of each agent's games."""


@dataclass(frozen=True)
class Deal:
    """One game's pool and the agents' private values (per item type, in :data:`ITEMS` order)."""

    counts: tuple[int, ...]
    values: Mapping[str, tuple[int, ...]]

    def worth(self, agent: str, taken: Sequence[int]) -> int:
        """What ``taken`` items are worth to ``agent``."""
        return int(np.dot(self.values[agent], taken))

    def divisions(self) -> list[tuple[int, ...]]:
        """Every division of this pool: what the first agent takes."""
        return [d for d in DIVISIONS if all(x <= c for x, c in zip(d, self.counts, strict=True))]

    def rest(self, taken: Sequence[int]) -> tuple[int, ...]:
        """What is left of the pool for the other agent."""
        return tuple(c - x for c, x in zip(self.counts, taken, strict=True))

    def pair_value(self, first_takes: Sequence[int]) -> int:
        """The pair's total value of a division in which the first agent takes ``first_takes``."""
        return self.worth(AGENTS[0], first_takes) + self.worth(AGENTS[1], self.rest(first_takes))

    def best_value(self) -> int:
        """The pair's total under the division that maximises it."""
        return max(self.pair_value(d) for d in self.divisions())

    def pareto_optimal(self, first_takes: Sequence[int]) -> bool:
        """Whether no other division leaves one agent better off and neither worse off."""
        mine, theirs = self.worth(AGENTS[0], first_takes), self.worth(AGENTS[1], self.rest(first_takes))
        for other in self.divisions():
            a, b = self.worth(AGENTS[0], other), self.worth(AGENTS[1], self.rest(other))
            if a >= mine and b >= theirs and (a > mine or b > theirs):
                return False
        return True


def _value_vectors(counts: Sequence[int]) -> list[tuple[int, ...]]:
    """Every integer value vector that makes the pool worth :data:`TOTAL`."""
    ranges = [range(TOTAL // c + 1) for c in counts]
    return [v for v in itertools.product(*ranges) if int(np.dot(v, counts)) == TOTAL]


def _even_divisions(counts: Sequence[int]) -> list[tuple[int, ...]]:
    """The divisions that split every item type as evenly as it goes (the odd item to either side)."""
    return list(itertools.product(*[sorted({c // 2, c - c // 2}) for c in counts]))


def _fits(deal: Deal) -> bool:
    a, b = (np.array(deal.values[agent]) for agent in AGENTS)
    someone_zero, each_valued = bool((a == 0).any() or (b == 0).any()), bool(((a > 0) | (b > 0)).all())
    best_beats_even = all(deal.pair_value(d) < deal.best_value() for d in _even_divisions(deal.counts))
    return someone_zero and each_valued and best_beats_even and deal.values[AGENTS[0]] != deal.values[AGENTS[1]]


def draw_deal(rng: np.random.Generator) -> Deal:
    """A pool and private values for both agents, drawn until they fit the rules of the module docstring."""
    while True:
        counts = tuple(int(c) for c in rng.integers(1, MOST + 1, size=len(ITEMS)))
        vectors = _value_vectors(counts)
        if sum(counts) not in POOL_SIZES or not vectors:
            continue
        picks = rng.integers(len(vectors), size=2)
        deal = Deal(counts, {agent: vectors[int(k)] for agent, k in zip(AGENTS, picks, strict=True)})
        if _fits(deal):
            return deal


@dataclass
class Turn:
    """One turn played: who, what kind, and the message's text or the division the mover takes."""

    agent: str
    phase: str
    text: str = ""
    takes: tuple[int, ...] = field(default_factory=tuple)


class DealOrNoDeal(AECEnv):
    """The game as a PettingZoo AEC env (see the module docstring); ``deal`` fixes the pool and values of every reset
    (a scripted game), else each reset draws them from its seed."""

    metadata = {"name": "deal_or_no_deal_v0", "render_modes": [], "is_parallelizable": False}
    possible_agents = list(AGENTS)

    def __init__(self, deal: Deal | None = None, rounds: int = ROUNDS):
        super().__init__()
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"rounds must be a positive int, got {rounds!r}")
        self.fixed_deal = deal
        self.rounds = rounds
        self._action_space = Discrete(ACCEPT + 1)
        self._observation_space = DictSpace(
            {
                "observation": Box(0, max(TOTAL, MOST, len(PHASES) * rounds), shape=(8,), dtype=np.int64),
                "action_mask": Box(0, 1, shape=(ACCEPT + 1,), dtype=np.int8),
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
        self.deal = self.fixed_deal or draw_deal(self._rng)
        self.turns: list[Turn] = []
        self.agreed: tuple[int, ...] | None = None
        """What the first agent takes in the agreed division, once there is one."""
        self.agents = list(self.possible_agents)
        self.agent_selection = self.agents[0]
        self.rewards = dict.fromkeys(self.agents, 0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {agent: {} for agent in self.agents}

    @property
    def phase(self) -> str:
        """``"message"`` or ``"proposal"``: what the agent to move does now."""
        return PHASES[len(self.turns) % len(PHASES)]

    def legal_actions(self) -> list[int]:
        """The action ids legal now: the message action, or every division of the pool and, once the other agent
        has proposed, :data:`ACCEPT`."""
        if self.phase == "message":
            return [MESSAGE]
        other = AGENTS[1 - AGENTS.index(self.agent_selection)]
        accept = [ACCEPT] if self.latest_proposal(other) is not None else []
        return [DIVISIONS.index(d) for d in self.deal.divisions()] + accept

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        mask = np.zeros(ACCEPT + 1, dtype=np.int8)
        if agent == self.agent_selection and not self.terminations[agent]:
            mask[self.legal_actions()] = 1
        numbers = [*self.deal.counts, *self.deal.values[agent], len(self.turns), PHASES.index(self.phase)]
        return {"observation": np.array(numbers, dtype=np.int64), "action_mask": mask}

    def latest_proposal(self, agent: str) -> tuple[int, ...] | None:
        """What ``agent`` took in its latest proposal, or None before it proposed."""
        own = [turn.takes for turn in self.turns if turn.agent == agent and turn.phase == "proposal"]
        return own[-1] if own else None

    def step(self, action: int | str | None) -> None:
        """A message turn takes the message's text (an int there is a message left blank); a proposal turn a
        division's action id or :data:`ACCEPT` (played as the division it accepts)."""
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        other = AGENTS[1 - AGENTS.index(agent)]
        self._cumulative_rewards[agent] = 0
        self.rewards = dict.fromkeys(self.agents, 0)
        if self.phase == "message":
            self.turns.append(Turn(agent, "message", " ".join(action.split()) if isinstance(action, str) else ""))
        else:
            if action not in self.legal_actions():
                raise ValueError(f"{action!r} is not a division of the pool {self.deal.counts}")
            offered = self.latest_proposal(other)
            takes = self.deal.rest(offered) if action == ACCEPT else DIVISIONS[int(action)]
            self.turns.append(Turn(agent, "proposal", takes=takes))
            if offered is not None and self.deal.rest(offered) == takes:
                self._settle(takes if agent == AGENTS[0] else offered)
            elif len(self.turns) == self.rounds * len(PHASES):
                self.terminations = dict.fromkeys(self.agents, True)  # no deal: 0 each
        self.agent_selection = other
        self._accumulate_rewards()

    def _settle(self, first_takes: tuple[int, ...]) -> None:
        self.agreed = first_takes
        shares = {AGENTS[0]: first_takes, AGENTS[1]: self.deal.rest(first_takes)}
        self.rewards = {agent: self.deal.worth(agent, shares[agent]) for agent in self.agents}
        self.terminations = dict.fromkeys(self.agents, True)


def env(**options: Any) -> DealOrNoDeal:
    """A new game (``game.name: deal_or_no_deal.py:env``; ``game.options`` are :class:`DealOrNoDeal`'s)."""
    return DealOrNoDeal(**options)


def pool_text(counts: Sequence[int]) -> str:
    """``3 books, 1 hat, 2 balls``."""
    return ", ".join(_items(n, item) for n, item in zip(counts, ITEMS, strict=True))


def values_text(values: Sequence[int]) -> str:
    """``book 2, hat 4, ball 0``: an agent's values as its prompt shows them."""
    return ", ".join(f"{item} {v}" for item, v in zip(ITEMS, values, strict=True))


def division_name(takes: Sequence[int]) -> str:
    """A proposal's name from the proposer's side: ``I take 2 books 0 hats 1 ball``."""
    return "I take " + " ".join(_items(n, item) for n, item in zip(takes, ITEMS, strict=True))


def _items(n: int, item: str) -> str:
    return f"{n} {item}" + ("" if n == 1 else "s")


NUMBER_WORDS = {
    word: str(n)
    for n, word in enumerate(("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"))
}
NEAR = 3
"""How many words apart an item's name and a number may stand for a message to name that value."""


def names_own_values(message: str, values: Sequence[int]) -> bool:
    """Whether a message names one of the writer's values: an item type's name within :data:`NEAR` words of the
    number it is worth to the writer (``books are worth 3 to me``, ``hat: 4``; digits or number words)."""
    words = [NUMBER_WORDS.get(w, w) for w in re.findall(r"[a-z]+|\d+", message.lower())]
    for item, value in zip(ITEMS, values, strict=True):
        names = [i for i, w in enumerate(words) if w in (item, item + "s")]
        numbers = [i for i, w in enumerate(words) if w == str(value)]
        if any(abs(i - j) <= NEAR for i in names for j in numbers):
            return True
    return False


def _turn_line(turn: Turn, seat: str, deal: Deal) -> str:
    """A turn as ``seat`` reads it: ``You: "..."``, ``Them proposed: you get ...``."""
    who = "You" if turn.agent == seat else "Them"
    if turn.phase == "message":
        return f'{who}: "{turn.text}"'
    yours = turn.takes if turn.agent == seat else deal.rest(turn.takes)
    return f"{who} proposed: you get {pool_text(yours)}."


class DealView(GameView):
    """How a seat sees a game of :class:`DealOrNoDeal`: the pool, its own values (never the other's), the dialogue so
    far, and what to do now; proposals named from the proposer's side, messages as free text."""

    title = "Deal or no deal"

    def rules(self, game: AECEnv) -> str:
        return (
            f"You and another player divide a pool of books, hats and balls. The whole pool is worth {TOTAL} to each "
            f"of you, but you value the items differently. In each of {game.unwrapped.rounds} rounds you each write a "
            "message, then "
            "you each propose what you take. Accepting the other player's last proposal (or proposing exactly what it "
            "offered you) is a deal: you each get the value of your items. No deal pays nothing."
        )

    def state(self, game: AECEnv, seat: str, moves: Sequence[Move]) -> str:
        inner = game.unwrapped
        lines = [f"Pool: {pool_text(inner.deal.counts)}.", f"Your values: {values_text(inner.deal.values[seat])}."]
        lines += [_turn_line(turn, seat, inner.deal) for turn in inner.turns]
        lines.append("Your message:" if inner.phase == "message" else "Your proposal:")
        return "\n".join(lines)

    def delta(self, game: AECEnv, seat: str, new_moves: Sequence[Move], moves: str) -> str:
        """The other's turns since the seat's last (the last ``len(new_moves)`` of the game's), then what to do now."""
        inner = game.unwrapped
        since = inner.turns[len(inner.turns) - len(new_moves) :]
        lines = [_turn_line(turn, seat, inner.deal) for turn in since]
        return "\n" + "\n".join([*lines, "Your message:" if inner.phase == "message" else "Your proposal:"])

    def move_name(self, game: AECEnv, seat: str, action: int) -> str:
        return ACCEPT_NAME if action == ACCEPT else division_name(DIVISIONS[action])

    def free_text(self, game: AECEnv, seat: str) -> bool:
        inner = game.unwrapped
        return inner.phase == "message" and not inner.terminations[seat]

    def loss_payoff(self, game: AECEnv) -> float:
        """A forfeit is no deal for the seat that forfeits: 0, as for the other."""
        return 0.0

    def max_moves(self, game: AECEnv) -> int:
        return game.unwrapped.rounds * len(PHASES)

    def metrics(self, game: AECEnv, seat: str) -> dict[str, float]:
        """The game's measures for ``seat`` (:data:`MEASURES`): whether it ended in agreement, the pair's value
        against the best division's (0 without a deal), whether the deal is Pareto-optimal (0 without one), the seat's
        value against its most (the whole pool), and of its own turns: how often a message names its own values
        (:func:`names_own_values`), how often a proposal the other answered with a proposal was accepted by it, and
        its messages' length in words."""
        inner, first = game.unwrapped, seat == AGENTS[0]
        deal, agreed = inner.deal, inner.agreed
        share = None if agreed is None else (agreed if first else deal.rest(agreed))
        measures = {
            "agreement_rate": float(agreed is not None),
            # The pair's welfare against the best division's: a Pareto-optimal deal can score below 1 (an uneven
            # split of what both value), hence a rate of Pareto optimality of its own.
            "welfare_of_best": 0.0 if agreed is None else deal.pair_value(agreed) / deal.best_value(),
            "pareto_optimal_rate": float(agreed is not None and deal.pareto_optimal(agreed)),
            "share_of_max": 0.0 if share is None else deal.worth(seat, share) / TOTAL,
        }
        messages = [turn.text for turn in inner.turns if turn.agent == seat and turn.phase == "message"]
        if messages:
            named = [names_own_values(text, deal.values[seat]) for text in messages]
            measures["own_values_named_rate"] = float(np.mean(named))
            measures["message_words"] = float(np.mean([len(text.split()) for text in messages]))
        answered = _answered_proposals(inner.turns, deal, seat)
        if answered:
            measures["proposal_accepted_rate"] = float(np.mean(answered))
        return measures


def _answered_proposals(turns: Sequence[Turn], deal: Deal, seat: str) -> list[bool]:
    """For each proposal of ``seat`` that the other answered with a proposal, whether that answer accepted it."""
    proposals = [(k, turn) for k, turn in enumerate(turns) if turn.phase == "proposal"]
    answered = []
    for (_, turn), (_, reply) in itertools.pairwise(proposals):
        if turn.agent == seat and reply.agent != seat:
            answered.append(reply.takes == deal.rest(turn.takes))
    return answered


VIEW = register_view(DealOrNoDeal.metadata["name"], DealView())
"""The view every batched game of :class:`DealOrNoDeal` is shown through."""
