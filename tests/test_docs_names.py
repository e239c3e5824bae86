"""The docs name only what exists: every marllm name, marllm path and config key a page writes in backticks resolves,
and no page says "not run yet" of a config whose results are in docs/results.

Checked in the README and every page under docs/ (fenced code blocks aside): dotted names
(``marllm.wrappers.RoleBaselines``, ``marllm.train(config)``), paths in the package (``marllm/run/run_dir.py``), a
marllm class and its attributes (``ComputeConfig.micro_batch_size``, or ``RunState`` alone) and config keys
(``ppo.compute.micro_batch_size``, ``game.actions: score``), the keys against the dataclass fields of
:class:`marllm.config.TrainConfig`'s sections.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re
import typing
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import marllm
from marllm.config import TrainConfig
from marllm.tasks import TASKS, TaskConfig

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RESULTS = ROOT / "docs" / "results"

FENCED = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"marllm(?:\.\w+)*(?=$|\()")
PACKAGE_PATH = re.compile(r"marllm/[\w/.]*")
CLASS_ATTRIBUTE = re.compile(r"([A-Z]\w*)((?:\.\w+)*)(?=$|\()")
CAMEL_CASE = re.compile(r"(?=\w*[a-z])[A-Z]\w*[A-Z]\w*")
FILE_NAME = re.compile(r"\w+\.(?:py|md|ya?ml|jsonl?|txt|png|csv|pt|safetensors)")
SECTIONS = {field.name: field for field in dataclasses.fields(TrainConfig)}
CONFIG_KEY = re.compile(rf"({'|'.join(SECTIONS)})((?:\.\w+)+)(?=$|\s|:|=)")

PYTHON_FILE = re.compile(r"[\w/]+\.py")
SOURCE_TREES = ("marllm", "tests", "scripts", "benchmarks", "examples")
USERS_FILES = {"tasks.py", "my_opponent.py", "my_mode.py", "my_learner.py"}
"""Python files a guide tells the user to write (not in the repository)."""
THIRD_PARTY = {"DistributedDataParallel", "MixedPrecisionPolicy", "TabularPolicy", "AECEnv", "BaseWrapper"}
"""Class names the docs cite from torch, PettingZoo and OpenSpiel."""


def spans(page: Path) -> list[str]:
    """The inline code spans of ``page``, outside fenced code blocks."""
    return [span.strip() for span in CODE_SPAN.findall(FENCED.sub("", page.read_text(encoding="utf-8")))]


@cache
def marllm_classes() -> dict[str, list[type]]:
    """Every class defined in a marllm module, by name (modules that need a missing optional package aside)."""
    classes: dict[str, list[type]] = {}
    for module_info in pkgutil.walk_packages(marllm.__path__, "marllm."):
        if module_info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(module_info.name)
        except ImportError:
            continue
        for name, value in vars(module).items():
            if inspect.isclass(value) and value.__module__.startswith("marllm") and value not in classes.get(name, []):
                classes.setdefault(name, []).append(value)
    return classes


def has_attribute(owner: Any, name: str) -> bool:
    """Whether ``owner`` (a module, class or object) has ``name``: an attribute, a dataclass field, or (a class) an
    attribute its methods set on ``self``."""
    if hasattr(owner, name):
        return True
    if dataclasses.is_dataclass(owner) and name in {field.name for field in dataclasses.fields(owner)}:
        return True
    if inspect.isclass(owner):
        for klass in owner.__mro__:
            try:
                source = inspect.getsource(klass)
            except (OSError, TypeError):
                continue
            if re.search(rf"self\.{name}\b\s*(?::[^=\n]*)?=", source):
                return True
    return False


def resolve_dotted(dotted: str) -> bool:
    """Whether ``marllm.a.b.c`` names a module, or an object in one (an attribute of an attribute, ...)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError as missing:
            if missing.name is not None and not missing.name.startswith("marllm"):
                return True  # an optional package (ray, ...) is missing: cannot be checked here
            continue
        for attribute in parts[end:]:
            if not has_attribute(owner, attribute):
                return False
            owner = getattr(owner, attribute, None)
        return True
    return False


def section_types(hint: Any) -> list[type]:
    """The dataclasses a config field's type annotation names (``GameConfig | None`` -> ``[GameConfig]``)."""
    if hint is TaskConfig:
        return [TaskConfig, *TASKS.values()]
    if dataclasses.is_dataclass(hint):
        return [hint]
    return [arg for arg in typing.get_args(hint) if dataclasses.is_dataclass(arg)]


