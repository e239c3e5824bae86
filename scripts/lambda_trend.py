"""What λ did in a study of reward coefficients over a game: per λ, the learners' game metrics at the end of
training (by default the cooperation rate and payoff of a social dilemma; the mean over the last K iterations and over
the learners of a run), with a 95% t interval over seeds, each seed's value and the seeds' mean at iteration 0; and the
trend over λ, the least-squares slope of every run's value on its λ with its 95% interval (an interval that excludes
0 establishes a monotone effect at that confidence).

    .venv/bin/python scripts/lambda_trend.py runs/studies/lambda_ipd_offline [--last 5] [--json OUT]
    .venv/bin/python scripts/lambda_trend.py runs/studies/lambda_deal_offline \
        --metrics agreement_rate,welfare_of_best,share_of_max,own_values_named_rate,message_words,kl \
        --dialogues -1,0,1 [--learner llm2]

A metric is ``<learner>/game/<name>`` of each learner (``kl`` and names with a ``/``: ``<learner>/<name>``), or
``A-B``, metric A minus metric B (an estimate minus its shuffled baseline);
``--learner NAME`` reads one learner's instead of the learners' mean (in a game without role swaps, one seat's).
``--dialogues`` prints, for each λ given, the last turn of the last logged iteration of the first seed's run as its
samples recorded it: the prompt (the game so far) and the answer. The study's runs are ``STUDY_DIR/runs/*``; each
run's λ is its config's ``agents.reward_coefficients`` (a number); a run without ``metrics.jsonl`` (not started, or
failed before its first iteration) is left out, and named on stderr and in the summary's ``skipped_runs``.
``--json OUT`` writes the summary to the file OUT (its missing folders made).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import yaml

from marllm.games.opponents import OPPONENT_REGISTRY
from marllm.studies.aggregate import last_iterations_label
from marllm.utils.jsonl import read_jsonl
from marllm.utils.statistics import CONFIDENCE, estimate, t_quantile

METRICS = ("cooperation_rate", "payoff")
"""The metrics summarised by default: a social dilemma's."""
DIFFERENCE = "-"
"""``A-B`` in ``--metrics``: metric A minus metric B, per run (an estimate minus its baseline: ``mi_prize_pick-
mi_prize_pick_shuffled``)."""


def metric_key(learner: str, name: str) -> str:
    """Where ``name`` is logged for ``learner``: ``<learner>/game/<name>``, or ``<learner>/<name>`` for ``kl`` and a
    name with a ``/``."""
    return f"{learner}/{name}" if name == "kl" or "/" in name else f"{learner}/game/{name}"


class NotAStudyError(ValueError):
    """The directory given is not a study of reward coefficients over a social dilemma; the message says what it
    lacks and what was expected."""


def at_least_one(text: str) -> int:
    """``--last``: an integer >= 1 (argparse's ``type``)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"must be an integer >= 1 (the iterations averaged at the end of each run), got {text!r}"
        )
    return value


def run_config(run_dir: Path) -> tuple[dict[str, Any], float]:
    """A run's recorded config and its λ.

    Raises:
        NotAStudyError: the run has no ``config.yaml``, or its λ is not one number.
    """
    if not (run_dir / "config.yaml").is_file():
        raise NotAStudyError(f"{run_dir} has metrics.jsonl but no config.yaml (marllm train writes both)")
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    weight = (config.get("agents") or {}).get("reward_coefficients")
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise NotAStudyError(
            f"{run_dir}: agents.reward_coefficients is {weight!r}, not one λ (this script reads a study of one "
            "reward coefficient over a two-seat game)"
        )
    return config, float(weight)


class RunValues(NamedTuple):
    """What :func:`run_values` reads of one run."""

    weight: float
    """The run's λ."""
    seed: Any
    """Its config's ``seed``."""
    values: dict[str, float]
    """Per metric, the mean over the learners and the last iterations."""
    start: dict[str, float]
    """Per metric, the mean over the learners at the first logged iteration (NaN where none logged it)."""
    averaged: int
    """How many iterations ``values`` averaged."""


