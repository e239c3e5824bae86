"""Run reports: compare training runs (PPO, CORY, ...) with curves, a reward-vs-KL view, final numbers,
held-out samples and collapse indicators.

    from marllm.reporting import build_report
    build_report(["runs/ppo", "runs/cory"], "runs/report")   # -> runs/report/report.md

The names below load on first use, so that a part of the report (a game's rows, :mod:`marllm.games.report`) can
import the report's tables without importing the report builder that imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from marllm.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "build_report": "marllm.reporting.build",
    "collapse_indicators": "marllm.reporting.indicators",
    "final_means": "marllm.reporting.indicators",
    "moving_average": "marllm.reporting.indicators",
    "phase_times": "marllm.reporting.indicators",
    "Curve": "marllm.reporting.runs",
    "Run": "marllm.reporting.runs",
    "load_run": "marllm.reporting.runs",
    "load_runs": "marllm.reporting.runs",
}

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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)

if TYPE_CHECKING:
    from marllm.reporting.build import build_report
    from marllm.reporting.indicators import collapse_indicators, final_means, moving_average, phase_times
    from marllm.reporting.runs import Curve, Run, load_run, load_runs
