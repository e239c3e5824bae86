"""Running a study: its directory, what each run needs (skip, resume, start over), and the executor that runs them.

The study directory holds ``study.yaml`` (the study file, base inline), ``study.json`` (the expanded runs) and
``runs/<name>/``, one ordinary run directory per run (``error.txt`` in it when the run failed).

One process at a time runs a study directory (:func:`hold_study_dir`: ``marllm study`` holds its lock while it runs),
and one at a time each of its runs (the worker that trains a run holds its run directory's lock): a study run again
while a worker of an earlier one still holds a run is refused, naming it
(:func:`~marllm.studies.processes.check_runs_not_held`). Workers die with the study that started them, however it
ends (:mod:`marllm.studies.processes`: a training run then checkpoints and stops), so that worker is an orphan still
checkpointing.

Locally each run trains in a process of its own (:class:`~marllm.studies.local_executor.LocalExecutor`): one
that dies (a signal, the out-of-memory killer) fails only its run, which is tried once more from its checkpoint, as on
Ray. What a worker does with its run is :mod:`marllm.studies.worker`'s, and how signals stop a study
:mod:`marllm.studies.signals`'.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml
from tqdm.auto import tqdm

from marllm.config import resume_differences
from marllm.config.loading import ConfigError
from marllm.run.run_dir import CONFIG_FILE, hold_directory, write_atomic
from marllm.studies.files import EXPANSION_FILE, STUDY_FILE
from marllm.studies.local_executor import LocalExecutor
from marllm.studies.processes import check_runs_not_held
from marllm.studies.signals import stopping_signal  # noqa: F401 - re-exported
from marllm.studies.spec import Study, StudyRun, expansion_changed
from marllm.studies.worker import (  # noqa: F401 - the executors' base, a run's outcome and run_one, re-exported
    Action,
    Executor,
    RunEvent,
    RunOutcome,
    plan,
    run_one,
)


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


class StudyProgress:
    """One tqdm bar on stderr for a whole study: runs done, running and failed, with an ETA.

    ``workers`` caps the running count shown (runs submitted beyond it wait); a callable is asked at each event (an
    executor may know it only once it has started).
    """

    def __init__(self, total: int, workers: int | Callable[[], int], enabled: bool = True):

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