def run_values(run_dir: Path, last: int, metrics: tuple[str, ...] = METRICS, learner: str | None = None) -> RunValues:
    """A run's λ and seed, per metric the mean over its learners of ``<learner>/game/<metric>`` over its last
    ``last`` iterations and at its first, and how many iterations that mean took (fewer than ``last`` when the run
    is shorter). With ``learner``, that learner's values alone instead of the learners' mean.

    Raises:
        NotAStudyError: the run has no ``config.yaml``, its λ is not one number, ``learner`` is not one of its
            ``game.seats``, or it logs no such metric.
    """
    config, weight = run_config(run_dir)
    every = [row for _, row in read_jsonl(run_dir / "metrics.jsonl")]
    rows = every[-last:]
    learners = learner_ids((config.get("game") or {}).get("seats") or [])
    if learner is not None:
        if learner not in learners:
            raise NotAStudyError(f"{run_dir}: no learner {learner!r}; its game.seats are {learners}")
        learners = [learner]
    values, start = {}, {}
    for metric in metrics:
        if DIFFERENCE in metric:  # an estimate minus its baseline: the difference of the two's means
            minuend, _, subtrahend = metric.partition(DIFFERENCE)
            if DIFFERENCE in subtrahend:
                raise NotAStudyError(f"--metrics {metric!r}: a difference is of two metrics, A-B")
            parts = run_values(run_dir, last, (minuend, subtrahend), learner)
            values[metric] = parts.values[minuend] - parts.values[subtrahend]
            start[metric] = parts.start[minuend] - parts.start[subtrahend]
            continue
        keys = [metric_key(name, metric) for name in dict.fromkeys(learners)]
        absent = [key for key in keys if not any(key in row for row in rows)]
        if absent:
            raise NotAStudyError(
                f"{run_dir}/metrics.jsonl has no {absent[0]!r}: this script reads the game metrics "
                f"{list(metrics)} of the game's learners (game.seats)"
            )
        # an iteration without a learner's rate (no legal answer of its own) counts as missing, not as a value
        per_learner = [[row.get(key, np.nan) for row in rows] for key in keys]
        if not per_learner or not rows:
            raise NotAStudyError(f"{run_dir}: no game metrics (no iteration logged, or no game.seats in config.yaml)")
        values[metric] = float(np.nanmean(per_learner))
        first = [every[0].get(key, np.nan) for key in keys]
        start[metric] = float(np.nanmean(first)) if not np.isnan(first).all() else float("nan")
    return RunValues(weight, config.get("seed"), values, start, len(rows))


def learner_ids(seats: list[Any]) -> list[str]:
    """The learner ids among a recorded config's ``game.seats`` (the seats an opponent plays left out)."""
    return [seat for seat in seats if isinstance(seat, str) and ":" not in seat and seat not in OPPONENT_REGISTRY]


def find_runs(study_dir: Path) -> list[Path]:
    """The run directories of ``STUDY_DIR/runs`` that logged metrics (:func:`skipped_runs` names the others).

    Raises:
        NotAStudyError: ``study_dir`` is not a directory, has no ``runs/`` folder, or none of its runs has metrics.
    """
    expected = "a study directory written by marllm study (e.g. runs/studies/lambda_ipd_offline), with a runs/ folder"
    if not study_dir.is_dir():
        what = "does not exist" if not study_dir.exists() else "is not a directory"
        raise NotAStudyError(f"{study_dir} {what}; give {expected}")
    if not (study_dir / "runs").is_dir():
        run = (
            " (it is one run's directory; give the study directory that holds its runs/)"
            if (study_dir / "metrics.jsonl").exists()
            else ""
        )
        raise NotAStudyError(f"{study_dir} has no runs/ folder{run}; give {expected}")
    runs = sorted(p for p in (study_dir / "runs").iterdir() if (p / "metrics.jsonl").is_file())
    if not runs:
        raise NotAStudyError(f"{study_dir}/runs holds no run with metrics (a run's metrics.jsonl); give {expected}")
    return runs


def skipped_runs(study_dir: Path) -> list[str]:
    """The names of the run directories of ``STUDY_DIR/runs`` that :func:`find_runs` leaves out: those without a
    ``metrics.jsonl`` (a run not started yet, or that failed before its first iteration)."""
    folder = study_dir / "runs"
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not (p / "metrics.jsonl").is_file())


def check_json_path(path: Path) -> None:
    """``--json``: refuse a path that is a directory, or whose folder is a file (its missing folders are made when
    it is written).

    Raises:
        ValueError: saying what the path is and what to give instead.
    """
    if path.is_dir():
        raise ValueError(
            f"--json {path} is a directory; give the file to write the summary to, e.g. {path / 'trend.json'}"
        )
    folder = next((parent for parent in path.parents if parent.exists()), None)
    if folder is not None and not folder.is_dir():
        raise ValueError(f"--json {path}: {folder} is a file, not a folder; give a file path in a folder")


