"""GSM8K loading from local files (and the hub call, mocked), validation errors, and the prompt templates."""

import json
import string
from pathlib import Path

import datasets
import pytest

from marllm.assets.offline.arithmetic_problems import generate_problems
from marllm.rewards.math import ExactMatchReward
from marllm.tasks.gsm8k import (
    GSM8K_FEW_SHOT,
    OBSERVER_TEMPLATE,
    PIONEER_TEMPLATE,
    load_gsm8k,
    prepare_math_dataset,
)

COLUMNS = ["question", "answer", "query", "ground_truth"]


def write_gsm8k_fixture(path: Path, n: int = 4, seed: int = 0) -> list[dict]:
    """Write ``n`` GSM8K-shaped rows (question, answer only) as JSON Lines; return them."""
    rows = [{"question": p["question"], "answer": p["answer"]} for p in generate_problems(n, seed)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return rows


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_load_jsonl_file(tmp_path):
    rows = write_gsm8k_fixture(tmp_path / "train.jsonl", n=4)
    dataset = load_gsm8k(str(tmp_path / "train.jsonl"))
    assert isinstance(dataset, datasets.Dataset)
    assert dataset.column_names == COLUMNS
    assert dataset["question"] == [row["question"] for row in rows]
    assert dataset["query"] == dataset["question"]
    assert dataset["ground_truth"] == [row["answer"].rsplit("#### ", 1)[1] for row in rows]


def test_load_json_array_file(tmp_path):
    path = tmp_path / "small.json"
    path.write_text(json.dumps([{"question": "How many?", "answer": "Count them.\n#### 1,200"}]))
    dataset = load_gsm8k(str(path))
    assert dataset[0] == {
        "question": "How many?",
        "answer": "Count them.\n#### 1,200",
        "query": "How many?",
        "ground_truth": "1200",
    }


def test_load_folder_picks_split(tmp_path):
    train = write_gsm8k_fixture(tmp_path / "train.jsonl", n=3, seed=0)
    test = write_gsm8k_fixture(tmp_path / "test.jsonl", n=2, seed=1)
    assert load_gsm8k(str(tmp_path), split="train")["question"] == [r["question"] for r in train]
    assert load_gsm8k(str(tmp_path), split="test")["question"] == [r["question"] for r in test]


def test_folder_without_split(tmp_path):
    write_gsm8k_fixture(tmp_path / "train.jsonl")
    with pytest.raises(FileNotFoundError, match=r"no test\.jsonl.*\['train\.jsonl'\]"):
        load_gsm8k(str(tmp_path), split="test")


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_gsm8k(str(tmp_path / "nope.jsonl"))


def test_local_file_of_other_format(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("question,answer\n")
    with pytest.raises(ValueError, match=r"not \.json/\.jsonl"):
        load_gsm8k(str(path))


def test_missing_column_names_it_and_columns_present(tmp_path):
    path = write_rows(tmp_path / "bad.jsonl", [{"question": "q", "solution": "#### 1"}])
    with pytest.raises(ValueError, match=r"missing column\(s\) \['answer'\].*\['question', 'solution'\]"):
        load_gsm8k(str(path))


def test_unparseable_answer_names_row(tmp_path):
    rows = [{"question": "a", "answer": "#### 1"}, {"question": "b", "answer": "#### 2"},
            {"question": "c", "answer": "the answer is 3"}]
    path = write_rows(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=r"bad\.jsonl: row 2: .*no '####'"):
        load_gsm8k(str(path))


def test_empty_question_names_row():
    dataset = datasets.Dataset.from_dict({"question": ["ok", "  "], "answer": ["#### 1", "#### 2"]})
    with pytest.raises(ValueError, match="row 1 has no question text"):
        prepare_math_dataset(dataset)


def test_empty_dataset():
    dataset = datasets.Dataset.from_dict({"question": [], "answer": []})
    with pytest.raises(ValueError, match="empty"):
        prepare_math_dataset(dataset, source="mine")


def test_prepared_columns_are_recomputed():
    dataset = datasets.Dataset.from_dict(
        {"question": ["q"], "answer": ["#### 5"], "query": ["stale"], "ground_truth": ["0"]}
    )
    row = prepare_math_dataset(dataset)[0]
    assert (row["query"], row["ground_truth"]) == ("q", "5")


def test_hub_source_goes_through_load_dataset(monkeypatch):
    calls = []

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return datasets.Dataset.from_dict({"question": ["What is 6 * 7?"], "answer": ["6 * 7 = 42\n#### 42"]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)  # gsm8k imports it where it loads
    dataset = load_gsm8k("openai/gsm8k", split="test", config="socratic")
    assert calls == [(("openai/gsm8k", "socratic"), {"split": "test"})]
    assert dataset["ground_truth"] == ["42"]


def fields(template: str) -> set[str]:
    return {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}


def test_templates_shape():
    assert fields(GSM8K_FEW_SHOT) == set()
    assert fields(PIONEER_TEMPLATE) == {"query"}
    assert fields(OBSERVER_TEMPLATE) == {"query", "pioneer"}
    pioneer = PIONEER_TEMPLATE.format(query="What is 1 + 1?")
    assert pioneer == GSM8K_FEW_SHOT + "Question: What is 1 + 1?\nAnswer:"
    observer = OBSERVER_TEMPLATE.format(query="What is 1 + 1?", pioneer=" 1 + 1 = 2. The answer is 2.")
    assert observer == GSM8K_FEW_SHOT + (
        "Question: What is 1 + 1?\nReference:  1 + 1 = 2. The answer is 2.\nAnswer:"
    )
    # braces in a query or a response are data, not fields
    assert PIONEER_TEMPLATE.format(query="{x}").endswith("Question: {x}\nAnswer:")


def test_few_shot_example_is_one_correct_worked_example():
    assert GSM8K_FEW_SHOT.count("Question:") == 1 and GSM8K_FEW_SHOT.count("Answer:") == 1
    assert GSM8K_FEW_SHOT.endswith("\n\n")
    answer = GSM8K_FEW_SHOT.split("Answer:", 1)[1]
    # 4 rows of 7 = 28; minus 5 eaten = 23; minus 9 picked = 14
    sample = {"query": "", "answer": "#### 14"}
    assert ExactMatchReward()([sample], [answer]) == [1.0]
