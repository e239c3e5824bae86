"""One registry mechanism for the kinds of extension a config names: algorithms, action modes, opponents, tasks.

A kind is a :class:`Registry` over a base class whose class attributes are the kind's facts (what the config, the
run and its checks read of an entry: ``compares_groups`` of an algorithm, ``needs`` of an opponent, ``Settings`` of
anything that has settings). A built-in entry is a small torch-free subclass of the base, registered by name with
the registry's decorator; its ``implementation`` names the class or function that builds it (``module:Name``),
imported only when something is built, so that reading a config never imports torch::

    LEARNERS = Registry("algorithm", Algorithm, "my_learner.py:MyLearner")

    @LEARNERS.register("sign_ppo")
    class SignPPO(Algorithm):
        implementation = "my_package.sign_ppo:SignPPOLearner"

A config can name an entry by reference instead of by name, ``package.module:Name`` or ``file.py:Name`` (a file
relative to the config's folder): the object it names is loaded and its own attributes are the facts, the base's
defaults filling in what it does not say. Adding an extension is then one file.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from marllm.utils.imports import is_file_reference, load_reference, split_reference

E = TypeVar("E", bound=type)

REFERENCE_FORMS = "package.module:Name, or file.py:Name relative to the config's folder"


class Extension:
    """The base of every kind's facts: what any entry says of itself.

    Attributes:
        name: the name it is registered under (a reference's own string for an entry named by reference).
        implementation: ``module:Name`` of the class or function that builds it ("" where the entry is its own).
        summary: what it is, in a line.
        Settings: the dataclass of its own settings, written under its name in a config (None: it has none).
    """

    name: ClassVar[str] = ""
    implementation: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Settings: ClassVar[type | None] = None


class Registry(Generic[E]):
    """The entries of one kind of extension by name (see the module docstring).

    Args:
        kind: the kind, in words, for messages (``algorithm``, ``action mode``).
        base: the kind's facts class; every entry is a subclass, and a referenced class's facts default to its.
        example: a reference a user would write (``my_learner.py:MyLearner``), for messages.
    """

    def __init__(self, kind: str, base: E, example: str) -> None:
        self.kind, self.base, self.example = kind, base, example
        self._entries: dict[str, E] = {}
        self._loaded: dict[str, E] = {}

    def register(self, name: str) -> Callable[[E], E]:
        """A class decorator registering a built-in entry under ``name``."""

        def add(entry: E) -> E:
            if name in self._entries:
                raise ValueError(f"the {self.kind} {name!r} is registered twice")
            if not issubclass(entry, self.base):
                raise TypeError(f"a registered {self.kind} must subclass {self.base.__name__}, got {entry!r}")
            entry.name = name
            self._entries[name] = entry
            return entry

        return add

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def names(self) -> list[str]:
        """The built-in names, in the order they were registered."""
        return list(self._entries)

    def builtins(self) -> dict[str, E]:
        """Each built-in name -> its entry."""
        return dict(self._entries)

    def is_reference(self, spec: object) -> bool:
        """Whether ``spec`` names an entry by reference (``module:Name``) rather than by a built-in name."""
        return isinstance(spec, str) and ":" in spec and spec not in self._entries

    def valid(self) -> str:
        """What a config may write for this kind, for messages."""
        return f"one of {self.names()}, or one by reference ({self.example}; {REFERENCE_FORMS})"

    def check(self, spec: object, where: str) -> None:
        """Refuse ``spec`` where it is neither a built-in name nor a reference that could load (a well-formed
        ``module:Name`` whose file exists or whose top package is installed), without importing it.

        Raises:
            ValueError: naming ``where``, what was written and what is valid.
        """
        if isinstance(spec, str) and spec in self._entries:
            return
        if not self.is_reference(spec):
            raise ValueError(f"{where}: unknown {self.kind} {spec!r}; {self.valid()}")
        why = reference_problem(str(spec))
        if why is not None:
            raise ValueError(f"{where}: {spec!r} {why}")

    def entry(self, spec: str, where: str) -> E:
        """The facts of ``spec``: a built-in's registered class, or for a reference, the class it names where that
        subclasses the kind's base, else a subclass of the base holding the named object's own facts (a builder
        function, a class of another family), its ``implementation`` the reference.

        Raises:
            ValueError: as :meth:`check`, or a reference that does not load (its module's own error quoted).
        """
        self.check(spec, where)
        if spec in self._entries:
            return self._entries[spec]
        if spec not in self._loaded:
            try:
                target = load_reference(spec)
            except ValueError as error:
                raise ValueError(f"{where}: {spec!r}: {error}") from None
            self._loaded[spec] = self._facts_of(spec, target)
        return self._loaded[spec]

    def implementation(self, spec: str, where: str) -> Any:
        """The class or function that builds ``spec`` (a built-in's ``implementation``, imported; a reference's own
        object)."""
        entry = self.entry(spec, where)
        return load_reference(entry.implementation)

    def _facts_of(self, spec: str, target: Any) -> E:
        if isinstance(target, type) and issubclass(target, self.base):
            facts = target
        else:
            own = {key: getattr(target, key) for key in _fact_names(self.base) if hasattr(target, key)}
            doc = (getattr(target, "__doc__", None) or "").strip().partition("\n")[0]
            facts = type(split_reference(spec)[1], (self.base,), {"summary": doc, **own})
        return type(facts.__name__, (facts,), {"name": spec, "implementation": spec})  # type: ignore[return-value]


def _fact_names(base: type) -> list[str]:
    """The public class attributes ``base`` and its bases declare (the facts an entry may state)."""
    names: list[str] = []
    for cls in base.__mro__:
        names += [key for key in vars(cls).get("__annotations__", {}) if not key.startswith("_")]
    return [name for name in dict.fromkeys(names) if name not in ("name", "implementation")]


def reference_problem(spec: str) -> str | None:
    """Why the reference ``spec`` cannot load, found without loading it (malformed, a missing file, no such
    top-level package), or None."""
    try:
        module, _ = split_reference(spec)
    except ValueError as error:
        return str(error)
    if is_file_reference(spec):
        return None if Path(module).expanduser().is_file() else f"names the file {module}, which does not exist"
    top = module.partition(".")[0]
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"names the module {top!r}, which cannot be found"
