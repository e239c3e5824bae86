"""Digest of what the main job's configs and a game run per action mode compute, to prove that a refactor changes no
behaviour.

Trains 3 iterations of each config below (a 2-rank ``--nproc`` run of ``cory_offline``, and Kuhn poker on the embedded
base under each of ``game.actions``' four modes, its exploitability tabulated) into OUT, then writes
``OUT/digest.json``: per run, sha256 of ``metrics.jsonl`` with every ``time/*`` key removed, of ``samples.jsonl`` and
of ``eval_samples.jsonl``. Run it before and after a change and compare the two files::

    .venv/bin/python scripts/behaviour_digest.py /tmp/before
    .venv/bin/python scripts/behaviour_digest.py /tmp/after
    diff /tmp/before/digest.json /tmp/after/digest.json && echo identical

Every run computes on one thread (``OMP_NUM_THREADS=1``): the float sums of a matrix product depend on how many
threads split them, so digests are comparable only at one thread count. Dotted overrides after OUT go to every run
(``ppo.compute.micro_batch_size=null ppo.compute.fused_kernels=false``: the digest of a path asked for by hand).

Where digests differ, ``--compare BEFORE AFTER`` says how: per run, the metric values that changed, metric keys
added or gone, and whether samples and eval samples are identical.
"""

from __future__ import annotations

import hashlib
import json
import os
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
# A game run per action mode, its exploitability tabulated at the last iteration: what a game run computes (moves
# sampled, the tabulated policy, the update) shows in its metrics and samples.
# exploitability_samples is a setting of the modes whose moves are sampled to tabulate them (generate, think): the
# others' policies are exact, and have no such setting.
_KUHN = ["examples/games/kuhn_poker_offline.yaml", "game.exploitability.every=3"]
_MODES = {
    "generate": "{generate: {exploitability_samples: 8}}",
    "constrained": "constrained",
    "think": "{think: {exploitability_samples: 8}}",
    "score": "score",
}
CONFIGS.update({f"kuhn_{mode}_offline": [*_KUHN, f"game.actions={actions}"] for mode, actions in _MODES.items()})
ITERATIONS = 3
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
"""The runs' environment: one thread, as a matrix product's float sums depend on how many threads split them (a digest
taken at another thread count differs in the metrics' last bits, not in behaviour)."""
MARLLM = str(Path(sys.executable).with_name("marllm"))


def _digest(path: Path, drop_timings: bool = False) -> str | None:
    if not path.exists():
        return None
    lines = path.read_text().splitlines()
    if drop_timings:
        records = [json.loads(line) for line in lines]
        lines = [json.dumps({k: v for k, v in r.items() if not k.startswith("time/")}, sort_keys=True) for r in records]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def main(out: Path, overrides: list[str] | None = None) -> None:
    digest: dict[str, dict[str, str | None]] = {}
    for name, arguments in CONFIGS.items():
        run_dir = out / name
        command = [MARLLM, "train", arguments[0], f"iterations={ITERATIONS}", "--run-dir", str(run_dir),
                   "--overwrite", *arguments[1:], *(overrides or [])]
        print("$", " ".join(command), flush=True)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=ONE_THREAD)
        digest[name] = {
            "metrics": _digest(run_dir / "metrics.jsonl", drop_timings=True),
            "samples": _digest(run_dir / "samples.jsonl"),
            "eval_samples": _digest(run_dir / "eval_samples.jsonl"),
        }
    (out / "digest.json").write_text(json.dumps(digest, indent=2) + "\n")
    print(json.dumps(digest, indent=2))


def compare(before: Path, after: Path) -> None:
    for name in CONFIGS:
        missing = [str(side) for side in (before, after) if not (side / name / "metrics.jsonl").is_file()]
        if missing:  # a config added to the digest after BEFORE was made
            print(f"{name}: not compared, no run in {' and '.join(missing)}")
            continue
        old = [json.loads(line) for line in (before / name / "metrics.jsonl").read_text().splitlines()]
        new = [json.loads(line) for line in (after / name / "metrics.jsonl").read_text().splitlines()]
        changed, added, gone = set(), set(), set()
        for a, b in zip(old, new, strict=False):
            changed |= {k for k in a if not k.startswith("time/") and k in b and a[k] != b[k]}
            gone |= {k for k in a if k not in b}
            added |= {k for k in b if k not in a}
        files = ("samples.jsonl", "eval_samples.jsonl")
        same = {f: _digest(before / name / f) == _digest(after / name / f) for f in files}
        print(f"{name}: {len(old)}/{len(new)} lines, changed values {sorted(changed)}, added keys {sorted(added)}, "
              f"gone keys {sorted(gone)}, identical: {same}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--compare":
        compare(Path(sys.argv[2]), Path(sys.argv[3]))
    elif len(sys.argv) >= 2 and sys.argv[1] != "--compare":
        main(Path(sys.argv[1]), sys.argv[2:])
    else:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR [KEY=VALUE ...] | --compare BEFORE_DIR AFTER_DIR")
