"""Objects named by reference in a config: ``package.module:name`` (an importable module) or ``path/to/file.py:name``
(a Python file, loaded on its own).

A reference is one string ``MODULE:NAME``. ``MODULE`` is a dotted module name, or a path ending in ``.py``; ``NAME``
is an attribute of the module, dotted for a nested one (``module:Class.method``). A relative file path is relative
to the current directory here; :func:`absolute_reference` makes it relative to another one (a config's folder). A
file is executed once per process and kept under a module name of its own, so that loading a config twice gives the
same objects.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from typing import Any

__all__ = ["absolute_reference", "is_file_reference", "load_reference", "package_version", "split_reference"]

FILE_SUFFIX = ".py"


def split_reference(reference: Any) -> tuple[str, str]:
    """``(module, name)`` of ``MODULE:NAME``; ``ValueError`` for anything else (the message shows the two forms)."""
    if not isinstance(reference, str) or reference.count(":") < 1:
        raise ValueError(
            f"{reference!r} is not a reference to a Python object: write package.module:name (an importable module) "
            "or file.py:name (a file, relative to the config's folder)"
        )
    module, _, name = reference.rpartition(":")
    if not module.strip() or not name.strip():
        raise ValueError(f"{reference!r} names no module or no object: write package.module:name or file.py:name")
    return module.strip(), name.strip()


def is_file_reference(reference: str) -> bool:
    """Whether ``reference`` names a Python file (``….py:name``) rather than an importable module."""
    try:
        module, _ = split_reference(reference)
    except ValueError:
        return False
    return module.endswith(FILE_SUFFIX)


def absolute_reference(reference: Any, base: Path) -> Any:
    """``reference`` with a relative file path made absolute against ``base``; anything else unchanged."""
    if not isinstance(reference, str) or not is_file_reference(reference):
        return reference
    module, name = split_reference(reference)
    path = Path(module).expanduser()
    if path.is_absolute():
        return reference
    return f"{(base / path).resolve()}:{name}"


def load_reference(reference: str) -> Any:
    """The object ``reference`` names.

    Raises:
        ValueError: the reference is malformed, its file does not exist, its module cannot be imported (the message
            holds the import's own error, e.g. a module the file itself imports), or the module has no such name
            (the message lists the public names it has).
    """
    module_name, name = split_reference(reference)
    module = _load_file(module_name) if module_name.endswith(FILE_SUFFIX) else _import(module_name)
    target: Any = module
    for depth, part in enumerate(name.split(".")):
        if not hasattr(target, part):
            owner = module_name if depth == 0 else f"{module_name}:{'.'.join(name.split('.')[:depth])}"
            public = sorted(n for n in dir(target) if not n.startswith("_"))
            shown = ", ".join(public[:20]) + (", …" if len(public) > 20 else "")
            raise ValueError(f"{owner} has no {part!r} (it defines: {shown or 'nothing public'})")
        target = getattr(target, part)
    return target


def _import(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and (module_name + ".").startswith(error.name + "."):
            raise ValueError(
                f"no module named {module_name!r} can be imported (no {error.name!r} on the Python path); "
                "install its package, or name a file as path/to/file.py:name"
            ) from error
        raise ValueError(f"importing module {module_name!r} failed: {type(error).__name__}: {error}") from error
    except Exception as error:
        raise ValueError(f"importing module {module_name!r} failed: {type(error).__name__}: {error}") from error


def _load_file(file_name: str) -> Any:
    path = Path(file_name).expanduser().resolve()
    if not path.is_file():
        raise ValueError(f"Python file {str(path)!r} does not exist")
    key = f"marllm_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"Python file {str(path)!r} cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[key]
        raise ValueError(f"loading Python file {str(path)!r} failed: {type(error).__name__}: {error}") from error
    return module


def package_version(name: str) -> str:
    """The installed version of the distribution ``name`` (``"unknown"`` where it is not installed as one)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
