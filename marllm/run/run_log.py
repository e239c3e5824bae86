"""What a run logs each iteration: its metrics line, its sample dialogues and, optionally, TensorBoard scalars."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from marllm.run.run_dir import METRICS_FILE, SAMPLES_FILE, TENSORBOARD_DIR


def sample_rows(dialogues: dict[str, dict[str, Any]], iteration: int, count: int) -> list[dict]:
    """The first ``count`` dialogues of each learner's turns (``dialogues`` of :class:`~marllm.loop.IterationResult`),
    as the rows of ``samples.jsonl`` (with ``delta``, what the model read, where a game gave one)."""
    rows = []
    for learner_id, record in dialogues.items():
        queries = record.get("queries")
        for turn_index, turn in enumerate(record["turns"], start=1):
            for i in range(min(count, len(turn["responses"]))):
                row = {
                    "iteration": iteration,
                    "learner": learner_id,
                    "role": record["role"],
                    "query": None if queries is None else queries[i],
                    "prompt": turn["prompts"][i],
                    "response": turn["responses"][i],
                    "task_reward": float(turn["task_rewards"][i]),
                }
                if len(record["turns"]) > 1:
                    row["turn"] = turn_index
                if "deltas" in turn:  # one token sequence per seat: the prompt is the state; this is what was read
                    row["delta"] = turn["deltas"][i]
                rows.append(row)
    return rows


class RunLog:
    """The per-iteration logs of a run: ``metrics.jsonl``, ``samples.jsonl`` and, optionally, TensorBoard scalars.

    ``start`` is the first iteration this log writes: 0 starts the files afresh; a resumed run appends to files
    already cut back to ``start`` (:func:`~marllm.run.run_dir.keep_iterations_before`), and TensorBoard hides its
    events from ``start`` on. Each line is flushed as it is written, so a killed run keeps every iteration it logged.
    """

    def __init__(self, run_dir: Path, start: int = 0, tensorboard: bool = False):
        mode = "a" if start else "w"
        self._metrics = (run_dir / METRICS_FILE).open(mode, encoding="utf-8")
        self._samples = (run_dir / SAMPLES_FILE).open(mode, encoding="utf-8")
        self._writer = _summary_writer(run_dir / TENSORBOARD_DIR, start) if tensorboard else None

    def write(self, iteration: int, metrics: Mapping[str, Any], samples: Sequence[Mapping[str, Any]]) -> None:
        """Log one iteration: its metrics line, its sample dialogues and its numeric metrics as scalars."""
        self._metrics.write(json.dumps(dict(metrics)) + "\n")
        self._metrics.flush()
        for row in samples:
            self._samples.write(json.dumps(dict(row)) + "\n")
        self._samples.flush()
        if self._writer is not None:
            for key, value in metrics.items():
                if isinstance(value, int | float) and not isinstance(value, bool) and key != "iteration":
                    self._writer.add_scalar(key, value, iteration)

    def close(self) -> None:
        self._metrics.close()
        self._samples.close()
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _summary_writer(log_dir: Path, start: int) -> Any:
    from torch.utils.tensorboard import SummaryWriter  # logging.tensorboard only

    # purge_step: events of iterations >= start (logged before a resumed run's checkpoint was cut to) are hidden.
    return SummaryWriter(str(log_dir), purge_step=start if start else None)
