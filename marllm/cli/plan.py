"""``marllm plan CONFIG [KEY=VALUE ...] [--device cpu|cuda|GiB]``: what a run will hold in memory at its peak, and
what would make it fit (:mod:`marllm.run.plan`)."""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

from marllm.config import load_config
from marllm.config.loading import ConfigError

GIB = 1024**3


def add_plan(commands: Any) -> None:
    """The ``plan`` sub-command."""
    plan = commands.add_parser(
        "plan",
        help="estimate a run's peak memory from its config (no weights loaded) and the levers that would make it fit",
    )
    plan.add_argument("config", help="YAML config file, e.g. examples/cory_offline.yaml")
    plan.add_argument("overrides", nargs="*", default=[], help="dotted overrides, as for marllm train")
    plan.add_argument(
        "--device",
        default="cpu",
        help="cpu (this machine's memory), cuda (GPU 0's memory; needs a GPU here) or a number of GiB (a device of "
        "that size: plans a CUDA run, without the process's own CPU memory)",
    )
    plan.add_argument(
        "--prompt-tokens",
        type=int,
        default=None,
        help="the longest prompt in tokens, >= 1 (default: from the templates; a game's prompts are measured)",
    )
    plan.set_defaults(handler=plan_command)


def device_capacity(device: str) -> tuple[str, float]:
    """The device kind (``cpu`` or ``cuda``) and its memory in bytes for ``--device``.

    Raises:
        ConfigError: ``device`` is neither ``cpu``, ``cuda`` nor a positive, finite number of GiB, or ``cuda`` has no
            GPU.
    """
    if device == "cpu":
        return "cpu", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA GPU here; give its memory instead, e.g. --device 80 (GiB)")
        return "cuda", torch.cuda.get_device_properties(0).total_memory
    try:
        gib = float(device)
    except ValueError:
        gib = -1.0
    if not (gib > 0 and math.isfinite(gib)):
        raise ConfigError(f"--device must be cpu, cuda or a finite number of GiB above 0, got {device!r}")
    return "cuda", gib * GIB


def plan_command(args: argparse.Namespace) -> int:
    """Print the plan of ``args.config`` on ``args.device``; a bad flag, or a model that is not there, is one
    ``marllm: config error`` line (:func:`~marllm.run.plan.plan_memory` says which)."""
    from marllm.assets import resolve_model
    from marllm.run.plan import plan_memory

    config = load_config(args.config, args.overrides)
    config.check_game()  # a game's settings against the game, before its batch is played to size the plan
    kind, capacity = device_capacity(args.device)
    plan = plan_memory(config, resolve_model, capacity, kind, args.prompt_tokens)
    print(format_plan(plan))
    return 0


def _mib(value: float) -> str:
    return f"{value / 1024**2:>10,.0f} MiB"


def format_plan(plan: Any) -> str:
    """The plan as the command prints it: the run's shape, each part, the peak against the device, the levers."""
    s = plan.summary
    trainable = s["trainable_per_learner"]
    lines = [
        f"model {s['model']}: {s['parameters'] / 1e6:,.1f}M parameters, {s['learners']} learner(s), "
        f"{'LoRA adapters of ' + f'{trainable / 1e6:.2f}M' if s['lora'] else 'full fine-tuning'}, {s['dtype']}"
        f" (reference {s['reference_dtype']}){', autocast ' + s['autocast_dtype'] if s['autocast_dtype'] else ''}",
        f"lengths: prompts up to {s['prompt_tokens']} tokens ({s['prompt_source']}) + {s['new_tokens']} new; batch "
        f"{s['batch']}; update "
        f"passes of {s['update_rows']} rows{' (gradient checkpointing)' if s['gradient_checkpointing'] else ''}",
        "",
        "kept for the whole run",
    ]
    for title, part in (("", plan.kept), ("rollout (one learner at a time)", plan.rollout),
                        ("update (one learner at a time)", plan.update)):  # fmt: skip
        if title:
            lines.append(title)
        lines += [f"  {line.name:<18}{_mib(line.bytes)}   {line.note}" for line in part]
    lines.append("")
    lines.append(f"peak (at the {plan.peak_phase}){_mib(plan.peak)}   estimate")
    if plan.capacity is not None:
        verdict = "fits" if plan.fits else "does NOT fit"
        lines.append(f"device ({s['device']}) {_mib(plan.capacity)}   {verdict} ({plan.peak / plan.capacity:.0%})")
    if plan.levers:
        lines.append("")
        lines.append("levers (each alone; estimated peak)")
        for name, peak in plan.levers:
            mark = "fits" if plan.capacity is not None and peak <= plan.capacity else ""
            lines.append(f"  {name:<58}{_mib(peak)}   {mark}")
    return "\n".join(lines)
