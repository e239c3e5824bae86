"""Peak memory of N = 1, 2, 3 agents: full-model learners against LoRA learners on one shared base.

Full models: N trainable policies (each with gradients and Adam state) + 1 frozen reference shared by all.
LoRA: one frozen base carrying N adapters; the reference is the base with the adapters disabled, so adding an
agent adds only an adapter, its gradients and its Adam state.

Each configuration runs in a fresh Python process, so that one configuration's freed memory cannot hide another's
peak: the process builds the learners with ``make_learners``, runs one training iteration (``run_iteration`` on the
sequential N-agent env; Adam state is allocated at the first step) and reports ``ru_maxrss`` (peak resident set
size) and, on CUDA, ``torch.cuda.max_memory_allocated``. The model is a random GPT-2 large enough to dominate the
Python/torch baseline (default 8 layers, n_embd 512, vocab 8000: about 30M parameters, 112 MiB in float32) and the
batch is small so that activations do not.

    .venv/bin/python benchmarks/bench_memory.py [--agents 1 2 3] [--modes full lora] [--device auto]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from typing import Any

import torch
from _models import chain_env, learner_ids, random_queries, run_child, save_random_model_counted
from transformers.utils import logging as hf_logging

from marllm.algorithms.ppo_config import GenerationConfig, PPOConfig
from marllm.loop import run_iteration
from marllm.models.lora import LoraSettings
from marllm.models.placement import ModelPlacement
from marllm.models.policy import load_tokenizer, resolve_device
from marllm.run.learners import make_learners

MODES = ("full", "lora")
MAX_AGENTS = 3
QUERY_TOKENS = 8
MIB = 2**20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 2, 3], help="agent counts to measure (1..3)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), help=f"learner kinds to measure, of {MODES}")
    parser.add_argument("--n-layer", type=int, default=8, help="GPT-2 layers")
    parser.add_argument("--n-embd", type=int, default=512, help="GPT-2 width (a multiple of 64: heads of 64)")
    parser.add_argument("--vocab-size", type=int, default=8000, help="vocabulary size of the random model")
    parser.add_argument("--batch-size", type=int, default=4, help="dialogues per iteration")
    parser.add_argument("--new-tokens", type=int, default=8, help="tokens generated per response")
    parser.add_argument("--lora-rank", type=int, default=16, help="LoRA rank r (alpha = 2r, on GPT-2's c_attn)")
    parser.add_argument("--device", default="auto", help="'auto' (CUDA when available), 'cpu' or 'cuda'")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads in each measured process")
    # Internal: run one configuration and print its figures as JSON (what the parent process starts).
    parser.add_argument("--child", nargs=3, metavar=("MODE", "AGENTS", "MODEL_DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--save-model", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    bad_modes = [m for m in args.modes if m not in MODES]
    if bad_modes:
        parser.error(f"--modes {bad_modes} unknown; choose from {list(MODES)}")
    bad_agents = [n for n in args.agents if not 1 <= n <= MAX_AGENTS]
    if bad_agents:
        parser.error(f"--agents {bad_agents} out of range; each must be in 1..{MAX_AGENTS}")
    for name in ("n_layer", "n_embd", "batch_size", "new_tokens", "lora_rank"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.n_embd % 64:
        parser.error(f"--n-embd must be a multiple of 64 (attention heads of 64), got {args.n_embd}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.device not in ("auto", "cpu", "cuda"):
        parser.error(f"--device must be 'auto', 'cpu' or 'cuda', got {args.device!r}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here")
    return args


def peak_rss_mib() -> float:
    """The process's peak resident set size so far (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ------------------------------------------------------------------------------------------------ one configuration
