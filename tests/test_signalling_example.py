"""The sender-receiver game (examples/signalling): it passes PettingZoo's and marllm's checks, a truthful pair finds
every prize and its messages carry all of the prize's information, the receiver's prompt depends on the hidden state
only through the message, two learners train an iteration of the example config, and its λ studies expand to valid
runs. Also what it relies on: the plug-in mutual information and its shuffled baseline, and a view's batch-wide
measures."""

from __future__ import annotations

import itertools
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from pettingzoo.test import api_test

from marllm.cli import main
from marllm.games.env import BatchedGameEnv
from marllm.games.env.records import view_metrics
from marllm.studies.spec import load_study
from marllm.testing import check_game_env
from marllm.utils.imports import load_reference
from marllm.utils.information import mutual_information, shuffled_mutual_information
from tests.conftest import make_tiny_gpt2

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "signalling"
CONFIG = EXAMPLE / "signalling_offline.yaml"
game = sys.modules[load_reference(f"{EXAMPLE / 'signalling.py'}:env").__module__]  # as a config loads it


def play(env: BatchedGameEnv, sender, receiver) -> dict[str, list[str]]:
    """One episode: the sender answers each prompt with ``sender(game)``, the receiver with ``receiver(prompt)``;
    every prompt each seat saw."""
    env.reset()
    prompts: dict[str, list[str]] = {"sender": [], "receiver": []}
    while not all(env.terminations.values()):
        seat = env.agent_selection
        seen = env.observe(seat)["prompt"]
        prompts[seat] += seen
        if seat == "sender":
            env.step([sender(one.unwrapped) for one in env.games])
        else:
            env.step([receiver(prompt) for prompt in seen])
    return prompts


def test_the_game_passes_pettingzoo_api_test_and_the_batched_env_check():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api_test(game.env(), num_cycles=50)
    report = check_game_env(lambda: BatchedGameEnv(game.env, 3, templates="{state}", illegal="random", seed=1))
    assert report["pettingzoo_api_test"].startswith("passed")


def test_a_truthful_pair_finds_every_prize_and_its_messages_carry_the_prize():
    env = BatchedGameEnv(game.env, 64, templates="{state}", seed=0)
    play(env, lambda inner: f"It is under the {game.ITEMS[inner.prize]}.", _pick_the_item_named)
    assert all(record.payoffs == {"sender": 0.0, "receiver": 1.0} for record in env.records)  # the best outcome
    metrics = env.final_metrics["receiver"]
    assert metrics["accuracy"] == metrics["names_prize_rate"] == metrics["names_an_item_rate"] == 1.0
    assert metrics["favourite_rate"] == metrics["names_favourite_rate"] == 0.0
    prizes = [one.unwrapped.prize for one in env.games]
    entropy = -sum(p * math.log2(p) for p in np.bincount(prizes) / len(prizes) if p > 0)
    assert metrics["mi_prize_pick"] == pytest.approx(entropy) == pytest.approx(metrics["mi_prize_message"])
    assert 0 < metrics["mi_prize_pick_shuffled"] < 0.5 * entropy  # chance's share on 64 games
    assert env.final_metrics["sender"]["mi_prize_pick"] == metrics["mi_prize_pick"]  # a batch measure, both seats


def test_a_sender_that_names_its_favourite_is_paid_and_the_receiver_is_not():
    env = BatchedGameEnv(game.env, 16, templates="{state}", seed=3)
    play(env, lambda inner: f"the {game.ITEMS[inner.favourite]}", _pick_the_item_named)
    assert all(record.payoffs == {"sender": game.BIAS, "receiver": 0.0} for record in env.records)
    assert env.final_metrics["sender"]["favourite_rate"] == 1.0 and env.final_metrics["sender"]["accuracy"] == 0.0


def test_the_receivers_prompt_depends_on_the_hidden_state_only_through_the_message():
    seen = {}
    for prize, favourite in itertools.permutations(range(len(game.ITEMS)), 2):
        env = BatchedGameEnv(lambda p=prize, f=favourite: game.SignallingGame(p, f), 1, templates=None, seed=0)
        prompts = play(env, lambda inner: "hello there", lambda prompt: "apple")
        assert game.ITEMS[prize] in prompts["sender"][0] and game.ITEMS[favourite] in prompts["sender"][0]
        seen[(prize, favourite)] = prompts["receiver"][0]
    assert len(set(seen.values())) == 1  # the same prompt whatever the prize and the favourite
    assert '"hello there"' in next(iter(seen.values()))


