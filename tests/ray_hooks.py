"""Run functions for the study executors' tests, imported by their workers (kept free of pytest and test modules)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from marllm.studies.execute import Action, RunOutcome, run_one


def exit_at_once() -> None:
    """End this process without cleanup, as a crashed worker does."""
    os._exit(1)


def sigkill_self() -> None:
    """SIGKILL this process, as the out-of-memory killer does."""
    os.kill(os.getpid(), signal.SIGKILL)


def dying_attempts(
    config_data: dict[str, Any],
    run_dir: str,
    action: Action,
    *,
    deaths: Mapping[str, int],
    count_dir: str,
    die: Callable[[], None] = exit_at_once,
) -> RunOutcome:
    """``run_one``, except that the first ``deaths[name]`` attempts at a run end their worker process with ``die``:
    the first one after training one iteration (so that its checkpoint is there for the retry), later ones at once.
    Each attempt appends its action to ``count_dir/<name>``."""
    name = Path(run_dir).name
    log = Path(count_dir) / name
    with log.open("a") as file:
        file.write(action + "\n")
    attempt = len(log.read_text().splitlines())
    if attempt <= deaths.get(name, 0):
        if attempt == 1:
            run_one({**config_data, "iterations": 1}, run_dir, action)
        die()
    return run_one(config_data, run_dir, action)


def environment_seen(
    config_data: dict[str, Any], run_dir: str, action: Action, *, variable: str, study_group: int
) -> RunOutcome:
    """Record what the worker sees, train nothing: ``variable``'s value, whether training's modules were already
    imported when the run began (a forked worker's are: its server imported them), whether its parent (the server)
    is out of the study's process group ``study_group`` and ignores SIGTERM, and whether the worker itself takes
    SIGTERM's default."""
    import sys

    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    parent = os.getppid()
    ignored = int(Path(f"/proc/{parent}/status").read_text().split("SigIgn:")[1].split()[0], 16)
    seen = {
        "value": os.environ.get(variable),
        "preloaded": "marllm.run.train" in sys.modules,
        "server_apart": os.getpgid(parent) != study_group and bool(ignored >> (signal.SIGTERM - 1) & 1),
        "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    }
    (path / "seen.json").write_text(json.dumps(seen))
    return RunOutcome(path.name, "finished")
