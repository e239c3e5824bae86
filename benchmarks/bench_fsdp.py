"""Memory per rank and seconds per iteration of CORY on N data-parallel ranks, models replicated or sharded (FSDP).

    .venv/bin/python benchmarks/bench_fsdp.py [--nproc 2] [--iterations 4] [--n-layer 8] [--n-embd 512]
        [--model marllm:smollm2-135m-instruct]

Two learners (pioneer, observer) train full copies of a random GPT-2 (or ``--model``, e.g. the embedded SmolLM2, a
Llama) against one shared reference, as CORY does, with the global batch split over the ranks. Each configuration
runs under its own torchrun: one process alone, N ranks each holding whole models (``model.fsdp: false``), and N
ranks sharding them (``model.fsdp: true``). Per rank it reports the bytes of model state the rank holds after the
iterations (the parameters of both policies, their value heads and the reference; gradients; Adam's moments: local
shards where sharded), the peak resident set size, and the mean seconds of an iteration after the first (rank 0's,
and of each phase). Gloo on CPU; NCCL, one GPU per rank, with ``--device cuda``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch
from _models import chain_env, random_queries, run_child, save_random_model_counted
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from marllm.algorithms.ppo_config import GenerationConfig, PPOConfig
from marllm.assets import resolve_model
from marllm.loop import run_iteration
from marllm.models.placement import ModelPlacement
from marllm.models.policy import load_tokenizer
from marllm.parallel.distributed import join_ranks
from marllm.parallel.placement import DataParallel, Placement, Sharded
from marllm.run.learners import make_learners

MIB = 2**20
MODES = ("one process", "replicated", "sharded")
PHASES = ("generation", "forward", "update")


def local_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes this rank stores for ``tensors``: a sharded tensor's local shard, another tensor whole."""
    parts = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in parts)


def model_state(learners: dict[str, Any]) -> dict[str, int]:
    """Bytes of parameters (policies, value heads, the shared reference), gradients and Adam state on this rank."""
    parameters: dict[int, torch.Tensor] = {}
    for learner in learners.values():
        for module in (learner.model, learner.value_head, learner.reference):
            parameters.update({id(p): p for p in module.parameters()} if module is not None else {})
    trained = [p for learner in learners.values() for group in learner.optimizer.param_groups for p in group["params"]]
    adam = [v for learner in learners.values() for s in learner.optimizer.state.values() for v in s.values()]
    return {
        "parameters": local_bytes(list(parameters.values())),
        "gradients": local_bytes([p.grad for p in trained if p.grad is not None]),
        "adam": local_bytes([v for v in adam if isinstance(v, torch.Tensor)]),
    }


