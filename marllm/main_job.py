"""The main job: on the embedded offline assets, train single-agent PPO and CORY, then write their report.

Prepares the assets first when they are missing (corpus, base model, reward model), records the wall time of each
phase in ``OUT/timings.json``, and leaves ``OUT/ppo``, ``OUT/cory`` and ``OUT/report``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from marllm.config import load_config
from marllm.reporting import build_report
from marllm.train import train

DEFAULT_CONFIGS = {"ppo": Path("examples/ppo_offline.yaml"), "cory": Path("examples/cory_offline.yaml")}


def run_main_job(
    out_dir: Path,
    iterations: int | None = None,
    configs: dict[str, Path] | None = None,
) -> Path:
    """Prepare (if needed), train every config in turn, and build the comparison report. Returns report.md."""
    from marllm.offline import ensure_assets

    configs = configs or DEFAULT_CONFIGS
    missing = [str(path) for path in configs.values() if not Path(path).is_file()]
    if missing:
        raise FileNotFoundError(f"main job configs not found: {missing} (run from the repository root)")
    out_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    ensure_assets(progress=True)
    timings["prepare_s"] = time.perf_counter() - started
    run_dirs = []
    for name, path in configs.items():
        overrides = [] if iterations is None else [f"iterations={iterations}"]
        config = load_config(path, overrides)
        phase_started = time.perf_counter()
        train(config, out_dir / name)
        timings[f"{name}_s"] = time.perf_counter() - phase_started
        run_dirs.append(out_dir / name)
    phase_started = time.perf_counter()
    report = build_report(run_dirs, out_dir / "report")
    timings["report_s"] = time.perf_counter() - phase_started
    timings["total_s"] = time.perf_counter() - started
    (out_dir / "timings.json").write_text(json.dumps(timings, indent=2))
    return report
