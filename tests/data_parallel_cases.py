"""Learners updated on one process and on two data-parallel ranks, for tests/test_data_parallel.py.

Run on two ranks by :func:`marllm.testing.run_ranks` (:func:`on_rank`): each rank takes its half of every case's
rollout (saved by the test to ``OUT/rollouts.pt``), runs one update, and saves its parameters,
metrics, controller state and checkpoint state to ``OUT/rank<r>.pt``. The :data:`SHARDED_CASES` run again with
the models sharded over the ranks (FSDP, under ``fsdp/<case>``), and also restore their checkpoint state into
fresh sharded learners and export to ``OUT/export-<case>``.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from marllm.algorithms.critic_free_config import CriticFreeConfig
from marllm.algorithms.critic_free_learner import CriticFreeLearner
from marllm.algorithms.ppo import PPOLearner, Rollout
from marllm.models.generation import generate_responses
from marllm.models.generation_config import GenerationConfig
from marllm.parallel.placement import DataParallel, Sharded
from marllm.parallel.sharding import full_tensor
from marllm.testing.data_parallel import rank_slice as one_rank_slice
from tests.conftest import make_tiny_gpt2, make_tokenizer
from tests.test_ppo_learner import make_learner

BATCH = 8
# Two optimiser steps per epoch of two mini-batches each, two epochs: the mini-batches and steps cross the ranks'
# slices, so that every part of the global bookkeeping is exercised.
PPO = {"mini_batch_size": 2, "gradient_accumulation_steps": 2, "ppo_epochs": 2, "learning_rate": 3e-3}
CASES: dict[str, dict[str, Any]] = {
    "ppo": {"ppo": PPO},
    "ppo_clipped": {"ppo": {**PPO, "max_grad_norm": 0.1}},  # clipped at every step: the global norm decides
    "ppo_step_token_mean": {"ppo": {**PPO, "loss_reduction": "step_token_mean", "score_transform": "scale"}},
    "grpo_kl_in_loss": {
        "ppo": PPO,
        "algorithm": "grpo",
        "critic_free": {"kl_in": "loss", "loss_aggregation": "seq-mean-token-mean"},
    },
    "reinforce_pp": {"ppo": {**PPO, "loss_reduction": "step_token_mean"}, "algorithm": "reinforce_pp"},
    # Two turns of different prompt and response lengths, merged into one update: one process holds each turn
    # whole, one after the other; a rank holds its half of each.
    "ppo_two_turns": {"ppo": {**PPO, "score_transform": "normalize"}, "turns": 2},
    # Mini-batches of 4 in passes of 1 row on each rank, skipping the mini-batches whose mean ratio runs over 1.02.
    "ppo_micro_batches": {"ppo": {**PPO, "mini_batch_size": 4, "gradient_accumulation_steps": 1,
                                  "micro_batch_size": 1, "ratio_threshold": 1.02}},
    # The same in whole mini-batches: the loss metrics micro-batches report must be these.
    "ppo_whole_batches": {"ppo": {**PPO, "mini_batch_size": 4, "gradient_accumulation_steps": 1,
                                  "micro_batch_size": None, "ratio_threshold": 1.02}},
    # A game's action modes (marllm.algorithms.actions): each learner re-scores its rank's moves as it played them.
    "ppo_score": {"ppo": PPO, "actions": "score"},
    "grpo_constrained": {"ppo": PPO, "algorithm": "grpo", "actions": "constrained"},
    "reinforce_pp_think": {"ppo": {**PPO, "micro_batch_size": 1}, "algorithm": "reinforce_pp", "actions": "think"},
}
LEGAL_MOVES = (["good", "bad"], ["pass", "bet", "fold"], ["a b c", "a b d"], ["good", "bad"])
"""A game case's legal moves, per prompt of a turn (several tokens, two sharing their first ones)."""


SHARDED_CASES = ("ppo", "ppo_clipped", "grpo_kl_in_loss")
RATIO_SKIPS = {"ratio_threshold": 1.02}  # low enough that some mini-batches of the second epoch run over it


