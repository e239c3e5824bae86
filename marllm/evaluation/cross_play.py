"""Cross-play: every model in every role beside every partner, on held-out queries, scored by the task reward.

The queries are the task's evaluation rows; a task without any (``eval_split: null``) is played on its training
queries, and the result says so (:attr:`CrossPlayResult.queries`).

A model is the base model or a saved learner (``RUN_DIR/checkpoints/LEARNER``), so one matrix puts the pioneer of one
run beside the observer of another, or a trained learner beside the untrained base. The episodes are played through
:class:`~marllm.envs.text_env.SequentialTextEnv` with the config's roles, templates and task reward. Row ``alone`` is
each model answering in the first role (from the query only: deployed alone); row ``ROLE after P`` is each model
answering in ``ROLE`` after partner ``P`` played every earlier role.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from marllm.config import TrainConfig
from marllm.envs.text_env import SequentialTextEnv
from marllm.evaluation.deployed import HELD_OUT, build_task, checkpoint_generator, held_out_rows, queries_kind
from marllm.loop import ActOnly, play_episode
from marllm.utils.statistics import Estimate, estimate

Generate = Callable[[Sequence[str]], list[str]]
"""``generate(prompts) -> one response per prompt``: a model answering a batch of prompts."""

ALONE = "alone"


@dataclass
class CrossPlayCell:
    """The task reward of ``model`` answering in ``role`` after ``partner`` played the earlier roles."""

    role: str
    partner: str | None
    model: str
    task_reward: float
    standard_error: float
    rewards: np.ndarray

    @property
    def row(self) -> str:
        return ALONE if self.partner is None else f"{self.role} after {self.partner}"


@dataclass
class CrossPlayResult:
    """Every cell of a cross-play matrix, over ``num_queries`` queries: ``held-out`` ones, or the ``training`` ones
    of a task without evaluation rows (``queries``)."""

    roles: list[str]
    models: list[str]
    num_queries: int
    cells: list[CrossPlayCell] = field(default_factory=list)
    queries: str = HELD_OUT

    def rows(self) -> list[str]:
        """Row names in order: ``alone``, then ``ROLE after PARTNER`` for each later role and partner."""
        return [ALONE] + [f"{role} after {partner}" for role in self.roles[1:] for partner in self.models]

    def cell(self, row: str, model: str) -> CrossPlayCell:
        for cell in self.cells:
            if cell.row == row and cell.model == model:
                return cell
        raise KeyError(f"no cross-play cell for row {row!r} and model {model!r}")

    def gain(self, row: str, model: str) -> Estimate:
        """What ``model`` gains by answering after a partner: its rewards in ``row`` minus its rewards alone, paired
        over queries (the same queries, and the same sampling seed), with a 95% t interval."""
        return estimate(self.cell(row, model).rewards - self.cell(ALONE, model).rewards)

    def to_markdown(self) -> str:
        """Two markdown tables: the mean task reward (standard error over queries) of each cell, and each later
        row's paired gain over answering alone, with its 95% interval."""
        header = ["| | " + " | ".join(self.models) + " |", "|---" * (len(self.models) + 1) + "|"]
        lines = list(header)
        for row in self.rows():
            values = [self.cell(row, model) for model in self.models]
            lines.append(
                f"| {row} | " + " | ".join(f"{c.task_reward:.3f} ({c.standard_error:.3f})" for c in values) + " |"
            )
        if len(self.rows()) > 1:
            lines += ["", "gain over answering alone, paired over queries: mean [95% interval]", "", *header]
            for row in self.rows()[1:]:
                gains = [self.gain(row, model) for model in self.models]
                lines.append(f"| {row} | " + " | ".join(interval(g, signed=True) for g in gains) + " |")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "roles": self.roles,
            "models": self.models,
            "num_queries": self.num_queries,
            "queries": self.queries,
            "cells": [
                {
                    "row": c.row,
                    "role": c.role,
                    "partner": c.partner,
                    "model": c.model,
                    "task_reward": c.task_reward,
                    "standard_error": c.standard_error,
                    "rewards": c.rewards.tolist(),
                }
                for c in self.cells
            ],
        }


