"""Checks a part of one's own, or any of marllm's, can be run against: a learner (:mod:`.conformance`, and
:mod:`.data_parallel` for two gloo ranks against one process, and the ranks themselves: :func:`run_ranks`), a game env
(:mod:`marllm.games.check`), an action mode's collector (:mod:`.collectors`) and a player that does not learn
(:mod:`.players`)."""

from marllm.games.check import check_game_env
from marllm.testing.collectors import check_collector
from marllm.testing.conformance import (
    check_first_update_is_on_policy,
    check_learner,
    check_move_probabilities_are_played,
    check_resume_equals_uninterrupted,
)
from marllm.testing.data_parallel import check_two_ranks_equal_one_process, run_ranks
from marllm.testing.outcomes import CheckNotApplicable
from marllm.testing.players import check_player

__all__ = [
    "CheckNotApplicable",
    "check_collector",
    "check_first_update_is_on_policy",
    "check_game_env",
    "check_learner",
    "check_move_probabilities_are_played",
    "check_player",
    "check_resume_equals_uninterrupted",
    "check_two_ranks_equal_one_process",
    "run_ranks",
]
