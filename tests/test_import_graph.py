"""The package's imports form no circle, seen or hidden: no module imports (through any chain) a module that imports
it, and no module names by string (a ``module:Name`` reference, a lazy export, an import by name) a module that
imports it back. The import-linter contract checks the layers; this checks what layers cannot see."""

from __future__ import annotations

import re
from pathlib import Path

import grimp
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "marllm"
_NAMED = re.compile(r"[\"'](marllm(?:\.\w+)+)(?::\w+)?[\"']")
OTHER_PROCESSES = {
    ("marllm.parallel.launcher", "marllm.cli"),  # each rank runs `python -m marllm.cli`
    ("marllm.studies.worker_server", "marllm.studies.local_executor"),  # the forkserver's preloaded modules
}
"""Modules named for another process to run or import: no import of the naming process's."""


@pytest.fixture(scope="module")
def graph():
    """The runtime import graph (imports made only for type checkers do not run, so they close no circle)."""
    return grimp.build_graph("marllm", exclude_type_checking_imports=True)


def module_of(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def test_no_module_imports_itself_through_a_chain(graph):
    circles = sorted(
        f"{module} -> {imported}"
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
        if graph.chain_exists(importer=imported, imported=module)
    )
    assert not circles, f"import circles: {circles}"


def hidden_circles(graph) -> list[str]:
    """Each module that names by string a module importing it, as ``"A names B, which imports it"``."""
    hidden = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_of(path)
        for named in sorted(set(_NAMED.findall(path.read_text()))):
            if (module, named) in OTHER_PROCESSES or named not in graph.modules or named == module:
                continue
            if graph.chain_exists(importer=named, imported=module):
                hidden.append(f"{module} names {named}, which imports it")
    return hidden


def test_no_module_names_by_string_a_module_that_imports_it(graph):
    assert not hidden_circles(graph)


def test_the_scan_finds_a_hidden_circle():
    """The algorithm catalog names PPO's learner by string: were PPO to import the catalog again, the scan says so."""
    graph = grimp.build_graph("marllm", exclude_type_checking_imports=True)
    graph.add_import(importer="marllm.algorithms.ppo", imported="marllm.algorithms.catalog")
    assert "marllm.algorithms.catalog names marllm.algorithms.ppo, which imports it" in hidden_circles(graph)
