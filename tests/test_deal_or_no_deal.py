"""Deal or no deal (examples/deal_or_no_deal): the game passes PettingZoo's and marllm's checks, a scripted pair that
reaches the best division is paid and measured as such, no deal pays 0, an agent's prompts never show the other's
values, two learners train an iteration of the example config, and its λ studies expand to valid runs. Also the
batched env's hooks the game uses: a game by reference, free-text turns and a view's own metrics."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from pettingzoo.test import api_test

from marllm.cli import main
from marllm.config import ConfigError, load_config
from marllm.games.env import BatchedGameEnv, GameView
from marllm.games.env.factory import game_factory
from marllm.games.env.records import view_metrics
from marllm.studies.spec import load_study
from marllm.testing import check_collector, check_game_env
from marllm.utils.imports import load_reference
from tests.conftest import make_tiny_gpt2
from tests.test_collector_check import OBSERVATION
from tests.test_learner_conformance import tiny_learner

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "deal_or_no_deal"
CONFIG = EXAMPLE / "deal_or_no_deal_offline.yaml"
game = sys.modules[load_reference(f"{EXAMPLE / 'deal_or_no_deal.py'}:env").__module__]  # as a config loads it

# 2 books, 1 hat, 3 balls; alice values books and balls, bob hats and books: the pair does best with alice taking
# the balls and bob the books and the hat (alice 6 + bob 4 + 6 = 16), better than any even split.
DEAL = game.Deal((2, 1, 3), {"alice": (2, 0, 2), "bob": (3, 4, 0)})
ALICE_BEST = (0, 0, 3)


def batched(deal=DEAL, batch_size: int = 1, **options) -> BatchedGameEnv:
    return BatchedGameEnv(lambda: game.DealOrNoDeal(deal), batch_size, templates="{state}", seed=0, **options)


def play(env: BatchedGameEnv, script: dict[str, list[str]]) -> dict[str, list[str]]:
    """Play one episode with each seat's answers in turn (the same in every game); every prompt each seat saw."""
    env.reset()
    prompts: dict[str, list[str]] = {seat: [] for seat in env.possible_agents}
    answers = {seat: iter(lines) for seat, lines in script.items()}
    while not all(env.terminations.values()):
        seat = env.agent_selection
        observation = env.observe(seat)
        prompts[seat] += observation["prompt"]
        env.step([next(answers[seat])] * len(observation["prompt"]))
    return prompts


def test_the_game_passes_pettingzoo_api_test_and_the_batched_env_check():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api_test(game.env(), num_cycles=50)
    report = check_game_env(lambda: BatchedGameEnv(game.env, 3, templates="{state}", illegal="random", seed=1))
    assert report["pettingzoo_api_test"].startswith("passed")


def test_deals_follow_the_rules():
    rng = np.random.default_rng(0)
    for _ in range(200):
        deal = game.draw_deal(rng)
        assert all(1 <= c <= game.MOST for c in deal.counts) and 5 <= sum(deal.counts) <= 7
        for values in deal.values.values():
            assert int(np.dot(values, deal.counts)) == game.TOTAL
        assert any(0 in values for values in deal.values.values())
        best = deal.best_value()
        assert all(deal.pair_value(even) < best for even in game._even_divisions(deal.counts))


def test_a_scripted_pair_reaches_the_best_division_and_is_scored_as_such():
    assert DEAL.pair_value(ALICE_BEST) == DEAL.best_value() == 16
    env = batched(batch_size=2)
    alice = ["Balls are worth 2 to me, books 2.", game.division_name(ALICE_BEST)]
    bob = ["Deal: the books and the hat for me.", game.division_name(DEAL.rest(ALICE_BEST))]
    play(env, {"alice": alice, "bob": bob})
    assert all(record.payoffs == {"alice": 6.0, "bob": 10.0} for record in env.records)
    alice_metrics, bob_metrics = env.final_metrics["alice"], env.final_metrics["bob"]
    for metrics in (alice_metrics, bob_metrics):
        assert metrics["agreement_rate"] == 1.0 and metrics["welfare_of_best"] == 1.0
        assert metrics["pareto_optimal_rate"] == 1.0
        assert metrics["illegal_move_rate"] == 0.0 and metrics["game_length"] == 4.0
    assert alice_metrics["share_of_max"] == 0.6 and bob_metrics["share_of_max"] == 1.0
    assert alice_metrics["proposal_accepted_rate"] == 1.0 and "proposal_accepted_rate" not in bob_metrics
    assert alice_metrics["own_values_named_rate"] == 1.0 and alice_metrics["message_words"] == 8.0
    assert bob_metrics["own_values_named_rate"] == 0.0 and bob_metrics["message_words"] == 8.0
    assert [move.name for move in env.records[0].moves][:2] == [alice[0], bob[0]]  # a message is its own text


