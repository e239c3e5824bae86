"""The facts of the action modes a config can name (``game.actions``), torch-free; registered by name in
:mod:`marllm.algorithms.action_registry`.

Each built-in mode is an :class:`ActionMode`: its facts as class attributes (what an answer is,
what its KL is, whether its answers end with EOS, whether it has exact move probabilities), its own settings as a
dataclass (``Settings``, written under the mode's name: ``game.actions: {score: {normalization: word}}``), and its
collector class (:mod:`marllm.algorithms.actions`) as ``implementation``, imported only when a learner or a player is
built. Each built-in collector class inherits its mode's facts, so ``ScoreCollector.Settings`` is the ``score``
entry's.

A config can also name a collector class by reference, as it names a learner: ``game.actions: my_mode.py:MyCollector``
(a file relative to the config's folder) or ``package.module:MyCollector``. Its facts are its own class attributes (a
subclass of :class:`~marllm.algorithms.actions.base.Collector` inherits the defaults of :class:`ActionMode`), read by
loading it when the config is checked. Adding an action mode is then one file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from marllm.games.env.parsers import PARSERS
from marllm.utils.checks import choice
from marllm.utils.registry import Extension

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


class ActionMode(Extension):
    """The facts of an action mode, as class attributes: the base of every collector class, and the torch-free
    entry registered for a built-in mode (:func:`action_mode`). A collector class that subclasses another mode's
    states every fact in which the two differ (its facts class comes first among its bases)."""

    actions: ClassVar[str]
    """The ``game.actions`` name of the mode."""
    needs_legal_moves: ClassVar[bool] = True
    """Whether it needs ``observation["legal_moves"]`` (a game's): a text task plays free text only."""
    ends_with_eos: ClassVar[bool] = False
    """Whether its answers end with EOS once a move is complete (``generation.stop_at_eos`` must be on)."""
    exact_policy: ClassVar[str | None] = None
    """Its exact move probabilities, in words (the policy that an exploitability of the mode measures); None where
    its moves' probabilities can only be estimated from sampled answers."""
    kl: ClassVar[Mapping[str, str]] = TOKEN_KL
    """What its KL to the reference (the metric ``<learner>/kl``) is, by ``generation.logprobs_from``."""
    rollout_from_generate: ClassVar[str | None] = None
    """Why ``ppo.compute.rollout_from_generate: true`` does not fit it (the refusal says so), or None where it fits."""
    answer: ClassVar[str] = "text"
    """What an answer generates: ``"text"`` (up to ``generation.max_new_tokens``), ``"move"`` (a legal move's name,
    then EOS), ``"thought, move"`` (free text, a marker, a move, EOS) or ``"nothing"`` (moves scored, none
    generated); what a memory plan sizes an answer by."""
    sequences: ClassVar[str | None] = None
    """Why it cannot play a game as one token sequence per seat (``game.history: sequence``, which appends each
    answer's sampled tokens to the seat's sequence), or None where it can."""
    ignores_sampling: ClassVar[tuple[str, ...]] = ()
    """The ``generation`` settings of the sampling distribution its answers never read (a value other than the
    default is refused, as it would change nothing)."""


@dataclass(frozen=True)
class SampledPolicySettings:
    """The settings of a mode whose move probabilities are estimated from sampled answers.

    Attributes:
        exploitability_samples: answers per information state that tabulate the policy, in training
            (``game.exploitability``, a ``best_response`` seat) and by ``marllm eval --exploitability``.
    """

    exploitability_samples: int = 64

    def __post_init__(self) -> None:
        if self.exploitability_samples < 1:
            raise ValueError(f"exploitability_samples must be an integer >= 1, got {self.exploitability_samples}")


@dataclass(frozen=True)
class GenerateSettings(SampledPolicySettings):
    """``generate``'s settings.

    Attributes:
        parser: how a free-text answer names a move: ``first`` (the first legal move named, else the first listed
            number), ``last`` or ``exact``.
    """

    parser: str = "first"

    def __post_init__(self) -> None:
        super().__post_init__()
        choice("generate", self, "parser", tuple(PARSERS))


@dataclass(frozen=True)
class ScoreSettings:
    """``score``'s settings.

    Attributes:
        normalization: how a move's log-likelihood is normalised: ``none`` (the sum over its tokens: favours short
            names), ``token`` (the mean per token, TWOSOME's token normalisation) or ``word`` (the sum divided by
            the name's words, TWOSOME's word normalisation).
    """

    normalization: str = "token"

    def __post_init__(self) -> None:
        choice("score", self, "normalization", ("none", "token", "word"))


class GenerateMode(ActionMode):
    """``generate``: free text, every token an action."""

    actions = "generate"
    Settings = GenerateSettings
    summary = "free text, every token an action"
    needs_legal_moves = False


class ConstrainedMode(ActionMode):
    """``constrained``: a legal move's name, token by token restricted to the legal moves, then EOS."""

    actions = "constrained"
    Settings = None  # said, not inherited: a subclass of the generate collector would take generate's otherwise
    summary = "a legal move's name, token by token restricted to them"
    needs_legal_moves = True
    ends_with_eos = True
    answer = "move"
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
    Settings = SampledPolicySettings
    summary = "free text, then a constrained move"
    needs_legal_moves = True
    ends_with_eos = True
    answer = "thought, move"
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
    Settings = ScoreSettings
    summary = "one legal move drawn from the softmax of their likelihoods"
    needs_legal_moves = True
    exact_policy = "the exact softmax over the legal moves' scores, from which moves are drawn"
    answer = "nothing"
    kl = {"tempered": _SCORE_KL, "sampling": _SCORE_KL}
    ignores_sampling = ("temperature", "top_k", "top_p", "repetition_penalty", "logprobs_from")
    rollout_from_generate = (
        "generates nothing (it draws each move from a softmax over the legal moves' scores), so it would be ignored"
    )
    sequences = "samples no tokens (a move is one action over the legal moves' scores) to append to a sequence"