class Trend(NamedTuple):
    """The least-squares slope of y on x with its 95% Student-t interval (df = n − 2; None below 3 points or when
    every x is the same), and the intercept."""

    slope: float | None
    low: float | None
    high: float | None
    intercept: float | None
    n: int

    def as_dict(self) -> dict[str, float | int | None]:
        return {"slope": self.slope, "ci_low": self.low, "ci_high": self.high, "intercept": self.intercept, "n": self.n}


def linear_trend(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> Trend:
    """Ordinary least squares y ≈ a + b·x over paired points (every run of a study: x its setting, y its result), and
    b's 95% t interval from the residuals' standard error."""
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xs.shape != ys.shape or xs.ndim != 1:
        raise ValueError(f"linear_trend needs two 1-d sequences of one length, got shapes {xs.shape} and {ys.shape}")
    n = len(xs)
    spread = float(((xs - xs.mean()) ** 2).sum()) if n else 0.0
    if n < 2 or spread == 0.0:
        return Trend(None, None, None, None, n)
    slope = float(((xs - xs.mean()) * (ys - ys.mean())).sum() / spread)
    intercept = float(ys.mean() - slope * xs.mean())
    if n < 3:
        return Trend(slope, None, None, intercept, n)
    residuals = ys - (intercept + slope * xs)
    se = math.sqrt(float((residuals**2).sum()) / (n - 2) / spread)
    half = t_quantile(0.5 + CONFIDENCE / 2, n - 2) * se
    return Trend(slope, slope - half, slope + half, intercept, n)


def summarise(
    study_dir: Path, last: int, metrics: tuple[str, ...] = METRICS, learner: str | None = None
) -> dict[str, Any]:
    """Per metric: per λ the estimate over seeds, each seed's value and the mean at the first iteration; and the
    trend over λ of every run's value.

    Raises:
        ValueError: ``last`` < 1.
        NotAStudyError: ``study_dir`` is not a study of one reward coefficient (the message says what it lacks).
    """
    if last < 1:
        raise ValueError(f"last must be an integer >= 1 (the iterations averaged at the end of each run), got {last}")
    results = [run_values(run, last, metrics, learner) for run in find_runs(study_dir)]
    averaged = [r.averaged for r in results]
    summary: dict[str, Any] = {
        "study": str(study_dir),
        "runs": len(results),
        "skipped_runs": skipped_runs(study_dir),
        "last_iterations": last,
        "averaged_iterations": {"min": min(averaged), "max": max(averaged)},
        "averaged_label": last_iterations_label(last, averaged),
    }
    for metric in metrics:
        by_weight: dict[float, list[RunValues]] = defaultdict(list)
        for result in results:
            by_weight[result.weight].append(result)
        summary[metric] = {
            "per_lambda": {str(w): _per_lambda(runs, metric) for w, runs in sorted(by_weight.items())},
            "trend": linear_trend([r.weight for r in results], [r.values[metric] for r in results]).as_dict(),
        }
    return summary


def _per_lambda(runs: list[RunValues], metric: str) -> dict[str, Any]:
    """One λ's estimate over its seeds, each seed's value (by seed) and the seeds' mean at the first iteration."""
    starts = [r.start[metric] for r in runs if not np.isnan(r.start[metric])]
    ordered = sorted(runs, key=lambda r: (r.seed is None, str(r.seed) if not isinstance(r.seed, int) else r.seed))
    return estimate([r.values[metric] for r in runs]).as_dict() | {
        "per_seed": {str(r.seed): r.values[metric] for r in ordered},
        "start": float(np.mean(starts)) if starts else None,
    }


def _format(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def lambda_values(text: str) -> list[float]:
    """``--dialogues``: comma-separated numbers (argparse's ``type``); ``-0`` is 0."""
    try:
        return [float(value) + 0.0 for value in text.split(",") if value.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated λ values (numbers), got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    """The command line's options (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="lambda_trend.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("study_dir", type=Path)
    parser.add_argument(
        "--last", type=at_least_one, default=5, help="iterations averaged at the end of each run (>= 1)"
    )
    parser.add_argument("--json", type=Path, help="also write the summary here")
    parser.add_argument(
        "--metrics", default=",".join(METRICS), help="comma-separated metric names (default: %(default)s)"
    )
    parser.add_argument(
        "--dialogues", type=lambda_values, default=[], help="comma-separated λ values whose last turn to print"
    )
    parser.add_argument("--learner", help="one learner's values (a name of game.seats) instead of the learners' mean")
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """``argv`` read as the command line reads it (``--dialogues -1,0,1`` included); exits on a bad option."""
    return build_parser().parse_args(_joined_negative_values(argv))


def main(argv: list[str] | None = None) -> None:
    """The command line (see the module docstring); a directory that is not such a study exits with status 2 and
    one line saying what it expected."""
    parser = build_parser()
    args = parser.parse_args(_joined_negative_values(sys.argv[1:] if argv is None else argv))
    metrics = tuple(name.strip() for name in args.metrics.split(",") if name.strip())
    try:
        if args.json:
            check_json_path(args.json)
        summary = summarise(args.study_dir, args.last, metrics, args.learner)
        transcripts = dialogues(args.study_dir, args.dialogues)
    except ValueError as error:  # not such a study, or a --json path that cannot be written
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    if summary["skipped_runs"]:
        skipped = summary["skipped_runs"]
        print(
            f"{parser.prog}: warning: skipped {len(skipped)} run(s) of {args.study_dir}/runs without metrics.jsonl "
            f"(not started, or failed before their first iteration): {', '.join(skipped)}",
            file=sys.stderr,
        )
    for metric in metrics:
        whose = f"learner {args.learner}" if args.learner else "mean of the learners"
        print(f"\n{metric} ({summary['averaged_label']}, {whose}; 95% t intervals over seeds)")
        print("| λ | mean | 95% interval | per seed | seeds | at iteration 0 |\n|---|---|---|---|---|---|")
        for weight, e in summary[metric]["per_lambda"].items():
            seeds = ", ".join(_format(v) for v in e["per_seed"].values())
            print(f"| {weight} | {_format(e['mean'])} | [{_format(e['ci_low'])}, {_format(e['ci_high'])}] | {seeds} "
                  f"| {e['n']} | {_format(e['start'])} |")  # fmt: skip
        t = summary[metric]["trend"]
        print(f"slope over λ: {_format(t['slope'])}, 95% [{_format(t['ci_low'])}, {_format(t['ci_high'])}], "
              f"{t['n']} runs")  # fmt: skip
    for weight, (run, sample) in transcripts.items():
        print(f"\nλ = {weight}: {run.name}, iteration {sample['iteration']}, {sample['learner']} ({sample['role']})")
        print(f"{sample['prompt']}{sample['response']}")
    if args.json:
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(summary | {"dialogues": _as_json(transcripts)}, indent=2) + "\n")
        except OSError as error:
            parser.exit(1, f"{parser.prog}: error: --json {args.json} cannot be written: {error.strerror or error}\n")


def _joined_negative_values(argv: list[str]) -> list[str]:
    """``--dialogues -1,0,1`` as ``--dialogues=-1,0,1``: argparse would read ``-1,0,1`` as an option."""
    joined: list[str] = []
    for arg in argv:
        if joined and joined[-1] == "--dialogues" and arg.startswith("-"):
            joined[-1] = f"--dialogues={arg}"
        else:
            joined.append(arg)
    return joined


def dialogues(study_dir: Path, weights: list[float]) -> dict[float, tuple[Path, dict[str, Any]]]:
    """Per λ of ``weights``: the first run of that λ (by name) and the last turn of its last logged iteration in
    its ``samples.jsonl`` (whose prompt shows the game so far).

    Raises:
        NotAStudyError: no run of a λ asked for, or its run logged no sample.
    """
    runs: dict[float, Path] = {}
    for run in find_runs(study_dir):
        runs.setdefault(run_config(run)[1], run)
    found = {}
    for weight in weights:
        if weight not in runs:
            raise NotAStudyError(f"{study_dir}: no run has λ = {weight}; its runs have λ in {sorted(runs)}")
        samples = (
            [row for _, row in read_jsonl(runs[weight] / "samples.jsonl")]
            if (runs[weight] / "samples.jsonl").is_file()
            else []
        )
        if not samples:
            raise NotAStudyError(f"{runs[weight]} logged no samples (logging.samples_per_iteration)")
        last = max(row["iteration"] for row in samples)
        rows = [row for row in samples if row["iteration"] == last]
        # the last turn logged (a game of one move per seat records no turn: its last row, the last seat's)
        found[weight] = (runs[weight], max(enumerate(rows), key=lambda k_row: (k_row[1].get("turn", 0), k_row[0]))[1])
    return found


def _as_json(transcripts: dict[float, tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
    return {str(weight): {"run": run.name, **sample} for weight, (run, sample) in transcripts.items()}


if __name__ == "__main__":
    main()
