"""``marllm eval`` of a game config: each model against each fixed opponent, in each seat."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from marllm.config import TrainConfig
from marllm.config.loading import ConfigError


def eval_game(config: TrainConfig, args: argparse.Namespace) -> int:
    """Print the win/draw/loss/illegal-move table of :func:`~marllm.evaluation.games.evaluate_game` (and write it as
    JSON to ``--out``)."""
    if config.game is None:
        raise ConfigError("--games and --opponent evaluate a game: the config has no game section")
    if args.cross_play or args.pass_k is not None or args.samples is not None or args.limit is not None:
        raise ConfigError(
            "--cross-play, --pass-k, --samples and --limit evaluate a text task; a game config takes --games and "
            "--opponent"
        )
    config.check_references()
    from marllm.evaluation.games import check_opponents, evaluate_game

    if args.opponent:
        try:
            check_opponents(config.game, args.opponent)
        except ValueError as error:
            raise ConfigError(f"--opponent: {error}") from None
    result = evaluate_game(
        config, args.checkpoint or ["base"], args.opponent, args.games or 100, args.batch_size, config.seed
    )
    print(
        f"{config.game.name}: each model against each opponent in each seat; rates with 95% Wilson intervals, the "
        "payoff with a 95% t interval"
    )
    print(result.to_markdown())
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result.to_dict(), indent=2))
    return 0
