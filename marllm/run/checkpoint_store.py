"""The checkpoint directories on disk: durable files, the manifest and its checks, atomic replacement, pruning.

:mod:`marllm.run.checkpoint` decides what a checkpoint holds; this module writes files so that they survive a crash
(synced to disk), renames a finished checkpoint into place (moving aside one of the same iteration), keeps the newest
complete ones, cleans what interrupted saves left, and reads a checkpoint back: its manifest, the files' sizes and
sha256 against it, and its JSON and safetensors files. Every problem is a :class:`CheckpointError`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from marllm.utils.errors import CheckpointError
from marllm.utils.files import fsync_directory, sha256_file

FORMAT = "marllm-training-state"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"

_FINAL = re.compile(r"iteration-(\d+)")
TEMPORARY_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
# A checkpoint moved aside while a new one of the same iteration takes its name; complete, so still a candidate.
_REPLACED = re.compile(r"\.replaced-(iteration-(\d+))-\d+")


# ----------------------------------------------------------------------------------------------- writing
def prune(root: Path, iteration: int, keep: int) -> None:
    """Keep the new checkpoint and the ``keep - 1`` newest complete ones before it; remove the rest."""
    kept = 1
    for number, path in candidates(root):
        if number == iteration and path.name == f"iteration-{iteration:06d}":
            continue
        if number < iteration and kept < keep and _is_complete(path):
            kept += 1
            continue
        _remove(path)


def clean_stale(root: Path) -> None:
    """Remove what interrupted saves and removals left; put back a checkpoint moved aside and never replaced."""
    for entry in root.iterdir():
        if entry.name.startswith((TEMPORARY_PREFIX, _TRASH_PREFIX)):
            shutil.rmtree(entry, ignore_errors=True)
            continue
        replaced = _REPLACED.fullmatch(entry.name)
        if replaced is None:
            continue
        final = root / replaced.group(1)
        if final.exists() and _is_complete(final):
            shutil.rmtree(entry, ignore_errors=True)
        else:
            if final.exists():
                _remove(final)
            os.replace(entry, final)
            fsync_directory(root)


def _remove(path: Path) -> None:
    # Renamed first: a kill in the middle of rmtree must not leave a half-deleted directory under a checkpoint name.
    trash = path.parent / f"{_TRASH_PREFIX}{path.name}-{os.getpid()}"
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def is_checkpoint_entry(name: str) -> bool:
    """Whether ``name``, in the checkpoints' directory, is one a save writes: a checkpoint, a temporary directory of
    a save, a checkpoint moved aside or being removed."""
    return bool(
        _FINAL.fullmatch(name) or _REPLACED.fullmatch(name) or name.startswith((TEMPORARY_PREFIX, _TRASH_PREFIX))
    )


# ----------------------------------------------------------------------------------------------- reading
def candidates(root: Path) -> list[tuple[int, Path]]:
    """Checkpoint directories (final ones, and complete ones moved aside), newest first; finals first on a tie."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        final, replaced = _FINAL.fullmatch(entry.name), _REPLACED.fullmatch(entry.name)
        if final is not None and entry.is_dir():
            found.append((int(final.group(1)), 1, entry))
        elif replaced is not None and entry.is_dir():
            found.append((int(replaced.group(2)), 0, entry))
    return [(number, path) for number, _, path in sorted(found, key=lambda item: item[:2], reverse=True)]


def _is_complete(path: Path) -> bool:
    try:
        check_files(path, read_manifest(path), verify_hashes=False)
    except CheckpointError:
        return False
    return True


def read_manifest(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise CheckpointError(f"there is no checkpoint directory {path}")
    if not (path / MANIFEST_FILE).is_file():
        raise CheckpointError(
            f"checkpoint {path} has no {MANIFEST_FILE}: it is incomplete (the manifest is written last)"
        )
    manifest = read_json(path / MANIFEST_FILE, path)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path / MANIFEST_FILE} is not a marllm training-state manifest")
    version = manifest.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {version!r}; this marllm reads version {FORMAT_VERSION} "
            "(a newer marllm wrote it)"
        )
    missing = [key for key in ("iteration", "extra", "files") if key not in manifest]
    if missing:
        raise CheckpointError(f"{path / MANIFEST_FILE} lacks {missing}")
    return manifest


def check_files(path: Path, manifest: dict[str, Any], verify_hashes: bool) -> None:
    problems = []
    for name, expected in manifest["files"].items():
        file = path / name
        if not file.is_file():
            problems.append(f"{name} is missing")
            continue
        size = file.stat().st_size
        if size != expected["bytes"]:
            problems.append(f"{name} has {size} bytes, the manifest says {expected['bytes']}")
        elif verify_hashes and sha256_file(file) != expected["sha256"]:
            problems.append(f"{name} does not match its sha256 in the manifest (its content changed)")
    if problems:
        raise CheckpointError(f"checkpoint {path} is damaged: " + "; ".join(problems))


def read_json(file: Path, checkpoint: Path) -> Any:
    try:
        return json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"checkpoint {checkpoint}: {file.name} cannot be read: {error}") from error
