"""The average of tabulated policies: OpenSpiel's own aggregation of the same policies where it runs (Kuhn, Leduc
poker), the payoff of the uniform mixture of the iterates against any opponent in a repeated game, and what a
checkpoint saves of it."""

from __future__ import annotations

import numpy as np
import pytest

from marllm.games.average_policy import AveragePolicy
from marllm.games.exploitability import ExactGame
from tests.test_games_cli import needs_openspiel

pytestmark = needs_openspiel

REPEATED_PD = "repeated_game(stage_game=matrix_pd(),num_repetitions=3)"


def random_policies(exact: ExactGame, count: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    policies = []
    for _ in range(count):
        policy = exact.tree.uniform_policy()
        table = policy.action_probability_array
        table[:] = rng.random(table.shape) * policy.legal_actions_mask
        table /= table.sum(axis=1, keepdims=True)
        policies.append(policy)
    return policies


@pytest.mark.parametrize("game", ["kuhn_poker", "leduc_poker"])
def test_the_average_is_openspiels_aggregate_of_the_same_policies(game):
    from open_spiel.python.algorithms.policy_aggregator import PolicyAggregator

    exact = ExactGame(game)
    policies = random_policies(exact, 3, seed=1)
    average = AveragePolicy(exact.tree)
    for policy in policies:
        average.add(policy)
    players = exact.solved.num_players()
    weights = [[1 / 3] * 3] * players
    expected = PolicyAggregator(exact.solved).aggregate(list(range(players)), [policies] * players, weights)
    got = average.policy()
    for info in exact.tree.info_states:
        want = expected.action_probabilities(info.solved, info.player)
        have = got.action_probabilities(info.solved, info.player)
        assert have.keys() == want.keys()
        assert np.allclose([have[a] for a in want], list(want.values()), atol=1e-9), info.key


def test_the_average_plays_as_the_uniform_mixture_of_the_iterates_against_any_opponent():
    from open_spiel.python.algorithms.expected_game_score import policy_value

    exact = ExactGame(REPEATED_PD)  # OpenSpiel's aggregator does not take this game's keys; the payoffs say it
    policies = random_policies(exact, 4, seed=2)
    average = AveragePolicy(exact.tree)
    for policy in policies:
        average.add(policy)
    root = exact.solved.new_initial_state()
    for opponent in random_policies(exact, 2, seed=3):
        mixture = np.mean([policy_value(root, [policy, opponent]) for policy in policies], axis=0)
        assert np.allclose(policy_value(root, [average.policy(), opponent]), mixture, atol=1e-9)
    # A plain mean of the tables is another strategy: the reach weights matter.
    plain = exact.tree.uniform_policy()
    plain.action_probability_array[:] = np.mean([p.action_probability_array for p in policies], axis=0)
    opponent = policies[0]
    mixture = np.mean([policy_value(root, [policy, opponent]) for policy in policies], axis=0)
    assert not np.allclose(policy_value(root, [plain, opponent]), mixture, atol=1e-6)


def test_the_average_of_one_policy_is_that_policy_and_of_none_an_error():
    exact = ExactGame("kuhn_poker")
    average = AveragePolicy(exact.tree)
    with pytest.raises(ValueError, match="no policy"):
        average.policy()
    (policy,) = random_policies(exact, 1, seed=4)
    average.add(policy)
    assert np.allclose(average.policy().action_probability_array, policy.action_probability_array)
    with pytest.raises(ValueError, match="shape"):
        average.add(ExactGame("leduc_poker").tree.uniform_policy())


def test_the_saved_average_goes_on_as_the_one_never_saved():
    exact = ExactGame("kuhn_poker")
    first, second, third = random_policies(exact, 3, seed=5)
    kept, restored = AveragePolicy(exact.tree), AveragePolicy(exact.tree)
    kept.add(first)
    kept.add(second)
    tensors, meta = kept.state_dict()
    restored.load_state_dict(tensors, meta)
    kept.add(third)
    restored.add(third)
    assert restored.count == 3
    assert np.array_equal(restored.policy().action_probability_array, kept.policy().action_probability_array)
    leduc = AveragePolicy(ExactGame("leduc_poker").tree)
    with pytest.raises(ValueError, match="shape"):
        leduc.load_state_dict(tensors, meta)


def test_a_linear_average_weighs_the_kth_policy_k():
    """Linear weights 1, 2, 3 are the uniform average of the first policy once, the second twice, the third thrice."""
    exact = ExactGame("kuhn_poker")
    policies = random_policies(exact, 3, seed=6)
    linear, repeated = AveragePolicy(exact.tree, "linear"), AveragePolicy(exact.tree)
    for k, policy in enumerate(policies, start=1):
        linear.add(policy)
        for _ in range(k):
            repeated.add(policy)
    assert np.allclose(linear.policy().action_probability_array, repeated.policy().action_probability_array)
    tensors, meta = linear.state_dict()
    restored = AveragePolicy(exact.tree, "linear")
    restored.load_state_dict(tensors, meta)
    restored.add(policies[0])
    linear.add(policies[0])  # the fourth: weight 4 in both
    assert np.allclose(restored.policy().action_probability_array, linear.policy().action_probability_array)
    with pytest.raises(ValueError, match=r"weighting must be one of \['uniform', 'linear'\], got 'mean'"):
        AveragePolicy(exact.tree, "mean")
