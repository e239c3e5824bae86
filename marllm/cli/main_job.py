"""The main job: on the embedded offline assets, train single-agent PPO and CORY, then write their report.

Prepares the assets first when they are missing (corpus, base model, reward model), and leaves ``OUT/ppo``,
``OUT/cory``, ``OUT/report`` and ``OUT/timings.json``. Run again after an interruption, it goes on where it stopped:
a finished run is kept, an unfinished one resumed from its latest checkpoint. One process at a time runs the job in
``OUT`` (it holds ``OUT``'s lock, and each training its run directory's).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from marllm.assets import offline
from marllm.config import TrainConfig, load_config, resume_differences
from marllm.config.loading import ConfigError
from marllm.reporting import build_report
from marllm.run.checkpoint import latest_checkpoint
from marllm.run.run_dir import CONFIG_FILE, hold_directory, read_run_state, write_atomic
from marllm.run.train import train

DEFAULT_CONFIGS = {"ppo": Path("examples/ppo_offline.yaml"), "cory": Path("examples/cory_offline.yaml")}
TIMINGS_FILE = "timings.json"


def run_main_job(
    out_dir: Path,
    iterations: int | None = None,
    configs: dict[str, Path] | None = None,
    overwrite: bool = False,
) -> Path:
    """Prepare (if needed), train every config in turn into ``out_dir/NAME``, and build the comparison report.

    A run already in ``out_dir/NAME`` is not trained again from scratch: a finished one with the config's
    iterations is kept (``skipped``), an unfinished one is resumed from its latest checkpoint (``resumed``), and one
    that stopped before its first checkpoint is started again (``restarted``). ``overwrite`` trains every run
    afresh. A kept or resumed run must have been trained with the same config (logging aside).

    ``out_dir/timings.json``, rewritten after each phase, holds the wall time in seconds of each phase of this
    invocation (``prepare_s``, ``NAME_s``, ``report_s``, ``total_s``) and, under ``runs``, what was done to each
    run: ``action``, ``from_iteration`` (where this invocation started it), ``iterations`` and ``wall_s``.

    This process owns ``out_dir`` meanwhile: another ``marllm main`` into it is refused.

    Returns the path of ``report.md``.

    Raises:
        DirectoryInUseError: another process runs the main job in ``out_dir`` (or trains one of its runs).
    """
    configs = configs or DEFAULT_CONFIGS
    missing = [str(path) for path in configs.values() if not Path(path).is_file()]
    if missing:
        raise FileNotFoundError(f"main job configs not found: {missing} (run from the repository root)")
    with hold_directory(
        out_dir, "main job directory", "wait for it to end, or stop it (kill {pid}), or give another --out"
    ):
        return _run_main_job(out_dir, iterations, configs, overwrite)


def _run_main_job(out_dir: Path, iterations: int | None, configs: dict[str, Path], overwrite: bool) -> Path:
    timings: dict[str, Any] = {"runs": {}}
    started = time.perf_counter()
    offline.ensure_assets(progress=True)
    timings["prepare_s"] = time.perf_counter() - started
    run_dirs = []
    for name, path in configs.items():
        overrides = [] if iterations is None else [f"iterations={iterations}"]
        config = load_config(path, overrides)
        run_dir = out_dir / name
        phase_started = time.perf_counter()
        action, from_iteration = _plan(config, run_dir, overwrite)
        timings["runs"][name] = {"action": action, "from_iteration": from_iteration, "iterations": config.iterations}
        try:
            if action != "skipped":
                train(config, run_dir, resume=action == "resumed", overwrite=action in ("restarted", "overwritten"))
        finally:
            timings[f"{name}_s"] = timings["runs"][name]["wall_s"] = time.perf_counter() - phase_started
            _write_timings(out_dir, timings)
        run_dirs.append(run_dir)
    phase_started = time.perf_counter()
    report = build_report(run_dirs, out_dir / "report")
    timings["report_s"] = time.perf_counter() - phase_started
    timings["total_s"] = time.perf_counter() - started
    _write_timings(out_dir, timings)
    return report


def _plan(config: TrainConfig, run_dir: Path, overwrite: bool) -> tuple[str, int]:
    """What to do with the run of ``config`` in ``run_dir``, and from which iteration: ``trained`` (nothing there),
    ``overwritten``, ``skipped`` (finished), ``resumed`` or ``restarted`` (no checkpoint to resume from)."""
    state = read_run_state(run_dir)
    if state is None:
        return "trained", 0
    if overwrite:
        return "overwritten", 0
    if state.finished and state.completed == config.iterations:
        _check_same_config(config, run_dir)
        print(f"marllm main: {run_dir} is finished ({state.describe()}); keeping it", file=sys.stderr)
        return "skipped", state.completed
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        print(
            f"marllm main: {run_dir} ({state.describe()}) has no checkpoint to resume from; training it again",
            file=sys.stderr,
        )
        return "restarted", 0
    print(
        f"marllm main: resuming {run_dir} ({state.describe()}) from iteration {checkpoint.iteration}", file=sys.stderr
    )
    return "resumed", checkpoint.iteration


def _check_same_config(config: TrainConfig, run_dir: Path) -> None:
    """A kept run must have been trained with ``config`` (``RESUMABLE_KEYS`` aside)."""
    path = run_dir / CONFIG_FILE
    saved = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    changed = resume_differences(saved, config) if isinstance(saved, dict) else ["(no readable config.yaml)"]
    if changed:
        raise ConfigError(
            f"{run_dir} holds a finished run of another config ({'; '.join(changed)}); train it again with "
            "`marllm main --overwrite`"
        )


def _write_timings(out_dir: Path, timings: dict[str, Any]) -> None:
    write_atomic(out_dir / TIMINGS_FILE, json.dumps(timings, indent=2) + "\n")
