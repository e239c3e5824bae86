"""Tic-tac-toe wrapped by marllm's SharedReward and RolePermutation, trained with tianshou's multi-agent machinery.

marllm's wrappers are plain PettingZoo AEC wrappers, so they are not tied to marllm's text env or trainer. Here the
env is PettingZoo's classic tic-tac-toe, the adapter is tianshou's ``PettingZooEnv`` and the learning is tianshou's
``MultiAgentOnPolicyAlgorithm`` with one REINFORCE learner (``Reinforce``) for the "student" and a uniformly random
legal-move player for the "random" learner id:

* ``RolePermutation(period=1)`` swaps the seat of the two learner ids after every game, so one student network learns
  to play both first (X) and second (O). Without it tianshou's dispatcher would bind the student to ``player_1`` for
  good and it would never play second.
* ``SharedReward(C)`` sets what the student optimises. ``selfish`` is C = I, the game's own zero-sum reward (+1 win,
  -1 loss, 0 draw); ``altruistic`` is C = [[0, 1], [1, 0]], each agent is paid its opponent's reward, which in a
  zero-sum game is minus its own. The student should learn to win under the first and to lose under the second: the
  flip shows that the mixed rewards, not the game's, are what reaches tianshou's learner.

Before and after training the student plays (greedy, illegal moves masked out) against a uniformly random legal-move
player on the raw, unwrapped tic-tac-toe env, half the games in each seat, and the win/draw/loss rates are printed.

Two things tianshou 2.0.1 needs in order to run REINFORCE on a turn-based game, both independent of marllm's wrappers
and handled here:

* its on-policy actors know nothing of action masks (only DQN reads ``obs.mask``), so :class:`MaskedActor` gives
  illegal moves zero probability;
* its dispatcher credits each env step's reward vector only to the agent that moved, and only that agent's transition
  ends the episode. The agent that did not move last (the loser of a won game) never sees its -1 and its returns run
  on into its next game. :class:`TurnBasedMultiAgentOnPolicy` re-credits every agent with what it received until its
  next move (what ``last()`` reports in AEC), and ends each agent's episode at its own last move.

Run ``python examples/classic_games/tictactoe_tianshou.py --games 3000 --seed 0``.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from pettingzoo import AECEnv
from pettingzoo.classic import tictactoe_v3
from tianshou.algorithm.algorithm_base import OnPolicyAlgorithm, TrainingStats
from tianshou.algorithm.modelfree.reinforce import DiscreteActorPolicy, Reinforce
from tianshou.algorithm.multiagent.marl import MultiAgentOnPolicyAlgorithm
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.algorithm.random import MARLRandomDiscreteMaskedOffPolicyAlgorithm
from tianshou.data import Batch, Collector, ReplayBuffer
from tianshou.data.types import RolloutBatchProtocol
from tianshou.env import DummyVectorEnv, PettingZooEnv
from tianshou.trainer import OnPolicyTrainerParams
from tianshou.utils.net.common import ActionReprNet

from marllm.wrappers import RolePermutation, SharedReward

STUDENT, RANDOM = "student", "random"
REWARDS: dict[str, list[list[float]]] = {
    "selfish": [[1.0, 0.0], [0.0, 1.0]],
    "altruistic": [[0.0, 1.0], [1.0, 0.0]],
}


def make_env(coefficients: Sequence[Sequence[float]], period: int | None = 1) -> AECEnv:
    """Tic-tac-toe whose rewards are ``C · r`` and whose seats the learners ``student``/``random`` swap every game."""
    return RolePermutation(SharedReward(tictactoe_v3.env(), coefficients), period=period, learners=[STUDENT, RANDOM])


class MaskedActor(ActionReprNet):
    """An MLP from the 3×3×2 board planes to nine move logits; illegal moves get the lowest float, so p = 0.

    tianshou hands it ``batch.obs`` as the PettingZooEnv adapter built it: a Batch with ``obs`` (the planes) and
    ``mask`` (True where a move is legal).
    """

    def __init__(self, hidden: int = 64, num_moves: int = 9) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(18, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, num_moves),
        )

    def forward(self, obs: Batch, state: Any = None, info: dict[str, Any] | None = None) -> tuple[torch.Tensor, Any]:
        planes = torch.as_tensor(np.asarray(obs.obs), dtype=torch.float32).flatten(1)
        legal = torch.as_tensor(np.asarray(obs.mask), dtype=torch.bool)
        logits = self.net(planes)
        # finite rather than -inf: a Categorical over -inf logits has NaN entropy and gradients
        return logits.masked_fill(~legal, torch.finfo(logits.dtype).min), state


class RandomLegalMoves(OnPolicyAlgorithm):
    """tianshou's random legal-move player as an on-policy "learner" that learns nothing.

    tianshou ships it only as ``MARLRandomDiscreteMaskedOffPolicyAlgorithm``, whose update signature the on-policy
    multi-agent dispatcher cannot call; its policy is reused as is.
    """

    def __init__(self, action_space: spaces.Discrete) -> None:
        super().__init__(policy=MARLRandomDiscreteMaskedOffPolicyAlgorithm.Policy(action_space))

    def _update_with_batch(self, batch: RolloutBatchProtocol, batch_size: int | None, repeat: int) -> TrainingStats:
        return TrainingStats()


def credit_turns(
    agent_ids: np.ndarray,
    rewards: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    boundaries: np.ndarray,
    agent_index: dict[str, int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Re-credit a turn-based rollout: each move earns what its agent receives until its next move.

    Args:
        agent_ids: (T,) the agent that moved at each transition, in time order.
        rewards: (T, N) the reward vector every agent received at each transition.
        terminated, truncated: (T,) how the episode ended after each transition.
        boundaries: (T,) True where the rollout's episode stops after this transition (ended, or data runs out).
        agent_index: agent id -> column of ``rewards``.

    Returns:
        (credited, own_terminated, own_truncated): credited[t] is the reward vector with only the mover's entry set,
        the sum of its column over transitions t … (its next move − 1) or the episode's end; each agent's last move in
        an episode carries the episode's end flags. A segment cut short by the data's end is marked truncated.
    """
    credited = np.zeros_like(rewards, dtype=np.float64)
    own_terminated = np.zeros(len(agent_ids), dtype=bool)
    own_truncated = np.zeros(len(agent_ids), dtype=bool)
    latest: dict[int, int] = {}  # agent column -> its latest move in the current episode
    for t, agent in enumerate(agent_ids):
        latest[agent_index[str(agent)]] = t
        for column, move in latest.items():
            credited[move, column] += rewards[t, column]
        if boundaries[t]:
            ended = bool(terminated[t] or truncated[t])
            for move in latest.values():
                own_terminated[move] = bool(terminated[t])
                own_truncated[move] = bool(truncated[t]) or not ended
            latest = {}
    return credited, own_terminated, own_truncated


