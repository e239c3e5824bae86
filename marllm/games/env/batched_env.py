"""Batched game environment: B copies of any AEC game played as one PettingZoo AEC env whose moves are texts.

Agents
    The game's seats: its ``possible_agents`` (``player_1``, ``player_2`` for PettingZoo's tic-tac-toe, ``player_0``,
    ``player_1`` for OpenSpiel games). Every copy of the game must have the same seats.
Episode
    ``reset`` starts ``batch_size`` games, each an AEC env made by ``game_fn`` and reset with its own seed. The seat
    selected next is the first seat after the last mover (in ``possible_agents`` order, cyclically) that is to move
    in at least one unfinished game; it moves in all of those games at once, one batched generation. Games end at
    different moves and may order their players differently: nothing runs in lockstep. Finished games, and games in
    which another seat is to move, are masked rows of the move. The episode ends when every game is over.
Observation
    A dict with one entry per game in which the seat moves now (its rows, in batch order): ``prompt`` (the prompt,
    rendered by the seat's template from the game view's fields), ``legal_moves`` (the legal move names, as the
    prompt lists them), ``legal_actions`` (their action ids), ``history`` (the game so far as action ids, for
    scripted players), ``games`` (the games' indices in the batch) and with ``history="sequence"`` ``delta``. See
    :mod:`marllm.games.env.keys`.
Action
    One answer string per row of the observation. The parser maps an answer to a legal move (on a free-text turn, the
    view's ``free_text``, the answer itself is the move); one naming none is illegal: with ``illegal="forfeit"`` the
    seat loses that game at once (the others get what winning pays in a zero-sum game), with ``"random"`` a random
    move is played for it; it counts in ``illegal_move_rate``.
Info
    ``infos[seat]`` holds ``role`` (the seat) and ``action_mask`` ((B,) int8: the games it moves in now). At the end
    it also holds the per-game rewards under the keys of :mod:`marllm.envs.info_keys`: ``task_rewards`` and
    ``batch_rewards`` (B,) the seat's payoff per game; ``turn_task_rewards`` (the payoff) and ``turn_batch_rewards``
    (what the move is trained on: payoff · γ^(the seat's later moves in that game) − ``illegal_penalty`` if the answer
    was illegal), one row per turn of the seat, each as long as that turn's observation; ``turn_discounts`` (each
    move's γ^k), ``turn_games`` (which games each turn's rows are), ``payoffs``, ``outcomes`` (+1 win, 0 draw, -1
    loss) and ``metrics`` (:data:`~marllm.games.env.keys.METRICS`).
Reward
    Zero until the episode ends; then ``rewards[seat]`` is the seat's mean payoff over the batch.
Termination
    Every seat terminates when the last game ends; nothing truncates (a game's own truncation ends that game). A game
    still on after ``max_moves`` answers is a draw (payoff 0 to every seat), with a warning and ``capped_rate``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Dict as DictSpace
from pettingzoo import AECEnv
from pettingzoo.utils import wrappers

from marllm.envs.info_keys import (
    BATCH_REWARDS,
    TASK_REWARDS,
    TURN_BATCH_REWARDS,
    TURN_DISCOUNTS,
    TURN_TASK_REWARDS,
)
from marllm.envs.spaces import Rows
from marllm.envs.text_inputs import describe_action
from marllm.games.env import keys
from marllm.games.env.checks import check_credit, check_max_moves, check_policy, check_seats, make_game, reset_game
from marllm.games.env.credit import outcomes, seat_metrics, turn_discounts, turn_rewards
from marllm.games.env.parsers import Parser, get_parser
from marllm.games.env.prompts import GameTemplate, check_game_templates, check_history, delta_text, render_prompt
from marllm.games.env.records import GameRecord, Turn, count_cooperation, describe_record, view_metrics
from marllm.games.env.view_lookup import view_for
from marllm.games.env.views import FREE_TEXT, GameView, Move
from marllm.utils.errors import CheckpointError
from marllm.utils.generators import restore_generator


class BatchedGameEnv(AECEnv):
    """``batch_size`` copies of an AEC game; each seat moves in every game where it is to move, with text.

    Args:
        game_fn: a zero-argument factory of the game, an AEC env: a PettingZoo classic env (``tictactoe_v3.env``),
            an OpenSpiel game (:func:`~marllm.games.env.openspiel.openspiel_factory`, or any shimmy
            ``OpenSpielCompatibilityV0``) or a user's own. Called once per game of the batch.
        batch_size: games per episode.
        view: how prompts show the game and name its moves; None looks it up by the game's name
            (:func:`~marllm.games.env.view_lookup.view_for`), falling back to the generic view.
        templates: one template for every seat, a mapping seat -> template, or None (the default prompt): a
            ``str.format`` string over :data:`~marllm.games.env.prompts.FIELDS` or a callable ``(fields) -> str``.
        parser: a registered parser's name (``"first"``, ``"last"``, ``"exact"``) or a callable
            ``(answer, legal_move_names) -> index or None``.
        illegal: ``"forfeit"`` (an illegal answer loses the game) or ``"random"`` (a random legal move is played).
        forfeit_payoffs: (the forfeiting seat's payoff, every other seat's); None: the view's (its loss, and for a
            zero-sum game what winning pays, else 0: :meth:`~marllm.games.env.GameView.forfeit_payoffs`).
        discount: γ in (0, 1]; a move is credited γ^k · payoff, k the mover's later moves in the game.
        illegal_penalty: >= 0, subtracted from the trained reward of every illegal answer.
        max_moves: answers per game (every seat's) after which a game still on is ended as a draw; None: the game's
            own bound where its view has one (:meth:`~marllm.games.env.GameView.max_moves`), else 1000.
        history: ``"prompt"`` or ``"sequence"`` (observations also hold :data:`~marllm.games.env.keys.DELTA`).
        render_mode: None or ``"ansi"`` (``render()`` returns the first game's moves).
        seed: seeds the games' seeds and the random moves, as a first ``reset(seed=seed)`` would.

    A seat's moves have as many rows as the games it moves in, which changes from move to move: a learner whose update
    splits each rollout into mini-batches (PPO) needs a mini-batch size that divides every such count (1 always does;
    games in which every seat moves in every game at every turn, like matrix games, keep the batch size).
    """

    metadata = {"name": "batched_game_v0", "render_modes": ["ansi"], "is_parallelizable": False}

    def __init__(
        self,
        game_fn: Callable[[], AECEnv],
        batch_size: int,
        *,
        view: GameView | None = None,
        templates: GameTemplate | Mapping[str, GameTemplate] | None = None,
        parser: str | Parser = "first",
        illegal: str = "forfeit",
        forfeit_payoffs: tuple[float, float] | None = None,
        discount: float = 1.0,
        illegal_penalty: float = 0.0,
        max_moves: int | None = None,
        history: str = "prompt",
        render_mode: str | None = None,
        seed: int | None = None,
    ):
        super().__init__()
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not callable(game_fn):
            raise TypeError(f"game_fn must be a zero-argument callable returning an AEC env, got {game_fn!r}")
        self.batch_size = batch_size
        self.games = [make_game(game_fn) for _ in range(batch_size)]
        self.possible_agents = check_seats(self.games)
        self.view = view_for(self.games[0]) if view is None else view
        self.templates = check_game_templates(templates, self.possible_agents)
        self.parser = get_parser(parser)
        self.illegal, self.forfeit_payoffs = check_policy(illegal, forfeit_payoffs)
        self.discount, self.illegal_penalty = check_credit(discount, illegal_penalty)
        self.max_moves = check_max_moves(max_moves, self.view.max_moves(self.games[0]))
        self.history = check_history(history)
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.render_mode = render_mode
        self.agents: list[str] = []
        rows = {key: Rows(batch_size, tuple) for key in (keys.LEGAL_MOVES, keys.LEGAL_ACTIONS, keys.HISTORY)}
        texts = {keys.DELTA: Rows(batch_size)} if history == "sequence" else {}
        self.observation_spaces = {
            seat: DictSpace({keys.PROMPT: Rows(batch_size), keys.GAMES: Rows(batch_size, int), **rows, **texts})
            for seat in self.possible_agents
        }
        self.action_spaces = {seat: Rows(batch_size) for seat in self.possible_agents}
        self._seed(seed)
        self.records: list[GameRecord] = []
        self.turns: list[Turn] = []
        self.final_metrics: dict[str, dict[str, float]] = {}
        """Each seat's ``metrics`` of the last finished episode (as its final info holds them, which the agent's
        last, dead step removes); empty until an episode ends, and from each ``reset`` until the next one does."""
        self._observations: dict[str, dict[str, tuple[Any, ...]]] = {}

    def observation_space(self, agent: str) -> DictSpace:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> Rows:
        return self.action_spaces[agent]

    def _seed(self, seed: int | None) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be a non-negative int or None, got {seed!r}")
        self._rng = np.random.default_rng(seed)

    def state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """What a resumed run needs to deal the same games: (no tensors, JSON-able meta), for a checkpoint: the state of
        the generator that seeds each episode's games and plays random moves, with the batch size and seats. The
        current episode is not part of it: save between episodes."""
        rng = self._rng.bit_generator.state
        return {}, {"batch_size": self.batch_size, "seats": list(self.possible_agents), "rng": rng}

    def load_state_dict(self, tensors: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises:
            CheckpointError: the batch size or the seats differ from this env's.
        """
        if meta.get("batch_size") != self.batch_size or list(meta.get("seats", ())) != self.possible_agents:
            raise CheckpointError(
                f"the checkpoint's game env plays {meta.get('batch_size')} games with seats {meta.get('seats')}, this "
                f"one {self.batch_size} with seats {self.possible_agents}"
            )
        rng = np.random.default_rng()
        restore_generator(rng, meta["rng"], "game env")
        self._rng = rng

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        if seed is not None:
            self._seed(seed)
        game_seeds = self._rng.integers(0, 2**31 - 1, size=self.batch_size)
        self.records = [GameRecord(list(self.possible_agents)) for _ in self.games]
        self.turns = []
        self.final_metrics = {}
        self._observations = {}
        for index, (game, game_seed) in enumerate(zip(self.games, game_seeds, strict=True)):
            reset_game(game, int(game_seed), index, self.possible_agents, self.view.name)
            self._settle(index)
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {seat: {"role": seat} for seat in self.agents}
        following = self._next_seat(self.possible_agents[-1])
        if following is None:
            raise ValueError("every game of the batch was over at reset; a batched game needs at least one move")
        self.agent_selection = following
        self._update_masks()

    # --------------------------------------------------------------------------------------------- who moves where
    def to_move(self, seat: str) -> list[int]:
        """The games (indices) in which ``seat`` is to move now."""
        return [b for b, record in enumerate(self.records) if not record.over and self.games[b].agent_selection == seat]

    def _next_seat(self, after: str) -> str | None:
        order = self.possible_agents
        k = order.index(after)
        for seat in order[k + 1 :] + order[: k + 1]:
            if self.to_move(seat):
                return seat
        return None

    def _update_masks(self) -> None:
        for seat in self.agents:
            mask = np.zeros(self.batch_size, dtype=np.int8)
            mask[self.to_move(seat)] = 1
            self.infos[seat][keys.ACTION_MASK] = mask

    # --------------------------------------------------------------------------------------------- observation
    def observe(self, agent: str) -> dict[str, tuple[Any, ...]]:
        if agent not in self._observations:
            self._observations[agent] = self._observe(agent)
        return self._observations[agent]

    def _observe(self, seat: str) -> dict[str, tuple[Any, ...]]:
        games = self.to_move(seat)
        legal = [self.view.legal_moves(self.games[b], seat) for b in games]
        template, view = self.templates[seat], self.view
        prompts = tuple(
            render_prompt(view, self.games[b], self.records[b], seat, moves, template, b)
            for b, moves in zip(games, legal, strict=True)
        )
        observation = {
            keys.PROMPT: prompts,
            keys.LEGAL_MOVES: tuple(tuple(name for _, name in moves) for moves in legal),
            keys.LEGAL_ACTIONS: tuple(tuple(int(a) for a, _ in moves) for moves in legal),
            keys.HISTORY: tuple(self.view.history(self.games[b], self.records[b].moves) for b in games),
            keys.GAMES: tuple(games),
        }
        if self.history == "sequence":
            rows = zip(games, legal, prompts, strict=True)
            observation[keys.DELTA] = tuple(
                delta_text(view, self.games[b], self.records[b], seat, *r) for b, *r in rows
            )
        return observation

    # --------------------------------------------------------------------------------------------- moves
    def step(self, action: Sequence[str] | None) -> None:
        seat = self.agent_selection
        if self.terminations[seat] or self.truncations[seat]:
            self._was_dead_step(action)
            return
        observation = self.observe(seat)
        games = observation[keys.GAMES]
        if not self.action_spaces[seat].contains(action) or len(action) != len(games):
            raise ValueError(
                f"the action of seat {seat!r} must be a sequence of {len(games)} answer strings, one per game it "
                f"moves in ({list(games)}), got {describe_action(action)}"
            )
        self._cumulative_rewards[seat] = 0.0
        illegal = [
            self._play(b, seat, answer, names, actions)
            for b, answer, names, actions in zip(
                games, action, observation[keys.LEGAL_MOVES], observation[keys.LEGAL_ACTIONS], strict=True
            )
        ]
        self.turns.append(Turn(seat, np.asarray(games, dtype=np.int64), np.asarray(illegal, dtype=bool)))
        self._observations = {}
        following = self._next_seat(seat)
        if following is None:
            self._finish()
            self.agent_selection = self.possible_agents[0]
        else:
            self.agent_selection = following
            self._clear_rewards()
            self._update_masks()
        self._accumulate_rewards()

    def _play(self, index: int, seat: str, answer: str, names: Sequence[str], actions: Sequence[int]) -> bool:
        """Apply one answer to one game; whether it was illegal."""
        record, game = self.records[index], self.games[index]
        talk = self.view.free_text(game, seat)  # a message: the answer itself is the move
        if not (names or talk):
            raise RuntimeError(f"seat {seat!r} is to move in game {index} but the view lists no legal move for it")
        record.answers[seat] += 1
        choice = None if talk else self.parser(answer, names)
        illegal = not talk and (choice is None or not 0 <= choice < len(names))
        if illegal:
            record.illegal[seat] += 1
            if self.illegal == "forfeit":
                self._forfeit(index, seat)
                return True
            choice = int(self._rng.integers(len(names)))
        record.moves.append(Move(seat, FREE_TEXT, answer) if talk else Move(seat, actions[choice], names[choice]))
        record.seen[seat] = len(record.moves)
        game.step(answer if talk else record.moves[-1].action)
        for who, reward in game.rewards.items():
            record.returns[who] += float(reward)
        self._settle(index)
        if not record.over and record.length >= self.max_moves:  # a game that does not end: a draw
            record.capped, record.payoffs = True, dict.fromkeys(self.possible_agents, 0.0)
        return illegal

    def _forfeit(self, index: int, seat: str) -> None:
        loser, others = self.forfeit_payoffs or self.view.forfeit_payoffs(self.games[index])
        record = self.records[index]
        record.forfeited_by = seat
        record.payoffs = {who: float(loser if who == seat else others) for who in self.possible_agents}

    def _settle(self, index: int) -> None:
        """Step the game's departed agents out (None) until someone is to move; mark the game over when all are done."""
        game, record = self.games[index], self.records[index]
        while game.agents:
            done = [a for a in game.agents if game.terminations[a] or game.truncations[a]]
            if len(done) == len(game.agents):
                break
            if game.agent_selection not in done:
                return
            game.step(None)  # an agent that left mid-game: its dead step is the game's business, not a move
        record.payoffs = {seat: float(value) for seat, value in self.view.payoffs(game, dict(record.returns)).items()}

    # --------------------------------------------------------------------------------------------- end
    def _finish(self) -> None:
        seats = self.possible_agents
        payoffs = np.array([[record.payoffs[s] for s in seats] for record in self.records])  # (B, N)
        forfeited = np.array([seats.index(r.forfeited_by) if r.forfeited_by else -1 for r in self.records])
        result = outcomes(payoffs, forfeited)  # (B, N)
        lengths = np.array([record.length for record in self.records])
        capped = np.array([record.capped for record in self.records])
        if capped.any():
            warnings.warn(
                f"{int(capped.sum())} of {self.batch_size} games reached max_moves ({self.max_moves} answers) without "
                "ending and were ended as draws (payoff 0 to every seat): raise game.max_moves, or fix a game that "
                "never ends",
                stacklevel=3,
            )
        for i, seat in enumerate(seats):
            own = [turn for turn in self.turns if turn.seat == seat]
            games = [turn.games for turn in own]
            trained = turn_rewards(games, [t.illegal for t in own], payoffs[:, i], self.discount, self.illegal_penalty)
            answers = np.array([record.answers[seat] for record in self.records])
            illegal = np.array([record.illegal[seat] for record in self.records])
            self.rewards[seat] = float(payoffs[:, i].mean())
            self.infos[seat] = {
                "role": seat,
                keys.ACTION_MASK: np.zeros(self.batch_size, dtype=np.int8),
                TASK_REWARDS: payoffs[:, i].copy(),
                BATCH_REWARDS: payoffs[:, i].copy(),
                TURN_TASK_REWARDS: [payoffs[g, i] for g in games],
                TURN_BATCH_REWARDS: trained,
                TURN_DISCOUNTS: turn_discounts(games, self.discount),
                keys.TURN_GAMES: games,
                keys.PAYOFFS: payoffs[:, i].copy(),
                keys.OUTCOMES: result[:, i],
                keys.METRICS: seat_metrics(
                    payoffs[:, i], result[:, i], answers, illegal, lengths, forfeited == i, capped
                ),
            }
            metrics, cooperation = self.infos[seat][keys.METRICS], self.cooperation_counts(seat)
            if cooperation is not None:  # a social dilemma: the share of the seat's legal answers that cooperate
                cooperative, legal = cooperation
                if legal:  # no legal answer (all replaced): no rate, rather than NaN
                    metrics["cooperation_rate"] = cooperative / legal
                metrics["legal_answers"] = float(legal)
            metrics.update(view_metrics(self.view, self.games, seat, metrics))  # the game's own measures
            self.final_metrics[seat] = dict(metrics)
        self.terminations = dict.fromkeys(self.agents, True)

    def cooperation_counts(self, seat: str) -> tuple[int, int] | None:
        """(cooperative, legal): of the seat's legal answers in this batch (not moves played for illegal ones), how
        many chose the view's cooperative move (:meth:`~marllm.games.env.GameView.cooperative_move`), or None."""
        return count_cooperation(self.view, self.games, self.records, self.turns, seat)

    def render(self) -> str | None:
        if self.render_mode is None or not self.records:
            return None
        return describe_record(self.view, self.games[0], self.records[0], f"game 0 of {self.batch_size}")

    def close(self) -> None:
        for game in self.games:
            game.close()


raw_env = BatchedGameEnv
"""PettingZoo's name for the unwrapped env class."""


def env(**kwargs: Any) -> AECEnv:
    """``BatchedGameEnv(**kwargs)`` behind PettingZoo's order-enforcing wrapper."""
    return wrappers.OrderEnforcingWrapper(BatchedGameEnv(**kwargs))
