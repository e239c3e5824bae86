"""What starting a local study's worker costs: seconds per run of a study whose runs train nothing, with workers
forked from the preloaded forkserver (the default where the platform has one) and with spawned interpreters.

A spawned worker imports torch, transformers and marllm's training before its run can begin; a forked one finds them
imported. The difference, times a study's runs, is what every local study saves (a λ sweep of 30 runs × 3 seeds
starts 90 workers).

    .venv/bin/python benchmarks/bench_study_workers.py [--runs 8] [--workers 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from marllm.studies import local_executor
from marllm.studies.execute import LocalExecutor, RunOutcome, run_study
from marllm.studies.spec import load_study

BASE = Path(__file__).resolve().parents[1] / "examples" / "ppo_offline.yaml"  # its runs are never trained here


def trains_nothing(config_data: dict[str, Any], run_dir: str, action: str) -> RunOutcome:
    """A run that ends as soon as its worker can run it, once training's modules are imported (as a run's are)."""
    import marllm.run.train  # noqa: F401 - what every run imports before training

    return RunOutcome(Path(run_dir).name, "finished")


def seconds_per_run(start_method: str, runs: int, workers: int) -> float:
    """Wall seconds of the whole study over its runs, its workers started by ``start_method``."""
    if start_method == "spawn":
        local_executor.worker_context = lambda: multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as directory:
        study_file = Path(directory) / "study.yaml"
        study = {"name": "bench", "base": str(BASE), "seeds": list(range(runs))}
        study_file.write_text(yaml.safe_dump(study))
        from bench_study_workers import trains_nothing as by_name  # pickled by module name, not as __main__'s

        executor = LocalExecutor(workers, run_function=by_name)
        started = time.perf_counter()
        outcomes = run_study(load_study(study_file), Path(directory) / "out", executor=executor, progress=False)
        seconds = time.perf_counter() - started
    assert all(outcome.status == "finished" for outcome in outcomes), outcomes
    return seconds / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    methods = ["forkserver", "spawn"] if sys.platform.startswith("linux") else ["spawn"]
    for method in methods:  # forkserver first: spawn replaces the executor's choice for the rest of this process
        print(f"{method:>10}: {seconds_per_run(method, args.runs, args.workers):.2f} s per run "
              f"({args.runs} runs, {args.workers} workers)")  # fmt: skip


if __name__ == "__main__":
    main()
