"""Models deployed alone: the base model or a trained agent answering from the query only, as it is used at inference.

The models are the learners of a run in memory (:func:`deployed_models`, for the end-of-run evaluation of
:func:`marllm.run.train.train`) or saved ones (:func:`load_deployed_model`, for ``marllm eval``). Either way they answer
the first role's template (CORY's pioneer: the query alone) with the config's generation settings and the full
``max_new_tokens`` budget: :func:`evaluate_alone` scores their answers to held-out queries by the task reward,
:func:`pass_at_k_of_model` estimates pass@k on the task's eval split.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from marllm.algorithms.learner import Learner
from marllm.assets import resolve_model
from marllm.config import TrainConfig
from marllm.envs.reward_context import alone_context
from marllm.envs.reward_context import score as score_reward
from marllm.envs.templates import PromptTemplate, as_prompt_fn, check_row_values
from marllm.evaluation.pass_at_k import mean_pass_at_k
from marllm.models.generation import generate_responses
from marllm.models.lora import load_adapter_checkpoint
from marllm.models.policy import context_length, load_causal_lm, load_tokenizer
from marllm.parallel.placement import Placement
from marllm.tasks.base import TaskParts, has_binary_reward
from marllm.utils.errors import CheckpointError
from marllm.utils.files import MANIFEST_NAME, verify_directory_manifest


@dataclass
class PassAtKResult:
    """pass@k per k, with what produced it."""

    model: str
    pass_at_k: dict[int, float]
    num_problems: int
    samples_per_problem: int
    mean_reward: float
    correct_counts: list[int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            **{f"pass@{k}": v for k, v in self.pass_at_k.items()},
            "num_problems": self.num_problems,
            "samples_per_problem": self.samples_per_problem,
            "mean_reward": self.mean_reward,
        }


def check_export(directory: Path) -> None:
    """A learner export (``RUN_DIR/checkpoints/LEARNER``, with its ``manifest.json``) must hold every file as it was
    written; a directory without a manifest (a model saved by other means) is loaded as it is.

    Raises:
        CheckpointError: a file is missing or altered; the message names each one.
    """
    if not (directory / MANIFEST_NAME).is_file():
        return
    problems = verify_directory_manifest(directory)
    if problems:
        raise CheckpointError(
            f"checkpoint {str(directory)!r} is damaged: " + "; ".join(problems[:5])
            + " (export it again, or train again from its run's training_state with --resume)"
        )


def load_deployed_model(config: TrainConfig, checkpoint: str | Path | None) -> tuple[PreTrainedModel, str, Any]:
    """The base model (``checkpoint`` None or ``"base"``) or a trained learner from ``checkpoints/<learner>``, with
    its label and tokenizer.

    A learner directory holds ``policy/`` as a full model (config.json) or as a LoRA adapter on the learner's base
    (``agents.models`` of the directory's learner id, else ``model.name_or_path``), with the tokenizer it was
    trained with; the base's tokenizer stands in for a directory saved without one.
    """
    trust = config.model.trust_remote_code
    if checkpoint is None or str(checkpoint) == "base":
        base_path = resolve_model(config.model.name_or_path)
        model = load_causal_lm(base_path, config.model.dtype, config.model.device, trust_remote_code=trust)
        return model, "base", load_tokenizer(base_path, trust_remote_code=trust)
    directory = Path(checkpoint)
    policy = directory / "policy" if (directory / "policy").is_dir() else directory
    if not policy.is_dir():
        raise FileNotFoundError(f"checkpoint {str(checkpoint)!r} does not exist (expected RUN_DIR/checkpoints/LEARNER)")
    check_export(directory)
    base_path = resolve_model(config.learner_models().get(directory.name, config.model.name_or_path))
    has_tokenizer = any((policy / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json"))
    tokenizer = load_tokenizer(str(policy) if has_tokenizer else base_path, trust_remote_code=trust)
    if (policy / "config.json").is_file():
        model = load_causal_lm(str(policy), config.model.dtype, config.model.device, trust_remote_code=trust)
        return model, str(checkpoint), tokenizer
    base = load_causal_lm(base_path, config.model.dtype, config.model.device, trust_remote_code=trust)
    return load_adapter_checkpoint(base, policy), str(checkpoint), tokenizer


def deployed_models(
    config: TrainConfig, learners: Mapping[str, Learner], placement: Placement | None = None
) -> Iterator[tuple[str, Any, Any]]:
    """``(name, model, tokenizer)`` of each base model π_0 of ``learners``, then of each learner's policy, each ready
    to generate on its own, within ``placement``'s generating block (the run's; None: whole models on one process).
    A base is named ``base`` when every learner starts from it, else ``base:MODEL``.

    Consume each model before asking for the next: with LoRA they are one model with different adapters active.
    """
    placement = placement if placement is not None else Placement()
    models = config.learner_models()
    bases = list(dict.fromkeys(models[learner_id] for learner_id in learners))
    for base in bases:
        first = next(learner for learner_id, learner in learners.items() if models[learner_id] == base)
        with first.reference_model() as model, placement.generating(model):
            yield ("base" if len(bases) == 1 else f"base:{base}"), model, first.tokenizer
    for name, learner in learners.items():
        learner.activate()
        with placement.generating(learner.model):
            yield name, learner.model, learner.tokenizer


def held_out_rows(task: TaskParts, limit: int | None = None) -> list[dict[str, Any]]:
    """The first ``limit`` rows (None: all) of the task's held-out queries: its eval dataset, else its dataset
    (:func:`queries_kind` says which)."""
    source = task.eval_dataset if task.eval_dataset is not None else task.dataset
    count = len(source) if limit is None else min(limit, len(source))
    return [dict(source[i]) for i in range(count)]


HELD_OUT = "held-out"
TRAINING = "training"


def queries_kind(task: TaskParts, task_config: Any = None) -> str:
    """What :func:`held_out_rows` returns: ``held-out`` queries when the task gives evaluation rows apart from its
    training rows, else ``training`` queries (no eval dataset, or a ``task_config`` whose ``eval_split`` is its
    training ``split``)."""
    if task.eval_dataset is None:
        return TRAINING
    split, eval_split = getattr(task_config, "split", None), getattr(task_config, "eval_split", None)
    if split is not None and eval_split == split and getattr(task_config, "eval_dataset", None) is None:
        return TRAINING
    return HELD_OUT


def build_task(config: TrainConfig) -> TaskParts:
    """``config``'s task, built with the base model's tokenizer (the one that cuts the sentiment task's queries)."""
    base_path = resolve_model(config.model.name_or_path)
    tokenizer = load_tokenizer(base_path, trust_remote_code=config.model.trust_remote_code)
    return config.task.build(tokenizer, config.seed, config.model.device)


def score_alone(reward_fn: Any, role: str, samples: list[dict[str, Any]], texts: Sequence[str]) -> Any:
    """The task reward of ``texts`` answered by ``role`` alone (one turn, no partner), as the env would score them:
    a role-aware reward sees a one-turn dialogue, a mapping of rewards gives the role's."""
    return score_reward(reward_fn, samples, list(texts), alone_context(role, samples, texts))


def deployed_prompts(config: TrainConfig, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The prompt of each row for a model deployed alone: the first role's template, with no earlier turn."""
    template = as_prompt_fn(config.deployed_template())
    if isinstance(template, PromptTemplate):  # a row without a field the prompt uses is refused, not rendered "None"
        check_row_values(template, f"role {config.env.roles[0]!r}", rows)
    return [template(row, {}) for row in rows]


def generate_answers(
    model: PreTrainedModel, tokenizer: Any, config: TrainConfig, prompts: Sequence[str], label: str
) -> tuple[str, ...]:
    """One batched generation of ``model`` for ``prompts``, with the config's generation settings and the full
    ``max_new_tokens`` budget (``label`` names the model in errors)."""
    generation = config.generation
    return generate_responses(
        model, tokenizer, list(prompts), generation.max_new_tokens, generation, context_length(model), label
    ).texts


def evaluate_alone(
    config: TrainConfig,
    task: TaskParts,
    learners: Mapping[str, Learner],
    num_queries: int,
    seed: int,
    placement: Placement | None = None,
) -> list[dict[str, Any]]:
    """The base model and each learner deployed alone answer the same held-out queries from the query only.

    The prompt is the first role's template (for CORY, the pioneer's: the query alone); the answers are scored by
    the task reward. The same sampling seed is used for every model. Returns one row per model and query.
    ``placement``: the run's placement across processes (None: whole models on one process).
    """
    samples = held_out_rows(task, num_queries)
    prompts = deployed_prompts(config, samples)
    rows = []
    for name, model, tokenizer in deployed_models(config, learners, placement):
        torch.manual_seed(seed)
        texts = generate_answers(model, tokenizer, config, prompts, name)
        rewards = score_alone(task.reward_fn, config.env.roles[0], samples, texts)
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


def evaluate_pass_at_k_alone(
    config: TrainConfig,
    learners: Mapping[str, Learner],
    progress: bool,
    task: TaskParts,
    placement: Placement | None = None,
) -> list[dict[str, Any]]:
    """pass@k of the base model and of each learner deployed alone, on the built ``task``'s held-out rows (its eval
    split) scored by its reward, with the ``logging.pass_at_k*`` settings of ``config``; one
    :meth:`PassAtKResult.to_dict` per model. ``progress``: show progress bars; ``placement``: the run's placement
    across processes (None: whole models on one process)."""
    log = config.logging
    problems = held_out_rows(task, log.pass_at_k_problems)
    results = []
    for name, model, tokenizer in deployed_models(config, learners, placement):
        result = pass_at_k_of_model(
            model,
            tokenizer,
            config,
            problems,
            task.reward_fn,
            name,
            log.pass_at_k,
            log.pass_at_k_samples,
            seed=config.seed,
            progress=progress,
        )
        results.append(result.to_dict())
    return results


def evaluate_pass_at_k(
    config: TrainConfig,
    checkpoint: str | Path | None,
    ks: list[int],
    samples: int,
    limit: int | None = None,
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = True,
) -> PassAtKResult:
    """pass@k of the base model or a saved learner on the task's held-out rows (its eval split), scored by its
    reward (see :func:`pass_at_k_of_model`)."""
    check_pass_at_k_request(config, ks, samples)
    task = build_task(config)
    model, label, tokenizer = load_deployed_model(config, checkpoint)
    problems = held_out_rows(task, limit)
    return pass_at_k_of_model(
        model, tokenizer, config, problems, task.reward_fn, label, ks, samples, batch_size, seed, progress
    )


def check_pass_at_k_request(config: TrainConfig, ks: list[int], samples: int) -> None:
    """The task must declare a 0/1 reward (``binary_reward``) and every k must satisfy 1 <= k <= samples."""
    if not has_binary_reward(config.task):
        raise ValueError(
            f"pass@k needs a task with a 0/1 reward, and task {config.task.name!r} does not declare one "
            "(binary_reward: the math tasks' is; the text task's is task.binary_reward)"
        )
    if samples < 1:
        raise ValueError(f"pass@k samples per problem must be >= 1, got {samples}")
    bad = [k for k in ks if not 1 <= k <= samples]
    if not ks or bad:
        raise ValueError(f"pass@k needs 1 <= k <= samples ({samples}); got k = {bad or ks}")


@torch.no_grad()
def pass_at_k_of_model(
    model: PreTrainedModel,
    tokenizer: Any,
    config: TrainConfig,
    problems: list[dict[str, Any]],
    reward_fn: Any,
    label: str,
    ks: list[int],
    samples: int,
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = True,
) -> PassAtKResult:
    """Sample ``samples`` answers per problem and compute the unbiased pass@k estimator.

    The prompt is the first role's template (the pioneer's: the query alone), as a CORY agent is used at
    inference, scored by ``reward_fn`` (the built task's) as that role's answers. Sampling uses the config's
    generation settings with the full ``max_new_tokens`` budget.
    """
    check_pass_at_k_request(config, ks, samples)
    model.eval()
    role = config.env.roles[0]
    prompts = deployed_prompts(config, problems)
    # Every problem is asked `samples` times; batches mix problems so that each generate call is full.
    order = [(i, s) for i in range(len(problems)) for s in range(samples)]
    correct = np.zeros(len(problems), dtype=np.int64)
    rewards = []
    torch.manual_seed(seed)
    for start in tqdm(range(0, len(order), batch_size), desc=f"pass@k {label}", disable=not progress):
        chunk = order[start : start + batch_size]
        texts = generate_answers(model, tokenizer, config, [prompts[i] for i, _ in chunk], label)
        scores = np.asarray(score_alone(reward_fn, role, [problems[i] for i, _ in chunk], texts), dtype=np.float64)
        if not np.all(np.isin(scores, (0.0, 1.0))):
            raise ValueError(f"pass@k needs a 0/1 task reward; task {config.task.name!r} returned {scores[:5]}")
        for (i, _), score in zip(chunk, scores, strict=True):
            correct[i] += int(score)
        rewards.extend(scores.tolist())
    return PassAtKResult(
        model=label,
        pass_at_k=mean_pass_at_k(correct.tolist(), samples, ks),
        num_problems=len(problems),
        samples_per_problem=samples,
        mean_reward=float(np.mean(rewards)),
        correct_counts=correct.tolist(),
    )


def checkpoint_generator(
    config: TrainConfig, checkpoint: str, label: str, batch_size: int
) -> Callable[[Sequence[str]], list[str]]:
    """The generate function of the base model (``base``) or a saved learner, answering ``batch_size`` prompts per
    ``generate`` call with the config's generation settings and the full ``max_new_tokens`` budget."""
    model, _, tokenizer = load_deployed_model(config, checkpoint)

    def generate(prompts: Sequence[str]) -> list[str]:
        texts: list[str] = []
        for start in range(0, len(prompts), batch_size):
            texts.extend(generate_answers(model, tokenizer, config, prompts[start : start + batch_size], label))
        return texts

    return generate
