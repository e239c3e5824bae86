"""Games driven by the unchanged training loop: self-play with one learner in every seat, SPIRAL's role-conditioned
baselines, SharedReward and RolePermutation over a batched game, and a tiny GPT-2 that learns to exploit a biased
rock-paper-scissors player."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from pettingzoo.classic import rps_v2, tictactoe_v3
from pettingzoo.test import api_test
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from marllm.algorithms import GenerationConfig, PPOConfig, PPOLearner
from marllm.games.env import BatchedGameEnv
from marllm.games.players import RandomMover
from marllm.loop import run_iteration
from marllm.wrappers import RoleBaselines, RolePermutation, SharedReward, cooperation_matrix
from marllm.wrappers.role_baselines import step_baselines
from tests.conftest import make_tiny_gpt2
from tests.test_games_env import CountdownGame

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class RecordingLearner:
    """A Learner that answers each row with a scripted move and checks that every reward row fits its act."""

    model = None
    tokenizer = None

    def __init__(self, name: str, pick=lambda names, game: names[0]):
        self.name = name
        self.pick = pick
        self.acts: list[tuple[int, ...]] = []
        self.roles: list[str | None] = []
        self.rewards: list[np.ndarray] = []
        self.updates = 0

    def act(self, observation, role=None):
        self.acts.append(tuple(observation["games"]))
        self.roles.append(role)
        rows = zip(observation["legal_moves"], observation["games"], strict=True)
        return tuple(self.pick(names, game) for names, game in rows)

    def finish(self, rewards, task_rewards=None):
        pending = self.acts[len(self.rewards)]
        assert len(rewards) == len(pending), f"{len(rewards)} rewards for an act of {len(pending)} rows"
        self.rewards.append(np.asarray(rewards, dtype=np.float64))

    def update(self):
        self.updates += 1
        return {"updates": float(self.updates)}

    def activate(self):
        pass

    def reference_model(self):
        return contextlib.nullcontext(None)

    def state_dict(self):
        return {}, {}

    def load_state_dict(self, tensors, meta):
        pass

    def save(self, directory):
        pass


# --- self-play: one learner, every seat ---------------------------------------------------------------------------


def test_one_learner_in_both_seats_is_rewarded_in_act_order_and_updated_once():
    environment = BatchedGameEnv(lambda: CountdownGame(target=5), batch_size=6, seed=3)
    learner = RecordingLearner("shared")
    seats = {seat: learner for seat in environment.possible_agents}  # the loop's mapping: no adapter needed
    metrics, dialogues = run_iteration(environment, seats, seed=3)
    assert learner.updates == 1
    assert metrics["p0/updates"] == 1.0 and not any(k.startswith("p1/") and k != "p1/role" for k in metrics)
    # its acts interleave the seats with different rows; every reward row matched its act (checked in finish)
    assert len({len(rows) for rows in learner.acts}) > 1
    assert len(learner.rewards) == len(learner.acts) == sum(len(d["turns"]) for d in dialogues.values())
    # and carries the payoff of the seat that made that act (the loop passes the seat as the role), in its games
    payoffs = {s: np.array([r.payoffs[s] for r in environment.records]) for s in environment.possible_agents}
    assert learner.roles[:2] == ["p0", "p1"]
    for games, rewards, seat in zip(learner.acts, learner.rewards, learner.roles, strict=True):
        np.testing.assert_array_equal(rewards, payoffs[seat][list(games)])
    # a second iteration works the same
    run_iteration(environment, seats, seed=4)
    assert learner.updates == 2


def word_tokenizer(words):
    """A word-level tokenizer: every word one token, so that a tiny model says a move in one token."""
    vocabulary = {word: i for i, word in enumerate(["<eos>", "<unk>", *words])}
    bare = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    bare.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    bare.decoder = decoders.WordPiece()  # joins the words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=bare, bos_token="<eos>", eos_token="<eos>", pad_token="<eos>", unk_token="<unk>"
    )


def tiny_learner(tokenizer, seed=0, mini_batch_size=1, generation=(1, 3), last_minibatch="whole"):
    model = make_tiny_gpt2(tokenizer, n_positions=32, seed=seed)
    reference = make_tiny_gpt2(tokenizer, n_positions=32, seed=seed).requires_grad_(False).eval()
    config = PPOConfig.from_flat(mini_batch_size=mini_batch_size, learning_rate=3e-3, init_kl_coef=0.01,
                                 kl_control="fixed", last_minibatch=last_minibatch)  # fmt: skip
    return PPOLearner("llm", model=model, tokenizer=tokenizer, reference=reference, config=config,
                      generation=GenerationConfig(*generation), seed=seed)  # fmt: skip


def test_self_play_of_a_tiny_ppo_learner_at_tictactoe():
    """A PPO learner in both seats of games that end at different moves: rollouts of varying sizes (mini-batches of
    1, as PPO needs every rollout to split into whole mini-batches), one update per iteration."""
    torch.manual_seed(0)
    tokenizer = word_tokenizer([str(k) for k in range(1, 10)] + ["move"])
    learner = tiny_learner(tokenizer)
    environment = BatchedGameEnv(tictactoe_v3.env, batch_size=4, templates="{move_names} move", illegal="random")
    seats = {seat: learner for seat in environment.possible_agents}
    for iteration in range(2):
        metrics, dialogues = run_iteration(environment, seats, seed=iteration)
        assert learner.num_updates == iteration + 1 and not learner.rollouts
        assert "player_1/kl" in metrics and "player_2/kl" not in metrics
        sizes = [len(t["responses"]) for d in dialogues.values() for t in d["turns"]]
        assert sum(sizes) == sum(r.length for r in environment.records)


def test_self_play_with_larger_mini_batches_merges_the_moves_left_over_into_the_last_one():
    """The moves of an iteration vary in number; with ppo.batching.last_minibatch: merge mini-batches of 5 take them
    all, the last one the rows left over, and every move is trained on exactly once per epoch."""
    torch.manual_seed(0)
    tokenizer = word_tokenizer([str(k) for k in range(1, 10)] + ["move"])
    learner = tiny_learner(tokenizer, mini_batch_size=5, last_minibatch="merge")
    environment = BatchedGameEnv(tictactoe_v3.env, batch_size=3, templates="{move_names} move", illegal="random")
    seats = {seat: learner for seat in environment.possible_agents}
    sizes = []
    loss = learner._loss
    learner._loss = lambda mb, prompt_length, kl_coef: (sizes.append(len(mb.mask)), loss(mb, prompt_length, kl_coef))[1]
    run_iteration(environment, seats, seed=0)
    moves = sum(r.length for r in environment.records)
    assert moves % 5 and sum(sizes) == moves * learner.config.batching.ppo_epochs  # not divisible by 5, all trained on
    assert min(sizes) >= 5 and max(sizes) < 10 and learner.num_updates == 1


# --- SPIRAL's role-conditioned advantage estimation ---------------------------------------------------------------


def test_step_baselines_takes_one_ema_step_per_key_with_the_mean_return():
    returns = {("llm", "x"): [1.0, 1.0, -1.0], ("llm", "o"): [-1.0], ("llm", "z"): []}
    updated = step_baselines(returns, {("llm", "x"): 0.5, ("llm", "q"): 2.0}, decay=0.9)
    assert updated == pytest.approx({("llm", "x"): 0.9 * 0.5 + 0.1 / 3, ("llm", "o"): -0.1, ("llm", "q"): 2.0})
    with pytest.raises(ValueError, match=r"decay must be a number in \[0, 1\)"):
        step_baselines(returns, {}, decay=1.0)


def _later_moves(moves, seat):
    """Per move of ``seat`` in one game's record, how many moves of the seat follow it."""
    own = [m for m in moves if m.seat == seat]
    return list(range(len(own) - 1, -1, -1))


