"""marllm's wrappers on a non-text AEC env: tic-tac-toe under SharedReward and RolePermutation, driven by tianshou.

Exercises ``examples/classic_games/tictactoe_tianshou.py``: the wrapped env passes PettingZoo's API test, its rewards
are C·r and its seats rotate both in AEC and through tianshou's ``PettingZooEnv`` adapter, tianshou's collection
respects the action masks, the turn-based credit gives the loser its -1, and a short REINFORCE run beats a random
player more often than the untrained network did.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from pettingzoo.classic import tictactoe_v3
from pettingzoo.test import api_test
from tianshou.data import Collector, ReplayBuffer
from tianshou.env import DummyVectorEnv, PettingZooEnv

from marllm.wrappers import RolePermutation, SharedReward, cooperation_matrix
from tests.test_wrappers import TICTACTOE_WIN, play_tictactoe

torch.set_num_threads(1)

# api_test recommends agent names like "player_0"; the learner ids "student" and "random" are names by design
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:pettingzoo.test.api_test")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "classic_games" / "tictactoe_tianshou.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tictactoe_tianshou", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


ttt = load_example()
STUDENT, RANDOM = ttt.STUDENT, ttt.RANDOM

# TICTACTOE_WIN: X (player_1) takes 0, 1, 2 (the top row) while O takes 3 and 4, and wins on the fifth move;
# play_tictactoe plays it on an AEC env and returns what last() reports to each agent when it is done.


def adapter_game(adapter: PettingZooEnv) -> tuple[str, list[float]]:
    """Play TICTACTOE_WIN through tianshou's adapter after a reset: (the learner who moved first, the final rewards)."""
    obs, _ = adapter.reset()
    first = obs["agent_id"]
    for move in TICTACTOE_WIN:
        assert obs["mask"][move], f"scripted move {move} should be legal"
        obs, rewards, terminated, _, _ = adapter.step(move)
    assert terminated
    return first, list(rewards)


# --- (a) PettingZoo's API test ------------------------------------------------------------------------------------


@pytest.mark.parametrize("coefficients", [ttt.REWARDS["selfish"], ttt.REWARDS["altruistic"], [[1, 0.5], [0.5, 1]]])
@pytest.mark.parametrize("period", [1, 3, None])
def test_api_test_passes_on_the_wrapped_tictactoe(coefficients, period):
    api_test(ttt.make_env(coefficients, period=period), num_cycles=100)


def test_api_test_passes_with_the_wrappers_the_other_way_round():
    env = SharedReward(RolePermutation(tictactoe_v3.env(), period=1, learners=[STUDENT, RANDOM]), [[1, -1], [-1, 1]])
    api_test(env, num_cycles=100)


# --- (b) SharedReward: C · r on a scripted game ------------------------------------------------------------------


@pytest.mark.parametrize("weight", [0.0, 0.5, -0.5, 1.0, 2.0])
def test_shared_reward_is_c_times_r_in_aec_and_through_tianshou(weight):
    """X wins: r = (+1, -1), so C = [[1, λ], [λ, 1]] gives X 1 - λ and O -1 + λ."""
    winner, loser = 1 - weight, -1 + weight
    assert play_tictactoe(tictactoe_v3.env()) == {"player_1": 1, "player_2": -1}
    mixed = SharedReward(tictactoe_v3.env(), cooperation_matrix(2, weight))
    assert play_tictactoe(mixed) == pytest.approx({"player_1": winner, "player_2": loser})

    # with period=None the student keeps X, so through tianshou's adapter it is the winner
    adapter = PettingZooEnv(ttt.make_env(cooperation_matrix(2, weight), period=None))
    first, rewards = adapter_game(adapter)
    assert first == STUDENT
    assert rewards[adapter.agent_idx[STUDENT]] == pytest.approx(winner)
    assert rewards[adapter.agent_idx[RANDOM]] == pytest.approx(loser)


def test_altruistic_matrix_pays_each_agent_its_opponents_reward():
    env = SharedReward(tictactoe_v3.env(), ttt.REWARDS["altruistic"])
    assert play_tictactoe(env) == {"player_1": -1, "player_2": 1}


