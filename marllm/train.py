"""The multi-agent training loop: PettingZoo's ``agent_iter`` over a wrapped text env, one learner per agent id.

CORY is not a code path here: it is ``SequentialTextEnv(roles=[pioneer, observer])`` wrapped by ``SharedReward`` and
``RolePermutation``, driven by the same loop as single-agent PPO.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from pettingzoo import AECEnv
from tqdm.auto import tqdm

from marllm.algorithms.critic_free_config import CriticFreeConfig
from marllm.algorithms.critic_free_learner import CriticFreeLearner
from marllm.algorithms.learner import Learner
from marllm.algorithms.ppo import NonFiniteLossError, PPOLearner
from marllm.algorithms.ppo_config import GenerationConfig, PPOConfig
from marllm.assets import resolve_model
from marllm.checkpoint import CheckpointInfo, latest_checkpoint, load_checkpoint, save_checkpoint
from marllm.config import TrainConfig, per_learner, resume_differences
from marllm.config_loading import ConfigError
from marllm.envs.info_keys import BATCH_REWARDS, TASK_REWARDS, TURN_BATCH_REWARDS, TURN_TASK_REWARDS
from marllm.envs.tasks.base import TaskParts
from marllm.envs.templates import as_prompt_fn
from marllm.envs.text_env import env as text_env
from marllm.interrupts import StopSignals, TrainingInterrupted
from marllm.models.generation import generate_responses
from marllm.models.lora import LoraSettings, attach_adapters
from marllm.models.policy import ReferencePool, context_length, load_causal_lm, load_tokenizer
from marllm.run_dir import (
    CONFIG_FILE,
    END_OF_RUN_FILES,
    EVAL_FILE,
    EXPORT_DIR,
    METRICS_FILE,
    PASS_AT_K_FILE,
    RUN_FILE,
    RUN_FILES,
    SAMPLES_FILE,
    RunDirError,
    RunLog,
    check_can_start,
    create_run_dir,
    keep_iterations_before,
    read_run_info,
    read_run_state,
    remove_run_files,
    update_run_info,
    write_atomic,
    write_run_info,
)
from marllm.wrappers import RolePermutation, SharedReward

KL_METRIC = "full-vocabulary KL(policy || reference) summed over response tokens, batch mean"


@dataclass
class Setup:
    """Everything a run needs, built from a config."""

    config: TrainConfig
    env: AECEnv
    learners: dict[str, Learner]
    task: TaskParts
    reference: Any
    tokenizer: Any


@dataclass
class TrainResult:
    """What :func:`train` returns: the run directory, every iteration's metrics (for a resumed run, also those
    logged before the checkpoint it resumed from) and the end-of-run evaluation rows."""

    run_dir: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    eval_rows: list[dict[str, Any]] = field(default_factory=list)


def build_env(config: TrainConfig, task: TaskParts) -> AECEnv:
    """The text env of ``config``, wrapped by SharedReward (if rewards are shared) and RolePermutation."""
    env = text_env(
        dataset=task.dataset,
        roles=config.env.roles,
        templates=config.role_templates(task.templates),
        reward_fn=task.reward_fn,
        batch_size=config.env.batch_size,
        group_size=config.env.group_size,
        turns=config.env.turns,
        turn_rewards=config.env.turn_rewards,
    )
    coefficients = config.coefficient_matrix()
    if coefficients is not None:
        env = SharedReward(env, coefficients)
    return RolePermutation(env, config.agents.role_period, config.learner_ids)


def build(config: TrainConfig) -> Setup:
    """Load the base model once per learner plus one shared reference per base, the task, and the wrapped env.

    The model, reward model and dataset references are checked first, before anything loads.
    """
    config.check_references()
    torch.manual_seed(config.seed)
    model_path = resolve_model(config.model.name_or_path)
    tokenizer = load_tokenizer(model_path, trust_remote_code=config.model.trust_remote_code)
    task = config.task.build(tokenizer, config.seed, config.model.device)
    env = build_env(config, task)
    learners, reference = make_learners(
        config.learner_models() if config.agents.models else model_path,
        config.learner_ids,
        config.ppo,
        config.generation,
        config.seed,
        config.model.dtype,
        config.model.device,
        None if config.agents.models else tokenizer,
        lora=config.model.lora,
        load_in_4bit=config.model.load_in_4bit,
        trust_remote_code=config.model.trust_remote_code,
        algorithm=config.learner_algorithms(),
        critic_free=config.critic_free,
        group_size=config.env.group_size,
    )
    return Setup(config, env, learners, task, reference, tokenizer)


def make_learners(
    model: str | Mapping[str, str],
    learner_ids: Sequence[str],
    ppo: PPOConfig | None = None,
    generation: GenerationConfig | None = None,
    seed: int = 0,
    dtype: str = "float32",
    device: str = "auto",
    tokenizer: Any = None,
    lora: LoraSettings | None = None,
    load_in_4bit: bool = False,
    trust_remote_code: bool = False,
    references: ReferencePool | None = None,
    algorithm: str | Mapping[str, str] = "ppo",
    critic_free: CriticFreeConfig | None = None,
    group_size: int = 1,
) -> tuple[dict[str, PPOLearner], Any]:
    """One PPO learner per id, each starting from its base model: ``model`` for all (a hub id, a local directory or a
    ``marllm:`` causal LM), or a mapping learner id -> model (heterogeneous agents; each base brings its tokenizer).

    Full models: each learner owns a copy and the learners of one base share one frozen reference from
    ``references`` (N policies + 1 reference per base). LoRA: one base carries one adapter per learner that starts
    from it, and the reference is that base with adapters disabled. Returns the learners (keyed by id) and the
    separate reference model: one model when every learner shares one base, None for LoRA, and a dict base ->
    reference for several bases.
    ``tokenizer`` (optional) is the tokenizer of a single ``model``; with several bases each loads its own.
    ``seed`` seeds each learner's initial value head, its response lengths and mini-batch order, and leaves torch's
    global generator (which samples the responses) in a state that depends on ``seed`` alone.
    ``trust_remote_code`` lets transformers run the Python code a hub model ships with (only for code you trust).
    ``algorithm`` (one for all, or per learner id; ``ppo`` where not named) picks :class:`PPOLearner` or a
    :class:`CriticFreeLearner` (``grpo``, ``rloo``, ``reinforce_pp``) with ``critic_free`` settings and the env's
    ``group_size``.
    """
    algorithms = per_learner(algorithm, learner_ids, "ppo")

    def learner(learner_id: str, *args: Any, **kwargs: Any) -> PPOLearner:
        if algorithms[learner_id] == "ppo":
            return PPOLearner(learner_id, *args, **kwargs)
        return CriticFreeLearner(
            learner_id, *args, algorithm=algorithms[learner_id], group_size=group_size, settings=critic_free, **kwargs
        )

    models = {learner_id: model for learner_id in learner_ids} if isinstance(model, str) else dict(model)
    missing = [learner_id for learner_id in learner_ids if learner_id not in models]
    if missing:
        raise ValueError(f"make_learners: no model for learner(s) {missing}; the mapping names {sorted(models)}")
    bases = list(dict.fromkeys(models[learner_id] for learner_id in learner_ids))
    if tokenizer is not None and len(bases) > 1:
        raise ValueError("make_learners: a tokenizer can be given for a single model only; each base loads its own")
    references = references if references is not None else ReferencePool()
    seeds = {learner_id: seed + i for i, learner_id in enumerate(learner_ids)}
    learners: dict[str, PPOLearner] = {}
    base_references: dict[str, Any] = {}
    for base in bases:
        group = [learner_id for learner_id in learner_ids if models[learner_id] == base]
        path = resolve_model(base)
        base_tokenizer = tokenizer or load_tokenizer(path, trust_remote_code=trust_remote_code)
        if lora is not None:
            torch.manual_seed(seeds[group[0]])
            shared = load_causal_lm(path, dtype, device, load_in_4bit=load_in_4bit, trust_remote_code=trust_remote_code)
            shared = attach_adapters(shared, group, lora)
            for learner_id in group:
                learners[learner_id] = learner(
                    learner_id, shared, base_tokenizer, None, ppo, generation, seeds[learner_id], adapter=learner_id
                )
            continue
        reference = references.get(path, dtype, device, trust_remote_code=trust_remote_code)
        base_references[base] = reference
        for learner_id in group:
            torch.manual_seed(seeds[learner_id])
            policy = load_causal_lm(path, dtype, device, trust_remote_code=trust_remote_code)
            learners[learner_id] = learner(
                learner_id, policy, base_tokenizer, reference, ppo, generation, seeds[learner_id]
            )
    ordered = {learner_id: learners[learner_id] for learner_id in learner_ids}
    if lora is not None:
        return ordered, None
    return ordered, base_references[bases[0]] if len(bases) == 1 else base_references


def run_iteration(
    env: AECEnv, learners: Mapping[str, Learner], seed: int | None = None
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """One episode (a batch of dialogues) then one independent update per learner (any :class:`Learner`).

    Returns the iteration's metrics (``<learner>/<name>`` and ``time/*``) and, per learner, its dialogue record:
    its role and, per turn it spoke, the prompts, responses and task rewards.
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
            record = dialogues.setdefault(agent, {"role": info.get("role", agent), "turns": []})
            record["turns"].append({"prompts": observation["prompt"], "responses": action})
        step_started = time.perf_counter()
        env.step(action)
        env_time += time.perf_counter() - step_started

    metrics: dict[str, Any] = {}
    timings: dict[str, float] = defaultdict(float)
    for learner_id, learner in learners.items():
        stats = learner.update()
        for key, value in stats.items():
            if key.startswith("time/"):
                timings[key] += value
            else:
                metrics[f"{learner_id}/{key}"] = value
        metrics[f"{learner_id}/role"] = dialogues[learner_id]["role"]
    metrics["time/reward_s"] = env_time
    metrics.update(timings)
    metrics["time/iteration_s"] = time.perf_counter() - started
    return metrics, dialogues


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


