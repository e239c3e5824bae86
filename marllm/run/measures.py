"""What a run's logged measures are, in words, as its ``run.json``, ``config.yaml`` and report state them: which KL
the ``<learner>/kl`` metric is, and which distribution a learner's exploitability is computed on."""

from __future__ import annotations

from marllm.config import TrainConfig

TOKEN_KL = "full-vocabulary KL(policy || reference) summed over response tokens, batch mean"
SAMPLED_TOKEN_KL = (
    "KL(policy || reference) of the sampling distributions (repetition penalty, temperature, top-k/top-p applied; the "
    "reference restricted to the policy's kept tokens) summed over response tokens, batch mean"
)
CONSTRAINED_KL = (
    "KL(policy || reference) of the distributions restricted to the legal moves' continuations, summed over the "
    "answer's tokens (EOS included), batch mean"
)
SCORE_KL = "exact KL(policy || reference) over the legal moves of the state, per move, batch mean"


def kl_metric(config: TrainConfig) -> str:
    """What ``<learner>/kl`` measures under ``config``'s action mode and ``generation.logprobs_from``."""
    actions = config.game.actions.mode if config.game is not None else "generate"
    if actions == "score":
        return SCORE_KL
    restricted = CONSTRAINED_KL if actions == "constrained" else None
    if config.generation.logprobs_from == "sampling":
        return (restricted + ", after every sampling processor") if restricted else SAMPLED_TOKEN_KL
    return (restricted + ", tempered logits") if restricted else TOKEN_KL


def exploitability_measure(config: TrainConfig) -> str | None:
    """The distribution whose exploitability the run logs or a ``best_response`` seat answers, or None where the run
    measures none."""
    game = config.game
    if game is None:
        return None
    best_response = any(seat.kind == "best_response" for seat in game.parsed_seats())
    if game.measurement.exploitability_every is None and not best_response:
        return None
    if game.actions.mode == "score":
        return "the policy that plays: the exact softmax over the legal moves' scores, from which moves are drawn"
    if game.actions.mode == "constrained":
        return (
            "the policy that plays: each legal move's exact probability under constrained sampling, every sampling "
            "processor applied (repetition penalty, temperature, top-k/top-p), EOS included"
        )
    return (
        f"the policy that plays, estimated: the frequencies of game.measurement.exploitability_samples = "
        f"{game.measurement.exploitability_samples} {game.actions.mode} answers per information state, each with a "
        f"budget drawn from [generation.min_new_tokens, generation.max_new_tokens] = "
        f"[{config.generation.min_new_tokens}, {config.generation.max_new_tokens}] as in training"
    )
