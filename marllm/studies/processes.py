"""The lifetime of a study's worker processes: dying with the study that started them, and saying how one ended.

Each worker holds the reading end of a pipe, its lifeline, whose writing end only the study's process holds and never
writes to: when that process ends, however it ends (a ``marllm study`` killed with SIGKILL cannot stop its workers
itself), the kernel closes the writing end, the worker reads the end of the pipe and sends itself SIGTERM, so that a
training run checkpoints and stops and no orphan trains on. It works whoever the worker's parent is (the study's
process for a spawned worker, the server of :mod:`marllm.studies.worker_server` for a forked one).

A worker so stopped first checkpoints its run, which takes up to about 20 s, holding its run directory's lock.
:func:`check_runs_not_held` refuses a study run again meanwhile, naming those workers, so that no new worker plans a
run from a checkpoint the old one is still writing.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path

from marllm.run.run_dir import DirectoryInUseError
from marllm.run.run_files import LOCK_FILE
from marllm.utils.files import LockHeldError, exclusive_lock


def die_with_study(lifeline: Connection, signal_number: int = signal.SIGTERM) -> threading.Thread:
    """Send this process ``signal_number`` once the study's process has ended: a daemon thread waits on
    ``lifeline`` (the reading end of a pipe the study never writes to), whose end comes when the study's process, the
    only holder of its writing end, is gone; a study already gone signals at once. Returns the thread."""

    def watch() -> None:
        try:
            lifeline.recv_bytes()
        except (EOFError, OSError):  # the end of the pipe: the study's process is gone
            os.kill(os.getpid(), signal_number)

    watcher = threading.Thread(target=watch, name="marllm-study-lifeline", daemon=True)
    watcher.start()
    return watcher


def exit_description(exitcode: int | None) -> str:
    """How a process ended without reporting, from its ``multiprocessing`` exit code: ``killed by SIGKILL (…)``
    for a signal, else its exit status."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (as the out-of-memory killer does)" if exitcode == -signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with status {exitcode} without a result"


def check_runs_not_held(study_dir: Path, run_dirs: Sequence[str]) -> None:
    """Refuse to run the study in ``study_dir`` while another process holds the lock of one of its run directories
    (``run_dirs``, relative to it): the workers of an earlier run of the study, still checkpointing after it was
    killed (even with SIGKILL).

    Raises:
        DirectoryInUseError: some run directory is held; the message names each with its holder's PID.
    """
    held: list[tuple[str, LockHeldError]] = []
    for run_dir in run_dirs:
        lock = Path(study_dir) / run_dir / LOCK_FILE
        if not lock.is_file():  # no process has held it, or the last one let go of it
            continue
        try:
            with exclusive_lock(lock):  # free: a killed holder left its file behind, not its lock
                pass
        except LockHeldError as error:
            held.append((run_dir, error))
    if not held:
        return
    pids = sorted({str(error.pid) for _, error in held if error.pid is not None})
    raise DirectoryInUseError(
        f"study directory {study_dir}: run(s) still held by the processes that trained them: "
        + ", ".join(f"{run_dir} ({error.holder})" for run_dir, error in held)
        + "; the workers of a stopped or killed study checkpoint their runs first (up to about 20 s): wait for "
        f"{'them' if len(pids) != 1 else 'it'} to end and run the study again"
        + (f" (or stop them: kill {' '.join(pids)}; each checkpoints and stops)" if pids else ""),
        held[0][1].pid,
    )