def deployed_models(setup: Setup) -> Iterator[tuple[str, Any, Any]]:
    """``(name, model, tokenizer)`` of each base model π_0, then of each learner's policy, each ready to generate on
    its own. A base is named ``base`` when every learner starts from it, else ``base:MODEL``.

    Consume each model before asking for the next: with LoRA they are one model with different adapters active.
    """
    models = setup.config.learner_models()
    bases = list(dict.fromkeys(models[learner_id] for learner_id in setup.learners))
    for base in bases:
        first = next(learner for learner_id, learner in setup.learners.items() if models[learner_id] == base)
        with first.reference_model() as model:
            yield ("base" if len(bases) == 1 else f"base:{base}"), model, first.tokenizer
    for name, learner in setup.learners.items():
        learner.activate()
        yield name, learner.model, learner.tokenizer


def evaluate_alone(setup: Setup, num_queries: int, seed: int) -> list[dict[str, Any]]:
    """The base model and each learner deployed alone answer the same held-out queries from the query only.

    The prompt is the first role's template (for CORY, the pioneer's: the query alone). The same sampling seed is
    used for every model.
    """
    config = setup.config
    rows_source = setup.task.eval_dataset if setup.task.eval_dataset is not None else setup.task.dataset
    count = min(num_queries, len(rows_source))
    samples = [dict(rows_source[i]) for i in range(count)]
    template = as_prompt_fn(config.deployed_template())
    prompts = [template(sample, {}) for sample in samples]
    budget = config.generation.max_new_tokens
    rows = []
    for name, model, tokenizer in deployed_models(setup):
        torch.manual_seed(seed)
        texts = generate_responses(
            model, tokenizer, prompts, budget, config.generation, context_length(model), name
        ).texts
        rewards = setup.task.reward_fn(samples, list(texts))
        for sample, prompt, response, reward in zip(samples, prompts, texts, rewards, strict=True):
            rows.append(
                {
                    "query": sample["query"],
                    "model": name,
                    "prompt": prompt,
                    "response": response,
                    "task_reward": float(reward),
                }
            )
    return rows


