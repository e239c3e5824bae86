"""Tasks and rewards a config names by reference: ``task.name: module:Class`` / ``file.py:Class`` (a task class of
one's own) and ``task.reward: module:function`` / ``file.py:function`` (the text task's reward, or one per role).

A file path is relative to the config file's folder (an override's, to the working directory): it is made absolute
when the config is read, as every path of a config is (:mod:`marllm.config.paths`), so that the run's saved
``config.yaml`` (read back by ``marllm eval`` and ``--resume`` from the run directory) names the same file.

A task class of one's own is guarded as a reward of one's own is (:class:`marllm.envs.RewardFunctionError`): an
error raised by one of its methods becomes a :class:`TaskCodeError`, one line naming the user's file and line
(``task.name tasks.py:12: build() raised KeyError('rows')``), with the original error as its cause.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sysconfig
import traceback
from pathlib import Path
from typing import Any

from marllm.tasks import TASK_REGISTRY, TaskParts
from marllm.utils.errors import ConfigError

TASK_METHODS = ("build", "default_templates", "check_references", "check_roles", "reward", "load_split")
"""The methods of a task class that marllm calls, guarded in a user's class (:func:`guarded_task_class`)."""
_MARLLM = Path(__file__).resolve().parents[1]
_LIBRARIES = {Path(sysconfig.get_paths()[key]).resolve() for key in ("stdlib", "purelib", "platlib")}
_GUARDED: dict[type, type] = {}


class TaskCodeError(ValueError):
    """A method of a task class of one's own raised, or its ``build()`` returned something that is not a
    :class:`~marllm.tasks.TaskParts`; the message names the file and line, the original error is the cause."""



def task_class(name: Any) -> type:
    """The task configuration class ``task.name`` names: one of :data:`~marllm.tasks.TASK_REGISTRY`, or a class imported
    from ``module:Class`` / ``file.py:Class`` that is a dataclass with a ``name`` field and the methods of
    :class:`~marllm.tasks.Task`.

    Raises:
        ConfigError: an unknown name, a reference that cannot be imported, or a class that is not a task.
    """
    try:
        cls = TASK_REGISTRY.implementation(name, "task.name")
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if name in TASK_REGISTRY:
        return cls
    if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
        raise ConfigError(f"task.name: {name!r} is {cls!r}, not a dataclass (a task class is a @dataclass)")
    if "name" not in {f.name for f in dataclasses.fields(cls) if f.init}:
        raise ConfigError(
            f"task.name: task class {cls.__name__} has no 'name' field; give it one (name: str), which holds the "
            "reference it was named by"
        )
    missing = [method for method in ("build", "default_templates", "check_references") if not callable(
        getattr(cls, method, None)
    )]
    if missing:
        raise ConfigError(
            f"task.name: task class {cls.__name__} lacks the method(s) {missing} of a task (see marllm.tasks.Task)"
        )
    return guarded_task_class(cls)


def guarded_task_class(cls: type) -> type:
    """A subclass of the user's task class ``cls`` (same name, fields and behaviour; one per class) whose
    :data:`TASK_METHODS` raise :class:`TaskCodeError` where the user's raise (a :class:`ConfigError` passes as it
    is), and whose ``build()`` must return a :class:`~marllm.tasks.TaskParts`."""
    if cls in _GUARDED:
        return _GUARDED[cls]
    namespace: dict[str, Any] = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}
    for method in TASK_METHODS:
        if callable(getattr(cls, method, None)):
            namespace[method] = _guarded_method(cls, method)
    guarded = type(cls.__name__, (cls,), namespace)
    _GUARDED[cls] = guarded
    return guarded


def _guarded_method(cls: type, method: str) -> Any:
    original = getattr(cls, method)

    @functools.wraps(original)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = getattr(super(_GUARDED[cls], self), method)(*args, **kwargs)
        except ConfigError:
            raise
        except Exception as error:
            where = _user_frame(error, cls) or _defined_at(original)
            raise TaskCodeError(f"task.name {where}: {method}() raised {_describe(error)}") from error
        if method == "build" and not isinstance(result, TaskParts):
            raise TaskCodeError(
                f"task.name {_defined_at(original)}: build() returned {_kind(result)}, not a marllm.tasks.TaskParts "
                "(dataset, templates, reward_fn)"
            )
        return result

    return call



def _user_frame(error: BaseException, cls: type) -> str | None:
    """``file.py:LINE`` of the user's frame where ``error`` was raised: the deepest frame in the task class's file,
    else the deepest outside marllm and the installed libraries (None when there is neither)."""
    frames = traceback.extract_tb(error.__traceback__)[1:]  # [0]: the guard's own frame
    try:
        source = Path(inspect.getfile(cls)).resolve()
    except (TypeError, OSError):
        source = None
    for frame in reversed(frames):
        if source is not None and Path(frame.filename).resolve() == source:
            return f"{Path(frame.filename).name}:{frame.lineno}"
    for frame in reversed(frames):
        path = Path(frame.filename).resolve()
        if not any(path.is_relative_to(root) for root in (_MARLLM, *_LIBRARIES)):
            return f"{path.name}:{frame.lineno}"
    return None


def _defined_at(function: Any) -> str:
    """``file.py:LINE`` where ``function`` is defined (its name where that cannot be told)."""
    code = getattr(inspect.unwrap(function), "__code__", None)
    if code is None:
        return getattr(function, "__qualname__", repr(function))
    return f"{Path(code.co_filename).name}:{code.co_firstlineno}"


def _describe(error: BaseException) -> str:
    """``KeyError('rows')``; for an error about a file, its type and message (whose repr would drop the file)."""
    if isinstance(error, OSError) and error.filename is not None:
        return f"{type(error).__name__}: {error}"
    return repr(error)


def _kind(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__name__}"
