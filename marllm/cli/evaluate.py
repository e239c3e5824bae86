"""``marllm eval``: its arguments and what it runs (task rewards, pass@k, cross-play, or a game's matches)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from marllm.cli.arguments import positive_int as _positive_int
from marllm.config import load_config
from marllm.config.loading import ConfigError


def run_eval(args: argparse.Namespace) -> int:
    from marllm.cli.eval_game import eval_game  # torch: kept out of `marllm --help`
    from marllm.evaluation import cross_play, deployed, task_rewards  # torch: kept out of `marllm --help`

    config = load_config(args.config, args.overrides)
    if args.checkpoint:  # a run directory stands for every learner it saved, in every mode
        args.checkpoint = cross_play.expand_checkpoints(args.checkpoint)
    game_flags = args.games is not None or args.opponent is not None or args.round_robin or args.exploitability
    if config.game is not None or game_flags:
        return eval_game(config, args)
    if args.cross_play and (args.pass_k is not None or args.samples is not None):
        raise ConfigError("--pass-k and --samples belong to pass@k; --cross-play scores one answer per query")
    config.check_references()
    if args.cross_play:
        result = cross_play.cross_play_of_checkpoints(
            config, args.checkpoint or ["base"], args.limit, args.batch_size, config.seed
        )
        print(f"task reward over {result.num_queries} {result.queries} queries, mean (standard error); columns: the "
              f"model answering, rows: its role and the partner that played the earlier roles")
        print(result.to_markdown())
        results: Any = result.to_dict()
    elif args.pass_k is None and args.samples is None:
        rewards = task_rewards.task_rewards_of_checkpoints(
            config, args.checkpoint or ["base"], args.limit, args.batch_size, config.seed
        )
        print(rewards.describe())
        print(rewards.to_markdown())
        results = rewards.to_dict()
    else:
        pass_k = args.pass_k or "1"
        try:
            ks = [int(k) for k in pass_k.split(",")]
        except ValueError as error:
            raise ConfigError(f"--pass-k must be comma-separated integers like 1,5,10, got {pass_k!r}") from error
        results = []
        for checkpoint in args.checkpoint or ["base"]:
            result = deployed.evaluate_pass_at_k(
                config, checkpoint, ks, args.samples or 1, args.limit, args.batch_size, config.seed
            )
            results.append(result.to_dict())
            print(json.dumps(result.to_dict()))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0



def add_eval(commands: Any) -> None:
    evaluate = commands.add_parser(
        "eval",
        help="the task reward of each role and turn for the base model or trained agents playing every role; with "
        "--pass-k their pass@k deployed alone, with --cross-play their cross-play matrix",
    )
    evaluate.add_argument("config", help="the run's YAML config (task, roles, templates, model, generation settings)")
    evaluate.add_argument("overrides", nargs="*", default=[], help="dotted overrides")
    evaluate.add_argument(
        "--checkpoint",
        action="append",
        help="RUN_DIR/checkpoints/LEARNER, 'base', or a RUN_DIR for all its learners (repeatable; default: base)",
    )
    evaluate.add_argument(
        "--cross-play",
        action="store_true",
        help="put every checkpoint in every role beside every other as partner and print the task-reward matrix",
    )
    evaluate.add_argument(
        "--pass-k",
        default=None,
        help="pass@k of each model deployed alone, for tasks with a 0/1 reward: comma-separated k values, e.g. 1,5,10 "
        "(default with --samples: 1)",
    )
    evaluate.add_argument(
        "--samples", type=_positive_int, default=None, help="samples per problem (n >= max k; default: 1)"
    )
    evaluate.add_argument(
        "--limit", type=_positive_int, default=None, help="evaluate only the first N problems or queries (default: all)"
    )
    evaluate.add_argument("--batch-size", type=_positive_int, default=64, help="sequences per generate call")
    evaluate.add_argument(
        "--games", type=_positive_int, default=None, help="a game config: games per model, opponent and seat (100)"
    )
    evaluate.add_argument(
        "--opponent",
        action="append",
        help="a game config: random, minimax, mcts, cfr or self (repeatable; default: random, minimax for "
        "tic-tac-toe, self for a social dilemma)",
    )
    evaluate.add_argument(
        "--round-robin",
        action="store_true",
        help="a two-seat game config: every checkpoint and --opponent plays every other in both seats, rated by "
        "Bradley-Terry (Elo scale, 95%% bootstrap intervals, the first rated 0)",
    )
    evaluate.add_argument(
        "--exploitability",
        action="store_true",
        help="a small OpenSpiel game config (Kuhn, Leduc poker, matrix games, small repeated games): each model's "
        "NashConv and exploitability, its policy tabulated at every information state "
        "(the mode's exploitability_samples answers per state under game.actions: generate or think)",
    )
    evaluate.add_argument("--out", default=None, help="also write the results as JSON here")
    evaluate.set_defaults(handler=run_eval)


