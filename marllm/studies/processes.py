"""The lifetime of a study's worker processes: dying with the parent that started them, and saying how one ended.

On Linux a worker asks the kernel for a signal when its parent dies (``prctl(PR_SET_PDEATHSIG)``), so that a
``marllm study`` killed with SIGKILL, which cannot stop its workers itself, leaves no orphan training on. Other
platforms have no such call: there an orphaned worker trains its run to the end and then exits (each run has its own
process, which nothing waits on afterwards).

A worker so stopped first checkpoints its run, which takes up to about 20 s, holding its run directory's lock.
:func:`check_runs_not_held` refuses a study run again meanwhile, naming those workers, so that no new worker plans a
run from a checkpoint the old one is still writing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from marllm.run.run_dir import DirectoryInUseError
from marllm.run.run_files import LOCK_FILE
from marllm.utils.files import LockHeldError, exclusive_lock

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent(parent_pid: int, signal_number: int = signal.SIGTERM) -> bool:
    """Have this process receive ``signal_number`` when its parent dies (Linux); if the parent ``parent_pid`` died
    before that was set, send it now. Elsewhere, or where ``prctl`` fails, nothing happens.

    The signal comes when the parent's *thread* that started this process ends, so that thread must outlive it (a
    study's executor waits for its workers in the thread that started them). Returns whether it was set.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        unset = libc.prctl(ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(signal_number), *[ctypes.c_ulong(0)] * 3)
    except (OSError, AttributeError):
        return False
    if unset:
        return False
    if os.getppid() != parent_pid:  # the parent was gone before the request: no signal will come
        os.kill(os.getpid(), signal_number)
    return True


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
    killed (even with SIGKILL), or still training on a platform without the parent-death signal.

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
