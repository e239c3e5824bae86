"""Reading the run directories written by the training loop.

A run directory holds ``run.json`` or ``config.yaml`` (marllm's record of a run, written when it starts: a directory
with neither is refused, even one holding a ``metrics.jsonl``), and:

- ``run.json``: ``{"name", "learners", "roles", "iterations", "kl_metric", "status", "completed_iterations"}``, and
  ``exploitability_of`` where the run measures exploitability.
  When it is absent the run is named after its directory and its learners are read off the ``<learner>/...``
  metric keys. A run whose ``status`` is not ``finished`` is marked unfinished in the report; a ``run.json`` from
  before statuses were recorded counts as finished when its metrics have its ``iterations`` (see
  :func:`marllm.run.run_dir.run_state`).
- ``metrics.jsonl`` (required): one object per training iteration, keys such as ``llm1/task_reward`` or
  ``time/update_s``. Any key may be missing from any line; a missing value is left out of that curve. A last line
  cut short (no newline: a killed run) is left out with a warning.
- ``eval_samples.jsonl`` (optional): ``{"query", "model", "response", "task_reward"}`` per held-out query
  and model.
- ``samples.jsonl`` (optional): ``{"iteration", "learner", "role", "query", "prompt", "response",
  "task_reward"}``, a few training dialogues per iteration.
- ``config.yaml``: the run's config, read only to tell whether the queries of ``eval_samples.jsonl`` were
  held out (:func:`eval_queries_of`).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from marllm.run.run_dir import RunState, check_run_record, run_state
from marllm.utils.jsonl import read_jsonl

RUN_FILE = "run.json"
CONFIG_FILE = "config.yaml"
HELD_OUT = "held-out"
TRAINING = "training"
METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval_samples.jsonl"
SAMPLES_FILE = "samples.jsonl"
BASE_MODEL = "base"
TIME_PREFIX = "time/"


@dataclass(frozen=True)
class Run:
    """One training run as read from disk.

    ``label`` is the upper-cased run name used in plots and tables ("PPO", "CORY"); ``tag`` is empty unless
    another run given to the same report has the same name, in which case it holds the directory name (or the
    path) that tells the two apart.
    """

    path: Path
    name: str
    learners: tuple[str, ...]
    metrics: tuple[dict[str, Any], ...]
    eval_samples: tuple[dict[str, Any], ...] = ()
    samples: tuple[dict[str, Any], ...] = ()
    kl_metric: str | None = None
    exploitability_of: str | None = None
    """The distribution whose exploitability the run logged (``run.json``), None where it measured none."""
    tag: str = ""
    status: str = "finished"
    planned_iterations: int | None = None
    eval_queries: str = HELD_OUT
    """What the queries of ``eval_samples`` are: ``held-out`` ones, or the ``training`` queries of a task without
    evaluation rows (``eval_split: null``)."""

    @property
    def label(self) -> str:
        return self.name.upper()

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    @property
    def state(self) -> RunState:
        return RunState(self.status, len(self.metrics), self.planned_iterations)

    @property
    def note(self) -> str:
        """``"unfinished: 5 of 20 iterations, interrupted"`` for a run that did not finish, else ``""``."""
        return "" if self.finished else f"unfinished: {self.state.describe()}"

    @property
    def display(self) -> str:
        """The run's label with its disambiguating tag and unfinished note, e.g. ``"CORY (seed1)"`` or
        ``"CORY (unfinished: 5 of 20 iterations, interrupted)"``."""
        return self._with_notes(self.label)

    def _with_notes(self, text: str) -> str:
        notes = "; ".join(note for note in (self.tag, self.note) if note)
        return f"{text} ({notes})" if notes else text

    @property
    def iterations(self) -> np.ndarray:
        """Iteration numbers in file order, shape (n_iterations,)."""
        return np.array([m["iteration"] for m in self.metrics], dtype=np.int64)

    def model_label(self, model: str) -> str:
        """Paper-style label of a model of this run: "PPO", "CORY-LLM1" (suffix only with >1 learner)."""
        suffix = "" if self.learners == (model,) else f"-{model.upper()}"
        return self._with_notes(f"{self.label}{suffix}")

    def roles_held(self, learner: str) -> list[str]:
        """The roles ``learner`` played (its ``LEARNER/role`` values), in order of first appearance."""
        held: dict[str, None] = {}
        for line in self.metrics:
            role = line.get(f"{learner}/role")
            if isinstance(role, str):
                held.setdefault(role)
        return list(held)

    def role_series(self, metric: str, role: str) -> tuple[np.ndarray, np.ndarray]:
        """``(iterations, values)`` of ``metric`` for whichever learner played ``role`` at each iteration."""
        xs, ys = [], []
        for line in self.metrics:
            for learner in self.learners:
                if line.get(f"{learner}/role") == role:
                    value = as_number(line.get(f"{learner}/{metric}"))
                    if value is not None:
                        xs.append(line["iteration"])
                        ys.append(value)
                    break
        return np.array(xs, dtype=np.int64), np.array(ys, dtype=np.float64)

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """``(iterations, values)`` of one metric key over the iterations where it holds a finite number."""
        xs, ys = [], []
        for line in self.metrics:
            value = as_number(line.get(key))
            if value is not None:
                xs.append(line["iteration"])
                ys.append(value)
        return np.array(xs, dtype=np.int64), np.array(ys, dtype=np.float64)


@dataclass(frozen=True)
class Curve:
    """One plotted line: a learner of a run."""

    run: Run
    learner: str

    @property
    def label(self) -> str:
        return self.run.model_label(self.learner)

    def series(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        return self.run.series(f"{self.learner}/{metric}")


def as_number(value: Any) -> float | None:
    """``value`` as a float when it is a finite real number (bools excluded), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def load_run(run_dir: Path | str) -> Run:
    """Read one run directory; see the module docstring for the files it expects.

    Raises FileNotFoundError when the directory or its ``metrics.jsonl`` is missing,
    :class:`~marllm.run.run_dir.WrongDirectoryError` when it holds neither ``run.json`` nor ``config.yaml`` (it is no
    run's), and ValueError naming the file (and line) when a file is empty or malformed.
    """
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    if not run_dir.is_dir():
        raise NotADirectoryError(f"run directory {run_dir} is not a directory")
    check_run_record(run_dir)
    metrics_path = run_dir / METRICS_FILE
    if not metrics_path.is_file():
        raise FileNotFoundError(
            f"{metrics_path} not found: a run directory needs the {METRICS_FILE} written by the training loop"
        )
    metrics = _read_metrics(metrics_path)
    name, learners, kl_metric, info = _read_run_info(run_dir, metrics)
    state = run_state(info, len(metrics))
    eval_path, samples_path = run_dir / EVAL_FILE, run_dir / SAMPLES_FILE
    eval_samples = (
        _read_rows(eval_path, {"query": str, "model": str, "response": str}) if eval_path.is_file() else []
    )
    samples = (
        _read_rows(samples_path, {"iteration": int, "learner": str, "response": str})
        if samples_path.is_file()
        else []
    )
    return Run(
        path=run_dir,
        name=name,
        learners=learners,
        metrics=tuple(metrics),
        eval_samples=tuple(eval_samples),
        samples=tuple(samples),
        kl_metric=kl_metric,
        exploitability_of=measure if isinstance(measure := info.get("exploitability_of"), str) else None,
        status=state.status,
        planned_iterations=state.planned,
        eval_queries=eval_queries_of(run_dir / CONFIG_FILE),
    )