def train(
    config: TrainConfig, run_dir: str | Path | None = None, resume: bool = False, overwrite: bool = False
) -> TrainResult:
    """Train for ``config.iterations`` iterations, logging to ``run_dir`` (default ``config.run_dir``).

    Args:
        config: the run.
        run_dir: where it is written (see :mod:`marllm.run_dir`); created once everything has loaded.
        resume: continue the run in ``run_dir`` from its latest training checkpoint. Its logs are cut back to that
            iteration and the run goes on to ``config.iterations``, exactly as if it had not stopped. ``config``
            must match the checkpoint's in everything but :data:`marllm.config.RESUMABLE_KEYS`.
        overwrite: delete the files of the run already in ``run_dir`` (marllm's own only) and start again.

    Without ``resume`` or ``overwrite``, a ``run_dir`` that already holds a run is an error. The training state is
    checkpointed every ``logging.checkpoint_every`` iterations and when training ends; the learners are exported and
    that last checkpoint written before any end-of-run evaluation. ``run.json`` records the run's status.

    SIGINT or SIGTERM stops the run after its current iteration, with a checkpoint, by raising
    :class:`~marllm.interrupts.TrainingInterrupted`; a second signal stops it at once. The previous signal handlers
    are restored on return. A new run that stops before its first iteration is logged leaves nothing behind: the
    files and the directories it created are removed again.

    Raises:
        RunDirError: ``run_dir`` holds a run (and neither flag is given), or there is nothing to resume.
        ConfigError: resuming with a config that changes what is trained.
    """
    run_dir = Path(run_dir) if run_dir is not None else config.resolved_run_dir()
    if resume and overwrite:
        raise RunDirError("resume and overwrite exclude each other: resume continues the run, overwrite deletes it")
    checkpoint = checkpoint_to_resume(run_dir, config) if resume else None
    if not resume and not overwrite:
        check_can_start(run_dir)
    elif run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"run directory {run_dir} is a file")
    setup = build(config)
    with StopSignals() as stop:
        run = _Run(config, setup, run_dir, fresh=checkpoint is None)
        try:
            _open_run(run, checkpoint, overwrite)
            _train_iterations(run, stop)
            _end_training(run, stop)
            return run.result
        except BaseException as error:
            stopped = _record_stop(run, error)
            if stopped is error:
                raise
            raise stopped from None


