"""Running a study: its directory, what each run needs (skip, resume, start over), and local worker processes.

The study directory holds ``study.yaml`` (the study file, base inline), ``study.json`` (the expanded runs) and
``runs/<name>/``, one ordinary run directory per run (``error.txt`` in it when the run failed).

One process at a time runs a study directory (:func:`hold_study_dir`: ``marllm study`` holds its lock while it runs),
and one at a time each of its runs (the worker that trains a run holds its run directory's lock): a study run again
while a worker of an earlier one still holds a run is refused, naming it
(:func:`~marllm.studies.processes.check_runs_not_held`). Workers die with the study that started them (on Linux,
:mod:`marllm.studies.processes`: a training run then checkpoints and stops), so that worker is an orphan still
checkpointing, or one on another platform, training its run to the end.

Locally each run trains in a spawned process of its own (:class:`LocalExecutor`): one that dies (a signal, the
out-of-memory killer) fails only its run, which is tried once more from its checkpoint, as on Ray.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing import connection
from pathlib import Path
from types import FrameType
from typing import Any, Literal, Protocol

import yaml

from marllm.config import config_from_dict, resume_differences
from marllm.config.loading import ConfigError
from marllm.run.interrupts import TrainingInterrupted
from marllm.run.run_dir import (
    CONFIG_FILE,
    DirectoryInUseError,
    hold_directory,
    hold_run_dir,
    read_run_info,
    update_run_info,
    write_atomic,
)
from marllm.studies.files import ERROR_FILE, EXPANSION_FILE, STUDY_FILE
from marllm.studies.processes import check_runs_not_held, die_with_parent, exit_description
from marllm.studies.spec import Study, StudyRun, expansion_changed

Action = Literal["skip", "resume", "start"]
ATTEMPTS = 2  # a run whose worker process dies is tried once more


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


class Executor(Protocol):
    """Runs the runs of a study: :class:`LocalExecutor` (a process pool here) or
    :class:`marllm.studies.ray_executor.RayExecutor` (Ray tasks)."""

    def run(
        self, runs: Sequence[StudyRun], study_dir: Path, on_event: Callable[[RunEvent], None], overwrite: bool = False
    ) -> list[RunOutcome]:
        """Run each run in ``study_dir/runs/<name>`` (skipping finished ones) and return an outcome per run."""
        ...


def hold_study_dir(study_dir: Path) -> contextlib.AbstractContextManager[Path | None]:
    """Own the study directory for the block (created if needed): one process at a time runs a study there.

    Raises:
        DirectoryInUseError: another process runs a study there; the message names its PID.
    """
    return hold_directory(
        study_dir,
        "study directory",
        "wait for that study to end, or stop it (kill {pid}: its running runs checkpoint and stop), or give another "
        "--out",
    )


def prepare_study_dir(study: Study, runs: Sequence[StudyRun], study_dir: Path, overwrite: bool = False) -> None:
    """Write ``study.yaml`` and ``study.json``; a directory that holds another study's expansion is refused.

    Raises:
        ConfigError: ``study_dir`` holds a study whose expansion differs (and ``overwrite`` is not set).
    """
    expansion = study.expansion(runs)
    existing = study_dir / EXPANSION_FILE
    if existing.is_file() and not overwrite:
        try:
            before = json.loads(existing.read_text(encoding="utf-8"))
        except ValueError:
            before = None
        if not isinstance(before, dict) or before.get("runs") != expansion["runs"]:
            raise ConfigError(expansion_changed(study_dir, study.name, before, expansion))
        check_run_configs(runs, study_dir)
    study_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(study_dir / STUDY_FILE, yaml.safe_dump(study.to_file_dict(), sort_keys=False))
    write_atomic(existing, json.dumps(expansion, indent=2) + "\n")


def check_run_configs(runs: Sequence[StudyRun], study_dir: Path) -> None:
    """Refuse a study whose runs would train differently from the runs already in ``study_dir`` (a changed base
    config, say): a finished run would be kept as it is. Keys a resumed run may change (``iterations``, logging …)
    may differ.

    Raises:
        ConfigError: naming the first such run and its changed keys.
    """
    for run in runs:
        path = study_dir / run.relative_dir / CONFIG_FILE
        if not path.is_file() or plan(run, path.parent) == "start":  # a run started over may change
            continue
        try:
            saved = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue  # an unreadable run is started over
        changed = resume_differences(saved, run.config) if isinstance(saved, dict) else []
        if changed:
            raise ConfigError(
                f"run {run.name} in {study_dir} was trained with another config ({'; '.join(changed)}); give another "
                "--out, or start every run again with --overwrite"
            )


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


def _worker_init(stopping: Any = None) -> None:
    """Each worker: one thread for torch, no progress bars of its own (the study shows one), and its own process
    group, so that a terminal's Ctrl-C reaches only the parent, which passes one SIGINT on to the workers (a second
    one would stop a run without its checkpoint)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    global _stopping
    _stopping = stopping
    os.setpgrp()
    signal.signal(signal.SIGINT, _idle_sigint)
    import datasets
    import torch
    import transformers

    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()