def eval_queries_of(config_path: Path) -> str:
    """``training`` when the run's config (its ``task`` section) evaluates on the training queries: no
    ``eval_dataset``, and an ``eval_split`` that is null or the training ``split``; else (or without a readable
    config) ``held-out``."""
    try:
        config = yaml.safe_load(config_path.read_text(encoding="utf-8")) if config_path.is_file() else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return HELD_OUT
    task = config.get("task") if isinstance(config, dict) else None
    if not isinstance(task, dict) or "eval_split" not in task or task.get("eval_dataset") is not None:
        return HELD_OUT
    return TRAINING if task["eval_split"] is None or task["eval_split"] == task.get("split") else HELD_OUT


def load_runs(run_dirs: Sequence[Path | str]) -> list[Run]:
    """Load several runs for one report, tagging runs that share a name so that none is overwritten."""
    if isinstance(run_dirs, (str, Path)) or len(run_dirs) == 0:
        raise ValueError("run_dirs must be a non-empty sequence of run directories")
    seen: dict[Path, Path] = {}
    for given in map(Path, run_dirs):
        resolved = given.resolve()
        if resolved in seen:
            raise ValueError(f"run directory {given} is given twice (also as {seen[resolved]})")
        seen[resolved] = given
    return disambiguate([load_run(d) for d in run_dirs])


