"""game.actions: constrained answers (sampling restricted to the legal moves' names, the same restriction
re-applied wherever log-probs are computed) and scored moves (a softmax over the legal moves' normalised
log-likelihoods, action-level PPO), on tiny models built here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from marllm.algorithms import GenerationConfig, PPOConfig, PPOLearner
from marllm.algorithms.actions import ScoreCollector
from marllm.algorithms.catalog import AlgorithmOptions, build_learner
from marllm.cli import main
from marllm.config import config_from_dict
from marllm.games.env import exact_move, first_legal_move
from marllm.models.legal_moves import generate_moves, score_logprobs
from marllm.models.move_tries import MoveTrie, move_continuations, restrict_logits
from marllm.models.packed_moves import move_tensors, packed_from_tensors
from marllm.models.policy import ready_for_generation
from tests.conftest import make_tiny_gpt2
from tests.test_games_config import game_config

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ROOT = Path(__file__).resolve().parents[1]
needs_openspiel = pytest.mark.skipif(
    importlib.util.find_spec("pyspiel") is None or importlib.util.find_spec("shimmy") is None,
    reason="needs the optional open_spiel and shimmy (pip install 'marllm[games]')",
)
# Multi-token names, names sharing their first tokens, a name that is a prefix of another ("1" and "10"; "a b" and
# "a b c"), rows of different sizes and prompts of different lengths (left padding).
PROMPTS = ["Your move:", "what a", "the movie was good and", "i think\n"]
MOVES = [["1", "10", "rock"], ["pass", "bet"], ["a b c", "a b", "the story"], ["good", "bad"]]
# Scored moves cannot have a name that begins another (it has no end): multi-token names sharing their first tokens.
SCORE_MOVES = [["1", "20", "rock"], ["pass", "bet"], ["a b c", "a b d", "the story"], ["good", "bad"]]


def complete_paths(trie: MoveTrie, eos: int, node: int = 0, prefix: tuple[int, ...] = ()) -> set[tuple[int, ...]]:
    """Every token sequence the tree admits from ``node``, each ending with EOS."""
    paths = set()
    for token in trie.allowed(node, eos):
        if token == eos:
            paths.add((*prefix, eos))
        else:
            paths |= complete_paths(trie, eos, trie.children[node][token], (*prefix, token))
    return paths


def test_the_prefix_tree_admits_exactly_the_legal_moves(tokenizer):
    eos = tokenizer.eos_token_id
    continuations = move_continuations(tokenizer, PROMPTS, MOVES)
    for prompt, names, moves in zip(PROMPTS, MOVES, continuations, strict=True):
        # Each move's tokens are those the prompt followed by " name" is encoded with.
        whole = tokenizer(prompt + " " * (not prompt[-1].isspace()) + "".join(names[:1]))["input_ids"]
        assert whole[-len(moves[0]) :] == moves[0]
        assert [tokenizer.decode(m).strip() for m in moves] == names
        trie = MoveTrie.of(moves)
        assert complete_paths(trie, eos) == {(*m, eos) for m in moves}
    assert any(len(m) > 1 for row in continuations for m in row)  # multi-token names
    one, ten = continuations[0][:2]
    assert ten[: len(one)] == one  # "1" is a prefix of "10": EOS and "0" are both allowed after it
    trie = MoveTrie.of(continuations[0])
    node = trie.children[0][one[0]]
    for token in one[1:]:
        node = trie.children[node][token]
    assert eos in trie.allowed(node, eos) and ten[len(one)] in trie.allowed(node, eos)
    with pytest.raises(ValueError, match="row 0: no legal move"):
        move_continuations(tokenizer, ["x"], [[]])


def test_restrict_logits_keeps_only_the_allowed_tokens():
    logits = torch.randn(2, 3, 7)
    allowed = torch.tensor([[[1, 4], [2, -1], [-1, -1]], [[0, 6], [5, 3], [6, -1]]])
    restricted = restrict_logits(logits, allowed)
    for b in range(2):
        for t in range(3):
            kept = torch.isfinite(restricted[b, t]).nonzero().flatten().tolist()
            wanted = sorted(i for i in allowed[b, t].tolist() if i >= 0) or list(range(7))  # all −1: unrestricted
            assert kept == wanted
            assert torch.equal(restricted[b, t, kept], logits[b, t, kept])


def test_every_constrained_answer_is_a_legal_move(tokenizer):
    model = make_tiny_gpt2(tokenizer).eval()
    ready_for_generation(tokenizer)
    torch.manual_seed(0)
    seen = set()
    for _ in range(6):
        sample = generate_moves(model, tokenizer, PROMPTS * 2, MOVES * 2, GenerationConfig(temperature=2.0))
        for answer, names, move in zip(sample.generated.texts, MOVES * 2, sample.moves, strict=True):
            assert exact_move(answer, names) == first_legal_move(answer, names) == move
            seen.add(answer)
        lengths = sample.generated.mask.sum(1)
        ends = sample.generated.response[torch.arange(len(lengths)), lengths - 1]
        assert (ends == tokenizer.eos_token_id).all()  # every answer ends with its EOS, inside the mask
    assert {"1", "10"} <= seen or {"a b", "a b c"} & seen  # prefix moves are answered too


class RecordingRatio:
    """Wraps a learner's ``_objective`` to keep the per-token log-prob differences of its first loss."""

    def __init__(self, learner):
        self.differences = []
        objective = learner._objective

        def recording(mb, logprobs, values, kl_coef):
            self.differences.append(((logprobs - mb.logprobs) * mb.mask).abs().max().item())
            return objective(mb, logprobs, values, kl_coef)

        learner._objective = recording


