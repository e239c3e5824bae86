"""The lifetime of a study's worker processes: dying with the parent that started them, and saying how one ended.

On Linux a worker asks the kernel for a signal when its parent dies (``prctl(PR_SET_PDEATHSIG)``), so that a
``marllm study`` killed with SIGKILL, which cannot stop its workers itself, leaves no orphan training on. Other
platforms have no such call: there an orphaned worker trains its run to the end and then exits (each run has its own
process, which nothing waits on afterwards).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

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
