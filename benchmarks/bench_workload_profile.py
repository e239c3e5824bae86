"""Where the memory and time of the shared CORY workload go: resident memory and seconds by phase of each iteration.

The workload is the one ``../shared/bench/`` builds (``make_workload.py WORKLOAD_DIR``): a random GPT-2 of 4 layers ×
256 with a byte-level BPE vocabulary of 8,192 (5.32M parameters), review-like queries, two full-model learners
(pioneer and observer, ``SharedReward`` and ``RolePermutation`` with period 5) and one shared frozen reference, batch
64 = mini-batch, 4 PPO epochs, 4–16 new tokens, full-vocabulary KL, score normalisation and a word-count reward —
the settings ``../shared/bench/marllm_workload.py`` times. The phases are those of ``bench_memory_profile.py``
(generation, rollout forwards, env step, update, per learner); each row gives the phase's seconds and its resident
set size at start, peak (``VmHWM``, reset at every phase boundary) and end, in MiB.

    .venv/bin/python benchmarks/bench_workload_profile.py runs/bench-workload [--iterations 6] [--threads 0]
        [--mini-batch-size N --accumulation K] [--micro-batch-size auto|none|M] [--fused-kernels true|false]
        [--rollout-from-generate auto|true|false] [--autocast-dtype bfloat16] [--tensors]

The cost settings default to PPOConfig's (micro-batches of 32 rows, fused kernels, the rollout from generate's
forwards); ``--micro-batch-size none --fused-kernels false --rollout-from-generate false`` is the path before them.

``--tensors`` reruns the iterations under the torch profiler and adds each phase's peak of live tensor bytes and
its largest allocations (slow; a separate process). Memory figures do not depend on the thread count; seconds do.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _models import run_child
from bench_memory_profile import format_table, run_phases
from transformers.utils import logging as hf_logging

from marllm.algorithms.ppo_config import GenerationConfig, PPOConfig
from marllm.envs import env as text_env
from marllm.run.learners import make_learners
from marllm.wrappers import RolePermutation, SharedReward

POSITIVE = {"great", "good", "wonderful", "brilliant", "best", "love", "fun", "beautiful", "funny"}
OBSERVER = 'I can make this sentence "{query}{pioneer}" more positive: {query}'


def word_count_reward(samples: Any, responses: list[str]) -> list[float]:
    """The workload's cheap reward: the share of positive words in each response."""
    scores = []
    for text in responses:
        words = text.split()
        scores.append(sum(word.strip(".,") in POSITIVE for word in words) / max(1, len(words)))
    return scores


def measure(kind: str, workload: str, args: argparse.Namespace) -> dict[str, Any]:
    """Build the workload's learners and run ``args.iterations`` iterations with phases recorded."""
    torch.manual_seed(0)
    queries = json.loads((Path(workload) / "queries.json").read_text())
    env = text_env(
        dataset=[{"query": query} for query in queries],
        roles=["pioneer", "observer"],
        templates={"pioneer": "{query}", "observer": OBSERVER},
        reward_fn=word_count_reward,
        batch_size=args.batch_size,
    )
    env = RolePermutation(SharedReward(env), period=5)
    ppo = PPOConfig.from_flat(
        learning_rate=1.41e-5,
        mini_batch_size=args.mini_batch_size or args.batch_size,
        gradient_accumulation_steps=args.accumulation,
        micro_batch_size=args.micro_batch_size,
        fused_kernels=args.fused_kernels,
        rollout_from_generate=args.rollout_from_generate,
        autocast_dtype=args.autocast_dtype,
        ppo_epochs=4,
        kl_penalty="full",
        score_transform="normalize",
        init_kl_coef=0.3,
    )
    generation = GenerationConfig(min_new_tokens=4, max_new_tokens=16, top_k=0, top_p=1.0, repetition_penalty=1.1)
    model_dir = str(Path(workload) / "model")
    return run_phases(
        kind,
        lambda: make_learners(model_dir, env.possible_agents, ppo, generation, seed=0)[0],
        env,
        args.iterations,
        0,
        4,
    )


def median_iteration_seconds(rows: list[dict[str, Any]]) -> float:
    """The median over iterations of the seconds of their phases (rows as :func:`measure` returns them)."""
    starts = [i for i, row in enumerate(rows) if row["phase"].startswith("iteration ")] + [len(rows)]
    seconds = sorted(sum(row["seconds"] for row in rows[a:b]) for a, b in zip(starts, starts[1:], strict=False))
    return seconds[len(seconds) // 2]


def _switch(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def _auto_switch(text: str) -> bool | str:
    return "auto" if text.lower() == "auto" else _switch(text)


def _micro_batch_size(text: str) -> int | str | None:
    if text.lower() in ("auto", "none"):
        return None if text.lower() == "none" else "auto"
    return int(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", help="the directory make_workload.py wrote")
    parser.add_argument("--iterations", type=int, default=6, help="iterations measured (6 crosses a role swap)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--mini-batch-size", type=int, default=None, help="ppo.batching.mini_batch_size (default: the batch)"
    )
    parser.add_argument("--accumulation", type=int, default=1, help="ppo.batching.gradient_accumulation_steps")
    parser.add_argument(
        "--micro-batch-size",
        type=_micro_batch_size,
        default="auto",
        help="ppo.compute.micro_batch_size: auto, none or N",
    )
    parser.add_argument("--fused-kernels", type=_switch, default=True, help="ppo.compute.fused_kernels: true or false")
    parser.add_argument(
        "--rollout-from-generate",
        type=_auto_switch,
        default="auto",
        help="ppo.compute.rollout_from_generate: auto/true/false",
    )
    parser.add_argument("--autocast-dtype", choices=["bfloat16"], default=None, help="ppo.compute.autocast_dtype")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's choice)")
    parser.add_argument("--tensors", action="store_true", help="also profile tensor allocations (slow)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    hf_logging.disable_progress_bar()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.child is not None:
        print(json.dumps(measure(args.child, args.workload, args)))
        return
    names = ("iterations", "batch_size", "mini_batch_size", "accumulation", "micro_batch_size", "autocast_dtype")
    options = {name: getattr(args, name) for name in names}
    for name in ("micro_batch_size", "fused_kernels", "rollout_from_generate"):  # passed on as words
        options[name] = str(getattr(args, name)).lower()
    options["threads"] = args.threads
    started = time.perf_counter()
    rss = run_child(__file__, [args.workload, "--child", "rss"], options)
    tensors = run_child(__file__, [args.workload, "--child", "tensors"], options) if args.tensors else None
    print(f"shared workload {args.workload}: {args.iterations} iterations, torch threads {args.threads or 'default'}")
    print(f"tokens per sequence (prompt+response), in generation order: {', '.join(rss['shapes'])}")
    print(format_table(rss, tensors))
    print(f"seconds per iteration: median {median_iteration_seconds(rss['rows']):.2f} of {args.iterations}")
    print(f"wall {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