def assert_first_update_is_on_policy(learner):
    """Update ``learner`` once: its first loss's log-probs are the rollout's at every token (ratio 1), KL ≥ 0."""
    recorder = RecordingRatio(learner)
    metrics = learner.update()
    assert max(recorder.differences) < 1e-5
    assert metrics["ratio"] == pytest.approx(1.0, abs=1e-5) and metrics["kl"] >= -1e-6


def constrained_learner(tokenizer, **ppo):
    config = PPOConfig.from_flat(**{"mini_batch_size": 6, "ppo_epochs": 1, **ppo})
    model, reference = make_tiny_gpt2(tokenizer, seed=1), make_tiny_gpt2(tokenizer, seed=2)
    generation = GenerationConfig(temperature=1.5, logprobs_from="sampling", top_k=20)
    return PPOLearner(
        "llm", model=model, tokenizer=tokenizer, reference=reference, config=config, generation=generation,
        actions="constrained",
    )  # fmt: skip


FROM_GENERATE = {"rollout_from_generate": True}
OLD_PATH = {"micro_batch_size": None, "rollout_from_generate": False}  # whole mini-batches, a second rollout forward


@pytest.mark.parametrize(
    "ppo", [OLD_PATH, {}, {"micro_batch_size": 2}, FROM_GENERATE, {**FROM_GENERATE, "micro_batch_size": 1}]
)
def test_constrained_log_probs_at_update_time_are_those_sampled(tokenizer, ppo):
    """Two turns (merged, of different widths), one mini-batch: the first ratio is 1 at every token; forced tokens
    have log-prob 0; a move's probability is the product of its tokens' (move_probabilities)."""
    torch.manual_seed(0)
    learner = constrained_learner(tokenizer, **ppo)
    first = learner.act({"prompt": PROMPTS, "legal_moves": MOVES})
    learner.act({"prompt": PROMPTS[1:3], "legal_moves": MOVES[1:3]})
    rollout = learner.rollouts[0]
    b = rollout.tensors
    forced = ((b.allowed >= 0).sum(-1) == 1) & (b.mask > 0)
    assert forced.any() and b.logprobs[forced].abs().max() < 1e-6
    probabilities = learner.move_probabilities(PROMPTS, MOVES)
    for row, (answer, names) in enumerate(zip(first, MOVES, strict=True)):
        assert sum(probabilities[row]) == pytest.approx(1.0, abs=1e-5)
        sampled = float((b.logprobs[row] * b.mask[row]).sum().exp())
        assert probabilities[row][names.index(answer)] == pytest.approx(sampled, abs=1e-5)
    learner.finish([1.0, 0.0, -1.0, 0.5])
    learner.finish([0.0, 1.0])
    assert_first_update_is_on_policy(learner)


def test_a_learner_with_legal_actions_refuses_observations_without_legal_moves(tokenizer):
    learner = constrained_learner(tokenizer)
    with pytest.raises(ValueError, match="need the game's legal moves"):
        learner.act({"prompt": ["what a"]})
    with pytest.raises(ValueError, match="stop_at_eos"):
        PPOLearner("x", model=learner.model, tokenizer=tokenizer, reference=learner.reference,
                   generation=GenerationConfig(stop_at_eos=False), actions="constrained")  # fmt: skip


def hand_score(model, tokenizer, prompt, names, normalization):
    """π over ``names`` computed move by move: one forward of prompt + " " + name each."""
    scores = []
    for name in names:
        prompt_ids = tokenizer(prompt)["input_ids"]
        ids = tokenizer(prompt + " " * (not prompt[-1].isspace()) + name)["input_ids"]
        with torch.no_grad():
            logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
        tokens = ids[len(prompt_ids) :]
        total = sum(logprobs[len(prompt_ids) - 1 + i, token] for i, token in enumerate(tokens))
        scale = {"none": 1, "token": len(tokens), "word": len(name.split())}[normalization]
        scores.append(total / scale)
    return torch.softmax(torch.stack(scores), 0).tolist()


