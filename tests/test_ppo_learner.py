"""PPOLearner on a tiny GPT-2: learning, guards against bad input, persistence."""

import numpy as np
import pytest
import torch

from marllm.algorithms import GenerationConfig, NonFiniteLossError, PPOConfig, PPOLearner
from marllm.models.generation import PromptTooLongError
from marllm.models.policy import ReferencePool
from tests.conftest import make_tiny_gpt2


def make_learner(
    tokenizer, seed=0, learner_class=PPOLearner, learner_kwargs=None, placement=None, **ppo
):
    """A ``learner_class`` (PPO by default; ``learner_kwargs`` for its own arguments) on a tiny GPT-2, with a fixed
    η and a learning rate that moves it within a few updates; ``ppo`` overrides the PPO settings. ``placement``
    (None: whole models on one process) prepares the policy and the reference (a Sharded one shards them over its
    ranks) and is handed to the learner."""
    settings = {"mini_batch_size": 8, "learning_rate": 3e-3, "init_kl_coef": 0.01, "kl_control": "fixed"}
    settings.update(ppo)
    model = make_tiny_gpt2(tokenizer, seed=seed)
    reference = make_tiny_gpt2(tokenizer, seed=seed).requires_grad_(False).eval()
    if placement is not None:
        model, reference = placement.prepare(model), placement.prepare(reference)
    return learner_class(
        "llm1",
        model=model,
        tokenizer=tokenizer,
        reference=reference,
        config=PPOConfig.from_flat(**settings),
        generation=GenerationConfig(4, 8),
        seed=seed,
        placement=placement,
        **(learner_kwargs or {}),
    )


def assert_learns_to_say_good(learner, tokenizer, updates=40, best_window=False):
    """Reward = share of response tokens equal to ' good'; its mean over the last 5 updates (``best_window``: over the
    best 5 in a row) must exceed its mean over the first 5 by 0.2."""
    target = tokenizer.encode(" good")[0]

    def reward(responses):
        ids = [tokenizer.encode(r) for r in responses]
        return [sum(t == target for t in row) / max(len(row), 1) for row in ids]

    history = []
    for _ in range(updates):
        responses = learner.act({"prompt": ["this movie was"] * 16})
        learner.finish(reward(responses))
        history.append(learner.update()["task_reward"])
    start, end = np.mean(history[:5]), np.mean(history[-5:])
    if best_window:
        end = max(np.convolve(history, np.ones(5) / 5, mode="valid"))
    assert end > start + 0.2, f"reward did not rise: first 5 {history[:5]}, last 5 {history[-5:]}"


def test_rollout_records_what_ppo_needs(tokenizer):
    learner = make_learner(tokenizer)
    responses = learner.act({"prompt": ["this movie was"] * 8})
    assert len(responses) == 8 and all(isinstance(r, str) for r in responses)
    rollout = learner.rollouts[0]
    batch = rollout.tensors
    length = batch.response.shape[1]
    assert 1 <= length <= 8
    for key in ("logprobs", "ref_logprobs", "values", "kl", "kl_full", "mask"):
        assert batch[key].shape == (8, length), key
    # policy and reference are identical copies: the KL starts at exactly zero
    assert torch.allclose(batch.logprobs, batch.ref_logprobs, atol=1e-5)
    assert batch.kl_full.abs().max().item() < 1e-5
    # the decoded text is exactly the masked response tokens
    for i in range(8):
        n = int(batch.mask[i].sum())
        assert responses[i] == tokenizer.decode(batch.response[i, :n], skip_special_tokens=True)


def test_learner_learns_to_say_a_token(tokenizer):
    """Reward = share of response tokens equal to ' good'; it must rise well above its start within 40 updates."""
    torch.manual_seed(0)
    learner = make_learner(tokenizer, mini_batch_size=8, ppo_epochs=4, score_transform="none")
    assert_learns_to_say_good(learner, tokenizer)


