"""Time one training iteration of marllm by phase, next to the bare-torch floor on the same tensors.

Two settings run through marllm's own loop (``make_learners`` + ``run_iteration`` on ``SequentialTextEnv``):
single-agent PPO (one learner, one role) and 2-agent CORY (pioneer + observer, ``SharedReward`` and
``RolePermutation``). The reward is a cheap pure-Python function, so the model phases dominate.

Phases, as marllm's learners and loop time them (summed over learners):
    generation  tokenize the prompts, ``model.generate``, decode the responses
    forwards    the rollout scoring: policy logits + value head, reference logits, log-probs and KL
    reward      the env steps: rendering the next role's prompts and computing (and mixing) the task rewards
    update      PPO: token rewards, GAE, ``ppo_epochs × (B / mini_batch)`` forward/backward passes and Adam steps

The floor is the least any implementation must do on the same tensors, written with torch/transformers only:
one ``generate`` per agent with the same prompt ids, sampling settings and token budget; one no-grad forward of the
policy and one of the reference over the generated sequences; the reward function called once per agent; and
``ppo_epochs × (B / mini_batch)`` forward+backward passes of the policy with a trivial loss (the mean log-prob of
the response tokens) and an Adam step each. Overhead = marllm seconds / floor seconds.

Each figure is the median of ``--repeats`` iterations after one warm-up iteration; marllm and floor iterations
alternate so that a change of machine load hits both alike.

    .venv/bin/python benchmarks/bench_iteration.py [--model DIR] [--batch-size 64] [--new-tokens 16] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _models import chain_env, distinct_word_reward, learner_ids, parameter_count, random_queries, save_random_model
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from marllm.algorithms.ppo_config import GenerationConfig, PPOConfig
from marllm.loop import run_iteration
from marllm.models.placement import ModelPlacement
from marllm.models.policy import load_tokenizer
from marllm.run.learners import make_learners

PHASES = ("generation", "forwards", "reward", "update")
MARLLM_KEYS = {
    "generation": "time/generation_s",
    "forwards": "time/forward_s",
    "reward": "time/reward_s",
    "update": "time/update_s",
}
MODES = {"PPO (1 agent)": 1, "CORY (2 agents)": 2}
QUERY_TOKENS = 8
SEED = 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        default=None,
        help="a local Hugging Face model directory (with its tokenizer); default: a random GPT-2 built in memory "
        "(4 layers, n_embd 256, vocab 8000)",
    )
    parser.add_argument("--batch-size", type=int, default=64, help="dialogues per iteration (B)")
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens generated per response (fixed budget)")
    parser.add_argument("--mini-batch-size", type=int, default=32, help="samples per PPO forward/backward pass")
    parser.add_argument("--ppo-epochs", type=int, default=2, help="passes over the batch per PPO update")
    parser.add_argument("--repeats", type=int, default=3, help="timed iterations per mode (after one warm-up)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads, 0 for torch's choice (all cores); default 1: a single thread is barely "
        "disturbed by other processes on a shared machine, where several spinning threads slow down many-fold",
    )
    args = parser.parse_args(argv)
    for name in ("batch_size", "new_tokens", "mini_batch_size", "ppo_epochs", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.batch_size % args.mini_batch_size:
        parser.error(f"--batch-size {args.batch_size} must be divisible by --mini-batch-size {args.mini_batch_size}")
    if args.threads < 0:
        parser.error(f"--threads must be >= 0 (0: torch's choice), got {args.threads}")
    if args.model is not None and not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model {args.model!r} is not a model directory (no config.json in it)")
    return args


# ------------------------------------------------------------------------------------------------ the bare floor
class Floor:
    """Bare torch/transformers versions of each phase for ``num_agents`` policies and one reference."""

    def __init__(self, model_dir: str, num_agents: int, tokenizer: Any, generation: GenerationConfig, ppo: PPOConfig):
        self.tokenizer = tokenizer
        self.generation = generation
        self.ppo = ppo
        self.policies = [AutoModelForCausalLM.from_pretrained(model_dir).eval() for _ in range(num_agents)]
        self.reference = AutoModelForCausalLM.from_pretrained(model_dir).eval().requires_grad_(False)
        self.optimizers = [
            torch.optim.Adam(policy.parameters(), lr=ppo.optimiser.learning_rate) for policy in self.policies
        ]

    def iteration(self, prompts_per_agent: list[tuple[str, ...]], samples: list[dict], responses: list[Any]) -> dict:
        """Seconds per phase for one iteration; ``prompts_per_agent[i]`` are the prompts marllm's agent i answered."""
        seconds = dict.fromkeys(PHASES, 0.0)
        for policy, optimizer, prompts, texts in zip(
            self.policies, self.optimizers, prompts_per_agent, responses, strict=True
        ):
            encoded = self.tokenizer(list(prompts), return_tensors="pt", padding=True)  # untimed: (B, P), left-padded
            prompt_ids, prompt_mask = encoded["input_ids"], encoded["attention_mask"]

            started = time.perf_counter()
            sequences = self._generate(policy, prompt_ids, prompt_mask)  # (B, P+L)
            seconds["generation"] += time.perf_counter() - started

            mask = torch.cat([prompt_mask, torch.ones_like(sequences[:, prompt_ids.shape[1] :])], 1)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            started = time.perf_counter()
            with torch.no_grad():
                policy(input_ids=sequences, attention_mask=mask, position_ids=positions, use_cache=False)
                self.reference(input_ids=sequences, attention_mask=mask, position_ids=positions, use_cache=False)
            seconds["forwards"] += time.perf_counter() - started

            started = time.perf_counter()
            distinct_word_reward(samples, list(texts))
            seconds["reward"] += time.perf_counter() - started

            started = time.perf_counter()
            self._update(policy, optimizer, sequences, mask, positions, prompt_ids.shape[1])
            seconds["update"] += time.perf_counter() - started
        return seconds

    @torch.no_grad()
    def _generate(self, policy: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        g = self.generation
        budget = g.max_new_tokens
        return policy.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            do_sample=True,
            max_new_tokens=budget,
            min_new_tokens=budget,
            top_k=g.top_k,
            top_p=g.top_p,
            temperature=g.temperature,
            repetition_penalty=g.repetition_penalty,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
        )

    def _update(
        self,
        policy: Any,
        optimizer: torch.optim.Optimizer,
        sequences: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        prompt_length: int,
    ) -> None:
        batch_size = sequences.shape[0]
        for _ in range(self.ppo.batching.ppo_epochs):
            order = torch.randperm(batch_size)
            for start in range(0, batch_size, self.ppo.batching.mini_batch_size):
                rows = order[start : start + self.ppo.batching.mini_batch_size]
                logits = policy(
                    input_ids=sequences[rows], attention_mask=mask[rows], position_ids=positions[rows], use_cache=False
                ).logits[:, prompt_length - 1 : -1]  # (b, L, V)
                response = sequences[rows, prompt_length:]  # (b, L)
                loss = -logits.log_softmax(-1).gather(-1, response.unsqueeze(-1)).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)