def resolve_key(section: str, keys: list[str]) -> bool:
    """Whether ``section.key.subkey…`` is a config key: a field of the section's dataclass (any task's, for
    ``task``), into nested sections; a mapping's keys (``agents.models.llm1``) and properties pass."""
    owners = section_types(typing.get_type_hints(TrainConfig)[section])
    for key in keys:
        if not owners:
            return True  # a mapping or a value: its keys are the user's
        found = [owner for owner in owners if has_attribute(owner, key)]
        if not found:
            return False
        owners = [t for owner in found for t in _field_types(owner, key)]
    return True


def _field_types(owner: type, key: str) -> list[type]:
    hints = typing.get_type_hints(owner) if dataclasses.is_dataclass(owner) else {}
    return section_types(hints[key]) if key in hints else []


@cache
def source_files() -> tuple[frozenset[str], tuple[str, ...]]:
    """The repository's Python files: their names, and their paths from the root."""
    paths = tuple(str(path.relative_to(ROOT)) for tree in SOURCE_TREES for path in (ROOT / tree).rglob("*.py"))
    return frozenset(Path(path).name for path in paths), paths


def missing_python_file(span: str) -> bool:
    """Whether a Python file a page names (``ppo_steps.py``, ``actions/tokens.py``) is in none of the source trees."""
    names, paths = source_files()
    if "/" not in span:
        return span not in names and span not in USERS_FILES
    return not any(path == span or path.endswith("/" + span) for path in paths)


def missing_names(span: str) -> list[str]:
    """The names in one code span that do not exist (empty when all do or it names nothing of marllm's)."""
    if PYTHON_FILE.fullmatch(span) and not span.startswith("marllm/"):
        return [span] if missing_python_file(span) else []
    if FILE_NAME.fullmatch(span) and not span.startswith("marllm"):
        return []
    if match := DOTTED.match(span):
        return [] if resolve_dotted(match.group(0)) else [match.group(0)]
    if match := PACKAGE_PATH.fullmatch(span):
        return [] if (ROOT / span).exists() else [span]
    if match := CONFIG_KEY.match(span):
        return [] if resolve_key(match.group(1), match.group(2).split(".")[1:]) else [match.group(0)]
    if (match := CLASS_ATTRIBUTE.match(span)) and CAMEL_CASE.fullmatch(match.group(1)):
        name, attributes = match.group(1), match.group(2).split(".")[1:]
        if name in THIRD_PARTY:
            return []
        candidates = marllm_classes().get(name, [])
        if not candidates:
            return [name]
        if attributes and not any(_resolve_attributes(klass, attributes) for klass in candidates):
            return [match.group(0)]
    return []


def _resolve_attributes(owner: Any, attributes: list[str]) -> bool:
    for attribute in attributes:
        if not has_attribute(owner, attribute):
            return False
        owner = getattr(owner, attribute, None)
    return True


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_name_a_page_cites_exists(page):
    missing = sorted({name for span in spans(page) for name in missing_names(span)})
    assert not missing, f"{page.relative_to(ROOT)} names what does not exist: {missing}"


CONFIG_PATH = re.compile(r"examples/[\w/.-]+\.ya?ml")


def test_no_page_says_not_run_yet_of_a_config_with_results():
    results = "\n".join(page.read_text(encoding="utf-8") for page in sorted(RESULTS.glob("*.md")))
    stale = []
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            if "not run yet" not in line.lower():
                continue
            measured = [path for path in CONFIG_PATH.findall(line) if path in results or Path(path).name in results]
            if measured:
                stale.append(f"{page.relative_to(ROOT)}:{number}: {measured}")
    assert not stale, f"'not run yet' beside configs whose results are in docs/results: {stale}"


@pytest.mark.parametrize(
    ("span", "missing"),
    [
        ("marllm.wrappers.RoleBaselines", []),
        ("marllm.wrappers.RoleBaseline", ["marllm.wrappers.RoleBaseline"]),
        ("marllm.train(config)", []),
        ("marllm/run/run_dir.py", []),
        ("marllm/run/rundir.py", ["marllm/run/rundir.py"]),
        ("ComputeConfig.micro_batch_size", []),
        ("PPOConfig.micro_batches", ["PPOConfig.micro_batches"]),
        ("RunDir", ["RunDir"]),
        ("ppo.compute.micro_batch_size", []),
        ("game.actions: score", []),
        ("agents.models.llm2", []),
        ("task.reward_model", []),
        ("ppo.micro_batch", ["ppo.micro_batch"]),
        ("settings.py", []),
        ("game.py", ["game.py"]),
        ("ppo_steps.py", []),
        ("ppo_stepz.py", ["ppo_stepz.py"]),
        ("actions/tokens.py", []),
        ("actions/token.py", ["actions/token.py"]),
    ],
)
def test_the_check_finds_what_does_not_exist(span, missing):
    assert missing_names(span) == missing
