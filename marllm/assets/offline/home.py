"""Where marllm keeps its offline data: ``$MARLLM_HOME``, by default ``~/.cache/marllm``."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["HOME_ENV", "default_home", "resolve_home"]

HOME_ENV = "MARLLM_HOME"


def default_home() -> Path:
    """The data directory named by ``$MARLLM_HOME``, else ``~/.cache/marllm`` (not created here)."""
    configured = os.environ.get(HOME_ENV, "").strip()
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "marllm"


def resolve_home(home: str | Path | None = None) -> Path:
    """``home`` as an absolute path, or :func:`default_home` when it is ``None``.

    An existing path that is not a directory is refused with ``NotADirectoryError``.
    """
    path = default_home() if home is None else Path(home).expanduser()
    path = path.resolve()
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"marllm home {path} exists but is not a directory; set {HOME_ENV} to a folder")
    return path
