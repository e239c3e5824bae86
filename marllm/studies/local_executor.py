"""Running a study's runs locally: each in a worker process of its own, a few at a time.

On Linux a worker is forked from a server that has imported training's modules once
(:mod:`marllm.studies.worker_server`): a run starts at once instead of importing torch and transformers afresh, which
takes seconds. Elsewhere each worker is a spawned interpreter. Either way a worker holds nothing of the study's process
but the run it is given and the study's environment variables as they are when the run starts (what a library reads
once, at import, such as ``HF_HUB_OFFLINE``, a forked worker has as it was when the server started, at the first run
of a study in this process).

A worker that dies (a signal, the out-of-memory killer) fails only its run, which is tried once more from its
checkpoint, as on Ray. Workers die with the study that started them, however it ends (its lifeline,
:mod:`marllm.studies.processes`: a training run then checkpoints and stops).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections import deque
from collections.abc import Callable
from multiprocessing import connection
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from marllm.studies.processes import die_with_study, exit_description
from marllm.studies.signals import sigint_ignored as _sigint_ignored
from marllm.studies.signals import sigterm_interrupts
from marllm.studies.spec import StudyRun
from marllm.studies.worker import (
    ATTEMPTS,
    Action,
    Executor,
    RunEvent,
    RunFunction,
    RunOutcome,
    error_line,
    plan,
    record_failure,
    run_one,
    worker_init,
)
from marllm.studies.worker_server import ensure_server, worker_context


class LocalExecutor(Executor):
    """Runs a study's runs here, each in a process of its own, ``workers`` at a time (default: ``os.cpu_count()``).

    A run whose process dies (killed by a signal, by the out-of-memory killer, a crash in native code) fails alone:
    the other runs go on, and it is tried once more, planned afresh (it resumes from the checkpoint the first attempt
    left, or starts over without one), as on Ray. If that attempt dies too, the run is recorded failed (``error.txt``
    and ``run.json``). A run that raises fails once (``run_one`` records it): it would fail again.

    Args:
        workers: how many runs train at once.
        run_function: what each process calls with ``(config_data, run_dir, action)`` (default: :func:`run_one`;
            tests put one that kills its process here). It must be importable by name in a worker process.
    """

    def __init__(self, workers: int | None = None, run_function: RunFunction = run_one):
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.run_function = run_function

    def _run_todo(
        self,
        todo: list[tuple[StudyRun, Action]],
        study_dir: Path,
        on_event: Callable[[RunEvent], None],
        overwrite: bool,
    ) -> dict[str, RunOutcome]:
        """Run every run (``overwrite`` is in its action already); on KeyboardInterrupt (Ctrl-C, or SIGTERM to this
        process, as a batch scheduler sends it), pass SIGINT to the workers (each checkpoints and stops), start no
        further run, wait for them, and raise KeyboardInterrupt again."""
        outcomes: dict[str, RunOutcome] = {}
        threads = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # the workers (and their server) start with it, before importing torch
        context = worker_context()
        ensure_server(context)
        stopping = context.Event()
        queue = deque((run, action, 1) for run, action in todo)
        running: list[_Attempt] = []
        with sigterm_interrupts():
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

            again = "resuming from its checkpoint" if action == "resume" else "starting it over (no checkpoint)"
            tqdm.write(f"marllm: run {run.name}: its worker process died ({how}); {again}", file=sys.stderr)
            queue.appendleft((run, action, attempt.number + 1))
            return None
        message = f"worker process died in each of {ATTEMPTS} attempts, the last {how}"
        record_failure(attempt.run_dir, message)
        return RunOutcome(run.name, "failed", message)


class _Attempt:
    """Attempt ``number`` at a run, planned as ``action``: a worker process of its own, started here, and the pipe
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
        lifeline, self._lifeline = context.Pipe(duplex=False)  # this process holds the writing end until it ends
        environment = dict(os.environ)  # now, not when the server started
        args = (sender, lifeline, environment, stopping, run_function, run.config.to_dict(), str(run_dir), action)
        self.process = context.Process(target=_worker_main, args=args, name=f"marllm-study:{run.name}")
        if context.get_start_method() == "spawn":
            with _sigint_ignored():  # a worker spawned here starts immune until its initializer runs
                self.process.start()
        else:  # a forked worker takes its signal settings from the server, which ignores SIGINT
            self.process.start()
        sender.close()
        lifeline.close()

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
    lifeline: Any,
    environment: dict[str, str],
    stopping: Any,
    run_function: RunFunction,
    config_data: dict[str, Any],
    run_dir: str,
    action: Action,
) -> None:
    """A worker process: die with the study (SIGTERM once the study's process has ended, so a training run
    checkpoints and stops), take the study's environment variables, run one run and send its outcome back."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a spawned worker starts: until worker_init's handler
    for number in (signal.SIGTERM, signal.SIGHUP):  # ignored by the server a forked worker comes from
        signal.signal(number, signal.SIG_DFL)
    die_with_study(lifeline)
    os.environ.clear()
    os.environ.update(environment)
    try:
        worker_init(stopping)
        outcome = run_function(config_data, run_dir, action)
    except BaseException as error:  # noqa: BLE001 - raised outside run_one's own handling: the run's failure
        outcome = RunOutcome(Path(run_dir).name, "failed", f"worker failed: {error_line(error)}")
        record_failure(Path(run_dir), outcome.error or "")
    with contextlib.suppress(OSError):  # the study is gone
        results.send(outcome)
