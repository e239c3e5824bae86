"""The NashConv and exploitability of deployed models (the base, or a run's checkpoints) in a config's game: what
``marllm eval --exploitability`` reports, tabulated as :mod:`marllm.games.strategy` tabulates a learner."""

from __future__ import annotations

from collections.abc import Sequence

from marllm.config import TrainConfig
from marllm.evaluation.deployed import load_deployed_model
from marllm.games.exploitability import ExploitabilityReport
from marllm.games.model_player import ModelPlayer
from marllm.games.strategy import exact_game, game_policy_source


def evaluate_exploitability(
    config: TrainConfig, checkpoints: Sequence[str] = ("base",), batch_size: int = 256
) -> dict[str, ExploitabilityReport]:
    """The NashConv and exploitability of each model of ``checkpoints`` (``base`` or ``RUN_DIR/checkpoints/LEARNER``)
    in the config's game, by label.

    Raises:
        ValueError: the config has no game section, or its game is not a small OpenSpiel game.
    """
    game = config.game
    if game is None:
        raise ValueError("evaluate_exploitability needs a config with a game section")
    config.check_game()  # its settings against the game, before anything loads
    exact = exact_game(game)
    reports = {}
    for checkpoint in checkpoints:
        model, label, tokenizer = load_deployed_model(config, checkpoint)
        model.eval()
        player = ModelPlayer.of_run(label, model, tokenizer, config)
        reports[label] = exact.evaluate(game_policy_source(game, player, batch_size))
        del model
    return reports
