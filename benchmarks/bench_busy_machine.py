"""How much slower the shared CORY workload runs when one busy single-threaded process shares the cores.

Runs of ``bench_workload_profile.py``'s workload, each in a fresh process with torch's default thread count: alone
and beside a busy process (a Python loop started here, on the same cores), for three settings of libgomp's spin:
``GOMP_SPINCOUNT=300000`` (libgomp's default, set explicitly: marllm's guard leaves a user's setting alone, so this
is the workload without the guard), unset (marllm's guard, :func:`marllm.utils.threads.wait_briefly_when_idle`, sets
:data:`~marllm.utils.threads.SPIN_COUNT` when marllm is imported) and ``GOMP_SPINCOUNT=1000`` in the environment
before anything loads. The workload is started with ``import marllm`` before torch, or with
``--import-torch-first`` with ``import torch`` before marllm (what a program using the Python API may do: the guard
then writes the spin into the libgomp torch has loaded). Prints the median seconds per iteration of each and the
slowdown beside the busy process against the same setting alone.

    .venv/bin/python benchmarks/bench_busy_machine.py runs/bench-workload [--iterations 8] [--import-torch-first]
        [--settings default guard environ]
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
SETTINGS = {  # name: (label, GOMP_SPINCOUNT; None: unset)
    "default": ("300000 (default)", "300000"),
    "guard": ("unset (guard)", None),
    "environ": (f"{SPIN_COUNT} (environ)", SPIN_COUNT),
}


def workload_command(workload: str, iterations: int, torch_first: bool) -> list[str]:
    """The workload's child run, with ``import torch`` before ``import marllm`` or after it."""
    first = "torch, marllm" if torch_first else "marllm, torch"
    argv = [str(PROFILE), workload, "--child", "rss", "--iterations", str(iterations)]
    code = (
        f"import sys; sys.path.insert(0, {str(PROFILE.parent)!r}); import {first}; import runpy; "
        f"sys.argv = {argv!r}; runpy.run_path({str(PROFILE)!r}, run_name='__main__')"
    )
    return [sys.executable, "-c", code]


def seconds_per_iteration(workload: str, iterations: int, spin: str | None, busy: bool, torch_first: bool) -> float:
    """The median seconds per iteration of one fresh run, with ``GOMP_SPINCOUNT`` = ``spin`` (None: unset)."""
    env = {key: value for key, value in os.environ.items() if key not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    if spin is not None:
        env["GOMP_SPINCOUNT"] = spin
    competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        command = workload_command(workload, iterations, torch_first)
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
    parser.add_argument(
        "--import-torch-first", action="store_true", help="start the workload with import torch before marllm"
    )
    parser.add_argument(
        "--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS), help="the spin settings to run"
    )
    args = parser.parse_args(argv)
    order = "torch, then marllm" if args.import_torch_first else "marllm, then torch"
    print(f"cores this process may use: {len(os.sched_getaffinity(0))}; {args.iterations} iterations per run")
    print(f"the workload imports {order}")
    print(f"{'GOMP_SPINCOUNT':<18}{'alone s/it':>11}{'busy s/it':>11}{'slowdown':>10}")
    for label, spin in (SETTINGS[name] for name in args.settings):
        alone = seconds_per_iteration(args.workload, args.iterations, spin, False, args.import_torch_first)
        busy = seconds_per_iteration(args.workload, args.iterations, spin, True, args.import_torch_first)
        print(f"{label:<18}{alone:>11.2f}{busy:>11.2f}{busy / alone:>9.2f}x")


if __name__ == "__main__":
    main()