def test_role_baselines_subtract_before_discounting_and_step_once_per_game_and_role():
    """3 games of different lengths, one learner in both seats, γ = 0.5 and an illegal-answer penalty: every move of
    a game in one role sees the same baseline, trained on γ^k (payoff − b) − penalty; each (learner, role) baseline
    takes one EMA step with the mean of its games' payoffs."""

    def pick(names, game):  # game 0 adds 1, game 1 adds 2, game 2 answers nonsense (a random legal move, penalised)
        return {0: names[0], 1: names[-1]}.get(game, "nonsense")

    inner = BatchedGameEnv(lambda: CountdownGame(target=5), 3, illegal="random", discount=0.5, illegal_penalty=0.25)
    environment = RoleBaselines(inner, decay=0.9, players={"p0": "llm", "p1": "llm"})
    before = {("llm", "p0"): 0.5, ("llm", "p1"): -0.2}
    environment.values = dict(before)
    learner = RecordingLearner("llm", pick=pick)
    run_iteration(environment, {"p0": learner, "p1": learner}, seed=1)

    records, turns = inner.records, inner.turns
    assert len({len(r.moves) for r in records}) > 1, "the games should differ in length"
    later = {seat: [_later_moves(r.moves, seat) for r in records] for seat in ("p0", "p1")}
    seen = {seat: [0] * len(records) for seat in ("p0", "p1")}
    assert len(learner.rewards) == len(turns)
    for turn, role, rewards in zip(turns, learner.roles, learner.rewards, strict=True):
        assert role == turn.seat
        expected = []
        for game, illegal in zip(turn.games, turn.illegal, strict=True):
            k = later[turn.seat][game][seen[turn.seat][game]]
            seen[turn.seat][game] += 1
            payoff = records[game].payoffs[turn.seat]
            expected.append(0.5**k * (payoff - before[("llm", turn.seat)]) - 0.25 * illegal)
        np.testing.assert_allclose(rewards, expected, rtol=0, atol=1e-12)
    for seat in ("p0", "p1"):
        payoffs = [r.payoffs[seat] for r in records]
        assert environment.values[("llm", seat)] == pytest.approx(0.9 * before[("llm", seat)] + 0.1 * np.mean(payoffs))

    tensors, meta = environment.state_dict()
    fresh = RoleBaselines(BatchedGameEnv(lambda: CountdownGame(target=5), 3), players={"p0": "llm", "p1": "llm"})
    fresh.load_state_dict(tensors, meta)
    assert fresh.values == environment.values


