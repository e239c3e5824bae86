"""Study aggregation math on hand-made numbers, and a study report built from hand-made run directories."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from marllm.studies.aggregate import (
    estimate,
    final_value,
    mean_curve,
    mean_over_learners,
    pareto_front,
    t_cdf,
    t_quantile,
    welch_difference,
)
from marllm.studies.report import build_study_report
from tests.test_probe_findings import load_lambda_trend

N_ITERATIONS = 8
LAST_K = 3


@pytest.mark.parametrize(("df", "expected"), [(1, 12.706), (2, 4.303), (4, 2.776), (29, 2.045), (1000, 1.962)])
def test_t_quantile_matches_tables(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-3)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-3)


def test_t_cdf_closed_forms():
    # df = 1 is Cauchy: F(t) = 1/2 + atan(t)/π; df = 2: F(t) = 1/2 + t / (2 √(2 + t²)).
    for t in (-3.0, -0.5, 0.0, 0.7, 4.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)


def test_estimate_hand_computed():
    values = [1.0, 2.0, 6.0]
    mean = 3.0
    std = math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + (6 - 3) ** 2) / 2)
    half = 4.302652729749752 * std / math.sqrt(3)
    got = estimate(values)
    assert (got.mean, got.n) == (mean, 3)
    assert got.std == pytest.approx(std)
    assert (got.low, got.high) == (pytest.approx(mean - half, rel=1e-9), pytest.approx(mean + half, rel=1e-9))


def test_estimate_of_one_seed_has_no_interval():
    got = estimate([4.0])
    assert (got.mean, got.std, got.low, got.high, got.n) == (4.0, None, None, None, 1)


def test_welch_difference_hand_computed():
    a, b = [1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0]
    va, vb = 1.0 / 3, (20.0 / 3) / 4  # sample variances 1 and 20/3, divided by n
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 3)
    half = t_quantile(0.975, df) * math.sqrt(va + vb)
    got = welch_difference(a, b)
    assert got.diff == pytest.approx(2.0 - 5.0)
    assert got.df == pytest.approx(df)
    assert (got.low, got.high) == (pytest.approx(-3.0 - half), pytest.approx(-3.0 + half))
    assert (got.n_a, got.n_b) == (3, 4)
    assert welch_difference([1.0], b).low is None


def test_linear_trend_hand_computed():
    linear_trend = load_lambda_trend().linear_trend
    # y = 1 + 2x exactly at x = 0, 1, 2, then one point off the line: residual standard error by hand.
    x, y = [0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 5.0, 8.0]
    mx, my = 1.5, 4.25
    sxx = sum((a - mx) ** 2 for a in x)  # 5
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sxx  # 2.3
    intercept = my - slope * mx
    residuals = [b - (intercept + slope * a) for a, b in zip(x, y, strict=True)]
    half = t_quantile(0.975, 2) * math.sqrt(sum(r * r for r in residuals) / 2 / sxx)
    got = linear_trend(x, y)
    assert (got.slope, got.intercept, got.n) == (pytest.approx(2.3), pytest.approx(intercept), 4)
    assert (got.low, got.high) == (pytest.approx(2.3 - half), pytest.approx(2.3 + half))
    assert linear_trend([1.0, 1.0, 1.0], [0.0, 1.0, 2.0]).slope is None  # no spread in x: no slope
    assert linear_trend([0.0, 1.0], [0.0, 1.0]).low is None  # two points: no interval
    with pytest.raises(ValueError, match="two 1-d sequences of one length"):
        linear_trend([0.0, 1.0], [0.0])


def test_final_value_uses_the_last_k_or_all():
    assert final_value([1.0, 2.0, 3.0, 4.0], last_k=2) == 3.5
    assert final_value([1.0, 2.0], last_k=5) == 1.5
    with pytest.raises(ValueError):
        final_value([1.0], last_k=0)


def test_mean_curve_and_mean_over_learners():
    its, mean, std, n = mean_curve([(np.array([0, 1, 2]), np.array([1.0, 2.0, 3.0])),
                                    (np.array([0, 1]), np.array([3.0, 6.0]))])
    assert its.tolist() == [0, 1, 2] and n.tolist() == [2, 2, 1]
    assert mean.tolist() == [2.0, 4.0, 3.0]
    assert std[:2] == pytest.approx([math.sqrt(2.0), math.sqrt(8.0)]) and math.isnan(std[2])
    its, values = mean_over_learners([(np.array([0, 1, 2]), np.array([1.0, 2.0, 3.0])),
                                      (np.array([1, 2]), np.array([4.0, 5.0]))])
    assert its.tolist() == [1, 2] and values.tolist() == [3.0, 4.0]


def test_pareto_front_keeps_ties_and_drops_dominated():
    points = {
        "a": (1.0, 1.0),
        "b": (2.0, 2.0),
        "tie_b": (2.0, 2.0),  # same as b: neither dominates the other
        "c": (1.0, 2.0),  # dominated by a (same reward, more KL) and by b
        "d": (0.5, 0.5),
        "e": (2.0, 3.0),  # same reward as b, more KL: dominated
    }
    assert pareto_front(points) == ["d", "a", "b", "tie_b"]


# --- a report from hand-made run directories ------------------------------------------------------------------


def _task(variant_offset: float, seed: int, learner: int, i: int) -> float:
    return variant_offset + 0.1 * seed + 0.05 * learner + 0.01 * i * i


def _kl(variant_offset: float, seed: int, learner: int, i: int) -> float:
    return 2 * variant_offset + 0.3 * seed * seed + 0.1 * learner + 0.2 * i


def _write_run(root: Path, name: str, learners: list[str], offset: float, seed: int, *, status: str) -> None:
    run_dir = root / "runs" / name
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({
        "name": name.split("_")[0], "learners": learners, "iterations": N_ITERATIONS, "status": status,
    }))
    (run_dir / "config.yaml").write_text(f"seed: {seed}\n")
    done = N_ITERATIONS if status == "finished" else 2
    lines = []
    for i in range(done):
        line: dict = {"iteration": i}
        for j, learner in enumerate(learners):
            task, kl = _task(offset, seed, j, i), _kl(offset, seed, j, i)
            line |= {f"{learner}/task_reward": task, f"{learner}/kl": kl, f"{learner}/combined_reward": task - kl}
        lines.append(json.dumps(line))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


VARIANTS = {"ppo": (["llm1"], 0.0), "cory": (["llm1", "llm2"], 1.0)}
SEEDS = (1, 2, 3)


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("study")
    runs = []
    for variant, (learners, offset) in VARIANTS.items():
        for seed in SEEDS:
            name = f"{variant}_s{seed}"
            _write_run(root, name, learners, offset, seed, status="finished")
            runs.append({"name": name, "variant": variant, "axes": {}, "seed": seed, "overrides": [],
                         "run_dir": f"runs/{name}"})
    _write_run(root, "cory_s4", VARIANTS["cory"][0], 1.0, 4, status="failed")
    runs.append({"name": "cory_s4", "variant": "cory", "axes": {}, "seed": 4, "overrides": [],
                 "run_dir": "runs/cory_s4"})
    runs.append({"name": "ppo_s5", "variant": "ppo", "axes": {}, "seed": 5, "overrides": [],
                 "run_dir": "runs/ppo_s5"})  # never ran: no directory
    (root / "study.json").write_text(json.dumps({"name": "demo", "runs": runs, "compare": [["cory", "ppo"]]}))
    path = build_study_report(root, last_k=LAST_K)
    return path, json.loads((root / "report" / "summary.json").read_text())


def _expected_finals(fn, variant: str, learner: int | None) -> list[float]:
    learners, offset = VARIANTS[variant]
    per_seed = []
    for seed in SEEDS:
        last = range(N_ITERATIONS - LAST_K, N_ITERATIONS)
        js = range(len(learners)) if learner is None else [learner]
        per_seed.append(sum(fn(offset, seed, j, i) for i in last for j in js) / (LAST_K * len(js)))
    return per_seed


def _cell(summary: dict, variant: str) -> dict:
    return next(c for c in summary["cells"] if c["variant"] == variant)


def test_study_report_lists_left_out_runs_and_writes_figures(study):
    path, summary = study
    text = path.read_text()
    assert [row["run"] for row in summary["excluded_runs"]] == ["cory_s4", "ppo_s5"]
    assert text.index("cory_s4") < text.index("## Cells") and "ppo_s5" in text
    for cell in summary["cells"]:
        assert cell["n_seeds"] == 3 and cell["seeds"] == list(SEEDS)
    for name in ("curves_task_reward.png", "curves_kl.png", "curves_combined_reward.png", "reward_vs_kl.png"):
        assert (path.parent / name).stat().st_size > 0
        assert f"]({name})" in text


@pytest.mark.parametrize(("metric", "fn"), [("task_reward", _task), ("kl", _kl)])
def test_study_report_final_values_hand_computed(study, metric, fn):
    _, summary = study
    for variant, learner_key, learner in [("ppo", "llm1", 0), ("ppo", "mean", None), ("cory", "llm2", 1),
                                          ("cory", "mean", None)]:
        expected = estimate(_expected_finals(fn, variant, learner))
        got = _cell(summary, variant)["final"][metric][learner_key]
        values = np.array(_expected_finals(fn, variant, learner))
        assert got["mean"] == pytest.approx(values.mean())
        assert got["std"] == pytest.approx(values.std(ddof=1))
        half = t_quantile(0.975, 2) * values.std(ddof=1) / math.sqrt(3)
        assert got["ci_low"] == pytest.approx(values.mean() - half)
        assert (got["ci_high"], got["n"]) == (pytest.approx(expected.high), 3)


def test_study_report_curves_are_means_over_seeds(study):
    _, summary = study
    curve = _cell(summary, "cory")["curves"]["kl"]["mean"]
    assert curve["iterations"] == list(range(N_ITERATIONS))
    for i in range(N_ITERATIONS):
        per_seed = [(_kl(1.0, s, 0, i) + _kl(1.0, s, 1, i)) / 2 for s in SEEDS]
        assert curve["mean"][i] == pytest.approx(np.mean(per_seed))
        assert curve["std"][i] == pytest.approx(np.std(per_seed, ddof=1))


def test_study_report_comparison_is_welch_on_the_mean_learner(study):
    path, summary = study
    row = next(r for r in summary["comparisons"] if r["metric"] == "kl")
    expected = welch_difference(_expected_finals(_kl, "cory", None), _expected_finals(_kl, "ppo", None))
    assert (row["a"], row["b"], row["learner"]) == ("cory", "ppo", "mean")
    assert row["diff"] == pytest.approx(expected.diff)
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(expected.low), pytest.approx(expected.high))
    assert f"cory − ppo, KL (mean) over the last {LAST_K} iterations" in path.read_text()
    assert summary["pareto"] == {"ppo": ["ppo"], "cory": ["cory"]}


def test_study_report_compares_with_the_first_variant_when_compare_is_empty(study, tmp_path):
    path, summary = study
    study_json = json.loads((path.parent.parent / "study.json").read_text())
    (tmp_path / "runs").symlink_to(path.parent.parent / "runs")
    (tmp_path / "study.json").write_text(json.dumps({**study_json, "compare": []}))
    default = json.loads((build_study_report(tmp_path, last_k=LAST_K).parent / "summary.json").read_text())
    # ppo is the first variant in run order, so the default pair is cory − ppo, as given explicitly above
    assert default["comparisons"] == summary["comparisons"]


def test_study_report_grid_axis_figure_and_one_seed_cells(tmp_path):
    runs = []
    for k, coef in enumerate((0.1, 0.2)):
        for seed in (1, 2) if k == 0 else (1,):
            name = f"ppo_c{k}_s{seed}"
            _write_run(tmp_path, name, ["llm1"], coef, seed, status="finished")
            runs.append({"name": name, "variant": "ppo", "axes": {"ppo.kl.init_kl_coef": coef}, "seed": seed,
                         "overrides": [], "run_dir": f"runs/{name}"})
    runs.append({"name": "ppo_c2_s1", "variant": "ppo", "axes": {"ppo.kl.init_kl_coef": 0.3}, "seed": 1,
                 "overrides": [], "run_dir": "runs/ppo_c2_s1"})  # a cell whose only run never started
    (tmp_path / "study.json").write_text(json.dumps({"name": "grid", "runs": runs}))
    path = build_study_report(tmp_path)
    summary = json.loads((path.parent / "summary.json").read_text())
    assert (path.parent / "axis_ppo_kl_init_kl_coef.png").is_file()
    one_seed = summary["cells"][1]["final"]["kl"]["mean"]
    assert (one_seed["n"], one_seed["std"], one_seed["ci_low"]) == (1, None, None)
    assert "undefined (n = 1)" in path.read_text()
    assert summary["comparisons"] == []
    assert (summary["cells"][2]["n_seeds"], summary["cells"][2]["final"]) == (0, {})
    last = range(N_ITERATIONS - 5, N_ITERATIONS)
    finals = {  # (reward, KL) of each cell, averaged over its seeds' last five iterations
        coef: tuple(np.mean([fn(coef, s, 0, i) for s in seeds for i in last]) for fn in (_task, _kl))
        for coef, seeds in ((0.1, (1, 2)), (0.2, (1,)))
    }
    dominant = finals[0.2][0] > finals[0.1][0] and finals[0.2][1] < finals[0.1][1]
    assert dominant  # the seed-2 run of the 0.1 cell has a much larger KL
    assert summary["pareto"]["ppo"] == ["ppo (ppo.kl.init_kl_coef=0.2)"]
    reward = summary["cells"][0]["final"]["task_reward"]["mean"]["mean"]
    assert reward == pytest.approx(finals[0.1][0])


def test_study_report_follows_exchanged_roles_and_pairs_their_gap_within_seeds(tmp_path):
    """llm1 and llm2 swap roles every iteration; the observer's task reward is the pioneer's plus 0.5 + seed/10 at
    iteration 0, shrinking by 0.05 per iteration."""

    def pioneer(seed, i):
        return 0.2 * seed + 0.01 * i

    def observer(seed, i):
        return pioneer(seed, i) + 0.5 + 0.1 * seed - 0.05 * i

    runs = []
    for seed in SEEDS:
        name = f"cory_s{seed}"
        run_dir = tmp_path / "runs" / name
        run_dir.mkdir(parents=True)
        (run_dir / "run.json").write_text(json.dumps(
            {"name": "cory", "learners": ["llm1", "llm2"], "iterations": N_ITERATIONS, "status": "finished"}
        ))
        lines = []
        for i in range(N_ITERATIONS):
            roles = ("pioneer", "observer") if i % 2 == 0 else ("observer", "pioneer")
            line: dict = {"iteration": i}
            for learner, role in zip(("llm1", "llm2"), roles, strict=True):
                reward = pioneer(seed, i) if role == "pioneer" else observer(seed, i)
                line |= {f"{learner}/task_reward": reward, f"{learner}/kl": 1.0, f"{learner}/role": role}
            lines.append(json.dumps(line))
        (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        runs.append({"name": name, "variant": "cory", "axes": {}, "seed": seed, "run_dir": f"runs/{name}"})
    (tmp_path / "study.json").write_text(json.dumps({"name": "roles", "runs": runs}))
    path = build_study_report(tmp_path, last_k=LAST_K)
    cell = json.loads((tmp_path / "report" / "summary.json").read_text())["cells"][0]

    last = range(N_ITERATIONS - LAST_K, N_ITERATIONS)
    as_pioneer = [sum(pioneer(s, i) for i in last) / LAST_K for s in SEEDS]
    assert cell["final"]["task_reward"]["as pioneer"]["per_seed"] == pytest.approx(as_pioneer)
    [gap] = cell["role_gaps"]
    assert (gap["role"], gap["minus"]) == ("observer", "pioneer")
    start = [0.5 + 0.1 * s for s in SEEDS]
    end = [sum(0.5 + 0.1 * s - 0.05 * i for i in last) / LAST_K for s in SEEDS]
    assert gap["first_iteration"]["per_seed"] == pytest.approx(start)
    assert gap["final"]["per_seed"] == pytest.approx(end)
    assert gap["final"]["ci_low"] == pytest.approx(estimate(end).low)
    text = path.read_text()
    assert "## By role" in text and "observer − pioneer, task reward at the first iteration 0.7" in text
    assert (path.parent / "curves_task_reward_by_role.png").stat().st_size > 0
    assert "](curves_task_reward_by_role.png)" in text
    # the learners' own series mix both roles: each learner's final is the mean of the two roles' values
    both = cell["final"]["task_reward"]
    assert both["mean"]["mean"] == pytest.approx((both["as pioneer"]["mean"] + both["as observer"]["mean"]) / 2)


def test_study_report_has_no_role_series_without_an_exchange(study):
    _, summary = study
    for cell in summary["cells"]:
        assert not any(name.startswith("as ") for name in cell["final"]["task_reward"]) and cell["role_gaps"] == []
    assert not (study[0].parent / "curves_task_reward_by_role.png").exists()
