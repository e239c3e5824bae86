"""Running a study's runs as Ray tasks, on a local Ray instance or a cluster (``marllm study --engine ray``).

Each run is one task that calls :func:`marllm.studies.worker.run_one`, as a local worker does, with the CPUs and
GPUs of the study file's ``resources`` reserved for it. Runs write into the study directory as they do locally, so on
a cluster that directory must be on a filesystem every node sees (NFS or the like) under the same path.

Failures, by layer:

- A run that raises (a bad config, a missing file, non-finite training …) fails inside ``run_one``, which writes
  ``error.txt`` and returns a failed outcome, as locally. Ray sees a task that succeeded, so the run is not retried:
  it would fail the same way again.
- A run whose worker process or node dies (out of memory, a lost node, a crash in native code) is a system failure to
  Ray, which retries the task once (``max_retries=1``; Python exceptions are not retried). The retry plans the run
  afresh: it resumes from the checkpoint the first attempt left, or starts over if there is none. If the retry dies
  too, the run is recorded failed (``error.txt``, ``run.json`` status ``failed``), like a local failure, and the
  study goes on; running the study again starts it over.

Ray is an optional dependency (``pip install 'marllm[ray]'``), imported when an executor is used.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from marllm.config.loading import ConfigError
from marllm.run.run_dir import (
    DirectoryInUseError,
    hold_run_dir,
    overwrite_run_files,
)
from marllm.studies.files import ERROR_FILE, EXPANSION_FILE, STUDY_FILE
from marllm.studies.signals import sigterm_interrupts
from marllm.studies.spec import StudyRun, resources_over_defaults
from marllm.studies.worker import (
    ATTEMPTS,
    Action,
    Executor,
    RunEvent,
    RunFunction,
    RunOutcome,
    error_line,
    plan,
    quiet_libraries,
    record_failure,
    run_one,
)

_WAIT_S = 1.0  # how long one ray.wait blocks (Ctrl-C and SIGTERM are seen between waits)


def import_ray() -> Any:
    """Import Ray, or raise ConfigError saying how to install it."""
    try:  # the optional marllm[ray] extra
        import ray
    except ImportError as error:
        raise ConfigError(
            f"the Ray engine needs Ray, which is not installed ({error}): pip install 'marllm[ray]'"
        ) from error
    return ray


class RayExecutor(Executor):
    """Runs a study's runs as Ray tasks (an :class:`~marllm.studies.worker.Executor`).

    Args:
        address: a Ray cluster to connect to (``ray://HOST:10001``, ``HOST:6379`` or ``auto``); None starts a local
            Ray instance for the study and stops it afterwards. If Ray is already initialised in this process, that
            instance is used as it is and left running.
        num_cpus: the CPUs of a local instance (default: ``os.cpu_count()``); not used with ``address``.
        num_gpus: the GPUs of a local instance (default: those Ray detects); not used with ``address``.
        resources: what each run reserves, ``{"cpus": …, "gpus": …}`` (default: the ``resources`` of the study file
            in the study directory, 1 CPU and no GPU where it gives none).
        run_function: what each task calls with ``(config_data, run_dir, action)`` (default: ``run_one``; tests put
            a failing one here).

    A run's torch uses as many threads as the whole CPUs it reserves (at least one).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: int | None = None,
        num_gpus: int | None = None,
        resources: Mapping[str, float] | None = None,
        run_function: RunFunction = run_one,
    ):
        self.ray = import_ray()
        self.address = address
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.resources = dict(resources) if resources is not None else None
        self.run_function = run_function
        self.workers = 1  # runs that fit at once (set when connected; the study's progress display reads it)

    def _run_todo(
        self,
        todo: list[tuple[StudyRun, Action]],
        study_dir: Path,
        on_event: Callable[[RunEvent], None],
        overwrite: bool,
    ) -> dict[str, RunOutcome]:
        """Run every run that is not finished as one Ray task each and return an outcome per run.

        ``started`` is reported when a run is submitted (Ray starts it once its resources are free). On
        KeyboardInterrupt (Ctrl-C, or SIGTERM to this process): cancel every task (a running run gets one SIGINT, so
        it checkpoints and stops; a queued one never starts), wait for the running ones, and raise
        KeyboardInterrupt again.

        Raises:
            ConfigError: a run asks for more CPUs or GPUs than the Ray cluster has (it would wait forever).
        """
        runs = [run for run, _ in todo]  # their actions stay here: each task plans its run itself
        resources = self._run_resources(study_dir)
        started = self._connect()
        try:
            self._check_fits(resources)
            if overwrite:  # cleared here, so that each task plans its run itself (a retry resumes)
                for run in runs:
                    _clear_run(study_dir / run.relative_dir)
            return self._run_tasks(runs, study_dir, resources, on_event)
        finally:
            if started:
                self.ray.shutdown()

    def _run_resources(self, study_dir: Path) -> dict[str, float]:
        """This executor's ``resources``, else those of ``STUDY_DIR/study.yaml`` (which run_study writes), over the
        defaults."""
        resources = self.resources
        if resources is None:
            try:
                data = yaml.safe_load((study_dir / STUDY_FILE).read_text(encoding="utf-8"))
            except (OSError, yaml.YAMLError):
                data = None
            resources = data.get("resources") if isinstance(data, dict) else None
        return resources_over_defaults(resources)

    def _connect(self) -> bool:
        """Initialise Ray unless it is; True when this executor started it (and so stops it)."""
        ray = self.ray
        if ray.is_initialized():
            return False
        options: dict[str, Any] = {"include_dashboard": False, "logging_level": "warning"}
        if self.address is None:
            options["num_cpus"] = self.num_cpus or os.cpu_count() or 1
            if self.num_gpus is not None:
                options["num_gpus"] = self.num_gpus
        try:
            ray.init(address=self.address, **options)
        except ConnectionError as error:
            raise ConfigError(f"cannot connect to the Ray cluster at {self.address!r}: {error_line(error)}") from error
        return True

    def _check_fits(self, resources: Mapping[str, float]) -> None:
        total = self.ray.cluster_resources()
        fits = []
        for key, name in (("cpus", "CPU"), ("gpus", "GPU")):
            wanted, have = resources[key], float(total.get(name, 0.0))
            if wanted > have:
                where = f"the Ray cluster at {self.address}" if self.address else "the local Ray instance"
                raise ConfigError(
                    f"each run of the study asks for resources.{key}={wanted:g} but {where} has {have:g} {name} in "
                    f"all, so the run could never start; lower resources.{key} in the study file, or run on a "
                    "bigger cluster"
                )
            if wanted > 0:
                fits.append(math.floor(have / wanted))
        self.workers = max(1, min(fits, default=1))

    def _run_tasks(
        self,
        todo: Sequence[StudyRun],
        study_dir: Path,
        resources: Mapping[str, float],
        on_event: Callable[[RunEvent], None],
    ) -> dict[str, RunOutcome]:
        ray = self.ray
        task = ray.remote(_attempt)
        options = {
            "num_cpus": resources["cpus"],
            "num_gpus": resources["gpus"],
            "max_retries": ATTEMPTS - 1,  # system failures only: a Python exception is not retried
            "retry_exceptions": False,
        }
        threads = max(1, math.floor(resources["cpus"]))
        outcomes: dict[str, RunOutcome] = {}
        pending: dict[Any, StudyRun] = {}
        with sigterm_interrupts():
            try:
                for run in todo:
                    ref = task.options(name=f"marllm-study:{run.name}", **options).remote(
                        self.run_function, run, str(study_dir.resolve()), threads
                    )
                    pending[ref] = run
                    on_event(RunEvent("started", run.name))
                while pending:
                    done, _ = ray.wait(list(pending), num_returns=1, timeout=_WAIT_S)
                    for ref in done:
                        run = pending.pop(ref)
                        outcomes[run.name] = self._result(ref, run, study_dir)
                        on_event(RunEvent("ended", run.name, outcomes[run.name]))
            except KeyboardInterrupt:
                for ref in pending:
                    ray.cancel(ref)  # force=False: SIGINT to a running task, a queued one is dropped
                for ref, run in pending.items():
                    outcomes[run.name] = self._result(ref, run, study_dir)
                    on_event(RunEvent("ended", run.name, outcomes[run.name]))
                raise
        return outcomes

    def _result(self, ref: Any, run: StudyRun, study_dir: Path) -> RunOutcome:
        """The task's outcome; a cancelled task is ``interrupted``, a task that failed in Ray is recorded failed."""
        exceptions = self.ray.exceptions
        try:
            return self.ray.get(ref)
        except exceptions.TaskCancelledError:
            return RunOutcome(run.name, "interrupted", "not started: the study was interrupted")
        except (exceptions.WorkerCrashedError, exceptions.NodeDiedError, exceptions.OwnerDiedError) as error:
            message = f"worker failed in each of {ATTEMPTS} attempts: {_ray_error(error)}"
        except exceptions.RayError as error:  # RayTaskError (raised outside run_one), a lost object …
            message = f"worker failed: {_ray_error(error)}"
        record_failure(study_dir / run.relative_dir, message)
        return RunOutcome(run.name, "failed", message)


