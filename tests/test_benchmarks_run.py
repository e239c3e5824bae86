"""Every benchmark script runs: each for one iteration at the smallest sizes it takes (a smoke run, not a timing), so
that a change of the library's API cannot break a benchmark unnoticed. The figures they print are not checked.

One class per script: pytest-xdist's ``loadscope`` spreads classes over the workers. Marked ``benchmarks``: ``make
test-benchmarks`` runs them (CI does, after ``make test``), ``make test`` leaves them out.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_durable_runs import cory_data

pytestmark = pytest.mark.benchmarks

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
SHARED_BENCH = ROOT.parent / "shared" / "bench"
TINY_GPT2 = ["--n-layer", "1", "--n-embd", "64", "--vocab-size", "200", "--batch-size", "4", "--new-tokens", "4"]


def run_script(script: Path, *args: str, cwd: Path = ROOT) -> str:
    """Run ``script`` with ``args`` in a fresh interpreter, offline; its stdout. Fails with its stderr."""
    environ = os.environ | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, cwd=cwd, env=environ, timeout=600
    )
    assert result.returncode == 0, f"{script.name} {' '.join(args)} failed:\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    """The shared CORY workload at its smallest: one layer of width 32, 64 queries."""
    if not (SHARED_BENCH / "make_workload.py").is_file():
        pytest.skip(f"the shared workload scripts are not beside this checkout ({SHARED_BENCH})")
    folder = tmp_path_factory.mktemp("workload")
    run_script(SHARED_BENCH / "make_workload.py", str(folder), "--layers", "1", "--dim", "32", "--queries", "64")
    return folder


class TestIteration:
    def test_runs(self):
        out = run_script(BENCHMARKS / "bench_iteration.py", "--batch-size", "4", "--new-tokens", "4",
                         "--mini-batch-size", "4", "--ppo-epochs", "1", "--repeats", "1")  # fmt: skip
        assert "floor" in out.lower()


class TestMemory:
    def test_runs(self):
        run_script(BENCHMARKS / "bench_memory.py", "--agents", "1", *TINY_GPT2)


class TestMemoryProfile:
    def test_runs(self):
        run_script(BENCHMARKS / "bench_memory_profile.py", "--agents", "1", "--n-layer", "1", "--n-embd", "32",
                   "--n-head", "2", "--vocab-size", "200", "--batch-size", "4", "--min-new-tokens", "2",
                   "--max-new-tokens", "4", "--mini-batch-size", "4", "--ppo-epochs", "1",
                   "--iterations", "1")  # fmt: skip


class TestLogitsPath:
    def test_runs(self):
        run_script(BENCHMARKS / "bench_logits_path.py", "--rows", "2", "--tokens", "4", "--hidden", "16",
                   "--vocab", "500", "--chunks", "1")  # fmt: skip


class TestFsdp:
    def test_runs(self):
        sizes = [*TINY_GPT2[:-4], "--batch-size", "8", "--new-tokens", "4"]  # 2 mini-batches a rank
        run_script(BENCHMARKS / "bench_fsdp.py", "--nproc", "2", "--iterations", "2", *sizes)


class TestDataParallel:
    def test_runs(self, tmp_path, tiny_lm_dir, tiny_classifier_dir, reviews_file):
        data = cory_data(tiny_lm_dir, tiny_classifier_dir, reviews_file, iterations=2)
        config = tmp_path / "tiny.yaml"
        config.write_text(yaml.safe_dump(data))
        run_script(BENCHMARKS / "bench_data_parallel.py", str(config), "--iterations", "2", "--nproc", "1", "2",
                   cwd=tmp_path)  # fmt: skip


class TestPlanSizes:
    def test_runs(self):
        out = run_script(BENCHMARKS / "plan_sizes.py", "--batch", "4", "--new-tokens", "4", "--prompt-tokens", "8",
                         "--sizes", "0.5B", "--settings", "0")  # fmt: skip
        assert "0.5B" in out


class TestPlanLevers:
    def test_runs(self):
        out = run_script(BENCHMARKS / "bench_plan_levers.py", "kuhn", "--iterations", "1")
        assert "kuhn" in out


class TestStudyWorkers:
    def test_runs(self):
        run_script(BENCHMARKS / "bench_study_workers.py", "--runs", "1", "--workers", "1")


class TestSharedWorkload:
    def test_runs(self, workload):
        out = run_script(SHARED_BENCH / "marllm_workload.py", str(workload), "--agents", "2", "--iters", "1",
                         "--batch", "8")  # fmt: skip
        assert '"s_per_iter_median"' in out

    def test_workload_profile_runs(self, workload):
        run_script(BENCHMARKS / "bench_workload_profile.py", str(workload), "--iterations", "1", "--batch-size", "8",
                   "--mini-batch-size", "8")  # fmt: skip

    def test_plan_runs(self, workload):
        sizes = f"workload+model.name_or_path={workload / 'model'}+env.batch_size=8+ppo.batching.mini_batch_size=8"
        out = run_script(BENCHMARKS / "bench_plan.py", sizes, "--iterations", "1")
        assert "plan MiB" in out

    def test_busy_machine_runs(self, workload):
        run_script(BENCHMARKS / "bench_busy_machine.py", str(workload), "--iterations", "1", "--settings", "guard")


class TestSequences:
    def test_runs(self):
        out = run_script(BENCHMARKS / "bench_sequences.py", "--games", "2", "--iterations", "2", "--only", "deal",
                         "--rounds", "2", "--threads", "1")  # fmt: skip
        assert "| deal | 2 | prompt |" in out and "| deal | 2 | sequence |" in out


def test_every_benchmark_script_is_run_here():
    """A new script in benchmarks/ gets its smoke run in this file."""
    source = Path(__file__).read_text()
    scripts = sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
    scripts += sorted(p.name for p in SHARED_BENCH.glob("*.py"))
    assert [name for name in scripts if f'"{name}"' not in source] == []