def test_no_deal_pays_both_nothing():
    env = batched()
    greedy = game.division_name(DEAL.counts)  # each takes everything, twice
    play(env, {"alice": ["All mine.", greedy, "Still mine.", greedy], "bob": ["No, mine.", greedy, "Mine.", greedy]})
    assert env.records[0].payoffs == {"alice": 0.0, "bob": 0.0}
    for seat in ("alice", "bob"):
        metrics = env.final_metrics[seat]
        assert metrics["agreement_rate"] == metrics["welfare_of_best"] == metrics["share_of_max"] == 0.0
        assert metrics["game_length"] == 8.0
    assert env.final_metrics["alice"]["proposal_accepted_rate"] == 0.0


def test_a_later_proposal_accepts_the_others_earlier_one():
    env = batched()
    mine, theirs = game.division_name((2, 1, 0)), game.division_name((0, 1, 3))  # bob offers alice the books only
    play(env, {"alice": ["hi", mine, "ok", game.division_name((2, 0, 0))], "bob": ["hey", theirs, "no"]})
    assert env.records[0].payoffs == {"alice": 4.0, "bob": 4.0} and env.final_metrics["bob"]["game_length"] == 7.0
    assert env.final_metrics["bob"]["proposal_accepted_rate"] == 1.0
    assert env.final_metrics["alice"]["proposal_accepted_rate"] == 0.0  # bob answered hers with another
    assert env.final_metrics["alice"]["welfare_of_best"] == 8 / 16
    assert env.final_metrics["alice"]["pareto_optimal_rate"] == 0.0  # (2, 0, 0): alice 4, bob 4 + 4 is dominated


def test_accepting_settles_the_others_latest_proposal_and_is_legal_only_after_one():
    env = batched()
    play(env, {"alice": ["hi", game.division_name(ALICE_BEST)], "bob": ["hey", game.ACCEPT_NAME]})
    assert env.records[0].payoffs == {"alice": 6.0, "bob": 10.0}
    assert env.final_metrics["alice"]["proposal_accepted_rate"] == 1.0
    assert env.final_metrics["bob"]["welfare_of_best"] == 1.0 and env.final_metrics["bob"]["game_length"] == 4.0
    raw = game.DealOrNoDeal(DEAL)
    raw.reset(seed=0)
    raw.step("hi")
    raw.step("hey")
    assert game.ACCEPT not in raw.legal_actions()  # alice moves first: nothing to accept yet
    raw.step(game.DIVISIONS.index((2, 1, 0)))
    assert game.ACCEPT in raw.legal_actions()


def test_an_agent_sees_its_own_values_never_the_others():
    env = batched()
    prompts = play(env, {"alice": ["a", game.division_name((1, 1, 1)), "b", game.division_name((1, 1, 1))],
                         "bob": ["c", game.division_name((0, 0, 0)), "d", game.division_name((0, 0, 0))]})  # fmt: skip
    for seat, other in (("alice", "bob"), ("bob", "alice")):
        assert len(prompts[seat]) == 4
        for prompt in prompts[seat]:
            assert f"Your values: {game.values_text(DEAL.values[seat])}." in prompt
            assert game.values_text(DEAL.values[other]) not in prompt and prompt.count("values") == 1
    last = prompts["bob"][-1].splitlines()  # the dialogue so far, both sides' messages and proposals
    assert last[-4:-1] == ['Them: "b"', 'You: "d"', "Them proposed: you get 1 book, 0 hats, 2 balls."]
    assert last[-1] == "Your proposal:"


@pytest.mark.parametrize(
    ("message", "named"),
    [("books are worth 2 to me", True), ("I want three balls", False), ("hat: 0", True), ("ball two", True),
     ("give me 2 hats", False), ("", False)],
)  # fmt: skip
def test_a_message_names_the_writers_values_by_an_item_near_its_value(message, named):
    assert game.names_own_values(message, (2, 0, 2)) is named


def test_a_game_by_reference_is_built_with_its_options_and_refused_when_missing(tmp_path):
    factory = game_factory(f"{EXAMPLE / 'deal_or_no_deal.py'}:env", {"deal": DEAL})
    made = factory()
    made.reset(seed=3)
    assert made.deal == DEAL and made.possible_agents == ["alice", "bob"]
    data = CONFIG.read_text().replace("deal_or_no_deal.py:env", "missing.py:env")
    data = data.replace("talk.py:TalkOrPropose", f"{EXAMPLE / 'talk.py'}:TalkOrPropose")
    (tmp_path / "config.yaml").write_text(data)
    with pytest.raises(ConfigError, match=r"game.name: .*missing.py.* does not exist"):
        load_config(tmp_path / "config.yaml").check_game()


def test_a_view_metric_named_as_one_of_the_envs_is_refused():
    class Clashing(GameView):
        def metrics(self, game, seat):
            return {"payoff": 1.0}

    with pytest.raises(ValueError, match=r"\['payoff'\] are the env's own"):
        view_metrics(Clashing(), [object()], "alice", {"payoff": 0.0})
    assert view_metrics(GameView(), [object()], "alice", {}) == {}