# ------------------------------------------------------------------------------------------------ measuring
def measure_mode(model_dir: str, num_agents: int, args: argparse.Namespace) -> dict[str, Any]:
    """Alternate marllm and floor iterations; returns per-repeat seconds of both and the prompt shapes."""
    tokenizer = load_tokenizer(model_dir)
    generation = GenerationConfig(min_new_tokens=args.new_tokens, max_new_tokens=args.new_tokens, stop_at_eos=False)
    ppo = PPOConfig.from_flat(mini_batch_size=args.mini_batch_size, ppo_epochs=args.ppo_epochs)
    dataset = random_queries(tokenizer, 4 * args.batch_size, QUERY_TOKENS, seed=SEED)
    env = chain_env(dataset, num_agents, args.batch_size)
    ids = learner_ids(num_agents)
    learners, _ = make_learners(
        model_dir, ids, ppo, generation, seed=SEED, placement=ModelPlacement(device="cpu"), tokenizer=tokenizer
    )
    floor = Floor(model_dir, num_agents, tokenizer, generation, ppo)
    marllm_runs, floor_runs = [], []
    prompt_tokens: dict[str, int] = {}
    for repeat in range(1 + args.repeats):
        torch.manual_seed(SEED + repeat)
        metrics, dialogues = run_iteration(env, learners, seed=SEED if repeat == 0 else None)
        # Agent order is speaking order: llm1 is the pioneer until the first role swap (after 5 iterations).
        ordered = sorted(dialogues.values(), key=lambda d: env.unwrapped.roles.index(d["role"]))
        prompts = [d["turns"][0]["prompts"] for d in ordered]  # each role speaks once in this chain
        responses = [d["turns"][0]["responses"] for d in ordered]
        torch.manual_seed(SEED + repeat)
        floor_seconds = floor.iteration(prompts, env.unwrapped.samples, responses)
        if repeat == 0:  # the warm-up
            for d in ordered:
                prompt_tokens[d["role"]] = len(tokenizer(list(d["turns"][0]["prompts"]), padding=True)["input_ids"][0])
            continue
        marllm_runs.append(
            {phase: metrics[key] for phase, key in MARLLM_KEYS.items()} | {"total": metrics["time/iteration_s"]}
        )
        floor_runs.append(floor_seconds | {"total": sum(floor_seconds.values())})
    return {"marllm": marllm_runs, "floor": floor_runs, "prompt_tokens": prompt_tokens}