# --- (c) RolePermutation: who plays first --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "period,first_movers",
    [
        (1, [RANDOM, STUDENT, RANDOM, STUDENT]),
        (2, [STUDENT, RANDOM, RANDOM, STUDENT]),
        (None, [STUDENT, STUDENT, STUDENT, STUDENT]),
    ],
)
def test_role_permutation_swaps_who_plays_first_through_tianshou(period, first_movers):
    """The adapter's __init__ is reset 1 (student in X); resets 2-5 follow. Rewards follow the seat, not the name."""
    adapter = PettingZooEnv(ttt.make_env(ttt.REWARDS["selfish"], period=period))
    assert adapter.agents == [STUDENT, RANDOM]
    for expected_first in first_movers:
        first, rewards = adapter_game(adapter)
        assert first == expected_first
        assert adapter.env.infos[first]["role"] == "player_1"
        other = RANDOM if first == STUDENT else STUDENT
        assert rewards[adapter.agent_idx[first]] == 1
        assert rewards[adapter.agent_idx[other]] == -1


def test_role_permutation_swaps_in_plain_aec_after_period_resets():
    env = ttt.make_env(cooperation_matrix(2, 0.25), period=2)
    winners = []
    for _ in range(6):
        final = play_tictactoe(env)
        winners.append(max(final, key=final.get))
        assert sorted(final.values()) == pytest.approx([-0.75, 0.75])
    assert winners == [STUDENT, STUDENT, RANDOM, RANDOM, STUDENT, STUDENT]


# --- tianshou's machinery on the wrapped env ------------------------------------------------------------------------