def cross_play(
    env: SequentialTextEnv,
    models: Sequence[str],
    load: Callable[[str], Generate],
    seed: int = 0,
    progress: bool = True,
    queries: str = HELD_OUT,
) -> CrossPlayResult:
    """Play the cross-play matrix of ``models`` on one batch of ``env`` (its batch is the held-out queries, or what
    ``queries`` says they are).

    Each model is loaded twice (``load(name)`` returns its generate function; it is dropped before the next is
    loaded): once to play every role itself, which gives its ``alone`` cell, its diagonal and the partner texts that
    others read, and once to answer every later role after each other partner. Every generation call starts from
    ``torch.manual_seed(seed)``, so that the cells of one row differ only by the model.
    """
    names = list(models)
    if not names:
        raise ValueError("cross-play needs at least one model")
    check_distinct_names(names, "cross-play models")
    roles = list(env.possible_agents)
    result = CrossPlayResult(roles, names, env.batch_size, queries=queries)
    own_texts: dict[str, dict[str, list[str]]] = {}
    steps = len(names) + len(names) * (len(names) - 1) * (len(roles) - 1)
    bar = tqdm(total=steps, desc="cross-play", disable=not progress)
    for name in names:
        generate = load(name)
        own_texts[name] = {}
        episode = _play(env, seed, [(role, _generating(generate, seed)) for role in roles], own_texts[name])
        result.cells.extend(_cell(episode, role, None if k == 0 else name, name) for k, role in enumerate(roles))
        del generate
        bar.update(1)
    for name in names:
        if len(roles) == 1 or len(names) == 1:
            break
        generate = load(name)
        for partner in names:
            if partner == name:
                continue
            for k in range(1, len(roles)):
                lineup = [(role, _replaying(own_texts[partner][role])) for role in roles[:k]]
                lineup.append((roles[k], _generating(generate, seed)))
                # Later roles replay the partner's texts: their rewards are not read, but the episode must end.
                lineup += [(role, _replaying(own_texts[partner][role])) for role in roles[k + 1 :]]
                episode = _play(env, seed, lineup, {})
                result.cells.append(_cell(episode, roles[k], partner, name))
                bar.update(1)
        del generate
    bar.close()
    order = {row: i for i, row in enumerate(result.rows())}
    result.cells.sort(key=lambda c: (order[c.row], names.index(c.model)))
    return result


def check_distinct_names(names: Sequence[str], what: str) -> None:
    """Models are told apart by name in a result: ``what`` (e.g. ``cross-play models``) must not repeat one."""
    duplicates = sorted({n for n in names if list(names).count(n) > 1})
    if duplicates:
        raise ValueError(f"{what} must have distinct names; {duplicates} appear twice")


def _generating(generate: Generate, seed: int) -> Generate:
    def answer(prompts: Sequence[str]) -> list[str]:
        torch.manual_seed(seed)
        return list(generate(prompts))

    return answer


def _replaying(texts: list[str]) -> Generate:
    return lambda prompts: list(texts)


def _play(
    env: SequentialTextEnv, seed: int, lineup: list[tuple[str, Generate]], record: dict[str, list[str]]
) -> dict[str, np.ndarray]:
    """One episode with ``lineup[k]`` answering role k; returns each role's per-query task rewards."""
    players = {role: ActOnly(_recording(generate, role, record)) for role, generate in lineup}
    episode = play_episode(env, players, seed)
    return {agent: episode.task_rewards(agent) for agent in episode.final_infos}


def _recording(generate: Generate, role: str, record: dict[str, list[str]]) -> Generate:
    def answer(prompts: Sequence[str]) -> list[str]:
        record[role] = texts = generate(prompts)
        return texts

    return answer


def _cell(episode: dict[str, np.ndarray], role: str, partner: str | None, model: str) -> CrossPlayCell:
    rewards = episode[role]
    error = float(rewards.std(ddof=1) / np.sqrt(rewards.size)) if rewards.size > 1 else float("nan")
    return CrossPlayCell(role, partner, model, float(rewards.mean()), error, rewards)


def interval(value: Estimate, signed: bool = False) -> str:
    """``mean [low, high]`` to three decimals, the mean alone where the interval is undefined; ``signed``: each
    number with its sign (a gain)."""
    spec = "+.3f" if signed else ".3f"
    if value.low is None or value.high is None:
        return f"{value.mean:{spec}}"
    return f"{value.mean:{spec}} [{value.low:{spec}}, {value.high:{spec}}]"