def measure_one(mode: str, num_agents: int, model_dir: str, args: argparse.Namespace) -> dict[str, Any]:
    """Build ``num_agents`` learners of kind ``mode``, run one iteration, and return the memory figures."""
    device = str(resolve_device(args.device))
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    imported = peak_rss_mib()
    tokenizer = load_tokenizer(model_dir)
    env = chain_env(random_queries(tokenizer, 2 * args.batch_size, QUERY_TOKENS), num_agents, args.batch_size)
    lora = (
        LoraSettings(r=args.lora_rank, alpha=2 * args.lora_rank, target_modules=["c_attn"]) if mode == "lora" else None
    )
    learners, _ = make_learners(
        model_dir,
        learner_ids(num_agents),
        PPOConfig.from_flat(mini_batch_size=args.batch_size, ppo_epochs=1),
        GenerationConfig(min_new_tokens=args.new_tokens, max_new_tokens=args.new_tokens, stop_at_eos=False),
        placement=ModelPlacement(device=device, lora=lora),
        tokenizer=tokenizer,
    )
    run_iteration(env, learners, seed=0)
    trainable = sum(
        p.numel() for learner in learners.values() for group in learner.optimizer.param_groups for p in group["params"]
    )
    return {
        "mode": mode,
        "agents": num_agents,
        "device": device,
        "trainable_params": trainable,
        "import_rss_mib": imported,
        "peak_rss_mib": peak_rss_mib(),
        "cuda_peak_mib": torch.cuda.max_memory_allocated() / MIB if cuda else None,
    }


def child_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options a measured child process is started with (the model's shape and the workload)."""
    names = ("n_layer", "n_embd", "vocab_size", "batch_size", "new_tokens", "lora_rank", "device", "threads")
    return {name: getattr(args, name) for name in names}


# ------------------------------------------------------------------------------------------------ report
def format_table(results: list[dict[str, Any]]) -> str:
    """One row per (mode, agents): models held, trainable parameters, RSS figures and the delta over N = 1."""
    cuda = any(r["cuda_peak_mib"] is not None for r in results)
    header = f"{'mode':<6}{'agents':>7}{'models held':>22}{'trainable M':>13}{'peak RSS':>10}{'delta N=1':>11}"
    if cuda:
        header += f"{'CUDA peak':>11}{'delta N=1':>11}"
    rows = [header + "   (MiB unless noted)"]
    first = {}
    for r in results:
        first.setdefault(r["mode"], r)
        base = first[r["mode"]]
        n = r["agents"]
        held = (
            f"{n} {'policy' if n == 1 else 'policies'} + 1 ref" if r["mode"] == "full" else f"1 base + {n} adapter(s)"
        )
        delta = r["peak_rss_mib"] - base["peak_rss_mib"] if base["agents"] == 1 else float("nan")
        row = (
            f"{r['mode']:<6}{n:>7}{held:>22}{r['trainable_params'] / 1e6:>13.2f}"
            f"{r['peak_rss_mib']:>10.0f}{delta:>+11.0f}"
        )
        if cuda:
            cuda_delta = r["cuda_peak_mib"] - base["cuda_peak_mib"] if base["agents"] == 1 else float("nan")
            row += f"{r['cuda_peak_mib']:>11.0f}{cuda_delta:>+11.0f}"
        rows.append(row)
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    hf_logging.disable_progress_bar()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.child is not None:
        mode, agents, model_dir = args.child
        print(json.dumps(measure_one(mode, int(agents), model_dir, args)))
        return
    if args.save_model is not None:
        heads = args.n_embd // 64
        saved = save_random_model_counted(args.save_model, args.vocab_size, args.n_layer, args.n_embd, heads)
        print(json.dumps(saved))
        return
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="marllm-bench-") as model_dir:
        params = run_child(__file__, ["--save-model", model_dir], child_options(args))["parameters"]
        print(
            f"model: random GPT-2, {args.n_layer} layers, n_embd {args.n_embd}, vocab {args.vocab_size} "
            f"({params / 1e6:.1f}M parameters, {4 * params / MIB:.0f} MiB in float32); batch {args.batch_size}, "
            f"{args.new_tokens} new tokens; LoRA r={args.lora_rank} on c_attn; one fresh process per row"
        )
        results = []
        for mode in args.modes:
            for num_agents in sorted(args.agents):
                results.append(run_child(__file__, ["--child", mode, str(num_agents), model_dir], child_options(args)))
                print(f"  measured {mode} x{num_agents}", file=sys.stderr)
    print(f"device: {results[0]['device']}; Python + torch + marllm imported: {results[0]['import_rss_mib']:.0f} MiB")
    print(format_table(results))
    print(
        f"load average (1 min) before {load_before:.2f}, after {os.getloadavg()[0]:.2f}; "
        f"wall {time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
