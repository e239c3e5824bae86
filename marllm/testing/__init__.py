"""Checks a learner of one's own, or any combination of marllm's, can be run against (:mod:`.conformance`)."""

from marllm.testing.conformance import (
    check_first_update_is_on_policy,
    check_learner,
    check_move_probabilities_are_played,
    check_resume_equals_uninterrupted,
)

__all__ = [
    "check_first_update_is_on_policy",
    "check_learner",
    "check_move_probabilities_are_played",
    "check_resume_equals_uninterrupted",
]
