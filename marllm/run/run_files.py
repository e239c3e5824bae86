"""Which files in a run directory are marllm's: their names, and the entries ``overwrite`` may delete.

marllm writes these names at the top of a run directory: ``config.yaml``, ``run.json``, ``metrics.jsonl``,
``samples.jsonl``, ``eval_samples.jsonl``, ``pass_at_k.json``, ``tensorboard/``, ``training_state/`` and
``checkpoints/`` (:data:`RUN_FILES`), ``report/`` (``marllm report``'s default output) and its lock file. In the
directories only some entries are marllm's (:func:`run_entries`): TensorBoard's event files, the checkpoint directories
of ``training_state/``, and in ``checkpoints/LEARNER/`` the files of a learner's export, as its ``manifest.json``
lists them (a user's file there, even inside ``policy/``, is not marllm's); in ``report/`` the report's own files.
"""

from __future__ import annotations

import shutil
from collections.abc import Collection, Sequence
from pathlib import Path

from marllm.run.checkpoint_store import is_checkpoint_entry
from marllm.utils.files import MANIFEST_NAME, read_json

CONFIG_FILE = "config.yaml"
RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
EVAL_FILE = "eval_samples.jsonl"
PASS_AT_K_FILE = "pass_at_k.json"
TENSORBOARD_DIR = "tensorboard"
EXPORT_DIR = "checkpoints"
# marllm.run.checkpoint.CHECKPOINTS_DIR (kept light: the report imports this module)
TRAINING_STATE_DIR = "training_state"
# ``marllm report RUN_DIR`` writes its report here (marllm.reporting.build; the test of this module checks the names).
REPORT_DIR = "report"
REPORT_ENTRIES = (
    "report.md",
    "summary.json",
    "task_reward.png",
    "kl.png",
    "combined_reward.png",
    "task_reward_by_role.png",
    "reward_vs_kl.png",
    "collapse_per_iteration.png",
)

# The lock of the process that owns a run directory (also of a study's and the main job's directories); it does not
# make a directory a run, and ``overwrite`` leaves it (the process that overwrites holds it).
LOCK_FILE = ".marllm.lock"

# What marllm train writes at the top of a run directory (in the directories, marllm's entries only:
# :func:`run_entries`). With LOCK_FILE and REPORT_DIR, these are all of marllm's names in a run directory.
RUN_FILES = (
    CONFIG_FILE,
    RUN_FILE,
    METRICS_FILE,
    SAMPLES_FILE,
    EVAL_FILE,
    PASS_AT_K_FILE,
    TENSORBOARD_DIR,
    EXPORT_DIR,
    TRAINING_STATE_DIR,
)
# Everything ``overwrite`` removes: the run's files and the report of it, which would describe a run that is gone.
OVERWRITTEN = (*RUN_FILES, REPORT_DIR)
# What a learner's export (marllm.algorithms.learner_checkpoint, LearnerCheckpoint.save) writes in
# ``checkpoints/LEARNER/``, with what earlier marllm versions wrote there (kept light: the report imports this module).
# An export with a ``manifest.json`` is read through it instead, file by file.
EXPORT_ENTRIES = (
    "policy",
    "learner_state.safetensors",
    "learner_state.json",
    MANIFEST_NAME,
    "learner_state.pt",
    "value_head.safetensors",
)
# The files TensorBoard's SummaryWriter writes in ``tensorboard/``.
TENSORBOARD_EVENTS_PREFIX = "events.out.tfevents."
# Written after training ends: they describe a finished training, so a resumed run drops them until it ends.
END_OF_RUN_FILES = (EVAL_FILE, PASS_AT_K_FILE)
# marllm's record of a run, written first when a run starts: a directory holding neither is not a run's (a stray
# ``metrics.jsonl`` does not make one).
RECORD_FILES = (RUN_FILE, CONFIG_FILE)


def run_entries(run_dir: Path, names: Sequence[str] = RUN_FILES) -> list[Path]:
    """marllm's own files and directories among ``names`` in ``run_dir``, as ``overwrite`` removes them.

    A file (or a link) is listed by its name. In ``tensorboard/`` the event files are listed, in ``training_state/``
    the checkpoint directories (and what interrupted saves leave), in ``report/`` the report's files
    (:data:`REPORT_ENTRIES`), and in ``checkpoints/LEARNER/`` what a learner's export wrote: the files its
    ``manifest.json`` lists and the manifest, or without one the names of :data:`EXPORT_ENTRIES` (a directory of
    ``checkpoints/`` counts as a learner's when it holds one of them). Nothing else in those directories is listed,
    nor the directories themselves.
    """
    entries = []
    for name in names:
        path = run_dir / name
        if not path.is_dir() or path.is_symlink():
            if path.exists() or path.is_symlink():
                entries.append(path)
            continue
        if name == TENSORBOARD_DIR:
            entries += [entry for entry in _sorted(path) if entry.name.startswith(TENSORBOARD_EVENTS_PREFIX)]
        elif name == TRAINING_STATE_DIR:
            entries += [entry for entry in _sorted(path) if is_checkpoint_entry(entry.name)]
        elif name == REPORT_DIR:
            entries += [entry for entry in _sorted(path) if entry.name in REPORT_ENTRIES]
        elif name == EXPORT_DIR:
            for learner in export_dirs(path):
                entries += export_entries(learner)
        else:  # a directory under a file's name: marllm's name, so it goes
            entries.append(path)
    return entries