def checkpoint_to_resume(run_dir: Path, config: TrainConfig) -> CheckpointInfo:
    """The latest complete training checkpoint of ``run_dir``, after checking that ``config`` may continue it.

    Raises:
        RunDirError: no checkpoint to resume from.
        ConfigError: ``config`` differs from the checkpoint's in a key that changes training, or asks for fewer
            iterations than the checkpoint has completed.
    """
    checkpoint = latest_checkpoint(run_dir) if run_dir.is_dir() else None
    if checkpoint is None:
        state = read_run_state(run_dir) if run_dir.is_dir() else None
        what = f"its run ({state.describe()}) stopped before" if state else "no run there wrote"
        raise RunDirError(
            f"nothing to resume in {run_dir}: {what} its first training checkpoint (logging.checkpoint_every); "
            "start it again with --overwrite (overwrite=True)"
        )
    saved = checkpoint.extra.get("config")
    if not isinstance(saved, dict):
        raise RunDirError(f"checkpoint {checkpoint.path} does not record the config it was trained with")
    changed = resume_differences(saved, config)
    if changed:
        raise ConfigError(
            f"the config differs from the one {run_dir} was trained with, in keys that change training: "
            f"{'; '.join(changed)}. Resume with the run's config ({run_dir / CONFIG_FILE}), or start again with "
            "--overwrite"
        )
    if config.iterations < checkpoint.iteration:
        raise ConfigError(
            f"iterations={config.iterations} is fewer than the {checkpoint.iteration} iterations the checkpoint of "
            f"{run_dir} has completed; give iterations >= {checkpoint.iteration}, or start again with --overwrite"
        )
    return checkpoint


@dataclass
class _Run:
    """A run in progress: what it trains, where it writes, how far it got."""

    config: TrainConfig
    setup: Setup
    run_dir: Path
    fresh: bool  # started by this call (not resumed)
    created: Path | None = None  # the outermost directory this call created
    preexisting: frozenset[str] = frozenset()  # marllm's file names that were in run_dir before a fresh run began
    completed: int = 0
    checkpointed: int | None = None  # the iteration of the latest training checkpoint
    streaks: dict[str, int] = field(default_factory=dict)  # consecutive skipped updates per learner
    result: TrainResult = field(init=False)

    def __post_init__(self) -> None:
        self.result = TrainResult(self.run_dir)


def _open_run(run: _Run, checkpoint: CheckpointInfo | None, overwrite: bool) -> None:
    """Load the checkpoint of a resumed run, or clear the way for a new one; write config.yaml and run.json."""
    config, run_dir = run.config, run.run_dir
    info = _run_info(config)
    if checkpoint is not None:
        loaded = load_checkpoint(checkpoint.path, run.setup.learners, run.setup.env)
        run.completed = run.checkpointed = loaded.iteration
        remove_run_files(run_dir, END_OF_RUN_FILES)
        run.result.history = keep_iterations_before(run_dir / METRICS_FILE, loaded.iteration)
        keep_iterations_before(run_dir / SAMPLES_FILE, loaded.iteration)
        previous = read_run_info(run_dir)
        info["resumed_from"] = [*previous.get("resumed_from", []), loaded.iteration]
        info["checkpoint_iteration"] = loaded.iteration
    else:
        run.created = create_run_dir(run_dir)
        if overwrite:
            remove_run_files(run_dir)
        run.preexisting = frozenset(name for name in RUN_FILES if (run_dir / name).exists())
    run.streaks = _skip_streaks(run.result.history, list(run.setup.learners))
    (run_dir / CONFIG_FILE).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    write_run_info(run_dir, {**info, "status": "running", "completed_iterations": run.completed})


