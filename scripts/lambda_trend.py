"""What λ did in a study of reward coefficients over a social dilemma: per λ, the learners' cooperation rate and
payoff at the end of training (the mean over the last K iterations and over the learners of a run), with a 95%
t interval over seeds; and the trend over λ, the least-squares slope of every run's value on its λ with its 95%
interval (an interval that excludes 0 establishes a monotone effect at that confidence).

    .venv/bin/python scripts/lambda_trend.py runs/studies/lambda_ipd_offline [--last 5] [--json OUT]

The study's runs are ``STUDY_DIR/runs/*``; each run's λ is its config's ``agents.reward_coefficients`` (a number).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from marllm.utils.jsonl import read_jsonl
from marllm.utils.statistics import estimate, linear_trend

METRICS = ("cooperation_rate", "payoff")


def run_values(run_dir: Path, last: int) -> tuple[float, dict[str, float]]:
    """A run's λ and, per metric, the mean over its learners of ``<learner>/game/<metric>`` over its last iterations."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    weight = config["agents"]["reward_coefficients"]
    if not isinstance(weight, int | float):
        raise ValueError(f"{run_dir}: agents.reward_coefficients is {weight!r}, not one λ")
    rows = [row for _, row in read_jsonl(run_dir / "metrics.jsonl")][-last:]
    learners = config["game"]["seats"]
    values = {}
    for metric in METRICS:
        per_learner = [[row[f"{learner}/game/{metric}"] for row in rows] for learner in dict.fromkeys(learners)]
        values[metric] = float(np.nanmean(per_learner))
    return float(weight), values


def summarise(study_dir: Path, last: int) -> dict[str, Any]:
    """Per metric: per λ the estimate over seeds, and the trend over λ of every run's value."""
    runs = sorted(p for p in (study_dir / "runs").iterdir() if (p / "metrics.jsonl").exists())
    if not runs:
        raise SystemExit(f"{study_dir}/runs holds no run with metrics")
    points = [run_values(run, last) for run in runs]
    summary: dict[str, Any] = {"study": str(study_dir), "runs": len(points), "last_iterations": last}
    for metric in METRICS:
        by_weight: dict[float, list[float]] = defaultdict(list)
        for weight, values in points:
            by_weight[weight].append(values[metric])
        summary[metric] = {
            "per_lambda": {str(w): estimate(v).as_dict() for w, v in sorted(by_weight.items())},
            "trend": linear_trend([w for w, _ in points], [v[metric] for _, v in points]).as_dict(),
        }
    return summary


def _format(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study_dir", type=Path)
    parser.add_argument("--last", type=int, default=5, help="iterations averaged at the end of each run")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args()
    summary = summarise(args.study_dir, args.last)
    for metric in METRICS:
        print(f"\n{metric} (last {args.last} iterations, mean of the learners; 95% t intervals over seeds)")
        print("| λ | mean | 95% interval | seeds |\n|---|---|---|---|")
        for weight, e in summary[metric]["per_lambda"].items():
            print(f"| {weight} | {_format(e['mean'])} | [{_format(e['ci_low'])}, {_format(e['ci_high'])}] | {e['n']} |")
        t = summary[metric]["trend"]
        print(f"slope over λ: {_format(t['slope'])}, 95% [{_format(t['ci_low'])}, {_format(t['ci_high'])}], "
              f"{t['n']} runs")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
