"""The multi-agent training loop: PettingZoo's ``agent_iter`` over a wrapped text env, one learner per agent id.

CORY is not a code path here: it is ``SequentialTextEnv(roles=[pioneer, observer])`` wrapped by ``SharedReward`` and
``RolePermutation``, driven by the same loop as single-agent PPO.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from pettingzoo import AECEnv
from tqdm.auto import tqdm

from marllm.algorithms.ppo import PPOLearner
from marllm.algorithms.ppo_config import GenerationConfig, PPOConfig
from marllm.assets import resolve_model
from marllm.config import TrainConfig
from marllm.envs.tasks.base import TaskParts
from marllm.envs.templates import as_prompt_fn
from marllm.envs.text_env import env as text_env
from marllm.models.generation import generate_responses
from marllm.models.lora import LoraSettings, attach_adapters
from marllm.models.policy import ReferencePool, context_length, load_causal_lm, load_tokenizer
from marllm.wrappers import RolePermutation, SharedReward

PASS_AT_K_FILE = "pass_at_k.json"
KL_METRIC = "full-vocabulary KL(policy || reference) summed over response tokens, batch mean"


@dataclass
class Setup:
    """Everything a run needs, built from a config."""

    config: TrainConfig
    env: AECEnv
    learners: dict[str, PPOLearner]
    task: TaskParts
    reference: Any
    tokenizer: Any


@dataclass
class TrainResult:
    run_dir: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    eval_rows: list[dict[str, Any]] = field(default_factory=list)


def build_env(config: TrainConfig, task: TaskParts) -> AECEnv:
    """The text env of ``config``, wrapped by SharedReward (if rewards are shared) and RolePermutation."""
    templates = config.env.templates
    if templates is None:
        missing = [r for r in config.env.roles if r not in task.templates]
        if missing:
            raise ValueError(
                f"the task has default templates for roles {sorted(task.templates)} only; give env.templates for "
                f"{missing}"
            )
        templates = {role: task.templates[role] for role in config.env.roles}
    env = text_env(
        dataset=task.dataset,
        roles=config.env.roles,
        templates=templates,
        reward_fn=task.reward_fn,
        batch_size=config.env.batch_size,
    )
    coefficients = config.coefficient_matrix()
    if coefficients is not None:
        env = SharedReward(env, coefficients)
    return RolePermutation(env, config.agents.role_period, config.learner_ids)


def build(config: TrainConfig) -> Setup:
    """Load the base model once per learner plus one shared reference, the task, and the wrapped env.

    The model, reward model and dataset references are checked first, before anything loads.
    """
    config.check_references()
    torch.manual_seed(config.seed)
    model_path = resolve_model(config.model.name_or_path)
    tokenizer = load_tokenizer(model_path)
    task = config.task.build(tokenizer, config.seed, config.model.device)
    env = build_env(config, task)
    learners, reference = make_learners(
        model_path,
        config.learner_ids,
        config.ppo,
        config.generation,
        config.seed,
        config.model.dtype,
        config.model.device,
        tokenizer,
        lora=config.model.lora,
        load_in_4bit=config.model.load_in_4bit,
    )
    return Setup(config, env, learners, task, reference, tokenizer)


def make_learners(
    model: str,
    learner_ids: Sequence[str],
    ppo: PPOConfig | None = None,
    generation: GenerationConfig | None = None,
    seed: int = 0,
    dtype: str = "float32",
    device: str = "auto",
    tokenizer: Any = None,
    lora: LoraSettings | None = None,
    load_in_4bit: bool = False,
) -> tuple[dict[str, PPOLearner], Any]:
    """One PPO learner per id, all starting from ``model``: a hub id, a local directory or ``marllm:offline-base``.

    Full models: each learner owns a copy and all share one frozen reference (N policies + 1 reference).
    LoRA: one base carries one adapter per learner, and the reference is that base with adapters disabled
    (one base + N adapters). Returns the learners (keyed by id) and the separate reference model (None for LoRA).
    ``seed`` seeds each learner's initial value head, its response lengths and mini-batch order, and leaves torch's
    global generator (which samples the responses) in a state that depends on ``seed`` alone.
    """
    model_path = resolve_model(model)
    tokenizer = tokenizer or load_tokenizer(model_path)
    if lora is not None:
        torch.manual_seed(seed)
        base = load_causal_lm(model_path, dtype, device, load_in_4bit=load_in_4bit)
        shared = attach_adapters(base, list(learner_ids), lora)
        learners = {
            learner_id: PPOLearner(
                learner_id, shared, tokenizer, None, ppo, generation, seed=seed + i, adapter=learner_id
            )
            for i, learner_id in enumerate(learner_ids)
        }
        return learners, None
    reference = ReferencePool().get(model_path, dtype, device)
    learners = {}
    for i, learner_id in enumerate(learner_ids):
        torch.manual_seed(seed + i)
        model = load_causal_lm(model_path, dtype, device)
        learners[learner_id] = PPOLearner(learner_id, model, tokenizer, reference, ppo, generation, seed=seed + i)
    return learners, reference


def run_iteration(
    env: AECEnv, learners: dict[str, PPOLearner], seed: int | None = None
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """One episode (a batch of dialogues) then one independent PPO update per learner.

    Returns the iteration's metrics (``<learner>/<name>`` and ``time/*``) and, per learner, its dialogue record
    (role, prompts, responses, task rewards).
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
            if "batch_rewards" not in info:
                raise KeyError(f"agent {agent!r} finished without per-dialogue 'batch_rewards' in its info")
            learners[agent].finish(info["batch_rewards"], info.get("task_rewards"))
            dialogues[agent]["task_rewards"] = np.asarray(info.get("task_rewards", info["batch_rewards"]))
            action = None
        else:
            action = learners[agent].act(observation, role=info.get("role"))
            dialogues[agent] = {"role": info.get("role", agent), "prompts": observation["prompt"], "responses": action}
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


