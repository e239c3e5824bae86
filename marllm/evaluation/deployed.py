"""pass@k of a model deployed alone: the base model or one trained agent answering from the query only."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from marllm.assets import resolve_model
from marllm.config import TrainConfig
from marllm.envs.templates import as_prompt_fn
from marllm.evaluation.pass_at_k import mean_pass_at_k
from marllm.models.generation import generate_responses
from marllm.models.lora import load_adapter_checkpoint
from marllm.models.policy import context_length, load_causal_lm, load_tokenizer


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
    base_path = resolve_model(config.learner_models().get(directory.name, config.model.name_or_path))
    has_tokenizer = any((policy / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json"))
    tokenizer = load_tokenizer(str(policy) if has_tokenizer else base_path, trust_remote_code=trust)
    if (policy / "config.json").is_file():
        model = load_causal_lm(str(policy), config.model.dtype, config.model.device, trust_remote_code=trust)
        return model, str(checkpoint), tokenizer
    base = load_causal_lm(base_path, config.model.dtype, config.model.device, trust_remote_code=trust)
    return load_adapter_checkpoint(base, policy), str(checkpoint), tokenizer


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
    """pass@k of the base model or a saved learner on the task's eval split (see :func:`pass_at_k_of_model`)."""
    check_pass_at_k_request(config, ks, samples)
    model, label, tokenizer = load_deployed_model(config, checkpoint)
    problems = eval_problems(config, limit)
    return pass_at_k_of_model(model, tokenizer, config, problems, label, ks, samples, batch_size, seed, progress)


def check_pass_at_k_request(config: TrainConfig, ks: list[int], samples: int) -> None:
    """The task must have a 0/1 reward and every k must satisfy 1 <= k <= samples."""
    if config.task.name not in ("gsm8k", "arithmetic"):
        raise ValueError(f"pass@k needs a task with a 0/1 reward (gsm8k, arithmetic), not {config.task.name!r}")
    if samples < 1:
        raise ValueError(f"pass@k samples per problem must be >= 1, got {samples}")
    bad = [k for k in ks if not 1 <= k <= samples]
    if not ks or bad:
        raise ValueError(f"pass@k needs 1 <= k <= samples ({samples}); got k = {bad or ks}")


def eval_problems(config: TrainConfig, limit: int | None = None) -> list[dict[str, Any]]:
    """The first ``limit`` problems of the task's eval split."""
    problems = config.task.load_split(config.task.eval_split)
    count = len(problems) if limit is None else min(limit, len(problems))
    return [dict(problems[i]) for i in range(count)]


@torch.no_grad()
def pass_at_k_of_model(
    model: PreTrainedModel,
    tokenizer: Any,
    config: TrainConfig,
    problems: list[dict[str, Any]],
    label: str,
    ks: list[int],
    samples: int,
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = True,
) -> PassAtKResult:
    """Sample ``samples`` answers per problem and compute the unbiased pass@k estimator.

    The prompt is the first role's template (the pioneer's: the query alone), as a CORY agent is used at
    inference. Sampling uses the config's generation settings with the full ``max_new_tokens`` budget.
    """
    check_pass_at_k_request(config, ks, samples)
    model.eval()
    template = as_prompt_fn(config.deployed_template())
    reward_fn = config.task.reward()
    prompts = [template(row, {}) for row in problems]
    # Every problem is asked `samples` times; batches mix problems so that each generate call is full.
    order = [(i, s) for i in range(len(problems)) for s in range(samples)]
    correct = np.zeros(len(problems), dtype=np.int64)
    rewards = []
    torch.manual_seed(seed)
    budget = config.generation.max_new_tokens
    for start in tqdm(range(0, len(order), batch_size), desc=f"pass@k {label}", disable=not progress):
        chunk = order[start : start + batch_size]
        texts = generate_responses(
            model, tokenizer, [prompts[i] for i, _ in chunk], budget, config.generation, context_length(model), label
        ).texts
        scores = np.asarray(reward_fn([problems[i] for i, _ in chunk], list(texts)), dtype=np.float64)
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