def collect(coefficients, games: int, seed: int = 0):
    """Untrained student vs random, collected by tianshou's Collector; (algorithm, buffer, indices, raw batch)."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    adapter = PettingZooEnv(ttt.make_env(coefficients))
    student = ttt.make_student()
    algorithm = ttt.TurnBasedMultiAgentOnPolicy(
        algorithms=[student.algorithm, ttt.RandomLegalMoves(adapter.action_space)], env=adapter
    )
    collector = Collector(algorithm, DummyVectorEnv([lambda: adapter]), ReplayBuffer(games * 10))
    collector.reset()
    stats = collector.collect(n_episode=games)
    assert stats.n_collected_episodes == games
    batch, indices = collector.buffer.sample(0)
    return algorithm, collector.buffer, indices, batch


def test_collected_moves_are_always_legal_for_both_learners():
    _, _, _, batch = collect(ttt.REWARDS["selfish"], games=60)
    mask = np.asarray(batch.obs.mask)
    assert mask[np.arange(len(batch)), batch.act].all()
    assert set(batch.obs.agent_id) == {STUDENT, RANDOM}


@pytest.mark.parametrize("reward", ["selfish", "altruistic"])
def test_turn_based_credit_gives_every_agent_its_game_outcome(reward):
    """Summed per learner, the credited rewards equal each game's final reward vector; without the re-credit tianshou
    hands the step's reward only to the mover, and the loser's -1 disappears."""
    algorithm, buffer, indices, batch = collect(ttt.REWARDS[reward], games=60)
    ends = np.flatnonzero(batch.terminated | batch.truncated)
    assert len(ends) == 60
    outcome = batch.rew[ends]  # (games, 2) learner rewards at each game's last step

    column = algorithm._dispatcher.agent_idx
    student_moves = np.asarray(batch.obs.agent_id) == STUDENT
    uncredited = np.asarray(batch.rew)[student_moves, column[STUDENT]]
    stored_terminated = buffer.terminated.copy()

    processed = algorithm._preprocess_batch(batch, buffer, indices)
    for learner in (STUDENT, RANDOM):
        own = processed[learner]
        assert own.rew.sum() == pytest.approx(outcome[:, column[learner]].sum())
        assert np.count_nonzero(own.rew) == np.count_nonzero(outcome[:, column[learner]])
        assert own.terminated.sum() == 60  # each learner's own episode ends once per game
    # what is fixed: before re-crediting, the student's moves hold only the outcomes of games it ended itself;
    # the games the random player decided with its last move are missing, and there are some
    last_mover = np.asarray(batch.obs.agent_id)[ends]
    decisive = outcome[:, column[STUDENT]] != 0
    assert np.count_nonzero(uncredited) == (decisive & (last_mover == STUDENT)).sum()
    assert (decisive & (last_mover == RANDOM)).sum() > 0
    assert np.array_equal(buffer.terminated, stored_terminated)


def test_credit_turns_on_a_hand_made_rollout():
    """Two games: A wins the first on its 3rd move; in the second B moves first and the game is drawn."""
    index = {"A": 0, "B": 1}
    agents = np.array(["A", "B", "A", "B", "A", "B", "A", "B"])
    rewards = np.zeros((8, 2))
    rewards[4] = [1, -1]
    terminated = np.array([0, 0, 0, 0, 1, 0, 0, 1], dtype=bool)
    truncated = np.zeros(8, dtype=bool)
    credited, own_terminated, own_truncated = ttt.credit_turns(
        agents, rewards, terminated, truncated, terminated.copy(), index
    )
    expected = np.zeros((8, 2))
    expected[4, 0] = 1  # A's winning move
    expected[3, 1] = -1  # B's last move before A won
    assert np.array_equal(credited, expected)
    assert own_terminated.tolist() == [0, 0, 0, 1, 1, 0, 1, 1]
    assert not own_truncated.any()

    # a rollout cut off mid-game: the last move of each agent is marked truncated, not terminated
    cut = np.zeros(3, dtype=bool)
    _, own_terminated, own_truncated = ttt.credit_turns(
        agents[:3], rewards[:3], cut, cut, np.array([0, 0, 1], dtype=bool), index
    )
    assert own_terminated.tolist() == [0, 0, 0]
    assert own_truncated.tolist() == [0, 1, 1]


def test_greedy_policy_never_picks_a_masked_move():
    student = ttt.make_student()
    torch.nn.init.constant_(student.policy.actor.net[-1].bias, 0.0)
    with torch.no_grad():
        student.policy.actor.net[-1].bias[4] = 100.0  # the centre would win every argmax if masks were ignored
    move = ttt.greedy_move(student.policy)
    mask = np.zeros(9, dtype=np.int8)
    mask[[0, 8]] = 1
    board = np.zeros((3, 3, 2), dtype=np.int8)
    board[1, 1, 1] = 1
    assert move({"observation": board, "action_mask": mask}) in (0, 8)


# --- (d) a short training run ------------------------------------------------------------------------------------

# Measured on this code (992 training games = 31 updates of 32 games, greedy evaluation on 1000 games, 500 per seat,
# CPU, one thread), the win rate against a uniformly random player went from before -> after, seeds 0-7:
#   64.8 -> 78.5, 63.0 -> 70.4, 48.2 -> 79.9, 23.3 -> 81.5, 56.8 -> 78.4, 29.2 -> 73.7, 35.9 -> 74.3, 61.2 -> 80.6 (%)
# and the loss rate fell in every one (a random player wins about 44% of such games). The smallest gain is +7.4
# points (seed 1), the asserted margin +4; one rate's standard error at 1000 games is about 1.5 points. The lowest
# trained rate is 70.4% and the highest untrained one 64.8% (seed 0's own): the asserted floor, 70%, lies between,
# 5 points above what the untrained network wins (a floor of 65% it nearly met: with a learning rate of 4e-4 instead
# of 1e-2 seed 0 reached only 68.9%, +4.1 points and fewer losses, which passed everything else asserted here).
# With 640 games seed 0 gained only 4.3 points, hence 992. About 15 s of training and 5 s of evaluation on a loaded
# 2-core machine.
TRAIN_GAMES, EVAL_GAMES, SEED, WIN_FLOOR = 992, 1000, 0, 0.70


def test_short_training_beats_a_random_player_more_often_than_before():
    torch.manual_seed(SEED)
    student = ttt.make_student()
    before = ttt.play_vs_random(ttt.greedy_move(student.policy), EVAL_GAMES, seed=10_000 + SEED)
    trained = ttt.train(student, ttt.REWARDS["selfish"], TRAIN_GAMES, SEED)
    after = ttt.play_vs_random(ttt.greedy_move(student.policy), EVAL_GAMES, seed=10_000 + SEED)

    assert trained.games == TRAIN_GAMES
    assert 5 * TRAIN_GAMES <= trained.steps <= 9 * TRAIN_GAMES  # whole games of 5 to 9 moves
    assert before["all"].games == after["all"].games == EVAL_GAMES
    assert after["first"].games == after["second"].games == EVAL_GAMES // 2
    assert after["all"].rate("wins") >= before["all"].rate("wins") + 0.04, (str(before["all"]), str(after["all"]))
    assert before["all"].rate("wins") <= WIN_FLOOR - 0.04, str(before["all"])  # a floor the untrained net is far from
    assert after["all"].rate("wins") >= WIN_FLOOR, str(after["all"])
    assert after["all"].rate("losses") < before["all"].rate("losses"), (str(before["all"]), str(after["all"]))
