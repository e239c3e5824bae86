"""Where the memory of a small CORY run goes: peak resident memory by phase of one training iteration.

The workload: a random 5.3M-parameter GPT-2 with GPT-2's vocabulary (50257 tokens, 4 layers, n_embd 96, so most
parameters are the embedding), two full-model learners (pioneer and observer, ``SharedReward`` and
``RolePermutation``) and one shared frozen reference, a batch of 64 dialogues, 4–16 new tokens, 4 PPO epochs with
mini-batches of 64 and ``kl_penalty: full``. With a vocabulary this large next to so small a model, the (B, L, V)
logits and their log-softmax copies (64 × 17 × 50257 float32 is 209 MiB each) dwarf the weights, gradients and
Adam state (about 21 MiB per copy of the model).

Each measurement runs in a fresh Python process (Linux carries ``ru_maxrss`` from a parent into its children), which
builds the learners with ``make_learners`` and runs ``--iterations`` iterations of ``run_iteration``. The learners'
methods are wrapped so that the iteration splits into phases, in the order they happen:

    <learner> generation   tokenize the prompts, ``generate``, decode
    <learner> forwards     the rollout scoring: policy + value head, reference, log-probs and KL
    env step               the env renders the next role's prompts or, after the last role, computes the rewards
    <learner> update       token rewards, GAE, the PPO epochs (forward, backward, Adam step)

For each phase the table gives its seconds (with ``--threads 1`` by default; a guide to relative cost, not a timing
benchmark), the resident set size (RSS) at its start, its peak within the phase (the kernel's high-water mark
``VmHWM``, reset at every phase boundary by writing 5 to ``/proc/self/clear_refs``) and at its end.
A second fresh process reruns the same iteration under the torch profiler with ``profile_memory=True`` and adds, per
phase, the peak of the tensor bytes allocated within the phase and alive at once (net of what the phase freed of
earlier tensors), and the largest tensor allocations with the aten op that made them.

    .venv/bin/python benchmarks/bench_memory_profile.py [--iterations 1] [--min-new-tokens 4] [--max-new-tokens 16]
        [--no-tensors] [--threads 1]
"""

from __future__ import annotations

import argparse
import bisect
import json
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from _models import chain_env, learner_ids, random_queries, run_child, save_random_model_counted
from transformers.utils import logging as hf_logging

from marllm.algorithms.ppo import PPOLearner
from marllm.algorithms.ppo_config import GenerationConfig, PPOConfig
from marllm.loop import run_iteration
from marllm.models.placement import ModelPlacement
from marllm.models.policy import load_tokenizer
from marllm.run.learners import make_learners