def test_kl_grows_as_the_policy_moves_and_updates_kl_coef(tokenizer):
    learner = make_learner(
        tokenizer, kl_control="adaptive", kl_penalty="full", init_kl_coef=0.2, target_kl=0.001, kl_horizon=16
    )
    stats = []
    for _ in range(3):
        learner.act({"prompt": ["the film"] * 8})
        learner.finish(np.linspace(-1, 1, 8))
        stats.append(learner.update())
    assert stats[0]["kl"] == pytest.approx(0.0, abs=1e-5)  # first batch: policy == reference
    assert stats[-1]["kl"] > 0.0
    # the first batch (KL 0 < target) lowered η by the clipped 20% · n/horizon; the last (KL > target) raised it
    assert stats[1]["kl_coef"] == pytest.approx(0.2 * (1 - 0.2 * 8 / 16))
    assert stats[-1]["kl_penalty"] > 0.001
    assert learner.kl_controller.value > stats[-1]["kl_coef"]
    assert stats[-1]["combined_reward"] == pytest.approx(
        stats[-1]["task_reward"] - stats[-1]["kl_coef"] * stats[-1]["kl"]
    )


def test_task_reward_and_received_reward_are_kept_apart(tokenizer):
    learner = make_learner(tokenizer)
    learner.act({"prompt": ["a"] * 8})
    learner.finish(rewards=[3.0] * 8, task_rewards=[1.0] * 8)
    stats = learner.update()
    assert stats["received_reward"] == pytest.approx(3.0)
    assert stats["task_reward"] == pytest.approx(1.0)


def test_score_normalisation_uses_running_statistics(tokenizer):
    learner = make_learner(tokenizer, score_transform="normalize")
    learner.act({"prompt": ["a"] * 8})
    learner.finish([0.0, 2.0] * 4)
    stats = learner.update()
    assert stats["score"] == pytest.approx(0.0, abs=1e-6)  # mean removed
    assert learner.score_statistics.mean == pytest.approx(1.0)


def test_preprocess_computes_the_targets_without_writing_into_the_rollout(tokenizer):
    learner = make_learner(tokenizer)
    learner.act({"prompt": ["a"] * 8})
    learner.finish(np.linspace(-1, 1, 8))
    rollout = learner.rollouts[0]
    columns = set(rollout.tensors.keys())
    data = learner._preprocess(rollout)
    assert set(rollout.tensors.keys()) == columns  # nothing added to the rollout
    assert set(data.batch.keys()) == columns | {"rewards", "advantages", "returns"}
    assert data.batch.logprobs is rollout.tensors.logprobs  # the rollout's tensors, not copies
    assert len(data) == 8 and data.prompt_length == rollout.prompt_length and data.kl_coef == 0.01
    assert not data.batch.advantages.requires_grad
    learner.update()
    assert set(rollout.tensors.keys()) == columns


def test_update_reports_the_same_metric_names(tokenizer):
    learner = make_learner(tokenizer, on_nonfinite="skip")
    learner.act({"prompt": ["a"] * 8})
    learner.finish(np.linspace(-1, 1, 8))
    stats = learner.update()
    assert list(stats) == [
        "task_reward", "received_reward", "score", "kl", "kl_penalty", "kl_coef", "combined_reward",
        "response_length", "returns/mean", "values/mean", "explained_variance", "time/generation_s",
        "time/forward_s", "time/update_s", "loss/policy", "loss/value", "loss/total", "clipfrac", "value_clipfrac",
        "approx_kl", "entropy", "ratio", "skipped_minibatch_fraction", "nonfinite_skipped",
    ]  # fmt: skip
    assert all(isinstance(value, float) for value in stats.values())


class RecordingKLController:
    def __init__(self, value):
        self.value, self.calls = value, []

    def update(self, current_kl, n_steps):
        self.calls.append((current_kl, n_steps))
        self.value *= 2.0


def test_a_kl_controller_passed_in_is_used_and_checkpointed(tokenizer):
    model = make_tiny_gpt2(tokenizer)
    reference = make_tiny_gpt2(tokenizer).requires_grad_(False).eval()
    controller = RecordingKLController(0.05)
    learner = PPOLearner(
        "llm1",
        model=model,
        tokenizer=tokenizer,
        reference=reference,
        config=PPOConfig.from_flat(mini_batch_size=8),
        generation=GenerationConfig(4, 8),
        kl_controller=controller,
    )
    assert learner.kl_controller is controller
    learner.act({"prompt": ["a"] * 8})
    learner.finish(np.linspace(-1, 1, 8))
    stats = learner.update()
    assert stats["kl_coef"] == 0.05  # not the config's init_kl_coef (0.3)
    assert controller.calls == [(pytest.approx(stats["kl_penalty"]), 8)] and controller.value == 0.1
    tensors, meta = learner.state_dict()
    assert meta["kl_coef"] == 0.1
    other = RecordingKLController(1.0)
    restored = PPOLearner(
        "llm1",
        model=make_tiny_gpt2(tokenizer),
        tokenizer=tokenizer,
        reference=reference,
        config=PPOConfig.from_flat(mini_batch_size=8),
        generation=GenerationConfig(4, 8),
        kl_controller=other,
    )
    restored.load_state_dict(tensors, meta)
    assert other.value == 0.1


