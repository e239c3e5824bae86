"""A game run built from a config's ``game`` section: the wrapped game env, its setup and what it measures.

The env is :class:`~marllm.games.env.BatchedGameEnv` over the game, wrapped like the text env: by
:class:`~marllm.wrappers.SharedReward` over the game's seats when ``agents.reward_coefficients`` is set, then by
:class:`~marllm.wrappers.RolePermutation`, whose agents are the *slots* of ``game.seats``: slot i starts in seat i and
moves on to the next seat every ``agents.role_period`` iterations (never when it is null); who sits in which slot is
:mod:`marllm.games.seats`'s. One learner in several slots (self-play) is one learner, updated once per iteration on the
moves of all of them. With ``game.role_baselines`` the env is wrapped, outermost, by
:class:`~marllm.wrappers.RoleBaselines`, one baseline per (learner, seat) for every learner's slots.

After each iteration :func:`game_metrics` adds what the env measured of each learner's games, read from each slot's
final info (its seat under ``role``, the seat's measures under :data:`~marllm.games.env.keys.METRICS`):
``<learner>/game/<seat>/<metric>`` per seat it played and ``<learner>/game/<metric>`` over them (see
:data:`AGGREGATED`); and of each fixed opponent's, its illegal answers (:data:`OPPONENT_METRICS`, as
``<opponent>/game/<seat>/<metric>`` and ``<opponent>/game/<metric>``), with a warning the first time an opponent
answers illegally (an opponent class of one's own naming no legal move).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pettingzoo import AECEnv

from marllm.config import TrainConfig
from marllm.games.build import game_env
from marllm.games.env.keys import METRICS
from marllm.games.players import OpponentPool
from marllm.games.seats import learner_slots, opponent_slots, seat_players, seat_slots
from marllm.games.settings import GameConfig
from marllm.games.strategy import ExploitabilityMetrics
from marllm.run.learners import learners_from_config
from marllm.run.parts import Setup, wrap_for_agents
from marllm.wrappers import RoleBaselines


def build_game_env(config: TrainConfig) -> AECEnv:
    """The batched game of ``config``, wrapped by SharedReward (if rewards are shared), RolePermutation and (with
    ``game.role_baselines``) RoleBaselines over the learners' slots."""
    game = config.game
    if game is None:
        raise ValueError("build_game_env needs a config with a game section")
    env = wrap_for_agents(game_env(game, game.batch_size, config.seed), config, seat_slots(game.seats))
    if game.role_baselines is not None:
        env = RoleBaselines(env, game.role_baselines, learner_slots(game))
    return env


AGGREGATED = (
    "payoff",
    "win_rate",
    "draw_rate",
    "loss_rate",
    "forfeit_rate",
    "capped_rate",
    "moves_per_game",
    "game_length",
)
"""The metrics ``<learner>/game/<metric>`` averages over the seats the learner played this iteration (each seat's
games counting once), as it does a game view's own measures (:meth:`~marllm.games.env.GameView.metrics`, over the
seats that report them); its ``illegal_move_rate`` is over all its answers, and in a social dilemma its
``cooperation_rate`` over all its legal answers (not logged in an iteration where it gave none)."""

_COUNTED = ("illegal_move_rate", "cooperation_rate", "legal_answers")
"""The env's own seat metrics that a learner's totals weigh by its answers rather than average over its seats."""

OPPONENT_METRICS = ("illegal_move_rate", "forfeit_rate")
"""The env's seat metrics logged for a fixed opponent too, under its id as a learner's are under the learner's
(``<opponent>/game/<seat>/<metric>`` per seat it played, ``<opponent>/game/<metric>`` over them): the share of its
answers that named no legal move, and of its games it forfeited so (``game.illegal: forfeit``). A built-in opponent
always answers legally; one of one's own may not."""


def game_metrics(
    final_infos: Mapping[str, Mapping[str, Any]],
    slots: Sequence[str],
    owners: Mapping[str, str],
    metrics: dict[str, Any],
    opponents: Mapping[str, str] | None = None,
    warned: set[str] | None = None,
    illegal: str = "forfeit",
) -> dict[str, Any]:
    """``metrics`` with the game results of the episode just played added (see the module docstring).

    Args:
        final_infos: each slot's info when its games were over (:attr:`~marllm.loop.IterationResult.final_infos`):
            its seat under ``role`` (the slot itself without a role permutation) and the seat's measures under
            :data:`~marllm.games.env.keys.METRICS`.
        slots: the env's agent ids.
        owners: slot -> learner id, for the learners' slots.
        metrics: the iteration's metrics (:func:`~marllm.loop.run_iteration`'s, keyed by learner id: its ``names``
            are ``owners``).
        opponents: slot -> opponent id, for the fixed opponents' slots (:func:`~marllm.games.seats.opponent_slots`);
            None: every slot that is not a learner's, under its own id.
        warned: the opponents already warned about answering illegally, kept from call to call (added to here) so
            that each is warned once; None: warn on every call.
        illegal: the game's illegal-answer policy (``game.illegal``), which the warning names.
    """
    if opponents is None:
        opponents = {slot: slot for slot in slots if slot not in owners}
    merged = dict(metrics)
    by_player: dict[str, list[dict[str, float]]] = {}
    fixed: dict[str, list[tuple[str, dict[str, float]]]] = {}
    for slot in slots:
        info = final_infos.get(slot, {})
        seat, seat_metrics = info.get("role", slot), info.get(METRICS)
        if seat_metrics is None:  # the episode has not ended
            continue
        if slot in owners:
            learner_id = owners[slot]
            by_player.setdefault(learner_id, []).append(seat_metrics)
            for key, value in seat_metrics.items():
                merged[f"{learner_id}/game/{seat}/{key}"] = float(value)
        elif slot in opponents:
            fixed.setdefault(opponents[slot], []).append((seat, seat_metrics))
    for learner_id, seats in by_player.items():
        merged.update({f"{learner_id}/game/{key}": value for key, value in learner_totals(seats).items()})
    for opponent_id, played in fixed.items():
        merged.update(opponent_metrics(opponent_id, played, illegal, warned))
    return merged


