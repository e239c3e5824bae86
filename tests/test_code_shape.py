"""The package's shape: no module of more than 400 lines, no function of more than 60 (its docstring not counted).

Each module of ``marllm/`` is its own case, so that a failure names the module and, for functions, each function
over the limit with its line and length. A function's length runs from its ``def`` line to its last line (a nested
function counts in its own and in its enclosing function's), less the lines of its docstring.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "marllm"
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """How many lines the function's docstring spans (0 without one)."""
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first.end_lineno - first.lineno + 1
    return 0


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """``(qualified name, def line, length)`` of every function and method of ``source``, nested ones included."""
    lengths = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                lengths.append((name, child.lineno, child.end_lineno - child.lineno + 1 - docstring_lines(child)))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return lengths


def module_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_modules_are_found():
    assert len(MODULES) > 100 and PACKAGE / "__init__.py" in MODULES


@pytest.mark.parametrize("path", MODULES, ids=module_id)
def test_module_has_at_most_400_lines(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, (
        f"{module_id(path)} has {lines} lines (at most {MAX_MODULE_LINES}): split it along one of its seams"
    )


@pytest.mark.parametrize("path", MODULES, ids=module_id)
def test_functions_have_at_most_60_lines(path):
    too_long = [
        f"{name} (line {line}): {length} lines"
        for name, line, length in function_lengths(path.read_text(encoding="utf-8"))
        if length > MAX_FUNCTION_LINES
    ]
    assert not too_long, (
        f"{module_id(path)}: functions over {MAX_FUNCTION_LINES} lines, docstrings aside: {'; '.join(too_long)}"
    )


def test_lengths_leave_out_the_docstring_and_count_nested_functions():
    source = (
        "def outer():\n"
        '    """One\n'
        '    two."""\n'
        "    def inner():\n"
        "        return 1\n"
        "    return inner\n"
        "class A:\n"
        "    async def method(self):\n"
        "        pass\n"
    )
    assert function_lengths(source) == [("outer", 1, 4), ("outer.inner", 4, 2), ("A.method", 8, 2)]
