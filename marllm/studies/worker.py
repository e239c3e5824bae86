"""One run of a study in its worker: what the run needs (skip, resume, start over), training it, and how it ended.

A worker process trains one run with :func:`run_one` (locally in a process of its own, see
:mod:`marllm.studies.local_executor`; on Ray in a task, see :mod:`marllm.studies.ray_executor`), owning its run
directory meanwhile: a failure is written to ``error.txt`` and returned as the run's :class:`RunOutcome`.
:class:`Executor` is what both kinds of executor share: the runs a study skips, and the runs it gives its workers.
"""

from __future__ import annotations

import abc
import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from marllm.config import config_from_dict
from marllm.run.interrupts import TrainingInterrupted
from marllm.run.run_dir import DirectoryInUseError, hold_run_dir, read_run_info, update_run_info, write_atomic
from marllm.studies.files import ERROR_FILE
from marllm.studies.spec import StudyRun

Action = Literal["skip", "resume", "start"]
ATTEMPTS = 2  # a run whose worker dies (its process, or its Ray worker or node) is tried once more


@dataclass(frozen=True)
class RunOutcome:
    """How one run of a study ended.

    Attributes:
        name: the run's name.
        status: ``finished``, ``skipped`` (finished before), ``failed`` or ``interrupted``.
        error: the one-line error of a failed run (or the summary of an interrupted one).
        seconds: wall time in its worker.
    """

    name: str
    status: str
    error: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class RunEvent:
    """A progress event: ``kind`` is ``started`` (outcome None) or ``ended``."""

    kind: Literal["started", "ended"]
    name: str
    outcome: RunOutcome | None = None


def plan(run: StudyRun, run_dir: Path, overwrite: bool = False) -> Action:
    """What ``run`` needs: ``skip`` (finished all its iterations), ``resume`` (stopped, with a checkpoint) or
    ``start`` (new, failed, or stopped before its first checkpoint: started over)."""
    if overwrite or not run_dir.is_dir():
        return "start"
    info = read_run_info(run_dir)
    status = info.get("status")
    if status == "finished" and info.get("completed_iterations") == run.config.iterations:
        return "skip"
    if status == "failed" or (run_dir / ERROR_FILE).exists():
        return "start"
    from marllm.run.checkpoint import latest_checkpoint  # torch: kept out of the study's own process

    return "resume" if latest_checkpoint(run_dir) is not None else "start"


def run_one(config_data: dict[str, Any], run_dir: str, action: Action) -> RunOutcome:
    """Train one run (in a worker process) owning its run directory; a failure is written to ``error.txt`` and
    returned, not raised. A run directory another process owns (a worker of an earlier study, still training it) is
    left as it is and the run failed."""
    from marllm.run.train import train  # torch: loaded in the worker, not in the study's own process

    global _busy
    path = Path(run_dir)
    _busy, started = True, time.monotonic()
    name = path.name
    if _stopping is not None and _stopping.is_set():  # the study was interrupted before this run began
        _busy = False
        return RunOutcome(name, "interrupted", "not started: the study was interrupted")
    try:
        with hold_run_dir(path):
            (path / ERROR_FILE).unlink(missing_ok=True)
            train(config_from_dict(config_data), path, resume=action == "resume", overwrite=action == "start")
    except DirectoryInUseError as error:  # the owner's run: nothing of it is touched, no error.txt
        return RunOutcome(name, "failed", error_line(error), time.monotonic() - started)
    except TrainingInterrupted as stop:
        return RunOutcome(name, "interrupted", stop.summary(), time.monotonic() - started)
    except KeyboardInterrupt:
        return RunOutcome(name, "interrupted", "interrupted before training began", time.monotonic() - started)
    except Exception as error:  # noqa: BLE001 - a failed run is recorded and the study goes on
        message = error_line(error)
        with contextlib.suppress(OSError):  # e.g. the run directory is a file: the outcome still says why
            path.mkdir(parents=True, exist_ok=True)
            write_atomic(path / ERROR_FILE, message + "\n")
        return RunOutcome(name, "failed", message, time.monotonic() - started)
    finally:
        _busy = False
    return RunOutcome(name, "finished", None, time.monotonic() - started)


