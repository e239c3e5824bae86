"""Durable files: checksums, synced and atomic writes, a directory swap and inter-process locks.

Everything marllm keeps on disk (assets, training-state checkpoints, run records) is written with these, so that a
reader sees either the old file or the whole new one, and a crash never leaves a half-written file under its
final name.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "LockHeldError",
    "MANIFEST_NAME",
    "atomic_write_json",
    "atomic_write_text",
    "describe_file",
    "exclusive_lock",
    "file_lock",
    "fsync_directory",
    "read_json",
    "read_json_object",
    "replace_directory",
    "sha256_file",
    "tree_checksums",
    "verify_checksums",
    "verify_directory_manifest",
    "write_directory_manifest",
    "write_json",
]

_CHUNK = 1 << 22


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def describe_file(path: Path) -> dict[str, Any]:
    """``{"bytes": size, "sha256": hex}``: a manifest entry for ``path``."""
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def tree_checksums(directory: str | Path, relative_to: str | Path) -> dict[str, str]:
    """sha256 of every regular file under ``directory``, keyed by its POSIX path relative to ``relative_to``."""
    directory, relative_to = Path(directory), Path(relative_to)
    return {
        path.relative_to(relative_to).as_posix(): sha256_file(path)
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def verify_checksums(root: str | Path, checksums: dict[str, str]) -> list[str]:
    """Compare files under ``root`` with ``checksums``; return one line per missing or altered file."""
    root = Path(root)
    problems = []
    for relative, expected in checksums.items():
        path = root / relative
        if not path.is_file():
            problems.append(f"{path}: missing")
            continue
        actual = sha256_file(path)
        if actual != expected:
            problems.append(f"{path}: sha256 {actual[:12]}… does not match the recorded {expected[:12]}…")
    return problems


MANIFEST_NAME = "manifest.json"


def write_directory_manifest(directory: Path, kind: str) -> None:
    """Record the sha256 of every file under ``directory`` in its ``manifest.json`` (written last, synced)."""
    files = {name: digest for name, digest in tree_checksums(directory, directory).items() if name != MANIFEST_NAME}
    write_json(directory / MANIFEST_NAME, {"format": kind, "sha256": files}, indent=2)


def verify_directory_manifest(directory: Path) -> list[str]:
    """One line per file of ``directory``'s manifest that is missing or altered (none when all match); a directory
    without a manifest is reported as such."""
    manifest = directory / MANIFEST_NAME
    if not manifest.is_file():
        return [f"{manifest}: missing"]
    try:
        recorded = read_json(manifest)["sha256"]
    except (ValueError, KeyError, TypeError) as error:
        return [f"{manifest}: unreadable ({error})"]
    return verify_checksums(directory, recorded)


def write_json(path: Path, data: Any, indent: int | None = None) -> None:
    """Write ``data`` as JSON (floats in full precision) and sync it to disk (for files of a directory that is
    itself moved into place once complete)."""
    with path.open("w") as handle:
        json.dump(data, handle, indent=indent)
        handle.flush()
        os.fsync(handle.fileno())


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader (or a crash) sees the old file or the new one, never a part."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        with temporary.open("w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise


def atomic_write_json(path: str | Path, payload: Any) -> None:
    """Write ``payload`` as indented JSON (keys sorted) with :func:`atomic_write_text`, creating its directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def read_json(path: str | Path) -> Any:
    """Parse a JSON file; a truncated or garbled file raises ``ValueError`` naming the file."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}); the file is corrupted or truncated") from error


def read_json_object(path: str | Path) -> dict[str, Any]:
    """A JSON file's object; empty when the file is missing, unreadable, not JSON or not a JSON object (a record
    that is optional to its reader, such as a run's ``run.json``)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def fsync_directory(path: Path) -> None:
    """Sync a directory's entries (a rename into it) to disk, where the platform and file system can."""
    if os.name != "posix":  # a directory cannot be opened for fsync elsewhere
        return
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    except OSError as error:
        # Some file systems (several FUSE and network ones) cannot sync a directory; their renames are what they are.
        if error.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(descriptor)


def replace_directory(built: Path, target: Path) -> None:
    """Move the finished directory ``built`` to ``target``, replacing whatever ``target`` held.

    ``rename`` cannot replace a non-empty directory, so an existing ``target`` is first renamed aside to
    ``.replaced-<name>-<pid>`` (readers that look for it there, as the checkpoint finder does, still find a complete
    directory), then removed once the new one has its name. ``target`` never holds a mix of old and new files.
    """
    root = target.parent
    aside = root / f".replaced-{target.name}-{os.getpid()}" if target.exists() else None
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(target, aside)
    os.replace(built, target)
    fsync_directory(root)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def file_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if needed), waiting for any other holder.

    Where ``fcntl`` is not available (Windows) this is a no-op.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl  # POSIX only
    except ImportError:  # pragma: no cover - non-POSIX platforms
        yield
        return
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


