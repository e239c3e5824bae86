"""The synthetic arithmetic task: determinism, correct arithmetic, documents that agree with the reward."""

import re

import pytest

from marllm.assets.offline.arithmetic_problems import (
    OPERATIONS,
    format_document,
    generate_problems,
    pretraining_documents,
    write_jsonl,
)
from marllm.rewards.math import ExactMatchReward, parse_gsm8k_answer
from marllm.tasks.arithmetic import arithmetic_dataset
from marllm.tasks.gsm8k import load_gsm8k

N = 300  # enough to hit every template many times


@pytest.fixture(scope="module")
def problems():
    return generate_problems(N, seed=0)


def test_deterministic_for_a_seed(problems):
    assert generate_problems(N, seed=0) == problems
    assert pretraining_documents(20, seed=5) == pretraining_documents(20, seed=5)
    assert generate_problems(10, seed=0) == problems[:10]  # a prefix, not a different draw


def test_held_out_seeds_differ(problems):
    other = generate_problems(N, seed=1)
    assert other != problems
    overlap = {p["question"] for p in problems} & {p["question"] for p in other}
    assert len(overlap) < N * 0.02


def test_answers_equal_the_arithmetic_of_the_question(problems):
    step_counts = set()
    for problem in problems:
        steps = problem["steps"]
        assert 1 <= len(steps) <= 3
        step_counts.add(len(steps))
        given = {int(x) for x in re.findall(r"\d+", problem["question"])}
        if "half" in problem["question"]:
            given.add(2)
        known = set(given)
        for step in steps:
            # each operand comes from the question or from an earlier step
            assert step["a"] in known and step["b"] in known, (problem["question"], step)
            if step["op"] == "/":
                assert step["a"] % step["b"] == 0
            result = OPERATIONS[step["op"]](step["a"], step["b"])
            assert result == step["result"] >= 0
            # the worked solution shows the step
            assert f"{step['a']} {step['op']} {step['b']} = " in problem["answer"]
            known.add(result)
        assert parse_gsm8k_answer(problem["answer"]) == str(steps[-1]["result"])
    assert step_counts == {1, 2, 3}


def test_operations_recompute_by_hand():
    assert [OPERATIONS[op](12, 4) for op in "+-*/"] == [16, 8, 48, 3]


def test_templates_vary(problems):
    openings = {" ".join(p["question"].split()[1:3]) for p in problems}
    assert len(openings) >= 6


def test_pretraining_documents_agree_with_reward(problems):
    documents = pretraining_documents(N, seed=0)
    reward = ExactMatchReward()
    pattern = re.compile(r"Question: (?P<q>[^\n]+)\nAnswer: (?P<a>[^\n]+) The answer is (?P<n>\d+)\.")
    for document, problem in zip(documents, problems, strict=True):
        match = pattern.fullmatch(document)
        assert match, document
        assert match["q"] == problem["question"]
        assert match["n"] == parse_gsm8k_answer(problem["answer"])
        # the document's answer, taken as a model response, earns the reward
        response = document.split("\nAnswer:", 1)[1]
        assert reward([problem], [response]) == [1.0]


def test_format_document_by_hand():
    problem = {"question": "What is 2 + 3?", "answer": "2 + 3 = 5.\nSo 5.\n#### 5"}
    assert format_document(problem) == "Question: What is 2 + 3?\nAnswer: 2 + 3 = 5. So 5. The answer is 5."
    with pytest.raises(KeyError, match="'answer'"):
        format_document({"question": "q"})


def test_arithmetic_dataset_columns():
    dataset = arithmetic_dataset(12, seed=3)
    assert dataset.column_names == ["question", "answer", "query", "ground_truth"]
    assert len(dataset) == 12
    row = dataset[4]
    problem = generate_problems(12, seed=3)[4]
    assert row["query"] == row["question"] == problem["question"]
    assert row["ground_truth"] == str(problem["steps"][-1]["result"])


def test_write_jsonl_round_trip(tmp_path):
    problems = generate_problems(6, seed=7)
    path = write_jsonl(problems, tmp_path / "sub" / "train.jsonl")
    loaded = load_gsm8k(str(path))
    assert loaded["question"] == [p["question"] for p in problems]
    assert loaded["ground_truth"] == [str(p["steps"][-1]["result"]) for p in problems]
    assert set(loaded.column_names) == set(arithmetic_dataset(6, seed=7).column_names) | {"steps"}
    assert loaded[0]["steps"] == problems[0]["steps"]


@pytest.mark.parametrize("n", [-1, 2.5, True])
def test_bad_counts(n):
    with pytest.raises(ValueError, match="n must be a non-negative int"):
        generate_problems(n, seed=0)


def test_bad_seed_and_empty_dataset():
    with pytest.raises(ValueError, match="seed must be an int"):
        generate_problems(3, seed="zero")
    with pytest.raises(ValueError, match="n >= 1"):
        arithmetic_dataset(0, seed=0)
    assert generate_problems(0, seed=0) == []
