"""``marllm plan``'s estimate beside the measured peak resident memory of the same config, on this CPU.

Each case is a config (and overrides). The plan is made as ``marllm plan`` makes it; the measurement trains the
config's learners in a fresh process for ``--iterations`` iterations and reports the process's peak RSS (``VmHWM``),
the phase it was reached in (rollout or update), the peak of each phase, and seconds per iteration:

- ``main``: the main job's CORY config (``examples/cory_offline.yaml``), trained by ``marllm train`` itself (its
  peak is the child's ``ru_maxrss``; the offline assets must be prepared: ``marllm prepare``);
- ``workload``: the shared CORY workload (``../shared/bench/make_workload.py runs/bench-workload``),
  ``benchmarks/configs/workload_cory.yaml``;
- ``qwen05-fp32``, ``qwen05-bf16``, ``qwen05-lora``: the same loop on Qwen2.5-0.5B's shape with its real
  151,936-token vocabulary (``make_workload.py runs/bench-qwen05 --arch qwen2 --vocab-size 151936``), batch 16:
  full fine-tuning in float32, full fine-tuning in bfloat16, LoRA (r = 16) adapters on a bfloat16 base;
- any case with ``+KEY=VALUE`` overrides appended (``qwen05-fp32+ppo.compute.gradient_checkpointing=true``).

The workload cases use the workload's queries and its word-count reward (the task section only sizes the prompts:
``task.query_max_tokens`` is set to the longest query in tokens).

    .venv/bin/python benchmarks/bench_plan.py workload qwen05-lora [--iterations 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = Path(__file__).with_name("configs")
QWEN05 = ["model.name_or_path=runs/bench-qwen05/model", "env.batch_size=16", "ppo.batching.mini_batch_size=16"]
CASES: dict[str, tuple[str, list[str]]] = {
    "main": (str(ROOT / "examples" / "cory_offline.yaml"), []),
    "workload": (str(CONFIGS / "workload_cory.yaml"), []),
    "qwen05-fp32": (str(CONFIGS / "workload_cory.yaml"), QWEN05),
    "qwen05-bf16": (str(CONFIGS / "workload_cory.yaml"), [*QWEN05, "model.dtype=bfloat16"]),
    "qwen05-lora": (str(CONFIGS / "workload_cory.yaml"), [*QWEN05, "model.dtype=bfloat16", "model.lora={r: 16}"]),
}


def case(name: str) -> tuple[str, list[str]]:
    """The config and overrides of a case name, with its ``+KEY=VALUE`` suffixes."""
    base, *extra = name.split("+")
    if base not in CASES:
        raise SystemExit(f"unknown case {base!r}; cases: {sorted(CASES)} (with +KEY=VALUE overrides)")
    path, overrides = CASES[base]
    return path, [*overrides, *extra]


def workload_overrides(overrides: list[str]) -> list[str]:
    """``task.query_max_tokens`` set to the workload's longest query, in its tokenizer's tokens."""
    from transformers import AutoTokenizer

    model = next((o.split("=", 1)[1] for o in overrides if o.startswith("model.name_or_path=")), None)
    model = model or "runs/bench-workload/model"
    queries = json.loads((Path(model).parent / "queries.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(model)
    longest = max(len(ids) for ids in tokenizer(queries)["input_ids"])
    return [*overrides, f"task.query_max_tokens={longest}"]


def measure_workload(path: str, overrides: list[str], iterations: int) -> dict[str, Any]:
    """Train the config's learners on the workload's queries and reward; peak RSS by phase (run in a child)."""
    import torch
    from bench_memory_profile import hwm_mib, reset_hwm
    from bench_workload_profile import word_count_reward

    from marllm.config import load_config
    from marllm.envs import env as text_env
    from marllm.loop import run_iteration
    from marllm.models.policy import load_tokenizer
    from marllm.run.learners import learners_from_config
    from marllm.wrappers import RolePermutation, SharedReward

    torch.manual_seed(0)
    config = load_config(path, overrides)
    model_dir = Path(config.model.name_or_path)
    queries = json.loads((model_dir.parent / "queries.json").read_text())
    env = text_env(
        dataset=[{"query": query} for query in queries],
        roles=config.env.roles,
        templates=config.role_templates(),
        reward_fn=word_count_reward,
        batch_size=config.env.batch_size,
    )
    env = RolePermutation(SharedReward(env), period=config.agents.role_period)
    learners, _ = learners_from_config(config, load_tokenizer(str(model_dir)))
    peaks = {"rollout": 0.0, "update": 0.0}

    def phase(name: str, method: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            reset_hwm()
            try:
                return method(*args, **kwargs)
            finally:
                peaks[name] = max(peaks[name], hwm_mib())

        return wrapped

    for learner in learners.values():
        learner.act = phase("rollout", learner.act)  # type: ignore[method-assign]
        learner.update = phase("update", learner.update)  # type: ignore[method-assign]
    times = []
    for iteration in range(iterations):
        started = time.perf_counter()
        run_iteration(env, learners, seed=0 if iteration == 0 else None)
        times.append(time.perf_counter() - started)
        print(f"iteration {iteration}: {times[-1]:.1f} s", file=sys.stderr, flush=True)
    peak = max(peaks.values())
    return {
        "peak_mib": peak,
        "peak_phase": max(peaks, key=peaks.get),
        "rollout_mib": peaks["rollout"],
        "update_mib": peaks["update"],
        # The first iteration creates Adam's state: the pace is the median of the later ones.
        "s_per_iter": statistics.median(times[1:] or times),
        "s_first_iter": times[0],
        "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def measure_main(path: str, overrides: list[str], iterations: int) -> dict[str, Any]:
    """``marllm train`` on the config for ``iterations`` iterations in a child process; its peak RSS."""
    with tempfile.TemporaryDirectory() as run_dir:
        command = [str(ROOT / ".venv" / "bin" / "marllm"), "train", path, *overrides, f"iterations={iterations}",
                   f"run_dir={run_dir}/run"]  # fmt: skip
        started = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"peak_mib": peak, "peak_phase": "?", "s_total": seconds}


def plan_of(path: str, overrides: list[str]) -> Any:
    from marllm.assets import resolve_model
    from marllm.cli.plan import device_capacity
    from marllm.config import load_config
    from marllm.run.plan import plan_memory

    kind, capacity = device_capacity("cpu")
    return plan_memory(load_config(path, overrides), resolve_model, capacity, kind, with_levers=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="+", help=f"cases: {', '.join(CASES)} (with +KEY=VALUE overrides)")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        path, overrides = case(args.child)
        print(json.dumps(measure_workload(path, workload_overrides(overrides), args.iterations)))
        return
    rows = []
    for name in args.cases:
        path, overrides = case(name)
        if name.split("+")[0] == "main":
            measured = measure_main(path, overrides, args.iterations)
        else:
            overrides = workload_overrides(overrides)
            command = [sys.executable, __file__, "--child", name, "--iterations", str(args.iterations), "x"]
            out = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True, cwd=ROOT)
            measured = json.loads(out.stdout.strip().splitlines()[-1])
        plan = plan_of(path, overrides)
        row = {"case": name, "estimate_mib": plan.peak / 1024**2, "estimate_phase": plan.peak_phase, **measured}
        row["error"] = row["estimate_mib"] / row["peak_mib"] - 1
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"{'case':<44}{'plan MiB':>10}{'measured MiB':>14}{'plan/meas':>10}  phase (plan/measured)  s/iter")
    for row in rows:
        seconds = row.get("s_per_iter")
        pace = "" if seconds is None else f"{seconds:.1f}"
        print(f"{row['case']:<44}{row['estimate_mib']:>10,.0f}{row['peak_mib']:>14,.0f}{1 + row['error']:>10.2f}  "
              f"{row['estimate_phase']}/{row['peak_phase']:<16}{pace}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
