"""The bundled grade-school math fixture loads through ``load_gsm8k`` and its worked solutions add up."""

import ast
import operator
import re
from pathlib import Path

from marllm.tasks.gsm8k import load_gsm8k

FIXTURE = Path(__file__).resolve().parents[1] / "examples" / "data" / "grade_school_math.jsonl"
ANNOTATION = re.compile(r"<<([^=<>]+)=([^<>]+)>>")
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def safe_eval(expression: str) -> float:
    """Evaluate numbers joined by + - * / and parentheses; anything else raises ValueError."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"unsupported syntax in {expression!r}: {ast.dump(node)}")

    return walk(ast.parse(expression, mode="eval").body)


def final_number(answer: str) -> str:
    """The text after the answer's last ``####`` marker."""
    return answer.rpartition("####")[2].strip()


def test_fixture_loads_sixty_unique_rows() -> None:
    dataset = load_gsm8k(str(FIXTURE))
    assert len(dataset) == 60
    assert len(set(dataset["question"])) == 60
    for answer, truth in zip(dataset["answer"], dataset["ground_truth"], strict=True):
        assert truth == final_number(answer)


def test_every_annotation_is_arithmetically_right() -> None:
    dataset = load_gsm8k(str(FIXTURE))
    for answer in dataset["answer"]:
        annotations = ANNOTATION.findall(answer)
        assert annotations, f"no <<expr=value>> annotations in {answer!r}"
        for expression, value in annotations:
            assert safe_eval(expression) == float(value), f"{expression} != {value} in {answer!r}"
        assert float(annotations[-1][1]) == float(final_number(answer))