def build_learner(case: str, tokenizer: Any, placement: Any = None) -> PPOLearner:
    """The learner of ``case`` on a tiny GPT-2 seeded alike on every process, with the adaptive KL controller, under
    ``placement`` (None: whole models on one process; a Sharded one shards its models over the ranks)."""
    spec = CASES[case]
    extra: dict[str, Any] = {"actions": spec.get("actions", "generate")}
    learner_class = PPOLearner
    if "algorithm" in spec:
        learner_class = CriticFreeLearner
        settings = CriticFreeConfig(**spec.get("critic_free", {}))
        extra.update(algorithm=spec["algorithm"], group_size=2, settings=settings)
    return make_learner(
        tokenizer, 0, learner_class, extra, placement, init_kl_coef=0.05, kl_control="adaptive", **spec["ppo"]
    )


def rank_slice(rollout: Rollout | list[Rollout], rank: int, world_size: int) -> Rollout | list[Rollout]:
    """The ``rank``-th of ``world_size`` equal slices of a rewarded rollout (the rank's dialogues of the batch), or
    of each of a list of them."""
    if isinstance(rollout, list):
        return [one_rank_slice(turn, rank, world_size) for turn in rollout]
    return one_rank_slice(rollout, rank, world_size)


def state_after_update(learner: PPOLearner, rollouts: Rollout | list[Rollout]) -> dict[str, Any]:
    """One update on ``rollouts`` (a rollout, or one per turn); the gradient handed to each of its optimiser steps,
    and the learner's trained parameters (whole), metrics, η, score statistics and checkpoint tensors after it.
    Sharded, a collective."""
    gradients = step_gradients(learner)
    learner.rollouts = list(rollouts) if isinstance(rollouts, list) else [rollouts]
    metrics = learner.update()
    return {
        "gradients": gradients,
        "parameters": [full_tensor(p.detach()).clone() for p in learner._trained_parameters()],
        "state": {name: tensor.clone() for name, tensor in learner.state_dict()[0].items()},
        "metrics": metrics,
        "kl_coef": float(learner.kl_controller.value),
        "score_mean": float(learner.score_statistics.mean),
        "score_var": float(learner.score_statistics.var),
    }


def step_gradients(learner: PPOLearner) -> list[torch.Tensor]:
    """Record the gradient (whole, flattened) that each optimiser step of ``learner`` is handed, in step order.

    Adam's step depends on the gradient's scale only through ε, so the parameters after it barely show a gradient
    summed over the ranks with the wrong weight (halved, or doubled): the gradients themselves do. Sharded, each
    step's recording is a collective, as the step is.
    """
    recorded = []
    step = learner.optimizer.step

    def recording_step(*args, **kwargs):
        grads = [full_tensor(p.grad).flatten() for p in learner._trained_parameters() if p.grad is not None]
        recorded.append(torch.cat(grads).detach().clone())
        return step(*args, **kwargs)

    learner.optimizer.step = recording_step
    return recorded


GENERATION_PROMPTS = (("this movie was", "the story is"), ("i hated the", "what a"))  # one pair per rank


def generated(model: Any, tokenizer: Any, rank: int, placement: Any = None) -> tuple[str, ...]:
    """Responses of ``model`` to rank ``rank``'s prompts, sampled from a seed of the rank's own (the ranks'
    responses end at different lengths), in ``placement``'s generating block (None: none)."""
    torch.manual_seed(5 + rank)
    with placement.generating(model) if placement is not None else contextlib.nullcontext():
        return generate_responses(model, tokenizer, GENERATION_PROMPTS[rank], 8, GenerationConfig(1, 8)).texts


def sharded_generation(tokenizer: Any, rank: int) -> dict[str, Any]:
    """Each rank's responses from a sharded tiny GPT-2, gathered whole for generation and left sharded, and whether
    its parameters are shards again afterwards."""
    found: dict[str, Any] = {}
    for gather in (True, False):
        placement = Sharded.of_default_group(gather_for_generation=gather)
        model = placement.prepare(make_tiny_gpt2(tokenizer, seed=0))
        found[f"gathered={gather}"] = generated(model, tokenizer, rank, placement)
        found[f"sharded_after/gathered={gather}"] = all(isinstance(p, DTensor) for p in model.parameters())
    return found