class TurnBasedMultiAgentOnPolicy(MultiAgentOnPolicyAlgorithm):
    """tianshou's ``MultiAgentOnPolicyAlgorithm`` with AEC credit assignment for turn-based games (see
    :func:`credit_turns`); the dispatch to each agent's algorithm is tianshou's own."""

    def __init__(self, *, algorithms: list[OnPolicyAlgorithm], env: PettingZooEnv) -> None:
        super().__init__(algorithms=algorithms, env=env)
        self._agent_index = dict(env.agent_idx)

    def _preprocess_batch(
        self, batch: RolloutBatchProtocol, buffer: ReplayBuffer, indices: np.ndarray
    ) -> RolloutBatchProtocol:
        if isinstance(batch.rew, np.ndarray) and len(indices):
            successor = buffer.next(indices)
            boundaries = np.ones(len(indices), dtype=bool)
            boundaries[:-1] = (successor[:-1] != indices[1:]) | (successor[:-1] == indices[:-1])
            boundaries |= batch.terminated | batch.truncated
            batch.rew, batch.terminated, batch.truncated = credit_turns(
                batch.obs.agent_id, batch.rew, batch.terminated, batch.truncated, boundaries, self._agent_index
            )
            # tianshou's value mask (whether to bootstrap past a transition) reads buffer.terminated, so it must see
            # the per-agent episode ends too; tianshou's dispatcher swaps buffer.rew the same way
            stored = buffer._meta.terminated
            own = stored.copy()
            own[indices] = batch.terminated
            buffer._meta.terminated = own
            try:
                return super()._preprocess_batch(batch, buffer, indices)
            finally:
                buffer._meta.terminated = stored
        return super()._preprocess_batch(batch, buffer, indices)