def _idle_sigint(number: int, frame: FrameType | None) -> None:
    """SIGINT in a worker outside ``train()`` (which handles it itself): stop a run that is loading, ignore it
    when idle."""
    if _busy:
        raise KeyboardInterrupt


class LocalExecutor:
    """Runs a study's runs here, each in a spawned process of its own, ``workers`` at a time (default:
    ``os.cpu_count()``).

    A run whose process dies (killed by a signal, by the out-of-memory killer, a crash in native code) fails alone:
    the other runs go on, and it is tried once more, planned afresh (it resumes from the checkpoint the first attempt
    left, or starts over without one), as on Ray. If that attempt dies too, the run is recorded failed (``error.txt``
    and ``run.json``). A run that raises fails once (``run_one`` records it): it would fail again.

    Args:
        workers: how many runs train at once.
        run_function: what each process calls with ``(config_data, run_dir, action)`` (default: :func:`run_one`;
            tests put one that kills its process here). It must be importable by name in a spawned process.
    """

    def __init__(self, workers: int | None = None, run_function: RunFunction = run_one):
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.run_function = run_function

    def run(
        self, runs: Sequence[StudyRun], study_dir: Path, on_event: Callable[[RunEvent], None], overwrite: bool = False
    ) -> list[RunOutcome]:
        """Run every run; on KeyboardInterrupt (Ctrl-C, or SIGTERM to this process, as a batch scheduler sends it),
        pass SIGINT to the workers (each checkpoints and stops), start no further run, wait for them, and raise
        KeyboardInterrupt again."""
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
            outcomes.update(self._run_processes(todo, study_dir, on_event))
        return [outcomes[run.name] for run in runs]

    def _run_processes(
        self, todo: list[tuple[StudyRun, Action]], study_dir: Path, on_event: Callable[[RunEvent], None]
    ) -> dict[str, RunOutcome]:
        outcomes: dict[str, RunOutcome] = {}
        threads = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # spawned workers inherit it before they import torch
        context = multiprocessing.get_context("spawn")
        stopping = context.Event()
        queue = deque((run, action, 1) for run, action in todo)
        running: list[_Attempt] = []
        previous_sigterm = sigterm_interrupts()
        try:
            while queue or running:
                while queue and len(running) < self.workers:
                    run, action, number = queue.popleft()
                    run_dir = study_dir / run.relative_dir
                    running.append(_Attempt(context, stopping, self.run_function, run, run_dir, action, number))
                    if number == 1:
                        on_event(RunEvent("started", run.name))
                waiting = {handle: attempt for attempt in running for handle in attempt.handles()}
                ready = dict.fromkeys(waiting[handle] for handle in connection.wait(list(waiting)))
                for attempt in ready:
                    if not attempt.collect():
                        continue
                    running.remove(attempt)
                    outcome = self._ended(attempt, queue)
                    if outcome is not None:
                        outcomes[attempt.run.name] = outcome
                        on_event(RunEvent("ended", attempt.run.name, outcome))
        except BaseException:  # Ctrl-C, SIGTERM (or a failure here): the running runs checkpoint and stop
            stopping.set()
            for attempt in running:
                attempt.interrupt()
            raise
        finally:
            for attempt in running:
                attempt.process.join()
            if previous_sigterm is not None:
                signal.signal(signal.SIGTERM, previous_sigterm)
            if threads is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = threads
        return outcomes

    def _ended(self, attempt: _Attempt, queue: deque[tuple[StudyRun, Action, int]]) -> RunOutcome | None:
        """The outcome of an attempt whose process has ended, or None when the run is tried again (queued first)."""
        if attempt.outcome is not None:
            return attempt.outcome
        run, how = attempt.run, exit_description(attempt.exitcode)
        if attempt.number < ATTEMPTS:
            action = plan(run, attempt.run_dir)
            if action == "skip":  # it finished, and died before its result came back
                return RunOutcome(run.name, "finished")
            from tqdm.auto import tqdm

            again = "resuming from its checkpoint" if action == "resume" else "starting it over (no checkpoint)"
            tqdm.write(f"marllm: run {run.name}: its worker process died ({how}); {again}", file=sys.stderr)
            queue.appendleft((run, action, attempt.number + 1))
            return None
        message = f"worker process died in each of {ATTEMPTS} attempts, the last {how}"
        record_failure(attempt.run_dir, message)
        return RunOutcome(run.name, "failed", message)