QUERY_TOKENS = 8
MIB = 2**20
SEED = 0
BIG_ALLOCATION = MIB  # tensor allocations listed per phase: at least this many bytes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=2, help="learners (2: CORY's pioneer and observer)")
    parser.add_argument("--n-layer", type=int, default=4, help="GPT-2 layers")
    parser.add_argument("--n-embd", type=int, default=96, help="GPT-2 width")
    parser.add_argument("--n-head", type=int, default=2, help="attention heads (must divide --n-embd)")
    parser.add_argument("--vocab-size", type=int, default=50257, help="vocabulary size (GPT-2's by default)")
    parser.add_argument("--batch-size", type=int, default=64, help="dialogues per iteration")
    parser.add_argument("--min-new-tokens", type=int, default=4, help="generation.min_new_tokens")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="generation.max_new_tokens")
    parser.add_argument("--mini-batch-size", type=int, default=64, help="ppo.batching.mini_batch_size")
    parser.add_argument("--ppo-epochs", type=int, default=4, help="ppo.batching.ppo_epochs")
    parser.add_argument("--kl-penalty", default="full", choices=("k1", "full"), help="ppo.kl.kl_penalty")
    parser.add_argument("--forward-batch-size", type=int, default=None, help="ppo.compute.forward_batch_size")
    parser.add_argument(
        "--logprobs-from", default="tempered", choices=("tempered", "sampling"), help="generation.logprobs_from"
    )
    parser.add_argument("--iterations", type=int, default=1, help="training iterations measured")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's choice)")
    parser.add_argument("--no-tensors", action="store_true", help="skip the torch-profiler run")
    parser.add_argument("--top", type=int, default=4, help="largest allocations listed per phase")
    # Internal: what the parent process starts.
    parser.add_argument("--child", nargs=2, metavar=("KIND", "MODEL_DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--save-model", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("agents", "n_layer", "n_embd", "n_head", "batch_size", "min_new_tokens", "iterations"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.n_embd % args.n_head:
        parser.error(f"--n-head {args.n_head} must divide --n-embd {args.n_embd}")
    if args.max_new_tokens < args.min_new_tokens:
        parser.error("--max-new-tokens must be >= --min-new-tokens")
    return args


# ------------------------------------------------------------------------------------------------ resident memory
def _status_mib(key: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise KeyError(key)


def rss_mib() -> float:
    """The resident set size now."""
    return _status_mib("VmRSS")


def hwm_mib() -> float:
    """The resident set size's high-water mark since the process started or :func:`reset_hwm`."""
    return _status_mib("VmHWM")


def reset_hwm() -> None:
    """Reset the high-water mark to the current RSS (Linux ≥ 4.0)."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


class Phases:
    """Splits the process's life into named phases; records RSS at start/end and the peak in between.

    With ``profile_tensors`` each phase is also a ``record_function`` range, so that the profiler's memory events
    can be assigned to it afterwards.
    """

    def __init__(self, profile_tensors: bool):
        self.profile_tensors = profile_tensors
        self.rows: list[dict[str, Any]] = []
        self._name: str | None = None
        self._start = 0.0
        self._started = 0.0
        self._range: Any = None

    def enter(self, name: str | None) -> None:
        """End the current phase (if any) and start ``name`` (None: no phase)."""
        now, clock = rss_mib(), time.perf_counter()
        if self._name is not None:
            row = {"phase": self._name, "start": self._start, "peak": hwm_mib(), "end": now}
            self.rows.append(row | {"seconds": clock - self._started})
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        reset_hwm()
        self._name, self._start, self._started = name, now, time.perf_counter()
        if name is not None and self.profile_tensors:
            self._range = torch.profiler.record_function(f"phase::{len(self.rows)}::{name}")
            self._range.__enter__()


def _around(method: Callable[..., Any], before: Callable[[], None], after: Callable[[Any], None]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        before()
        result = method(*args, **kwargs)
        after(result)
        return result

    return wrapped


def instrument(learner: PPOLearner, phases: Phases, shapes: list[str]) -> None:
    """Wrap the learner's methods so that generation, rollout forwards, env steps and update are phases.

    Each generation appends ``"<learner> P+L"`` (prompt and response tokens) to ``shapes``.
    """
    name = learner.name

    def generated(sampled: Any) -> None:
        batch = sampled[0]  # _sample returns the generated batch and its restriction
        shapes.append(f"{name} {batch.prompt_ids.shape[1]}+{batch.response.shape[1]}")
        phases.enter(f"{name} forwards")

    # _rollout = _sample, then the forwards; act returns to the loop, which steps the env.
    learner.collector._sample = _around(  # type: ignore[method-assign]
        learner.collector._sample, lambda: phases.enter(f"{name} generation"), generated
    )
    learner.act = _around(learner.act, lambda: None, lambda _: phases.enter("env step"))  # type: ignore[method-assign]
    learner.update = _around(  # type: ignore[method-assign]
        learner.update, lambda: phases.enter(f"{name} update"), lambda _: phases.enter("loop")
    )


# ------------------------------------------------------------------------------------------------ tensor memory
def tensor_figures(profiler: torch.profiler.profile, top: int) -> dict[str, dict[str, Any]]:
    """Per phase (keyed by ``phase::<index>``): peak net tensor bytes and the largest allocations with their op."""
    events = profiler.profiler.kineto_results.events()
    phases, ops, memory = [], [], []
    for event in events:
        name = event.name()
        if name.startswith("phase::"):
            phases.append((event.start_ns(), event.end_ns(), "::".join(name.split("::")[:2])))
        elif name == "[memory]":
            if str(event.device_type()).endswith("CPU"):
                memory.append((event.start_ns(), event.nbytes()))
        elif name.startswith("aten::"):
            ops.append((event.start_ns(), event.end_ns(), name))
    ops.sort()
    starts = [op[0] for op in ops]
    memory.sort()
    figures = {}
    for start, end, key in phases:
        live = peak = 0
        big: Counter[tuple[str, float]] = Counter()
        for when, nbytes in memory:
            if not start <= when <= end:
                continue
            live += nbytes
            peak = max(peak, live)
            if nbytes >= BIG_ALLOCATION:
                big[(_innermost_op(ops, starts, when), round(nbytes / MIB, 1))] += 1
        largest = sorted(big.items(), key=lambda item: -item[0][1] * item[1])[:top]
        figures[key] = {
            "tensor_peak_mib": peak / MIB,
            "largest": [f"{count}x {size:g} {op.removeprefix('aten::')}" for (op, size), count in largest],
        }
    return figures


def _innermost_op(ops: list[tuple[int, int, str]], starts: list[int], when: int) -> str:
    # The op that allocated: of the ops running at ``when``, the one that started last.
    i = bisect.bisect_right(starts, when) - 1
    while i >= 0:
        start, end, name = ops[i]
        if start <= when <= end:
            return name
        i -= 1
    return "?"


# ------------------------------------------------------------------------------------------------ one process
def measure(kind: str, model_dir: str, args: argparse.Namespace) -> dict[str, Any]:
    """Build the learners, run the iterations with phases recorded; ``kind`` is ``rss`` or ``tensors``."""
    tokenizer = load_tokenizer(model_dir)
    dataset = random_queries(tokenizer, 2 * args.batch_size * args.iterations, QUERY_TOKENS, seed=SEED)
    env = chain_env(dataset, args.agents, args.batch_size)
    ppo = PPOConfig.from_flat(
        mini_batch_size=args.mini_batch_size,
        ppo_epochs=args.ppo_epochs,
        kl_penalty=args.kl_penalty,
        forward_batch_size=args.forward_batch_size,
    )
    generation = GenerationConfig(
        min_new_tokens=args.min_new_tokens, max_new_tokens=args.max_new_tokens, logprobs_from=args.logprobs_from
    )

    def build() -> dict[str, PPOLearner]:
        placement = ModelPlacement(device="cpu")
        return make_learners(model_dir, learner_ids(args.agents), ppo, generation, seed=SEED, placement=placement)[0]

    return run_phases(kind, build, env, args.iterations, SEED, args.top)


def run_phases(
    kind: str, build: Callable[[], dict[str, PPOLearner]], env: Any, iterations: int, seed: int, top: int
) -> dict[str, Any]:
    """Build the learners (a phase of its own), instrument them and run ``iterations`` iterations of ``env``,
    recording phases; ``kind`` ``tensors`` also profiles tensor allocations (the ``top`` largest per phase).
    Returns ``{"rows": …, "shapes": …}`` as :func:`format_table` reads them."""
    phases = Phases(profile_tensors=kind == "tensors")
    phases.enter("build learners")
    learners = build()
    shapes: list[str] = []
    for learner in learners.values():
        instrument(learner, phases, shapes)
    profiler = None
    if kind == "tensors":
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
        profiler.start()
    for iteration in range(iterations):
        phases.enter(f"iteration {iteration + 1} start")
        run_iteration(env, learners, seed=seed if iteration == 0 else None)
    phases.enter(None)
    rows = phases.rows
    if profiler is not None:
        profiler.stop()
        figures = tensor_figures(profiler, top)
        for index, row in enumerate(rows):
            row.update(figures.get(f"phase::{index}", {}))
    return {"rows": rows, "shapes": shapes}


def child_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options a measured child process is started with: every option but the parent's own."""
    return {name: value for name, value in vars(args).items() if name not in ("child", "save_model", "no_tensors")}


# ------------------------------------------------------------------------------------------------ report
def format_table(rss: dict[str, Any], tensors: dict[str, Any] | None) -> str:
    """One row per phase, in the order they ran; MiB throughout."""
    header = f"{'phase':<22}{'seconds':>8}{'RSS start':>10}{'peak':>8}{'end':>8}{'peak-start':>11}"
    if tensors is not None:
        header += f"{'tensors':>9}   largest allocations (count x MiB op)"
    lines = [header]
    for i, row in enumerate(rss["rows"]):
        line = (
            f"{row['phase']:<22}{row['seconds']:>8.2f}{row['start']:>10.0f}{row['peak']:>8.0f}{row['end']:>8.0f}"
            f"{row['peak'] - row['start']:>+11.0f}"
        )
        if tensors is not None and i < len(tensors["rows"]) and "tensor_peak_mib" in tensors["rows"][i]:
            other = tensors["rows"][i]
            line += f"{other['tensor_peak_mib']:>9.0f}   {', '.join(other['largest'])}"
        lines.append(line)
    peak = max(row["peak"] for row in rss["rows"])
    lines.append(f"peak RSS of the process: {peak:.0f} MiB ({peak / 1024:.2f} GiB)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    hf_logging.disable_progress_bar()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.child is not None:
        kind, model_dir = args.child
        print(json.dumps(measure(kind, model_dir, args)))
        return
    if args.save_model is not None:
        saved = save_random_model_counted(args.save_model, args.vocab_size, args.n_layer, args.n_embd, args.n_head)
        print(json.dumps(saved))
        return
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="marllm-bench-") as model_dir:
        options = child_options(args)
        params = run_child(__file__, ["--save-model", model_dir], options)["parameters"]
        rss = run_child(__file__, ["--child", "rss", model_dir], options)
        tensors = None if args.no_tensors else run_child(__file__, ["--child", "tensors", model_dir], options)
    per_copy = 4 * params / MIB
    state = per_copy * (4 * args.agents + 1)
    print(
        f"model: random GPT-2, {args.n_layer} layers, n_embd {args.n_embd}, vocab {args.vocab_size}: "
        f"{params / 1e6:.2f}M parameters, {per_copy:.1f} MiB per float32 copy; {args.agents} full learners + 1 shared "
        f"reference: weights, gradients and Adam moments {state:.0f} MiB"
    )
    print(
        f"batch {args.batch_size}, {args.min_new_tokens}-{args.max_new_tokens} new tokens, {args.ppo_epochs} PPO epochs"
        f" of mini-batch {args.mini_batch_size}, kl_penalty {args.kl_penalty}, forward_batch_size "
        f"{args.forward_batch_size}, logprobs_from {args.logprobs_from}; {args.iterations} iteration(s);"
        f" torch threads {args.threads or 'default'}"
    )
    print(f"tokens per sequence (prompt+response), in generation order: {', '.join(rss['shapes'])}")
    print(format_table(rss, tensors))
    print(f"wall {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
