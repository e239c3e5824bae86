"""Seconds per iteration of a training config on 1 process and on N data-parallel processes (same global batch).

    .venv/bin/python benchmarks/bench_data_parallel.py [CONFIG] [--iterations K] [--nproc 1 2]

Runs ``marllm train CONFIG iterations=K --nproc N`` for each N into a temporary directory and prints, from each run's
metrics, the mean wall time of an iteration and its phases (generation, scoring forwards, update; summed over the
learners, rank 0's) over the iterations after the first. Evaluation at the end is switched off. One process uses the
machine's default torch threads; torchrun gives each of N > 1 processes one thread (OMP_NUM_THREADS=1) unless set.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("time/iteration_s", "time/generation_s", "time/forward_s", "time/update_s")


def measure(config: str, iterations: int, nproc: int, run_dir: Path) -> dict[str, float]:
    """Train ``iterations`` iterations on ``nproc`` processes; the mean of each phase after the first iteration."""
    command = [sys.executable, "-m", "marllm.cli", "train", config, f"iterations={iterations}"]
    command += ["logging.eval_queries=0", "logging.progress=false", "logging.save_checkpoint=false"]
    command += ["--nproc", str(nproc), "--run-dir", str(run_dir)]
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][1:]
    result = {phase: float(np.mean([row[phase] for row in rows])) for phase in PHASES}
    result["spread"] = float(np.std([row["time/iteration_s"] for row in rows]))
    result["wall_s"] = wall
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="examples/cory_offline.yaml")
    parser.add_argument("--iterations", type=int, default=11)
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    print(f"{args.config}, {args.iterations} iterations (mean over iterations 2…{args.iterations})")
    columns = ("processes", "s/iteration", "± sd", "generation", "forwards", "update", "wall")
    print(" ".join(f"{name:>{width}}" for name, width in zip(columns, (9, 12, 6, 10, 9, 7, 7), strict=True)))
    with tempfile.TemporaryDirectory() as scratch:
        for nproc in args.nproc:
            r = measure(args.config, args.iterations, nproc, Path(scratch) / f"n{nproc}")
            print(
                f"{nproc:>9} {r['time/iteration_s']:>12.2f} {r['spread']:>6.2f} {r['time/generation_s']:>10.2f} "
                f"{r['time/forward_s']:>9.2f} {r['time/update_s']:>7.2f} {r['wall_s']:>6.0f}s"
            )


if __name__ == "__main__":
    main()