class _Attempt:
    """Attempt ``number`` at a run, planned as ``action``: a spawned process of its own, started here, and the pipe
    its outcome comes back on."""

    def __init__(
        self,
        context: Any,
        stopping: Any,
        run_function: RunFunction,
        run: StudyRun,
        run_dir: Path,
        action: Action,
        number: int,
    ) -> None:
        self.run, self.run_dir, self.number = run, run_dir, number
        self.outcome: RunOutcome | None = None
        self.exitcode: int | None = None
        self.results, sender = context.Pipe(duplex=False)
        args = (sender, os.getpid(), stopping, run_function, run.config.to_dict(), str(run_dir), action)
        self.process = context.Process(target=_worker_main, args=args, name=f"marllm-study:{run.name}")
        with _sigint_ignored():  # a worker spawned here starts immune until its initializer runs
            self.process.start()
        sender.close()

    def handles(self) -> list[Any]:
        """What to wait on: the process's end and, until it has come, its outcome (read at once, so that a long one
        cannot block the worker on a full pipe)."""
        return [self.process.sentinel] + ([] if self.results.closed else [self.results])

    def collect(self) -> bool:
        """Read the outcome if it has come; True once the process has ended (then ``exitcode`` is set)."""
        ended = not self.process.is_alive()
        if not self.results.closed and (ended or self.results.poll()):
            with contextlib.suppress(EOFError, OSError):  # the worker died without sending it
                if self.results.poll():
                    self.outcome = self.results.recv()
            self.results.close()
        if ended:
            self.exitcode = self.process.exitcode
        return ended

    def interrupt(self) -> None:
        """SIGINT to the worker: a training run checkpoints and stops, a loading one stops."""
        if self.process.is_alive() and self.process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGINT)


def _worker_main(
    results: Any,
    parent_pid: int,
    stopping: Any,
    run_function: RunFunction,
    config_data: dict[str, Any],
    run_dir: str,
    action: Action,
) -> None:
    """A worker process: die with the study (SIGTERM when its parent dies, so a training run checkpoints and
    stops), run one run and send its outcome back."""
    die_with_parent(parent_pid)
    try:
        _worker_init(stopping)
        outcome = run_function(config_data, run_dir, action)
    except BaseException as error:  # noqa: BLE001 - raised outside run_one's own handling: the run's failure
        outcome = RunOutcome(Path(run_dir).name, "failed", f"worker failed: {error_line(error)}")
        record_failure(Path(run_dir), outcome.error or "")
    with contextlib.suppress(OSError):  # the study is gone
        results.send(outcome)