def _attempt(run_function: RunFunction, run: StudyRun, study_dir: str, threads: int) -> RunOutcome:
    """One attempt at a run, in a Ray worker: plan it (a retry resumes what the first attempt checkpointed), then
    run it with ``threads`` torch threads."""
    root = Path(study_dir)
    if not (root / EXPANSION_FILE).is_file():
        raise FileNotFoundError(
            f"the study directory {study_dir} is not visible on this Ray node (no {EXPANSION_FILE}): on a cluster, "
            "put it on a filesystem every node mounts at the same path"
        )
    quiet_libraries(threads)  # as a local worker does: no progress bars of its own either
    run_dir = root / run.relative_dir
    action = plan(run, run_dir)
    if action == "skip":  # finished by an attempt whose result was lost
        return RunOutcome(run.name, "finished")
    return run_function(run.config.to_dict(), str(run_dir), action)


def _clear_run(run_dir: Path) -> None:
    """What ``--overwrite`` does to a run before it starts again: its files (marllm's own) and its error go; a run
    another process owns (an earlier study's worker) is left as it is (its task is refused)."""
    if not run_dir.is_dir():
        return
    try:
        with hold_run_dir(run_dir):
            overwrite_run_files(run_dir)
            (run_dir / ERROR_FILE).unlink(missing_ok=True)
    except DirectoryInUseError:
        pass


def _ray_error(error: BaseException) -> str:
    """A Ray error on one line: the exception a task raised, or Ray's message without the traceback it carries."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException):
        return error_line(cause)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1]}" if lines else type(error).__name__