@dataclass
class Student:
    """The trainable side: the REINFORCE algorithm and the policy it trains."""

    algorithm: Reinforce
    policy: DiscreteActorPolicy


def make_student(learning_rate: float = 1e-2, gamma: float = 0.9, hidden: int = 64) -> Student:
    """A REINFORCE learner whose greedy (mode) action is used for evaluation.

    Returns are standardised with a running mean and std (tianshou's ``return_standardization``), which acts as a
    baseline: without it, against a random player most games are won and nearly every move gets reinforced.
    """
    policy = DiscreteActorPolicy(actor=MaskedActor(hidden), action_space=spaces.Discrete(9), deterministic_eval=True)
    algorithm = Reinforce(
        policy=policy, gamma=gamma, optim=AdamOptimizerFactory(lr=learning_rate), return_standardization=True
    )
    return Student(algorithm, policy)


@dataclass(frozen=True)
class Record:
    """Game outcomes from the student's side."""

    wins: int = 0
    draws: int = 0
    losses: int = 0

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    def rate(self, outcome: str) -> float:
        return getattr(self, outcome) / max(self.games, 1)

    def __add__(self, other: Record) -> Record:
        return Record(self.wins + other.wins, self.draws + other.draws, self.losses + other.losses)

    def __str__(self) -> str:
        return (
            f"win {self.rate('wins'):6.1%}  draw {self.rate('draws'):6.1%}  loss {self.rate('losses'):6.1%}"
            f"  ({self.games} games)"
        )


def greedy_move(policy: DiscreteActorPolicy) -> Callable[[dict[str, np.ndarray]], int]:
    """The policy's most probable legal move for one tic-tac-toe observation dict."""

    def move(observation: dict[str, np.ndarray]) -> int:
        obs = Batch(obs=observation["observation"][None], mask=observation["action_mask"][None].astype(bool))
        with torch.no_grad():
            return int(policy(Batch(obs=obs, info=Batch())).act[0])

    return move


def play_vs_random(move: Callable[[dict[str, np.ndarray]], int], games: int, seed: int) -> dict[str, Record]:
    """Play ``games`` games of raw tic-tac-toe against a uniformly random legal-move player.

    The student plays first in even games and second in odd ones. Returns records for ``"first"``, ``"second"`` and
    ``"all"``. Raises AssertionError if ``move`` ever picks an illegal square.
    """
    rng = np.random.default_rng(seed)
    env = tictactoe_v3.env()
    records = {"first": Record(), "second": Record()}
    for game in range(games):
        seat = "first" if game % 2 == 0 else "second"
        student = "player_1" if seat == "first" else "player_2"
        env.reset(seed=seed + game)
        outcome = 0.0
        for agent in env.agent_iter():
            observation, reward, terminated, truncated, _ = env.last()
            if terminated or truncated:
                if agent == student:
                    outcome = reward
                env.step(None)
                continue
            legal = np.flatnonzero(observation["action_mask"])
            action = move(observation) if agent == student else int(rng.choice(legal))
            assert action in legal, f"illegal move {action} by {agent}; legal moves {legal.tolist()}"
            env.step(action)
        won, lost = outcome > 0, outcome < 0
        records[seat] = records[seat] + Record(int(won), int(not won and not lost), int(lost))
    env.close()
    return {**records, "all": records["first"] + records["second"]}


