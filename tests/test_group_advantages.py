"""Critic-free advantages (GRPO, Dr. GRPO, RLOO, REINFORCE++), KL penalties and loss aggregation, by hand."""

import math

import pytest
import torch

from marllm.algorithms.core import clipped_policy_loss, masked_mean
from marllm.algorithms.critic_free import (
    aggregate,
    aggregation_weights,
    clipped_policy_gradient_loss,
    discounted_returns,
    grpo_advantages,
    grpo_kl_penalised_advantages,
    kl_penalty,
    per_token,
    reinforce_plus_plus_advantages,
    rloo_advantages,
)

F64 = torch.float64
LOG2 = math.log(2.0)


def t64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


# Two queries, G = 4 responses each, laid out consecutively.
REWARDS = t64([1.0, 0.0, 0.0, 0.0, 3.0, 3.0, 5.0, 5.0])


# --- GRPO / Dr. GRPO ---------------------------------------------------------------------------------------------


def test_grpo_advantages_hand_computed():
    advantages = grpo_advantages(REWARDS, group_size=4, eps=0.0)
    # group 1: mean 0.25, deviations (0.75, −0.25, −0.25, −0.25), Σ dev² = 0.5625 + 3·0.0625 = 0.75,
    #   ddof=1 std = sqrt(0.75 / 3) = 0.5 → (1.5, −0.5, −0.5, −0.5)
    # group 2: mean 4, deviations (−1, −1, 1, 1), Σ dev² = 4, std = sqrt(4 / 3) = 2/√3 → ±√3/2
    half_root3 = math.sqrt(3.0) / 2
    expected = [1.5, -0.5, -0.5, -0.5, -half_root3, -half_root3, half_root3, half_root3]
    assert advantages.tolist() == pytest.approx(expected, rel=1e-12)
    assert advantages.dtype == F64


def test_grpo_default_eps_shrinks_by_std_over_std_plus_eps():
    advantages = grpo_advantages(REWARDS, group_size=4)  # eps = 1e-6
    # group 1: 0.75 / (0.5 + 1e-6) instead of 0.75 / 0.5
    assert advantages[0].item() == pytest.approx(0.75 / 0.500001, rel=1e-12)
    assert advantages[0].item() == pytest.approx(1.5, rel=1e-5)


def test_dr_grpo_only_centres():
    advantages = grpo_advantages(REWARDS, group_size=4, scale_by_std=False)
    # r − group mean: (1 − 0.25, 0 − 0.25, ...), (3 − 4, 3 − 4, 5 − 4, 5 − 4)
    assert advantages.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, -1.0, -1.0, 1.0, 1.0], rel=1e-12)


def test_grpo_group_of_two_shows_the_ddof():
    # rewards {1, 0}: deviations ±0.5, ddof=1 std = sqrt(0.5 / 1) = 1/√2 → ±1/√2 (ddof=0 would give ±1)
    advantages = grpo_advantages(t64([1.0, 0.0]), group_size=2, eps=0.0)
    assert advantages.tolist() == pytest.approx([1 / math.sqrt(2), -1 / math.sqrt(2)], rel=1e-12)


@pytest.mark.parametrize("scale_by_std", [True, False])
def test_grpo_single_response_groups_are_zero(scale_by_std):
    advantages = grpo_advantages(t64([3.0, -1.0, 7.0]), group_size=1, scale_by_std=scale_by_std, eps=0.0)
    assert advantages.tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("scale_by_std", [True, False])
def test_grpo_equal_rewards_give_exactly_zero(scale_by_std):
    rewards = t64([0.1, 0.1, 0.1, 1.0, 0.0, 0.0])
    # The float64 mean of (0.1, 0.1, 0.1) is 0.10000000000000002: plain centring leaves −1.4e-17, which eps = 0
    # would blow up to −0.82. The constant group must still give exactly 0.
    assert (rewards[:3] - rewards[:3].mean()).abs().max().item() > 0
    advantages = grpo_advantages(rewards, group_size=3, scale_by_std=scale_by_std, eps=0.0)
    assert advantages[:3].tolist() == [0.0, 0.0, 0.0]
    assert torch.isfinite(advantages).all()
    assert advantages[3].item() > 0  # the other group is untouched