def deployed_models(setup: Setup) -> Iterator[tuple[str, Any]]:
    """``("base", π_0)`` then ``(learner id, its policy)``, each ready to generate on its own.

    Consume each model before asking for the next: with LoRA they are one model with different adapters active.
    """
    any_learner = next(iter(setup.learners.values()))
    with any_learner.reference_model() as base:
        yield "base", base
    for name, learner in setup.learners.items():
        learner.activate()
        yield name, learner.model


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
    for name, model in deployed_models(setup):
        torch.manual_seed(seed)
        texts = generate_responses(
            model, setup.tokenizer, prompts, budget, config.generation, context_length(model), name
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


def train(config: TrainConfig, run_dir: str | Path | None = None) -> TrainResult:
    """Train for ``config.iterations`` iterations, logging to ``run_dir`` (default ``config.run_dir``).

    ``run_dir`` is created once everything has loaded. If the run fails before its first iteration is logged, the
    directories this call created are removed again (a directory that existed before is left as it was).
    """
    run_dir = Path(run_dir) if run_dir is not None else config.resolved_run_dir()
    setup = build(config)
    created = _create_run_dir(run_dir)
    try:
        return _train(config, setup, run_dir)
    except BaseException:
        if created is not None and not _has_metrics(run_dir):
            shutil.rmtree(created, ignore_errors=True)
        raise


def _create_run_dir(run_dir: Path) -> Path | None:
    """Create ``run_dir``; return the outermost directory this created (None if ``run_dir`` already existed)."""
    missing = [path for path in (run_dir, *run_dir.parents) if not path.exists()]
    run_dir.mkdir(parents=True, exist_ok=True)
    return missing[-1] if missing else None


def _has_metrics(run_dir: Path) -> bool:
    metrics = run_dir / "metrics.jsonl"
    return metrics.is_file() and metrics.stat().st_size > 0


def _train(config: TrainConfig, setup: Setup, run_dir: Path) -> TrainResult:
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    (run_dir / "run.json").write_text(
        json.dumps(
            {
                "name": config.name,
                "learners": config.learner_ids,
                "roles": config.env.roles,
                "iterations": config.iterations,
                "kl_metric": KL_METRIC,
            },
            indent=2,
        )
    )
    writer = _tensorboard(run_dir) if config.logging.tensorboard else None
    result = TrainResult(run_dir)
    with (run_dir / "metrics.jsonl").open("w") as metrics_file, (run_dir / "samples.jsonl").open("w") as samples_file:
        bar = tqdm(range(config.iterations), desc=f"{config.name}", disable=not config.logging.progress)
        for iteration in bar:
            metrics, dialogues = run_iteration(setup.env, setup.learners, seed=config.seed if iteration == 0 else None)
            metrics = {"iteration": iteration, **metrics}
            result.history.append(metrics)
            metrics_file.write(json.dumps(metrics) + "\n")
            metrics_file.flush()
            for row in _sample_rows(setup.env, dialogues, iteration, config.logging.samples_per_iteration):
                samples_file.write(json.dumps(row) + "\n")
            samples_file.flush()
            if writer is not None:
                for key, value in metrics.items():
                    if isinstance(value, int | float) and key != "iteration":
                        writer.add_scalar(key, value, iteration)
            bar.set_postfix(
                {
                    f"{lid}": f"r={metrics[f'{lid}/task_reward']:.2f} kl={metrics[f'{lid}/kl']:.2f}"
                    for lid in setup.learners
                }
            )
    if writer is not None:
        writer.close()
    if config.logging.eval_queries > 0:
        result.eval_rows = evaluate_alone(setup, config.logging.eval_queries, config.seed)
        with (run_dir / "eval_samples.jsonl").open("w") as handle:
            for row in result.eval_rows:
                handle.write(json.dumps(row) + "\n")
    if config.logging.pass_at_k is not None:
        results = evaluate_pass_at_k_alone(setup)
        (run_dir / PASS_AT_K_FILE).write_text(json.dumps(results, indent=2))
    if config.logging.save_checkpoint:
        for learner_id, learner in setup.learners.items():
            learner.save(run_dir / "checkpoints" / learner_id)
    return result


def evaluate_pass_at_k_alone(setup: Setup) -> list[dict[str, Any]]:
    """pass@k of the base model and of each learner deployed alone, on the task's eval split."""
    from marllm.evaluation.deployed import eval_problems, pass_at_k_of_model

    config = setup.config
    log = config.logging
    problems = eval_problems(config, log.pass_at_k_problems)
    results = []
    for name, model in deployed_models(setup):
        result = pass_at_k_of_model(
            model,
            setup.tokenizer,
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
        for i in range(min(count, len(record["responses"]))):
            rows.append(
                {
                    "iteration": iteration,
                    "learner": learner_id,
                    "role": record["role"],
                    "query": samples[i][query_column],
                    "prompt": record["prompts"][i],
                    "response": record["responses"][i],
                    "task_reward": float(record["task_rewards"][i]),
                }
            )
    return rows


def _tensorboard(run_dir: Path) -> Any:
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(run_dir / "tensorboard"))
