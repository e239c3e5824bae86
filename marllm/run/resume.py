"""Resuming a run: the checkpoint a resumed run starts from, checked against its config."""

from __future__ import annotations

from pathlib import Path

from marllm.config import TrainConfig, resume_differences
from marllm.config.loading import ConfigError
from marllm.run.checkpoint import CheckpointInfo, latest_checkpoint
from marllm.run.run_dir import CONFIG_FILE, RunDirError, read_run_state


def checkpoint_to_resume(run_dir: Path, config: TrainConfig) -> CheckpointInfo:
    """The latest complete training checkpoint of ``run_dir``, after checking that ``config`` may continue it.

    Raises:
        RunDirError: no checkpoint to resume from.
        ConfigError: ``config`` differs from the checkpoint's in a key that changes training, or asks for fewer
            iterations than the checkpoint has completed.
    """
    checkpoint = latest_checkpoint(run_dir) if run_dir.is_dir() else None
    if checkpoint is None:
        state = read_run_state(run_dir) if run_dir.is_dir() else None
        what = f"its run ({state.describe()}) stopped before" if state else "no run there wrote"
        raise RunDirError(
            f"nothing to resume in {run_dir}: {what} its first training checkpoint (logging.checkpoint_every); "
            "start it again with --overwrite (overwrite=True)"
        )
    saved = checkpoint.extra.get("config")
    if not isinstance(saved, dict):
        raise RunDirError(f"checkpoint {checkpoint.path} does not record the config it was trained with")
    changed = resume_differences(saved, config)
    if changed:
        raise ConfigError(
            f"the config differs from the one {run_dir} was trained with, in keys that change training: "
            f"{'; '.join(changed)}. Resume with the run's config ({run_dir / CONFIG_FILE}), or start again with "
            "--overwrite"
        )
    if config.iterations < checkpoint.iteration:
        raise ConfigError(
            f"iterations={config.iterations} is fewer than the {checkpoint.iteration} iterations the checkpoint of "
            f"{run_dir} has completed; give iterations >= {checkpoint.iteration}, or start again with --overwrite"
        )
    return checkpoint