@dataclass(frozen=True)
class TrainingRun:
    """How much a :func:`train` call played."""

    games: int
    steps: int
    seconds: float


def train(
    student: Student,
    coefficients: Sequence[Sequence[float]],
    games: int,
    seed: int,
    games_per_update: int = 32,
) -> TrainingRun:
    """Train ``student`` against the random player, ``games`` rounded to a multiple of ``games_per_update``.

    One env, so the on-policy buffer holds whole games in time order, which :func:`credit_turns` relies on.
    """
    start = time.perf_counter()
    # the collector summarises the (games, 2) return array as if flat, with a warning per collection step
    logging.getLogger("tianshou.data.stats").setLevel(logging.ERROR)
    torch.manual_seed(seed)
    np.random.seed(seed)  # tianshou's random player draws from numpy's global generator
    adapter = PettingZooEnv(make_env(coefficients))
    venv = DummyVectorEnv([lambda: adapter])
    venv.seed(seed)
    algorithm = TurnBasedMultiAgentOnPolicy(
        algorithms=[student.algorithm, RandomLegalMoves(adapter.action_space)], env=adapter
    )
    collector = Collector(algorithm, venv, ReplayBuffer(games_per_update * 10))
    result = algorithm.run_training(
        OnPolicyTrainerParams(
            training_collector=collector,
            # an epoch collects until it holds epoch_num_steps env steps: 1 makes every epoch one collect + update
            max_epochs=max(1, round(games / games_per_update)),
            epoch_num_steps=1,
            collection_step_num_env_steps=None,
            collection_step_num_episodes=games_per_update,
            batch_size=None,
            update_step_num_repetitions=1,
            test_collector=None,
            multi_agent_return_reduction=lambda returns: returns[:, adapter.agent_idx[STUDENT]],
            verbose=False,
            show_progress=False,
        )
    )
    venv.close()
    return TrainingRun(int(result.train_episode), int(result.train_step), time.perf_counter() - start)


def run(reward: str, games: int, seed: int, eval_games: int) -> dict[str, dict[str, Record]]:
    """Evaluate an untrained student, train it under ``REWARDS[reward]``, evaluate again; prints both."""
    torch.manual_seed(seed)
    student = make_student()
    before = play_vs_random(greedy_move(student.policy), eval_games, seed=10_000 + seed)
    trained = train(student, REWARDS[reward], games, seed)
    after = play_vs_random(greedy_move(student.policy), eval_games, seed=10_000 + seed)
    print(
        f"\n{reward} reward, C = {REWARDS[reward]}: trained on {trained.games} games "
        f"({trained.steps} env steps) in {trained.seconds:.1f} s"
    )
    for seat in ("first", "second", "all"):
        print(f"  before  {seat:6}  {before[seat]}")
        print(f"  after   {seat:6}  {after[seat]}")
    return {"before": before, "after": after}


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``--games``, ``--seed``, ``--eval-games``, ``--reward``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", type=int, default=3000, help="training games per reward setting")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-games", type=int, default=2000, help="games vs the random player, before and after")
    parser.add_argument("--reward", choices=[*REWARDS, "both"], default="both")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    reference = play_vs_random(lambda obs: int(rng.choice(np.flatnonzero(obs["action_mask"]))), args.eval_games, 0)
    print("for reference, a uniformly random player in the student's place:")
    for seat in ("first", "second", "all"):
        print(f"          {seat:6}  {reference[seat]}")
    for reward in REWARDS if args.reward == "both" else [args.reward]:
        run(reward, args.games, args.seed, args.eval_games)


if __name__ == "__main__":
    main()
