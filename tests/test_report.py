"""Tests of the run report on synthetic run directories (no training, no models)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from marllm.reporting import build_report, collapse_indicators, load_run, load_runs, moving_average
from marllm.reporting.evaluation import collapse_per_iteration, eval_models
from marllm.reporting.tables import escape_cell
from marllm.run.run_dir import WrongDirectoryError

N_ITERATIONS = 12
N_QUERIES = 10
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _queries() -> list[str]:
    queries = [f"query number {i}" for i in range(N_QUERIES)]
    queries[1] = "a | piped\nquery"
    return queries


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _run_dir(path: Path) -> Path:
    """A run directory with a config.yaml but no run.json: a run is named after its directory."""
    path.mkdir()
    (path / "config.yaml").write_text("name: run\n", encoding="utf-8")
    return path


def _write_run(
    root: Path,
    dir_name: str,
    name: str,
    learners: list[str],
    *,
    base_response: str = "plain answer {i}",
    responses: dict[str, str] | None = None,
    samples: bool = False,
) -> Path:
    """A run directory following the training loop's contract.

    Learner j (0-based) logs task_reward = (j + 1) * 0.1 * i, kl = 0.5 * i, combined = task - 0.2 * kl.
    Iteration 10 has no ``<learner>/kl`` and iteration 4 no ``time/*`` keys.
    """
    run_dir = root / dir_name
    run_dir.mkdir()
    (run_dir / "run.json").write_text(
        json.dumps(
            {
                "name": name,
                "learners": learners,
                "roles": ["pioneer", "observer"][: len(learners)],
                "iterations": N_ITERATIONS,
                "kl_metric": "full-vocabulary KL summed over response tokens",
            }
        )
    )
    lines = []
    for i in range(N_ITERATIONS):
        line: dict = {"iteration": i}
        if i != 4:
            line.update({"time/iteration_s": 1.0, "time/generation_s": 0.5, "time/update_s": 0.25})
        for j, learner in enumerate(learners):
            task, kl = (j + 1) * 0.1 * i, 0.5 * i
            line.update(
                {
                    f"{learner}/task_reward": task,
                    f"{learner}/combined_reward": task - 0.2 * kl,
                    f"{learner}/kl_coef": 0.2,
                    f"{learner}/role": "pioneer" if (i // 5 + j) % 2 == 0 else "observer",
                    f"{learner}/response_length": 8.0,
                }
            )
            if i != 10:
                line[f"{learner}/kl"] = kl
        lines.append(line)
    _write_jsonl(run_dir / "metrics.jsonl", lines)
    responses = responses or {}
    rows = []
    for i, query in enumerate(_queries()):
        rows.append(
            {"query": query, "model": "base", "response": base_response.format(i=i), "task_reward": i / 10}
        )
        for learner in learners:
            text = responses.get(learner, f"{learner} says {i}")
            rows.append({"query": query, "model": learner, "response": text, "task_reward": 1.0})
    _write_jsonl(run_dir / "eval_samples.jsonl", rows)
    if samples:
        dialogues = [
            {
                "iteration": it,
                "learner": learner,
                "role": "pioneer",
                "query": "q",
                "prompt": "q",
                "response": "wow wow" if it >= 6 else "a fine film",
                "task_reward": 0.0,
            }
            for it in range(N_ITERATIONS)
            for learner in learners
        ]
        _write_jsonl(run_dir / "samples.jsonl", dialogues)
    return run_dir


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    root = tmp_path_factory.mktemp("runs")
    ppo = _write_run(root, "ppo_run", "ppo", ["llm1"], responses={"llm1": "Marvelous marvelous splendid"})
    cory = _write_run(root, "cory_run", "cory", ["llm1", "llm2"], samples=True)
    path = build_report([ppo, cory], root / "report", smoothing=3)
    summary = json.loads((root / "report" / "summary.json").read_text())
    return path, summary, path.read_text()


def test_report_writes_markdown_figures_and_summary(report):
    path, summary, text = report
    assert path.name == "report.md"
    for name in [
        "task_reward.png",
        "kl.png",
        "combined_reward.png",
        "reward_vs_kl.png",
        "collapse_per_iteration.png",
    ]:
        assert (path.parent / name).read_bytes()[:8] == PNG_MAGIC
        assert f"]({name})" in text
    assert [r["label"] for r in summary["runs"]] == ["PPO", "CORY"]
    assert [f["label"] for f in summary["final"]] == ["PPO", "CORY-LLM1", "CORY-LLM2"]
    assert summary["final_k"] == 5


def test_final_table_is_the_mean_of_the_last_five_iterations(report):
    _, summary, text = report
    ppo, cory1, cory2 = summary["final"]
    assert ppo["k"] == 5 and ppo["window"] == [7, 11]
    # task reward 0.1 * i over i = 7..11; KL 0.5 * i with iteration 10 missing.
    assert ppo["task_reward"] == pytest.approx(0.1 * (7 + 8 + 9 + 10 + 11) / 5)
    assert ppo["kl"] == pytest.approx(0.5 * (7 + 8 + 9 + 11) / 4)
    assert ppo["combined_reward"] == pytest.approx(0.9 - 0.2 * 4.5)
    assert cory2["task_reward"] == pytest.approx(0.2 * 9)
    assert cory1["kl"] == pytest.approx(4.375)
    assert ppo["received_reward"] is None  # never logged
    assert "| CORY-LLM2 | 7–11 (k=5) | 1.8 | 4.375 |" in text


def test_wall_time_sums_the_time_keys(report):
    _, summary, text = report
    # 11 of the 12 iterations log time/* keys.
    assert summary["wall_time_s"]["PPO"] == pytest.approx(
        {"iteration_s": 11.0, "generation_s": 5.5, "update_s": 2.75}
    )
    assert "| run | iteration (s) | generation (s) | update (s) |" in text


def test_sample_table_shows_the_first_eight_queries_escaped(report):
    _, _, text = report
    section = text.split("## Held-out samples")[1].split("## Collapse indicators")[0]
    assert "| query | Base | PPO | CORY-LLM1 | CORY-LLM2 |" in section
    for i in [0, 2, 7]:
        assert f"| query number {i} | plain answer {i} (r = {i / 10:.3g}) |" in section
    assert "query number 8" not in section
    assert "a \\| piped<br>query" in section
    assert "Marvelous marvelous splendid (r = 1)" in section


def test_eval_collapse_indicators_per_model(report):
    _, summary, _ = report
    by_label = {row["label"]: row for row in summary["eval"]}
    assert list(by_label) == ["Base", "PPO", "CORY-LLM1", "CORY-LLM2"]
    base, ppo = by_label["Base"], by_label["PPO"]
    # "plain answer i" for i < 10: 12 distinct words of 30; bigrams: "plain answer" and 10 "answer i" of 20.
    assert base["distinct_1"] == pytest.approx(12 / 30)
    assert base["distinct_2"] == pytest.approx(11 / 20)
    assert base["repeated_fraction"] == 0.0
    assert base["task_reward"] == pytest.approx(0.45)
    assert base["n_responses"] == 10
    # "marvelous marvelous splendid" ten times: 2 words, 2 bigrams, one repeat per answer.
    assert ppo["distinct_1"] == pytest.approx(2 / 30)
    assert ppo["distinct_2"] == pytest.approx(2 / 20)
    assert ppo["repeated_fraction"] == pytest.approx(1 / 3)
    assert ppo["mean_length"] == 3.0


def test_runs_without_training_samples_are_named(report):
    _, _, text = report
    assert "No samples.jsonl (or an empty one) in: PPO." in text


@pytest.mark.parametrize(
    ("responses", "expected"),
    [
        (
            ["good good good"],
            {"distinct_1": 1 / 3, "distinct_2": 1 / 2, "repeated_fraction": 2 / 3, "mean_length": 3},
        ),
        (
            ["The cat sat", "the dog sat"],
            {"distinct_1": 4 / 6, "distinct_2": 1.0, "repeated_fraction": 0.0, "mean_length": 3},
        ),
        (
            ["a b a b", "c"],
            {"distinct_1": 3 / 5, "distinct_2": 2 / 3, "repeated_fraction": 2 / 5, "mean_length": 2.5},
        ),
    ],
)
def test_collapse_indicators_hand_computed(responses, expected):
    assert collapse_indicators(responses) == pytest.approx(expected)


def test_collapse_indicators_undefined_ratios_are_nan_and_bad_input_raises():
    stats = collapse_indicators(["", "word"])
    assert stats["distinct_1"] == 1.0 and stats["mean_length"] == 0.5
    assert math.isnan(stats["distinct_2"])
    with pytest.raises(ValueError, match="at least one response"):
        collapse_indicators([])
    with pytest.raises(ValueError, match="not a single string"):
        collapse_indicators("good good")


def test_collapse_per_iteration_from_training_samples(report, tmp_path):
    run = load_run(_write_run(tmp_path, "c", "cory", ["llm1", "llm2"], samples=True))
    iterations, stats = collapse_per_iteration(run, "llm2")
    assert iterations.tolist() == list(range(N_ITERATIONS))
    # "a fine film" before iteration 6, "wow wow" after.
    assert stats["repeated_fraction"].tolist() == [0.0] * 6 + [0.5] * 6
    assert stats["distinct_1"].tolist() == [1.0] * 6 + [0.5] * 6


def test_moving_average_hand_computed():
    np.testing.assert_allclose(moving_average([1, 2, 3, 4], 2), [1, 1.5, 2.5, 3.5])
    np.testing.assert_allclose(moving_average([1, 2, 3, 4], 3), [1, 1.5, 2, 3])
    np.testing.assert_allclose(moving_average([5, 7], 1), [5, 7])
    with pytest.raises(ValueError, match="smoothing window"):
        moving_average([1, 2], 0)


def test_escape_cell_keeps_table_structure():
    assert escape_cell("a|b\nc\\") == "a\\|b<br>c\\\\"
    assert escape_cell("*bold* <b>") == "\\*bold\\* \\<b\\>"


def test_missing_run_dir_and_metrics_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.*does not exist"):
        build_report([tmp_path / "nowhere"], tmp_path / "out")
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(WrongDirectoryError, match="empty_run is not a run directory: it has no run.json or config"):
        build_report([tmp_path / "empty_run"], tmp_path / "out")
    (tmp_path / "empty_run" / "config.yaml").write_text("name: run\n")
    with pytest.raises(FileNotFoundError, match="empty_run/metrics.jsonl not found"):
        build_report([tmp_path / "empty_run"], tmp_path / "out")
    (tmp_path / "empty_run" / "metrics.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="metrics.jsonl is empty"):
        load_run(tmp_path / "empty_run")
    (tmp_path / "empty_run" / "metrics.jsonl").write_text('{"iteration": 0}\n{"iteration": 1,\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2: not valid JSON"):
        load_run(tmp_path / "empty_run")
    assert not (tmp_path / "out").exists()


def test_malformed_inputs_are_clear_errors(tmp_path):
    run_dir = _write_run(tmp_path, "r", "ppo", ["llm1"])
    with pytest.raises(ValueError, match="given twice"):
        load_runs([run_dir, tmp_path / "." / "r"])
    with pytest.raises(ValueError, match="non-empty sequence"):
        load_runs([])
    with pytest.raises(ValueError, match="smoothing must be an integer >= 1"):
        build_report([run_dir], tmp_path / "out", smoothing=0)
    with pytest.raises(ValueError, match="final_k"):
        build_report([run_dir], tmp_path / "out", final_k=0)
    _write_jsonl(run_dir / "eval_samples.jsonl", [{"query": "q", "model": "base"}])
    with pytest.raises(ValueError, match="eval_samples.jsonl:1: 'response' must be a str"):
        load_run(run_dir)
    (run_dir / "run.json").write_text(json.dumps({"name": "ppo", "learners": []}))
    with pytest.raises(ValueError, match="'learners' must be a non-empty list"):
        load_run(run_dir)


def test_runs_with_the_same_name_are_told_apart(tmp_path):
    a = _write_run(tmp_path, "seed0", "cory", ["llm1", "llm2"])
    b = _write_run(tmp_path, "seed1", "cory", ["llm1", "llm2"], base_response="other {i}")
    runs = load_runs([a, b])
    assert [run.display for run in runs] == ["CORY (seed0)", "CORY (seed1)"]
    assert runs[1].model_label("llm2") == "CORY-LLM2 (seed1)"
    # The base answers differ between the two runs, so each run keeps its own base column.
    assert [m.label for m in eval_models(runs)][:2] == ["Base (CORY (seed0))", "Base (CORY (seed1))"]


def test_run_without_run_json_is_named_after_its_directory(tmp_path):
    run_dir = _run_dir(tmp_path / "my_run")
    _write_jsonl(run_dir / "metrics.jsonl", [{"time/update_s": 1.0, "a/kl": 1.0}, {"b/kl": 2.0, "a/kl": 3.0}])
    run = load_run(run_dir)
    assert (run.name, run.learners) == ("my_run", ("a", "b"))
    # Lines without "iteration" are numbered after the previous line.
    iterations, values = run.series("a/kl")
    assert iterations.tolist() == [0, 1] and values.tolist() == [1.0, 3.0]


def test_repeated_iteration_keeps_the_last_line_and_warns(tmp_path):
    run_dir = _run_dir(tmp_path / "resumed")
    _write_jsonl(
        run_dir / "metrics.jsonl",
        [
            {"iteration": 0, "llm1/kl": 1.0},
            {"iteration": 1, "llm1/kl": 2.0},
            {"iteration": 1, "llm1/kl": 5.0},
        ],
    )
    with pytest.warns(UserWarning, match=r"iterations \[1\] are logged more than once"):
        run = load_run(run_dir)
    assert run.series("llm1/kl")[1].tolist() == [1.0, 5.0]


def test_report_without_kl_or_eval_samples_says_what_is_missing(tmp_path):
    run_dir = _run_dir(tmp_path / "bare")
    _write_jsonl(
        run_dir / "metrics.jsonl", [{"iteration": i, "llm1/task_reward": float(i)} for i in range(3)]
    )
    text = build_report([run_dir], tmp_path / "out", smoothing=1).read_text()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert "*KL to the reference: no figure, no run logged `<learner>/kl`.*" in text
    assert "No eval_samples.jsonl (or an empty one) in: BARE." in text
    assert summary["final"][0]["k"] == 3 and summary["final"][0]["task_reward"] == pytest.approx(1.0)
    assert summary["figures"]["kl"] is None and (tmp_path / "out" / "task_reward.png").is_file()