def test_two_learners_train_an_iteration_of_the_example(tmp_path, tokenizer):
    model_dir = tmp_path / "tiny"
    make_tiny_gpt2(tokenizer, n_positions=1024).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    run_dir = tmp_path / "run"
    overrides = [f"model.name_or_path={model_dir}", "iterations=1", "game.batch_size=4", f"run_dir={run_dir}",
                 "generation.max_new_tokens=4", "logging.progress=false", "agents.reward_coefficients=-1.0",
                 "logging.checkpoint_every=null"]  # fmt: skip
    assert main(["train", str(CONFIG), *overrides]) == 0
    (metrics,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for learner, seat in (("llm1", "sender"), ("llm2", "receiver")):
        for measure in game.MEASURES:
            assert np.isfinite(metrics[f"{learner}/game/{seat}/{measure}"]), measure
        assert metrics[f"{learner}/game/{seat}/illegal_move_rate"] == 0.0  # picks are constrained
        assert np.isfinite(metrics[f"{learner}/kl"])


@pytest.mark.parametrize(
    ("study", "coefficients", "seeds"),
    [("lambda_signalling_offline", [-1.0, -0.5, 0.0, 0.5, 1.0], 5), ("lambda_signalling_smollm2", [-1.0, 0.0, 1.0], 3)],
)
def test_the_lambda_studies_expand_to_one_run_per_coefficient_and_seed(study, coefficients, seeds):
    runs = load_study(ROOT / "examples" / "studies" / f"{study}.yaml").runs()
    assert len(runs) == len(coefficients) * seeds
    assert sorted({run.config.agents.reward_coefficients for run in runs}) == coefficients
    assert all(run.config.game.name.endswith("signalling.py:env") for run in runs)


@pytest.mark.parametrize(
    ("xs", "ys", "bits"),
    [([0, 0, 1, 1], [0, 0, 1, 1], 1.0), ([0, 1, 0, 1], [0, 0, 1, 1], 0.0), ([0, 1, 2, 3], ["a", "a", "b", "b"], 1.0),
     ([0, 0, 0, 1], [0, 0, 1, 1], 0.3112781244591328), ([], [], 0.0)],
)  # fmt: skip
def test_the_plug_in_mutual_information_on_hand_computed_tables(xs, ys, bits):
    # [0,0,0,1] x [0,0,1,1]: H(Y) − H(Y|X) = 1 − (3/4)·H(1/3) = 0.31128 bits
    assert mutual_information(xs, ys) == pytest.approx(bits)


def test_the_shuffled_baseline_measures_the_estimates_bias_and_breaks_the_dependence():
    rng = np.random.default_rng(0)
    xs = rng.integers(4, size=32).tolist()
    independent = rng.integers(4, size=32).tolist()
    baseline = shuffled_mutual_information(xs, xs, permutations=200)
    assert 0.1 < baseline < 0.4  # Miller's bias for 4 x 4 values on 32 samples: 9 / (64 ln 2) = 0.20 bits
    assert mutual_information(xs, xs) > 1.5  # the entropy of 4 near-uniform values
    assert abs(mutual_information(xs, independent) - baseline) < 0.25
    assert shuffled_mutual_information(xs, xs, seed=1) == shuffled_mutual_information(xs, xs, seed=1)
    with pytest.raises(ValueError, match="paired samples"):
        mutual_information([0, 1], [0])


def test_a_views_batch_measure_named_as_a_per_game_one_is_refused():
    class Twice(game.SignallingView):
        def batch_metrics(self, games, seat):
            return {"accuracy": 1.0}

    env = BatchedGameEnv(game.env, 2, templates="{state}", seed=0)
    play(env, lambda inner: "apple", _pick_the_item_named)
    with pytest.raises(ValueError, match=r"\['accuracy'\] are the env's own or reported twice"):
        view_metrics(Twice(), [one for one in env.games], "receiver", {"payoff"})


def _pick_the_item_named(prompt: str) -> str:
    said = prompt.rpartition("wrote:")[2]
    named = game.item_named(said)
    return game.ITEMS[0] if named == game.NONE else named


def test_the_lambda_trend_reads_an_estimate_minus_its_baseline_and_a_one_move_games_last_turn(tmp_path):
    from tests.test_probe_findings import load_lambda_trend

    trend = load_lambda_trend()
    for weight, seed, pick, shuffled in ((-1.0, 0, 0.2, 0.2), (1.0, 0, 1.4, 0.2), (1.0, 1, 1.0, 0.3)):
        run = tmp_path / "runs" / f"l{weight}s{seed}"
        run.mkdir(parents=True)
        config = f"seed: {seed}\nagents: {{reward_coefficients: {weight}}}\ngame: {{seats: [a]}}\n"
        (run / "config.yaml").write_text(config)
        row = {"iteration": 0, "a/game/mi_prize_pick": pick, "a/game/mi_prize_pick_shuffled": shuffled}
        (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
        samples = [{"iteration": 0, "learner": who, "role": who, "prompt": "p", "response": who} for who in "ab"]
        (run / "samples.jsonl").write_text("".join(json.dumps(sample) + "\n" for sample in samples))
    summary = trend.summarise(tmp_path, 1, ("mi_prize_pick-mi_prize_pick_shuffled",))
    per_lambda = summary["mi_prize_pick-mi_prize_pick_shuffled"]["per_lambda"]
    assert per_lambda["-1.0"]["mean"] == pytest.approx(0.0) and per_lambda["1.0"]["mean"] == pytest.approx(0.95)
    assert trend.dialogues(tmp_path, [1.0])[1.0][1]["learner"] == "b"  # no turn recorded: the last row