def sharded_bfloat16(tokenizer: Any, part: Rollout) -> dict[str, Any]:
    """The ``ppo`` case's update with the sharded models computing in bfloat16 over float32 shards, and the dtypes
    the first decoder layer computed in."""
    placement = Sharded.of_default_group(compute_dtype=torch.bfloat16)
    learner = make_learner(tokenizer, 0, PPOLearner, None, placement, init_kl_coef=0.05, kl_control="adaptive", **PPO)
    computed = set()
    learner.model.transformer.h[0].register_forward_hook(lambda module, args, output: computed.add(output[0].dtype))
    result = state_after_update(learner, part)
    result["computed_in"] = computed
    return result


def sharded_agreement(tokenizer: Any, rank: int, part: Rollout) -> dict[str, Any]:
    """Sharded learners where ranks must agree to skip: mini-batches over a low ratio threshold (forwards with no
    backward), and a non-finite loss (rank 1's shard of one weight set to NaN, which the all-gather spreads)."""
    found = {}
    for name, overrides in {"ratio": RATIO_SKIPS, "nonfinite": {"on_nonfinite": "skip"}}.items():
        learner = make_learner(tokenizer, 0, PPOLearner, None, Sharded.of_default_group(), **{**PPO, **overrides})
        if name == "nonfinite" and rank == 1:
            with torch.no_grad():
                learner.model.transformer.ln_f.weight.to_local().fill_(float("nan"))
        before = [full_tensor(p.detach()).clone() for p in learner._trained_parameters()]
        found[name] = state_after_update(learner, copy.copy(part))
        found[name]["before"] = before
        found[name]["last_nonfinite"] = learner.last_nonfinite
    return found


def micro_batches_nonfinite(tokenizer: Any, placement: DataParallel, part: Rollout) -> dict[str, Any]:
    """The ``ppo_micro_batches`` case with ``on_nonfinite: skip`` where only rank 1's (whole) model is NaN: its first
    pass fails while rank 0's passes run on; both ranks must skip the same step and go on in step."""
    settings = {**CASES["ppo_micro_batches"]["ppo"], "on_nonfinite": "skip"}
    learner = make_learner(tokenizer, 0, PPOLearner, None, placement, init_kl_coef=0.05,
                           kl_control="adaptive", **settings)  # fmt: skip
    if placement.rank == 1:
        with torch.no_grad():
            learner.model.transformer.ln_f.weight.fill_(float("nan"))
    before = [p.detach().clone() for p in learner._trained_parameters()]
    found = state_after_update(learner, copy.copy(part))
    found["before"] = before
    found["last_nonfinite"] = learner.last_nonfinite
    return found


def on_rank(out_dir: str, placement: DataParallel) -> None:
    """One rank (:func:`marllm.testing.run_ranks`): every case's update on its slice of ``OUT/rollouts.pt``, into
    ``OUT/rank<r>.pt``."""
    torch.set_num_threads(1)
    tokenizer = make_tokenizer()
    rollouts = torch.load(f"{out_dir}/rollouts.pt", weights_only=False)
    results = {}
    place = (placement.rank, placement.world_size)
    for case in CASES:
        learner = build_learner(case, tokenizer, placement)
        part = rank_slice(rollouts[case], *place)
        results[case] = state_after_update(learner, part)
    results["micro/nonfinite"] = micro_batches_nonfinite(
        tokenizer, placement, rank_slice(rollouts["ppo_micro_batches"], *place)
    )
    for case in SHARDED_CASES:
        learner = build_learner(case, tokenizer, Sharded.of_default_group())
        part = rank_slice(rollouts[case], *place)
        results[f"fsdp/{case}"] = result = state_after_update(learner, part)
        held = [*learner._trained_parameters(), *learner.reference.parameters()]
        result["elements_held"] = sum(p.to_local().numel() for p in held)  # this rank's shards
        fresh = build_learner(case, tokenizer, Sharded.of_default_group())
        fresh.load_state_dict(*learner.state_dict())
        result["restored"] = fresh.state_dict()[0]
        learner.save(f"{out_dir}/export-{case}")
    results["fsdp/bfloat16"] = sharded_bfloat16(tokenizer, rank_slice(rollouts["ppo"], *place))
    results["fsdp/generation"] = sharded_generation(tokenizer, placement.rank)
    results["fsdp/agreement"] = sharded_agreement(tokenizer, placement.rank, rank_slice(rollouts["ppo"], *place))
    torch.save(results, f"{out_dir}/rank{placement.rank}.pt")
