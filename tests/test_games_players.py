"""Players that do not learn: random and biased movers, tic-tac-toe minimax, OpenSpiel's MCTS, frozen snapshots of a
learner and a pool of them; all through the Learner protocol the loop drives."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from pettingzoo.classic import rps_v2, tictactoe_v3

from marllm.algorithms import GenerationConfig, Learner, PPOConfig, PPOLearner
from marllm.games.env import BatchedGameEnv, openspiel_factory
from marllm.games.players import RandomMover, TicTacToeMinimax
from marllm.games.players.snapshots import FrozenSnapshot, OpponentPool
from marllm.loop import run_iteration
from tests.conftest import make_tiny_gpt2

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

needs_openspiel = pytest.mark.skipif(
    importlib.util.find_spec("pyspiel") is None or importlib.util.find_spec("shimmy") is None,
    reason="needs the optional open_spiel and shimmy (pip install 'marllm[games]')",
)


def outcomes_of(environment, players, seed=0):
    """Play one batch with ``players`` (seat -> player) through the loop; the per-seat outcomes (B,) of each game."""
    run_iteration(environment, players, seed=seed)
    seats = environment.possible_agents
    payoffs = np.array([[record.payoffs[s] for s in seats] for record in environment.records])
    return {seat: np.sign(payoffs[:, i] - payoffs[:, 1 - i]) for i, seat in enumerate(seats)}


def test_fixed_players_are_learners_that_answer_with_legal_move_names(tmp_path):
    player = RandomMover(seed=0)
    assert isinstance(player, Learner)
    observation = {"legal_moves": (("a", "b"), ("c",)), "legal_actions": ((0, 1), (2,)), "history": ((), (1,))}
    answers = player.act(observation)
    assert answers[0] in ("a", "b") and answers[1] == "c"
    player.finish([1.0, -1.0])
    assert player.update() == {"task_reward": 0.0}
    assert player.update() == {}  # nothing played since
    with pytest.raises(RuntimeError, match="got a reward but has no move waiting"):
        player.finish([1.0])
    player.act(observation)
    with pytest.raises(RuntimeError, match=r"1 move\(s\) never got their reward"):
        player.update()
    with pytest.raises(KeyError, match="needs an observation with 'legal_moves'"):
        player.act({"prompt": ("hello",)})
    player.save(tmp_path / "random")
    assert (tmp_path / "random" / "player.json").read_text() == '{"name": "random", "kind": "RandomMover"}\n'
    with player.reference_model() as model:
        assert model is None


def test_random_mover_weights_bias_its_moves():
    player = RandomMover(seed=1, weights={"ROCK": 8, "paper": 1}, default_weight=1)
    names, actions = ("rock", "paper", "scissors"), (0, 1, 2)
    picks = [player.choose(names, actions, ()) for _ in range(2000)]
    assert picks.count("rock") / 2000 == pytest.approx(0.8, abs=0.03)
    assert RandomMover(weights={"rock": 0}, default_weight=0).choose(names, actions, ()) in names  # all zero: uniform
    with pytest.raises(ValueError, match="finite and >= 0"):
        RandomMover(weights={"rock": -1})


def test_minimax_never_loses_and_draws_against_itself():
    environment = BatchedGameEnv(tictactoe_v3.env, batch_size=24, seed=0)
    for minimax_seat in ("player_1", "player_2"):
        other = "player_2" if minimax_seat == "player_1" else "player_1"
        players = {minimax_seat: TicTacToeMinimax(seed=0), other: RandomMover(seed=2)}
        result = outcomes_of(environment, players)
        assert (result[minimax_seat] >= 0).all()
        assert (result[minimax_seat] > 0).mean() > 0.5
    selfplay = outcomes_of(environment, {"player_1": TicTacToeMinimax(), "player_2": TicTacToeMinimax(seed=3)})
    assert (selfplay["player_1"] == 0).all()


def test_minimax_takes_the_win_and_blocks():
    player = TicTacToeMinimax()
    # X on 0 and 1 (history: X0, O4, X1, O8): O to move must block at 2; then X wins at 2 if O does not
    names = tuple(str(a) for a in (2, 3, 5, 6, 7))
    assert player.choose(names, (2, 3, 5, 6, 7), (0, 4, 1, 8)) == "2"
    assert player.choose(("2", "5", "6", "7", "8"), (2, 5, 6, 7, 8), (0, 3, 1, 4)) == "2"  # X: win rather than block


@needs_openspiel
def test_mcts_beats_a_random_player_at_openspiel_tic_tac_toe():
    from marllm.games.players.mcts import MCTSPlayer

    environment = BatchedGameEnv(openspiel_factory("tic_tac_toe"), batch_size=8, seed=0)
    players = {"player_0": MCTSPlayer("tic_tac_toe", simulations=60, seed=0), "player_1": RandomMover(seed=0)}
    result = outcomes_of(environment, players)
    assert (result["player_0"] >= 0).all() and (result["player_0"] > 0).mean() >= 0.75
    with pytest.raises(ValueError, match="sequential turns"):
        MCTSPlayer("matrix_pd")


# --- frozen snapshots ---------------------------------------------------------------------------------------------


def tiny_learner(tokenizer, seed=0):
    model = make_tiny_gpt2(tokenizer, seed=seed)
    reference = make_tiny_gpt2(tokenizer, seed=seed).requires_grad_(False).eval()
    config = PPOConfig.from_flat(mini_batch_size=4, learning_rate=1e-2, init_kl_coef=0.01, kl_control="fixed")
    return PPOLearner("llm", model=model, tokenizer=tokenizer, reference=reference, config=config,
                      generation=GenerationConfig(2, 4), seed=seed)  # fmt: skip


def parameters(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def snapshot_answers(snapshot, prompts):
    torch.manual_seed(123)
    snapshot._rng = np.random.default_rng(0)
    return snapshot.act({"prompt": prompts})


def test_a_frozen_snapshot_does_not_change_when_its_learner_learns(tokenizer):
    learner = tiny_learner(tokenizer)
    snapshot = FrozenSnapshot(learner)
    assert snapshot.name == "llm-snapshot" and snapshot.tokenizer is learner.tokenizer
    frozen = parameters(snapshot.model)
    assert all(torch.equal(frozen[n], p) for n, p in parameters(learner.model).items())
    assert not any(p.requires_grad for p in snapshot.model.parameters())
    prompts = ("this movie was",) * 4
    before = snapshot_answers(snapshot, prompts)
    snapshot.finish([0.0] * 4)

    for _ in range(3):
        learner.act({"prompt": prompts})
        learner.finish([1.0, -1.0, 1.0, -1.0])
        learner.update()
    assert any(not torch.equal(frozen[n], p) for n, p in parameters(learner.model).items()), "the learner moved"
    assert all(torch.equal(frozen[n], p) for n, p in parameters(snapshot.model).items())
    assert snapshot_answers(snapshot, prompts) == before
    assert snapshot.act({"prompt": ()}) == ()


def test_opponent_pool_keeps_the_last_k_snapshots_and_draws_one_per_iteration(tokenizer):
    learner = tiny_learner(tokenizer)
    pool = OpponentPool(learner, size=2, every=2, seed=0)
    assert len(pool.snapshots) == 1 and pool.current is pool.snapshots[0]
    first = pool.snapshots[0]
    taken = []
    for _ in range(6):
        learner.act({"prompt": ("the film",) * 4})
        learner.finish([1.0, 0.0, -1.0, 0.0])
        learner.update()
        stats = pool.update()
        taken.append(pool.taken)
        assert pool.current in pool.snapshots and stats["pool_size"] == len(pool.snapshots) <= 2
        assert 0 <= stats["opponent_age"] < len(pool.snapshots)
    assert taken == [1, 2, 2, 3, 3, 4]  # one snapshot every second update
    assert first not in pool.snapshots  # the oldest was dropped
    newest = pool.snapshots[-1]
    assert all(torch.equal(p, q) for p, q in zip(newest.model.parameters(), learner.model.parameters(), strict=True))
    with pytest.raises(ValueError, match="OpponentPool size must be an int >= 1"):
        OpponentPool(learner, size=0)


def test_a_snapshot_plays_through_the_loop(tokenizer):
    learner = tiny_learner(tokenizer)
    environment = BatchedGameEnv(
        lambda: rps_v2.env(max_cycles=1), batch_size=4, templates="{move_names}:", illegal="random", seed=0
    )
    pool = OpponentPool(learner, size=3)
    metrics, dialogues = run_iteration(environment, {"player_0": learner, "player_1": pool}, seed=0)
    assert metrics["player_1/pool_size"] == 2.0  # the update took a second snapshot
    assert len(dialogues["player_1"]["turns"]) == 1 and len(dialogues["player_1"]["turns"][0]["responses"]) == 4