def disambiguate(runs: Iterable[Run]) -> list[Run]:
    """Tag runs whose labels collide with their directory name, or their whole path if those collide too."""
    runs = list(runs)
    groups: dict[str, list[int]] = {}
    for i, run in enumerate(runs):
        groups.setdefault(run.label, []).append(i)
    for members in groups.values():
        if len(members) == 1:
            continue
        dir_names = [runs[i].path.name for i in members]
        use_path = len(set(dir_names)) < len(dir_names)
        for i in members:
            runs[i] = replace(runs[i], tag=str(runs[i].path) if use_path else runs[i].path.name)
    return runs


def curves(runs: Iterable[Run]) -> list[Curve]:
    """Every (run, learner) pair, in run order then learner order."""
    return [Curve(run, learner) for run in runs for learner in run.learners]


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    """Metric lines sorted by iteration; a line without ``iteration`` follows the previous line.

    A resumed run may log an iteration twice: the later line wins, with a warning naming the iterations.
    """
    by_iteration: dict[int, dict[str, Any]] = {}
    repeated = []
    previous = -1
    for number, record in read_jsonl(path):
        iteration = record.get("iteration", previous + 1)
        if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
            raise ValueError(
                f"{path}:{number}: 'iteration' must be a non-negative integer, got {iteration!r}"
            )
        if iteration in by_iteration:
            repeated.append(iteration)
        by_iteration[iteration] = {**record, "iteration": iteration}
        previous = iteration
    if not by_iteration:
        raise ValueError(f"{path} is empty: it must hold one JSON object per training iteration")
    if repeated:
        warnings.warn(
            f"{path}: iterations {sorted(set(repeated))} are logged more than once; the last line of each "
            "is used",
            stacklevel=3,
        )
    return [by_iteration[i] for i in sorted(by_iteration)]


def _read_run_info(
    run_dir: Path, metrics: list[dict[str, Any]]
) -> tuple[str, tuple[str, ...], str | None, dict[str, Any]]:
    """The run's name, learners and KL description, and the whole ``run.json`` (empty when there is none)."""
    path = run_dir / RUN_FILE
    if not path.is_file():
        return run_dir.name, _learners_from_metrics(run_dir / METRICS_FILE, metrics), None, {}
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg})") from err
    if not isinstance(info, dict):
        raise ValueError(f"{path}: expected a JSON object with 'name' and 'learners'")
    name = info.get("name", run_dir.name)
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{path}: 'name' must be a non-empty string, got {name!r}")
    if "learners" in info:
        learners = info["learners"]
        valid = isinstance(learners, list) and learners and all(isinstance(x, str) and x for x in learners)
        if not valid or len(set(learners)) != len(learners):
            raise ValueError(
                f"{path}: 'learners' must be a non-empty list of distinct learner ids, got {learners!r}"
            )
        learners = tuple(learners)
    else:
        learners = _learners_from_metrics(run_dir / METRICS_FILE, metrics)
    kl_metric = info.get("kl_metric")
    return name, learners, kl_metric if isinstance(kl_metric, str) else None, info


def _learners_from_metrics(path: Path, metrics: list[dict[str, Any]]) -> tuple[str, ...]:
    """Learner ids are the prefixes of ``<learner>/<metric>`` keys, in order of first appearance."""
    learners: dict[str, None] = {}
    for line in metrics:
        for key in line:
            if "/" in key and not key.startswith(TIME_PREFIX):
                learners.setdefault(key.split("/", 1)[0], None)
    if not learners:
        raise ValueError(
            f"{path}: no per-learner keys such as 'llm1/task_reward', and no {RUN_FILE} naming the learners"
        )
    return tuple(learners)


def _read_rows(path: Path, required: dict[str, type]) -> list[dict[str, Any]]:
    rows = []
    for number, record in read_jsonl(path):
        for key, kind in required.items():
            value = record.get(key)
            if isinstance(value, bool) or not isinstance(value, kind):
                raise ValueError(
                    f"{path}:{number}: {key!r} must be a {kind.__name__}, got {value!r}; "
                    f"each line needs {', '.join(repr(k) for k in required)}"
                )
        rows.append(record)
    return rows