def export_dirs(export_dir: Path) -> list[Path]:
    """The learners' export directories in ``checkpoints/``."""
    return [
        entry
        for entry in _sorted(export_dir)
        if entry.is_dir() and not entry.is_symlink() and any((entry / name).exists() for name in EXPORT_ENTRIES)
    ]


def export_entries(learner_dir: Path) -> list[Path]:
    """What marllm wrote in a learner's export directory: the files its manifest lists (those still there) and the
    manifest; without a readable manifest, the entries named in :data:`EXPORT_ENTRIES`."""
    listed = _manifest_files(learner_dir)
    if listed is None:
        return [entry for entry in _sorted(learner_dir) if entry.name in EXPORT_ENTRIES]
    files = [learner_dir / name for name in sorted(listed) if (learner_dir / name).is_file()]
    return [*files, learner_dir / MANIFEST_NAME]


def foreign_export_files(run_dir: Path) -> list[Path]:
    """Files in the learners' export directories of ``run_dir`` that their exports did not write (a user's notes in
    ``checkpoints/llm1/policy/``, say), sorted."""
    export_dir = run_dir / EXPORT_DIR
    if not export_dir.is_dir() or export_dir.is_symlink():
        return []
    foreign = []
    for learner in export_dirs(export_dir):
        ours = export_entries(learner)
        foreign += [
            path
            for path in learner.rglob("*")
            if not path.is_dir() and not any(path == entry or entry in path.parents for entry in ours)
        ]
    return sorted(foreign)


def names_in_the_way(run_dir: Path) -> list[str]:
    """marllm train's names (:data:`RUN_FILES`) that ``run_dir`` already holds, as a file or a non-empty directory."""
    found = []
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_symlink() or path.is_file() or (path.is_dir() and any(path.iterdir())):
            found.append(name)
    return found


def _manifest_files(learner_dir: Path) -> list[str] | None:
    """The files a learner export's manifest lists (None without a readable manifest)."""
    manifest = learner_dir / MANIFEST_NAME
    if not manifest.is_file():
        return None
    try:
        listed = read_json(manifest)["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return [name for name in listed if isinstance(name, str)] if isinstance(listed, dict) else None


def _sorted(directory: Path) -> list[Path]:
    return sorted(directory.iterdir())


def _containers(run_dir: Path, names: Sequence[str]) -> list[Path]:
    """The directories of ``names`` whose entries :func:`run_entries` picks, deepest first."""
    containers = []
    for name in (TENSORBOARD_DIR, TRAINING_STATE_DIR, REPORT_DIR, EXPORT_DIR):
        path = run_dir / name
        if name in names and path.is_dir() and not path.is_symlink():
            if name == EXPORT_DIR:
                for learner in export_dirs(path):
                    inner = [entry for entry in learner.rglob("*") if entry.is_dir() and not entry.is_symlink()]
                    containers += sorted(inner, key=lambda entry: len(entry.parts), reverse=True)
                    containers.append(learner)
            containers.append(path)
    return containers


def remove_run_files(run_dir: Path, names: Sequence[str] = RUN_FILES, keep: Collection[Path] = ()) -> list[Path]:
    """Delete marllm's own files among ``names`` from ``run_dir`` (:func:`run_entries`, but those in ``keep``), and
    the directories of ``names`` they leave empty (but those in ``keep``); anything else stays.

    Returns what stays in those directories that is not marllm's (a user's file in ``checkpoints/``, say), sorted.
    """
    containers = _containers(run_dir, names)
    for path in run_entries(run_dir, names):
        if path in keep:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    kept = []
    for container in containers:  # deepest first: a learner's policy/ before the learner's, before checkpoints/
        if container in keep or not container.is_dir():
            continue
        remaining = _sorted(container)
        if not remaining:
            container.rmdir()
        kept += [entry for entry in remaining if entry not in containers]
    return sorted(set(kept))


def describe_entries(run_dir: Path, entries: Sequence[Path]) -> str:
    """``entries`` of ``run_dir`` in a few words: each top-level name (with how many of its entries are listed for a
    directory), and each learner's export as ``checkpoints/LEARNER``."""
    counts: dict[str, int] = {}
    for entry in entries:
        parts = entry.relative_to(run_dir).parts
        key = "/".join(parts[:2]) if parts[0] == EXPORT_DIR and len(parts) > 2 else parts[0]  # a learner's export
        counts[key] = counts.get(key, 0) + (len(parts) > 1 and key == parts[0])
    return ", ".join(f"{name}/ ({count} entries)" if count else name for name, count in counts.items())