def test_role_baselines_leave_fixed_opponents_alone_and_pass_the_api_test():
    game = BatchedGameEnv(lambda: rps_v2.env(max_cycles=1), batch_size=4)
    environment = RoleBaselines(game, 0.5, {"player_0": "llm"})
    learner = RecordingLearner("llm", pick=lambda names, game: names[game % 3])
    opponent = RecordingLearner("other", pick=lambda names, game: names[0])
    run_iteration(environment, {"player_0": learner, "player_1": opponent}, seed=0)
    payoffs = np.array([r.payoffs["player_0"] for r in environment.unwrapped.records])
    np.testing.assert_array_equal(learner.rewards[0], payoffs)  # the baseline started at 0
    np.testing.assert_array_equal(opponent.rewards[0], -payoffs)
    assert environment.values == pytest.approx({("llm", "player_0"): 0.5 * payoffs.mean()})
    baseline = environment.values[("llm", "player_0")]
    run_iteration(environment, {"player_0": learner, "player_1": opponent}, seed=1)
    payoffs = np.array([r.payoffs["player_0"] for r in environment.unwrapped.records])
    np.testing.assert_allclose(learner.rewards[1], payoffs - baseline)
    api_test(RoleBaselines(BatchedGameEnv(lambda: rps_v2.env(max_cycles=2), 3, illegal="random")), num_cycles=50)


# --- SharedReward and RolePermutation, unchanged, over the game env ----------------------------------------------


def test_the_wrappers_pass_the_api_test_over_a_batched_game():
    # api_test answers at random: with "forfeit" every game would end at its first move, and the second seat,
    # which never moved, would have no turn rows for SharedReward to mix (see the xfail below)
    def rps():
        return BatchedGameEnv(lambda: rps_v2.env(max_cycles=2), 3, illegal="random")

    api_test(SharedReward(rps(), [[1, 0.5], [0.5, 1]]), num_cycles=50)
    api_test(RolePermutation(BatchedGameEnv(tictactoe_v3.env, 3), period=1), num_cycles=200)
    api_test(SharedReward(RolePermutation(rps(), period=1), [[1, -1], [-1, 1]]), num_cycles=50)


@pytest.mark.parametrize("weight", [0.0, 0.5, -1.0])
def test_shared_reward_mixes_the_payoffs_of_a_general_sum_matrix_game(weight):
    """Every game moves every seat at every turn here, so the turn rows have the batch's width and SharedReward
    mixes them unchanged: each move of seat i is credited r_i + λ r_j."""
    environment = SharedReward(BatchedGameEnv(lambda: rps_v2.env(max_cycles=2), 6), cooperation_matrix(2, weight))
    learners = {
        "player_0": RecordingLearner("a", pick=lambda names, game: names[0]),
        "player_1": RecordingLearner("b", pick=lambda names, game: names[game % 3]),
    }
    run_iteration(environment, learners, seed=0)
    payoffs = {s: np.array([r.payoffs[s] for r in environment.unwrapped.records]) for s in learners}
    assert payoffs["player_0"].any()
    for seat, other in (("player_0", "player_1"), ("player_1", "player_0")):
        assert len(learners[seat].rewards) == 2
        for rewards in learners[seat].rewards:
            np.testing.assert_allclose(rewards, payoffs[seat] + weight * payoffs[other])


