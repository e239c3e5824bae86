"""``marllm eval`` of a game config: each model against each fixed opponent, in each seat; or a rated round-robin.

Imported only when a game is evaluated (:mod:`marllm.cli.evaluate`): it loads torch.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import yaml

from marllm.config import TrainConfig
from marllm.config.loading import ConfigError
from marllm.evaluation.model_strategy import evaluate_exploitability
from marllm.evaluation.round_robin import round_robin
from marllm.games.evaluation import check_opponents, evaluate_game


def eval_game(config: TrainConfig, args: argparse.Namespace) -> int:
    """Print the win/draw/loss/illegal-move table of :func:`~marllm.games.evaluation.evaluate_game`, or with
    ``--round-robin`` the ratings of :func:`~marllm.evaluation.round_robin.round_robin`, or with ``--exploitability``
    each model's NashConv and exploitability (:func:`~marllm.evaluation.model_strategy.evaluate_exploitability`); and
    write it as JSON to ``--out``."""
    if config.game is None:
        raise ConfigError(
            "--games, --opponent, --round-robin and --exploitability evaluate a game: the config has no game section"
        )
    if args.cross_play or args.pass_k is not None or args.samples is not None or args.limit is not None:
        raise ConfigError(
            "--cross-play, --pass-k, --samples and --limit evaluate a text task; a game config takes --games and "
            "--opponent"
        )
    config.check_references()
    for checkpoint in args.checkpoint or []:
        _warn_on_other_actions(config, checkpoint)
    if args.exploitability:
        return _exploitability(config, args)
    if args.round_robin:
        return _round_robin(config, args)
    if args.opponent:
        try:
            check_opponents(config.game, args.opponent)
        except ValueError as error:
            raise ConfigError(f"--opponent: {error}") from None
    result = evaluate_game(
        config, args.checkpoint or ["base"], args.opponent, args.games or 100, args.batch_size, config.seed
    )
    print(
        f"{config.game.name} (game.actions: {config.game.actions.mode}): each model against each opponent in "
        "each seat; rates with 95% Wilson intervals, the payoff with a 95% t interval"
    )
    print(result.to_markdown())
    _write(args.out, result.to_dict())
    return 0


def _warn_on_other_actions(config: TrainConfig, checkpoint: str) -> None:
    """Warn when a learner directory's run (RUN/checkpoints/LEARNER, whose RUN/config.yaml says) played its game with
    another ``game.actions`` than the config the evaluation plays with: its policy would be read another way. The
    run's ``game.actions`` is the mode's name, or the name and its settings (``{score: {normalization: word}}``)."""
    run_config = Path(checkpoint).parent.parent / "config.yaml"
    if checkpoint == "base" or not run_config.is_file():
        return
    trained = (yaml.safe_load(run_config.read_text()) or {}).get("game", {}).get("actions") or "generate"
    if isinstance(trained, dict):
        trained = next(iter(trained), "generate")
    assert config.game is not None
    if trained != config.game.actions.mode:
        warnings.warn(
            f"{checkpoint} was trained with game.actions: {trained}, and this evaluation plays it with "
            f"{config.game.actions.mode}; add game.actions={trained}, or evaluate with its run's config.yaml",
            stacklevel=2,
        )


def _exploitability(config: TrainConfig, args: argparse.Namespace) -> int:
    if args.round_robin or args.opponent or args.games is not None:
        raise ConfigError("--exploitability measures each model's policy exactly; it takes no --opponent, --games or "
                          "--round-robin")  # fmt: skip
    try:
        reports = evaluate_exploitability(config, args.checkpoint or ["base"], args.batch_size)
    except ValueError as error:
        raise ConfigError(f"--exploitability: {error}") from None
    print(f"{config.game.name}: NashConv (the sum of what best responses gain) and exploitability (NashConv / 2 in a "
          "two-player zero-sum game) of each model's policy, tabulated at every information state")  # fmt: skip
    for label, report in reports.items():
        print(f"{label}: {report.text()}")
    _write(args.out, {label: report.to_dict() for label, report in reports.items()})
    return 0


def _round_robin(config: TrainConfig, args: argparse.Namespace) -> int:
    checkpoints = args.checkpoint or ["base"]
    try:
        result = round_robin(
            config, checkpoints, args.opponent or [], args.games or 100, args.batch_size, config.seed
        )
    except ValueError as error:
        raise ConfigError(f"--round-robin: {error}") from None
    print(
        f"{config.game.name}: a round-robin, {args.games or 100} games per pair and seat; Bradley-Terry ratings on the "
        f"Elo scale relative to {result.players[0]}, with 95% bootstrap intervals over games"
    )
    print(result.to_markdown())
    _write(args.out, result.to_dict())
    return 0


def _write(out: str | None, results: dict) -> None:
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(results, indent=2))
