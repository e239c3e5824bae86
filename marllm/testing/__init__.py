"""Checks a learner of one's own, or any combination of marllm's, can be run against (:mod:`.conformance`, and
:mod:`.data_parallel` for two gloo ranks against one process, and the ranks themselves: :func:`run_ranks`)."""

from marllm.testing.conformance import (
    check_first_update_is_on_policy,
    check_learner,
    check_move_probabilities_are_played,
    check_resume_equals_uninterrupted,
)
from marllm.testing.data_parallel import check_two_ranks_equal_one_process, run_ranks
from marllm.testing.outcomes import CheckNotApplicable

__all__ = [
    "CheckNotApplicable",
    "check_first_update_is_on_policy",
    "check_learner",
    "check_move_probabilities_are_played",
    "check_resume_equals_uninterrupted",
    "check_two_ranks_equal_one_process",
    "run_ranks",
]