SEATS = ("player_1", "player_2")


def test_shared_reward_over_games_where_turns_cover_some_games_only():
    game_env = BatchedGameEnv(tictactoe_v3.env, 4)
    environment = SharedReward(game_env, cooperation_matrix(2, 0.5))
    learners = {seat: RecordingLearner(seat, pick=lambda names, game: names[game % len(names)]) for seat in SEATS}
    run_iteration(environment, learners, seed=0)
    payoffs = {seat: np.array([record.payoffs[seat] for record in game_env.records]) for seat in SEATS}
    assert len({len(games) for learner in learners.values() for games in learner.acts}) > 1  # uneven turns
    for seat, other in zip(SEATS, SEATS[::-1], strict=True):
        assert len(learners[seat].rewards) == len(learners[seat].acts) > 0
        for rewards, games in zip(learners[seat].rewards, learners[seat].acts, strict=True):  # each move: its mix
            games = list(games)
            np.testing.assert_allclose(rewards, payoffs[seat][games] + 0.5 * payoffs[other][games])


def test_role_permutation_rotates_who_moves_first_in_every_game():
    environment = RolePermutation(BatchedGameEnv(tictactoe_v3.env, 3), period=1)
    learners = {"llm1": RecordingLearner("llm1"), "llm2": RecordingLearner("llm2")}
    for iteration, first in enumerate(["llm1", "llm2", "llm1"]):
        metrics, dialogues = run_iteration(environment, learners, seed=iteration)
        assert dialogues[first]["role"] == "player_1" and metrics[f"{first}/role"] == "player_1"
        assert learners[first].acts[-len(dialogues[first]["turns"])] == (0, 1, 2)  # X opens every game


# --- learning -----------------------------------------------------------------------------------------------------

# Measured on this code (PPO, 32 games per iteration, 40 iterations; mean payoff of the learner's moves against an
# opponent playing rock 80% of the time, paper and scissors 10% each), first 5 -> last 5 iterations, seeds 0-5:
#   0.02 -> 0.73, 0.13 -> 0.70, 0.06 -> 0.68, -0.03 -> 0.63, -0.11 -> 0.70, 0.06 -> 0.68
# (always paper would get 0.7). About 3 s on a loaded 2-core machine. Illegal answers play a random move and cost 1:
# with "forfeit" a batch where every first answer is illegal leaves the opponent without a move, which the loop
# does not handle yet.
ITERATIONS, GAMES, SEED = 40, 32, 0


def test_a_tiny_model_learns_to_exploit_a_biased_rock_paper_scissors_player():
    torch.manual_seed(SEED)
    tokenizer = word_tokenizer(["rock", "paper", "scissors", "play", "your", "move", ":", "the", "a", "and"])
    learner = tiny_learner(tokenizer, seed=SEED, mini_batch_size=GAMES, generation=(1, 2))
    opponent = RandomMover(seed=SEED, weights={"rock": 8, "paper": 1, "scissors": 1})
    environment = BatchedGameEnv(
        lambda: rps_v2.env(max_cycles=1),
        GAMES,
        templates="play {move_names} your move :",
        illegal="random",
        illegal_penalty=1.0,
        seed=SEED,
    )
    history = []
    for _ in range(ITERATIONS):
        _, dialogues = run_iteration(environment, {"player_0": learner, "player_1": opponent})
        history.append(float(dialogues["player_0"]["turns"][0]["task_rewards"].mean()))
    start, end = np.mean(history[:5]), np.mean(history[-5:])
    assert end >= 0.45 and end >= start + 0.35, f"payoff did not rise: first 5 {history[:5]}, last 5 {history[-5:]}"
    answers = dialogues["player_0"]["turns"][0]["responses"]
    assert sum(a.split()[:1] == ["paper"] for a in answers) >= 0.75 * GAMES, answers
    illegal = sum(record.illegal["player_0"] for record in environment.records)
    assert illegal <= 0.1 * GAMES
