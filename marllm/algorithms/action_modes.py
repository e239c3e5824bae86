"""The facts of the action modes (:mod:`marllm.algorithms.action_catalog`), as class attributes, without importing
torch: :class:`ActionMode`, the base of every collector class (:class:`~marllm.algorithms.actions.base.Collector`),
and one subclass per built-in mode, which its collector class inherits first (``ScoreCollector.options`` is
:class:`ScoreMode`'s) and which the catalog gives the config in place of the collector class.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

TOKEN_KL = {
    "tempered": "full-vocabulary KL(policy || reference) summed over response tokens, batch mean",
    "sampling": (
        "KL(policy || reference) of the sampling distributions (repetition penalty, temperature, top-k/top-p "
        "applied; the reference restricted to the policy's kept tokens) summed over response tokens, batch mean"
    ),
}
"""What the KL of free-text answers is, by ``generation.logprobs_from``."""

_RESTRICTED_KL = (
    "KL(policy || reference) of the distributions restricted to the legal moves' continuations, summed over the "
    "answer's tokens (EOS included), batch mean"
)
_SCORE_KL = "exact KL(policy || reference) over the legal moves of the state, per move, batch mean"


class ActionMode:
    """The facts of an action mode, as class attributes: the base of every collector class, and the torch-free
    stand-in the catalog gives for a built-in mode (:func:`~marllm.algorithms.action_catalog.action_mode`). A
    collector class that subclasses another mode's states every fact in which the two differ (its facts class comes
    first among its bases)."""

    actions: ClassVar[str]
    """The ``game.actions.mode`` name of the mode."""
    summary: ClassVar[str] = ""
    """What an answer is, in a line."""
    needs_legal_moves: ClassVar[bool] = True
    """Whether it needs ``observation["legal_moves"]`` (a game's): a text task plays free text only."""
    ends_with_eos: ClassVar[bool] = False
    """Whether its answers end with EOS once a move is complete (``generation.stop_at_eos`` must be on)."""
    exact_policy: ClassVar[str | None] = None
    """Its exact move probabilities, in words (the policy that an exploitability of the mode measures); None where
    its moves' probabilities can only be estimated from sampled answers."""
    options: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    """Its own settings (``game.actions.<option>``) -> the values each takes."""
    kl: ClassVar[Mapping[str, str]] = TOKEN_KL
    """What its KL to the reference (the metric ``<learner>/kl``) is, by ``generation.logprobs_from``."""
    rollout_from_generate: ClassVar[str | None] = None
    """Why ``ppo.compute.rollout_from_generate: true`` does not fit it (the refusal says so), or None where it fits."""
    answer: ClassVar[str] = "text"
    """What an answer generates: ``"text"`` (up to ``generation.max_new_tokens``), ``"move"`` (a legal move's name,
    then EOS), ``"thought, move"`` (free text, a marker, a move, EOS) or ``"nothing"`` (moves scored, none
    generated); what a memory plan sizes an answer by."""
    parses_answers: ClassVar[bool] = True
    """Whether the game's parser (``game.parser``) reads its answers; False where every answer is a legal move's exact
    name, which any parser maps alike (a ``game.parser`` other than the default is then refused, as it changes
    nothing)."""
    ignores_sampling: ClassVar[tuple[str, ...]] = ()
    """The ``generation`` settings of the sampling distribution its answers never read (a value other than the
    default is refused, as it would change nothing)."""


class GenerateMode(ActionMode):
    """``generate``: free text, every token an action."""

    actions = "generate"
    summary = "free text, every token an action"
    needs_legal_moves = False


class ConstrainedMode(ActionMode):
    """``constrained``: a legal move's name, token by token restricted to the legal moves, then EOS."""

    actions = "constrained"
    summary = "a legal move's name, token by token restricted to them"
    needs_legal_moves = True
    ends_with_eos = True
    answer = "move"
    parses_answers = False
    exact_policy = (
        "each legal move's exact probability under constrained sampling, every sampling processor applied "
        "(repetition penalty, temperature, top-k/top-p), EOS included"
    )
    kl = {
        "tempered": _RESTRICTED_KL + ", tempered logits",
        "sampling": _RESTRICTED_KL + ", after every sampling processor",
    }


class ThinkMode(ActionMode):
    """``think``: free text, then a constrained move."""

    actions = "think"
    summary = "free text, then a constrained move"
    needs_legal_moves = True
    ends_with_eos = True
    answer = "thought, move"
    parses_answers = False
    kl = {
        "tempered": (
            "KL(policy || reference) summed over the answer's tokens, batch mean: full-vocabulary over the thought's "
            "tokens (tempered logits), restricted to the legal moves' continuations over the move's (EOS included)"
        ),
        "sampling": (
            "KL(policy || reference) of the sampling distributions summed over the answer's tokens, batch mean: over "
            "the thought's tokens after every sampling processor (the reference restricted to the policy's kept "
            "tokens), restricted to the legal moves' continuations over the move's (EOS included)"
        ),
    }
    rollout_from_generate = (
        "samples a thought and its move in two generate calls, whose log-probs come from one forward over both"
    )


class ScoreMode(ActionMode):
    """``score``: one legal move drawn from the softmax of the moves' normalised log-likelihoods."""

    actions = "score"
    summary = "one legal move drawn from the softmax of their likelihoods"
    needs_legal_moves = True
    exact_policy = "the exact softmax over the legal moves' scores, from which moves are drawn"
    answer = "nothing"
    parses_answers = False
    options = {"normalization": ("none", "token", "word")}
    kl = {"tempered": _SCORE_KL, "sampling": _SCORE_KL}
    ignores_sampling = ("temperature", "top_k", "top_p", "repetition_penalty", "logprobs_from")
    rollout_from_generate = (
        "generates nothing (it draws each move from a softmax over the legal moves' scores), so it would be ignored"
    )
