"""The run directory: the files a training run writes there, its recorded status, and the checks before a run starts.

A run directory holds ``config.yaml``, ``run.json`` (what the run is and how far it got), ``metrics.jsonl`` and
``samples.jsonl`` (one line per iteration, appended as it goes), ``tensorboard/``, ``training_state/`` (the
checkpoints a run resumes from, see :mod:`marllm.run.checkpoint`), and when training ends ``checkpoints/`` (each learner
exported for ``marllm eval``), ``eval_samples.jsonl`` and ``pass_at_k.json``; ``report/`` once ``marllm report``
writes it there; and ``.marllm.lock``, the lock of the process that owns the directory (:func:`hold_run_dir`). Nothing
else in it is marllm's, and in its directories only the entries marllm's writers create there are
(:mod:`marllm.run.run_files`). marllm writes over no file it did not write: a new run is refused in a directory that
holds files under those names and no run of marllm's, and ``overwrite`` deletes marllm's files only, saying which.

One process at a time owns a run directory: :func:`marllm.run.train.train` holds its lock for the whole run, and
another process that tries to train into it is refused with the owner's PID. The lock is ``flock``'s, so it ends with
the process, even a killed one.

``run.json``'s ``status`` is ``running`` while a process trains (it stays so when the process is killed),
``interrupted`` after SIGINT/SIGTERM, ``failed`` after an error, and ``finished`` once everything, end-of-run
evaluation included, is written; ``completed_iterations`` counts the iterations logged so far.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from marllm.run.checkpoint_store import is_checkpoint_entry
from marllm.run.run_files import (  # noqa: F401 - the run directory's names, re-exported
    CONFIG_FILE,
    END_OF_RUN_FILES,
    EVAL_FILE,
    EXPORT_DIR,
    EXPORT_ENTRIES,
    LOCK_FILE,
    METRICS_FILE,
    OVERWRITTEN,
    PASS_AT_K_FILE,
    RECORD_FILES,
    REPORT_DIR,
    RUN_FILE,
    RUN_FILES,
    SAMPLES_FILE,
    TENSORBOARD_DIR,
    TENSORBOARD_EVENTS_PREFIX,
    TRAINING_STATE_DIR,
    describe_entries,
    foreign_export_files,
    names_in_the_way,
    remove_run_files,
    run_entries,
)
from marllm.utils.files import LockHeldError, exclusive_lock, read_json_object
from marllm.utils.files import atomic_write_text as write_atomic

Status = Literal["running", "interrupted", "failed", "finished"]
# "unknown": a run.json from before statuses were recorded, with fewer metric lines than its iterations.
STATUSES = ("running", "interrupted", "failed", "finished", "unknown")


class RunDirError(ValueError):
    """A run directory cannot be used as asked (it already holds a run, it has nothing to resume from, ...)."""


class WrongDirectoryError(RunDirError):
    """A directory given as a run's is not one, or one given as a run's or a study's is the other kind (a study
    directory as ``--run-dir``): refused before anything is done. The message says what it is and what to give."""


class DirectoryInUseError(RunDirError):
    """Another process owns the directory (a run's, a study's or the main job's): it holds its lock.

    Attributes:
        pid: the owner's process id (None when it has not written it yet).
    """

    def __init__(self, message: str, pid: int | None):
        super().__init__(message)
        self.pid = pid


@dataclass(frozen=True)
class RunState:
    """How far the run of a directory got.

    Attributes:
        status: one of :data:`STATUSES`.
        completed: iterations logged in ``metrics.jsonl``.
        planned: the run's ``iterations`` (None when no ``run.json`` says).
    """

    status: str
    completed: int
    planned: int | None

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    def describe(self) -> str:
        """E.g. ``"5 of 20 iterations, interrupted"``."""
        done = f"{self.completed} of {self.planned}" if self.planned is not None else str(self.completed)
        status = "running or killed" if self.status == "running" else self.status
        if self.status == "unknown":
            status = "stopped early (no status recorded)"
        return f"{done} iterations, {status}"


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run: a ``run.json``, a ``metrics.jsonl`` or training checkpoints (marllm's entries
    in ``training_state/``; the lock file and other files do not count)."""
    state = run_dir / TRAINING_STATE_DIR
    has_state = state.is_dir() and any(is_checkpoint_entry(entry.name) for entry in state.iterdir())
    return (run_dir / RUN_FILE).is_file() or (run_dir / METRICS_FILE).is_file() or has_state


def has_run_record(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds marllm's record of a run: its ``run.json`` or its ``config.yaml``."""
    return any((run_dir / name).is_file() for name in RECORD_FILES)


def check_run_record(run_dir: Path) -> None:
    """Refuse a directory without marllm's record of a run (:data:`RECORD_FILES`), such as one holding only a
    ``metrics.jsonl``: a report would take it for a finished run.

    Raises:
        WrongDirectoryError: saying which files are missing, and which of a run's files it holds.
    """
    if has_run_record(run_dir):
        return
    found = [name for name in RUN_FILES if (run_dir / name).exists()]
    alone = f" (of a run's files it holds only {', '.join(found)})" if found else ""
    raise WrongDirectoryError(
        f"{run_dir} is not a run directory: it has no {RUN_FILE} or {CONFIG_FILE}, which marllm train writes into "
        f"every run directory{alone}; give a directory marllm train wrote (its --run-dir)"
    )


def read_run_state(run_dir: Path) -> RunState | None:
    """The state of the run in ``run_dir``; None when it holds none.

    A ``run.json`` without ``status`` was written before statuses were recorded: that run counts as finished when
    its metrics have as many iterations as it planned, else its status is ``unknown``. A run with metrics but no
    ``run.json`` counts as finished (nothing says how many iterations it planned).
    """
    if not holds_run(run_dir):
        return None
    completed = count_iterations(run_dir / METRICS_FILE)
    return run_state(read_run_info(run_dir), completed)


def run_state(info: Mapping[str, Any], completed: int) -> RunState:
    """The state of a run from its ``run.json`` (``info``, empty when there is none) and its logged iterations."""
    planned = info.get("iterations")
    planned = planned if isinstance(planned, int) and not isinstance(planned, bool) else None
    status = info.get("status")
    if status not in STATUSES:
        status = "finished" if planned is None or completed >= planned else "unknown"
    return RunState(status, completed, planned)


def read_run_info(run_dir: Path) -> dict[str, Any]:
    """``run.json`` as a dict (empty when it is missing or not a JSON object)."""
    return read_json_object(run_dir / RUN_FILE)


def count_iterations(metrics_path: Path) -> int:
    """The number of distinct iterations logged in a ``metrics.jsonl`` (0 when it is missing)."""
    return len({record.get("iteration") for record in iter_jsonl(metrics_path)})


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, skipping lines that are not one (such as a line cut short by a
    killed process); nothing when the file is missing."""
    for _, record in _jsonl_lines(path):
        yield record


def _jsonl_lines(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(line text, object)`` for each line of a JSON-lines file that holds a JSON object."""
    if not path.is_file():
        return
    with path.open(encoding="utf-8") as handle:
        for text in handle:
            try:
                record = json.loads(text)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield text, record


def holds_marllm_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run marllm wrote: a run (:func:`holds_run`) with its record (:func:`has_run_record`).
    ``overwrite`` deletes only such a run."""
    return holds_run(run_dir) and has_run_record(run_dir)


def refuse_a_file(directory: Path, what: str = "run directory") -> None:
    """Refuse a file where the ``what`` ``directory`` should be (:class:`RunDirError`, saying so)."""
    if directory.exists() and not directory.is_dir():
        raise RunDirError(f"{what} {directory} is a file")


def check_can_start(run_dir: Path) -> None:
    """Refuse to start a new run in a directory that holds one, holds files under marllm's names that are not a
    run's (a user's ``config.yaml``: marllm writes over no file it did not write), or is a file.

    Raises:
        RunDirError: saying how far the run there got and how to resume it or start again, or which files are in the
            way and what to do.
    """
    refuse_a_file(run_dir)
    state = read_run_state(run_dir)
    if state is not None and has_run_record(run_dir):
        raise RunDirError(
            f"{run_dir} already holds a run ({state.describe()}); continue it from its latest checkpoint with "
            "--resume, or delete its files and start again with --overwrite"
        )
    _refuse_files_in_the_way(run_dir)


def check_can_overwrite(run_dir: Path) -> None:
    """Refuse an ``overwrite`` that would delete files marllm did not write: files under marllm's names in a
    directory that holds no run of marllm's, or a user's files inside a learner's export (``checkpoints/LEARNER/``,
    where the new run's export goes). Nothing is deleted when refused.

    Raises:
        RunDirError: naming the files and saying what to do.
    """
    refuse_a_file(run_dir)
    if not run_dir.is_dir():
        return
    if not holds_marllm_run(run_dir):
        _refuse_files_in_the_way(run_dir)
        return
    foreign = foreign_export_files(run_dir)
    if foreign:
        listed = ", ".join(path.relative_to(run_dir).as_posix() for path in foreign)
        raise RunDirError(
            f"--overwrite would delete the learners' exports in {run_dir / EXPORT_DIR}, which hold files marllm did "
            f"not write: {listed}; move them out of {run_dir / EXPORT_DIR} and run again"
        )


def _refuse_files_in_the_way(run_dir: Path) -> None:
    """Refuse a directory without a run of marllm's that holds files under the names marllm train writes."""
    found = names_in_the_way(run_dir) if run_dir.is_dir() else []
    if found:
        raise RunDirError(
            f"{run_dir} holds {', '.join(found)} but no {RUN_FILE}: not a run marllm wrote, and marllm train writes "
            f"over no file it did not write; move them out of {run_dir}, or train into another --run-dir"
        )


def create_run_dir(run_dir: Path) -> Path | None:
    """Create ``run_dir``; return the outermost directory this created (None if ``run_dir`` already existed)."""
    missing = [path for path in (run_dir, *run_dir.parents) if not path.exists()]
    run_dir.mkdir(parents=True, exist_ok=True)
    return missing[-1] if missing else None


@contextlib.contextmanager
def hold_directory(directory: Path, what: str, advice: str) -> Iterator[Path | None]:
    """Own ``directory`` for the block: create it if needed and hold its lock (``LOCK_FILE`` in it, with this
    process's PID) without waiting. Yields the outermost directory this created (None if it existed).

    The lock ends with the block, or with the process however it ends. The same thread may nest blocks on one
    directory. Refused, nothing in the directory is changed (a directory this created for it stays: the owner uses it).

    Args:
        what: what the directory is, for the error (``"run directory"``).
        advice: what to do about an owner, for the error; ``{pid}`` in it is replaced by the owner's PID.

    Raises:
        RunDirError: ``directory`` is a file.
        DirectoryInUseError: another process owns it: the message names its PID and says what to do.
    """
    directory = Path(directory)
    refuse_a_file(directory, what)
    created = create_run_dir(directory)
    lock = contextlib.ExitStack()
    try:
        lock.enter_context(exclusive_lock(directory / LOCK_FILE))
    except LockHeldError as error:
        pid = "PID" if error.pid is None else str(error.pid)
        raise DirectoryInUseError(
            f"{what} {directory} is in use by {error.holder}, which holds its lock {error.path}; "
            f"{advice.format(pid=pid)} (the lock ends with that process, even a killed one)",
            error.pid,
        ) from None
    with lock:
        yield created


def hold_run_dir(run_dir: Path) -> contextlib.AbstractContextManager[Path | None]:
    """Own the run directory ``run_dir`` for the block (:func:`hold_directory`): one process trains into it at a time.

    Raises:
        RunDirError: ``run_dir`` is a file.
        DirectoryInUseError: another process owns it (a run training there, or a study worker running it).
    """
    return hold_directory(
        run_dir,
        "run directory",
        "wait for that run to end, or stop it (kill {pid}: it checkpoints and stops, then go on with --resume), "
        "or train into another --run-dir",
    )


def overwrite_run_files(run_dir: Path) -> list[Path]:
    """What ``overwrite`` does before a new run: check that it deletes only marllm's files
    (:func:`check_can_overwrite`), say what it deletes (a warning), remove them with the report of the old run
    (:func:`remove_run_files` of :data:`OVERWRITTEN`), and warn about the files it left in marllm's directories.
    Returns those.

    Raises:
        RunDirError: as :func:`check_can_overwrite`.
    """
    check_can_overwrite(run_dir)
    doomed = run_entries(run_dir, OVERWRITTEN)
    if doomed:
        state = read_run_state(run_dir)
        run = f" ({state.describe()})" if state is not None else ""
        warnings.warn(
            f"--overwrite deletes the run in {run_dir}{run}: {describe_entries(run_dir, doomed)}",
            UserWarning,
            stacklevel=2,
        )
    kept = remove_run_files(run_dir, OVERWRITTEN)
    if kept:
        listed = ", ".join(path.relative_to(run_dir).as_posix() for path in kept)
        warnings.warn(
            f"--overwrite removed only marllm's own files from {run_dir}; kept what is not marllm's in its "
            f"directories: {listed}",
            UserWarning,
            stacklevel=2,
        )
    return kept


def write_run_info(run_dir: Path, info: Mapping[str, Any]) -> None:
    """Write ``run.json`` atomically."""
    write_atomic(run_dir / RUN_FILE, json.dumps(dict(info), indent=2) + "\n")


def update_run_info(run_dir: Path, **changes: Any) -> None:
    """Change some keys of ``run.json`` (atomically), e.g. ``status`` and ``completed_iterations``."""
    write_run_info(run_dir, {**read_run_info(run_dir), **changes})


def keep_iterations_before(path: Path, iteration: int, rewrite: bool = True) -> list[dict[str, Any]]:
    """Cut a JSON-lines log back to its lines of iterations before ``iteration`` (rewritten atomically; lines
    that are not JSON objects are dropped). Returns the lines kept; a missing file stays missing. With
    ``rewrite=False`` the file is only read (a data-parallel rank that does not write the run)."""
    if not path.is_file():
        return []
    kept = [(text, record) for text, record in _jsonl_lines(path) if _iteration(record) < iteration]
    if rewrite:
        write_atomic(path, "".join(text.rstrip("\n") + "\n" for text, _ in kept))
    return [record for _, record in kept]


def _iteration(record: Mapping[str, Any]) -> float:
    value = record.get("iteration")
    return value if isinstance(value, int) and not isinstance(value, bool) else float("inf")