def median(runs: list[dict[str, float]], key: str) -> float:
    """The median over repeats of one figure."""
    return statistics.median(run[key] for run in runs)


def format_table(mode: str, result: dict[str, Any]) -> str:
    """The phase table of one mode: medians in seconds and marllm / floor."""
    rows = [f"{'phase':<12}{'marllm s':>11}{'floor s':>11}{'overhead':>10}"]
    for phase in (*PHASES, "total"):
        ours, floor = median(result["marllm"], phase), median(result["floor"], phase)
        ratio = f"{ours / floor:.2f}x" if floor > 0 else "n/a"
        rows.append(f"{phase:<12}{ours:>11.4f}{floor:>11.4f}{ratio:>10}")
    totals = ", ".join(f"{run['total']:.2f}" for run in result["marllm"])
    shapes = ", ".join(f"{role} {p}+{result['new_tokens']}" for role, p in result["prompt_tokens"].items())
    return "\n".join(
        [
            f"{mode}; tokens per sequence (prompt+response): {shapes}",
            *rows,
            f"marllm iteration totals of the {len(result['marllm'])} repeats: {totals} s",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    hf_logging.disable_progress_bar()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="marllm-bench-") as scratch:
        if args.model is None:
            # make_learners loads from a path, so the in-memory random model is saved to a scratch directory.
            model_dir = str(save_random_model(scratch, vocab_size=8000, n_layer=4, n_embd=256, n_head=4))
        else:
            model_dir = args.model
        probe = AutoModelForCausalLM.from_pretrained(model_dir)
        print(
            f"model: {args.model or 'random GPT-2 (4 layers, n_embd 256, vocab 8000)'}, "
            f"{parameter_count(probe) / 1e6:.2f}M parameters; batch {args.batch_size}, {args.new_tokens} new tokens, "
            f"mini-batch {args.mini_batch_size}, {args.ppo_epochs} PPO epochs; torch threads "
            f"{torch.get_num_threads()}; median of {args.repeats} after 1 warm-up"
        )
        del probe
        results = {}
        for mode, num_agents in MODES.items():
            results[mode] = measure_mode(model_dir, num_agents, args) | {"new_tokens": args.new_tokens}
            print()
            print(format_table(mode, results[mode]))
            sys.stdout.flush()
    print(
        f"\nload average (1 min) before {load_before:.2f}, after {os.getloadavg()[0]:.2f}; "
        f"wall {time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