def score_learner(tokenizer, normalization="token", algorithm="ppo", **ppo):
    config = PPOConfig.from_flat(**{"mini_batch_size": 6, "ppo_epochs": 1, **ppo})
    model, reference = make_tiny_gpt2(tokenizer, seed=1), make_tiny_gpt2(tokenizer, seed=2)
    options = AlgorithmOptions(actions="score", action_normalization=normalization)
    return build_learner(
        algorithm, "llm", options, model=model, tokenizer=tokenizer, reference=reference, config=config
    )


def reinforce_score_learner(tokenizer, **ppo):
    return score_learner(tokenizer, algorithm="reinforce_pp", **ppo)


@pytest.mark.parametrize("normalization", ["none", "token", "word"])
def test_score_probabilities_are_a_softmax_of_the_moves_likelihoods(tokenizer, normalization):
    learner = score_learner(tokenizer, normalization)
    assert isinstance(learner.collector, ScoreCollector)
    probabilities = learner.move_probabilities(PROMPTS, SCORE_MOVES)
    for prompt, names, row in zip(PROMPTS, SCORE_MOVES, probabilities, strict=True):
        assert sum(row) == pytest.approx(1.0, abs=1e-6)
        assert row == pytest.approx(hand_score(learner.model, tokenizer, prompt, names, normalization), abs=1e-5)


