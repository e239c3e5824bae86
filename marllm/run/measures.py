"""What a run's logged measures are, in words, as its ``run.json``, ``config.yaml`` and report state them: which KL
the ``<learner>/kl`` metric is, and which distribution a learner's exploitability is computed on. Each is its action
mode's fact (:class:`~marllm.algorithms.action_modes.ActionMode`)."""

from __future__ import annotations

from marllm.algorithms.action_registry import DEFAULT_MODE, action_mode
from marllm.config import TrainConfig


def kl_metric(config: TrainConfig) -> str:
    """What ``<learner>/kl`` measures under ``config``'s action mode and ``generation.logprobs_from``."""
    mode = action_mode(config.game.actions.mode if config.game is not None else DEFAULT_MODE)
    return mode.kl[config.generation.logprobs_from]


def exploitability_measure(config: TrainConfig) -> str | None:
    """The distribution whose exploitability the run logs or an opponent reading the learner's tabulated policy (a
    ``best_response`` seat) answers, or None where the run measures none."""
    game = config.game
    if game is None:
        return None
    tabulated = any(seat.opponent.tabulates for seat in game.seats if not seat.is_learner)
    if game.exploitability is None and not tabulated:
        return None
    exact = game.actions.facts.exact_policy
    if exact is not None:
        return f"the policy that plays: {exact}"
    return (
        f"the policy that plays, estimated: the frequencies of game.actions.{game.actions.mode}.exploitability_samples "
        f"= {game.actions.exploitability_samples} {game.actions.mode} answers per information state, each with a "
        f"budget drawn from [generation.min_new_tokens, generation.max_new_tokens] = "
        f"[{config.generation.min_new_tokens}, {config.generation.max_new_tokens}] as in training"
    )