def test_the_action_mode_writes_messages_and_proposes_legal_moves():
    mode = f"{EXAMPLE / 'talk.py'}:TalkOrPropose"
    check_collector(lambda: tiny_learner(None, "ppo", mode).collector, OBSERVATION, samples=100)  # proposals
    collector = tiny_learner(None, "ppo", mode).collector
    rollout = collector.collect({"prompt": ["Your message:"] * 2, "legal_moves": [(), ()]})
    assert len(rollout.responses) == 2 and bool((rollout.tensors.allowed == -1).all())  # nothing restricted
    with pytest.raises(ValueError, match="mixes message turns and move turns"):
        collector.play({"prompt": ["Your message:", "Your proposal:"], "legal_moves": [(), ("I take 1 book",)]})


def test_two_learners_train_an_iteration_of_the_example(tmp_path, tokenizer):
    model_dir = tmp_path / "tiny"
    make_tiny_gpt2(tokenizer, n_positions=1024).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    run_dir = tmp_path / "run"
    overrides = [f"model.name_or_path={model_dir}", "iterations=1", "game.batch_size=2", f"run_dir={run_dir}",
                 "generation.max_new_tokens=4", "generation.min_new_tokens=1", "logging.progress=false",
                 "agents.reward_coefficients=1.0", "logging.checkpoint_every=null"]  # fmt: skip
    assert main(["train", str(CONFIG), *overrides]) == 0
    (metrics,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for learner, seat in (("llm1", "alice"), ("llm2", "bob")):
        for measure in ("agreement_rate", "welfare_of_best", "share_of_max", "own_values_named_rate",
                        "message_words"):  # fmt: skip
            assert 0 <= metrics[f"{learner}/game/{seat}/{measure}"] <= (4 if measure == "message_words" else 1)
        assert metrics[f"{learner}/game/{seat}/illegal_move_rate"] == 0.0  # proposals are constrained
        assert np.isfinite(metrics[f"{learner}/kl"])


@pytest.mark.parametrize(
    ("study", "coefficients", "seeds"),
    [("lambda_deal_offline", [-1.0, -0.5, 0.0, 0.5, 1.0], 5), ("lambda_deal_smollm2", [-1.0, 0.0, 1.0], 3)],
)
def test_the_lambda_studies_expand_to_one_run_per_coefficient_and_seed(study, coefficients, seeds):
    runs = load_study(ROOT / "examples" / "studies" / f"{study}.yaml").runs()
    assert len(runs) == len(coefficients) * seeds
    assert sorted({run.config.agents.reward_coefficients for run in runs}) == coefficients
    assert all(run.config.game.name == f"{EXAMPLE / 'deal_or_no_deal.py'}:env" for run in runs)
    assert all(run.config.game.actions.mode == f"{EXAMPLE / 'talk.py'}:TalkOrPropose" for run in runs)


def test_welfare_of_the_best_is_not_pareto_optimality():
    """A Pareto-optimal deal can leave the pair below the best division's welfare; the rate of Pareto-optimal deals
    is its own measure. Checked against the definition on every division of random pools."""
    rng = np.random.default_rng(0)
    below_best, seen = 0, 0
    for _ in range(300):
        deal = game.draw_deal(rng)
        for division in deal.divisions():
            outcome = (deal.worth("alice", division), deal.worth("bob", deal.rest(division)))
            dominated = any(
                (deal.worth("alice", o), deal.worth("bob", deal.rest(o))) != outcome
                and deal.worth("alice", o) >= outcome[0] and deal.worth("bob", deal.rest(o)) >= outcome[1]
                for o in deal.divisions()
            )
            assert deal.pareto_optimal(division) is not dominated
            if not dominated:
                seen += 1
                below_best += deal.pair_value(division) < deal.best_value()
    assert seen > 0 and below_best > 0


def test_as_one_sequence_per_seat_a_seat_reads_only_the_others_turns_since_and_the_rounds_are_an_option():
    env = BatchedGameEnv(
        lambda: game.DealOrNoDeal(DEAL, rounds=3), 1, templates="{rules}\n{state}", seed=0, history="sequence"
    )
    env.reset()
    assert "In each of 3 rounds" in env.observe(env.agent_selection)["prompt"][0]
    deltas: dict[str, list[str]] = {seat: [] for seat in env.possible_agents}
    take = game.division_name((1, 0, 1))  # a proposal neither accepts: the game runs its three rounds
    while not all(env.terminations.values()):
        seat = env.agent_selection
        observation = env.observe(seat)
        deltas[seat] += observation["delta"]
        message = "" if observation["legal_moves"][0] else f"hello from {seat}"
        env.step([message or take])
    alice, bob = deltas["alice"], deltas["bob"]
    assert len(alice) == len(bob) == 6 and "Pool:" in alice[0]  # 3 rounds of a message and a proposal each
    assert alice[1] == '\nThem: "hello from bob"\nYour proposal:'
    assert bob[1].startswith("\nThem proposed: you get") and bob[1].endswith("Your proposal:")
    assert all("Pool:" not in delta and "You:" not in delta for delta in alice[1:] + bob[1:])
    assert env.records[0].length == 12