@pytest.mark.parametrize("algorithm", ["ppo", "reinforce_pp"])
@pytest.mark.parametrize("ppo", [{}, {"micro_batch_size": 2}])
def test_action_level_learners_start_at_ratio_one(tokenizer, ppo, algorithm):
    torch.manual_seed(0)
    learner = score_learner(tokenizer, algorithm=algorithm, **ppo)
    assert isinstance(learner.collector, ScoreCollector) and (learner.value_head is None) == (algorithm != "ppo")
    answers = learner.act({"prompt": PROMPTS, "legal_moves": SCORE_MOVES})
    assert all(answer in names for answer, names in zip(answers, SCORE_MOVES, strict=True))
    learner.act({"prompt": PROMPTS[:2], "legal_moves": SCORE_MOVES[:2]})
    b = learner.rollouts[0].tensors
    exact = learner.move_probabilities(PROMPTS, SCORE_MOVES)
    for row, (answer, names) in enumerate(zip(answers, SCORE_MOVES, strict=True)):
        assert float(b.logprobs[row, 0].exp()) == pytest.approx(exact[row][names.index(answer)], abs=1e-5)
    assert (b.kl_full >= -1e-6).all()
    learner.finish([1.0, 0.0, -1.0, 0.5])
    learner.finish([0.0, 1.0])
    recorder = RecordingRatio(learner)
    metrics = learner.update()
    assert max(recorder.differences) < 1e-5 and metrics["ratio"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["response_length"] == 1.0 and 0 <= metrics["entropy"] <= torch.log(torch.tensor(3.0)).item()


@pytest.mark.parametrize("algorithm", ["ppo", "reinforce_pp"])
def test_action_level_learners_learn_the_rewarded_move(tokenizer, algorithm):
    """One prompt, two moves, the first paid 1 and the second 0: a few updates raise the first move's probability."""
    torch.manual_seed(0)
    learner = score_learner(tokenizer, algorithm=algorithm, mini_batch_size=8, learning_rate=3e-3, init_kl_coef=0.0)
    prompts, moves = ["i think"] * 8, [["good", "bad"]] * 8
    before = learner.move_probabilities(prompts[:1], moves[:1])[0][0]
    for _ in range(6):
        answers = learner.act({"prompt": prompts, "legal_moves": moves})
        learner.finish([1.0 if answer == "good" else 0.0 for answer in answers])
        learner.update()
    assert learner.move_probabilities(prompts[:1], moves[:1])[0][0] > before + 0.05


@pytest.mark.parametrize("make", [constrained_learner, score_learner, reinforce_score_learner])
def test_a_learner_with_legal_actions_saves_and_restores(tokenizer, make):
    torch.manual_seed(0)
    learner = make(tokenizer, mini_batch_size=4)
    learner.act({"prompt": PROMPTS, "legal_moves": SCORE_MOVES})
    learner.finish([1.0, 0.0, -1.0, 0.5])
    learner.update()
    tensors, meta = learner.state_dict()
    restored = make(tokenizer, mini_batch_size=4)
    restored.load_state_dict(tensors, json.loads(json.dumps(meta)))
    before = [p for row in learner.move_probabilities(PROMPTS, SCORE_MOVES) for p in row]
    after = [p for row in restored.move_probabilities(PROMPTS, SCORE_MOVES) for p in row]
    assert after == pytest.approx(before, abs=1e-7)


def test_game_actions_are_validated_naming_the_key():
    actions = r"\['generate', 'constrained', 'think', 'score'\]"
    with pytest.raises(ValueError, match=rf"game.actions: unknown action mode 'sample'; one of {actions}"):
        config_from_dict(game_config({"actions": "sample"}))
    with pytest.raises(ValueError, match=r"normalization must be one of \['none', 'token', 'word'\]"):
        config_from_dict(game_config({"actions": {"score": {"normalization": "mean"}}}))
    assert config_from_dict(game_config({"actions": "score"}, agents={"algorithm": "reinforce_pp"}))
    with pytest.raises(ValueError, match="generation.stop_at_eos: true"):
        config_from_dict(game_config({"actions": "constrained"}, generation={"stop_at_eos": False}))
    with pytest.raises(ValueError, match="snapshot pool plays game.actions: generate only"):
        pool = {"snapshot_pool": {"learner": "llm"}}
        config_from_dict(game_config({"actions": "constrained", "seats": ["llm", pool]}))
    assert config_from_dict(game_config({"actions": "constrained"}, agents={"algorithm": "reinforce_pp"}))


@needs_openspiel
@pytest.mark.parametrize(
    ("actions", "algorithm"), [("constrained", "ppo"), ("score", "ppo"), ("score", "reinforce_pp"), ("think", "ppo")]
)
def test_a_kuhn_poker_run_with_legal_actions_never_answers_illegally(tmp_path, actions, algorithm):
    """Self-play Kuhn poker on the offline base for an iteration, checkpointed, then marllm eval with the mode."""
    run_dir = tmp_path / "run"
    config = str(ROOT / "examples" / "games" / "kuhn_poker_offline.yaml")
    overrides = ["iterations=1", "game.batch_size=2", "logging.progress=false", f"game.actions={actions}"]
    overrides += [f"agents.algorithm={algorithm}"]
    overrides += ["game.illegal=forfeit", "game.illegal_penalty=0.0"]
    assert main(["train", config, "--run-dir", str(run_dir), *overrides]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and all(row["llm/game/illegal_move_rate"] == 0.0 for row in rows)
    assert all(abs(row["llm/kl"]) < 10 for row in rows)
    out = tmp_path / "eval.json"
    checkpoint = str(run_dir / "checkpoints" / "llm")
    evaluation = ["eval", config, *overrides, "--checkpoint", checkpoint, "--games", "2", "--opponent", "random"]
    assert main([*evaluation, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["actions"] == actions and all(row["illegal_move_rate"] == 0.0 for row in result["rows"])


@pytest.mark.parametrize("normalization", ["none", "token", "word"])
def test_one_token_moves_are_scored_from_one_forward_of_each_distinct_prompt(tokenizer, normalization):
    """Every move one token (after prompts ending in whitespace): π and V come from one forward of each distinct
    prompt, and equal the move-by-move computation and the packed path's; a repeated prompt is computed once."""
    prompts, moves = ["i think\n", "what a\n", "i think\n"], [["a", "b"], ["1", "2", "3"], ["a", "b"]]
    learner = score_learner(tokenizer, normalization)
    columns = move_tensors(tokenizer, prompts, moves, False)
    assert columns["moves"].shape[-1] == 1  # the one-forward path
    forwards = []
    hook = learner.model.register_forward_hook(lambda module, args, output: forwards.append(len(output.logits)))
    with torch.no_grad():
        table, values = learner.collector.scores(learner.model, columns, with_values=True)
    hook.remove()
    assert forwards == [2]  # one forward, of the two distinct prompts
    for row, (prompt, names) in enumerate(zip(prompts, moves, strict=True)):
        expected = hand_score(learner.model, tokenizer, prompt, names, normalization)
        assert table[row, : len(names)].exp().tolist() == pytest.approx(expected, abs=1e-5)
        assert torch.isinf(table[row, len(names) :]).all()
    torch.testing.assert_close(table[0], table[2], rtol=0, atol=0)
    packed = packed_from_tensors(*(columns[k] for k in ("input_ids", "attention_mask", "moves", "move_words")), 0)
    with torch.no_grad():
        logprobs, packed_values = score_logprobs(learner.model, packed, normalization, learner.value_head)
    torch.testing.assert_close(packed.per_row(logprobs), table, rtol=0, atol=1e-5)
    first_moves = torch.tensor([0, 2, 5])  # each prompt's first packed row
    torch.testing.assert_close(packed_values[first_moves].unsqueeze(1), values, rtol=0, atol=1e-5)
