"""What the README's figures are made of, written out here from first principles and compared with the learners.

- An update's targets: on a hand-built rollout (responses of unequal length, chosen values, scores and log-probs),
  PPO's token rewards, GAE with the configured γ and λ, and the whitening; the critic-free learners' outcomes and
  advantages with the KL in the reward and in the loss.
- The statistics a learner logs and the reports plot (``kl``, ``kl_penalty``, task, received and combined reward,
  response length), recomputed from the rollout's tokens with forwards of the policy and the reference of their
  own, for the full-vocabulary and the sampled-token KL penalty.

Nothing here is taken from a run's output: each expected value is a loop over tokens in float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tianshou.data import Batch

from marllm.algorithms import CriticFreeConfig, CriticFreeLearner, GenerationConfig, PPOConfig, PPOLearner, Rollout
from tests.conftest import make_tiny_gpt2

# --- an update's targets, on a hand-built rollout ----------------------------------------------------------------

LENGTHS = (5, 2, 4, 1, 3, 5)  # response tokens of each row: unequal, one of a single token
SCORES = np.array([1.0, -0.5, 2.0, 0.25, -1.5, 0.75])  # the rewards received (score_transform "none")
GROUP = 3  # two groups of three responses to the same query, for GRPO and RLOO
ETA = 0.2  # the KL coefficient, fixed
GAMMA, LAM = 0.9, 0.7  # distinct, and neither 1: swapping them changes every advantage


def hand_built_rollout() -> Rollout:
    """A rewarded-to-be rollout of six right-padded responses, every column chosen here.

    The values on padding are large garbage (as a value head's output there would be): nothing may read them.
    The per-token KL is the k1 estimate log π − log π_0, zero on padding, as the rollout stores it.
    """
    generator = torch.Generator().manual_seed(0)
    batch, prompt_length, length = len(LENGTHS), 3, max(LENGTHS)
    mask = (torch.arange(length)[None, :] < torch.tensor(LENGTHS)[:, None]).float()
    logprobs = -3.0 * torch.rand(batch, length, generator=generator)
    ref_logprobs = -3.0 * torch.rand(batch, length, generator=generator)
    values = torch.randn(batch, length, generator=generator)
    values[mask == 0] = 50.0
    input_ids = torch.randint(1, 100, (batch, prompt_length + length), generator=generator)
    tensors = Batch(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        response=input_ids[:, prompt_length:],
        mask=mask,
        logprobs=logprobs,
        ref_logprobs=ref_logprobs,
        values=values,
        kl=(logprobs - ref_logprobs) * mask,
        kl_full=torch.rand(batch, length, generator=generator) * mask,
    )
    prompts = tuple(f"query {i // GROUP}" for i in range(batch))
    return Rollout(prompts, tuple(f"response {i}" for i in range(batch)), prompt_length, tensors)


def preprocessed(learner: PPOLearner, rollout: Rollout) -> Batch:
    """The batch the learner's epochs would train on, after it received ``SCORES`` for ``rollout``."""
    learner.rollouts.append(rollout)
    learner.finish(SCORES)
    return learner._preprocess(rollout).batch


def tiny_learner(tokenizer, learner_class=PPOLearner, **kwargs) -> PPOLearner:
    settings = {
        "mini_batch_size": len(LENGTHS),
        "kl_control": "fixed",
        "init_kl_coef": ETA,
        "score_transform": "none",
        **kwargs.pop("ppo", {}),
    }
    reference = make_tiny_gpt2(tokenizer).requires_grad_(False).eval()
    return learner_class(
        "llm1",
        model=make_tiny_gpt2(tokenizer),
        tokenizer=tokenizer,
        reference=reference,
        config=PPOConfig.from_flat(**settings),
        **kwargs,
    )


def rows(tensor: torch.Tensor) -> list[np.ndarray]:
    """The real tokens of each response, in float64."""
    array = tensor.detach().double().numpy()
    return [array[i, :n] for i, n in enumerate(LENGTHS)]


def token_rewards(kl: np.ndarray, score: float, eta: float) -> np.ndarray:
    """−η·KL at every token, and the score added at the last one."""
    rewards = -eta * kl
    rewards[-1] += score
    return rewards


def whitened(per_row: list[np.ndarray]) -> list[np.ndarray]:
    """Zero mean and unit (Bessel-corrected) variance over every real token of the batch, ε = 1e-8 under the root."""
    tokens = np.concatenate(per_row)
    mean, std = tokens.mean(), np.sqrt(tokens.var(ddof=1) + 1e-8)
    return [(row - mean) / std for row in per_row]


def padded(per_row: list[np.ndarray]) -> np.ndarray:
    out = np.zeros((len(per_row), max(LENGTHS)))
    for i, row in enumerate(per_row):
        out[i, : len(row)] = row
    return out


def assert_matches(actual: torch.Tensor, per_row: list[np.ndarray], what: str) -> None:
    """``actual`` (B, L) equals ``per_row`` on the real tokens and is 0 on padding (float32 against float64)."""
    np.testing.assert_allclose(actual.double().numpy(), padded(per_row), rtol=1e-5, atol=1e-5, err_msg=what)


@pytest.mark.parametrize("whiten", [True, False])
def test_ppo_targets_are_token_rewards_then_gae_then_whitening(tokenizer, whiten):
    rollout = hand_built_rollout()
    learner = tiny_learner(tokenizer, ppo={"gamma": GAMMA, "lam": LAM, "whiten_advantages": whiten})
    batch = preprocessed(learner, rollout)

    rewards, advantages, returns = [], [], []
    for kl, values, score in zip(rows(rollout.tensors.kl), rows(rollout.tensors.values), SCORES, strict=True):
        reward = token_rewards(kl, score, ETA)
        next_values = np.append(values[1:], 0.0)  # the episode ends at the last real token: nothing bootstrapped
        deltas = reward + GAMMA * next_values - values
        n = len(deltas)
        advantage = np.array([sum((GAMMA * LAM) ** (k - t) * deltas[k] for k in range(t, n)) for t in range(n)])
        rewards.append(reward)
        advantages.append(advantage)
        returns.append(advantage + values)  # GAE's returns, from the advantages before any whitening
    assert_matches(batch.rewards, rewards, "token rewards")
    assert_matches(batch.returns, returns, "returns")
    assert_matches(batch.advantages, whitened(advantages) if whiten else advantages, "advantages")


def group_baseline(outcome: np.ndarray, algorithm: str, scale_by_std: bool) -> np.ndarray:
    """GRPO's (r − mean) / (std + 1e-6) (std with ddof = 1; Dr. GRPO without the division) or RLOO's r − mean of
    the others, per group of ``GROUP`` consecutive responses."""
    advantages = np.zeros_like(outcome)
    for start in range(0, len(outcome), GROUP):
        group = outcome[start : start + GROUP]
        if algorithm == "rloo":
            others = (group.sum() - group) / (GROUP - 1)
            advantages[start : start + GROUP] = group - others
        else:
            centred = group - group.mean()
            advantages[start : start + GROUP] = centred / (group.std(ddof=1) + 1e-6) if scale_by_std else centred
    return advantages


@pytest.mark.parametrize("kl_in", ["reward", "loss"])
@pytest.mark.parametrize(
    ("algorithm", "scale_by_std"),
    [("grpo", True), ("grpo", False), ("rloo", True), ("reinforce_pp", True)],
    ids=["grpo", "dr-grpo", "rloo", "reinforce_pp"],
)
def test_critic_free_targets_take_the_kl_where_it_is_configured(tokenizer, algorithm, scale_by_std, kl_in):
    rollout = hand_built_rollout()
    settings = CriticFreeConfig(kl_in=kl_in, scale_by_std=scale_by_std)
    learner = tiny_learner(tokenizer, CriticFreeLearner, algorithm=algorithm, group_size=GROUP, settings=settings)
    batch = preprocessed(learner, rollout)
    eta = ETA if kl_in == "reward" else 0.0  # with the KL in the loss, the reward is the score alone
    kl = rows(rollout.tensors.kl)

    if algorithm == "reinforce_pp":
        # Token rewards, their returns-to-go (γ = 1), whitened over every real token of the batch.
        returns = [np.cumsum(token_rewards(row, score, eta)[::-1])[::-1] for row, score in zip(kl, SCORES, strict=True)]
        assert_matches(batch.returns, returns, "returns")
        assert_matches(batch.advantages, whitened(returns), "advantages")
        return
    # GRPO and RLOO: one outcome per response, the score less η·(its summed KL), compared within its group. GRPO
    # normalises the scores alone and subtracts the group-centred η·ΣKL (never divided by the scores' std).
    kl_sums = np.array([row.sum() for row in kl])
    outcome = np.array(SCORES, dtype=np.float64) - eta * kl_sums
    np.testing.assert_allclose(batch.outcome.double().numpy(), SCORES, rtol=1e-5, atol=1e-6)  # what groups compare
    if algorithm == "rloo":
        advantages = group_baseline(outcome, algorithm, scale_by_std)
    else:
        centred_kl = kl_sums - np.repeat(kl_sums.reshape(-1, GROUP).mean(axis=1), GROUP)
        advantages = group_baseline(np.array(SCORES, dtype=np.float64), algorithm, scale_by_std) - eta * centred_kl
    assert_matches(batch.advantages, [np.full(n, a) for n, a in zip(LENGTHS, advantages, strict=True)], "advantages")
    assert_matches(batch.returns, [np.full(n, o) for n, o in zip(LENGTHS, outcome, strict=True)], "returns")


# --- the statistics a learner logs --------------------------------------------------------------------------------

PROMPTS = [prompt for prompt in ("this movie was", "a", "i hated the ending , a", "the cast is good") for _ in "ab"]
LOGGED_ETA = 0.1


def drifted_learner(tokenizer, learner_class, kl_penalty: str, **kwargs) -> PPOLearner:
    """A learner whose policy has moved away from its reference (the same tiny GPT-2): logits scaled up, and EOS
    made likelier everywhere (about one token in five), so that the KL is large and responses end at unequal
    lengths. The log-probs are those of softmax(logits): temperature 1 and no repetition penalty."""
    policy = make_tiny_gpt2(tokenizer, seed=0)
    with torch.no_grad():
        policy.transformer.ln_f.weight.mul_(10.0)
        eos = policy.transformer.wte.weight[tokenizer.eos_token_id]
        policy.transformer.ln_f.bias.add_(4.0 * eos / eos.dot(eos))  # +4 on the EOS logit (the LM head is tied)
    reference = make_tiny_gpt2(tokenizer, seed=0).requires_grad_(False).eval()
    config = PPOConfig.from_flat(
        mini_batch_size=len(PROMPTS),
        ppo_epochs=1,
        learning_rate=1e-3,
        kl_penalty=kl_penalty,
        kl_control="fixed",
        init_kl_coef=LOGGED_ETA,
    )
    generation = GenerationConfig(8, 8, repetition_penalty=1.0)
    return learner_class(
        "llm1", model=policy, tokenizer=tokenizer, reference=reference, config=config, generation=generation, **kwargs
    )


@torch.no_grad()
def recomputed(learner: PPOLearner, rollout: Rollout) -> dict[str, np.ndarray]:
    """Per response, from its tokens alone: its length (up to and including the first EOS), the full-vocabulary
    KL(π ‖ π_0) summed over it and the sampled tokens' log π − log π_0 summed over it, each model run on the
    unpadded prompt + response."""
    eos, prompt_length = learner.tokenizer.eos_token_id, rollout.prompt_length
    found: dict[str, list[float]] = {"length": [], "full": [], "sampled": []}
    for i in range(len(rollout.responses)):
        prompt = rollout.tensors.input_ids[i, :prompt_length][rollout.tensors.attention_mask[i, :prompt_length] == 1]
        response = rollout.tensors.response[i]
        ends = (response == eos).nonzero()
        n = int(ends[0]) + 1 if len(ends) else len(response)
        ids = torch.cat([prompt, response[:n]]).unsqueeze(0)
        predicting = slice(len(prompt) - 1, len(prompt) - 1 + n)  # the positions whose next token is the response's
        logp = torch.log_softmax(learner.model(ids).logits[0, predicting].double(), -1)  # (n, V)
        logq = torch.log_softmax(learner.reference(ids).logits[0, predicting].double(), -1)
        tokens = response[:n].unsqueeze(1)
        found["length"].append(n)
        found["full"].append(float((logp.exp() * (logp - logq)).sum()))
        found["sampled"].append(float((logp.gather(1, tokens) - logq.gather(1, tokens)).sum()))
    return {key: np.array(values) for key, values in found.items()}


@pytest.mark.parametrize("kl_penalty", ["k1", "full"])
@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_logged_kl_rewards_and_length_are_the_rollouts(tokenizer, algorithm, kl_penalty):
    """``kl`` is the full-vocabulary KL summed over each response, then averaged over the batch (whatever the
    penalty uses); ``kl_penalty`` is the penalty's KL summed alike; ``combined_reward`` = task reward − η·``kl``."""
    if algorithm == "ppo":
        learner = drifted_learner(tokenizer, PPOLearner, kl_penalty)
    else:
        learner = drifted_learner(tokenizer, CriticFreeLearner, kl_penalty, algorithm="grpo", group_size=2)
    torch.manual_seed(0)
    learner.act({"prompt": PROMPTS})
    rollout = learner.rollouts[0]
    expected = recomputed(learner, rollout)
    assert len(set(expected["length"])) > 1, "the responses should end at unequal lengths"
    assert expected["full"].mean() > 1.0  # far from 0: the policy has moved

    received = np.linspace(-1.0, 2.5, len(PROMPTS))
    task = np.linspace(0.0, 1.0, len(PROMPTS)) ** 2
    learner.finish(received, task_rewards=task)
    stats = learner.update()

    kl = expected["full"].mean()
    assert stats["kl"] == pytest.approx(kl, rel=1e-4)
    assert stats["kl_penalty"] == pytest.approx(expected["sampled" if kl_penalty == "k1" else "full"].mean(), rel=1e-4)
    assert stats["kl_coef"] == LOGGED_ETA
    assert stats["task_reward"] == pytest.approx(task.mean(), rel=1e-9)
    assert stats["received_reward"] == pytest.approx(received.mean(), rel=1e-9)
    assert stats["combined_reward"] == pytest.approx(task.mean() - LOGGED_ETA * kl, rel=1e-4)
    assert stats["response_length"] == pytest.approx(expected["length"].mean(), rel=1e-9)
