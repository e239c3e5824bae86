"""The action modes a config can name (``game.actions``): :data:`ACTION_MODE_REGISTRY`, torch-free.

Each built-in mode is an :class:`ActionMode` registered by name: its facts as class attributes (what an answer is,
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
from typing import Any, ClassVar

from marllm.games.env.parsers import PARSERS
from marllm.utils.checks import choice
from marllm.utils.dataclass_tree import build
from marllm.utils.registry import Extension, Registry

DEFAULT_MODE = "generate"
"""The mode of a text task, and of a game whose config names none."""

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


ACTION_MODE_REGISTRY: Registry[type[ActionMode]] = Registry("action mode", ActionMode, "my_mode.py:MyCollector")
"""Action mode name -> :class:`ActionMode`: the names ``game.actions`` takes (besides references)."""


@ACTION_MODE_REGISTRY.register("generate")
class GenerateMode(ActionMode):
    """``generate``: free text, every token an action."""

    actions = "generate"
    implementation = "marllm.algorithms.actions.tokens:TokenCollector"
    Settings = GenerateSettings
    summary = "free text, every token an action"
    needs_legal_moves = False


@ACTION_MODE_REGISTRY.register("constrained")
class ConstrainedMode(ActionMode):
    """``constrained``: a legal move's name, token by token restricted to the legal moves, then EOS."""

    actions = "constrained"
    implementation = "marllm.algorithms.actions.constrained:ConstrainedCollector"
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


@ACTION_MODE_REGISTRY.register("think")
class ThinkMode(ActionMode):
    """``think``: free text, then a constrained move."""

    actions = "think"
    implementation = "marllm.algorithms.actions.think:ThinkCollector"
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


@ACTION_MODE_REGISTRY.register("score")
class ScoreMode(ActionMode):
    """``score``: one legal move drawn from the softmax of the moves' normalised log-likelihoods."""

    actions = "score"
    implementation = "marllm.algorithms.actions.score:ScoreCollector"
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


ACTION_MODES = tuple(ACTION_MODE_REGISTRY)
"""The built-in action mode names."""


def action_mode(mode: str, owner: str = "game.actions") -> type[ActionMode]:
    """The facts of ``mode``: a built-in's torch-free :class:`ActionMode`, or a referenced collector class (loaded).

    Raises:
        ValueError: an unknown name, a reference that does not load, or one that names no collector class.
    """
    facts = ACTION_MODE_REGISTRY.entry(mode, owner)
    if ACTION_MODE_REGISTRY.is_reference(mode):
        target = ACTION_MODE_REGISTRY.implementation(mode, owner)
        fits = isinstance(target, type) and issubclass(target, ActionMode) and hasattr(target, "actions")
    else:
        fits = True
    if not fits:
        raise ValueError(
            f"{owner}: {mode!r} is not a collector class (a subclass of marllm.algorithms.actions.Collector with an "
            "'actions' name)"
        )
    return facts


def collector_class(mode: str, owner: str) -> type[Any]:
    """The collector class of ``mode`` (a built-in name or a reference), imported (``owner`` names it in errors)."""
    action_mode(mode, owner)
    return ACTION_MODE_REGISTRY.implementation(mode, owner)


def mode_settings(mode: str, settings: Mapping[str, Any] | None = None, owner: str = "game.actions") -> Any:
    """The settings of ``mode`` (its ``Settings`` made from ``settings``), or None for a mode without settings.

    Raises:
        ValueError: settings given to a mode that has none.
    """
    cls = action_mode(mode, owner).Settings
    if cls is None:
        if settings:
            raise ValueError(f"{owner}: {mode} has no settings, got {dict(settings)}")
        return None
    return build(cls, dict(settings or {}), f"{owner}.{mode}")