def checkpoint_label(checkpoint: str) -> str:
    """``base``, ``RUN/LEARNER`` for ``.../RUN/checkpoints/LEARNER``, else the path as given."""
    if checkpoint == "base":
        return checkpoint
    path = Path(checkpoint)
    if path.parent.name == "checkpoints":
        return f"{path.parent.parent.name}/{path.name}"
    return checkpoint


def expand_checkpoints(entries: Iterable[str]) -> list[str]:
    """``base``, learner directories, and run directories (each becomes every learner under its ``checkpoints/``).

    Raises:
        FileNotFoundError: an entry is neither ``base`` nor an existing directory, or a run has no saved learner.
    """
    expanded = []
    for entry in entries:
        path = Path(entry)
        if entry == "base":
            expanded.append(entry)
        elif (path / "checkpoints").is_dir():
            learners = sorted(p for p in (path / "checkpoints").iterdir() if p.is_dir())
            if not learners:
                raise FileNotFoundError(
                    f"run directory {entry!r} has no saved learner under checkpoints/ (a run exports its learners "
                    "there when it ends, with logging.save_checkpoint: true)"
                )
            expanded.extend(str(p) for p in learners)
        elif path.is_dir() and (path / "training_state").is_dir():  # a run that exported nothing
            raise FileNotFoundError(
                f"run directory {entry!r} has no saved learner (no checkpoints/): a run exports its learners when "
                "it ends, with logging.save_checkpoint: true; finish it with marllm train --resume, or give "
                "RUN_DIR/checkpoints/LEARNER of another run"
            )
        elif path.is_dir():
            expanded.append(entry)
        else:
            raise FileNotFoundError(
                f"{entry!r} is neither 'base', a run directory (with checkpoints/) nor a learner directory "
                "(RUN_DIR/checkpoints/LEARNER)"
            )
    return expanded


def checkpoint_env(
    config: TrainConfig, checkpoints: Sequence[str], num_queries: int | None, batch_size: int, what: str
) -> tuple[SequentialTextEnv, list[str], Callable[[str], Generate], str]:
    """What an evaluation of saved models plays: the env of ``config``'s task on its first ``num_queries`` held-out
    queries (None: all; see :func:`held_out_rows`) as one batch, with the config's roles, turn order, templates and
    task reward; the models' names (:func:`checkpoint_label` of each of :func:`expand_checkpoints`); ``load(name)``,
    the generate function of a named model (:func:`checkpoint_generator`, ``batch_size`` prompts per call); and what
    the queries are (:func:`queries_kind`).

    Raises:
        ValueError: ``num_queries`` is below 1 (``what`` names the evaluation in the message).
        FileNotFoundError: as :func:`expand_checkpoints`.
    """
    if num_queries is not None and num_queries < 1:
        raise ValueError(f"{what} needs at least one query, got num_queries={num_queries}")
    paths = expand_checkpoints(checkpoints)
    labels = [checkpoint_label(p) for p in paths]
    by_label = dict(zip(labels, paths, strict=True))
    task = build_task(config)
    rows = held_out_rows(task, num_queries)
    env = SequentialTextEnv(
        rows,
        config.env.roles,
        config.role_templates(task.templates),
        task.reward_fn,
        batch_size=len(rows),
        turns=config.env.turns,
        turn_rewards=config.env.turn_rewards,
    )

    def load(label: str) -> Generate:
        return checkpoint_generator(config, by_label[label], label, batch_size)

    return env, labels, load, queries_kind(task, config.task)


def cross_play_of_checkpoints(
    config: TrainConfig,
    checkpoints: Sequence[str],
    num_queries: int | None = None,
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = True,
) -> CrossPlayResult:
    """Cross-play of the base model and saved learners on the first ``num_queries`` held-out queries (None: all) of
    ``config``'s task, with its roles, templates, task reward and generation settings.

    ``checkpoints`` holds ``base``, ``RUN_DIR/checkpoints/LEARNER`` directories and run directories (every learner
    of the run). Each model answers with its own tokenizer (see :func:`load_deployed_model`).
    """
    # Checked first: past it every role speaks once, so the env's turns and turn_rewards change no reward.
    if config.speaking_order != config.env.roles:
        raise ValueError(
            f"cross-play puts one model in each role, which speaks once; env.turns {config.env.turns} lets a role "
            f"speak several times (evaluate such runs with marllm eval without --cross-play)"
        )
    env, labels, load, queries = checkpoint_env(config, checkpoints, num_queries, batch_size, "cross-play")
    return cross_play(env, labels, load, seed, progress, queries)