def test_grpo_all_equal_batch_float32_default_eps():
    advantages = grpo_advantages(torch.full((8,), 0.3), group_size=4)
    assert advantages.tolist() == [0.0] * 8


def test_grpo_invariances():
    torch.manual_seed(0)
    rewards = torch.randn(12, dtype=F64)
    shift = t64([5.0, -2.0, 100.0]).repeat_interleave(4)  # a different constant per group
    scale = t64([0.1, 3.0, 40.0]).repeat_interleave(4)
    base = grpo_advantages(rewards, 4, eps=0.0)
    assert torch.allclose(grpo_advantages(rewards + shift, 4, eps=0.0), base, rtol=0, atol=1e-12)
    assert torch.allclose(grpo_advantages(rewards * scale, 4, eps=0.0), base, rtol=0, atol=1e-12)
    # with eps the scale invariance holds up to the relative size of eps against the std
    assert torch.allclose(grpo_advantages(rewards * scale, 4), base, rtol=0, atol=1e-4)
    # Dr. GRPO: shift-invariant, but scaling the rewards scales the advantages
    centred = grpo_advantages(rewards, 4, scale_by_std=False)
    assert torch.allclose(grpo_advantages(rewards + shift, 4, scale_by_std=False), centred, rtol=0, atol=1e-12)
    assert torch.allclose(grpo_advantages(rewards * scale, 4, scale_by_std=False), centred * scale, atol=1e-12)
    # each group's advantages have zero mean and, with std scaling and eps = 0, ddof=1 std 1
    grouped = base.view(3, 4)
    assert torch.allclose(grouped.mean(1), torch.zeros(3, dtype=F64), atol=1e-12)
    assert torch.allclose(grouped.std(1), torch.ones(3, dtype=F64), atol=1e-12)


def test_group_layout_errors():
    with pytest.raises(ValueError, match="groups of group_size=2"):
        grpo_advantages(torch.zeros(5), group_size=2)
    with pytest.raises(ValueError, match="groups of group_size=4"):
        rloo_advantages(torch.zeros(6), group_size=4)
    with pytest.raises(ValueError, match="shape \\(B,\\)"):
        grpo_advantages(torch.zeros(2, 4), group_size=4)
    with pytest.raises(ValueError, match="at least 1"):
        grpo_advantages(torch.zeros(4), group_size=0)


def test_integer_rewards_become_float():
    advantages = grpo_advantages(torch.tensor([1, 0, 1, 0]), group_size=2, scale_by_std=False)
    assert advantages.is_floating_point()
    assert advantages.tolist() == [0.5, -0.5, 0.5, -0.5]


