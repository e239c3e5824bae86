"""Package attributes loaded on first use (PEP 562), so that importing a package does not import what it exports."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: MutableMapping[str, Any], public: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__``: ``exports`` maps each public name to the module defining it,
    which is imported when the name is first read; the value is then kept in the package's ``namespace``."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        namespace[name] = value  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(public))

    return __getattr__, __dir__
