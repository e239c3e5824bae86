"""The task reward of each model playing every role: the mean, with its 95% interval, of each role and each turn.

A model is the base model or a saved learner (``RUN_DIR/checkpoints/LEARNER``); each one plays a whole episode by
itself, in every role and every turn, on the same queries (the task's evaluation rows, else its training rows), with
the config's roles, turn order, templates, task reward and generation settings. The episode is played through
:func:`marllm.loop.play_episode` with :class:`~marllm.loop.ActOnly` players, as in training, so multi-turn configs
and role-aware rewards are scored exactly as the env scores them in training: a role's reward is its last response's
(row ``ROLE``), and a role that speaks several times also has a row per turn (``ROLE_K``, the env's
``turn_task_rewards``: each turn's own response's reward, or with ``env.turn_rewards: last`` the role's last one).
This is what ``marllm eval`` prints without ``--cross-play`` or ``--pass-k``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from marllm.config import TrainConfig
from marllm.envs.info_keys import TASK_REWARDS
from marllm.envs.text_env import SequentialTextEnv
from marllm.envs.turns import turn_names
from marllm.evaluation.cross_play import Generate, check_distinct_names, checkpoint_env, interval
from marllm.evaluation.deployed import HELD_OUT
from marllm.loop import ActOnly, play_episode
from marllm.utils.statistics import Estimate, estimate


@dataclass
class TaskRewardResult:
    """Each model's task rewards: per row (a role, or one turn of a role that speaks several times), the reward of
    every query.

    Attributes:
        roles: the env's roles.
        turns: the speaking order.
        models: the models' names, in the order given.
        num_queries: the queries each model answered.
        queries: ``held-out`` (the task's evaluation rows) or ``training`` (a task without any: its training rows).
        rewards: ``rewards[model][row]``, one reward per query.
    """

    roles: list[str]
    turns: list[str]
    models: list[str]
    num_queries: int
    queries: str = HELD_OUT
    rewards: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def rows(self) -> list[str]:
        """Each role, each followed by its turns' rows when it speaks more than once (``proposer``,
        ``proposer_1``, ``proposer_2``, ``critic``)."""
        names = turn_names(self.turns)
        rows = []
        for role in self.roles:
            rows.append(role)
            own = [name for speaker, name in zip(self.turns, names, strict=True) if speaker == role]
            if len(own) > 1:
                rows += own
        return rows

    def estimate(self, row: str, model: str) -> Estimate:
        """The mean reward of ``model`` in ``row`` over the queries, with its 95% t interval."""
        return estimate(self.rewards[model][row])

    def to_markdown(self) -> str:
        """A markdown table: rows as :meth:`rows`, a column per model, cells ``mean [95% interval]``."""
        lines = ["| | " + " | ".join(self.models) + " |", "|---" * (len(self.models) + 1) + "|"]
        for row in self.rows():
            label = row if row in self.roles else f"{row} (turn)"
            cells = [interval(self.estimate(row, model)) for model in self.models]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def describe(self) -> str:
        """One line saying what the table holds."""
        return (
            f"task reward over {self.num_queries} {self.queries} queries, mean [95% interval]; columns: the model "
            "playing every role, rows: each role (its last response's reward) and, for a role that speaks several "
            "times, each of its turns"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "roles": self.roles,
            "turns": self.turns,
            "models": self.models,
            "num_queries": self.num_queries,
            "queries": self.queries,
            "cells": [
                {
                    "row": row,
                    "role": row if row in self.roles else self.turns[turn_names(self.turns).index(row)],
                    "turn": None if row in self.roles else row,
                    "model": model,
                    **self.estimate(row, model).as_dict(),
                    "rewards": self.rewards[model][row].tolist(),
                }
                for row in self.rows()
                for model in self.models
            ],
        }


def task_rewards(
    env: SequentialTextEnv,
    models: Sequence[str],
    load: Callable[[str], Generate],
    seed: int = 0,
    queries: str = HELD_OUT,
    progress: bool = False,
) -> TaskRewardResult:
    """Each of ``models`` plays one episode of ``env`` alone, in every role (``load(name)`` returns its generate
    function, dropped before the next model loads); ``env``'s batch is the evaluation's queries. Every model's
    episode starts from ``torch.manual_seed(seed)`` and ``env.reset(seed=seed)``, so that all models answer the
    same queries. ``queries`` says what they are (``held-out`` or ``training``), for the table's title."""
    names = list(models)
    if not names:
        raise ValueError("the evaluation needs at least one model")
    check_distinct_names(names, "the evaluated models")
    result = TaskRewardResult(list(env.roles), list(env.turns), names, env.batch_size, queries)
    all_turns = turn_names(env.turns)
    for name in tqdm(names, desc="task reward", disable=not progress):
        generate = load(name)
        torch.manual_seed(seed)
        player = ActOnly(generate)
        episode = play_episode(env, dict.fromkeys(env.possible_agents, player), seed)
        rows: dict[str, np.ndarray] = {}
        for role in env.roles:
            rows[role] = np.asarray(episode.final_infos[role][TASK_REWARDS], dtype=np.float64)
            own = [turn for speaker, turn in zip(env.turns, all_turns, strict=True) if speaker == role]
            if len(own) > 1:
                for turn, record in zip(own, episode.dialogues[role]["turns"], strict=True):
                    rows[turn] = np.asarray(record["task_rewards"], dtype=np.float64)
        result.rewards[name] = rows
        del generate, player
    return result


def task_rewards_of_checkpoints(
    config: TrainConfig,
    checkpoints: Sequence[str],
    num_queries: int | None = None,
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = True,
) -> TaskRewardResult:
    """:func:`task_rewards` of the base model and saved learners on the first ``num_queries`` evaluation queries
    (None: all) of ``config``'s task, with its roles, turn order, templates, task reward and generation settings.

    ``checkpoints`` holds ``base``, ``RUN_DIR/checkpoints/LEARNER`` directories and run directories (every learner
    of the run), each named as in cross-play (``base``, ``RUN/LEARNER``).
    """
    env, labels, load, queries = checkpoint_env(config, checkpoints, num_queries, batch_size, "the evaluation")
    return task_rewards(env, labels, load, seed, queries, progress)
