"""Settings a run would not read: a value other than its default, given to a setting that nothing of the run reads,
is refused, naming what reads it (the config already refuses ``normalization: word`` under ``generate`` and
``rollout_from_generate`` under ``score`` for the same reason).

A value equal to its default passes: a dataclass cannot tell it from a value left out, and a run directory's
``config.yaml`` records every key. The answer budgets (``generation.min_new_tokens``, ``max_new_tokens``) and
``game.measurement.exploitability_samples`` pass under the modes that do not read them, so that one config switches
``game.actions.mode`` by one override: their docs say which modes read them.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

from marllm.config.game import MeasurementConfig, OpponentsConfig
from marllm.config.opponents import CATALOG as OPPONENTS
from marllm.models.generation_config import GenerationConfig

if TYPE_CHECKING:
    from marllm.config.train_config import TrainConfig


def check_read_settings(config: TrainConfig, game_repetition_penalty: float) -> None:
    """Refuse a game setting the run would ignore: an opponent's setting with no seat of that opponent, a measurement
    setting with nothing measured, a sampling setting under an action mode that samples no token. A game's
    ``generation.repetition_penalty`` default is ``game_repetition_penalty``.

    Raises:
        ValueError: naming the setting, its value and what would read it.
    """
    game = config.game
    if game is None:
        return
    _opponent_settings(game)
    _measurement_settings(game)
    defaults = {"repetition_penalty": game_repetition_penalty}
    ignored = getattr(game.actions.facts, "ignores_sampling", ())
    for name in ignored:
        value, default = getattr(config.generation, name), defaults.get(name, _default(GenerationConfig, name))
        if value != default:
            raise ValueError(
                f"generation.{name}: {value} would be ignored: under game.actions.mode: {game.actions.mode} (its "
                f"answer: {game.actions.facts.summary}) no token is sampled; leave generation.{name} at its default "
                f"({default}), or use a mode that samples tokens"
            )


def _opponent_settings(game: Any) -> None:
    seated = [seat for seat in game.parsed_seats() if not seat.is_learner]
    read = {setting for seat in seated for setting in seat.opponent.settings}
    for name in _changed(game.opponents, OpponentsConfig):
        if name not in read:
            owners = [kind for kind, entry in OPPONENTS.items() if name in entry.settings]
            raise ValueError(
                f"game.opponents.{name}: {getattr(game.opponents, name)} is a setting of a {' or '.join(owners)} "
                f"seat, and game.seats {game.seats} has none: it would be ignored; leave it out, or seat one"
            )


def _measurement_settings(game: Any) -> None:
    measured = game.measurement.exploitability_every is not None
    tabulated = any(seat.opponent.tabulates for seat in game.parsed_seats() if not seat.is_learner)
    for name in _changed(game.measurement, MeasurementConfig):
        if name == "exploitability_every" or measured or (name == "exploitability_samples" and tabulated):
            continue
        also = " (or tabulated for a best_response seat)" if name == "exploitability_samples" else ""
        raise ValueError(
            f"game.measurement.{name}: {getattr(game.measurement, name)} applies to the policies measured every "
            f"game.measurement.exploitability_every iterations{also}, and game.measurement.exploitability_every is "
            "null: it would be ignored; leave it out, or set game.measurement.exploitability_every"
        )


def _changed(section: Any, cls: type) -> list[str]:
    """The fields of ``section`` whose value differs from ``cls``'s default."""
    return [f.name for f in fields(cls) if f.init and getattr(section, f.name) != _default(cls, f.name)]


def _default(cls: type, name: str) -> Any:
    return next(f.default for f in fields(cls) if f.name == name)
