"""How much slower the shared CORY workload runs when one busy single-threaded process shares the cores.

Four runs of ``bench_workload_profile.py``'s workload, each in a fresh process with torch's default thread count:
alone and beside a busy process (a Python loop started here, on the same cores), each with libgomp's default spin
(``GOMP_SPINCOUNT`` unset: idle threads spin about 300,000 iterations before they sleep) and with the spin the
``marllm`` command sets (:data:`marllm.utils.threads.SPIN_COUNT`). Prints the median seconds per iteration of each
and the slowdown beside the busy process against the same setting alone.

    .venv/bin/python benchmarks/bench_busy_machine.py runs/bench-workload [--iterations 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from bench_workload_profile import median_iteration_seconds

from marllm.utils.threads import SPIN_COUNT

PROFILE = Path(__file__).with_name("bench_workload_profile.py")


def seconds_per_iteration(workload: str, iterations: int, spin: str | None, busy: bool) -> float:
    """The median seconds per iteration of one fresh run, with ``GOMP_SPINCOUNT`` = ``spin`` (None: unset)."""
    env = {key: value for key, value in os.environ.items() if key not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    if spin is not None:
        env["GOMP_SPINCOUNT"] = spin
    competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        command = [sys.executable, str(PROFILE), workload, "--child", "rss", "--iterations", str(iterations)]
        completed = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    return median_iteration_seconds(json.loads(completed.stdout.strip().splitlines()[-1])["rows"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", help="the directory ../shared/bench/make_workload.py wrote")
    parser.add_argument("--iterations", type=int, default=8)
    args = parser.parse_args(argv)
    print(f"cores this process may use: {len(os.sched_getaffinity(0))}; {args.iterations} iterations per run")
    print(f"{'GOMP_SPINCOUNT':<16}{'alone s/it':>11}{'busy s/it':>11}{'slowdown':>10}")
    for label, spin in (("unset (default)", None), (SPIN_COUNT, SPIN_COUNT)):
        alone = seconds_per_iteration(args.workload, args.iterations, spin, busy=False)
        busy = seconds_per_iteration(args.workload, args.iterations, spin, busy=True)
        print(f"{label:<16}{alone:>11.2f}{busy:>11.2f}{busy / alone:>9.2f}x")


if __name__ == "__main__":
    main()
