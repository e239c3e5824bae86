"""Settings neither training nor evaluation would read: a value other than its default, given to a setting that
nothing reads, is refused, naming what reads it (the config already refuses ``normalization: word`` under
``generate`` and ``rollout_from_generate`` under ``score`` for the same reason).

A config serves ``marllm train`` and ``marllm eval`` alike: the settings of the opponents that watch no learner
(``game.opponents.mcts_simulations``, ``cfr_iterations``) and ``game.measurement.exploitability_samples`` are read by
``marllm eval`` (its opponents, ``--exploitability``) whatever the seats, and pass. A value equal to its default
passes: a dataclass cannot tell it from a value left out, and a run directory's ``config.yaml`` records every key.
The answer budgets (``generation.min_new_tokens``, ``max_new_tokens``) pass under the modes that do not read them,
so that one config switches ``game.actions.mode`` by one override: their docs say which modes read them.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

from marllm.games.opponents import CATALOG as OPPONENTS
from marllm.games.settings import GAME_REPETITION_PENALTY, MeasurementConfig, OpponentsConfig
from marllm.models.generation_config import GenerationConfig

if TYPE_CHECKING:
    from marllm.config.train_config import TrainConfig


def check_read_settings(config: TrainConfig) -> None:
    """Refuse a game setting the run would ignore: an opponent's setting with no seat of that opponent, a measurement
    setting with nothing measured, a sampling setting under an action mode that samples no token (against a game's
    defaults: ``generation.repetition_penalty`` is :data:`~marllm.games.settings.GAME_REPETITION_PENALTY`).

    Raises:
        ValueError: naming the setting, its value and what would read it.
    """
    game = config.game
    if game is None:
        return
    _opponent_settings(game)
    _measurement_settings(game)
    _mode_settings(config)
    defaults = _defaults(GenerationConfig) | {"repetition_penalty": GAME_REPETITION_PENALTY}
    for name in getattr(game.actions.facts, "ignores_sampling", ()):
        value, default = getattr(config.generation, name), defaults[name]
        if value != default:
            raise ValueError(
                f"generation.{name}: {value} would be ignored: under game.actions.mode: {game.actions.mode} (its "
                f"answer: {game.actions.facts.summary}) no token is sampled; leave generation.{name} at its default "
                f"({default}), or use a mode that samples tokens"
            )


def _opponent_settings(game: Any) -> None:
    """The settings of opponents that watch a learner (a snapshot pool, a best response), which only a training run
    with such a seat reads; an evaluation has no learner to watch."""
    seated = [seat for seat in game.parsed_seats() if not seat.is_learner]
    read = {setting for seat in seated for setting in seat.opponent.settings}
    watching = {setting for entry in OPPONENTS.values() if entry.learner for setting in entry.settings}
    for name in _changed(game.opponents, OpponentsConfig):
        if name in watching and name not in read:
            owners = [kind for kind, entry in OPPONENTS.items() if name in entry.settings]
            raise ValueError(
                f"game.opponents.{name}: {getattr(game.opponents, name)} is a setting of a {' or '.join(owners)} "
                f"seat, and game.seats {game.seats} has none: it would be ignored; leave it out, or seat one"
            )


def _measurement_settings(game: Any) -> None:
    """``policy_average``, which weighs the policies a training run measures (``exploitability_samples`` is read by
    ``marllm eval --exploitability`` too)."""
    if game.measurement.exploitability_every is not None:
        return
    if "policy_average" in _changed(game.measurement, MeasurementConfig):
        raise ValueError(
            f"game.measurement.policy_average: {game.measurement.policy_average} weighs the policies measured every "
            "game.measurement.exploitability_every iterations in their average, and game.measurement."
            "exploitability_every is null: it would be ignored; leave it out, or set "
            "game.measurement.exploitability_every"
        )


def _mode_settings(config: TrainConfig) -> None:
    """Settings the action mode's answers never meet: ``game.parser`` where every answer is a legal move's exact name,
    ``game.measurement.exploitability_samples`` where the mode's move probabilities are exact (nothing is sampled to
    tabulate them)."""
    game, facts = config.game, config.game.actions.facts
    default_parser = next(f.default for f in fields(type(game)) if f.name == "parser")
    if not facts.parses_answers and game.parser != default_parser:
        raise ValueError(
            f"game.parser: {game.parser} would be ignored: under game.actions.mode: {game.actions.mode} every answer "
            f"is a legal move's exact name ({facts.summary}); leave game.parser at its default ({default_parser}), or "
            "use a mode whose answers are parsed (generate)"
        )
    if facts.exact_policy is not None and "exploitability_samples" in _changed(game.measurement, MeasurementConfig):
        raise ValueError(
            f"game.measurement.exploitability_samples: {game.measurement.exploitability_samples} would be ignored: "
            f"under game.actions.mode: {game.actions.mode} the exploitability reads {facts.exact_policy}, and nothing "
            "is sampled; leave it out"
        )


def _changed(section: Any, cls: type) -> list[str]:
    """The fields of ``section`` whose value differs from ``cls``'s default."""
    return [name for name, default in _defaults(cls).items() if getattr(section, name) != default]


def _defaults(cls: type) -> dict[str, Any]:
    """Each init field of dataclass ``cls`` -> its default."""
    return {f.name: f.default for f in fields(cls) if f.init}
