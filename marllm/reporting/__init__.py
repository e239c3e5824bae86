"""Run reports: compare training runs (PPO, CORY, ...) with curves, a reward-vs-KL view, final numbers,
held-out samples and collapse indicators.

    from marllm.reporting import build_report
    build_report(["runs/ppo", "runs/cory"], "runs/report")   # -> runs/report/report.md
"""

from marllm.reporting.build import build_report
from marllm.reporting.indicators import collapse_indicators, final_means, moving_average, phase_times
from marllm.reporting.runs import Curve, Run, load_run, load_runs

__all__ = [
    "Curve",
    "Run",
    "build_report",
    "collapse_indicators",
    "final_means",
    "load_run",
    "load_runs",
    "moving_average",
    "phase_times",
]
