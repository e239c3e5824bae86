"""The multi-agent loop: PettingZoo's ``agent_iter`` over a wrapped env, one player per agent id.

CORY is not a code path here: it is ``SequentialTextEnv(roles=[pioneer, observer])`` wrapped by ``SharedReward`` and
``RolePermutation``, driven by the same loop as single-agent PPO. The loop reads the env only through the AEC API
(``reset``, ``agent_iter``, ``last``, ``step``): what it records of a dialogue comes from the observations and infos.
:func:`play_episode` plays one episode with any players (training, evaluation and cross-play all use it);
:func:`run_iteration` is an episode followed by one update per learner.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np
from pettingzoo import AECEnv

from marllm.algorithms.learner import Learner
from marllm.envs.info_keys import (
    BATCH_REWARDS,
    QUERIES,
    TASK_REWARDS,
    TURN_BATCH_REWARDS,
    TURN_GAMES,
    TURN_TASK_REWARDS,
)
from marllm.games.env.keys import DELTA

ROLE_TASK_REWARD = "role_task_reward"
"""Metric of an agent that spoke several times in an episode: its role's task reward (its last response's), batch
mean. Its ``task_reward`` (the learner's own metric) is the mean over all its turns' rollouts."""

TURN_TASK_REWARD = "turn_task_reward"
"""Metric prefix of an agent that spoke several times: ``turn_task_reward/<role>_<k>`` is the task reward its k-th
turn was credited with (the env's ``turn_task_rewards``), batch mean."""


class Player(Protocol):
    """What :func:`play_episode` needs of whoever plays an agent: an answer per prompt, then the rewards of each
    answer (oldest first). Every :class:`~marllm.algorithms.learner.Learner` is one; so is :class:`ActOnly`."""

    def act(self, observation: Mapping[str, Sequence[str]], role: str | None = None) -> Sequence[str]: ...

    def finish(self, rewards: Sequence[float], task_rewards: Sequence[float] | None = None) -> None: ...


class ActOnly:
    """A player that answers with ``answer(prompts)`` and learns nothing (evaluation, cross-play, replays)."""

    def __init__(self, answer: Callable[[Sequence[str]], Sequence[str]]) -> None:
        self.answer = answer

    def act(self, observation: Mapping[str, Sequence[str]], role: str | None = None) -> list[str]:
        return list(self.answer(observation["prompt"]))

    def finish(self, rewards: Sequence[float], task_rewards: Sequence[float] | None = None) -> None:
        """Nothing to learn."""


@dataclass
class Episode:
    """One played episode, as :func:`play_episode` returns it."""

    dialogues: dict[str, dict[str, Any]]
    """Per agent that acted: ``role``, ``queries`` (the batch's queries, as the env reports them under
    :data:`~marllm.envs.info_keys.QUERIES`; None if it does not) and ``turns``: per turn it spoke, its ``prompts``,
    ``responses`` and ``task_rewards`` (and its ``deltas`` where the observation has them:
    :data:`~marllm.games.env.keys.DELTA`)."""
    final_infos: dict[str, Mapping[str, Any]]
    """Each agent's info when it was done (its rewards, under the keys of :mod:`marllm.envs.info_keys`)."""
    env_seconds: float
    """Time spent in ``env.step`` (rendering prompts, scoring rewards)."""

    def task_rewards(self, agent: str) -> np.ndarray:
        """The agent's own per-dialogue task reward of the episode."""
        return np.asarray(self.final_infos[agent][TASK_REWARDS])


class _MetricsAndDialogues(NamedTuple):
    metrics: dict[str, Any]
    """``<learner>/<name>`` per learner (its update's metrics and its role) and ``time/*`` summed over learners."""
    dialogues: dict[str, dict[str, Any]]
    """Per learner, its dialogue record (:attr:`Episode.dialogues`)."""


class IterationResult(_MetricsAndDialogues):
    """What :func:`run_iteration` returns; unpacks as ``metrics, dialogues``. ``final_infos`` holds each agent's
    info when it was done (:attr:`Episode.final_infos`): what the env measured of the episode (a game's per-seat
    results, under the info keys of :mod:`marllm.games.env.keys`), read through the AEC API like everything else."""

    final_infos: dict[str, Mapping[str, Any]]

    def __new__(
        cls,
        metrics: dict[str, Any],
        dialogues: dict[str, dict[str, Any]],
        final_infos: dict[str, Mapping[str, Any]] | None = None,
    ) -> IterationResult:
        result = super().__new__(cls, metrics, dialogues)
        result.final_infos = {} if final_infos is None else final_infos
        return result


def play_episode(env: AECEnv, players: Mapping[str, Player], seed: int | None = None) -> Episode:
    """Reset ``env`` and play one episode: each agent's player answers when the agent is to move.

    Once the episode is over, every answer's rewards go to its player's ``finish`` in the order the answers were
    given, so that a player sitting in several seats gets each reward for the rollout it belongs to.
    """
    env.reset(seed=seed)
    dialogues: dict[str, dict[str, Any]] = {}
    final_infos: dict[str, Mapping[str, Any]] = {}
    acted: list[str] = []  # the agent of every answer, oldest first
    env_seconds = 0.0
    for agent in env.agent_iter():
        observation, _, terminated, truncated, info = env.last()
        if agent not in players:
            raise KeyError(f"the env's agent {agent!r} has no player; players are {sorted(players)}")
        if terminated or truncated:
            final_infos[agent] = info
            action = None
        else:
            action = players[agent].act(observation, role=info.get("role"))
            acted.append(agent)
            record = dialogues.setdefault(
                agent, {"role": info.get("role", agent), "queries": info.get(QUERIES), "turns": []}
            )
            turn = {"prompts": observation["prompt"], "responses": action}
            if DELTA in observation:  # a game played as one token sequence per seat: what each seat read, as read
                turn["deltas"] = observation[DELTA]
            record["turns"].append(turn)
        step_started = time.perf_counter()
        env.step(action)
        env_seconds += time.perf_counter() - step_started
    _finish_turns(players, acted, final_infos, dialogues)
    return Episode(dialogues, final_infos, env_seconds)


def run_iteration(
    env: AECEnv,
    learners: Mapping[str, Learner],
    seed: int | None = None,
    concurrent_updates: bool = False,
    names: Mapping[str, str] | None = None,
) -> IterationResult:
    """One episode (a batch of dialogues) then one independent update per learner (any :class:`Learner`).

    Returns the iteration's metrics (``<learner>/<name>`` and ``time/*``; for an agent that spoke several times also
    :data:`ROLE_TASK_REWARD` and one :data:`TURN_TASK_REWARD` per turn) and, per learner, its dialogue record:
    its role, the batch's queries and, per turn it spoke, the prompts, responses and task rewards. A learner
    object that plays several agents (self-play) is updated once, and its metrics go under ``names[agent]`` for the
    first of its agent ids that moved (``names``: agent id -> learner id, e.g. a game's seats; default: that agent id).

    ``concurrent_updates`` runs the learners' updates at the same time, one thread each: for learners on distinct
    devices (``agents.devices``), which share nothing an update writes. Turns cannot overlap (a turn reads the
    earlier ones), and neither can an update and a later turn: with shared rewards an agent's reward needs every
    agent's response, so updates start once the episode is over.
    """
    started = time.perf_counter()
    episode = play_episode(env, learners, seed)
    first_seat = {id(learners[agent]): agent for agent in reversed(list(learners)) if agent in episode.dialogues}
    to_update = {agent: learner for agent, learner in learners.items() if first_seat.get(id(learner)) == agent}
    if concurrent_updates and len(to_update) > 1:
        with ThreadPoolExecutor(len(to_update), thread_name_prefix="marllm-update") as pool:
            futures = {learner_id: pool.submit(learner.update) for learner_id, learner in to_update.items()}
        updates = {learner_id: future.result() for learner_id, future in futures.items()}
    else:
        updates = {learner_id: learner.update() for learner_id, learner in to_update.items()}
    metrics: dict[str, Any] = {}
    timings: dict[str, float] = defaultdict(float)
    for agent, stats in updates.items():
        name = (names or {}).get(agent, agent)
        for key, value in stats.items():
            if key.startswith("time/"):
                timings[key] += value
            else:
                metrics[f"{name}/{key}"] = value
        metrics[f"{name}/role"] = episode.dialogues[agent]["role"]
    for agent, record in episode.dialogues.items():
        metrics.setdefault(f"{agent}/role", record["role"])
    metrics.update(turn_metrics(episode))
    metrics["time/reward_s"] = episode.env_seconds
    metrics.update(timings)
    metrics["time/iteration_s"] = time.perf_counter() - started
    return IterationResult(metrics, episode.dialogues, episode.final_infos)


def turn_metrics(episode: Episode) -> dict[str, float]:
    """For each agent that spoke more than once: its role's task reward (its last response's) and each turn's, batch
    means, as ``<agent>/role_task_reward`` and ``<agent>/turn_task_reward/<role>_<k>``. A learner's own
    ``task_reward`` metric is the mean over its turns; these say which turn earned what. Agents of one turn get
    none (their ``task_reward`` is all three), nor do turns covering only some dialogues (a batched game's)."""
    metrics: dict[str, float] = {}
    for agent, record in episode.dialogues.items():
        info = episode.final_infos.get(agent, {})
        if len(record["turns"]) < 2 or TURN_GAMES in info or TASK_REWARDS not in info:
            continue
        metrics[f"{agent}/{ROLE_TASK_REWARD}"] = float(np.mean(info[TASK_REWARDS]))
        for k, turn in enumerate(record["turns"], start=1):
            metrics[f"{agent}/{TURN_TASK_REWARD}/{record['role']}_{k}"] = float(np.mean(turn["task_rewards"]))
    return metrics


def _finish_turns(
    players: Mapping[str, Player],
    acted: list[str],
    final_infos: Mapping[str, Mapping[str, Any]],
    dialogues: dict[str, dict[str, Any]],
) -> None:
    """Reward every answer of the episode in the order the answers were given (a player rewards its oldest
    unrewarded rollout), and record each turn's task rewards."""
    turns = {}
    for agent, record in dialogues.items():
        info = final_infos.get(agent, {})
        if BATCH_REWARDS not in info:
            raise KeyError(f"agent {agent!r} finished without per-dialogue {BATCH_REWARDS!r} in its info")
        trained = info.get(TURN_BATCH_REWARDS, [info[BATCH_REWARDS]])
        own = info.get(TURN_TASK_REWARDS, [info.get(TASK_REWARDS, info[BATCH_REWARDS])])
        if not len(trained) == len(own) == len(record["turns"]):
            raise ValueError(
                f"agent {agent!r} spoke {len(record['turns'])} time(s) but its info has rewards for {len(trained)} "
                "turn(s)"
            )
        turns[agent] = iter(zip(record["turns"], trained, own, strict=True))
    for agent in acted:
        turn, rewards, task_rewards = next(turns[agent])
        players[agent].finish(rewards, task_rewards)
        turn["task_rewards"] = np.asarray(task_rewards)