def test_constructor_arguments_are_keyword_only_and_the_controller_is_checked(tokenizer):
    model = make_tiny_gpt2(tokenizer)
    with pytest.raises(TypeError, match="positional argument"):
        PPOLearner("llm1", model, tokenizer, model)
    with pytest.raises(TypeError, match="kl_controller must have a value and an update"):
        PPOLearner("llm1", model=model, tokenizer=tokenizer, reference=model, kl_controller=0.1)


def test_prompt_longer_than_context_is_an_error(tokenizer):
    model = make_tiny_gpt2(tokenizer, n_positions=16)
    learner = PPOLearner(
        "llm1",
        model=model,
        tokenizer=tokenizer,
        reference=model,
        config=PPOConfig.from_flat(mini_batch_size=2),
        generation=GenerationConfig(4, 8),
    )
    with pytest.raises(PromptTooLongError, match=r"prompt 1 has \d+ tokens.*context of 16"):
        learner.act({"prompt": ["short", "this movie was good and the acting was great " * 3]})


def test_empty_prompt_is_an_error(tokenizer):
    learner = make_learner(tokenizer)
    with pytest.raises(ValueError, match=r"prompt\(s\) \[1\] tokenize to nothing"):
        learner.act({"prompt": ["fine", ""]})


def test_batch_not_divisible_by_mini_batch_is_an_error(tokenizer):
    learner = make_learner(tokenizer, mini_batch_size=4)
    learner.act({"prompt": ["a"] * 6})
    learner.finish([1.0] * 6)
    with pytest.raises(ValueError, match="batch size 6 is not divisible by .* 4 × 1 = 4"):
        learner.update()


def test_reward_count_and_order_errors(tokenizer):
    learner = make_learner(tokenizer)
    with pytest.raises(RuntimeError, match="no rollout"):
        learner.update()
    with pytest.raises(RuntimeError, match="no rollout waiting"):
        learner.finish([1.0])
    learner.act({"prompt": ["a"] * 8})
    with pytest.raises(ValueError, match="got 3 rewards for a rollout of 8"):
        learner.finish([1.0] * 3)
    with pytest.raises(ValueError, match="non-finite rewards at \\[2\\]"):
        learner.finish([1.0, 1.0, float("nan")] + [1.0] * 5)
    with pytest.raises(RuntimeError, match="never got their reward"):
        learner.update()


def test_nan_loss_applies_no_update(tokenizer):
    learner = make_learner(tokenizer)
    learner.act({"prompt": ["a"] * 8})
    learner.finish([1.0] * 8)
    with torch.no_grad():
        learner.value_head.summary.bias.fill_(float("nan"))
    policy_before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    with pytest.raises(NonFiniteLossError, match="optimiser step was not applied"):
        learner.update()
    for key, value in learner.model.state_dict().items():
        assert torch.equal(value, policy_before[key]), key
    assert all(p.grad is None for p in learner.model.parameters())


def step_gradients(learner: PPOLearner) -> list[torch.Tensor]:
    """Record the gradient every optimiser step of ``learner`` applies, flattened, in step order."""
    recorded = []
    step = learner.optimizer.step

    def recording_step(*args, **kwargs):
        params = [p for group in learner.optimizer.param_groups for p in group["params"]]
        recorded.append(torch.cat([p.grad.flatten() for p in params if p.grad is not None]).clone())
        return step(*args, **kwargs)

    learner.optimizer.step = recording_step
    return recorded


