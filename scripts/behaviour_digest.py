"""Digest of what the main job's configs compute, to prove that a refactor changes no behaviour.

Trains 3 iterations of each config below (and a 2-rank ``--nproc`` run of ``cory_offline``) into OUT, then writes
``OUT/digest.json``: per run, sha256 of ``metrics.jsonl`` with every ``time/*`` key removed, of ``samples.jsonl`` and
of ``eval_samples.jsonl``. Run it before and after a change and compare the two files::

    .venv/bin/python scripts/behaviour_digest.py /tmp/before
    .venv/bin/python scripts/behaviour_digest.py /tmp/after
    diff /tmp/before/digest.json /tmp/after/digest.json && echo identical
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

CONFIGS = {
    "cory_offline": ["examples/cory_offline.yaml"],
    "ppo_offline": ["examples/ppo_offline.yaml"],
    "cory_grpo_offline": ["examples/cory_grpo_offline.yaml"],
    "cory_arith_offline": ["examples/cory_arith_offline.yaml"],
    "propose_critique_revise_offline": ["examples/propose_critique_revise_offline.yaml"],
    "cory_offline_nproc2": ["examples/cory_offline.yaml", "--nproc", "2"],
}
ITERATIONS = 3
MARLLM = str(Path(sys.executable).with_name("marllm"))


def _digest(path: Path, drop_timings: bool = False) -> str | None:
    if not path.exists():
        return None
    lines = path.read_text().splitlines()
    if drop_timings:
        records = [json.loads(line) for line in lines]
        lines = [json.dumps({k: v for k, v in r.items() if not k.startswith("time/")}, sort_keys=True) for r in records]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def main(out: Path) -> None:
    digest: dict[str, dict[str, str | None]] = {}
    for name, arguments in CONFIGS.items():
        run_dir = out / name
        command = [MARLLM, "train", arguments[0], f"iterations={ITERATIONS}", "--run-dir", str(run_dir),
                   "--overwrite", *arguments[1:]]
        print("$", " ".join(command), flush=True)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        digest[name] = {
            "metrics": _digest(run_dir / "metrics.jsonl", drop_timings=True),
            "samples": _digest(run_dir / "samples.jsonl"),
            "eval_samples": _digest(run_dir / "eval_samples.jsonl"),
        }
    (out / "digest.json").write_text(json.dumps(digest, indent=2) + "\n")
    print(json.dumps(digest, indent=2))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR")
    main(Path(sys.argv[1]))