class LockHeldError(RuntimeError):
    """Another process holds the lock that :func:`exclusive_lock` asked for.

    Attributes:
        path: the lock file.
        pid: the holder's process id as it wrote it in the lock file (None when it has not written it yet).
        host: the host name the holder wrote beside it (None when unknown).
    """

    def __init__(self, path: Path, pid: int | None, host: str | None = None):
        self.path, self.pid, self.host = path, pid, host
        super().__init__(
            f"{path} is locked by {self.holder}; the lock is free again as soon as that process ends "
            "(it does not outlive a killed process)"
        )

    @property
    def holder(self) -> str:
        """``"process 1234"``, or ``"process 1234 on host node7"`` when the holder is on another host."""
        if self.pid is None:
            return "another process (its PID is not written yet)"
        elsewhere = f" on host {self.host}" if self.host and self.host != socket.gethostname() else ""
        return f"process {self.pid}{elsewhere}"


# The exclusive locks this process holds: (device, inode) of the lock file -> the thread that holds it.
_held: dict[tuple[int, int], int] = {}
_held_guard = threading.Lock()


@contextlib.contextmanager
def exclusive_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive advisory lock (``flock``) on ``path`` for the block, or fail at once if another holds it.

    The lock file is created for the block and holds the holder's PID and host name (one per line); it is removed
    when the block ends. The lock belongs to the open file, so it ends with the process that holds it, however that
    process ends: a killed holder leaves its file behind (with its PID) but no lock, and the next caller takes it.
    Failing, this changes nothing on disk (the file exists while another holds it). The same thread may nest blocks
    on the same file (they share the one lock).

    Where ``fcntl`` is not available (Windows), or the file system cannot lock (``ENOLCK``, ``EOPNOTSUPP``), the
    block runs unlocked (the latter with a warning).

    Raises:
        LockHeldError: another process (or another thread of this one) holds the lock; it names the holder's PID.
    """
    path = Path(path)
    try:
        import fcntl  # POSIX only
    except ImportError:  # pragma: no cover - non-POSIX platforms
        yield
        return
    if _held_here(path):
        yield  # a block of this thread's holds it, and lets go of it
        return
    try:
        descriptor = _acquire(path, fcntl)
    except OSError as error:
        if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL):
            raise

        warnings.warn(f"cannot lock {path} ({error}); going on unlocked", RuntimeWarning, stacklevel=3)
        yield
        return
    key = _file_key(descriptor)
    try:
        os.pwrite(descriptor, f"{os.getpid()}\n{socket.gethostname()}\n".encode(), 0)
        with _held_guard:
            _held[key] = threading.get_ident()
        try:
            yield
        finally:
            with _held_guard:
                del _held[key]
            # Removed while still locked: a process that opened it meanwhile finds, once it has the lock, that the
            # path no longer names its file, and opens the path again.
            with contextlib.suppress(OSError):
                if _path_key(path) == key:
                    path.unlink()
    finally:
        os.close(descriptor)  # releases the lock


def _acquire(path: Path, fcntl: Any) -> int:
    """Open ``path`` and lock it without waiting; return the descriptor of the file the path names once locked."""
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, host = _read_holder(descriptor)
            os.close(descriptor)
            raise LockHeldError(path, pid, host) from None
        except BaseException:
            os.close(descriptor)
            raise
        if _path_key(path) == _file_key(descriptor):
            os.ftruncate(descriptor, 0)  # a killed holder's PID
            return descriptor
        os.close(descriptor)  # its holder removed the file as it let go: lock the path's new file


def _held_here(path: Path) -> bool:
    """Whether this thread holds the lock of ``path``; raise LockHeldError if another thread of this process does."""
    key = _path_key(path)
    with _held_guard:
        thread = _held.get(key) if key is not None else None
    if thread is not None and thread != threading.get_ident():
        raise LockHeldError(path, os.getpid(), socket.gethostname())
    return thread is not None


def _path_key(path: Path) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None
    return status.st_dev, status.st_ino


def _file_key(descriptor: int) -> tuple[int, int]:
    status = os.fstat(descriptor)
    return status.st_dev, status.st_ino


def _read_holder(descriptor: int) -> tuple[int | None, str | None]:
    """The PID and host a lock's holder wrote in its file; (None, None) if it has not written them yet."""
    for _ in range(20):  # the holder writes its PID just after it takes the lock
        lines = os.pread(descriptor, 4096, 0).decode(errors="replace").splitlines()
        if lines and lines[0].strip().isdigit():
            return int(lines[0]), (lines[1].strip() or None) if len(lines) > 1 else None
        time.sleep(0.01)
    return None, None