def _run_info(config: TrainConfig) -> dict[str, Any]:
    return {
        "name": config.name,
        "learners": config.learner_ids,
        "roles": config.env.roles,
        "iterations": config.iterations,
        "kl_metric": KL_METRIC,
    }


def _train_iterations(run: _Run, stop: StopSignals) -> None:
    """Run the iterations from ``run.completed`` to ``iterations``, logging and checkpointing each as due; stop
    (with a checkpoint) once a signal asks."""
    config, setup = run.config, run.setup
    with RunLog(run.run_dir, run.completed, config.logging.tensorboard) as log:
        bar = tqdm(
            range(run.completed, config.iterations),
            desc=f"{config.name}",
            initial=run.completed,
            total=config.iterations,
            disable=not config.logging.progress,
        )
        for iteration in bar:
            if stop.requested:
                break
            # A new run seeds the env once; a resumed one continues the env's generator from the checkpoint.
            seed = config.seed if run.fresh and iteration == 0 else None
            metrics, dialogues = run_iteration(setup.env, setup.learners, seed=seed)
            metrics = {"iteration": iteration, **metrics}
            samples = _sample_rows(setup.env, dialogues, iteration, config.logging.samples_per_iteration)
            log.write(iteration, metrics, samples)
            run.result.history.append(metrics)
            run.completed = iteration + 1
            update_run_info(run.run_dir, completed_iterations=run.completed)
            _count_skips(run, metrics)
            if _checkpoint_due(run):
                _save_training_state(run)
            bar.set_postfix(
                {
                    f"{lid}": f"r={metrics[f'{lid}/task_reward']:.2f} kl={metrics[f'{lid}/kl']:.2f}"
                    for lid in setup.learners
                }
            )
    if stop.requested:
        _stop_gracefully(run, stop)


def _checkpoint_due(run: _Run) -> bool:
    """``checkpoint_every`` iterations since the last checkpoint, and no learner in a run of skipped updates."""
    every = run.config.logging.checkpoint_every
    since = run.completed - (run.checkpointed or 0)
    return every is not None and since >= every and not any(run.streaks.values())


def _save_training_state(run: _Run) -> None:
    save_checkpoint(
        run.run_dir,
        run.completed,
        run.setup.learners,
        run.setup.env,
        keep=run.config.logging.keep_checkpoints,
        extra={"config": run.config.to_dict()},
    )
    run.checkpointed = run.completed
    update_run_info(run.run_dir, checkpoint_iteration=run.completed)


def _stop_gracefully(run: _Run, stop: StopSignals) -> None:
    """After a stop request: checkpoint what is not yet (unless a learner is in a run of skipped updates), then
    raise :class:`TrainingInterrupted`."""
    if run.completed > (run.checkpointed or 0) and not any(run.streaks.values()):
        _save_training_state(run)
    assert stop.received is not None
    raise TrainingInterrupted(
        stop.received, run.run_dir, run.completed, run.config.iterations, run.checkpointed, at_once=False
    )


def _count_skips(run: _Run, metrics: dict[str, Any]) -> None:
    """Count each learner's consecutive skipped (non-finite) updates; say so on stderr; stop past the limit."""
    iteration = metrics["iteration"]
    for learner_id, learner in run.setup.learners.items():
        if metrics.get(f"{learner_id}/nonfinite_skipped"):
            run.streaks[learner_id] = run.streaks.get(learner_id, 0) + 1
            print(
                f"marllm: iteration {iteration}: learner {learner_id!r} skipped its update "
                f"({run.streaks[learner_id]} in a row): {getattr(learner, 'last_nonfinite', None)}",
                file=sys.stderr,
                flush=True,
            )
        else:
            run.streaks[learner_id] = 0
    limit = run.config.ppo.max_consecutive_skips
    over = {learner_id: n for learner_id, n in run.streaks.items() if n > limit}
    if over:
        kept = f"iteration {run.checkpointed}" if run.checkpointed is not None else "none"
        raise NonFiniteLossError(
            f"learner(s) {sorted(over)} skipped more than ppo.max_consecutive_skips = {limit} updates in a row "
            f"(non-finite loss or gradient; the last at iteration {iteration}); the run stops, and its latest "
            f"checkpoint ({kept}) is from before the first of these skips"
        )