def test_gradient_accumulation_matches_one_big_mini_batch(tokenizer):
    """2 mini-batches of 4 with accumulation 2 apply the same gradient as 1 mini-batch of 8.

    The comparison is of the gradient handed to the optimiser, not of the parameters after an Adam step: Adam's
    first step is lr·g/(|g|+ε), so any component with |g| near ε flips with the last bit of the summation order
    (which differs between CPUs and builds), while a missing 1/accumulation factor would not change it at all.
    The tolerance is relative to the gradient itself: summation order moves it by ~1e-7 of its size, while a
    missing division (2×) or a zero_grad between micro-batches (half the batch) moves it by ~1.
    """
    gradients = []
    for mini_batch_size, accumulation in ((8, 1), (4, 2)):
        torch.manual_seed(1)
        model = make_tiny_gpt2(tokenizer, seed=1)
        reference = make_tiny_gpt2(tokenizer, seed=1).requires_grad_(False).eval()
        ppo = PPOConfig.from_flat(
            mini_batch_size=mini_batch_size,
            gradient_accumulation_steps=accumulation,
            ppo_epochs=1,
            learning_rate=3e-3,
            kl_control="fixed",
            init_kl_coef=0.01,
        )
        # Every response runs to the same length, so a masked mean per mini-batch equals the batch's mean.
        generation = GenerationConfig(6, 6, stop_at_eos=False)
        learner = PPOLearner(
            "llm1", model=model, tokenizer=tokenizer, reference=reference, config=ppo, generation=generation, seed=1
        )
        recorded = step_gradients(learner)
        learner.act({"prompt": ["the story"] * 8})
        learner.finish(np.arange(8.0))
        learner.update()
        assert len(recorded) == 1
        gradients.append(recorded[0])
    one_batch, accumulated = gradients
    scale = one_batch.abs().max()
    assert scale > 0
    assert (accumulated - one_batch).abs().max() <= 1e-4 * scale


def test_save_and_load_state_round_trip(tokenizer, tmp_path):
    learner = make_learner(tokenizer, kl_control="adaptive")
    learner.act({"prompt": ["a"] * 8})
    learner.finish(np.linspace(0, 1, 8))
    learner.update()
    learner.save(tmp_path / "llm1")
    assert (tmp_path / "llm1" / "policy" / "config.json").is_file()
    restored = make_learner(tokenizer, kl_control="adaptive")
    restored.load_state(tmp_path / "llm1")
    assert restored.kl_controller.value == pytest.approx(learner.kl_controller.value)
    assert restored.num_updates == 1
    assert restored.score_statistics.mean == pytest.approx(learner.score_statistics.mean)
    for a, b in zip(restored.value_head.parameters(), learner.value_head.parameters(), strict=True):
        assert torch.equal(a, b)


def test_reference_pool_shares_one_frozen_model(tiny_lm_dir):
    pool = ReferencePool()
    first = pool.get(str(tiny_lm_dir), device="cpu")
    second = pool.get(str(tiny_lm_dir), device="cpu")
    assert first is second and len(pool) == 1
    assert not any(p.requires_grad for p in first.parameters())


def test_response_forward_matches_the_full_forward_on_left_padded_rows(tokenizer):
    from marllm.models.policy import ValueHead, response_forward

    model = make_tiny_gpt2(tokenizer).eval()
    tokenizer.padding_side = "left"
    prompts = tokenizer(["this movie was good and", "a"], return_tensors="pt", padding=True)
    response = torch.tensor([[5, 6, 7], [8, 9, 10]])
    input_ids = torch.cat([prompts["input_ids"], response], 1)
    attention_mask = torch.cat([prompts["attention_mask"], torch.ones_like(response)], 1)
    prompt_length = prompts["input_ids"].shape[1]
    head = ValueHead(model.config.hidden_size)
    with torch.no_grad():
        logits, values = response_forward(model, input_ids, attention_mask, prompt_length, head)
        for row in range(2):  # each row alone, without padding, predicts its response the same way
            real = attention_mask[row].bool()
            alone = model(input_ids[row, real].unsqueeze(0), output_hidden_states=True)
            n = int(real.sum()) - 3
            assert torch.allclose(logits[row], alone.logits[0, n - 1 : -1], atol=1e-4)
            assert torch.allclose(values[row], head(alone.hidden_states[-1][0, n - 1 : -1]), atol=1e-4)
