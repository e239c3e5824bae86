"""Players of small OpenSpiel games that play a tabular policy: CFR's average policy and an exact best response.

Both look the policy up at the seat's information state, rebuilt from the observation's ``history`` (the OpenSpiel
history, chance outcomes included) in the game's solved twin (:func:`~marllm.games.env.info_states.solved_twin`),
sample a move from it and answer with the move's exact name. The seat comes from ``act``'s ``role`` (``player_<i>``,
as the loop passes it); without it, from whose turn it is (sequential games only).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from marllm.games.env.info_states import enumerate_info_states, load_game, solved_twin
from marllm.games.env.keys import HISTORY, LEGAL_ACTIONS, LEGAL_MOVES
from marllm.games.players.fixed import FixedPlayer

if TYPE_CHECKING:
    from marllm.games.opponents import SeatArguments


class TabularPlayer(FixedPlayer):
    """Plays :meth:`policy`'s probabilities at its information state in an OpenSpiel game.

    Args:
        game: the OpenSpiel game string (``kuhn_poker``, ``openspiel:kuhn_poker``) or ``pyspiel.Game`` the env plays.
        name: the player's id.
        seed: seeds its draws.
    """

    def __init__(self, game: Any, name: str, seed: int = 0):
        super().__init__(name)
        self.game = load_game(game)
        self.solved = solved_twin(self.game)
        self._rng = np.random.default_rng(seed)

    def policy(self, player: int) -> Any:
        """The OpenSpiel policy (of :attr:`solved`) that ``player`` plays."""
        raise NotImplementedError

    def act(self, observation: Mapping[str, Sequence[Any]], role: str | None = None) -> tuple[str, ...]:
        self._unrewarded += 1
        rows = zip(observation[LEGAL_MOVES], observation[LEGAL_ACTIONS], observation[HISTORY], strict=True)
        return tuple(self.play(names, actions, history, role) for names, actions, history in rows)

    def answer(self, observation: Mapping[str, Sequence[Any]]) -> tuple[str, ...]:
        rows = zip(observation[LEGAL_MOVES], observation[LEGAL_ACTIONS], observation[HISTORY], strict=True)
        return tuple(self.play(names, actions, history, None) for names, actions, history in rows)

    def play(self, names: Sequence[str], actions: Sequence[int], history: Sequence[int], role: str | None) -> str:
        """The name of the move drawn from the policy at the information state of ``role`` after ``history``."""
        state, player = self.information_state(history, role)
        probabilities = self.policy(player).action_probabilities(state, player)
        p = np.array([probabilities.get(int(a), 0.0) for a in actions], dtype=np.float64)
        if p.sum() <= 0:
            raise ValueError(f"player {self.name!r}: its policy gives no legal move of {list(names)} any probability")
        return names[int(self._rng.choice(len(names), p=p / p.sum()))]

    def information_state(self, history: Sequence[int], role: str | None) -> tuple[Any, int]:
        """A state of :attr:`solved` in the seat's information state, and the seat's player number."""
        state = self.solved.new_initial_state()
        for action in history:
            state.apply_action(int(action))
        if role is None:
            if self.game.get_type().dynamics != self.game.get_type().dynamics.SEQUENTIAL:
                raise ValueError(f"player {self.name!r} needs its seat (act's role) in a game of simultaneous moves")
            return state, state.current_player()
        player = int(role.rsplit("_", 1)[-1])
        simultaneous = self.game.get_type().dynamics.name == "SIMULTANEOUS"
        while simultaneous and 0 <= state.current_player() < player:  # this round's earlier movers: hidden from it
            state.apply_action(state.legal_actions()[0])
        if state.current_player() != player:
            raise ValueError(f"player {self.name!r}: seat {role!r} is not to move after history {list(history)}")
        return state, player


class CFRPlayer(TabularPlayer):
    """Plays the average policy of OpenSpiel's CFR (``open_spiel.python.algorithms.cfr``) after ``iterations``
    iterations: an ε-Nash equilibrium of a two-player zero-sum game, ε shrinking as O(1/√iterations) (Kuhn poker:
    exploitability about 0.015 after 50). Solved when the first such player of the game is made
    (:func:`cfr_average_policy`).

    Args:
        game: as :class:`TabularPlayer`'s; it must be enumerable (:func:`~marllm.games.env.info_states.
            enumerate_info_states`).
        iterations: CFR iterations.
        name: the player's id.
        seed: seeds its draws.
    """

    def __init__(self, game: Any, iterations: int = 100, name: str = "cfr", seed: int = 0):
        super().__init__(game, name, seed)
        self.iterations = iterations
        self.average_policy = cfr_average_policy(str(self.game), iterations)

    @classmethod
    def from_seat(cls, seat: SeatArguments) -> CFRPlayer:
        """A ``cfr`` seat's player: CFR's average policy after its settings' ``iterations``."""
        return cls(seat.game.info.openspiel, seat.settings.iterations, seat.name, seed=seat.seed)

    def policy(self, player: int) -> Any:
        return self.average_policy


@functools.lru_cache(maxsize=8)
def cfr_average_policy(game: str, iterations: int) -> Any:
    """CFR's average ``TabularPolicy`` (of the solved twin) of the OpenSpiel game string ``game`` after ``iterations``
    iterations; cached, so that players made again (a batch each) do not solve again. Refuses games too large."""
    if iterations < 1:
        raise ValueError(f"CFR needs iterations >= 1, got {iterations}")
    from open_spiel.python.algorithms import cfr  # OpenSpiel: the optional marllm[games] extra

    enumerate_info_states(game)
    solver = cfr.CFRSolver(solved_twin(load_game(game)))
    for _ in range(iterations):
        solver.evaluate_and_update_policy()
    return solver.average_policy()


class BestResponsePlayer(TabularPlayer):
    """Plays an exact best response (``open_spiel.python.algorithms.best_response``) to a target's tabulated policy,
    the target playing every other seat; the target's policy is read again every ``every`` updates (iterations).

    Args:
        game: as :class:`TabularPlayer`'s.
        target: gives the target's current policy (an OpenSpiel policy of the solved twin; e.g.
            :meth:`~marllm.games.exploitability.ExactGame.tabulate` of a learner).
        every: updates between two readings of the target's policy (>= 1).
        name: the player's id.
        seed: seeds its draws (a best response is deterministic: ties go to OpenSpiel's first best action).
    """

    def __init__(
        self, game: Any, target: Callable[[], Any], every: int = 1, name: str = "best_response", seed: int = 0
    ):
        super().__init__(game, name, seed)
        if every < 1:
            raise ValueError(f"a best response is recomputed every >= 1 iterations, got {every}")
        self.target, self.every = target, every
        self._updates = 0
        self._responses: dict[int, Any] = {}

    @classmethod
    def from_seat(cls, seat: SeatArguments) -> BestResponsePlayer:
        """A ``best_response`` seat's player: a best response to the watched learner's tabulated policy
        (``seat.learner_policy``), read every ``every`` iterations (its settings)."""
        assert seat.learner_policy is not None  # the seat builder tabulates the learner of an opponent that reads it
        every = seat.settings.every
        return cls(seat.game.info.openspiel, seat.learner_policy, every, seat.name, seed=seat.seed)

    def policy(self, player: int) -> Any:
        if player not in self._responses:
            from open_spiel.python.algorithms.best_response import BestResponsePolicy  # the marllm[games] extra

            if not self._responses:
                self._target_policy = self.target()
            self._responses[player] = BestResponsePolicy(self.solved, player, self._target_policy)
        return self._responses[player]

    def update(self) -> dict[str, float]:
        """Learn nothing; every ``every`` updates, forget the best responses (the next move reads the target again)."""
        stats = super().update()
        self._updates += 1
        if self._updates % self.every == 0:
            self._responses = {}
        return stats