def _skip_streaks(history: Sequence[dict[str, Any]], learner_ids: Sequence[str]) -> dict[str, int]:
    """Each learner's consecutive skipped updates at the end of ``history`` (a resumed run's kept metrics)."""
    streaks = {}
    for learner_id in learner_ids:
        count = 0
        for metrics in reversed(history):
            if not metrics.get(f"{learner_id}/nonfinite_skipped"):
                break
            count += 1
        streaks[learner_id] = count
    return streaks


def _end_training(run: _Run, stop: StopSignals) -> None:
    """The last checkpoint and the learners' export, then (a signal now stopping at once) the end-of-run
    evaluation; the run is ``finished`` once all is written."""
    config, setup, run_dir = run.config, run.setup, run.run_dir
    if run.checkpointed != run.completed:
        _save_training_state(run)
    stop.graceful = False
    if stop.requested:  # a signal during that save
        _stop_gracefully(run, stop)
    if config.logging.save_checkpoint:
        for learner_id, learner in setup.learners.items():
            learner.save(run_dir / EXPORT_DIR / learner_id)
    if config.logging.eval_queries > 0:
        run.result.eval_rows = evaluate_alone(setup, config.logging.eval_queries, config.seed)
        write_atomic(run_dir / EVAL_FILE, "".join(json.dumps(row) + "\n" for row in run.result.eval_rows))
    if config.logging.pass_at_k is not None:
        results = evaluate_pass_at_k_alone(setup)
        write_atomic(run_dir / PASS_AT_K_FILE, json.dumps(results, indent=2))
    update_run_info(run_dir, status="finished", completed_iterations=run.completed)


def _record_stop(run: _Run, error: BaseException) -> BaseException:
    """Record why the run stopped in ``run.json`` (or, for a new run with nothing logged, remove what it wrote);
    return the exception to raise."""
    if run.fresh and run.completed == 0:
        _remove_new_run(run)
    elif (run.run_dir / RUN_FILE).is_file():
        interrupted = isinstance(error, KeyboardInterrupt)
        details = {} if interrupted else {"error": f"{type(error).__name__}: {error}".splitlines()[0]}
        update_run_info(
            run.run_dir,
            status="interrupted" if interrupted else "failed",
            completed_iterations=run.completed,
            **details,
        )
    if isinstance(error, TrainingInterrupted) and error.run_dir is None:  # raised by a signal handler
        return TrainingInterrupted(
            error.signal_number, run.run_dir, run.completed, run.config.iterations, run.checkpointed, at_once=True
        )
    return error


def _remove_new_run(run: _Run) -> None:
    """Remove what a new run wrote: the directories it created, or else its files."""
    if run.created is not None:
        shutil.rmtree(run.created, ignore_errors=True)
    elif run.run_dir.is_dir():
        remove_run_files(run.run_dir, [name for name in RUN_FILES if name not in run.preexisting])


def evaluate_pass_at_k_alone(setup: Setup) -> list[dict[str, Any]]:
    """pass@k of the base model and of each learner deployed alone, on the task's eval split."""
    from marllm.evaluation.deployed import eval_problems, pass_at_k_of_model

    config = setup.config
    log = config.logging
    problems = eval_problems(config, log.pass_at_k_problems)
    results = []
    for name, model, tokenizer in deployed_models(setup):
        result = pass_at_k_of_model(
            model,
            tokenizer,
            config,
            problems,
            name,
            log.pass_at_k,
            log.pass_at_k_samples,
            seed=config.seed,
            progress=log.progress,
        )
        results.append(result.to_dict())
    return results


def _sample_rows(env: AECEnv, dialogues: dict[str, dict[str, Any]], iteration: int, count: int) -> list[dict]:
    samples = env.unwrapped.samples
    query_column = env.unwrapped.query_column
    rows = []
    for learner_id, record in dialogues.items():
        for turn_index, turn in enumerate(record["turns"], start=1):
            for i in range(min(count, len(turn["responses"]))):
                row = {
                    "iteration": iteration,
                    "learner": learner_id,
                    "role": record["role"],
                    "query": samples[i][query_column],
                    "prompt": turn["prompts"][i],
                    "response": turn["responses"][i],
                    "task_reward": float(turn["task_rewards"][i]),
                }
                if len(record["turns"]) > 1:
                    row["turn"] = turn_index
                rows.append(row)
    return rows