def opponent_metrics(
    opponent_id: str,
    played: Sequence[tuple[str, Mapping[str, float]]],
    illegal: str,
    warned: set[str] | None = None,
) -> dict[str, float]:
    """A fixed opponent's :data:`OPPONENT_METRICS` from the ``(seat, seat metrics)`` of each seat it played (a seat
    where it gave no answer logs none), warning where it answered illegally unless ``warned`` holds its id (to which
    it is then added).

    Args:
        opponent_id: its id, the metrics' prefix.
        played: each seat it played and the env's metrics of that seat (its final info's ``METRICS``).
        illegal: the env's illegal-answer policy (``forfeit`` or ``random``), for the warning.
        warned: the opponents already warned about; None: warn regardless.
    """
    answered = [(seat, m) for seat, m in played if m["moves_per_game"] > 0]
    out = {f"{opponent_id}/game/{seat}/{key}": float(m[key]) for seat, m in answered for key in OPPONENT_METRICS}
    if not answered:
        return out
    totals = learner_totals([m for _, m in answered])
    out.update({f"{opponent_id}/game/{key}": totals[key] for key in OPPONENT_METRICS})
    rate = totals["illegal_move_rate"]
    if rate > 0 and (warned is None or opponent_id not in warned):
        if warned is not None:
            warned.add(opponent_id)
        seats = sorted(seat for seat, m in answered if m["illegal_move_rate"] > 0)
        where = f"{'seat' if len(seats) == 1 else 'seats'} {', '.join(seats)}"
        outcome = "it forfeited those games" if illegal == "forfeit" else "a random legal move was played for each"
        warnings.warn(
            f"opponent {opponent_id!r} does not learn and answered illegally: {rate:.0%} of its answers this "
            f"iteration (in {where}) named no legal move, and {outcome} (game.illegal: {illegal}); "
            f"its rates are logged as {opponent_id}/game/illegal_move_rate and {opponent_id}/game/forfeit_rate. An "
            "opponent should answer with a legal move's exact name (marllm.testing.check_player checks it); this is "
            "said once per opponent and run",
            stacklevel=2,
        )
    return out


def learner_totals(seats: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """A learner's game metrics from those of the seats it played (see :data:`AGGREGATED`)."""
    totals = {key: float(sum(m[key] for m in seats) / len(seats)) for key in AGGREGATED}
    answers = [m["moves_per_game"] for m in seats]  # per game; every seat plays the batch's games
    illegal = sum(m["illegal_move_rate"] * n for m, n in zip(seats, answers, strict=True) if n > 0)
    totals["illegal_move_rate"] = float(illegal / sum(answers)) if sum(answers) else math.nan
    dilemmas = [m for m in seats if "legal_answers" in m]  # over all its legal answers, in every seat
    legal = sum(m["legal_answers"] for m in dilemmas)
    if legal:  # none (every answer illegal): no rate is logged
        cooperative = sum(m["cooperation_rate"] * m["legal_answers"] for m in dilemmas if m["legal_answers"] > 0)
        totals["cooperation_rate"] = float(cooperative / legal)
    own = {key for m in seats for key in m} - set(AGGREGATED) - set(_COUNTED)  # the game view's own measures
    for key in sorted(own):
        reported = [m[key] for m in seats if key in m]
        totals[key] = float(sum(reported) / len(reported))
    return totals


def build_game_setup(config: TrainConfig, tokenizer: Any) -> Setup:
    """The :class:`~marllm.run.parts.Setup` of a game config (``config.game``): the learners its seats name (and
    their reference), the fixed opponents, the wrapped env and the per-seat metrics."""
    game = config.game
    assert game is not None
    env = build_game_env(config)
    learners, reference = learners_from_config(config, tokenizer)
    players, opponents = seat_players(game, learners, config.seed, config.generation)
    owners = learner_slots(game)
    devices = {str(next(learner.model.parameters()).device) for learner in learners.values()}
    pools = any(isinstance(player, OpponentPool) for player in opponents.values())  # a snapshot waits for its learner
    concurrent = config.model.lora is None and len(devices) == len(learners) > 1 and not pools
    return Setup(
        config,
        env,
        {**learners, **opponents},
        None,
        reference,
        tokenizer,
        concurrent,
        seat_players=players,
        metric_names=owners,
        metrics_hook=metrics_hook(config, learners, game_metrics_hook(game)),
    )


def game_metrics_hook(game: GameConfig) -> Callable[[dict[str, Any], Mapping[str, Any]], dict[str, Any]]:
    """:func:`game_metrics` as a run calls it after each iteration, ``hook(metrics, final_infos)``: the learners'
    and the fixed opponents' slots of ``game.seats``, each opponent warned about its illegal answers once in the
    run."""
    slots = seat_slots(game.seats)
    warned: set[str] = set()

    def hook(metrics: dict[str, Any], final_infos: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        return game_metrics(
            final_infos, slots, learner_slots(game), metrics, opponent_slots(game), warned, game.illegal
        )

    return hook


def metrics_hook(config: TrainConfig, learners: Mapping[str, Any], hook: Any) -> Any:
    """``hook``, with the learners' exploitability added every ``game.exploitability.every`` iterations if
    it is set (:class:`~marllm.games.strategy.ExploitabilityMetrics`)."""
    game = config.game
    if game is None or game.exploitability is None:
        return hook
    return ExploitabilityMetrics(game, config.generation, learners, hook)
