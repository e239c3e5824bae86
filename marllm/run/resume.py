"""Resuming a run: the checkpoint a resumed run starts from, checked against its config, and loaded.

A resume that fails before it trains changes nothing in the run directory; its errors say what is wrong and what
can be done: resume from an older checkpoint the run keeps (``logging.keep_checkpoints``), or start again. A damaged
newest checkpoint (a file missing, cut short or changed: sizes and sha256 are checked) is skipped with a warning, and
the run resumes from the newest intact one.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marllm.assets import PREFIX
from marllm.assets.offline.recipe import RECIPE_ENV, RECIPES, default_recipe_name
from marllm.config import CONFIG_LAYOUT, TrainConfig, other_layout, resume_differences, run_layout
from marllm.config.loading import ConfigError
from marllm.run.checkpoint import CheckpointError, CheckpointInfo, checkpoints, load_checkpoint
from marllm.run.run_dir import CONFIG_FILE, RunDirError, read_run_state

if TYPE_CHECKING:
    from pettingzoo import AECEnv

    from marllm.algorithms.learner import Learner

START_AGAIN = "start it again with --overwrite"

def offline_assets_record(config: TrainConfig) -> dict[str, str] | None:
    """Which offline assets a run on ``config`` trains with (what a checkpoint records, so that a resumed run loads the
    same ones): the recipe :data:`~marllm.assets.offline.recipe.RECIPE_ENV` names and its directory, where the config
    names a ``marllm:offline-*`` asset; else None."""
    if f"{PREFIX}offline-" not in json.dumps(config.to_dict()):
        return None
    name = default_recipe_name()
    return {"recipe": name, "directory": RECIPES[name].directory_name}


def check_run_dir_exists(run_dir: Path) -> None:
    """Refuse to resume a run directory that does not exist, before anything is built.

    Raises:
        RunDirError: ``run_dir`` is no directory, naming what to give instead.
    """
    if not run_dir.is_dir():
        raise RunDirError(
            f"nothing to resume: run directory {run_dir} does not exist; give the directory a run was trained into "
            f"(--resume RUN_DIR, or its config's run_dir), or start a new run there without --resume"
        )


def checkpoint_to_resume(run_dir: Path, config: TrainConfig) -> CheckpointInfo:
    """The latest complete training checkpoint of ``run_dir``, after checking that ``config`` may continue it.

    Raises:
        RunDirError: no checkpoint to resume from (the message names what is damaged, if that is why).
        ConfigError: ``config`` differs from the checkpoint's in a key that changes training, or asks for fewer
            iterations than the checkpoint has completed.
    """
    check_run_dir_exists(run_dir)
    layout = run_layout(run_dir)
    if layout is not None and layout != CONFIG_LAYOUT:
        raise RunDirError(other_layout(run_dir, layout))
    checkpoint, damaged = _first_intact(checkpoints(run_dir, verify_hashes=True))
    if checkpoint is None:
        if damaged:
            listed = "; ".join(str(error) for error in damaged)
            raise RunDirError(f"nothing to resume in {run_dir}: {listed}; it keeps no other checkpoint: {START_AGAIN}")
        state = read_run_state(run_dir)
        what = f"its run ({state.describe()}) stopped before" if state else "no run there wrote"
        raise RunDirError(
            f"nothing to resume in {run_dir}: {what} its first training checkpoint (logging.checkpoint_every); "
            f"{START_AGAIN}"
        )
    for error in damaged:  # newer ones, damaged: the run goes on from an older one
        warnings.warn(f"skipping a damaged checkpoint: {error}", RuntimeWarning, stacklevel=2)
    saved = checkpoint.extra.get("config")
    if not isinstance(saved, dict):
        raise RunDirError(f"checkpoint {checkpoint.path} does not record the config it was trained with")
    _check_offline_assets(run_dir, checkpoint.extra.get("offline_assets"), offline_assets_record(config))
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


def _check_offline_assets(run_dir: Path, saved: dict[str, str] | None, now: dict[str, str] | None) -> None:
    """Refuse to resume a run on other offline assets than it trained with (another recipe's base model)."""
    if saved is None or now is None or saved == now:
        return
    raise ConfigError(
        f"{run_dir} was trained on the offline assets of recipe {saved['recipe']!r} ({saved['directory']}), but "
        f"${RECIPE_ENV} now names {now['recipe']!r} ({now['directory']}): resume it with {RECIPE_ENV}="
        f"{saved['recipe']}, or start again with --overwrite"
    )


def load_to_resume(
    run_dir: Path, checkpoint: CheckpointInfo, learners: Mapping[str, Learner], env: AECEnv, parts: Sequence[Any] = ()
) -> CheckpointInfo:
    """:func:`~marllm.run.checkpoint.load_checkpoint` of ``checkpoint`` (of ``run_dir``) into a resumed run.

    Raises:
        CheckpointError: the checkpoint does not load (a damaged file, named); the message adds that the run is
            unchanged, and how to resume from an older checkpoint the run keeps, or else to start again.
    """
    try:
        return load_checkpoint(checkpoint.path, learners, env, parts)
    except CheckpointError as error:
        # Hashes checked before one is named: the advice must not lead to a second refusal.
        found = checkpoints(run_dir, verify_hashes=True)
        intact, _ = _first_intact(e for e in found if not isinstance(e, CheckpointInfo) or e.path != checkpoint.path)
        if intact is not None:
            advice = (
                f"it also keeps {intact.path.name} (logging.keep_checkpoints), intact: to resume from that, move "
                f"{checkpoint.path} out of the run directory (or delete it) and resume again; or {START_AGAIN}"
            )
        else:
            advice = f"it keeps no other intact checkpoint (logging.keep_checkpoints): {START_AGAIN}"
        raise CheckpointError(f"cannot resume: {error}; the run is left as it was, and {advice}") from error


def _first_intact(
    found: Iterable[CheckpointInfo | CheckpointError],
) -> tuple[CheckpointInfo | None, list[CheckpointError]]:
    """The first checkpoint of ``found`` that is intact (None if none is), and the errors of the damaged ones before
    it."""
    damaged = []
    for entry in found:
        if isinstance(entry, CheckpointInfo):
            return entry, damaged
        damaged.append(entry)
    return None, damaged