def measure(mode: str, model_dir: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """Train ``args.iterations`` CORY iterations on this rank; rank 0 returns every rank's figures."""
    joined = join_ranks(args.device)
    placement = (Sharded if mode == "sharded" else DataParallel).of_default_group() if joined else Placement()
    rank, world = placement.rank, placement.world_size
    tokenizer = load_tokenizer(model_dir)
    queries = random_queries(tokenizer, 4 * args.batch_size, 8)
    env = chain_env(queries, 2, args.batch_size, shard=(rank, world))
    learners, _ = make_learners(
        model_dir,
        ["llm1", "llm2"],
        PPOConfig.from_flat(mini_batch_size=args.batch_size // 2, ppo_epochs=1),
        GenerationConfig(min_new_tokens=args.new_tokens, max_new_tokens=args.new_tokens, stop_at_eos=False),
        placement=ModelPlacement(device=args.device, processes=placement),
        tokenizer=tokenizer,
    )
    seconds, phases = [], {phase: [] for phase in PHASES}
    for iteration in range(args.iterations):
        started = time.perf_counter()
        metrics, _ = run_iteration(env, learners, seed=0 if iteration == 0 else None)
        seconds.append(time.perf_counter() - started)
        for phase in PHASES:
            phases[phase].append(metrics[f"time/{phase}_s"])  # summed over the learners
    figures = {
        **model_state(learners),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cuda_peak_mib": torch.cuda.max_memory_allocated() / MIB if torch.cuda.is_available() else None,
        "s_per_iteration": float(np.mean(seconds[1:])),
        "sd": float(np.std(seconds[1:])),
        **{phase: float(np.mean(values[1:])) for phase, values in phases.items()},
    }
    everyone = gather_figures(figures, world) if joined else [figures]
    placement.close()
    return {"mode": mode, "ranks": everyone} if rank == 0 else None


def gather_figures(figures: dict[str, Any], world: int) -> list[dict[str, Any]]:
    everyone: list[Any] = [None] * world
    torch.distributed.all_gather_object(everyone, figures)
    return everyone


def run_mode(mode: str, model_dir: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one configuration under torchrun (N ranks) or alone; return rank 0's JSON."""
    options = ["--child", mode, model_dir, "--iterations", str(args.iterations), "--batch-size", str(args.batch_size),
               "--new-tokens", str(args.new_tokens), "--device", args.device]
    nproc = 1 if mode == "one process" else args.nproc
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    command = [*launcher, __file__, *options] if nproc > 1 else [sys.executable, __file__, *options]
    environment = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    completed = subprocess.run(command, capture_output=True, text=True, env=environment)
    if completed.returncode != 0:
        raise RuntimeError(f"{mode} failed (exit {completed.returncode}):\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def format_row(result: dict[str, Any]) -> str:
    ranks = result["ranks"]
    worst = {key: max(r[key] for r in ranks) for key in ("parameters", "gradients", "adam", "peak_rss_mib")}
    state = worst["parameters"] + worst["gradients"] + worst["adam"]
    cuda = max((r["cuda_peak_mib"] or 0) for r in ranks)
    row = (
        f"{result['mode']:<12}{len(ranks):>6}{worst['parameters'] / MIB:>12.0f}{worst['gradients'] / MIB:>11.0f}"
        f"{worst['adam'] / MIB:>8.0f}{state / MIB:>13.0f}{worst['peak_rss_mib']:>10.0f}"
        f"{ranks[0]['s_per_iteration']:>8.2f} ± {ranks[0]['sd']:.2f}"
        + "".join(f"{ranks[0][phase]:>{len(phase) + 2}.2f}" for phase in PHASES)
    )
    return row + (f"{cuda:>11.0f}" if cuda else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--n-layer", type=int, default=8)
    parser.add_argument("--n-embd", type=int, default=512)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--batch-size", type=int, default=8, help="global dialogues per iteration")
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--model", help="a model directory or marllm: model to train instead of a random GPT-2")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "MODEL_DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--save-model", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    hf_logging.disable_progress_bar()
    if args.child is not None:
        result = measure(args.child[0], args.child[1], args)
        if result is not None:
            print(json.dumps(result))
        return
    if args.save_model is not None:
        heads = args.n_embd // 64
        print(json.dumps(save_random_model_counted(args.save_model, args.vocab_size, args.n_layer, args.n_embd, heads)))
        return
    if args.iterations < 2 or args.nproc < 2 or args.batch_size % (2 * args.nproc):
        parser.error("give --iterations >= 2, --nproc >= 2, and a --batch-size that splits into 2 mini-batches a rank")
    with tempfile.TemporaryDirectory(prefix="marllm-bench-") as scratch:
        if args.model is None:
            model_dir, what = scratch, "random GPT-2"
            shape = {"vocab_size": args.vocab_size, "n_layer": args.n_layer, "n_embd": args.n_embd}
            params = run_child(__file__, ["--save-model", model_dir], shape)["parameters"]
        else:
            model_dir, what = resolve_model(args.model), args.model
            params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
        print(
            f"CORY, 2 full-model learners + 1 reference; {what} of {params / 1e6:.1f}M parameters "
            f"({4 * params / MIB:.0f} MiB in float32); global batch {args.batch_size}, {args.new_tokens} new tokens; "
            f"{args.threads} torch thread(s) per process; {args.device}"
        )
        print(f"{'models':<12}{'ranks':>6}{'params':>12}{'grads':>11}{'adam':>8}{'model state':>13}{'peak RSS':>10}"
              f"{'s/iteration':>14}" + "".join(f"  {phase}" for phase in PHASES)
              + f"{' CUDA peak' if args.device == 'cuda' else ''}   (MiB per rank, the largest; seconds)")
        for mode in args.modes:
            print(format_row(run_mode(mode, model_dir, args)), flush=True)


if __name__ == "__main__":
    main()
