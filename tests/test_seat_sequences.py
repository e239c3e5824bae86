"""One token sequence per seat and game (``game.history: sequence``): the env's deltas, token in and token out, the
first update on policy, the same log-probs as a prompt that is the sequence so far, and credit across the turns."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from marllm.algorithms import GenerationConfig, PPOConfig
from marllm.algorithms.catalog import AlgorithmOptions, build_learner
from marllm.algorithms.core import gae
from marllm.algorithms.seat_sequences import sequence_rows, turn_score_tokens
from marllm.config import ConfigError, config_from_dict
from marllm.games.check import check_game_env
from marllm.games.env import BatchedGameEnv, GameView
from marllm.games.model_player import ModelPlayer
from marllm.loop import play_episode, run_iteration
from marllm.models.token_prompts import TokenPrompts, observation_ids
from marllm.run.run_log import sample_rows
from marllm.testing import check_learner
from marllm.wrappers import SharedReward
from tests.conftest import make_tiny_gpt2, make_tokenizer
from tests.test_games_config import game_config
from tests.test_games_env import CountdownGame

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

RULES = "this movie was good and the acting was great , the story is fine . "
GENERATION = GenerationConfig(min_new_tokens=1, max_new_tokens=3, temperature=1.3, top_k=20, repetition_penalty=2.0)


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def learner(tok, actions="generate", mini_batch_size=2, seed=1):
    config = PPOConfig.from_flat(mini_batch_size=mini_batch_size, ppo_epochs=1)
    model, reference = make_tiny_gpt2(tok, n_positions=256, seed=seed), make_tiny_gpt2(tok, n_positions=256, seed=2)
    with torch.no_grad():  # logits large enough for the processors to matter
        model.transformer.ln_f.weight.mul_(8)
        reference.transformer.ln_f.weight.mul_(8)
    torch.manual_seed(0)
    return build_learner(
        "ppo", "llm", AlgorithmOptions(actions=actions), model=model, tokenizer=tok, reference=reference,
        config=config, generation=GENERATION,
    )  # fmt: skip


def sequence_turns():
    """Two turns of a seat in four games: its first prompts, then what is new in games 1 and 3; rewards per row."""
    first = {
        "prompt": [RULES + end for end in ("i loved it", "bad", "good", "what a waste")],
        "games": [0, 1, 2, 3],
        "legal_moves": [["good", "bad"], ["pass", "bet"], ["a b c", "a b d"], ["good", "bad"]],
    }
    first["delta"] = list(first["prompt"])
    second = {
        "prompt": ["(re-rendered)", "(re-rendered)"],
        "delta": [" they said bad . your move :", " they bet . your move :"],
        "games": [1, 3],
        "legal_moves": [["pass", "bet"], ["good", "bad"]],
    }
    return [first, second], [[1.0, 0.0, -1.0, 0.5], [0.5, -0.5]]


def act_and_reward(agent) -> list[dict]:
    """The learner plays :func:`sequence_turns` and gets their rewards, without updating; the turns."""
    turns, rewards = sequence_turns()
    for observation in turns:
        agent.act(observation)
    for row in rewards:
        agent.finish(row)
    return turns


# --- the env ---------------------------------------------------------------------------------------------------------


def test_a_seat_reads_its_prompt_first_then_only_the_other_seats_moves_since():
    env = BatchedGameEnv(lambda: CountdownGame(target=6), batch_size=3, seed=0, history="sequence", illegal="random")
    env.reset(seed=0)
    seen: dict[tuple[str, int], list[str]] = {}
    for seat in env.agent_iter():
        observation, _, done, _, _ = env.last()
        if done:
            env.step(None)
            continue
        for game, prompt, delta in zip(observation["games"], observation["prompt"], observation["delta"], strict=True):
            history = seen.setdefault((seat, game), [])
            if not history:
                assert delta == prompt
            else:  # the generic view: the state now, then the request, without the prompt's introduction
                assert delta.startswith("\nObservation") and delta.endswith("Your move:")
                assert "Legal moves:" in delta and "You are playing" in prompt and "You are playing" not in delta
            history.append(delta)
        env.step(tuple(names[0] for names in observation["legal_moves"]))
    assert any(len(h) > 1 for h in seen.values())


@pytest.mark.skipif(importlib.util.find_spec("pyspiel") is None, reason="needs open_spiel")
def test_a_repeated_matrix_games_delta_shows_a_round_once_both_moves_are_in():
    from marllm.games.env.openspiel import openspiel_factory

    game = "repeated_game(stage_game=matrix_pd(),num_repetitions=3)"
    env = BatchedGameEnv(openspiel_factory(game), batch_size=1, seed=0, history="sequence")
    env.reset(seed=0)
    deltas: dict[str, list[str]] = {}
    for seat in env.agent_iter():
        observation, _, done, _, _ = env.last()
        if done:
            env.step(None)
            continue
        deltas.setdefault(seat, []).append(observation["delta"][0])
        env.step(("Defect" if seat == env.possible_agents[0] else "Cooperate",))
    for seat, (first, *later) in deltas.items():
        assert "Payoffs" in first and len(later) == 2
        mine, theirs = ("Defect", "Cooperate") if seat == env.possible_agents[0] else ("Cooperate", "Defect")
        for k, delta in enumerate(later, 1):
            assert delta.startswith(f"\nRound {k} of 3: you {mine}, opponent {theirs}\nThis is round {k + 1} of 3.")
            assert "Payoffs" not in delta and f"Round {k + 1} of 3:" not in delta


def test_a_history_other_than_prompt_or_sequence_is_refused():
    with pytest.raises(ValueError, match=r"history must be one of \['prompt', 'sequence'\]"):
        BatchedGameEnv(lambda: CountdownGame(), batch_size=2, history="tokens")


# --- token in, token out ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("actions", ["generate", "constrained", "think"])
def test_the_tokens_trained_on_are_exactly_the_tokens_sampled(tok, actions):
    agent = learner(tok, actions)
    sampled: list[list[list[int]]] = []
    record = agent.collector.book.record

    def spy(keys, response, mask, allowed, eos):
        sampled.append([response[i, : int(n)].tolist() for i, n in enumerate(mask.sum(1).tolist())])
        return record(keys, response, mask, allowed, eos)

    agent.collector.book.record = spy
    turns = act_and_reward(agent)
    book = agent.collector.book
    rows = sequence_rows(book, tok.pad_token_id)
    for b, key in enumerate(rows.keys):
        own = rows.response[b][rows.mask[b] > 0].tolist()
        answers = [sampled[t][turn["games"].index(key[1])] for t, turn in enumerate(turns) if key[1] in turn["games"]]
        assert own == [token for answer in answers for token in answer]
        # and the observations between them are the deltas' tokens, as tokenized once
        if key[1] in turns[1]["games"]:
            delta = turns[1]["delta"][turns[1]["games"].index(key[1])]
            assert (
                tok.decode(rows.response[b][rows.mask[b] == 0][: len(tok(delta)["input_ids"])]).strip() == delta.strip()
            )


@pytest.mark.parametrize("actions", ["generate", "constrained", "think"])
def test_the_conformance_suite_passes_over_sequences(tok, actions):
    """The first update is on policy (ratio 1 at every token, the loss reads the log-probs against the rollout's) and a
    resumed learner ends where an uninterrupted one does, with one token sequence per seat."""
    turns, rewards = sequence_turns()
    report = check_learner(lambda: learner(tok, actions), turns, rewards)
    assert float(report["first_update_on_policy"].split()[-1]) <= 1e-5
    assert report["resume_equals_uninterrupted"] == "largest weight difference 0"


def test_a_sequence_gives_the_log_probs_of_a_prompt_that_is_the_sequence_so_far(tok):
    """Where the re-rendered prompt's tokens are the sequence up to an answer, the two paths score the answer alike
    (float32; the tolerance covers the different padding and attention widths)."""
    agent = learner(tok, "generate")
    act_and_reward(agent)
    book = agent.collector.book
    sequences = {key: (list(s.ids), list(s.answers)) for key, s in book.sequences.items()}
    rollout = agent.collector.sequence_rollout(agent.rollouts)
    collector = agent.collector
    for b, (ids, answers) in enumerate(sequences.values()):
        first = answers[0][0]
        for start, end in answers:
            prompt = TokenPrompts(tok, [ids[:start]])
            prompt_ids, prompt_mask = prompt.padded(tok.pad_token_id)
            whole = torch.tensor([ids[:end]])
            scored = collector._score(whole, torch.ones_like(whole), prompt_ids.shape[1], None, None)
            alone = scored["logprobs"][0, : end - start]
            together = rollout.tensors.logprobs[b, start - first : end - first]
            torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-4)
            assert bool((rollout.tensors.mask[b, start - first : end - first] == 1).all())


def test_the_first_observation_of_a_chat_model_is_its_prompt_rendered_later_ones_close_the_answer():
    tok = make_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    tok.eos_token = "</s>"
    first = tok.decode(observation_ids(tok, "hi", True, True))
    later = tok.decode(observation_ids(tok, "next", False, True, after_eos=True))
    cut = tok.decode(observation_ids(tok, "next", False, True, after_eos=False))
    assert first.replace(" ", "") == "<user>hi</s><assistant>"
    assert later.replace(" ", "") == "<user>next</s><assistant>"
    assert cut.replace(" ", "") == "</s><user>next</s><assistant>"


# --- credit across the turns -----------------------------------------------------------------------------------------


def test_the_return_from_each_answer_is_its_credited_return():
    scores = np.array([3.0, 1.0, -2.0])  # answers 0, 1 and 2 of sequence 0
    tokens = turn_score_tokens(scores, np.array([0, 0, 0]), np.array([0, 1, 2]), [(1, 4, 8)], 10)
    mask = torch.zeros(1, 10)
    mask[0, [0, 1, 3, 4, 7, 8]] = 1  # three answers, observations between them
    advantages, returns = gae(tokens, torch.zeros(1, 10), mask, 1.0, 1.0)
    assert returns[0, 1].item() == pytest.approx(3.0) and returns[0, 4].item() == pytest.approx(1.0)
    assert returns[0, 8].item() == pytest.approx(-2.0) and returns[0, 0].item() == pytest.approx(3.0)
    assert returns[0, [2, 5, 6, 9]].abs().sum().item() == 0.0


def test_gae_skips_the_masked_out_tokens_between_answers():
    generator = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(3, 9, generator=generator), torch.randn(3, 9, generator=generator)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 1, 0, 0], [0, 1, 1, 1, 0, 1, 0, 1, 0], [1, 1, 1, 1, 1, 0, 0, 0, 0]]).float()
    advantages, returns = gae(rewards, values, mask, 0.9, 0.8)
    for row in range(3):
        own = mask[row] > 0
        expected, expected_returns = gae(
            rewards[row][own][None], values[row][own][None], torch.ones(1, int(own.sum())), 0.9, 0.8
        )
        torch.testing.assert_close(advantages[row][own], expected[0])
        torch.testing.assert_close(returns[row][own], expected_returns[0])
        assert advantages[row][~own].abs().sum().item() == 0.0


def test_an_answer_scored_twice_or_without_a_token_is_refused():
    with pytest.raises(ValueError, match="scored twice"):
        turn_score_tokens(np.array([1.0, 2.0]), np.array([0, 0]), np.array([0, 0]), [(3,)], 5)
    with pytest.raises(ValueError, match="no token"):
        turn_score_tokens(np.array([1.0]), np.array([0]), np.array([0]), [(-1,)], 5)


# --- training --------------------------------------------------------------------------------------------------------


def test_a_game_trains_as_one_sequence_per_seat_with_shared_rewards(tok):
    env = SharedReward(
        BatchedGameEnv(lambda: CountdownGame(target=5), batch_size=4, seed=0, history="sequence", illegal="random"),
        coefficients=np.ones((2, 2)),
    )
    first, second = (
        learner(tok, "constrained", mini_batch_size=4),
        learner(tok, "constrained", mini_batch_size=4, seed=3),
    )
    players = dict(zip(env.possible_agents, (first, second), strict=True))
    metrics, dialogues = run_iteration(env, players, seed=0)
    assert metrics["p0/ratio"] == pytest.approx(1.0, abs=1e-5)
    assert all(len(record["turns"]) >= 2 for record in dialogues.values())
    rows = sample_rows(dialogues, 0, 2)  # samples.jsonl says what the model read at each turn
    assert all(row["delta"] for row in rows) and any(row["delta"] != row["prompt"] for row in rows)
    assert not first.collector.book and not first.rollouts  # the book starts anew for the next episode
    metrics, _ = run_iteration(env, players, seed=1)
    assert np.isfinite(metrics["p1/loss/total"])


# --- the config ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("game", "sections", "message"),
    [
        ({"history": "tokens"}, {}, r"game.history must be one of \['prompt', 'sequence'\]"),
        ({"history": "sequence", "actions": "score"}, {}, "game.history: sequence: game.actions: score samples no"),
        ({"history": "sequence"}, {"agents": {"algorithm": "reinforce_pp"}}, r"trains with ppo .*\['reinforce_pp'\]"),
    ],
)
def test_a_sequence_history_the_run_could_not_train_is_refused(game, sections, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(game_config(game, **sections)).check_game()


def test_a_sequence_history_is_read_and_written_back():
    config = config_from_dict(game_config({"history": "sequence"}))
    assert config.game.history == "sequence" and config.to_dict()["game"]["history"] == "sequence"


# --- rollouts that continue ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("actions", ["generate", "constrained", "think"])
def test_a_turn_goes_on_from_the_kept_caches_as_a_forward_over_the_whole_sequences_would(tok, actions):
    """After a first turn the book keeps each row's cache of a prefix of its sequence; the next turn's layout, read on
    top of those caches, gives each row the next-token logits of one forward over its whole sequence."""
    agent = learner(tok, actions)
    turns, _ = sequence_turns()
    agent.act(turns[0])
    book, model = agent.collector.book, agent.model
    assert all(s.cache is not None and 0 < s.cache.length <= len(s.ids) for s in book.sequences.values())
    keys = [(None, game) for game in turns[1]["games"]]
    book.observe(keys, turns[1]["delta"], tok, False)
    prompts = book.prompts(keys, tok, model)
    ids, mask, cache = prompts.continuation
    assert cache.get_seq_length() == max(book.sequences[key].cache.length for key in keys)
    with torch.no_grad():
        new = ids[:, cache.get_seq_length() :]
        positions = (mask.cumsum(1) - 1).clamp(min=0)[:, -new.shape[1] :]
        continued = model(input_ids=new, attention_mask=mask, position_ids=positions, past_key_values=cache).logits
        for row, key in enumerate(keys):
            whole = torch.tensor([book.sequences[key].ids])
            alone = model(input_ids=whole).logits[0, -1]
            torch.testing.assert_close(continued[row, -1], alone, atol=1e-4, rtol=1e-4)


def test_only_the_book_holds_the_caches_not_the_turns_rollouts(tok):
    """Each turn's rollout, kept until the episode's update, keeps its prompts but no cache: every turn's whole cache
    kept with it would grow the memory with the square of the game's length."""
    agent = learner(tok, "generate")
    turns, _ = sequence_turns()
    rollouts = [agent.collector.collect(observation) for observation in turns]
    assert all(rollout.prompts.ids for rollout in rollouts)
    assert all(rollout.prompts.kept is None and rollout.prompts.continuation is None for rollout in rollouts)
    assert all(sequence.cache is not None for sequence in agent.collector.book.sequences.values())


def test_without_a_cache_to_go_on_from_a_turn_reads_its_whole_sequence(tok):
    agent = learner(tok, "generate")
    turns, _ = sequence_turns()
    first_keys = [(None, game) for game in turns[0]["games"]]
    agent.collector.book.observe(first_keys, turns[0]["delta"], tok, False)
    prompts = agent.collector.book.prompts(first_keys, tok, None)
    assert prompts.continuation is None
    ids, mask = prompts.padded(tok.pad_token_id)
    assert ids.shape[1] == max(len(row) for row in prompts.ids) and int(mask.sum()) == sum(map(len, prompts.ids))


# --- playing outside training ----------------------------------------------------------------------------------------


def test_a_model_player_in_both_seats_goes_on_from_each_seats_own_sequence_and_starts_anew_with_each_batch(tok):
    agent = learner(tok, "constrained")
    player = ModelPlayer("model", agent.model, tok, GENERATION, "constrained", collector=agent.collector)
    for seed in (0, 1):
        env = BatchedGameEnv(lambda: CountdownGame(target=5), batch_size=3, seed=seed, history="sequence")
        episode = play_episode(env, dict.fromkeys(env.possible_agents, player), seed=seed)
        book = agent.collector.play_book.sequences
        assert {role for role, _ in book} == set(env.possible_agents)  # one sequence per seat and game
        for (role, game), sequence in book.items():
            answers = sum(1 for move in env.records[game].moves if move.seat == role)
            forfeits = int(env.records[game].forfeited_by == role)
            assert len(sequence.answers) == answers + forfeits  # this batch's answers only
        assert episode.final_infos


@pytest.mark.parametrize("target", [5, 7])
def test_a_game_played_as_sequences_passes_the_game_env_check(target):
    report = check_game_env(lambda: BatchedGameEnv(lambda: CountdownGame(target=target), 3, history="sequence"))
    assert "turns" in report["rows_match_mask"]


def test_the_game_env_check_refuses_a_delta_that_is_no_text():
    class Silent(GameView):
        def delta(self, game, seat, new_moves, moves):
            return " "

    with pytest.raises(AssertionError, match="the view's delta is ' ', not a text to read"):
        check_game_env(lambda: BatchedGameEnv(lambda: CountdownGame(), 3, view=Silent(), history="sequence"))
