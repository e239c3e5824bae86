"""The multi-agent training loop: PettingZoo's ``agent_iter`` over a wrapped text env, one learner per agent id.

CORY is not a code path here: it is ``SequentialTextEnv(roles=[pioneer, observer])`` wrapped by ``SharedReward`` and
``RolePermutation``, driven by the same loop as single-agent PPO. The loop reads the env only through the AEC API
(``reset``, ``agent_iter``, ``last``, ``step``): what it records of a dialogue comes from the observations and infos.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
from pettingzoo import AECEnv

from marllm.algorithms.learner import Learner
from marllm.envs.info_keys import BATCH_REWARDS, QUERIES, TASK_REWARDS, TURN_BATCH_REWARDS, TURN_TASK_REWARDS


class IterationResult(NamedTuple):
    """What :func:`run_iteration` returns; unpacks as ``metrics, dialogues``."""

    metrics: dict[str, Any]
    """``<learner>/<name>`` per learner (its update's metrics and its role) and ``time/*`` summed over learners."""
    dialogues: dict[str, dict[str, Any]]
    """Per learner: ``role``, ``queries`` (the batch's queries, as the env reports them under
    :data:`~marllm.envs.info_keys.QUERIES`; None if it does not) and ``turns``: per turn it spoke, its
    ``prompts``, ``responses`` and ``task_rewards``."""


def run_iteration(
    env: AECEnv, learners: Mapping[str, Learner], seed: int | None = None, concurrent_updates: bool = False
) -> IterationResult:
    """One episode (a batch of dialogues) then one independent update per learner (any :class:`Learner`).

    Returns the iteration's metrics (``<learner>/<name>`` and ``time/*``) and, per learner, its dialogue record:
    its role, the batch's queries and, per turn it spoke, the prompts, responses and task rewards.

    ``concurrent_updates`` runs the learners' updates at the same time, one thread each: for learners on distinct
    devices (``agents.devices``), which share nothing an update writes. Turns cannot overlap (a turn reads the
    earlier ones), and neither can an update and a later turn: with shared rewards an agent's reward needs every
    agent's response, so updates start once the episode is over.
    """
    started = time.perf_counter()
    env.reset(seed=seed)
    dialogues: dict[str, dict[str, Any]] = {}
    env_time = 0.0
    for agent in env.agent_iter():
        observation, _, terminated, truncated, info = env.last()
        if agent not in learners:
            raise KeyError(f"the env's agent {agent!r} has no learner; learners are {sorted(learners)}")
        if terminated or truncated:
            _finish_turns(learners[agent], agent, info, dialogues[agent])
            action = None
        else:
            action = learners[agent].act(observation, role=info.get("role"))
            record = dialogues.setdefault(
                agent, {"role": info.get("role", agent), "queries": info.get(QUERIES), "turns": []}
            )
            record["turns"].append({"prompts": observation["prompt"], "responses": action})
        step_started = time.perf_counter()
        env.step(action)
        env_time += time.perf_counter() - step_started

    metrics: dict[str, Any] = {}
    timings: dict[str, float] = defaultdict(float)
    if concurrent_updates and len(learners) > 1:
        with ThreadPoolExecutor(len(learners), thread_name_prefix="marllm-update") as pool:
            futures = {learner_id: pool.submit(learner.update) for learner_id, learner in learners.items()}
        updates = {learner_id: future.result() for learner_id, future in futures.items()}
    else:
        updates = {learner_id: learner.update() for learner_id, learner in learners.items()}
    for learner_id, stats in updates.items():
        for key, value in stats.items():
            if key.startswith("time/"):
                timings[key] += value
            else:
                metrics[f"{learner_id}/{key}"] = value
        metrics[f"{learner_id}/role"] = dialogues[learner_id]["role"]
    metrics["time/reward_s"] = env_time
    metrics.update(timings)
    metrics["time/iteration_s"] = time.perf_counter() - started
    return IterationResult(metrics, dialogues)


def _finish_turns(learner: Learner, agent: str, info: Mapping[str, Any], record: dict[str, Any]) -> None:
    """Reward each of the agent's turns of the episode, oldest first, as its learner's rollouts are queued."""
    if BATCH_REWARDS not in info:
        raise KeyError(f"agent {agent!r} finished without per-dialogue {BATCH_REWARDS!r} in its info")
    trained = info.get(TURN_BATCH_REWARDS, [info[BATCH_REWARDS]])
    own = info.get(TURN_TASK_REWARDS, [info.get(TASK_REWARDS, info[BATCH_REWARDS])])
    if not len(trained) == len(own) == len(record["turns"]):
        raise ValueError(
            f"agent {agent!r} spoke {len(record['turns'])} time(s) but its info has rewards for {len(trained)} turn(s)"
        )
    for turn, rewards, task_rewards in zip(record["turns"], trained, own, strict=True):
        learner.finish(rewards, task_rewards)
        turn["task_rewards"] = np.asarray(task_rewards)