RunFunction = Callable[[dict[str, Any], str, Action], RunOutcome]
"""What trains a run in a worker: ``run_one(config_data, run_dir, action)`` or a stand-in of the same shape."""


def record_failure(run_dir: Path, message: str) -> None:
    """Record a run that failed outside ``run_one`` (its worker died) as ``run_one`` records a failure:
    ``error.txt``, and ``failed`` in ``run.json`` where there is one."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(run_dir / ERROR_FILE, message + "\n")
        if read_run_info(run_dir):
            update_run_info(run_dir, status="failed")
    except OSError:
        pass  # e.g. the run directory is a file: the outcome still says why


def error_line(error: BaseException) -> str:
    """The error's type and message on one line, as a run's failure is recorded."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


_busy = False  # in a worker: whether it is running a run (SIGINT stops a run, an idle worker ignores it)
_stopping: Any = None  # in a worker: the study's stop event (set by the parent on Ctrl-C)


def worker_init(stopping: Any = None) -> None:
    """Each worker: one thread for torch, no progress bars of its own (the study shows one), and its own process
    group, so that a terminal's Ctrl-C reaches only the parent, which passes one SIGINT on to the workers (a second
    one would stop a run without its checkpoint)."""
    global _stopping
    _stopping = stopping
    os.setpgrp()
    signal.signal(signal.SIGINT, _idle_sigint)
    quiet_libraries(1)


def quiet_libraries(threads: int) -> None:
    """In a worker (a local one, or a Ray task): ``threads`` threads for torch and no progress bars of its own."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    # after the variables above, which these libraries read as they are imported
    import datasets
    import torch
    import transformers

    torch.set_num_threads(threads)
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()


def _idle_sigint(number: int, frame: FrameType | None) -> None:
    """SIGINT in a worker outside ``train()`` (which handles it itself): stop a run that is loading, ignore it
    when idle."""
    if _busy:
        raise KeyboardInterrupt


class Executor(abc.ABC):
    """Runs the runs of a study: :class:`~marllm.studies.local_executor.LocalExecutor` (a process each, here) or
    :class:`~marllm.studies.ray_executor.RayExecutor` (Ray tasks). :meth:`run` skips the finished runs and gives the
    others to :meth:`_run_todo`, which each executor implements."""

    def run(
        self, runs: Sequence[StudyRun], study_dir: Path, on_event: Callable[[RunEvent], None], overwrite: bool = False
    ) -> list[RunOutcome]:
        """Run each run in ``study_dir/runs/<name>`` (skipping finished ones) and return an outcome per run."""
        outcomes: dict[str, RunOutcome] = {}
        todo: list[tuple[StudyRun, Action]] = []
        for run in runs:
            action = plan(run, study_dir / run.relative_dir, overwrite)
            if action == "skip":
                outcomes[run.name] = RunOutcome(run.name, "skipped")
                on_event(RunEvent("ended", run.name, outcomes[run.name]))
            else:
                todo.append((run, action))
        if todo:
            outcomes.update(self._run_todo(todo, study_dir, on_event, overwrite))
        return [outcomes[run.name] for run in runs]

    @abc.abstractmethod
    def _run_todo(
        self,
        todo: list[tuple[StudyRun, Action]],
        study_dir: Path,
        on_event: Callable[[RunEvent], None],
        overwrite: bool,
    ) -> dict[str, RunOutcome]:
        """Run each run of ``todo`` (none finished; each with what it needs, as :func:`plan` said) and return its
        outcome by name, reporting ``started`` and ``ended`` to ``on_event``."""
