"""The server a local study's workers are forked from, on Linux: a multiprocessing ``forkserver`` that has imported
training's modules once, so that a run starts at once instead of importing torch and transformers afresh.

The server is started once per process, at the first run a study starts, and serves every later study of that
process. It leaves the study's process group and ignores SIGTERM and SIGHUP, so that a signal meant for the study
(``timeout``, a batch scheduler, ``kill -- -PGID``) cannot end it under workers still running: it ends by itself once
the study's process and every worker it forked are gone. Elsewhere (macOS, where forking a process that has loaded
system frameworks is unsafe; Windows) each worker is a spawned interpreter.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
from typing import Any

from marllm.studies.signals import sigint_ignored

PRELOADED = ("marllm.studies.worker_server", "marllm.run.train", "marllm.studies.local_executor")
"""What the server imports before it forks a worker: this module first (it detaches the server), then everything a
run imports to train."""

_STARTING = "MARLLM_STUDY_WORKER_SERVER"  # set only while the server starts: how its import of this module knows it


def worker_context() -> Any:
    """The multiprocessing context a local study starts its workers with: the preloaded forkserver on Linux, else
    ``spawn``."""
    if not sys.platform.startswith("linux"):
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOADED))
    return context


def ensure_server(context: Any) -> None:
    """Start ``context``'s server unless it runs (a forkserver context; nothing for ``spawn``). It returns at once:
    the server imports :data:`PRELOADED` in the background, and the first worker's start waits for it."""
    if context.get_start_method() != "forkserver":
        return
    os.environ[_STARTING] = "1"  # the server's environment is copied from this one as it starts
    try:
        with sigint_ignored():  # a Ctrl-C now would leave the server half started
            multiprocessing.forkserver.ensure_running()
    finally:
        os.environ.pop(_STARTING, None)


def _detach_server() -> None:
    """In the server only: its own process group, and SIGTERM and SIGHUP ignored (its workers restore them)."""
    if os.environ.pop(_STARTING, None) != "1":
        return
    os.setpgrp()
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_IGN)


_detach_server()