class Terminated(KeyboardInterrupt):
    """SIGTERM, taking the Ctrl-C path (a KeyboardInterrupt) but remembering which signal it was."""

    signal_number = signal.SIGTERM
    received = False
    """Set when the handler ran: Ray re-raises an interrupt that reaches it inside ``ray.wait`` as a plain
    KeyboardInterrupt, so the exception alone cannot always tell."""


def stopping_signal(stop: KeyboardInterrupt) -> signal.Signals:
    """The signal that stopped a study: SIGTERM when :func:`sigterm_interrupts`' handler ran, else SIGINT."""
    return signal.SIGTERM if isinstance(stop, Terminated) or Terminated.received else signal.SIGINT


def sigterm_interrupts() -> Any:
    """In the main thread, make SIGTERM raise :class:`Terminated` (the Ctrl-C path); returns the handler it
    replaced, or None where it could not install one (another thread)."""

    def interrupt(number: int, frame: FrameType | None) -> None:
        Terminated.received = True
        raise Terminated

    Terminated.received = False

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, interrupt)


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Ignore SIGINT for a moment (a process spawned meanwhile inherits that until it installs its own handler)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class StudyProgress:
    """One tqdm bar on stderr for a whole study: runs done, running and failed, with an ETA.

    ``workers`` caps the running count shown (runs submitted beyond it wait); a callable is asked at each event (an
    executor may know it only once it has started).
    """

    def __init__(self, total: int, workers: int | Callable[[], int], enabled: bool = True):
        from tqdm.auto import tqdm

        self.workers = workers
        self.running = self.failed = 0
        self.bar = tqdm(total=total, desc="study", unit="run", disable=not enabled)

    def __call__(self, event: RunEvent) -> None:
        if event.kind == "started":
            self.running += 1
        else:
            if event.outcome is not None and event.outcome.status != "skipped":
                self.running -= 1
            if event.outcome is not None and event.outcome.status == "failed":
                self.failed += 1
            self.bar.update(1)
        workers = self.workers() if callable(self.workers) else self.workers
        self.bar.set_postfix(running=min(self.running, workers), failed=self.failed, refresh=True)

    def close(self) -> None:
        self.bar.close()


def run_study(
    study: Study,
    study_dir: Path,
    executor: Executor | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> list[RunOutcome]:
    """Expand and validate ``study`` (before any run starts), write its directory, and run its runs.

    Finished runs are skipped, stopped runs with a checkpoint resumed, and failed or never-checkpointed runs started
    over (``overwrite``: every run started over). A failed run does not stop the study. This process owns
    ``study_dir`` meanwhile (:func:`hold_study_dir`).

    Raises:
        ConfigError: an override of some run is invalid, a model, dataset or device it names is missing, or
            ``study_dir`` holds another study.
        DirectoryInUseError: another process runs a study in ``study_dir``, or holds one of its run directories
            (a worker of an earlier run of it, still checkpointing; see
            :func:`~marllm.studies.processes.check_runs_not_held`).
        KeyboardInterrupt: Ctrl-C, after the running runs have checkpointed and stopped.
    """
    runs = study.runs()
    study.check_references(runs)
    with hold_study_dir(study_dir):
        check_runs_not_held(study_dir, [run.relative_dir for run in runs])
        prepare_study_dir(study, runs, study_dir, overwrite)
        executor = executor or LocalExecutor()
        display = StudyProgress(len(runs), lambda: getattr(executor, "workers", len(runs)), progress)
        try:
            return executor.run(runs, study_dir, display, overwrite)
        finally:
            display.close()