def test_per_token_broadcasts_and_zeroes_padding():
    advantages = t64([1.5, -0.5, 2.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # an all-padded third response
    assert per_token(advantages, mask).tolist() == [[1.5, 1.5, 0.0], [-0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]


# --- RLOO --------------------------------------------------------------------------------------------------------


def test_rloo_hand_computed():
    advantages = rloo_advantages(REWARDS, group_size=4)
    # group 1: 1 − (0+0+0)/3 = 1; 0 − (1+0+0)/3 = −1/3 (×3)
    # group 2: 3 − (3+5+5)/3 = −4/3 (×2); 5 − (3+3+5)/3 = 4/3 (×2)
    expected = [1.0, -1 / 3, -1 / 3, -1 / 3, -4 / 3, -4 / 3, 4 / 3, 4 / 3]
    assert advantages.tolist() == pytest.approx(expected, rel=1e-12)
    # = G/(G−1)·(r − mean): 4/3 · 0.75 = 1
    assert torch.allclose(advantages, 4 / 3 * grpo_advantages(REWARDS, 4, scale_by_std=False), atol=1e-12)


def test_rloo_group_of_two_is_the_difference():
    assert rloo_advantages(t64([2.5, 1.0]), group_size=2).tolist() == [1.5, -1.5]


def test_rloo_groups_sum_to_zero_and_equal_rewards_give_zero():
    torch.manual_seed(1)
    rewards = torch.randn(15, dtype=F64) * 10
    sums = rloo_advantages(rewards, group_size=5).view(3, 5).sum(1)
    assert torch.allclose(sums, torch.zeros(3, dtype=F64), rtol=0, atol=1e-12)
    assert rloo_advantages(t64([0.1, 0.1, 0.1]), group_size=3).tolist() == [0.0, 0.0, 0.0]


def test_rloo_refuses_groups_of_one():
    with pytest.raises(ValueError, match="at least 2 responses per query"):
        rloo_advantages(torch.zeros(4), group_size=1)


# --- KL penalties ------------------------------------------------------------------------------------------------


def test_kl_penalty_hand_computed():
    logprobs = t64([[math.log(0.5), math.log(0.25), 0.0]])
    ref = t64([[math.log(0.25), math.log(0.5), 0.0]])
    mask = t64([[1.0, 1.0, 0.0]])
    # k1 = log π − log π_ref: log 2, −log 2
    assert kl_penalty(logprobs, ref, mask, "k1").tolist() == [pytest.approx([LOG2, -LOG2, 0.0], rel=1e-12)]
    # k3 with x = log π_ref/π: x = −log 2 → 0.5 + log 2 − 1; x = log 2 → 2 − log 2 − 1
    k3 = kl_penalty(logprobs, ref, mask, "k3")
    assert k3.tolist() == [pytest.approx([LOG2 - 0.5, 1.0 - LOG2, 0.0], rel=1e-12)]


def test_kl_estimators_are_unbiased_in_exact_expectation():
    # Σ_a π(a)·k(a) over the whole vocabulary is E_{a∼π}[k] exactly; both must equal KL(π ‖ π_ref).
    pi, ref = t64([0.5, 0.3, 0.2]), t64([0.2, 0.2, 0.6])
    exact_kl = (pi * (pi / ref).log()).sum().item()
    mask = torch.ones(1, 3, dtype=F64)
    for estimator in ("k1", "k3"):
        per_token_kl = kl_penalty(pi.log().view(1, 3), ref.log().view(1, 3), mask, estimator)
        assert (pi * per_token_kl[0]).sum().item() == pytest.approx(exact_kl, rel=1e-12)


def test_k3_is_nonnegative_and_zero_at_the_reference():
    torch.manual_seed(2)
    logprobs, ref = -torch.rand(4, 50) * 10, -torch.rand(4, 50) * 10
    mask = torch.ones(4, 50)
    assert (kl_penalty(logprobs, ref, mask, "k3") >= 0).all()
    assert (kl_penalty(logprobs, logprobs, mask, "k3") == 0).all()
    assert (kl_penalty(logprobs, logprobs, mask, "k1") == 0).all()
    # tiny differences: no negative rounding residue from exp(x) − 1 − x
    assert (kl_penalty(logprobs, logprobs + 1e-7, mask, "k3") >= 0).all()


def test_k3_gradient_is_one_minus_ref_over_pi():
    logprobs = t64([[math.log(0.5), math.log(0.25)]]).requires_grad_()
    ref = t64([[math.log(0.25), math.log(0.5)]])
    kl_penalty(logprobs, ref, torch.ones(1, 2), "k3").sum().backward()
    # 1 − π_ref/π: 1 − 0.5 = 0.5, 1 − 2 = −1
    assert logprobs.grad.tolist() == [pytest.approx([0.5, -1.0], rel=1e-12)]


def test_kl_penalty_ignores_garbage_on_padding():
    logprobs = torch.tensor([[-1.0, float("-inf"), float("nan")]], requires_grad=True)
    ref = torch.tensor([[-2.0, -3.0, float("inf")]])
    mask = torch.tensor([[1.0, 0.0, 0.0]])
    for estimator in ("k1", "k2", "k3"):
        kl = kl_penalty(logprobs, ref, mask, estimator)
        assert kl[0, 1:].tolist() == [0.0, 0.0]
        kl.sum().backward()
        assert torch.isfinite(logprobs.grad).all() and logprobs.grad[0, 1:].tolist() == [0.0, 0.0]
        logprobs.grad = None
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(logprobs, ref, mask, "k4")  # type: ignore[arg-type]


# --- REINFORCE++ -------------------------------------------------------------------------------------------------


def test_discounted_returns_hand_computed():
    rewards = t64([[1.0, 2.0, 3.0, 9.0]])
    mask = t64([[1.0, 1.0, 1.0, 0.0]])  # the 9 is on padding and must not count
    # γ = 1: (1+2+3, 2+3, 3, 0)
    assert discounted_returns(rewards, mask).tolist() == [[6.0, 5.0, 3.0, 0.0]]
    # γ = 0.5: G2 = 3, G1 = 2 + 0.5·3 = 3.5, G0 = 1 + 0.5·3.5 = 2.75
    assert discounted_returns(rewards, mask, gamma=0.5).tolist() == [[2.75, 3.5, 3.0, 0.0]]


def test_returns_are_the_reverse_cumulative_sum_of_each_response():
    torch.manual_seed(3)
    rewards = torch.randn(4, 7, dtype=F64)
    lengths = [7, 3, 1, 0]
    mask = torch.zeros(4, 7, dtype=F64)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    returns = discounted_returns(rewards, mask)
    for row, length in enumerate(lengths):
        tokens = rewards[row, :length]
        expected = tokens.flip(0).cumsum(0).flip(0)
        assert torch.allclose(returns[row, :length], expected, rtol=0, atol=1e-12)
        assert (returns[row, length:] == 0).all()


def test_reinforce_plus_plus_hand_computed():
    scores = t64([1.0, 0.0, 5.0])
    kl = t64([[0.2, 0.4, 0.0], [0.1, 0.3, 0.5], [0.0, 0.0, 0.0]])
    mask = t64([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])  # the third response is empty
    advantages, returns = reinforce_plus_plus_advantages(scores, kl, mask, kl_coef=0.5)
    # token rewards: row 0 (−0.1, −0.2 + 1, ·) → returns (0.7, 0.8, 0)
    #                row 1 (−0.05, −0.15, −0.25 + 0) → returns (−0.45, −0.4, −0.25); row 2: nothing
    assert returns.tolist() == [
        pytest.approx([0.7, 0.8, 0.0], rel=1e-12),
        pytest.approx([-0.45, -0.4, -0.25], rel=1e-12),
        [0.0, 0.0, 0.0],
    ]
    # whitening over the 5 real tokens: mean = (0.7 + 0.8 − 0.45 − 0.4 − 0.25) / 5 = 0.08,
    # deviations (0.62, 0.72, −0.53, −0.48, −0.33), Σ dev² = 0.3844 + 0.5184 + 0.2809 + 0.2304 + 0.1089 = 1.523,
    # unbiased var = 1.523 / 4 = 0.38075, advantage = dev / sqrt(0.38075 + 1e-8)
    std = math.sqrt(0.38075 + 1e-8)
    assert advantages.tolist() == [
        pytest.approx([0.62 / std, 0.72 / std, 0.0], rel=1e-9),
        pytest.approx([-0.53 / std, -0.48 / std, -0.33 / std], rel=1e-9),
        [0.0, 0.0, 0.0],
    ]


def test_reinforce_plus_plus_with_k1_from_log_probs():
    logprobs = t64([[math.log(0.5), math.log(0.25)]])
    ref = t64([[math.log(0.25), math.log(0.5)]])
    mask = torch.ones(1, 2, dtype=F64)
    kl = kl_penalty(logprobs, ref, mask, "k1")  # (log 2, −log 2)
    _, returns = reinforce_plus_plus_advantages(t64([1.0]), kl, mask, kl_coef=0.1)
    # rewards (−0.1·log 2, 0.1·log 2 + 1): returns (1, 1 + 0.1·log 2)
    assert returns.tolist() == [pytest.approx([1.0, 1.0 + 0.1 * LOG2], rel=1e-12)]


# --- loss aggregation and the clipped loss -----------------------------------------------------------------------

# Two responses of unequal length plus an all-padded one.
MASK = t64([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


def test_token_mean_and_seq_mean_token_mean_hand_computed():
    values = t64([[1.0, 2.0, 3.0, 4.0], [10.0, 99.0, 99.0, 99.0], [7.0, 7.0, 7.0, 7.0]])
    # token-mean: (1+2+3+4+10) / 5 = 4; seq-mean-token-mean: (10/4 + 10/1) / 2 = 6.25 (the empty row not counted)
    assert aggregate(values, MASK, "token-mean").item() == pytest.approx(4.0, rel=1e-12)
    assert aggregate(values, MASK, "seq-mean-token-mean").item() == pytest.approx(6.25, rel=1e-12)
    assert aggregation_weights(MASK, "seq-mean-token-mean").tolist() == [[0.25] * 4, [1.0, 0, 0, 0], [0.0] * 4]
    # equal lengths: the two agree
    full = torch.ones(3, 4, dtype=F64)
    assert aggregate(values, full, "token-mean").item() == pytest.approx(
        aggregate(values, full, "seq-mean-token-mean").item(), rel=1e-12
    )
    # nothing valid: 0, not NaN
    for mode in ("token-mean", "seq-mean-token-mean"):
        assert aggregate(values, torch.zeros(3, 4, dtype=F64), mode).item() == 0.0
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregation_weights(MASK, "seq-sum")  # type: ignore[arg-type]


def _loss_inputs():
    # Row 0 (3 tokens): A = (1, −1, 1), ρ = (1.5, 0.5, 1.1); row 1 (1 token): A = 2, ρ = 0.9.
    # Padding holds garbage that must not matter.
    nan, inf = float("nan"), float("inf")
    ratios = t64([[1.5, 0.5, 1.1, 1.0], [0.9, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    logprobs = ratios.log()
    logprobs[0, 3], logprobs[1, 1], logprobs[2, 0] = nan, -inf, inf
    old = torch.zeros(3, 4, dtype=F64)
    old[1, 2] = nan
    advantages = t64([[1.0, -1.0, 1.0, nan], [2.0, 5.0, inf, 0.0], [3.0, 3.0, 3.0, 3.0]])
    mask = t64([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    return logprobs, old, advantages, mask


def test_clipped_loss_token_mean_vs_seq_mean_hand_computed():
    logprobs, old, advantages, mask = _loss_inputs()
    # per token, ε = 0.2: max(−1.5, −1.2) = −1.2 (clipped), max(0.5, 0.8) = 0.8 (clipped), max(−1.1, −1.1) = −1.1;
    # row 1: max(−1.8, −1.8) = −1.8 (0.9 is inside [0.8, 1.2])
    token = clipped_policy_gradient_loss(logprobs, old, advantages, mask, 0.2, "token-mean")
    seq = clipped_policy_gradient_loss(logprobs, old, advantages, mask, 0.2, "seq-mean-token-mean")
    # token-mean: (−1.2 + 0.8 − 1.1 − 1.8) / 4 = −0.825; seq-mean-token-mean: ((−1.5 / 3) + (−1.8)) / 2 = −1.15
    assert token.pg_loss.item() == pytest.approx(-0.825, rel=1e-12)
    assert seq.pg_loss.item() == pytest.approx(-1.15, rel=1e-12)
    assert token.loss.item() == token.pg_loss.item() and token.kl_loss.item() == 0.0
    # clip fraction: 2 of 4 tokens; per response (2/3 + 0/1) / 2
    assert token.clipfrac.item() == pytest.approx(0.5, rel=1e-12)
    assert seq.clipfrac.item() == pytest.approx(1 / 3, rel=1e-12)
    # approx_kl = ½·mean (log ρ)²
    squares = [math.log(1.5) ** 2, math.log(0.5) ** 2, math.log(1.1) ** 2]
    assert token.approx_kl.item() == pytest.approx(0.5 * (sum(squares) + math.log(0.9) ** 2) / 4, rel=1e-12)
    assert seq.approx_kl.item() == pytest.approx(0.5 * (sum(squares) / 3 + math.log(0.9) ** 2) / 2, rel=1e-12)


def test_token_mean_matches_core_clipped_policy_loss():
    torch.manual_seed(4)
    logprobs, old, advantages = -torch.rand(3, 5), -torch.rand(3, 5), torch.randn(3, 5)
    mask = torch.tensor([[1.0] * 5, [1.0, 1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]])
    ours = clipped_policy_gradient_loss(logprobs, old, advantages, mask, 0.2)
    pg_loss, clipfrac, approx_kl = clipped_policy_loss(logprobs, old, advantages, mask, 0.2)
    assert torch.allclose(ours.pg_loss, pg_loss) and torch.allclose(ours.clipfrac, clipfrac)
    assert torch.allclose(ours.approx_kl, approx_kl)


def test_aggregation_sets_the_gradient_weight_of_each_token():
    logprobs, _, _, mask = _loss_inputs()
    advantages = t64([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    old = torch.where(mask.bool(), logprobs, 0.0).detach()  # ρ = 1 on real tokens: nothing clipped
    expected = {
        # d/d log π of −A·ρ at ρ = 1 is −A, times the token's weight: 1/4 each; 1/(3·2) in row 0, 1/(1·2) in row 1
        "token-mean": [[-1 / 4, -2 / 4, -3 / 4, 0.0], [-4 / 4, 0.0, 0.0, 0.0], [0.0] * 4],
        "seq-mean-token-mean": [[-1 / 6, -2 / 6, -3 / 6, 0.0], [-4 / 2, 0.0, 0.0, 0.0], [0.0] * 4],
    }
    for mode, grad in expected.items():
        current = logprobs.clone().requires_grad_()
        clipped_policy_gradient_loss(current, old, advantages, mask, 0.2, mode).loss.backward()
        assert current.grad.tolist() == [pytest.approx(row, rel=1e-12) for row in grad]


def test_kl_loss_term_aggregated_like_the_policy_loss():
    logprobs = t64([[math.log(0.5), math.log(0.25)], [math.log(0.5), 0.0]])
    ref = t64([[math.log(0.25), math.log(0.5)], [math.log(0.25), 0.0]])
    mask = t64([[1.0, 1.0], [1.0, 0.0]])
    zeros = torch.zeros(2, 2, dtype=F64)
    # k3 per token: log 2 − 0.5 and 1 − log 2 (row 0, sum exactly 0.5), log 2 − 0.5 (row 1)
    k = LOG2 - 0.5
    token = clipped_policy_gradient_loss(logprobs, logprobs, zeros, mask, 0.2, "token-mean", ref, kl_coef=0.1)
    seq = clipped_policy_gradient_loss(logprobs, logprobs, zeros, mask, 0.2, "seq-mean-token-mean", ref, kl_coef=0.1)
    assert token.kl_loss.item() == pytest.approx((0.5 + k) / 3, rel=1e-12)
    assert seq.kl_loss.item() == pytest.approx((0.5 / 2 + k) / 2, rel=1e-12)
    assert token.pg_loss.item() == 0.0  # A = 0
    assert token.loss.item() == pytest.approx(0.1 * (0.5 + k) / 3, rel=1e-12)
    k1 = clipped_policy_gradient_loss(logprobs, logprobs, zeros, mask, 0.2, ref_logprobs=ref, kl_estimator="k1")
    assert k1.kl_loss.item() == pytest.approx(LOG2 / 3, rel=1e-12)  # (log 2 − log 2 + log 2) / 3
    assert k1.loss.item() == 0.0  # kl_coef = 0: reported, not added
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        clipped_policy_gradient_loss(logprobs, logprobs, zeros, mask, 0.2, kl_coef=0.1)


def test_padding_garbage_reaches_neither_loss_nor_gradient():
    logprobs, old, advantages, mask = _loss_inputs()
    logprobs.requires_grad_()
    ref = torch.where(mask.bool(), logprobs.detach() - 0.1, float("nan"))
    for mode in ("token-mean", "seq-mean-token-mean"):
        terms = clipped_policy_gradient_loss(logprobs, old, advantages, mask, 0.2, mode, ref, kl_coef=0.05)
        assert all(torch.isfinite(term) for term in terms)
        terms.loss.backward()
        assert torch.isfinite(logprobs.grad).all()
        assert (logprobs.grad[~mask.bool()] == 0).all()
        logprobs.grad = None


def test_grpo_pipeline_end_to_end():
    # 2 queries × 2 responses; outcome rewards → per-token advantages → loss at ρ = 1 is −aggregate(A)
    rewards = t64([1.0, 0.0, 0.0, 0.0])
    mask = t64([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    advantages = per_token(grpo_advantages(rewards, group_size=2, eps=0.0), mask)
    # group 1: ±1/√2 over 3 and 1 tokens; group 2: all 0
    a = 1 / math.sqrt(2)
    assert advantages.tolist()[:2] == [pytest.approx([a, a, a], rel=1e-12), pytest.approx([-a, 0.0, 0.0], rel=1e-12)]
    logprobs = torch.zeros(4, 3, dtype=F64)
    token = clipped_policy_gradient_loss(logprobs, logprobs, advantages, mask, 0.2, "token-mean")
    seq = clipped_policy_gradient_loss(logprobs, logprobs, advantages, mask, 0.2, "seq-mean-token-mean")
    # token-mean: −(3a − a) / 9 tokens; seq-mean: −(a − a + 0 + 0) / 4 = 0 (GRPO's sequences weigh the same)
    assert token.loss.item() == pytest.approx(-2 * a / 9, rel=1e-12)
    assert seq.loss.item() == pytest.approx(0.0, abs=1e-15)
    assert masked_mean(advantages, mask).item() == pytest.approx(2 * a / 9, rel=1e-12)


def test_grpo_kl_penalty_is_not_rescaled_by_the_scores_std():
    # A group whose scores are all equal: the advantage is the (centred) KL penalty alone, of size η, not ±1.22
    # whatever η is (what normalising score − η·ΣKL together gives).
    # float64, so that the expected values are exact to far below the tolerance on any CPU
    scores = t64([1.0, 1.0, 1.0, 1.0])
    kl_sums = t64([2.0, 2.1, 1.9, 2.0])
    for eta in (0.3, 0.03, 0.003):
        advantages = grpo_kl_penalised_advantages(scores, kl_sums, eta, group_size=4)
        torch.testing.assert_close(advantages, -eta * t64([0.0, 0.1, -0.1, 0.0]), rtol=1e-5, atol=1e-7)
    # A mixed group: the scores are normalised by their own std; the KL term is added unscaled.
    scores = t64([1.0, 0.0, 1.0, 0.0])
    std = t64([1.0, 0.0, 1.0, 0.0]).std()
    expected = (scores - 0.5) / (std + 1e-6) - 0.3 * (kl_sums - kl_sums.mean())
    torch.testing.assert_close(grpo_kl_penalised_advantages(scores, kl_sums, 0.3, group_size=4), expected)
    # Without the KL (η = 0, or the KL in the loss) it is GRPO's advantage exactly.
    assert torch.equal(grpo_kl_penalised_advantages(scores, kl_sums, 0.0, 4), grpo_advantages(scores, 4))


def test_k2_is_half_the_squared_log_ratio_and_its_gradient_is_that_of_the_forward_kl():
    logprobs = t64([[math.log(0.5), math.log(0.25), 0.0]])
    ref = t64([[math.log(0.25), math.log(0.5), 0.0]])
    mask = t64([[1.0, 1.0, 0.0]])
    assert kl_penalty(logprobs, ref, mask, "k2").tolist() == [pytest.approx([LOG2**2 / 2, LOG2**2 / 2, 0.0])]
    # On-policy (each token weighted by π(a), π held fixed), the gradient of k2 is the gradient of KL(π ‖ π_ref);
    # k3's is the gradient of the reverse KL(π_ref ‖ π).
    theta = t64([0.3, -0.2, 0.9]).requires_grad_()
    ref_probs = t64([0.2, 0.2, 0.6])
    ones = torch.ones(1, 3, dtype=F64)

    def on_policy_gradient(estimator: str) -> torch.Tensor:
        log_pi = torch.log_softmax(theta, 0)
        per_token = kl_penalty(log_pi.view(1, 3), ref_probs.log().view(1, 3), ones, estimator)[0]
        return torch.autograd.grad((log_pi.exp().detach() * per_token).sum(), theta)[0]

    def exact_gradient(reverse: bool) -> torch.Tensor:
        pi = torch.softmax(theta, 0)
        kl = (ref_probs * (ref_probs / pi).log()).sum() if reverse else (pi * (pi / ref_probs).log()).sum()
        return torch.autograd.grad(kl, theta)[0]

    torch.testing.assert_close(on_policy_gradient("k2"), exact_gradient(reverse=False))
    torch.testing.assert_close(on_policy_gradient("k3"), exact_gradient(reverse=True))


def test_k3_is_clamped_so_that_a_floored_log_prob_gives_a_bounded_gradient():
    # A token the policy gives log-prob −87 (floored) while the reference gives it −1: exp(86) unclamped.
    logprobs = torch.tensor([[-87.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -1.0]])
    kl = kl_penalty(logprobs, ref, torch.ones(1, 2), "k3")
    assert kl[0, 0].item() == 10.0 and kl[0, 1].item() == 0.0
    kl.sum().backward()
    assert torch.isfinite(logprobs.grad).all() and logprobs.grad.abs().max() <= math.exp(20.0)
