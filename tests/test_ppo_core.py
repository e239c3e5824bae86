"""Token-level PPO math and KL controllers against small hand-computed cases."""

import math

import pytest
import torch

from marllm.algorithms.core import (
    clipped_policy_loss,
    clipped_value_loss,
    explained_variance,
    full_kl,
    gae,
    logprobs_and_full_kl,
    logprobs_of,
    masked_mean,
    masked_var,
    masked_whiten,
    sampled_kl,
    token_rewards,
)
from marllm.algorithms.kl_controller import AdaptiveKLController, FixedKLController


def test_masked_mean_and_var_ignore_padding():
    values = torch.tensor([[1.0, 3.0, 100.0], [5.0, -50.0, -50.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert masked_mean(values, mask).item() == pytest.approx(3.0)
    # values 1, 3, 5: mean 3, unbiased variance (4 + 0 + 4) / 2
    assert masked_var(values, mask).item() == pytest.approx(4.0)
    assert masked_var(values, mask, unbiased=False).item() == pytest.approx(8 / 3)
    assert masked_mean(values, mask, dim=1).tolist() == pytest.approx([2.0, 5.0])


def test_masked_whiten_normalises_real_tokens_and_zeroes_padding():
    values = torch.tensor([[1.0, 3.0, 7.0], [5.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    whitened = masked_whiten(values, mask)
    assert whitened[0, 2].item() == 0.0 and whitened[1, 1].item() == 0.0
    assert masked_mean(whitened, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_var(whitened, mask).item() == pytest.approx(1.0, rel=1e-4)
    assert whitened[0, 0].item() == pytest.approx(-1.0, rel=1e-4)  # (1 - 3) / 2


def test_gae_hand_computed_with_padding():
    rewards = torch.tensor([[1.0, 2.0, 9.0]])
    values = torch.tensor([[0.5, 1.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # t=1 is the last real token: δ1 = 2 − 1 = 1, A1 = 1 (nothing bootstrapped from the padded t=2)
    # t=0: δ0 = 1 + 0.9·1.0 − 0.5 = 1.4, A0 = 1.4 + 0.9·0.8·1.0 = 2.12
    assert advantages.tolist() == [pytest.approx([2.12, 1.0, 0.0])]
    assert returns.tolist() == [pytest.approx([2.62, 2.0, 0.0])]


def test_gae_gamma_one_lambda_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[0.0, 0.0, 3.0]])
    values = torch.tensor([[1.0, 2.0, 0.5]])
    mask = torch.ones(1, 3)
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert advantages.tolist() == [pytest.approx([2.0, 1.0, 2.5])]
    assert returns.tolist() == [pytest.approx([3.0, 3.0, 3.0])]


def test_token_rewards_put_score_on_last_real_token():
    scores = torch.tensor([2.0, -1.0, 5.0])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.0, 0.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    rewards = token_rewards(scores, kl, mask, kl_coef=0.5)
    assert rewards[0].tolist() == pytest.approx([-0.05, -0.1 + 2.0, 0.0])
    assert rewards[1].tolist() == pytest.approx([-0.2, 0.0, -1.0])
    assert rewards[2].tolist() == [0.0, 0.0, 0.0]  # no response token: no reward anywhere


def test_full_kl_matches_closed_form():
    p = torch.tensor([0.5, 0.5]).log().view(1, 1, 2)
    q = torch.tensor([0.25, 0.75]).log().view(1, 1, 2)
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert full_kl(p, q).item() == pytest.approx(expected, rel=1e-5)
    assert full_kl(p, p).item() == pytest.approx(0.0, abs=1e-7)
    # logits are shift-invariant: KL is computed on the normalised distributions
    assert full_kl(p + 3.0, q - 1.0).item() == pytest.approx(expected, rel=1e-5)


def test_logprobs_and_sampled_kl():
    logits = torch.tensor([[[0.0, math.log(3.0)]]])  # probabilities 1/4, 3/4
    tokens = torch.tensor([[1]])
    assert logprobs_of(logits, tokens).item() == pytest.approx(math.log(0.75))
    ref = torch.tensor([[math.log(0.5)]])
    assert sampled_kl(logprobs_of(logits, tokens), ref).item() == pytest.approx(math.log(0.75 / 0.5))


def test_clipped_policy_loss_hand_computed():
    advantages = torch.tensor([[1.0, -1.0, 1.0, 5.0]])
    ratios = torch.tensor([[1.5, 0.5, 1.1, 1.0]])
    old = torch.zeros(1, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, clipfrac, approx_kl = clipped_policy_loss(ratios.log(), old, advantages, mask, clip_range=0.2)
    # token 0: max(−1.5, −1.2) = −1.2 (clipped); token 1: max(0.5, 0.8) = 0.8 (clipped); token 2: −1.1
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 1.1) / 3)
    assert clipfrac.item() == pytest.approx(2 / 3)
    expected_kl = 0.5 * (math.log(1.5) ** 2 + math.log(0.5) ** 2 + math.log(1.1) ** 2) / 3
    assert approx_kl.item() == pytest.approx(expected_kl, rel=1e-5)


def test_clipped_value_loss_hand_computed():
    values = torch.tensor([[2.0, 0.5]])
    old_values = torch.tensor([[1.0, 0.0]])
    returns = torch.tensor([[1.0, 0.5]])
    mask = torch.ones(1, 2)
    loss, clipfrac = clipped_value_loss(values, old_values, returns, mask, clip_range_value=0.2)
    # token 0: unclipped (2−1)² = 1, clipped (1.2−1)² = 0.04 → 1; token 1: unclipped 0, clipped (0.2−0.5)² = 0.09
    assert loss.item() == pytest.approx(0.5 * (1.0 + 0.09) / 2)
    assert clipfrac.item() == pytest.approx(0.5)


def test_explained_variance():
    target = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4)
    assert explained_variance(target, target, mask) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(1, 4), target, mask) == pytest.approx(0.0)
    assert math.isnan(explained_variance(target, torch.ones(1, 4), mask))


def test_adaptive_kl_controller_hand_computed():
    controller = AdaptiveKLController(value=0.3, target=6.0, horizon=10_000)
    controller.update(current_kl=12.0, n_steps=256)  # error clipped to +0.2
    assert controller.value == pytest.approx(0.3 * (1 + 0.2 * 256 / 10_000))
    controller = AdaptiveKLController(value=0.3, target=6.0, horizon=10_000)
    controller.update(current_kl=6.6, n_steps=100)  # error 0.1, inside the clip
    assert controller.value == pytest.approx(0.3 * (1 + 0.1 * 100 / 10_000))
    controller.value = 0.3
    controller.update(current_kl=0.0, n_steps=1000)  # error clipped to −0.2
    assert controller.value == pytest.approx(0.3 * (1 - 0.2 * 0.1))


def test_fixed_kl_controller_and_bad_adaptive_settings():
    fixed = FixedKLController(0.2)
    fixed.update(100.0, 256)
    assert fixed.value == 0.2
    with pytest.raises(ValueError, match="target"):
        AdaptiveKLController(0.1, target=0.0, horizon=10)
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, target=1.0, horizon=0)


def test_logprobs_and_full_kl_agree_with_the_separate_functions():
    torch.manual_seed(0)
    policy, reference = torch.randn(2, 3, 7), torch.randn(2, 3, 7)
    tokens = torch.randint(0, 7, (2, 3))
    logprobs, ref_logprobs, kl = logprobs_and_full_kl(policy, reference, tokens)
    assert torch.allclose(logprobs, logprobs_of(policy, tokens))
    assert torch.allclose(ref_logprobs, logprobs_of(reference, tokens))
    assert torch.allclose(kl, full_kl(policy, reference))
