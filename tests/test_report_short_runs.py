"""Run reports of short runs (issue 22): whole-number iteration ticks, no moving average on a run shorter than three
windows (its raw values drawn bold instead), the legend beside the plot rather than over the data, and a by-role view
when learners change role."""

import json

import pytest

from marllm.reporting import build_report
from marllm.reporting.plots import curve_colors, metric_figure, role_figure
from marllm.reporting.runs import curves, load_run


def write_run(root, name, iterations, role_period=None):
    """A run directory of two learners whose task rewards rise, swapping roles every ``role_period`` iterations."""
    path = root / name
    path.mkdir()
    lines = []
    for i in range(iterations):
        line = {"iteration": i}
        for j, learner in enumerate(["llm1", "llm2"]):
            swapped = role_period is not None and (i // role_period) % 2 == 1
            role = ["pioneer", "observer"][(j + swapped) % 2]
            line.update({f"{learner}/task_reward": i * (j + 1) + (10 if role == "observer" else 0),
                         f"{learner}/kl": 0.1 * i, f"{learner}/role": role})
        lines.append(line)
    (path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (path / "run.json").write_text(json.dumps({"name": name, "learners": ["llm1", "llm2"]}))
    return path


def figure_of(run_dir, smoothing):
    run = load_run(run_dir)
    lines = curves([run])
    return metric_figure(lines, curve_colors(len(lines)), "task_reward", "Task reward", smoothing)


def test_a_short_run_has_whole_iteration_ticks_raw_bold_lines_and_the_legend_outside(tmp_path):
    fig = figure_of(write_run(tmp_path, "short", 3), smoothing=5)
    (ax,) = fig.axes
    ticks = [t for t in ax.get_xticks() if 0 <= t <= 2]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert len(ax.lines) == 2  # one line per learner: no faint raw line under a moving average
    assert all(line.get_linewidth() == 2 and line.get_alpha() is None for line in ax.lines)
    assert "moving average" not in ax.get_title()
    assert ax.get_legend() is None and len(fig.legends) == 1  # the legend is the figure's, beside the axes


def test_a_run_of_three_windows_is_smoothed(tmp_path):
    fig = figure_of(write_run(tmp_path, "long", 15), smoothing=5)
    (ax,) = fig.axes
    assert len(ax.lines) == 4 and "moving average over 5 iterations" in ax.get_title()
    assert sorted(line.get_alpha() or 1.0 for line in ax.lines) == [0.25, 0.25, 1.0, 1.0]


def test_the_report_of_a_short_run_says_its_curves_are_raw(tmp_path):
    text = build_report([write_run(tmp_path, "short", 4)], tmp_path / "report", smoothing=5).read_text()
    assert "Raw values, bold, for every run: shorter than 15 iterations" in text
    assert "Bold lines: moving average" not in text


def test_learners_that_change_role_get_a_by_role_view(tmp_path):
    rotating = write_run(tmp_path, "cory", 6, role_period=2)
    fixed = write_run(tmp_path, "fixed", 6)
    fig = role_figure([load_run(rotating), load_run(fixed)], "task_reward", "Task reward by role")
    (ax,) = fig.axes
    assert [line.get_label() for line in ax.lines] == ["CORY pioneer", "CORY observer"]
    observer = ax.lines[1].get_ydata()
    # whoever is the observer: llm2 (2i + 10) at iterations 0, 1, 4, 5 and llm1 (i + 10) at 2, 3
    assert list(observer) == [10, 12, 12, 13, 18, 20]
    assert role_figure([load_run(fixed)], "task_reward", "Task reward by role") is None
    report = build_report([rotating, fixed], tmp_path / "report", smoothing=1)
    assert (report.parent / "task_reward_by_role.png").is_file()
    assert "### Task reward by role" in report.read_text()
    alone = build_report([fixed], tmp_path / "report_fixed", smoothing=1).read_text()
    assert "by role" not in alone


def test_a_report_replaces_the_earlier_report_in_its_directory_figures_it_no_longer_draws_included(tmp_path):
    out = tmp_path / "report"
    build_report([write_run(tmp_path, "rotating", 6, role_period=2)], out, smoothing=1)
    assert (out / "task_reward_by_role.png").is_file()
    (out / "notes.txt").write_text("mine")  # a file under another name is the user's and stays
    build_report([write_run(tmp_path, "fixed", 6)], out, smoothing=1)
    assert not (out / "task_reward_by_role.png").exists()  # it would show the rotating run beside a fixed-role report
    assert json.loads((out / "summary.json").read_text())["runs"][0]["name"] == "fixed"
    assert (out / "notes.txt").read_text() == "mine"


def test_a_users_file_under_a_reports_name_is_refused_not_written_over(tmp_path, capsys):
    from marllm.cli import main

    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.md").write_text("my notes")
    run = write_run(tmp_path, "run", 4)
    assert main(["report", str(run), "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"marllm: error: {out} holds report.md but no summary.json of a marllm report: files marllm did not write, "
        f"which a report never writes over; move them out of {out}, or give the report another --out"
    )
    assert [path.name for path in out.iterdir()] == ["report.md"] and (out / "report.md").read_text() == "my notes"


def test_a_report_that_failed_halfway_leaves_a_directory_the_next_report_takes(tmp_path, monkeypatch):
    from marllm.reporting import build as report_build

    out, run = tmp_path / "report", write_run(tmp_path, "run", 4)

    def fail(*args, **kwargs):
        raise RuntimeError("evaluation failed")

    monkeypatch.setattr(report_build, "eval_models", fail)
    with pytest.raises(RuntimeError, match="evaluation failed"):
        build_report([run], out, smoothing=1)
    assert (out / "task_reward.png").is_file()  # drawn before the failure
    monkeypatch.undo()
    assert build_report([run], out, smoothing=1).is_file()
    assert json.loads((out / "summary.json").read_text())["runs"][0]["name"] == "run"
